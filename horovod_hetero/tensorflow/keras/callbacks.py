"""Keras callbacks: thin ``tf.keras.callbacks.Callback`` subclasses over ``horovod_hetero._keras``."""
import tensorflow as tf

import horovod.tensorflow as hvd

from horovod_hetero._keras import callbacks as _impl
from horovod_hetero.common.controller import call_with_timeout
from horovod_hetero.common.state_server import server_host


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

    def _hh_average(self, weight, control):
        # TensorFlow's grouped allreduce takes one dtype: one group per dtype (normally just
        # float32), the control vector riding with float64 variables if any, else float32 ones.
        variables = self._hh_variables
        by_dtype = {}
        for v in variables:
            by_dtype.setdefault(v.dtype, []).append(v)
        ctl_dtype = tf.float64 if tf.float64 in by_dtype else tf.float32
        by_dtype.setdefault(ctl_dtype, [])
        ps = self.process_set or hvd.global_process_set

        def collective():
            out = {}
            for dtype, group in by_dtype.items():
                tensors = [v.value() if weight == 1.0 else v.value() * weight for v in group]
                if dtype == ctl_dtype:
                    tensors.append(tf.constant(control, dtype=dtype))
                out[dtype] = hvd.grouped_allreduce(tensors, op=hvd.Sum, process_set=ps,
                                                   name=f"horovod_hetero.average.{dtype.name}")
            return out

        out = call_with_timeout(collective, self.timeout, "model averaging round")
        summed = out[ctl_dtype][-1].numpy().tolist()
        if summed[0] > 0:
            for dtype, group in by_dtype.items():
                for v, s in zip(group, out[dtype]):
                    v.assign(s / tf.cast(summed[0], dtype))
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
