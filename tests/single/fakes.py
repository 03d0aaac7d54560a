"""Fake collectives for single-process tests: ranks are threads, allreduce is a barrier + sum."""
import threading
import time

import numpy as np

from horovod_hetero.runtime.seams import Collectives, Model
from horovod_hetero.strategies.base import Context, RoundResult, RoundStats
from horovod_hetero.runtime.strategy_transports import Transports


class ThreadAllreduce:
    """Sum-allreduce among ``size`` threads; each call is matched by call order, like Horovod."""

    def __init__(self, size, timeout=10.0):
        self.size = size
        self._barrier = threading.Barrier(size, timeout=timeout)
        self._slots = [None] * size
        self.calls = 0

    def __call__(self, rank, arrays):
        self._slots[rank] = [np.asarray(a, dtype=np.float64).copy() for a in arrays]
        self._barrier.wait()
        total = [sum(slot[i] for slot in self._slots) for i in range(len(arrays))]
        if rank == 0:
            self.calls += 1
        self._barrier.wait()
        return total


def weighted_average_fn(allreduce, rank, model):
    """The ``RoundProtocol`` averaging contract over a dict of numpy arrays (one rank's model)."""
    def average(weight, control):
        keys = sorted(model)
        out = allreduce(rank, [model[k] * weight for k in keys] + [np.array(control)])
        summed = out[-1]
        if summed[0] > 0:
            for k, s in zip(keys, out[:-1]):
                model[k] = s / summed[0]
        return summed.tolist()
    return average


def run_ranks(size, target, timeout=20.0):
    """Run ``target(rank)`` in ``size`` threads; return results by rank; re-raise the first error."""
    results, errors = [None] * size, []

    def wrap(rank):
        try:
            results[rank] = target(rank)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if any(t.is_alive() for t in threads):
        raise TimeoutError("a fake rank hung")
    if errors:
        raise errors[0]
    return results


class ArrayCollectives(Collectives):
    """``Collectives`` over NumPy arrays: ``allreduce(rank, arrays)`` sums (e.g. a ``ThreadAllreduce``),
    ``broadcast(obj)`` stands in for Horovod's object broadcast."""

    def __init__(self, allreduce, rank=0, size=1, broadcast=lambda obj: obj):
        self.rank, self.size = rank, size
        self._allreduce, self._broadcast = allreduce, broadcast
        self.calls = []

    def allreduce_sum(self, tensors, control, *, ranks=None, name, what, inplace=False, like=None):
        self.calls.append((name, ranks))
        out = self._allreduce(self.rank, list(tensors) + [np.array(control)])
        return out[:-1], [float(c) for c in out[-1]]

    def copy(self, tensors):
        return [np.array(t, copy=True) for t in tensors]

    def broadcast_object(self, obj, *, what, root=None):
        return self._broadcast(obj)

    def allgather_object(self, obj, *, what):
        raise NotImplementedError("not in single-process tests")


def scripted(control_fn):
    """An ``allreduce`` for ``ArrayCollectives`` that leaves tensors alone and maps the control vector."""
    return lambda rank, arrays: list(arrays[:-1]) + [np.asarray(control_fn(list(arrays[-1])), dtype=float)]


class ArrayModel(Model):
    """A ``Model`` over a dict of NumPy arrays (sorted by key), e.g. ``{"w": np.zeros(3)}``."""

    def __init__(self, arrays, nbytes=None):
        self.arrays = arrays
        self._nbytes = nbytes

    def tensors(self):
        return [self.arrays[k] for k in sorted(self.arrays)]

    def assign(self, values, divisor=1.0, add_current=False):
        for k, s in zip(sorted(self.arrays), values):
            self.arrays[k] = ((s + self.arrays[k]) if add_current else s) / divisor

    def place(self, values):
        out = [np.array(v, dtype=t.dtype) for v, t in zip(values, self.tensors())]
        if len(out) != len(self.arrays) or any(o.shape != t.shape for o, t in zip(out, self.tensors())):
            raise ValueError("values do not fit the model")
        return out

    @property
    def nbytes(self):
        return self._nbytes if self._nbytes is not None else sum(a.nbytes for a in self.arrays.values())


def shared_broadcast():
    """``(root, member)`` for fake ranks started one after another: ``root`` is rank 0's broadcast (it
    records what it sends), ``member()`` another rank's, which receives those values in order."""
    sent = []

    def root(obj):
        sent.append(obj)
        return obj

    def member():
        received = iter(sent)
        return lambda obj: next(received)

    return root, member


def context(rank=0, size=1, broadcast=lambda obj: obj, clock=time.perf_counter):
    """A strategy ``Context`` with real transports over ``ArrayCollectives`` (returns it and the transports)."""
    collectives = ArrayCollectives(None, rank, size, broadcast)
    transports = Transports(rank, size, collectives)
    return Context(rank, size, transports, collectives, clock), transports


def round_result(round, size=1):
    """A ``RoundResult`` in which every rank stepped once."""
    stats = RoundStats(local_steps=np.ones(size, dtype=np.int64), step_s=np.zeros(size), loss=np.full(size, np.nan),
                       samples=np.zeros(size, dtype=np.int64), done=np.zeros(size, dtype=bool))
    return RoundResult(round, 1.0, float(size), 0, stats)
