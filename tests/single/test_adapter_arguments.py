"""Bad input to the adapters fails before any collective: Horovod is imported, never initialised."""
import re

import pytest
import torch

import horovod.torch as hvd
import horovod_hetero.strategies as hh_strategies
from horovod_hetero.runtime.runner import runner_for
import horovod_hetero.torch as hh


def sgd():
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)


def test_use_before_hvd_init_names_the_fix():
    assert not hvd.is_initialized()
    with pytest.raises(RuntimeError, match=r"call hvd.init\(\)"):
        hh.DistributedOptimizer(sgd(), strategy=hh.LocalSGD(period=2))


@pytest.mark.parametrize("kwargs,error,match", [
    ({"strategy": "localsgd"}, TypeError, "strategy must be one of ADSP, Auto, Balanced, DSSP, ESync, ElasticBSP, LocalSGD, Synchronous"),
    ({"strategy": hh.LocalSGD}, TypeError, "an instance"),
    ({"backward_passes_per_step": 0}, ValueError, "backward_passes_per_step"),
    ({"timeout": -1.0}, ValueError, "timeout"),
    ({"timeout": float("inf")}, ValueError, "timeout must be a finite number"),
    ({"process_set": 0}, TypeError, "process_set"),
    # as Horovod: argument problems are ValueError/TypeError even before hvd.init()
    ({"named_parameters": 5}, ValueError, "named_parameters must be a sequence of"),
    ({"named_buffers": [("b", 5)]}, ValueError, "named_buffers must be a sequence of"),
    ({"named_buffers": [("phase", torch.zeros(2, dtype=torch.complex64))]}, ValueError,
     r"^named_buffers: complex buffers \(phase\) cannot be averaged"),
    ({"op": "sum"}, ValueError, "op must be hvd.Average, hvd.Sum or hvd.Adasum"),
    ({"sparse_as_dense": "no"}, TypeError, "sparse_as_dense"),
    ({"gradient_predivide_factor": float("inf")}, ValueError, "gradient_predivide_factor"),
    ({"num_groups": -1}, ValueError, "num_groups"),
    ({"slowdown": 5}, TypeError, "slowdown"),
    ({"telemetry": 5}, TypeError, "telemetry"),
    ({"sampler": [0, 1]}, TypeError, "sampler must be a horovod_hetero.torch.DistributedSampler"),
    ({"strategy": hh.LocalSGD(2), "op": hvd.Adasum}, ValueError, "op must be hvd.Average with LocalSGD"),
    # Horovod's gradient-allreduce options under model averaging: refused by name, never ignored
    ({"strategy": hh.ESync(), "compression": hvd.Compression.fp16}, ValueError,
     r"^compression: Horovod's options for the gradient allreduce, which ESync does not run"),
    ({"strategy": hh.LocalSGD(2), "gradient_predivide_factor": 2.0, "groups": 2, "sparse_as_dense": True}, ValueError,
     r"^gradient_predivide_factor, groups, sparse_as_dense: .* strategy=hh.Synchronous\(\)"),
    ({"strategy": hh.LocalSGD(2), "num_groups": 2}, ValueError, r"^num_groups: Horovod's options"),  # the name given
    ({"strategy": hh.LocalSGD(2), "aggregate": "normalized"}, TypeError, r"^aggregate must be hh.Mean\(...\) or hh.Normalized"),
    ({"strategy": hh.ESync(), "aggregate": hh.OuterSGD(0.7)}, TypeError, r"^aggregate must be hh.Mean"),
    ({"aggregate": hh.Normalized()}, ValueError, r"^aggregate=Normalized\(\) combines .* Synchronous averages gradients"),
    ({"strategy": hh.Balanced(global_batch=8), "aggregate": hh.Mean(hh.OuterSGD(0.5))}, ValueError,
     r"Balanced averages gradients every step"),
])
def test_bad_arguments_are_refused_before_init(kwargs, error, match):
    with pytest.raises(error, match=match):
        hh.DistributedOptimizer(sgd(), **kwargs)


def test_not_an_optimizer():
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        hh.DistributedOptimizer(torch.nn.Linear(2, 2))


def test_keras_callbacks_check_their_arguments():
    keras_hh = pytest.importorskip("horovod_hetero.tensorflow.keras")
    with pytest.raises(TypeError, match=r"^strategy must be a strategy, e\.g\. hh\.LocalSGD\(period=8\)"):
        keras_hh.callbacks.HeteroSyncCallback(None)
    with pytest.raises(ValueError, match="period"):
        keras_hh.callbacks.LocalSGDCallback(period=0)
    with pytest.raises(ValueError, match="mode must be one of"):
        keras_hh.callbacks.ESyncCallback(mode="fast")
    with pytest.raises(TypeError, match="batch_size"):
        keras_hh.callbacks.LocalSGDCallback(period=2, batch_size=1.5)
    with pytest.raises(ValueError, match="share_epochs=True .* needs epoch_sync=True"):
        keras_hh.callbacks.ESyncCallback(epoch_sync=False, share_epochs=True)
    assert keras_hh.callbacks.ESyncCallback().share_epochs is True                  # the default, with epoch_sync
    assert keras_hh.callbacks.ESyncCallback(epoch_sync=False).share_epochs is False
    assert keras_hh.callbacks.ESyncCallback(share_epochs=False).share_epochs is False
    with pytest.raises(TypeError, match=r"share_epochs must be True, False or None \(the default: True with "
                                        r"epoch_sync\), got 'yes' \(str\)"):
        keras_hh.callbacks.ESyncCallback(share_epochs="yes")
    for build, removed in [(lambda: keras_hh.callbacks.ESyncCallback(global_lr=0.5), "ESyncCallback(global_lr=...)"),
                           (lambda: keras_hh.callbacks.LocalSGDCallback(8, outer=None), "LocalSGDCallback(outer=...)"),
                           (lambda: keras_hh.callbacks.HeteroSyncCallback(keras_hh.ESync(), global_lr=0.5),
                            "HeteroSyncCallback(global_lr=...)"),
                           (lambda: keras_hh.callbacks.ESyncCallback(esync_options={"aggregate": "normalized"}),
                            "esync_options(aggregate=...)")]:
        with pytest.raises(TypeError, match=rf"^{re.escape(removed)} was removed in horovod-hetero 0\.2\.0: "):
            build()


def test_one_keras_callback_runs_every_strategy_of_either_kind():
    keras_hh = pytest.importorskip("horovod_hetero.tensorflow.keras")
    cb = keras_hh.callbacks
    strategy = keras_hh.Balanced(global_batch=64, min_batch=4)
    balanced = cb.HeteroSyncCallback(strategy, None, None, None, 16, 30.0)      # positional, as its signature
    assert type(balanced) is cb.HeteroSyncCallback and balanced.strategy is strategy
    assert (balanced.batch_size, balanced.timeout) == (16, 30.0)
    assert type(cb.HeteroSyncCallback(keras_hh.Synchronous())) is cb.HeteroSyncCallback
    averaging = cb.HeteroSyncCallback(keras_hh.LocalSGD(4), aggregate=keras_hh.Normalized())
    assert type(averaging) is cb.HeteroSyncCallback and averaging.aggregate == keras_hh.Normalized()
    assert type(cb.LocalSGDCallback(4)) is cb.LocalSGDCallback
    built = cb.BalancedCallback(batch_size=16, min_batch=2)
    assert isinstance(built, cb.HeteroSyncCallback) and (built.strategy.global_batch, built.batch_size) == (None, 16)
    for given, error, match in [
            ({"aggregate": keras_hh.Normalized()}, ValueError, "Balanced averages gradients every step"),
            ({"timeout": 0}, ValueError, "^timeout must be"), ({"steps": 3}, TypeError, "unexpected keyword")]:
        with pytest.raises(error, match=match):
            cb.HeteroSyncCallback(keras_hh.Balanced(global_batch=64), **given)
    with pytest.raises(ValueError, match="give batch_size="):
        cb.BalancedCallback()
    with pytest.raises(ValueError, match="^Balanced has no global_batch: give batch_size="):
        runner_for(keras_hh.Balanced()).epoch_sizes(100, None, 4)                # what epoch_plan asks
    assert runner_for(keras_hh.Balanced(min_batch=4)).epoch_sizes(100, 16, 4) == (2, (16, 16, 16, 16))
    assert runner_for(keras_hh.LocalSGD(4)).epoch_sizes(100, 16, 4) is None     # its own batch, a share by speed


def test_which_keras_runs_follows_tensorflows_rule(monkeypatch):
    from horovod_hetero.keras import _backend as _keras

    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    assert _keras.keras_module().__name__ == "keras"
    tf_keras = pytest.importorskip("tf_keras")
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    assert _keras.keras_module() is tf_keras and _keras.keras_major() == 2


def test_a_keras_backend_without_horovod_collectives_is_refused_by_name(monkeypatch):
    from types import SimpleNamespace

    from horovod_hetero.keras import _backend as _keras

    jax = SimpleNamespace(backend=SimpleNamespace(backend=lambda: "jax"))
    monkeypatch.setattr(_keras, "keras_module", lambda: jax)
    with pytest.raises(ValueError, match="Keras backend 'jax' is not supported.*KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch"):
        _keras.collectives_class()


def test_keras_3_optimizer_refuses_keras_2_options_before_any_collective():
    keras_hh = pytest.importorskip("horovod_hetero.keras")
    if keras_hh.keras_major() < 3:
        pytest.skip("Keras 2: hh.DistributedOptimizer is hvd.DistributedOptimizer")
    with pytest.raises(TypeError, match="compression: options of Horovod's Keras 2 optimizer"):
        keras_hh.DistributedOptimizer(keras_hh.keras_module().optimizers.SGD(0.1), compression=None)
    with pytest.raises(ValueError, match="backward_passes_per_step=2: on Keras 3 .* gradient_accumulation_steps"):
        keras_hh.DistributedOptimizer(keras_hh.keras_module().optimizers.SGD(0.1), backward_passes_per_step=2)
    with pytest.raises(TypeError, match="average_aggregated_gradients must be True or False"):
        keras_hh.DistributedOptimizer(keras_hh.keras_module().optimizers.SGD(0.1), average_aggregated_gradients=1)


@pytest.mark.parametrize("make,match", [
    (lambda: hh.ESync(epsilon=float("inf")), "epsilon must be a finite number"),
    (lambda: hh.ESync(timeout=float("inf")), "timeout must be a finite number"),
    (lambda: hh.WAGMA(timeout=float("inf")), "timeout must be a finite number"),
    (lambda: hh.WAGMA(patience=float("-inf")), "patience must be a finite number"),
    (lambda: hh.DSSP((1, 3), tolerance=float("inf")), "tolerance must be a finite number"),
])
def test_infinite_numbers_are_refused_where_only_finite_ones_make_sense(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("named", [5, [("w",)], "ab"])
def test_named_tensors_that_are_not_pairs_name_the_argument(named):
    from horovod_hetero.torch.optimizer import _named
    with pytest.raises(ValueError, match=r"named_parameters must be a sequence of \(name, tensor\) tuples"):
        _named(named, "named_parameters", [])


# --- arguments removed in 0.2.0: a TypeError that names what replaces them -----------------------------------

@pytest.mark.parametrize("build, removed, replacement", [
    (lambda: hh_strategies.ESync(global_lr=0.5), "ESync(global_lr=...)", "aggregate=hh.Mean(outer=hh.OuterSGD(lr=global_lr))"),
    (lambda: hh_strategies.LocalSGD(8, aggregate="normalized"), "LocalSGD(aggregate=...)", "aggregate=hh.Normalized()"),
    (lambda: hh_strategies.ElasticBSP(outer=None), "ElasticBSP(outer=...)", "aggregate=hh.Mean(outer=hh.OuterSGD(...))"),
    (lambda: hh_strategies.WAGMA(aggregate="mean"), "WAGMA(aggregate=...)", "hh.DistributedOptimizer(..., aggregate="),
    (lambda: hh_strategies.DSSP(outer=None), "DSSP(outer=...)", "hh.Normalized(outer=...)"),
    (lambda: hh_strategies.ADSP(aggregate="normalized"), "ADSP(aggregate=...)", "the Keras callback's aggregate="),
])
def test_a_removed_strategy_argument_names_its_replacement(build, removed, replacement):
    with pytest.raises(TypeError) as error:
        build()
    message = str(error.value)
    assert message.startswith(f"{removed} was removed in horovod-hetero 0.2.0: ") and replacement in message
    assert message.endswith("(see CHANGELOG.md)")


def test_esync_s_old_first_argument_is_named():
    with pytest.raises(TypeError, match=r"got 0\.5 \(ESync's first argument was global_lr before 0\.2\.0: give it as "
                                        r"hh\.DistributedOptimizer\(\.\.\., aggregate=hh\.Mean\(outer=hh\.OuterSGD"):
        hh_strategies.ESync(0.5)
    with pytest.raises(ValueError, match=r"^mode must be one of 'blocking', 'delayed_ack', got 'fast'$"):
        hh_strategies.ESync("fast")


def test_a_strategy_that_takes_a_removed_name_itself_keeps_it():
    class Outer(hh_strategies.ModelAveraging):
        def __init__(self, outer):
            super().__init__()
            self.outer = outer

    assert Outer(outer=3).outer == 3
