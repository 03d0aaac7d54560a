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
    """The optimizer's parameters and floating-point buffers, held as views into one flat tensor per
    (dtype, device), so an averaging round is one in-place allreduce with no gather or scatter copies.

    At construction every tensor that owns its memory outright (contiguous, storage of its own) is
    copied, in the given (name) order, into the flat tensor of its dtype and device, and rebound to
    a view of it (``tensor.data = view``): parameters keep their identity, gradients, hooks and
    optimizer state, and the optimizer's in-place updates write into the flat tensor. The flat
    tensor holds the same bytes at the same offsets as the fusion buffer Horovod packs for a grouped
    allreduce of the separate tensors (on the CPU it packs them back to back, ``MemcpyInFusionBuffer``),
    so a round sums exactly what it summed before, in the same order: results are bit-identical to
    averaging the tensors one by one in a fused group. Horovod reduces a response of one tensor in
    place; the control vector (float64) is reduced beside it, fused only with float64 models.
    Tensors that do not own their memory (views into a buffer of someone else's, such as cuDNN's
    flattened RNN weights, or non-contiguous tensors) stay separate, after the flat tensors.

    A parameter rebound later (``model.to()``, ``model.half()``, ``p.data = ...``) no longer lives in
    the flat tensor; ``tensors()`` notices (a data-pointer check) and packs the model again. Buffers
    are *replaced* by ``model.to()`` (new tensor objects that no wrapper sees), so, as Horovod's
    recipe has it, move the model before wrapping the optimizer.

    Args:
        tensors: the parameters and buffers themselves (not ``.data``: rebinding a ``.data`` tensor
            would leave the parameter where it was), in the same order on every rank.

    Example:
        >>> net = torch.nn.Linear(3, 2)
        >>> model = TorchModel(list(net.parameters()))
        >>> [tuple(t.shape) for t in model.tensors()]      # weight (6) and bias (2) in one flat tensor
        [(8,)]
        >>> _ = model.tensors()[0].fill_(1.0); float(net.bias.sum())
        2.0
    """

    def __init__(self, tensors):
        self._sources = list(tensors)
        self._flats = []
        self._pack()

    @torch.no_grad()
    def _pack(self):
        """Copy the tensors that own their memory into one flat tensor per (dtype, device); rebind them."""
        ours = {flat.untyped_storage().data_ptr() for flat in self._flats}     # a previous pack's
        seen, groups, loose = set(), {}, []
        for t in self._sources:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            alone = (t.storage_offset() == 0 and storage.nbytes() == t.numel() * t.element_size()
                     and (ptr == 0 or ptr not in seen))
            own = t.layout == torch.strided and t.numel() > 0 and t.is_contiguous() and (alone or ptr in ours)
            seen.add(ptr)
            (groups.setdefault((t.dtype, t.device), []) if own else loose).append(t)
        self._flats = []
        for (dtype, device), members in groups.items():
            flat = torch.empty(sum(t.numel() for t in members), dtype=dtype, device=device)
            for t, view in zip(members, flat.split([t.numel() for t in members])):
                view = view.view(t.shape)
                view.copy_(t)
                t.data = view
            self._flats.append(flat)
        self._tensors = self._flats + [t.data for t in loose]
        self._bound = [t.data_ptr() for t in self._sources]

    def tensors(self):
        if any(t.data_ptr() != ptr for t, ptr in zip(self._sources, self._bound)):
            self._pack()                        # a tensor was rebound (model.to(), p.data = ...)
        return self._tensors

    @torch.no_grad()
    def assign(self, values, divisor=1.0, add_current=False):
        """In place; ``values`` are consumed (summed into, divided)."""
        for t, s in zip(self.tensors(), values):
            if add_current:
                s.add_(t)
            if s is t:
                t.div_(divisor)
            else:
                t.copy_(s.div_(divisor) if divisor != 1.0 else s)

    @property
    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self._sources)
