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


def run_switching(tmp_path, case, field):
    """Run ``elastic_worker.py case`` (the job grows to 4 workers and shrinks back); its records, its epochs' records
    and ``{(epoch, size): the strategies (``field``) the ranks ran}``, every rank running the same one."""
    records = run(Path(__file__).with_name("elastic_worker.py"), case, tmp_path)
    check_grew_and_shrank(records, planned=False)
    epochs = [r for r in records if r["event"] == "epoch"]
    by_epoch = {}
    for r in epochs:
        by_epoch.setdefault((r["epoch"], r["size"]), set()).add(r[field])
    assert all(len(names) == 1 for names in by_epoch.values()), by_epoch        # every rank the same strategy
    return records, epochs, by_epoch


def test_strategies_switched_during_the_job_survive_its_resets(tmp_path):
    """``opt.set_strategy`` inside ``hvd.elastic.run`` (Synchronous, then ESync, Balanced and ElasticBSP at
    epochs' ends, around the growth to 4 workers and the shrinking back): the workers that join take the
    strategy running with the committed state, every rank runs the same one in every epoch, and the
    survivors end with identical models under the last."""
    records, epochs, by_epoch = run_switching(tmp_path, "switch", "strategy")
    ran = [next(iter(by_epoch[key])) for key in sorted(by_epoch)]
    assert ran[0] == "Synchronous" and {"ESync", "Balanced", "ElasticBSP"} <= set(ran), ran
    assert {r["strategy"] for r in records if r["event"] == "end"} == {"ElasticBSP"}
    joined = [r for r in epochs if r["size"] == 4 and r["rank"] >= 2]         # workers built as Synchronous
    assert joined and all(r["strategy"] != "Synchronous" for r in joined), joined


def test_auto_keeps_what_it_chose_across_the_jobs_resets(tmp_path):
    """``hh.Auto()`` inside ``hvd.elastic.run`` (odd ranks step 4x as long): it leaves Synchronous in the
    first epoch, the workers that join take the strategy it runs with the committed state (they are built
    running Synchronous), every rank runs the same one in every epoch, and the survivors end identical."""
    records, epochs, by_epoch = run_switching(tmp_path, "auto", "running")
    first = min(by_epoch)
    assert by_epoch[first] != {"sync"}, by_epoch                                  # left Synchronous in epoch 1
    joined = [r for r in epochs if r["size"] == 4 and r["rank"] >= 2]
    assert joined and all(r["running"] != "sync" for r in joined), joined
