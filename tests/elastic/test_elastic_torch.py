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
