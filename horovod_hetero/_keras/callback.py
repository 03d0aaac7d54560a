"""The Keras strategy callback's logic, independent of the Keras version and backend and of the strategy.

``horovod_hetero.keras.callbacks`` mixes it into thin ``Callback`` classes; every strategy's
callback is ``HeteroSyncCallbackImpl`` with the strategy filled in. Nothing here imports TensorFlow
or torch: weights are read and written through the Keras variable API (``value``, ``assign``) and
Python operators, and the collectives are the backend's (``_keras.collectives_class``).
"""
import numpy as np

from horovod_hetero._horovod import check_process_set, check_run_options, follow_ranks
from horovod_hetero._keras import collectives_class, to_numpy, to_tensor, value, weights
from horovod_hetero._keras.horovod_layer import begin_training
from horovod_hetero.rules.partition import epoch_indices, step_times_of
from horovod_hetero.runtime.collectives import DEFAULT_TIMEOUT_S, Model
from horovod_hetero.runtime.controller import HeteroController
from horovod_hetero.runtime.straggler import Pacer, Slowdown
from horovod_hetero.strategies.base import check_strategy
from horovod_hetero.validation import check_bool, check_float, check_int


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


class HeteroSyncCallbackImpl:
    """Runs a model-averaging strategy from Keras batch hooks.

    After every training batch the strategy decides whether the model's floating-point
    weights are averaged across the process set (or within a group); batches are counted across
    epochs. At the end of training every rank keeps joining the other ranks' rounds until all have
    finished, so all replicas end with identical weights even when ranks saw different numbers of
    batches; then what the strategy opened is closed. Under ``hvd.elastic.run`` the next ``fit``
    after a reset goes on with the new ranks (``runtime.membership``).
    """

    def __init__(self, strategy, process_set=None, telemetry=None, slowdown=None, batch_size=None,
                 timeout=DEFAULT_TIMEOUT_S, epoch_sync=True):
        super().__init__()
        self.strategy = check_strategy(strategy)
        if self.strategy.averages_gradients:
            raise ValueError(f"strategy={self.strategy!r} averages gradients, which a callback cannot do: for "
                             f"synchronous training wrap the optimizer with hh.DistributedOptimizer (on Keras 2 "
                             f"that is hvd.DistributedOptimizer, which averages nothing on Keras 3), or pass a "
                             f"model-averaging strategy such as LocalSGD(period=8)")
        self.process_set = check_process_set(process_set)        # membership: at fit, after hvd.init()
        self.batch_size = None if batch_size is None else check_int("batch_size", batch_size, 1)
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
        self.epoch_sync = check_bool("epoch_sync", epoch_sync)
        check_run_options(telemetry, slowdown)                   # built at fit (they need the rank)
        self._telemetry, self._slowdown = telemetry, slowdown
        self._membership = None                # built at fit: it needs hvd.init() and the model
        self._pending_state = None
        self._loss_mean = None                 # (batches, Keras' running mean of the loss) this epoch

    @property
    def _hh(self):
        """The controller, or None before the first fit."""
        return None if self._membership is None else self._membership.controller

    def _build(self, telemetry):
        """The controller for Horovod's current ranks (a new one after ``hvd.elastic``'s reset)."""
        collectives = collectives_class()(self.process_set, self.timeout, owner=type(self).__name__)
        controller = HeteroController(self.strategy, collectives, KerasModel(self.model), telemetry, self._slowdown)
        if self._pending_state is not None:
            controller.load_state_dict(self._pending_state)
            self._pending_state = None
        return controller

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

    def on_train_begin(self, logs=None):
        begin_training(self.model, self.timeout)
        self._hh_controller().start()

    def on_epoch_begin(self, epoch, logs=None):
        self._loss_mean = None

    def on_train_batch_end(self, batch, logs=None):
        with self._follow().guard() as hh:
            if logs and "loss" in logs:
                mean = float(logs["loss"])
                hh.telemetry.annotate(loss=batch_loss(batch + 1, mean, self._loss_mean))
                self._loss_mean = (batch + 1, mean)
            if self.batch_size:
                hh.telemetry.annotate(samples=self.batch_size)
            hh.after_step()

    def on_epoch_end(self, epoch, logs=None):
        if self.epoch_sync:
            # sync_model() at every epoch's end, as in the torch loop: every rank leaves the epoch
            # at the same round with identical weights, so the callbacks after this one (metric
            # averaging, checkpoints) meet in their collectives; the next batch reopens the strategy
            self.sync_model()

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
        if self._hh is None:
            self._pending_state = state
        else:
            self._hh.load_state_dict(state)


class SlowdownCallbackImpl:
    """Simulated heterogeneity for Keras training without a horovod-hetero strategy (Synchronous with
    ``hh.DistributedOptimizer`` or Horovod's): each batch is padded as ``HOROVOD_HETERO_SLOWDOWN``
    says, so baselines run under the same simulated cluster as the strategies. The batch is timed
    from its start to its end (the gradient average inside it included), the sleep follows it."""

    def __init__(self, slowdown=None):
        super().__init__()
        check_run_options(None, slowdown)
        self._slowdown, self._pacer = slowdown, None

    def on_train_begin(self, logs=None):
        begin_training(self.model)
        hvd = collectives_class().hvd
        self._pacer = Pacer(Slowdown(hvd.rank(), self._slowdown, size=hvd.size()))

    def on_train_batch_begin(self, batch, logs=None):
        self._pacer.start()

    def on_train_batch_end(self, batch, logs=None):
        self._pacer.pad()
