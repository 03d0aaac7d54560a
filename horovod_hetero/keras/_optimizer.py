"""Synchronous training for any Keras: ``hh.DistributedOptimizer``'s gradient average inside the
compiled step, and the refusal of optimizers that would let ranks train apart silently.

Horovod 0.28.1 hooks Keras 2's optimizer methods: on Keras 3 its ``DistributedOptimizer`` averages
nothing. This works on Keras 3 with the TensorFlow or PyTorch backend and on Keras 2, through the
backend's ``Collectives``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from horovod_hetero.common import compat
from horovod_hetero.keras._backend import collectives_class, keras_major, keras_module, switch, value
from horovod_hetero.runtime.seams import DEFAULT_TIMEOUT_S
from horovod_hetero.errors import troubleshooting

if TYPE_CHECKING:
    from horovod_hetero.common.horovod_collectives import HorovodCollectives
    from horovod_hetero.runtime.seams import Collectives
    from horovod_hetero.strategies import Strategy

def optimizer_variables(optimizer: Any) -> list[Any]:
    """The optimizer's variables, a list (none for ``None``)."""
    if optimizer is None:
        return []
    found = optimizer.variables      # a method on Keras 2's OptimizerV2, a property elsewhere
    return list(found() if callable(found) else found)


def _averages(optimizer: Any) -> bool:
    return getattr(type(optimizer), "_hh_averaging", False)


def check_optimizer(model: Any) -> None:
    """Refuse, by name, optimizers that would let ranks train apart or fall out of step on Keras 3:
    ``hvd.DistributedOptimizer`` (averages nothing there), a loss-scale optimizer around
    ``hh.DistributedOptimizer`` (each rank would skip the average when its own gradients overflow),
    and ``hh.DistributedOptimizer`` under XLA on TensorFlow (Horovod's ops do not compile)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or keras_major() < 3:
        return
    if type(optimizer).__module__.startswith("horovod."):
        raise TypeError("model.optimizer is hvd.DistributedOptimizer, which averages nothing under Keras 3 (Horovod "
                        "0.28.1 hooks Keras 2's optimizer methods, which Keras 3's fit never calls): ranks would "
                        "train apart silently. Wrap the optimizer with hh.DistributedOptimizer "
                        "(import horovod_hetero.keras as hh)\n" + troubleshooting("troubleshooting-keras3-horovod-optimizer"))
    if _averages(getattr(optimizer, "inner_optimizer", None)):
        raise TypeError("model.optimizer is a LossScaleOptimizer around hh.DistributedOptimizer (compile wraps it so "
                        "under mixed_float16): a rank whose own gradients overflow would skip the average and ranks "
                        "would fall out of step. Wrap the other way round: "
                        "hh.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(optimizer))\n"
                        + troubleshooting("troubleshooting-keras3-horovod-optimizer"))
    if _averages(optimizer) and keras_module().backend.backend() == "tensorflow" and getattr(model, "jit_compile", False):
        raise ValueError("hh.DistributedOptimizer averages with Horovod's TensorFlow ops, which do not run under XLA: "
                         "compile the model with jit_compile=False (Keras turns XLA on by default on GPUs)\n"
                         + troubleshooting("troubleshooting-keras3-horovod-optimizer"))


def check_keras_optimizer(optimizer: Any, name: str = "optimizer") -> Any:
    """``optimizer`` if it is an optimizer of the Keras that runs (Keras 2: also a legacy one), else a
    ``TypeError`` naming ``name``."""
    optimizers = keras_module().optimizers
    kinds = tuple(k for k in (optimizers.Optimizer, getattr(getattr(optimizers, "legacy", None), "Optimizer", None))
                  if isinstance(k, type))
    if not isinstance(optimizer, kinds):
        raise TypeError(f"{name} must be a Keras optimizer (an instance of {kinds[0].__module__.split('.')[0]}."
                        f"optimizers.Optimizer, e.g. keras.optimizers.SGD(0.05)), got {optimizer!r} "
                        f"({type(optimizer).__name__})")
    return optimizer


class GradientScale:
    """What ``hh.DistributedOptimizer``'s average reads and writes each step, beside the model's variables
    (not tracked by Keras, so never saved): ``active``, whether the gradients are averaged at all (1; a
    strategy callback running a model-averaging strategy sets 0: each rank steps with its own), ``scale``,
    each gradient's factor before the mean (1; a strategy that weighs the ranks, ``Balanced``, sets its
    rank's share of the global batch times the number of ranks, so the mean is the union batch's
    gradient), and ``seconds``, the time the last average took (the wait for the other ranks, which the
    step's own compute excludes). All are Keras variables: a compiled step reads and assigns them, so a
    strategy can change between fits and inside one."""

    def __init__(self) -> None:
        keras = keras_module()
        self.active = keras.Variable(1.0, trainable=False, dtype="float32", name="hh_gradient_active")
        self.scale = keras.Variable(1.0, trainable=False, dtype="float32", name="hh_gradient_scale")
        self.seconds = keras.Variable(0.0, trainable=False, dtype="float32", name="hh_gradient_seconds")


def averaging_optimizer(optimizer: Any, collectives: Collectives) -> Any:
    """``optimizer`` (a Keras 3 optimizer), whose ``apply`` now first averages the gradients over
    ``collectives``: synchronous data-parallel SGD.

    The instance is kept (its state, learning-rate schedule and options) and its class becomes a
    subclass with the same name and module, so ``isinstance`` holds and a saved model reloads with
    the plain optimizer. A missing gradient is averaged as zeros, so every rank averages the same
    list of tensors (as Horovod's torch optimizer does). Each gradient is multiplied by the class's
    ``GradientScale.scale`` (1 unless a ``BalancedCallback`` weighs the ranks) and the average timed."""
    base = type(optimizer)
    if _averages(optimizer):
        return optimizer
    ops = keras_module().ops
    state = GradientScale()

    def apply(self: Any, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        targets = self._trainable_variables if trainable_variables is None else trainable_variables
        grads = [ops.zeros_like(v) if g is None else g for g, v in zip(grads, targets)]

        def average() -> tuple[list[Any], Any]:
            scale = ops.convert_to_tensor(value(state.scale))
            averaged, seconds = collectives.timed_mean([g * ops.cast(scale, g.dtype) for g in grads],
                                                       name="horovod_hetero.gradients")
            return list(averaged), ops.cast(seconds, "float32")

        def own() -> tuple[list[Any], Any]:        # a model-averaging strategy runs: each rank's own
            return list(grads), ops.zeros((), "float32")

        grads, seconds = switch(state.active, average, own)
        state.seconds.assign(seconds)
        return base.apply(self, grads, trainable_variables)

    return compat.subclass_in_place(optimizer, {
        "apply": apply, "_hh_averaging": True, "_hh_collectives": collectives, "_hh_gradient": state})


class KerasGradients:
    """The Keras ``Gradients`` (``runtime.runner``): the average inside the model's optimizer, which a strategy's
    runner opens or closes. ``hh.DistributedOptimizer`` (Keras 3) has a switch (``GradientScale.active``) and a
    weight (``scale``); Horovod's Keras 2 ``hvd.DistributedOptimizer`` always averages; a plain optimizer never
    does. Asking for what the compiled optimizer cannot do is a ``TypeError`` naming the fix.

    Args:
        model: the Keras model (its optimizer is read when the runner asks, after ``compile``).
        strategy: ``() -> the strategy``, named in the errors.
        root: ``() -> the set's first rank`` (every rank takes its model at a sync with the average open).
    """

    def __init__(self, model: Any, strategy: Callable[[], Strategy], root: Callable[[], int]) -> None:
        self._model, self._strategy, self._root = model, strategy, root
        self._weight: Callable[[], float] | None = None
        self._opened = False

    def _state(self) -> GradientScale | None:
        return getattr(type(getattr(self._model, "optimizer", None)), "_hh_gradient", None)

    def open(self, weight: Callable[[], float] | None) -> None:
        state, optimizer = self._state(), getattr(self._model, "optimizer", None)
        name = type(self._strategy()).__name__
        if state is None and (weight is not None or not compat.is_horovod_keras2_optimizer(optimizer)):
            raise TypeError(f"{name} averages the gradients inside every step: compile the model with "
                            f"hh.DistributedOptimizer(optimizer) (Keras 3)"
                            + ("" if weight is None else ", which weighs each rank's gradient")
                            + f", not with {type(optimizer).__name__}\n"
                            + troubleshooting("troubleshooting-keras-switchable-optimizer"))
        self._weight, self._opened = weight, True
        if state is not None:
            state.active.assign(1.0)
            state.scale.assign(1.0)

    def close(self) -> None:
        state, optimizer = self._state(), getattr(self._model, "optimizer", None)
        if state is None and compat.is_horovod_keras2_optimizer(optimizer):
            raise TypeError(f"{type(self._strategy()).__name__} averages the models, but the model's optimizer is "
                            f"Horovod's hvd.DistributedOptimizer, which averages the gradients of every step too: "
                            f"compile with the plain optimizer (Keras 3: hh.DistributedOptimizer switches)\n"
                            + troubleshooting("troubleshooting-keras-switchable-optimizer"))
        self._weight, self._opened = None, False
        if state is not None:
            state.active.assign(0.0)

    def switchable(self) -> bool:
        """Whether the model's optimizer can switch its average on and off (``hh.DistributedOptimizer`` on Keras 3)."""
        return self._state() is not None

    def join(self) -> int | None:
        """With the average open every rank took the same steps inside ``fit``: the set's first rank's model
        and counters are every rank's (``None`` closed: the rounds join)."""
        return self._root() if self._opened else None

    def begin_fit(self, size: int) -> None:
        """At a ``fit``'s start: the weight of this rank's gradient for its batches (constant within a ``fit``:
        Keras fixes its batch size), as the mean's factor, ``weight * size``."""
        state = self._state()
        if state is not None and self._weight is not None:
            state.scale.assign(float(self._weight()) * size)

    def seconds(self) -> float:
        """The seconds the last average took (0 where none ran)."""
        state = self._state()
        return 0.0 if state is None else float(np.asarray(value(state.seconds)))


def step_collectives(optimizer: Any, timeout: float = DEFAULT_TIMEOUT_S) -> HorovodCollectives | None:
    """The ``Collectives`` that average gradients inside ``optimizer``'s update, hence inside Keras'
    compiled train step: ``hh.DistributedOptimizer``'s, or for Horovod's Keras 2
    ``hvd.DistributedOptimizer`` ones over its process set (made once, ``timeout`` for their object
    collectives); None for an optimizer that averages nothing."""
    found = getattr(optimizer, "_hh_collectives", None)
    if found is None and compat.is_horovod_keras2_optimizer(optimizer):
        found = collectives_class()(optimizer.process_set, timeout, owner="hvd.DistributedOptimizer",
                                    members_only=False)
        optimizer._hh_collectives = found
    return found if found is not None and found.included else None

