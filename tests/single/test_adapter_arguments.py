"""Bad input to the adapters fails before any collective: Horovod is imported, never initialised."""
import pytest
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh


def sgd():
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)


def test_use_before_hvd_init_names_the_fix():
    assert not hvd.is_initialized()
    with pytest.raises(RuntimeError, match=r"call hvd.init\(\)"):
        hh.DistributedOptimizer(sgd(), strategy=hh.LocalSGD(period=2))


@pytest.mark.parametrize("kwargs,error,match", [
    ({"strategy": "localsgd"}, TypeError, "strategy must be one of ESync, LocalSGD, Synchronous"),
    ({"strategy": hh.LocalSGD}, TypeError, "an instance"),
    ({"backward_passes_per_step": 0}, ValueError, "backward_passes_per_step"),
    ({"timeout": -1.0}, ValueError, "timeout"),
    ({"process_set": 0}, TypeError, "process_set"),
])
def test_bad_arguments_are_refused_before_init(kwargs, error, match):
    with pytest.raises(error, match=match):
        hh.DistributedOptimizer(sgd(), **kwargs)


def test_not_an_optimizer():
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        hh.DistributedOptimizer(torch.nn.Linear(2, 2))


def test_keras_callbacks_check_their_arguments():
    keras_hh = pytest.importorskip("horovod_hetero.tensorflow.keras")
    with pytest.raises(ValueError, match="hvd.DistributedOptimizer"):
        keras_hh.callbacks.HeteroSyncCallback(keras_hh.Synchronous())
    with pytest.raises(ValueError, match="period"):
        keras_hh.callbacks.LocalSGDCallback(period=0)
    with pytest.raises(ValueError, match="mode must be one of"):
        keras_hh.callbacks.ESyncCallback(mode="fast")
    with pytest.raises(TypeError, match="batch_size"):
        keras_hh.callbacks.LocalSGDCallback(period=2, batch_size=1.5)
