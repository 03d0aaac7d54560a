"""What Horovod's Keras callbacks give (on Keras 2 only, in Horovod 0.28.1), for any Keras: the
initial broadcast, metric averaging, learning-rate warm-up.

Horovod 0.28.1's callbacks use Keras 2's variable API and raise on Keras 3. These work on Keras 3
with the TensorFlow or PyTorch backend and on Keras 2, through the backend's ``Collectives``.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from horovod_hetero.common.process_sets import check_process_set
from horovod_hetero.keras._backend import collectives_class, sync_epoch, value, weights
from horovod_hetero.keras._optimizer import optimizer_variables
from horovod_hetero.keras._train_guard import begin_training
from horovod_hetero.runtime.seams import DEFAULT_TIMEOUT_S
from horovod_hetero.validation import check_bool, check_float, check_int

if TYPE_CHECKING:
    from horovod.common.process_sets import ProcessSet

log = logging.getLogger("horovod_hetero")


class BroadcastGlobalVariablesCallbackImpl:
    """Broadcast the model's weights and its optimizer's variables from ``root_rank`` (a global rank)
    once: when training begins if they exist, else after the first batch (a model built by its
    first batch: put this callback first then). Random-generator states stay each rank's own."""

    model: Any                         # set by Keras (set_model) before any hook runs

    def __init__(self, root_rank: int = 0, process_set: ProcessSet | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__()
        self.root_rank = check_int("root_rank", root_rank, 0)
        self.process_set = check_process_set(process_set)        # membership: at fit, after hvd.init()
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
        self.broadcast_done = False

    def _broadcast(self) -> bool:
        chosen = weights(self.model)
        if not chosen:
            return False
        chosen += optimizer_variables(getattr(self.model, "optimizer", None))
        collectives = collectives_class()(self.process_set, self.timeout, owner=type(self).__name__)
        if self.root_rank not in collectives.process_set.ranks:
            raise ValueError(f"root_rank={self.root_rank} is not in the process set (ranks "
                             f"{collectives.process_set.ranks}); root_rank is a global rank")
        values = collectives.broadcast([value(v) for v in chosen], self.root_rank,
                                       name="horovod_hetero.broadcast_variables", what="the initial variables' broadcast")
        for variable, new in zip(chosen, values):
            variable.assign(new)
        return True

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        begin_training(self.model, self.timeout)
        if not self.broadcast_done:
            self.broadcast_done = self._broadcast()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.broadcast_done:
            self.broadcast_done = self._broadcast()


class MetricAverageCallbackImpl:
    """At the end of every epoch, replace each numeric entry of ``logs`` by its mean over the ranks
    (put it before callbacks that read the logs: checkpoints, early stopping, LR schedules). A
    strategy callback of the same ``fit`` with ``epoch_sync`` syncs the model first, wherever it is
    in the list (``keras._backend.sync_epoch``)."""

    model: Any                         # set by Keras (set_model) before any hook runs

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__()
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        begin_training(self.model, self.timeout)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
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

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        super().__init__()
        self.initial_lr = check_float("initial_lr", initial_lr, 0.0, min_exclusive=True)
        self.warmup_epochs = check_int("warmup_epochs", warmup_epochs, 1)
        self.momentum_correction = check_bool("momentum_correction", momentum_correction)
        self.steps_per_epoch = None if steps_per_epoch is None else check_int("steps_per_epoch", steps_per_epoch, 1)
        self.verbose = check_int("verbose", verbose, 0)
        self._epoch = 0
        self._restore: float | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        begin_training(self.model)
        collectives = collectives_class()(None, DEFAULT_TIMEOUT_S, owner=type(self).__name__)
        self._size, self._rank = collectives.size, collectives.rank
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__}: fit() does not tell the number of batches per epoch; "
                                 f"pass steps_per_epoch=")

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def learning_rate(self, epoch: float) -> float:
        """Horovod's warm-up multiplier at fractional ``epoch`` times ``initial_lr``."""
        if self.steps_per_epoch is None:
            raise RuntimeError(f"{type(self).__name__}.learning_rate: the batches per epoch are known once fit() "
                               f"begins; pass steps_per_epoch= to use it before")
        epoch += 1.0 / self.steps_per_epoch
        return self.initial_lr / self._size * (epoch * (self._size - 1) / self.warmup_epochs + 1)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._epoch >= self.warmup_epochs:
            return
        optimizer = self.model.optimizer
        old = float(np.asarray(optimizer.learning_rate))
        new = self.learning_rate(self._epoch + batch / cast(int, self.steps_per_epoch))   # set at on_train_begin
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

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._restore is not None:
            self.model.optimizer.momentum.assign(self._restore)
            self._restore = None

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        lr = float(np.asarray(self.model.optimizer.learning_rate))
        if logs is not None:
            logs["lr"] = lr
        if epoch == self.warmup_epochs - 1 and self.verbose and self._rank == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {lr:g}.")
