"""Fake collectives for single-process tests: ranks are threads, allreduce is a barrier + sum."""
import threading

import numpy as np


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
