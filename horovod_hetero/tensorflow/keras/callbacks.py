"""Keras callbacks: thin ``tf.keras.callbacks.Callback`` subclasses over ``horovod_hetero._keras``."""
import tensorflow as tf

import horovod.tensorflow as hvd

from horovod_hetero._keras import callbacks as _impl
from horovod_hetero.common.controller import call_with_timeout
from horovod_hetero.common.state_server import server_host
from horovod_hetero.process_sets import GroupOpsBase


def _grouped_sum(tensors, control, process_set, name):
    """Sum ``tensors`` and the ``control`` list over ``process_set``; returns (sums, summed control).

    TensorFlow's grouped allreduce takes one dtype: one group per dtype (normally just
    float32), the control vector riding with float64 tensors if any, else float32 ones.
    """
    by_dtype = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    ctl_dtype = tf.float64 if tf.float64 in by_dtype else tf.float32
    by_dtype.setdefault(ctl_dtype, [])
    sums, summed_control = [None] * len(tensors), None
    for dtype, index in by_dtype.items():
        group = [tensors[i] for i in index]
        if dtype == ctl_dtype:
            group.append(tf.constant(control, dtype=dtype))
        out = hvd.grouped_allreduce(group, op=hvd.Sum, process_set=process_set, name=f"{name}.{dtype.name}")
        for i, s in zip(index, out):
            sums[i] = s
        if dtype == ctl_dtype:
            summed_control = out[-1].numpy().tolist()
    return sums, summed_control


class _GroupOps(GroupOpsBase):
    """WAGMA's group collectives over the model's variables (``self.model``)."""

    hvd = hvd

    def current(self):
        return [v.value() for v in self.model]

    def snapshot(self):
        return [tf.identity(v) for v in self.model]

    def allreduce(self, model, weight, control, ranks, name):
        sent = model if weight == 1.0 else [t * weight for t in model]
        return call_with_timeout(lambda: _grouped_sum(sent, control, self._sets[tuple(ranks)], name),
                                 self.timeout, "WAGMA group average")

    def assign(self, summed, total, add_current=False):
        for v, s in zip(self.model, summed):
            v.assign(((s + v) if add_current else s) / tf.cast(total, v.dtype))


class _TensorFlowAveraging:
    """The fused weighted-averaging collective over tf.Variables (Horovod's TensorFlow ops)."""

    def _hh_size_rank(self):
        if not hvd.is_initialized():
            raise RuntimeError(f"{type(self).__name__}: Horovod is not initialized; call hvd.init() first")
        ps = self.process_set or hvd.global_process_set
        if not ps.included():
            raise ValueError("this rank is not in process_set; add the callback only on its members")
        return ps.size(), ps.rank()

    def _hh_broadcast(self, obj):
        ps = self.process_set or hvd.global_process_set
        root = 0 if ps == hvd.global_process_set else ps.ranks[0]
        return call_with_timeout(
            lambda: hvd.broadcast_object(obj, root_rank=root, process_set=ps, name="horovod_hetero.broadcast"),
            self.timeout, "the broadcast of the state server's address")

    def _hh_host(self):
        return server_host(hvd.local_size() == hvd.size())

    def _hh_snapshot(self):
        self._hh_global = [tf.identity(v) for v in self._hh_variables]

    def _hh_blend(self, lr):
        """w = w_t + lr (w - w_t); then w_t = w (ESync's global step size)."""
        for v, g in zip(self._hh_variables, self._hh_global):
            v.assign(g + tf.cast(lr, v.dtype) * (v - g))
        self._hh_snapshot()

    def _hh_group_ops(self):
        return _GroupOps(self._hh_variables, self.process_set, self.timeout)

    def _hh_average(self, weight, control):
        tensors = [v.value() if weight == 1.0 else v.value() * weight for v in self._hh_variables]
        ps = self.process_set or hvd.global_process_set
        sums, summed = call_with_timeout(lambda: _grouped_sum(tensors, control, ps, "horovod_hetero.average"),
                                         self.timeout, "model averaging round")
        if summed[0] > 0:
            for v, s in zip(self._hh_variables, sums):
                v.assign(s / tf.cast(summed[0], v.dtype))
        return summed


class HeteroSyncCallback(_TensorFlowAveraging, _impl.HeteroSyncCallbackImpl, tf.keras.callbacks.Callback):
    """Train with a model-averaging strategy: the general form every algorithm uses.

    The model is compiled with a plain local optimizer; after each batch the strategy decides
    whether the weights are averaged across ranks (one fused ``grouped_allreduce``). At the end
    of training all replicas hold identical weights, even if ranks saw different numbers of
    batches.

    Args:
        strategy: a model-averaging strategy, e.g. ``LocalSGD(period=8)``.
        process_set: Horovod process set (default: all ranks).
        telemetry: directory for per-rank step records (default ``$HOROVOD_HETERO_TELEMETRY``).
        slowdown: per-rank factors such as ``"1,1,1,4"`` (default ``$HOROVOD_HETERO_SLOWDOWN``).
        batch_size: samples per batch, for the telemetry's samples/s (optional).
        timeout: seconds an averaging collective may take before a ``TimeoutError``.

    Example::

        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
        model.fit(x, y, epochs=5, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                             hh.callbacks.HeteroSyncCallback(hh.LocalSGD(period=8))])
    """

    def __init__(self, strategy, process_set=None, telemetry=None, slowdown=None, batch_size=None,
                 timeout=_impl.DEFAULT_TIMEOUT_S):
        super().__init__(tf.keras.backend, strategy, process_set, telemetry, slowdown, batch_size, timeout)


class LocalSGDCallback(_TensorFlowAveraging, _impl.LocalSGDCallbackImpl, tf.keras.callbacks.Callback):
    """Local SGD for Keras: average the model after every ``period``-th batch, counted across epochs.

    Same as ``HeteroSyncCallback(LocalSGD(period, warmup_steps))``; see it for the other arguments.

    Example::

        model.fit(x, y, epochs=5, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                             hh.callbacks.LocalSGDCallback(period=8)])
    """

    def __init__(self, period, warmup_steps=0, process_set=None, telemetry=None, slowdown=None,
                 batch_size=None, timeout=_impl.DEFAULT_TIMEOUT_S):
        super().__init__(tf.keras.backend, period, warmup_steps, process_set, telemetry, slowdown,
                         batch_size, timeout)


class ESyncCallback(_TensorFlowAveraging, _impl.ESyncCallbackImpl, tf.keras.callbacks.Callback):
    """ESync for Keras: each rank runs as many batches as fit while the slowest runs one.

    Same as ``HeteroSyncCallback(ESync(global_lr, mode, **esync_options))``; see ``hh.ESync``
    for the algorithm and ``HeteroSyncCallback`` for the other arguments.

    Example::

        model.fit(x, y, epochs=5, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                             hh.callbacks.ESyncCallback(global_lr=1.0, mode="delayed_ack")])
    """

    def __init__(self, global_lr=1.0, mode="blocking", esync_options=None, process_set=None, telemetry=None,
                 slowdown=None, batch_size=None, timeout=_impl.DEFAULT_TIMEOUT_S):
        super().__init__(tf.keras.backend, global_lr, mode, esync_options, process_set, telemetry, slowdown,
                         batch_size, timeout)


class WAGMACallback(_TensorFlowAveraging, _impl.WAGMACallbackImpl, tf.keras.callbacks.Callback):
    """WAGMA-SGD for Keras: group averaging after every batch, a global average every ``sync_period``.

    Same as ``HeteroSyncCallback(WAGMA(group_size, sync_period, **wagma_options))``; Horovod must
    be initialised with ``hvd.init(process_sets=hh.wagma_process_sets(group_size))``. See
    ``hh.WAGMA`` for the algorithm and ``HeteroSyncCallback`` for the other arguments.

    Example::

        hvd.init(process_sets=hh.wagma_process_sets(group_size=None))
        model.fit(x, y, epochs=5, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                             hh.callbacks.WAGMACallback(group_size=None, sync_period=10)])
    """

    def __init__(self, group_size=None, sync_period=10, wagma_options=None, process_set=None, telemetry=None,
                 slowdown=None, batch_size=None, timeout=_impl.DEFAULT_TIMEOUT_S):
        super().__init__(tf.keras.backend, group_size, sync_period, wagma_options, process_set, telemetry,
                         slowdown, batch_size, timeout)
