"""Keras adapter, any Keras (3 with the TensorFlow or PyTorch backend, or 2): ``import horovod_hetero.keras as hh``.

Next to ``import horovod.tensorflow as hvd`` (TensorFlow backend, Keras 2 or 3) or
``import horovod.torch as hvd`` (``KERAS_BACKEND=torch``); the callbacks are in ``hh.callbacks``.
``horovod_hetero.tensorflow.keras`` is the same module under Horovod's name for it. Every strategy class of
``strategies.registry.REGISTRY`` is ``hh.<its name>``, looked up when it is read.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from horovod_hetero.common.process_sets import check_process_set, wagma_process_sets  # noqa: F401
from horovod_hetero.keras._backend import collectives_class, keras_major, keras_module  # noqa: F401
from horovod_hetero.keras._optimizer import averaging_optimizer, check_keras_optimizer
from horovod_hetero.errors import (  # noqa: F401
    CollectiveTimeoutError, ElasticResetError, HeteroError, RankLostError, RoundMismatchError)
from horovod_hetero.keras import callbacks  # noqa: F401
from horovod_hetero.runtime.seams import DEFAULT_TIMEOUT_S
from horovod_hetero.strategies import (  # noqa: F401
    GradientAveraging, GradientWeighting, Mean, ModelAveraging, Normalized, OuterSGD, Steps, Strategy)
import horovod_hetero.auto  # noqa: F401  (registers hh.Auto, the strategy the library chooses)
from horovod_hetero.strategies.registry import REGISTRY, classes
from horovod_hetero.validation import check_bool, check_float, check_int

__all__ = ["DistributedOptimizer", "callbacks", "wagma_process_sets", "keras_module", "keras_major",
           "Strategy", "ModelAveraging", "GradientAveraging", "GradientWeighting", *(entry.cls.__name__ for entry in REGISTRY.values()), "Steps", "Mean", "Normalized", "OuterSGD",
           "HeteroError", "RankLostError", "CollectiveTimeoutError", "RoundMismatchError", "ElasticResetError"]

if TYPE_CHECKING:
    from horovod.common.process_sets import ProcessSet

    from horovod_hetero.strategies import (  # noqa: F401
        ADSP, Balanced, DSSP, ESync, ElasticBSP, LocalSGD, Synchronous, WAGMA)


def __getattr__(name: str) -> Any:
    """Every registered strategy class by its name (``strategies.registry.classes``: one registered after this
    module was imported too)."""
    try:
        return classes()[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(classes()))


def DistributedOptimizer(optimizer: Any, process_set: ProcessSet | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                         **horovod_options: Any) -> Any:
    """Synchronous data-parallel training for Keras: gradients averaged over the ranks every step.

    The ``Synchronous`` strategy for Keras (a callback cannot average gradients). On Keras 3 the
    optimizer's class becomes a subclass of it (same name; ``isinstance``, its state and schedule
    hold) whose ``apply`` averages the gradients with one grouped allreduce of the backend's Horovod
    (``horovod.tensorflow`` inside the compiled train step, or ``horovod.torch``) before updating:
    Horovod 0.28.1's own ``hvd.DistributedOptimizer`` hooks Keras 2's optimizer methods, which Keras
    3's ``fit`` never calls, so there it averages nothing. On Keras 2 this is ``hvd.DistributedOptimizer``.
    Under ``mixed_float16`` wrap a ``LossScaleOptimizer`` (``hh.DistributedOptimizer(
    keras.optimizers.LossScaleOptimizer(opt))``); on TensorFlow compile with ``jit_compile=False``
    where Keras would use XLA (GPUs): the hh callbacks refuse both mistakes by name. A lost rank
    fails the average inside the step; the first hh callback (``BroadcastGlobalVariablesCallback``)
    makes that error a ``RankLostError`` naming the step and the rank (``GuardedTrainFunction``).

    Args:
        optimizer: a Keras optimizer (of the Keras that runs).
        process_set: a Horovod ``ProcessSet`` or ``None`` (all ranks).
        timeout: seconds (finite, > 0) a gradient average may take with the PyTorch backend. TensorFlow's compiled
            step cannot be interrupted from Python: Gloo's own timeout bounds it
            (``HOROVOD_GLOO_TIMEOUT_SECONDS``, 30 s by default).
        horovod_options: Keras 2: passed to ``hvd.DistributedOptimizer`` (``compression``, ...). Keras 3:
            only ``backward_passes_per_step=1`` and ``average_aggregated_gradients`` (no effect with one
            pass), as Horovod's example passes them; anything else a ``TypeError``.

    Example::

        model.compile(optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss=...)
        model.fit(x, y, callbacks=[hh.callbacks.BroadcastGlobalVariablesCallback(0)])
    """
    check_keras_optimizer(optimizer)
    check_process_set(process_set)
    timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
    if keras_major() < 3:
        import horovod.tensorflow.keras as hvd_keras
        return hvd_keras.DistributedOptimizer(optimizer, process_set=process_set or hvd_keras.global_process_set,
                                              **horovod_options)
    passes = horovod_options.pop("backward_passes_per_step", 1)           # as Horovod's example passes them
    check_bool("average_aggregated_gradients", horovod_options.pop("average_aggregated_gradients", False))
    if check_int("backward_passes_per_step", passes, 1) != 1:
        raise ValueError(f"backward_passes_per_step={passes}: on Keras 3 hh.DistributedOptimizer averages the "
                         f"gradients of every step (1, the default); accumulate gradients with Keras' own "
                         f"gradient_accumulation_steps= of the optimizer instead")
    if horovod_options:
        raise TypeError(f"{', '.join(sorted(horovod_options))}: options of Horovod's Keras 2 optimizer; on Keras 3 "
                        f"hh.DistributedOptimizer takes optimizer, process_set, timeout, and "
                        f"backward_passes_per_step=1 and average_aggregated_gradients as Horovod's example "
                        f"passes them")
    return averaging_optimizer(optimizer, collectives_class()(process_set, timeout, owner="hh.DistributedOptimizer"))
