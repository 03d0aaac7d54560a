"""``Collectives`` over ``horovod.tensorflow``."""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf

import horovod.tensorflow as hvd

from horovod_hetero.common.horovod_collectives import HorovodCollectives
from horovod_hetero.runtime.seams import Tensor, call_with_timeout

if TYPE_CHECKING:
    from horovod.common.process_sets import ProcessSet


class TensorFlowCollectives(HorovodCollectives):
    """Horovod's TensorFlow collectives.

    TensorFlow's grouped allreduce takes one dtype: one group per dtype (normally just float32),
    the control vector riding with float64 tensors if any, else float32 ones (exact for the
    round protocol's tags and counts). Eager ops cannot be polled, so each eager collective runs
    under ``call_with_timeout``; ``mean`` runs inside Keras' compiled train step.

    Horovod matches collectives by name, and an eager TensorFlow op has none (every eager grouped
    allreduce is ``HorovodGroupedAllreduce``): two ranks would pair whichever they enqueued next,
    and a responder thread's group average could collide with the main thread's. So an eager
    grouped allreduce runs as a compiled function of its name (``_named_allreduce``, compiled once
    per name, op and process set), whose node carries the name.
    """

    hvd = hvd

    def allreduce_sum(self, tensors: Sequence[Tensor], control: Sequence[float], *,
                      ranks: Sequence[int] | None = None, name: str, what: str, inplace: bool = False,
                      like: Tensor | None = None) -> tuple[list[Tensor], list[float]]:
        process_set = self.process_set_of(ranks)
        return call_with_timeout(lambda: self._grouped_sum(tensors, control, process_set, name), self.timeout, what)

    @staticmethod
    def _grouped(tensors: Sequence[Tensor], op: int, process_set: ProcessSet, name: str,
                 control: Sequence[float] | None = None) -> tuple[list[Tensor], Tensor | None]:
        """One grouped allreduce per dtype; ``control`` rides with float64 tensors if any, else float32."""
        tensors = [tf.convert_to_tensor(t) for t in tensors]          # Keras 3 hands variables
        by_dtype: dict[Any, list[int]] = {}
        for i, t in enumerate(tensors):
            by_dtype.setdefault(t.dtype, []).append(i)
        ctl_dtype = tf.float64 if tf.float64 in by_dtype else tf.float32
        if control is not None:
            by_dtype.setdefault(ctl_dtype, [])
        out, summed_control = [None] * len(tensors), None
        for dtype, index in by_dtype.items():
            group = [tensors[i] for i in index]
            if control is not None and dtype == ctl_dtype:
                group.append(tf.constant(control, dtype=dtype))
            named = f"{name}.{dtype.name}"
            if tf.executing_eagerly():
                reduced = _named_allreduce(named, op, process_set)(group)
            else:                                           # in a compiled step: the node has the name
                reduced = hvd.grouped_allreduce(group, op=op, process_set=process_set, name=named)
            for i, r in zip(index, reduced):
                out[i] = r
            if control is not None and dtype == ctl_dtype:
                summed_control = reduced[-1]
        return out, summed_control

    def _grouped_sum(self, tensors: Sequence[Tensor], control: Sequence[float], process_set: ProcessSet,
                     name: str) -> tuple[list[Tensor], list[float]]:
        summed_control: Tensor          # control given: its sum, never None
        sums, summed_control = self._grouped(tensors, hvd.Sum, process_set, name, control)
        return sums, summed_control.numpy().tolist()

    def copy(self, tensors: Sequence[Tensor]) -> list[Tensor]:
        return [tf.identity(t) for t in tensors]

    def broadcast(self, tensors: Sequence[Tensor], root_rank: int, *, name: str, what: str) -> list[Tensor]:
        return call_with_timeout(lambda: [hvd.broadcast(tf.convert_to_tensor(t), root_rank, name=f"{name}.{i}",
                                                        process_set=self.process_set) for i, t in enumerate(tensors)],
                                 self.timeout, what)

    def mean(self, tensors: Sequence[Tensor], *, name: str) -> list[Tensor]:
        return self._grouped(tensors, hvd.Average, self.process_set, name)[0]

    def timed_mean(self, tensors: Sequence[Tensor], *, name: str) -> tuple[list[Tensor], Tensor]:
        """``mean`` and the seconds it took, as a float64 tensor (``tf.timestamp`` around it: inside a
        compiled step too)."""
        start = tf.timestamp()
        with tf.control_dependencies([start]):
            tensors = [tf.identity(t) for t in tensors]
        out = self.mean(tensors, name=name)
        with tf.control_dependencies(out):
            end = tf.timestamp()
        return out, end - start


#: Compiled grouped allreduces kept (names are few: the rounds' and the group averages' name slots)
NAMED_KEPT = 256


@functools.lru_cache(maxsize=NAMED_KEPT)
def _named_allreduce(name: str, op: int, process_set: ProcessSet) -> Callable[[list[Tensor]], list[Tensor]]:
    """A compiled ``hvd.grouped_allreduce`` whose Horovod name is ``name`` (eager ops have none). A
    partial, not a closure: TensorFlow counts the traces of one code object as retracing, and warns."""
    return tf.function(functools.partial(hvd.grouped_allreduce, op=op, process_set=process_set, name=name),
                       autograph=False)
