"""What Horovod's Keras API gives (on Keras 2 only, in Horovod 0.28.1), for any Keras: synchronous
training, the initial broadcast, metric averaging, learning-rate warm-up; the refusal of what would
go wrong silently; and a lost rank named (``RankLostError``) when synchronous training's average fails inside ``fit``.

Horovod 0.28.1 hooks Keras 2's optimizer methods and variable API: on Keras 3 its
``DistributedOptimizer`` averages nothing and its callbacks raise. Everything here works on Keras 3
with the TensorFlow or PyTorch backend and on Keras 2, through the backend's ``Collectives``.
"""
import logging
from typing import Any

import numpy as np

from horovod_hetero.keras._backend import collectives_class, keras_major, keras_module, sync_epoch, value, weights
from horovod_hetero.common import compat
from horovod_hetero.common.process_sets import check_process_set
from horovod_hetero.common.ranks import collective_failed, under_elastic
from horovod_hetero.runtime.seams import DEFAULT_TIMEOUT_S
from horovod_hetero.runtime.controller import rank_lost_error
from horovod_hetero.validation import check_bool, check_float, check_int

log = logging.getLogger("horovod_hetero")


def _optimizer_variables(optimizer):
    if optimizer is None:
        return []
    found = optimizer.variables      # a method on Keras 2's OptimizerV2, a property elsewhere
    return list(found() if callable(found) else found)


def _averages(optimizer):
    return getattr(type(optimizer), "_hh_averaging", False)


def check_optimizer(model):
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
                        "(import horovod_hetero.keras as hh)")
    if _averages(getattr(optimizer, "inner_optimizer", None)):
        raise TypeError("model.optimizer is a LossScaleOptimizer around hh.DistributedOptimizer (compile wraps it so "
                        "under mixed_float16): a rank whose own gradients overflow would skip the average and ranks "
                        "would fall out of step. Wrap the other way round: "
                        "hh.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(optimizer))")
    if _averages(optimizer) and keras_module().backend.backend() == "tensorflow" and getattr(model, "jit_compile", False):
        raise ValueError("hh.DistributedOptimizer averages with Horovod's TensorFlow ops, which do not run under XLA: "
                         "compile the model with jit_compile=False (Keras turns XLA on by default on GPUs)")


def check_keras_optimizer(optimizer, name="optimizer"):
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
    (not tracked by Keras, so never saved): ``scale``, each gradient's factor before the mean (1; a
    ``BalancedCallback`` sets its rank's share of the global batch times the number of ranks, so the mean
    is the union batch's gradient), and ``seconds``, the time the last average took (the wait for the
    other ranks, which the step's own compute excludes). Both are Keras variables: a compiled step reads
    and assigns them."""

    def __init__(self):
        keras = keras_module()
        self.scale = keras.Variable(1.0, trainable=False, dtype="float32", name="hh_gradient_scale")
        self.seconds = keras.Variable(0.0, trainable=False, dtype="float32", name="hh_gradient_seconds")


def averaging_optimizer(optimizer, collectives):
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

    def apply(self, grads, trainable_variables=None):
        targets = self._trainable_variables if trainable_variables is None else trainable_variables
        scale = ops.convert_to_tensor(value(state.scale))
        grads = [ops.zeros_like(v) if g is None else g * ops.cast(scale, g.dtype) for g, v in zip(grads, targets)]
        averaged, seconds = collectives.timed_mean(grads, name="horovod_hetero.gradients")
        state.seconds.assign(ops.cast(seconds, "float32"))
        return base.apply(self, averaged, trainable_variables)

    return compat.subclass_in_place(optimizer, {
        "apply": apply, "_hh_averaging": True, "_hh_collectives": collectives, "_hh_gradient": state})


def step_collectives(optimizer, timeout=DEFAULT_TIMEOUT_S):
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


class GuardedTrainFunction:
    """``model.train_function`` whose failed gradient average raises ``RankLostError``.

    The average runs inside the step Keras compiles (TensorFlow) or traces (torch), past every
    callback: a lost rank comes out of ``fit`` as TensorFlow's ``UnknownError`` naming Horovod's
    shutdown, or torch's ``HorovodInternalError``. Whatever ``collective_failed`` recognises becomes
    the ``RankLostError`` the strategies' callbacks raise (``CollectiveTimeoutError`` stays one),
    naming the gradient allreduce, the step (the optimizer's ``iterations`` + 1; with
    ``steps_per_execution`` > 1 the first step of the failed execution) and the lost rank
    (``collectives.lost_ranks``); round 0, as for torch's ``Synchronous``: no model-averaging round
    runs. Other errors pass unchanged; attributes are the wrapped function's (TensorBoard reads them).
    Keras' ``fit`` re-raises it ``from None``: the original error is its ``__context__``.
    """

    def __init__(self, function, model, collectives):
        self.__wrapped__, self._model, self._collectives = function, model, collectives
        self.restart()

    def restart(self):
        """Take the step count from the optimizer (a ``fit`` begins: it may have loaded a checkpoint)."""
        self._done = self._iterations()
        per_call: Any = getattr(self._model, "_steps_per_execution", None)  # Keras 2: a variable
        if per_call is None:
            per_call = getattr(self._model, "steps_per_execution", 1)
        self._single = int(value(per_call) if hasattr(per_call, "value") else per_call) == 1

    def _iterations(self):
        return int(value(self._model.optimizer.iterations))

    def __call__(self, *args, **kwargs):
        try:
            logs = self.__wrapped__(*args, **kwargs)
        except Exception as error:
            if not collective_failed(error):
                raise
            # the steps done before this call: in a compiled step the optimizer's iterations may
            # already count the failed one (its increment does not wait for the average)
            step = self._done + 1
            raise rank_lost_error(error, f"the gradient allreduce of step {step}", 0, step, self._collectives.rank,
                                  self._collectives.lost_ranks()) from error
        # one step per call: counted here, no read of a variable (a device sync) per step
        self._done = self._done + 1 if self._single else self._iterations()
        return logs

    def __getattr__(self, name):
        return getattr(self.__wrapped__, name)


def guard_train_function(model, timeout=DEFAULT_TIMEOUT_S):
    """Wrap ``model.train_function`` in a ``GuardedTrainFunction`` if its optimizer averages inside
    the step (``step_collectives``), once per train function (later fits only ``restart`` it); first
    note where every rank runs (``know_peers``: an object allgather, so on every rank at the same
    point: ``on_train_begin``, which Keras 2 and 3 call after ``make_train_function``). Not under
    ``hvd.elastic`` (``HOROVOD_ELASTIC=1``), whose reset needs Horovod's error."""
    function = getattr(model, "train_function", None)
    if isinstance(function, GuardedTrainFunction):
        function.restart()
        return
    if function is None or under_elastic():
        return
    collectives = step_collectives(getattr(model, "optimizer", None), timeout)
    if collectives is not None:
        collectives.know_peers()
        compat.replace_train_function(model, GuardedTrainFunction(function, model, collectives))


def begin_training(model, timeout=DEFAULT_TIMEOUT_S):
    """What every hh callback does when training begins: ``check_optimizer``, then
    ``guard_train_function`` (the first callback wraps, on every rank alike)."""
    check_optimizer(model)
    guard_train_function(model, timeout)


class BroadcastGlobalVariablesCallbackImpl:
    """Broadcast the model's weights and its optimizer's variables from ``root_rank`` (a global rank)
    once: when training begins if they exist, else after the first batch (a model built by its
    first batch: put this callback first then). Random-generator states stay each rank's own."""

    model: Any                         # set by Keras (set_model) before any hook runs

    def __init__(self, root_rank=0, process_set=None, timeout=DEFAULT_TIMEOUT_S):
        super().__init__()
        self.root_rank = check_int("root_rank", root_rank, 0)
        self.process_set = check_process_set(process_set)        # membership: at fit, after hvd.init()
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
        self.broadcast_done = False

    def _broadcast(self):
        chosen = weights(self.model)
        if not chosen:
            return False
        chosen += _optimizer_variables(getattr(self.model, "optimizer", None))
        collectives = collectives_class()(self.process_set, self.timeout, owner=type(self).__name__)
        if self.root_rank not in collectives.process_set.ranks:
            raise ValueError(f"root_rank={self.root_rank} is not in the process set (ranks "
                             f"{collectives.process_set.ranks}); root_rank is a global rank")
        values = collectives.broadcast([value(v) for v in chosen], self.root_rank,
                                       name="horovod_hetero.broadcast_variables", what="the initial variables' broadcast")
        for variable, new in zip(chosen, values):
            variable.assign(new)
        return True

    def on_train_begin(self, logs=None):
        begin_training(self.model, self.timeout)
        if not self.broadcast_done:
            self.broadcast_done = self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self.broadcast_done:
            self.broadcast_done = self._broadcast()


class MetricAverageCallbackImpl:
    """At the end of every epoch, replace each numeric entry of ``logs`` by its mean over the ranks
    (put it before callbacks that read the logs: checkpoints, early stopping, LR schedules). A
    strategy callback of the same ``fit`` with ``epoch_sync`` syncs the model first, wherever it is
    in the list (``keras._backend.sync_epoch``)."""

    model: Any                         # set by Keras (set_model) before any hook runs

    def __init__(self, timeout=DEFAULT_TIMEOUT_S):
        super().__init__()
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)

    def on_train_begin(self, logs=None):
        begin_training(self.model, self.timeout)

    def on_epoch_end(self, epoch, logs=None):
        sync_epoch(self.model, epoch)           # a strategy callback later in the list syncs now
        if logs is None:
            return
        mine = {k: float(np.asarray(v)) for k, v in sorted(logs.items()) if np.ndim(np.asarray(v)) == 0}
        collectives = collectives_class()(None, self.timeout, owner=type(self).__name__)
        everyone = collectives.allgather_object(mine, what="the metric average")
        for key in mine:
            logs[key] = float(np.mean([values[key] for values in everyone if key in values]))


class LearningRateWarmupCallbackImpl:
    """Horovod's learning-rate warm-up: over ``warmup_epochs`` the rate grows per batch from
    ``initial_lr / size`` to ``initial_lr`` (Goyal et al., "Accurate, Large Minibatch SGD"), with
    Horovod's formula. Momentum correction needs a momentum variable (Keras 2's legacy optimizers,
    ``tf_keras.optimizers.legacy``); elsewhere momentum is a constant of the compiled step, so it is
    skipped (logged once)."""

    model: Any                         # set by Keras (set_model) before any hook runs
    params: dict[str, Any]             # set by Keras (set_params)

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__()
        self.initial_lr = check_float("initial_lr", initial_lr, 0.0, min_exclusive=True)
        self.warmup_epochs = check_int("warmup_epochs", warmup_epochs, 1)
        self.momentum_correction = check_bool("momentum_correction", momentum_correction)
        self.steps_per_epoch = None if steps_per_epoch is None else check_int("steps_per_epoch", steps_per_epoch, 1)
        self.verbose = check_int("verbose", verbose, 0)
        self._epoch, self._restore = 0, None

    def on_train_begin(self, logs=None):
        begin_training(self.model)
        collectives = collectives_class()(None, DEFAULT_TIMEOUT_S, owner=type(self).__name__)
        self._size, self._rank = collectives.size, collectives.rank
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__}: fit() does not tell the number of batches per epoch; "
                                 f"pass steps_per_epoch=")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def learning_rate(self, epoch):
        """Horovod's warm-up multiplier at fractional ``epoch`` times ``initial_lr``."""
        if self.steps_per_epoch is None:
            raise RuntimeError(f"{type(self).__name__}.learning_rate: the batches per epoch are known once fit() "
                               f"begins; pass steps_per_epoch= to use it before")
        epoch += 1.0 / self.steps_per_epoch
        return self.initial_lr / self._size * (epoch * (self._size - 1) / self.warmup_epochs + 1)

    def on_train_batch_begin(self, batch, logs=None):
        if self._epoch >= self.warmup_epochs:
            return
        optimizer = self.model.optimizer
        old = float(np.asarray(optimizer.learning_rate))
        new = self.learning_rate(self._epoch + batch / self.steps_per_epoch)
        optimizer.learning_rate = new
        momentum = getattr(optimizer, "momentum", None)
        if self.momentum_correction and momentum is not None and old > 0:
            if hasattr(momentum, "assign"):
                self._restore = float(np.asarray(momentum))
                momentum.assign(self._restore * new / old)
            elif momentum and not getattr(self, "_warned", False):
                self._warned = True
                log.warning("%s: the optimizer's momentum is a constant, so momentum correction is skipped",
                            type(self).__name__)

    def on_train_batch_end(self, batch, logs=None):
        if self._restore is not None:
            self.model.optimizer.momentum.assign(self._restore)
            self._restore = None

    def on_epoch_end(self, epoch, logs=None):
        lr = float(np.asarray(self.model.optimizer.learning_rate))
        if logs is not None:
            logs["lr"] = lr
        if epoch == self.warmup_epochs - 1 and self.verbose and self._rank == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {lr:g}.")
