"""Horovod's elastic Keras recipe with every strategy callback (``elastic_keras_worker.py``): the job
grows from 2 to 4 workers and shrinks back to 2; the callback's strategy goes on under the new ranks
and the workers end with identical models. Keras 2 only: Horovod 0.28's ``hvd.elastic.KerasState``
calls ``optimizer.variables()``, which Keras 3 made a list."""
from pathlib import Path

import pytest

from elastic_job import check_grew_and_shrank, run


@pytest.mark.parametrize("strategy", ["localsgd", "esync", "wagma", "elasticbsp", "dssp"])
def test_training_goes_on_after_the_job_grows_and_shrinks(tmp_path, strategy):
    records = run(Path(__file__).with_name("elastic_keras_worker.py"), strategy, tmp_path, TF_USE_LEGACY_KERAS="1")
    check_grew_and_shrank(records, planned=strategy in ("elasticbsp", "dssp"))
