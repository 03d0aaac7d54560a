"""Horovod's PyTorch MNIST script (the checkout's ``examples/torch_mnist.py``), each strategy changed by one line:
sharded epochs, metric averaging in ``test()``, checkpoints by rank 0 and a resume through rank 0 +
``hvd.broadcast_parameters``/``hvd.broadcast_optimizer_state``. Every run must finish with identical
models and metrics on every rank."""
import importlib.util
import tempfile

import pytest

import horovod.torch as hvd
import horovod_hetero.torch as hh
import horovod_hetero_lab
import job

job.init(hvd, hh)
_spec = importlib.util.spec_from_file_location("torch_mnist", horovod_hetero_lab.example("torch_mnist"))
torch_mnist = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_mnist)
RANK, SIZE = hvd.rank(), hvd.size()
pytestmark = pytest.mark.skipif(SIZE != 4, reason="written for 4 ranks")


def everyone(value, name):
    return hvd.allgather_object(value, name=name)


@pytest.mark.parametrize("strategy", ["sync", "localsgd", "esync", "wagma --period 4",
                                      "elasticbsp", "dssp", "adsp --check-period 4steps"])
def test_the_script_trains_checkpoints_and_resumes_with_every_strategy(strategy):
    directory = hvd.broadcast_object(tempfile.mkdtemp() if RANK == 0 else None, root_rank=0, name="ckdir")
    argv = ["--strategy", *strategy.split(), "--checkpoint-dir", directory]
    first = torch_mnist.main(argv + ["--epochs", "2"])
    resumed = torch_mnist.main(argv + ["--epochs", "3"])           # a new job: rank 0 loads epoch 2
    for run, name in ((first, "first"), (resumed, "resumed")):
        models = everyone(run["model"], f"{strategy}.{name}.model")
        metrics = everyone(run["test_loss_accuracy"], f"{strategy}.{name}.metrics")
        assert all(m == models[0] for m in models), f"{name}: models differ between ranks"
        assert all(m == metrics[0] for m in metrics)
        assert metrics[0][1] > 0.5                                    # it learned something
    assert first["resumed_from"] == 0 and resumed["resumed_from"] == 2
    assert len(resumed["epoch_s"]) == 1
    batches = everyone(resumed["batches"][0], f"{strategy}.batches")
    assert sum(b * 16 for b in batches) >= 1438 - 4 * 15        # every sample once: shares cover the epoch
