"""The Keras strategy callback's logic, independent of the Keras version and backend and of the strategy.

``horovod_hetero.keras.callbacks`` mixes it into thin ``Callback`` classes; every strategy's
callback is ``HeteroSyncCallbackImpl`` with the strategy filled in. Nothing here imports TensorFlow
or torch: weights are read and written through the Keras variable API (``value``, ``assign``) and
Python operators, and the collectives are the backend's (``keras._backend.collectives_class``).
"""
import copy
from typing import Any

import numpy as np

from horovod_hetero.keras._backend import collectives_class, strategy_callbacks, to_numpy, to_tensor, value, weights
from horovod_hetero.keras._checkpoint import CheckpointState, carry_state
from horovod_hetero.keras._train_guard import begin_training
from horovod_hetero.common.options import check_run_options, check_samples_known
from horovod_hetero.common.process_sets import check_process_set
from horovod_hetero.common.ranks import follow_ranks
from horovod_hetero.rules.partition import epoch_indices, epoch_steps, step_batch, step_times_of, steps_per_epoch
from horovod_hetero.runtime.seams import DEFAULT_TIMEOUT_S, Model
from horovod_hetero.runtime.controller import HeteroController, check_state
from horovod_hetero.runtime.straggler import Pacer, Slowdown
from horovod_hetero.strategies.aggregation import check_aggregate
from horovod_hetero.strategies.balanced import Balanced
from horovod_hetero.strategies.base import GradientAveraging
from horovod_hetero.strategies.registry import check_strategy
from horovod_hetero.validation import check_bool, check_float, check_int
from horovod_hetero.errors import troubleshooting


def _is_float(variable):
    dtype = variable.dtype
    floating = getattr(dtype, "is_floating", None)
    return bool(floating) if floating is not None else "float" in str(dtype)


def _nbytes(variable):
    size = getattr(variable.dtype, "size", None) or np.dtype(str(variable.dtype).replace("bfloat16", "float16")).itemsize
    return int(np.prod(tuple(variable.shape))) * size


def batch_loss(batches, mean, previous):
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

    def __init__(self, keras_model):
        self._model = keras_model
        self._variables = None

    @property
    def variables(self):
        if not self._variables:                  # not cached while the model has no weights yet
            self._variables = [v for v in weights(self._model) if _is_float(v)]
        return self._variables

    def tensors(self):
        return [value(v) for v in self.variables]

    def assign(self, values, divisor=1.0, add_current=False):
        for v, s in zip(self.variables, values):
            if add_current:
                s = s + value(v)
            v.assign(s / divisor if divisor != 1.0 else s)

    def place(self, values):
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
    def nbytes(self):
        return sum(_nbytes(v) for v in self.variables)


class _EpochShared(int):
    """``model.stop_training`` while a strategy callback ends this rank's share of an epoch: truthy, so
    Keras leaves the epoch's loop, and told apart from the ``True`` another callback sets to end ``fit``
    (``EarlyStopping``), which the callback leaves as it is."""


EPOCH_SHARED = _EpochShared(1)


class StrategyCallbackImpl(CheckpointState):
    """What every strategy callback shares, whatever the strategy's kind: the strategy, the ranks it
    synchronises (``process_set``), the controller for Horovod's current ranks (made at the first
    ``fit``, after ``hvd.init()``; a new one after ``hvd.elastic``'s reset), its telemetry, and the
    strategy's state in Keras checkpoints (``CheckpointState``)."""

    model: Any                         # set by Keras (set_model) before any hook runs

    def __init__(self, strategy, process_set=None, telemetry=None, slowdown=None, timeout=DEFAULT_TIMEOUT_S,
                 aggregate=None):
        super().__init__()
        self.strategy = strategy
        self.aggregate = check_aggregate(aggregate, strategy)
        self.process_set = check_process_set(process_set)        # membership: at fit, after hvd.init()
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
        check_run_options(telemetry, slowdown)                   # built at fit (they need the rank)
        self._telemetry, self._slowdown = telemetry, slowdown
        self._membership = None                # built at fit: it needs hvd.init() and the model

    @property
    def _hh(self):
        """The controller, or None before the first fit."""
        return None if self._membership is None else self._membership.controller

    def _build(self, telemetry):
        """The controller for Horovod's current ranks (a new one after ``hvd.elastic``'s reset)."""
        collectives = collectives_class()(self.process_set, self.timeout, owner=type(self).__name__)
        return HeteroController(self.strategy, collectives, KerasModel(self.model), telemetry, self._slowdown,
                                aggregate=self.aggregate)

    def _follow(self):
        """The ``Membership`` that gives the controller (made at the first fit: it needs ``hvd.init()``)."""
        if self._membership is None:
            self._membership = follow_ranks(collectives_class().hvd, self.process_set, self._telemetry, self._build)
        return self._membership

    def _hh_controller(self):
        return self._follow().current()

    @property
    def telemetry(self):
        return self._hh_controller().telemetry


class HeteroSyncCallbackImpl(StrategyCallbackImpl):
    """Runs a model-averaging strategy from Keras batch hooks.

    After every training batch the strategy decides whether the model's floating-point
    weights are averaged across the process set (or within a group); batches are counted across
    epochs. At the end of training every rank keeps joining the other ranks' rounds until all have
    finished, so all replicas end with identical weights even when ranks saw different numbers of
    batches; then what the strategy opened is closed. Under ``hvd.elastic.run`` the next ``fit``
    after a reset goes on with the new ranks (``runtime.membership``).

    With ``share_epochs`` (the default with ``epoch_sync``), ranks share each epoch by speed: Keras gives every rank
    the same batches per epoch (``steps_per_epoch``, or the batches of its arrays), so the fastest rank
    takes them all and every other rank as many as it takes in the same time, from the speeds the rounds
    measured (``rules.partition.epoch_steps``; identical on every rank after the previous epoch's sync),
    and ends its epoch there: no rank waits at the epoch's end for a slower one. An epoch that begins
    before every speed is known (the first) takes its shares from the second round that measures them
    (the first holds start-up: tracing, the first batch). Ranks whose ``fit`` holds different numbers of
    batches (shards sized by hand) keep Keras' count.
    """

    def __init__(self, strategy, process_set=None, telemetry=None, slowdown=None, batch_size=None,
                 timeout=DEFAULT_TIMEOUT_S, epoch_sync=True, share_epochs=None, aggregate=None):
        strategy = check_strategy(strategy)
        if isinstance(strategy, GradientAveraging):
            raise ValueError(f"strategy={strategy!r} averages gradients, which a callback cannot do: for "
                             f"synchronous training wrap the optimizer with hh.DistributedOptimizer (on Keras 2 "
                             f"that is hvd.DistributedOptimizer, which averages nothing on Keras 3), or pass a "
                             f"model-averaging strategy such as LocalSGD(period=8)")
        super().__init__(strategy, process_set, telemetry, slowdown, timeout, aggregate)
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
        self._pending_state = None
        self._loss_mean = None                 # (batches, Keras' running mean of the loss) this epoch
        self._synced_epoch = None              # the epoch whose end sync_model() ran (epoch_sync)
        self.epoch_shares = None               # every rank's batches this epoch (None: Keras' own count)
        self._start_up = None                  # (controller, the step times of its first measuring round)
        self._same_steps = False               # share_epochs, and every rank's fit has the same batches per epoch

    def _build(self, telemetry):
        controller = super()._build(telemetry)
        if self._pending_state is not None:            # loaded before the first fit
            controller.load_state_dict(self._pending_state)
            self._pending_state = None
        return controller

    def on_train_begin(self, logs=None):
        begin_training(self.model, self.timeout)
        strategy_callbacks(self.model).add(self)
        carry_state(self.model, self)
        hh = self._hh_controller()
        hh.start()
        steps = (getattr(self, "params", None) or {}).get("steps")
        self._same_steps = self.share_epochs and len(set(hh.collectives.allgather_object(
            steps, what="every rank's batches per epoch (share_epochs)"))) == 1

    def on_epoch_begin(self, epoch, logs=None):
        self._loss_mean = None
        self._synced_epoch = None
        self.epoch_shares = self._shares()

    def _shares(self):
        """Every rank's batches this epoch by speed, or None (Keras' own count): without ``share_epochs``
        and ``epoch_sync``, without a known number of batches, when the ranks' fits hold different numbers
        (shards sized by hand), or before every rank's speed is measured."""
        steps = (getattr(self, "params", None) or {}).get("steps")
        hh = self._hh
        if not self._same_steps or not steps or hh is None or hh.step_times is None:    # share_epochs in it
            return None
        shares = epoch_steps(int(steps), hh.step_times).tolist()
        return None if min(shares) == steps else shares

    def _measured_shares(self, hh):
        """The shares of an epoch begun before every speed was known, once a round after the first
        measuring one (start-up's) gave the step times. Every rank sees the same rounds: a rank still in
        the epoch takes them at the same round as the others (a fast rank may have ended it before)."""
        if hh.step_times is None:
            return None
        if self._start_up is None or self._start_up[0] is not hh:       # a new controller: hvd.elastic's reset
            self._start_up = (hh, hh.step_times)
        return None if hh.step_times is self._start_up[1] else self._shares()

    def on_train_batch_end(self, batch, logs=None):
        with self._follow().guard() as hh:
            if logs and "loss" in logs:
                mean = float(logs["loss"])
                hh.telemetry.annotate(loss=batch_loss(batch + 1, mean, self._loss_mean))
                self._loss_mean = (batch + 1, mean)
            if self.batch_size:
                hh.telemetry.annotate(samples=self.batch_size)
            hh.after_step()
            if self.epoch_shares is None:
                self.epoch_shares = self._measured_shares(hh)
            if self.epoch_shares is not None and batch + 1 >= self.epoch_shares[hh.rank]:
                self.model.stop_training = self.model.stop_training or EPOCH_SHARED    # this rank's share is done

    def on_epoch_end(self, epoch, logs=None):
        if self.model.stop_training is EPOCH_SHARED:        # the epoch's end, not fit's
            self.model.stop_training = False
        self.sync_epoch(epoch)

    def sync_epoch(self, epoch):
        """``sync_model()`` once at ``epoch``'s end if ``epoch_sync``, as in the torch loop: every rank
        leaves the epoch at the same round with identical weights, so the callbacks after this one
        (metric averaging, checkpoints) meet in their collectives; the next batch reopens the strategy.
        ``MetricAverageCallback`` calls it first when it comes before this callback (``sync_epoch``)."""
        if self.epoch_sync and self._synced_epoch != epoch:
            self.sync_model()
            self._synced_epoch = epoch

    def on_train_end(self, logs=None):
        self.sync_model()

    def sync_model(self):
        """Join averaging rounds until every rank has called it; then all weights are identical and
        what the strategy opened is closed."""
        with self._follow().guard() as hh:
            hh.finish()

    def epoch_indices(self, n, epoch, seed=0, shuffle=True):
        """This rank's sample indices for ``epoch`` of ``n`` samples: every sample once per epoch over
        the ranks, each rank's share proportional to the speed the rounds measured (an even split
        before the first round), the same split on every rank (``rules.partition``, as
        ``hh.DistributedSampler`` in torch). Keras fixes an epoch's number of batches within one
        ``fit()``, so train one ``fit()`` per epoch on the share (its ``on_train_end`` syncs)::

            for epoch in range(epochs):
                idx = callback.epoch_indices(len(x), epoch)
                model.fit(x[idx], y[idx], batch_size=32, initial_epoch=epoch, epochs=epoch + 1,
                          callbacks=[callback])
        """
        n, epoch = check_int("n", n, 0), check_int("epoch", epoch, 0)
        if self._hh is not None:
            rank, size, times = self._hh.rank, self._hh.size, self._hh.step_times
        else:                                    # before the first fit: no round yet, an even split
            hvd = collectives_class().hvd
            ps = self.process_set or hvd.global_process_set
            rank, size, times = ps.rank(), ps.size(), None
        return epoch_indices(n, step_times_of(times, size), rank, epoch, check_int("seed", seed),
                             check_bool("shuffle", shuffle))

    def state_dict(self):
        """The strategy's counters and the round number, to resume on the same averaging steps."""
        if self._hh is None:
            return self._pending_state
        return self._hh.state_dict()

    def load_state_dict(self, state):
        """Counters from ``state_dict()`` (this rank's or rank 0's); before the first ``fit`` they are kept
        for it, checked now (a ``ValueError`` here, not at the first batch)."""
        if self._hh is not None:
            self._hh.load_state_dict(state)
            return
        check_state(state)
        trial = copy.deepcopy(self.strategy)
        try:
            trial.load_state_dict(state["strategy"])
        except (KeyError, TypeError) as error:
            raise ValueError(f"state['strategy'] is not a state of {type(self.strategy).__name__}: {error!r}") from None
        self._pending_state = state


class BalancedCallbackImpl(StrategyCallbackImpl):
    """Runs ``Balanced`` for Keras: synchronous training with ``hh.DistributedOptimizer`` (gradients
    averaged inside the step), each rank's batch sized to its speed, planned per epoch.

    Keras fixes a ``fit``'s batch size, so the sizes change between epochs: train one ``fit`` per epoch
    on ``epoch_plan(len(x), epoch)``'s indices and batch size (every rank the same number of steps, every
    sample once per epoch: ``rules.partition.step_batch``). A window of ``Balanced`` is an epoch: after it
    a round carries every rank's mean step time (the batch's time less the gradient average's, timed
    inside the step: ``GradientScale.seconds``), and the sizes planned from it are used two epochs later
    (the first epoch, holding start-up and tracing, is not measured). Each rank's gradients are scaled by
    its share of the global batch (``GradientScale.scale``) before the average: the average is the
    gradient of the union of the ranks' batches.

    Built from its arguments (``BalancedCallback(batch_size=32)``), or around a ``Balanced`` the user built
    (``HeteroSyncCallback(hh.Balanced(...), batch_size=32)``: ``running``); either way a window is an
    epoch (``rebalance_every`` becomes the epoch's steps).
    """

    def __init__(self, global_batch=None, max_batch=None, batch_size=None, process_set=None, telemetry=None,
                 slowdown=None, timeout=DEFAULT_TIMEOUT_S, min_batch=None):
        if global_batch is None and batch_size is None:
            raise ValueError("give batch_size= (one rank's batch; the global batch is the number of ranks times it) "
                             "or global_batch=")
        self._setup(Balanced(global_batch, rebalance_every=1, max_batch=max_batch, min_batch=min_batch), batch_size,
                    process_set, telemetry, slowdown, timeout)

    @classmethod
    def running(cls, strategy, process_set=None, telemetry=None, slowdown=None, batch_size=None,
                timeout=DEFAULT_TIMEOUT_S, epoch_sync=None, share_epochs=None, aggregate=None):
        """The callback that runs ``strategy``, a ``Balanced`` the user built, with ``HeteroSyncCallback``'s
        arguments (``HeteroSyncCallback(hh.Balanced(...), ...)`` returns it). ``epoch_sync`` and
        ``share_epochs`` do not apply (every epoch is one ``fit`` on ``epoch_plan``'s batches, which ends
        with every rank at the same step), nor does an ``aggregate`` other than the mean."""
        if not isinstance(strategy, Balanced):
            raise TypeError(f"strategy={strategy!r} weighs gradients; the Keras callback runs Balanced, the one "
                            f"GradientWeighting strategy it plans an epoch's batches for")
        given = [name for name, value in (("epoch_sync", epoch_sync), ("share_epochs", share_epochs)) if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: options of model-averaging strategies' epochs; Balanced trains one "
                             f"fit() per epoch on epoch_plan's batches, every rank to the same step: leave them out")
        if strategy.global_batch is None and batch_size is None:
            raise ValueError(f"strategy={strategy!r} has no global_batch: give batch_size= (one rank's batch; the "
                             f"global batch is the number of ranks times it)")
        callback = cls.__new__(cls)
        callback._setup(strategy, batch_size, process_set, telemetry, slowdown, timeout, aggregate)
        return callback

    def _setup(self, strategy, batch_size, process_set, telemetry, slowdown, timeout, aggregate=None):
        super().__init__(strategy, process_set, telemetry, slowdown, timeout, aggregate)
        self.batch_size = None if batch_size is None else check_int("batch_size", batch_size, 1)
        self._epoch = None                    # (epoch, this rank's batch) of the latest epoch_plan

    def _ranks(self):
        hvd = collectives_class().hvd
        ps = self.process_set or hvd.global_process_set
        return ps.rank(), ps.size()

    def epoch_plan(self, n, epoch, seed=0, shuffle=True):
        """``(indices, batch_size)`` of this rank for ``epoch`` of ``n`` samples: fit on ``x[indices]`` with
        ``batch_size=batch_size, shuffle=False`` (one ``fit`` per epoch)::

            for epoch in range(epochs):
                idx, batch = balanced.epoch_plan(len(x), epoch)
                model.fit(x[idx], y[idx], batch_size=batch, shuffle=False, initial_epoch=epoch,
                          epochs=epoch + 1, callbacks=[balanced])
        """
        n, epoch = check_int("n", n, 1), check_int("epoch", epoch, 0)
        rank, size = self._ranks()
        if self.strategy.global_batch is None and self.batch_size is not None:
            self.strategy.use_batch(self.batch_size, size)
        self.strategy.check_size(size)
        global_batch = self.strategy.global_batch
        assert global_batch is not None          # given, or batch_size was (__init__): the ranks' batches
        steps = steps_per_epoch(n, global_batch)
        if self.strategy.step % steps:
            raise ValueError(f"epoch_plan: {self.strategy.step} steps were taken, not a whole number of epochs of {steps} "
                             f"steps: train every epoch on its plan, to its end")
        self.strategy.rebalance_every = steps                  # a window is an epoch
        sizes = self.strategy.batch_sizes(self.strategy.step + 1, size)
        order = (np.random.default_rng([check_int("seed", seed), epoch]).permutation(n)
                 if check_bool("shuffle", shuffle) else np.arange(n))
        indices = np.concatenate([step_batch(order, s, sizes, rank) for s in range(steps)]).astype(np.int64)
        self._epoch = (epoch, sizes[rank], sizes)
        return indices, int(sizes[rank])

    def on_train_begin(self, logs=None):
        begin_training(self.model, self.timeout)
        state = getattr(type(getattr(self.model, "optimizer", None)), "_hh_gradient", None)
        if state is None:
            raise TypeError("BalancedCallback weighs every rank's gradient in the average: compile the model with "
                            "hh.DistributedOptimizer(optimizer) (Keras 3)\n" + troubleshooting("troubleshooting-balanced-sampler"))
        if self._epoch is None:
            raise ValueError("BalancedCallback plans every rank's batch: fit each epoch on "
                             "callback.epoch_plan(len(x), epoch)'s indices and batch size\n"
                             + troubleshooting("troubleshooting-balanced-sampler"))
        self._gradient = state
        carry_state(self.model, self)
        hh = self._hh_controller()
        hh.start()
        _, self._samples, sizes = self._epoch
        self._gradient.scale.assign(self._samples * len(sizes) / self.strategy.global_batch)

    def on_train_batch_end(self, batch, logs=None):
        with self._follow().guard() as hh:
            hh.telemetry.annotate(samples=self._samples)
            hh.after_step(comm_s=float(np.asarray(value(self._gradient.seconds))))

    def on_train_end(self, logs=None):
        self._epoch = None                     # the next fit needs the next epoch's plan
        self._hh_controller().close()

    def state_dict(self):
        """The plans, the measurements and the step count (the strategy's), to resume on the same sizes."""
        return self.strategy.state_dict()

    def load_state_dict(self, state):
        self.strategy.load_state_dict(state)


class SlowdownCallbackImpl:
    """Simulated heterogeneity for Keras training without a horovod-hetero strategy (Synchronous with
    ``hh.DistributedOptimizer`` or Horovod's): each batch is padded as ``HOROVOD_HETERO_SLOWDOWN``
    says, so baselines run under the same simulated cluster as the strategies. The batch is timed
    from its start to its end (the gradient average inside it included), the sleep follows it.
    ``batch_size``: this rank's batch, an int >= 1 (needed with ``HOROVOD_HETERO_SAMPLE_S``)."""

    model: Any                         # set by Keras (set_model) before any hook runs

    def __init__(self, slowdown=None, batch_size=None):
        super().__init__()
        check_run_options(None, slowdown)
        self.batch_size = None if batch_size is None else check_int("batch_size", batch_size, 1)
        check_samples_known(slowdown, self.batch_size)
        self._slowdown = slowdown
        self._pacer: Pacer | None = None

    def on_train_begin(self, logs=None):
        begin_training(self.model)
        hvd = collectives_class().hvd
        slowdown = self._slowdown
        self._pacer = Pacer(slowdown if isinstance(slowdown, Slowdown) else Slowdown(hvd.rank(), slowdown, size=hvd.size()))

    def on_train_batch_begin(self, batch, logs=None):
        if self._pacer is not None:                  # made by on_train_begin
            self._pacer.start()

    def on_train_batch_end(self, batch, logs=None):
        if self._pacer is not None:
            self._pacer.pad(samples=self.batch_size)
