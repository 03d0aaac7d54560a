"""Horovod elastic with every strategy, changed by one line in a ``hvd.elastic.run`` script
(``elastic_worker.py``): the job grows from 2 to 4 workers and shrinks back to 2; the strategy goes
on under the new ranks (WAGMA's groups and ElasticBSP/DSSP's plans for each size) and the workers
end with identical models."""
from pathlib import Path

import pytest

from elastic_job import check_grew_and_shrank, run


@pytest.mark.parametrize("strategy", ["sync", "localsgd", "esync", "wagma", "elasticbsp", "dssp", "balanced"])
def test_training_goes_on_after_the_job_grows_and_shrinks(tmp_path, strategy):
    records = run(Path(__file__).with_name("elastic_worker.py"), strategy, tmp_path)
    check_grew_and_shrank(records, planned=strategy in ("elasticbsp", "dssp", "balanced"))


def test_strategies_switched_during_the_job_survive_its_resets(tmp_path):
    """``opt.set_strategy`` inside ``hvd.elastic.run`` (Synchronous, then ESync, Balanced and ElasticBSP at
    epochs' ends, around the growth to 4 workers and the shrinking back): the workers that join take the
    strategy running with the committed state, every rank runs the same one in every epoch, and the
    survivors end with identical models under the last."""
    records = run(Path(__file__).with_name("elastic_worker.py"), "switch", tmp_path)
    check_grew_and_shrank(records, planned=False)
    epochs = [r for r in records if r["event"] == "epoch"]
    by_epoch = {}
    for r in epochs:
        by_epoch.setdefault((r["epoch"], r["size"]), set()).add(r["strategy"])
    assert all(len(names) == 1 for names in by_epoch.values()), by_epoch        # every rank the same strategy
    ran = [next(iter(by_epoch[key])) for key in sorted(by_epoch)]
    assert ran[0] == "Synchronous" and {"ESync", "Balanced", "ElasticBSP"} <= set(ran), ran
    assert {r["strategy"] for r in records if r["event"] == "end"} == {"ElasticBSP"}
    joined = [r for r in epochs if r["size"] == 4 and r["rank"] >= 2]         # workers built as Synchronous
    assert joined and all(r["strategy"] != "Synchronous" for r in joined), joined
