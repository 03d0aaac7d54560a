"""Keras callback logic, independent of the Keras backend.

The thin ``keras.callbacks.Callback`` subclasses in ``horovod_hetero.tensorflow.keras`` mix this
in and provide one method, ``_hh_average(weight, control)``, the fused averaging collective.
"""
from horovod_hetero.common.controller import HeteroController
from horovod_hetero.common.strategy import ESync, LocalSGD, check_strategy
from horovod_hetero.common.validation import check_float, check_int
from horovod_hetero.common.wagma import WAGMA

DEFAULT_TIMEOUT_S = 300.0


class HeteroSyncCallbackImpl:
    """Runs a model-averaging strategy from Keras batch hooks.

    After every training batch the strategy decides whether the model's floating-point
    weights (trainable and not, so BatchNorm statistics too) are averaged across the process
    set; batches are counted across epochs. At the end of training every rank keeps joining
    the other ranks' rounds until all have finished, so all replicas end with identical weights
    even when ranks saw different numbers of batches.
    """

    def __init__(self, backend, strategy, process_set=None, telemetry=None, slowdown=None,
                 batch_size=None, timeout=DEFAULT_TIMEOUT_S, *args):
        super().__init__(*args)
        self.backend = backend
        self.strategy = check_strategy(strategy)
        if self.strategy.averages_gradients:
            raise ValueError(f"strategy={self.strategy!r} averages gradients, which a callback cannot do: "
                             f"wrap the optimizer with hvd.DistributedOptimizer for synchronous training, "
                             f"or pass a model-averaging strategy such as LocalSGD(period=8)")
        self.process_set = process_set
        self.batch_size = None if batch_size is None else check_int("batch_size", batch_size, 1)
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
        self._telemetry, self._slowdown = telemetry, slowdown
        self._hh = None
        self._pending_state = None

    def _hh_controller(self):
        if self._hh is None:
            self._hh_variables = [v for v in self.model.weights if v.dtype.is_floating]
            size, rank = self._hh_size_rank()
            payload = sum(int(v.shape.num_elements()) * v.dtype.size for v in self._hh_variables)
            self._hh = HeteroController(self.strategy, self._hh_average, size, rank, payload,
                                        self._telemetry, self._slowdown, broadcast=self._hh_broadcast,
                                        host=self._hh_host(), model_ops=(self._hh_snapshot, self._hh_blend),
                                        group_ops=self._hh_group_ops())
            if self._pending_state is not None:
                self._hh.load_state_dict(self._pending_state)
                self._pending_state = None
        return self._hh

    @property
    def telemetry(self):
        return self._hh_controller().telemetry

    def on_train_begin(self, logs=None):
        self._hh_controller()

    def on_train_batch_end(self, batch, logs=None):
        hh = self._hh_controller()
        if logs and "loss" in logs:
            hh.telemetry.annotate(loss=float(logs["loss"]))
        if self.batch_size:
            hh.telemetry.annotate(samples=self.batch_size)
        hh.after_step()

    def on_train_end(self, logs=None):
        self.sync_model()

    def sync_model(self):
        """Join averaging rounds until every rank has called it; then all weights are identical."""
        self._hh_controller().join()

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


class LocalSGDCallbackImpl(HeteroSyncCallbackImpl):
    """``HeteroSyncCallbackImpl`` with ``LocalSGD(period, warmup_steps)``."""

    def __init__(self, backend, period, warmup_steps=0, *args, **kwargs):
        super().__init__(backend, LocalSGD(period, warmup_steps), *args, **kwargs)


class ESyncCallbackImpl(HeteroSyncCallbackImpl):
    """``HeteroSyncCallbackImpl`` with ``ESync(global_lr, mode, ...)``."""

    def __init__(self, backend, global_lr=1.0, mode="blocking", esync_options=None, *args, **kwargs):
        super().__init__(backend, ESync(global_lr, mode, **(esync_options or {})), *args, **kwargs)


class WAGMACallbackImpl(HeteroSyncCallbackImpl):
    """``HeteroSyncCallbackImpl`` with ``WAGMA(group_size, sync_period, ...)``."""

    def __init__(self, backend, group_size=None, sync_period=10, wagma_options=None, *args, **kwargs):
        super().__init__(backend, WAGMA(group_size, sync_period, **(wagma_options or {})), *args, **kwargs)
