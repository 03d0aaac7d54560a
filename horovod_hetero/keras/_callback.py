"""The Keras strategy callback's logic, independent of the Keras version and backend and of the strategy.

``horovod_hetero.keras.callbacks`` mixes it into thin ``Callback`` classes; every strategy's
callback is ``HeteroSyncCallbackImpl`` with the strategy filled in. Nothing here imports TensorFlow
or torch: weights are read and written through the Keras variable API (``value``, ``assign``) and
Python operators, and the collectives are the backend's (``keras._backend.collectives_class``).
"""
from __future__ import annotations

import copy
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from horovod_hetero.keras._backend import collectives_class, strategy_callbacks, to_numpy, to_tensor, value, weights
from horovod_hetero.errors import troubleshooting
from horovod_hetero.keras._checkpoint import CheckpointState, carry_state
from horovod_hetero.keras._optimizer import KerasGradients
from horovod_hetero.keras._train_guard import begin_training
from horovod_hetero.common.options import check_run_options, check_samples_known
from horovod_hetero.common.process_sets import check_process_set
from horovod_hetero.common.ranks import follow_ranks
from horovod_hetero.rules.partition import epoch_indices, step_batch, step_times_of
from horovod_hetero.runtime.seams import DEFAULT_TIMEOUT_S, Model, Tensor
from horovod_hetero.runtime.controller import HeteroController, check_state
from horovod_hetero.runtime.runner import check_aggregate, runner_for
from horovod_hetero.runtime.straggler import Pacer, Slowdown
from horovod_hetero.strategies.balanced import Balanced
from horovod_hetero.strategies.registry import check_strategy, rebuild

log = logging.getLogger("horovod_hetero")
from horovod_hetero.validation import check_bool, check_float, check_int

if TYPE_CHECKING:
    from horovod.common.process_sets import ProcessSet

    from horovod_hetero.common.horovod_collectives import HorovodCollectives
    from horovod_hetero.runtime.membership import Membership
    from horovod_hetero.runtime.straggler import SlowdownFactors
    from horovod_hetero.runtime.telemetry import Telemetry
    from horovod_hetero.strategies import Aggregation, Strategy


def _is_float(variable: Any) -> bool:
    dtype = variable.dtype
    floating = getattr(dtype, "is_floating", None)
    return bool(floating) if floating is not None else "float" in str(dtype)


def _nbytes(variable: Any) -> int:
    size = getattr(variable.dtype, "size", None) or np.dtype(str(variable.dtype).replace("bfloat16", "float16")).itemsize
    return int(np.prod(tuple(variable.shape))) * size


def batch_loss(batches: int, mean: float, previous: tuple[int, float] | None) -> float:
    """The mean loss of the batches since the previous call, from Keras' running mean of the epoch.

    Keras logs at each batch's end the loss averaged over the epoch so far (its loss tracker is a
    ``Mean`` weighted by batch size), not the batch's own: a strategy that reads losses (ADSP's
    commit-rate search) would fit a lagging curve that restarts every epoch. ``batches`` is the
    number of batches the epoch has run (``batch + 1``), ``previous`` the ``(batches, mean)`` of
    the previous call in this epoch, or ``None``. Batches are taken as equally large (an epoch's
    last, partial batch counts as a full one); with ``steps_per_execution`` a call covers several
    batches and gets their mean.

    Example:
        >>> batch_loss(1, 2.0, None), batch_loss(2, 1.5, (1, 2.0)), batch_loss(4, 1.25, (2, 1.5))
        (2.0, 1.0, 1.0)
    """
    if previous is None or previous[0] >= batches:
        return mean
    count, before = previous
    return (batches * mean - count * before) / (batches - count)


class KerasModel(Model):
    """A Keras model's floating-point weights (trainable and not, so BatchNorm statistics too),
    looked up when first needed: a model built by its first batch has them by then."""

    def __init__(self, keras_model: Any) -> None:
        self._model = keras_model
        self._variables: list[Any] | None = None

    @property
    def variables(self) -> list[Any]:
        if not self._variables:                  # not cached while the model has no weights yet
            self._variables = [v for v in weights(self._model) if _is_float(v)]
        return self._variables

    def tensors(self) -> list[Tensor]:
        return [value(v) for v in self.variables]

    def assign(self, values: Sequence[Tensor], divisor: float = 1.0, add_current: bool = False) -> None:
        for v, s in zip(self.variables, values):
            if add_current:
                s = s + value(v)
            v.assign(s / divisor if divisor != 1.0 else s)

    def place(self, values: Sequence[Any]) -> list[Tensor]:
        values = list(values)
        if len(values) != len(self.variables):
            raise ValueError(f"{len(values)} tensors do not fit a model of {len(self.variables)} weights: "
                             f"state from another model?")
        out = []
        for v, variable in zip(values, self.variables):
            array = to_numpy(v)
            if array.shape != tuple(variable.shape):
                raise ValueError(f"a tensor of shape {array.shape} does not fit a weight of shape "
                                 f"{tuple(variable.shape)}: state from another model?")
            out.append(to_tensor(array, variable))
        return out

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(v) for v in self.variables)


class _EpochShared(int):
    """``model.stop_training`` while a strategy callback ends this rank's share of an epoch: truthy, so
    Keras leaves the epoch's loop, and told apart from the ``True`` another callback sets to end ``fit``
    (``EarlyStopping``), which the callback leaves as it is."""


EPOCH_SHARED = _EpochShared(1)


class StrategyCallbackImpl(CheckpointState):
    """The strategy callback's logic, for every strategy of either kind and any Keras: the strategy (``set_strategy``
    changes it at an epoch's end), the ranks it synchronises (``process_set``), the controller for Horovod's
    current ranks (made at the first ``fit``, after ``hvd.init()``; a new one after ``hvd.elastic``'s reset) with
    its runner, the model's gradient average as the runner opens or closes it (``KerasGradients``), its
    telemetry, and the strategy's state in Keras checkpoints (``CheckpointState``).

    With a model-averaging strategy the model is compiled with a plain optimizer (or ``hh.DistributedOptimizer``,
    whose average the callback switches off); after each batch the strategy decides whether the weights are
    averaged across the process set (or within a group); batches are counted across epochs. At every epoch's
    end (``epoch_sync``) and at the end of training every rank keeps joining the other ranks' rounds until all
    have finished, so all replicas hold identical weights even when ranks saw different numbers of batches;
    then what the strategy opened is closed. With a gradient-averaging strategy (``Synchronous``, ``Balanced``)
    the model is compiled with ``hh.DistributedOptimizer``, whose average the callback switches on (and weighs,
    for ``Balanced``), every rank takes the same batches, and the rounds only measure.

    With ``share_epochs`` (the default with ``epoch_sync``), ranks share each epoch by speed where the strategy
    lets fast ranks take more steps between rounds (not ``LocalSGD``, ``WAGMA`` without wait-avoidance,
    ``Synchronous`` or ``Balanced``: ``Strategy.lockstep``) and the ranks' speeds, as the rounds measured them,
    differ beyond their noise: Keras gives every rank the same batches per epoch (``steps_per_epoch``, or the
    batches of its arrays), so the fastest rank takes them all and every other rank as many as it takes in the
    same time (``rules.partition.epoch_steps``; identical on every rank after the previous epoch's sync), and
    ends its epoch there. Ranks then take different numbers of batches in an epoch, so no collective of your own
    may run per batch (rank 0's log says so at the first shared epoch). An epoch that begins before the speeds
    are known (the first) takes its shares from the round that first tells them apart; an epoch where a strategy
    (``hh.Auto``) switched from a lockstep one to one that is not shares the batches left after the switch.
    Ranks whose ``fit`` holds different numbers of batches (shards sized by hand) keep Keras' count.
    """

    model: Any                         # set by Keras (set_model) before any hook runs

    def __init__(self, strategy: Strategy, process_set: ProcessSet | None = None,
                 telemetry: Telemetry | str | os.PathLike[str] | None = None,
                 slowdown: SlowdownFactors | Slowdown | None = None, batch_size: int | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, epoch_sync: bool = True, share_epochs: bool | None = None,
                 aggregate: Aggregation | None = None) -> None:
        super().__init__()
        if strategy is None:
            raise TypeError("strategy must be a strategy, e.g. hh.LocalSGD(period=8), hh.ESync() or hh.Synchronous() "
                            "(with hh.DistributedOptimizer), not None")
        self._strategy = check_strategy(strategy)
        self.aggregate = check_aggregate(aggregate, self._strategy)
        self.process_set = check_process_set(process_set)        # membership: at fit, after hvd.init()
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
        check_run_options(telemetry, slowdown)                   # built at fit (they need the rank)
        self._telemetry, self._slowdown = telemetry, slowdown
        self.batch_size = None if batch_size is None else check_int("batch_size", batch_size, 1)
        self.epoch_sync = check_bool("epoch_sync", epoch_sync)
        if share_epochs is not None and not isinstance(share_epochs, bool):
            raise TypeError(f"share_epochs must be True, False or None (the default: True with epoch_sync), got "
                            f"{share_epochs!r} ({type(share_epochs).__name__})")
        self.share_epochs = self.epoch_sync if share_epochs is None else share_epochs
        if self.share_epochs and not self.epoch_sync:
            raise ValueError("share_epochs=True shares each epoch's batches among ranks that meet at its end: "
                             "it needs epoch_sync=True (with epoch_sync=False no epoch ends together; "
                             "drop share_epochs)")
        check_samples_known(slowdown, self.batch_size)
        # built at fit: it needs hvd.init() and the model
        self._membership: Membership[HeteroController] | None = None
        self._gradients: Any = None            # the model's gradient average (KerasGradients), at fit
        self._pending_state: dict[str, Any] | None = None
        self._loss_mean: tuple[int, float] | None = None   # (batches, Keras' running mean of the loss) this epoch
        self._synced_epoch: int | None = None  # the epoch whose end sync_model() ran (epoch_sync)
        self.epoch_shares: list[int] | None = None   # every rank's batches this epoch (None: Keras' own count)
        self._shared_from = 0                  # the batch a switch within this epoch left every rank at
        self._same_steps = False               # share_epochs, and every rank's fit has the same batches per epoch
        self._said_shared = False              # rank 0 said once that ranks share epochs
        # (epoch, this rank's batch, every rank's) of the latest epoch_plan
        self._epoch: tuple[int, int, tuple[int, ...] | None] | None = None

    @property
    def strategy(self) -> Strategy:
        """The strategy the callback runs (``set_strategy`` changes it)."""
        return self._strategy if self._hh is None else self._hh.strategy

    @property
    def _hh(self) -> HeteroController | None:
        """The controller, or None before the first fit."""
        return None if self._membership is None else self._membership.controller

    def _build(self, telemetry: Telemetry | str | os.PathLike[str] | None) -> HeteroController:
        """The controller for Horovod's current ranks (a new one after ``hvd.elastic``'s reset)."""
        collectives = collectives_class()(self.process_set, self.timeout, owner=type(self).__name__)
        slowdown = self._slowdown if isinstance(self._slowdown, Slowdown) else \
            Slowdown(collectives.rank, self._slowdown, size=collectives.size)
        if self._gradients is None:
            # root: the set's first rank, of the controller then (built by then: it asks only in a sync)
            self._gradients = KerasGradients(self.model, lambda: self.strategy, lambda: cast(
                "HorovodCollectives", cast(HeteroController, self._hh).collectives).root)
        # a strategy hands over (Auto) at an epoch's end, or within it where every rank is at the same batch
        controller = HeteroController(self.strategy, collectives, KerasModel(self.model), telemetry, [slowdown.pad],
                                      aggregate=self.aggregate, gradients=self._gradients,
                                      batches_planned=self._epoch is not None, handover_at_rounds=False)
        if self._pending_state is not None:            # loaded before the first fit
            controller.load_state_dict(self._pending_state)
            self._pending_state = None
        return controller

    def _follow(self) -> Membership[HeteroController]:
        """The ``Membership`` that gives the controller (made at the first fit: it needs ``hvd.init()``)."""
        if self._membership is None:
            # Membership[HeteroController]: _build makes no OutsideController (a non-member is refused there)
            membership = follow_ranks(collectives_class().hvd, self.process_set, self._telemetry, self._build)
            self._membership = cast("Membership[HeteroController]", membership)
        return self._membership

    def _hh_controller(self) -> HeteroController:
        return self._follow().current()

    @property
    def telemetry(self) -> Telemetry:
        return self._hh_controller().telemetry

    def _ranks(self) -> tuple[int, int]:
        hvd = collectives_class().hvd
        ps = self.process_set or hvd.global_process_set
        return ps.rank(), ps.size()

    # -- training --

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        begin_training(self.model, self.timeout)
        strategy_callbacks(self.model).add(self)
        carry_state(self.model, self)
        hh = self._hh_controller()
        if self._epoch is None and hh.runner.plans_batches:
            raise ValueError(f"{type(hh.strategy).__name__} plans every rank's batch: fit each epoch on "
                             f"callback.epoch_plan(len(x), epoch)'s indices and batch size\n"
                             + troubleshooting("troubleshooting-balanced-sampler"))
        if hh.strategy.runs is not hh.strategy and not self._gradients.switchable():
            raise TypeError(f"{type(hh.strategy).__name__} runs strategies of either kind in turn: compile the model "
                            f"with hh.DistributedOptimizer(optimizer) on Keras 3, whose average it switches on and off\n"
                            + troubleshooting("troubleshooting-keras-switchable-optimizer"))
        hh.runner.begin(self._gradients, hh.rank, hh.size)       # the model's average, as the runner needs it
        hh.start()
        self._gradients.begin_fit(hh.size)
        steps = (getattr(self, "params", None) or {}).get("steps")
        self._same_steps = self.share_epochs and len(set(hh.collectives.allgather_object(
            steps, what="every rank's batches per epoch (share_epochs)"))) == 1

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._loss_mean = None
        self._synced_epoch = None
        self._shared_from = 0
        self.epoch_shares = self._shares()

    def _shares(self) -> list[int] | None:
        """Every rank's batches this epoch by speed (``Runner.epoch_shares``; after a switch within the epoch,
        of the batches left), or None (Keras' own count):
        without ``share_epochs`` and ``epoch_sync``, without a known number of batches, when the ranks' fits
        hold different numbers (shards sized by hand), for a lockstep strategy, or before the rounds tell the
        ranks' speeds apart from their noise."""
        steps = (getattr(self, "params", None) or {}).get("steps")
        hh = self._hh
        done = self._shared_from               # a switch within the epoch: the batches left are shared
        left = int(steps or 0) - done
        if not self._same_steps or left <= 0 or hh is None:       # share_epochs in it
            return None
        shares = hh.runner.epoch_shares(left, hh.speeds)
        if shares is None or min(shares) == left:
            return None
        shares = [done + s for s in shares]
        if not self._said_shared and hh.rank == 0:
            self._said_shared = True
            log.warning("ranks now share each epoch by speed (batches per rank this epoch: %s): they take different "
                        "numbers of batches, so no collective of your own may run per batch (after the epoch's "
                        "sync, a MetricAverageCallback or a checkpoint, is fine); share_epochs=False keeps Keras' "
                        "count", shares)
        return shares

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        with self._follow().guard() as hh:
            if logs and "loss" in logs:
                mean = float(logs["loss"])
                hh.telemetry.annotate(loss=batch_loss(batch + 1, mean, self._loss_mean))
                self._loss_mean = (batch + 1, mean)
            samples = self.batch_size if self._epoch is None else self._epoch[1]
            if samples:
                hh.telemetry.annotate(samples=samples)
            runner = hh.runner
            hh.after_step(comm_s=self._gradients.seconds())
            if hh.runner is not runner:        # a switch at this batch's round, every rank at this batch
                self._shared_from, self.epoch_shares = batch + 1, None
            if self.epoch_shares is None:
                self.epoch_shares = self._shares()
            if self.epoch_shares is not None and batch + 1 >= self.epoch_shares[hh.rank]:
                self.model.stop_training = self.model.stop_training or EPOCH_SHARED    # this rank's share is done

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.model.stop_training is EPOCH_SHARED:        # the epoch's end, not fit's
            self.model.stop_training = False
        self.sync_epoch(epoch)

    def sync_epoch(self, epoch: int) -> None:
        """``sync_model()`` once at ``epoch``'s end if ``epoch_sync``, as in the torch loop: every rank
        leaves the epoch at the same round with identical weights, so the callbacks after this one
        (metric averaging, checkpoints) meet in their collectives; the next batch reopens the strategy.
        ``MetricAverageCallback`` calls it first when it comes before this callback (``sync_epoch``)."""
        if self.epoch_sync and self._synced_epoch != epoch:
            self.sync_model()
            self._synced_epoch = epoch

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._epoch = None                     # the next fit needs the next epoch's plan
        self.sync_model()

    def sync_model(self) -> None:
        """Bring every rank to identical weights and the same round (a model-averaging strategy joins the
        rounds until every rank has called it); what the strategy opened is closed."""
        with self._follow().guard() as hh:
            hh.sync()

    def set_strategy(self, strategy: Strategy) -> None:
        """Run ``strategy`` from the next batch on, of either kind (the model compiled with
        ``hh.DistributedOptimizer`` for a gradient-averaging one). Every rank calls it at the same point, at
        an epoch's end or between ``fit`` calls: the model is synced first (``sync_model()``), then the new
        strategy starts from rank 0's counters. Checkpoints taken from then on hold the new strategy, and
        loading one brings it back.

        Example::

            callback.set_strategy(hh.ElasticBSP())   # e.g. from on_epoch_end of a callback after this one
        """
        strategy = check_strategy(strategy)
        if self._hh is None:                   # before the first fit: the fit starts with it
            self._strategy = strategy
            return
        self.sync_model()
        with self._follow().guard() as hh:
            hh.set_strategy(strategy)
        self.epoch_shares = None

    # -- epochs planned by the callback --

    def epoch_plan(self, n: int, epoch: int, seed: int = 0,
                   shuffle: bool = True) -> tuple[npt.NDArray[np.int64], int]:
        """``(indices, batch_size)`` of this rank for ``epoch`` of ``n`` samples: fit on ``x[indices]`` with
        ``batch_size=batch_size, shuffle=False`` (one ``fit`` per epoch). Where the strategy plans every rank's
        batch (``Balanced``), every rank takes the same number of steps at its planned batch; else every rank
        its ``batch_size`` on a share of the epoch by speed (``epoch_indices``; an even split for a lockstep
        strategy). Every sample once per epoch::

            for epoch in range(epochs):
                idx, batch = callback.epoch_plan(len(x), epoch)
                model.fit(x[idx], y[idx], batch_size=batch, shuffle=False, initial_epoch=epoch,
                          epochs=epoch + 1, callbacks=[callback])
        """
        n, epoch = check_int("n", n, 1), check_int("epoch", epoch, 0)
        rank, size = self._ranks()
        runner = self._hh.runner if self._hh is not None else runner_for(self._strategy)
        planned = runner.epoch_sizes(n, self.batch_size, size)
        if planned is None:
            if self.batch_size is None:
                raise ValueError("epoch_plan needs the callback's batch_size= (every rank's batch)")
            share = self.epoch_indices(n, epoch, seed, shuffle)
            self._epoch = (epoch, self.batch_size, None)
            return np.asarray(share, dtype=np.int64), self.batch_size
        steps, sizes = planned
        order = (np.random.default_rng([check_int("seed", seed), epoch]).permutation(n)
                 if check_bool("shuffle", shuffle) else np.arange(n))
        indices = np.concatenate([step_batch(order, s, sizes, rank) for s in range(steps)]).astype(np.int64)
        self._epoch = (epoch, sizes[rank], sizes)
        return indices, int(sizes[rank])

    def epoch_indices(self, n: int, epoch: int, seed: int = 0, shuffle: bool = True) -> list[int]:
        """This rank's sample indices for ``epoch`` of ``n`` samples: every sample once per epoch over
        the ranks, each rank's share proportional to the speed the rounds measured (an even split
        before the first round, and for a lockstep strategy), the same split on every rank
        (``rules.partition``, as ``hh.DistributedSampler`` in torch). Keras fixes an epoch's number of
        batches within one ``fit()``, so train one ``fit()`` per epoch on the share (its ``on_train_end``
        syncs)::

            for epoch in range(epochs):
                idx = callback.epoch_indices(len(x), epoch)
                model.fit(x[idx], y[idx], batch_size=32, initial_epoch=epoch, epochs=epoch + 1,
                          callbacks=[callback])
        """
        n, epoch = check_int("n", n, 0), check_int("epoch", epoch, 0)
        hh = self._hh
        if hh is not None:
            rank, size = hh.rank, hh.size
            times = None if hh.runner.lockstep else hh.speeds.step_times
        else:                                    # before the first fit: no round yet, an even split
            (rank, size), times = self._ranks(), None
        return epoch_indices(n, step_times_of(times, size), rank, epoch, check_int("seed", seed),
                             check_bool("shuffle", shuffle))

    # -- state --

    def state_dict(self) -> dict[str, Any] | None:
        """The strategy's counters (and what rebuilds it) and the round number, to resume on the same steps."""
        if self._hh is None:
            return self._pending_state
        return self._hh.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Counters from ``state_dict()`` (this rank's or rank 0's), of this strategy or of another one the
        state rebuilds (saved after ``set_strategy``); before the first ``fit`` they are kept for it, checked
        now (a ``ValueError`` here, not at the first batch)."""
        if self._hh is not None:
            self._hh.load_state_dict(state)
            return
        check_state(state)
        saved = state["strategy"]
        same = saved.get("kind") == type(self._strategy).__name__
        trial = copy.deepcopy(self._strategy) if same else rebuild(saved)
        try:
            trial.load_state_dict(saved)
        except (KeyError, TypeError) as error:
            raise ValueError(f"state['strategy'] is not a state of {type(trial).__name__}: {error!r}") from None
        if not same:                           # saved after set_strategy: the fit starts with that strategy
            self._strategy = trial
        self._pending_state = state


# the names the callbacks were known by: every strategy runs in the one callback
HeteroSyncCallbackImpl = StrategyCallbackImpl


class SlowdownCallbackImpl:
    """Simulated heterogeneity for Keras training without a horovod-hetero strategy (Synchronous with
    ``hh.DistributedOptimizer`` or Horovod's): each batch is padded as ``HOROVOD_HETERO_SLOWDOWN``
    says, so baselines run under the same simulated cluster as the strategies. The batch is timed
    from its start to its end (the gradient average inside it included), the sleep follows it.
    ``batch_size``: this rank's batch, an int >= 1 (needed with ``HOROVOD_HETERO_SAMPLE_S``)."""

    model: Any                         # set by Keras (set_model) before any hook runs

    def __init__(self, slowdown: SlowdownFactors | Slowdown | None = None, batch_size: int | None = None) -> None:
        super().__init__()
        check_run_options(None, slowdown)
        self.batch_size = None if batch_size is None else check_int("batch_size", batch_size, 1)
        check_samples_known(slowdown, self.batch_size)
        self._slowdown = slowdown
        self._pacer: Pacer | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        begin_training(self.model)
        hvd = collectives_class().hvd
        slowdown = self._slowdown
        self._pacer = Pacer(slowdown if isinstance(slowdown, Slowdown) else Slowdown(hvd.rank(), slowdown, size=hvd.size()))

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._pacer is not None:                  # made by on_train_begin
            self._pacer.start()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._pacer is not None:
            self._pacer.pad(samples=self.batch_size)
