"""``Collectives`` over ``horovod.torch`` and the ``Model`` of a torch optimizer's tensors."""
import time

import torch

import horovod.torch as hvd

from horovod_hetero._horovod import HorovodCollectives
from horovod_hetero.runtime.collectives import Model, timeout_error


def wait(handle, timeout_s, what):
    """``hvd.synchronize(handle)``, but raise ``CollectiveTimeoutError`` after ``timeout_s`` seconds."""
    # Back off to 1 ms between polls: polling harder measurably slows training when ranks and
    # Horovod's background threads share cores (LocalSGD(1) step time +20% at a 0.1 ms cap).
    deadline = time.monotonic() + timeout_s
    pause = 0.0
    while not hvd.poll(handle):
        if time.monotonic() > deadline:
            raise timeout_error(what, timeout_s)
        time.sleep(pause)
        pause = min(2 * pause or 1e-5, 1e-3)
    return hvd.synchronize(handle)


class TorchCollectives(HorovodCollectives):
    """Horovod's torch collectives; the control vector is made on the model's device in float64.

    Horovod's torch grouped allreduce takes the device of the *first* tensor for the whole group
    (``mpi_ops_v2.cc``, ``DoGroupedAllreduce``): a CPU control vector beside CUDA parameters would
    be read as GPU memory, so it is always created beside ``tensors[0]``.
    """

    hvd = hvd

    @torch.no_grad()
    def allreduce_sum(self, tensors, control, *, ranks=None, name, what, inplace=False):
        device = tensors[0].device if len(tensors) else torch.device("cpu")
        group = list(tensors) + [torch.tensor(control, dtype=torch.float64, device=device)]
        enqueue = hvd.grouped_allreduce_async_ if inplace else hvd.grouped_allreduce_async
        out = wait(enqueue(group, op=hvd.Sum, name=name, process_set=self.process_set_of(ranks)), self.timeout, what)
        return out[:-1], out[-1].tolist()

    @torch.no_grad()
    def copy(self, tensors):
        return [t.clone() for t in tensors]

    def broadcast(self, tensors, root_rank, *, name, what):
        handles = [hvd.broadcast_async(t.detach(), root_rank, name=f"{name}.{i}", process_set=self.process_set)
                   for i, t in enumerate(tensors)]
        return [wait(h, self.timeout, what) for h in handles]

    def mean(self, tensors, *, name):
        handle = hvd.grouped_allreduce_async(list(tensors), op=hvd.Average, name=name, process_set=self.process_set)
        return wait(handle, self.timeout, "the gradient average")


class TorchModel(Model):
    """The optimizer's parameters and floating-point buffers (``tensor.data``), in name order."""

    def __init__(self, tensors):
        self._tensors = list(tensors)

    def tensors(self):
        return self._tensors

    @torch.no_grad()
    def assign(self, values, divisor=1.0, add_current=False):
        """In place; ``values`` are consumed (summed into, divided)."""
        for t, s in zip(self._tensors, values):
            if add_current:
                s.add_(t)
            if s is t:
                t.div_(divisor)
            else:
                t.copy_(s.div_(divisor) if divisor != 1.0 else s)

    @property
    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self._tensors)
