"""``Collectives`` over ``horovod.tensorflow``."""
import tensorflow as tf

import horovod.tensorflow as hvd

from horovod_hetero._horovod import HorovodCollectives
from horovod_hetero.runtime.collectives import call_with_timeout


class TensorFlowCollectives(HorovodCollectives):
    """Horovod's TensorFlow collectives (eager).

    TensorFlow's grouped allreduce takes one dtype: one group per dtype (normally just float32),
    the control vector riding with float64 tensors if any, else float32 ones (exact for the
    round protocol's tags and counts). Eager ops cannot be polled, so each collective runs under
    ``call_with_timeout``.
    """

    hvd = hvd

    def allreduce_sum(self, tensors, control, *, ranks=None, name, what, inplace=False):
        process_set = self.process_set_of(ranks)
        return call_with_timeout(lambda: self._grouped_sum(tensors, control, process_set, name), self.timeout, what)

    @staticmethod
    def _grouped_sum(tensors, control, process_set, name):
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

    def copy(self, tensors):
        return [tf.identity(t) for t in tensors]
