"""``Collectives`` over ``horovod.torch`` and the ``Model`` of a torch optimizer's tensors.

Every wait here polls (``wait_done``) before ``hvd.synchronize``: Horovod's own wait is a loop of
``sched_yield`` calls that takes the GIL back each turn, and where ranks outnumber cores a rank
waiting so keeps a core from the ranks and Horovod background threads that would end its wait
(measured: Horovod's Gloo exchanges then stalled past their 30 s timeout, in about one job in two
of the torch averager test on 2 cores and 4 ranks; none in 5 with polling)."""
from __future__ import annotations

import itertools
import pickle
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

import horovod.torch as hvd

from horovod_hetero.common.horovod_collectives import HorovodCollectives
from horovod_hetero.runtime.seams import Model, check_background, timeout_error


def wait(handle: int, timeout_s: float, what: str) -> Any:
    """``hvd.synchronize(handle)``, but raise ``CollectiveTimeoutError`` after ``timeout_s`` seconds."""
    wait_done(handle, timeout_s, what)
    return hvd.synchronize(handle)


def wait_done(handle: int, timeout_s: float, what: str) -> None:
    """Return once ``handle``'s collective is done (it stays Horovod's to synchronize), or raise
    ``CollectiveTimeoutError`` after ``timeout_s`` seconds."""
    # Back off to 1 ms between polls: polling harder measurably slows training when ranks and
    # Horovod's background threads share cores (LocalSGD(1) step time +20% at a 0.1 ms cap).
    started = time.monotonic()
    deadline = started + timeout_s
    pause = 0.0
    while not hvd.poll(handle):
        now = time.monotonic()
        if now > deadline:
            raise timeout_error(what, timeout_s)
        check_background(what, now - started)
        time.sleep(pause)
        pause = min(2 * pause or 1e-5, 1e-3)


class TorchCollectives(HorovodCollectives):
    """Horovod's torch collectives; the control vector is made on the model's device in float64.

    Horovod's torch grouped allreduce takes the device of the *first* tensor for the whole group
    (``mpi_ops_v2.cc``, ``DoGroupedAllreduce``): a CPU control vector beside CUDA parameters would
    be read as GPU memory, so it is always created beside ``tensors[0]``.
    """

    hvd = hvd
    overlaps = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deferred: list[Callable[[], None]] = []      # sums started, to enqueue with the gradients (flush)

    @torch.no_grad()
    def allreduce_sum(self, tensors: Sequence[torch.Tensor], control: Sequence[float], *,
                      ranks: Sequence[int] | None = None, name: str, what: str, inplace: bool = False,
                      like: torch.Tensor | None = None) -> tuple[list[torch.Tensor], list[float]]:
        device = tensors[0].device if len(tensors) else like.device if like is not None else torch.device("cpu")
        group = list(tensors) + [torch.tensor(control, dtype=torch.float64, device=device)]
        enqueue = hvd.grouped_allreduce_async_ if inplace else hvd.grouped_allreduce_async
        out = self.polled(lambda: enqueue(group, op=hvd.Sum, name=self.named(name),
                                          process_set=self.process_set_of(ranks)), what)
        return out[:-1], out[-1].tolist()

    def start_sum(self, control: Sequence[float], *, name: str, what: str,
                  like: torch.Tensor | None = None) -> Callable[[], list[float]]:
        """The allreduce of ``control`` (float64, on ``like``'s device), enqueued with the next step's gradient
        allreduce (``flush``, when the optimizer waits for it: in the same Horovod cycle, where the ranks wait
        anyway), or where it is waited for if no gradient allreduce comes first; return what polls it (``wait``).
        Enqueued at once, beside the next step's compute, it cost that step 0-20 ms on 4 ranks sharing 2 cores."""
        vector = torch.tensor(control, dtype=torch.float64, device=like.device if like is not None else "cpu")
        handle: list[int] = []

        def enqueue() -> None:
            if not handle:
                with self.enqueueing(what):
                    handle.append(hvd.allreduce_async_(vector, op=hvd.Sum, name=self.named(name),
                                                       process_set=self.process_set))

        def result() -> list[float]:
            enqueue()
            if enqueue in self._deferred:
                self._deferred.remove(enqueue)
            return wait(handle[0], self.timeout, what).tolist()
        self._deferred.append(enqueue)
        return result

    def flush(self) -> None:
        """Enqueue the sums started since the last flush (``start_sum``): the optimizer calls it when it waits for
        the step's gradient allreduce."""
        deferred, self._deferred = self._deferred, []
        for enqueue in deferred:
            enqueue()

    def broadcast_object(self, obj: Any, *, what: str, root: int | None = None,
                         name: str = "horovod_hetero.broadcast") -> Any:
        """``obj`` of the set's first rank (or of global rank ``root``) on every rank of the set, as
        ``hvd.broadcast_object`` (pickled: a size, then the bytes), with polled waits."""
        root = self.root if root is None else root
        sender = hvd.rank() == root
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8) if sender else None
        size = torch.tensor([0 if data is None else data.numel()], dtype=torch.int64)
        self.polled(lambda: hvd.broadcast_async_(size, root, name=self.named(f"{name}.sz"),
                                                 process_set=self.process_set), what)
        if data is None:
            data = torch.empty(int(size.item()), dtype=torch.uint8)
        self.polled(lambda: hvd.broadcast_async_(data, root, name=self.named(f"{name}.t"),
                                                 process_set=self.process_set), what)
        return obj if sender else pickle.loads(data.numpy().tobytes())

    def allgather_object(self, obj: Any, *, what: str) -> list[Any]:
        """Every rank's ``obj``, in rank order, as ``hvd.allgather_object`` (over all ranks), with polled waits."""
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = self.polled(lambda: hvd.allgather_async(torch.tensor([data.numel()], dtype=torch.int64),
                                                         name=self.named("horovod_hetero.allgather.sz")), what).tolist()
        gathered = self.polled(lambda: hvd.allgather_async(data, name=self.named("horovod_hetero.allgather.t")), what)
        starts = itertools.accumulate(sizes, initial=0)
        return [pickle.loads(gathered[start:start + n].numpy().tobytes()) for start, n in zip(starts, sizes)]

    def polled(self, enqueue: Callable[[], int], what: str) -> Any:
        """Enqueue one collective (``enqueue()``: its handle) and return its result, polled (``wait``);
        never into a failed Horovod, where the enqueue would block (``check_enqueue``)."""
        with self.enqueueing(what):
            handle = enqueue()
        return wait(handle, self.timeout, what)

    @torch.no_grad()
    def copy(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [t.clone() for t in tensors]

    def broadcast(self, tensors: Sequence[torch.Tensor], root_rank: int, *, name: str,
                  what: str) -> list[torch.Tensor]:
        with self.enqueueing(what):
            handles = [hvd.broadcast_async(t.detach(), root_rank, name=self.named(f"{name}.{i}"),
                                           process_set=self.process_set) for i, t in enumerate(tensors)]
        return [wait(h, self.timeout, what) for h in handles]

    def mean(self, tensors: Sequence[torch.Tensor], *, name: str) -> list[torch.Tensor]:
        return self.polled(lambda: hvd.grouped_allreduce_async(list(tensors), op=hvd.Average, name=self.named(name),
                                                               process_set=self.process_set), "the gradient average")

    def timed_mean(self, tensors: Sequence[torch.Tensor], *, name: str) -> tuple[list[torch.Tensor], float]:
        """``mean`` and the seconds it took (eager: the wall clock around it)."""
        start = time.perf_counter()
        out = self.mean(tensors, name=name)
        return out, time.perf_counter() - start


class TorchModel(Model):
    """The optimizer's parameters and floating-point buffers, held as views into one flat tensor per
    (dtype, device), so an averaging round is one in-place allreduce with no gather or scatter copies.

    At construction every contiguous tensor is copied, in the given (name) order, into the flat
    tensor of its dtype and device, and rebound to a view of it (``tensor.data = view``): parameters
    keep their identity, gradients, hooks and optimizer state, and the optimizer's in-place updates
    write into the flat tensor. Which tensors are packed, and where, depends only on what every rank
    shares (the tensors' order, dtypes, devices, shapes, strides and which of them overlap), never on
    how memory happens to be laid out on one rank (a rank that loaded a checkpoint into one shared
    storage packs like the others), so every rank enters a round with the same tensors. A tensor that
    is the same memory as an earlier one (tied weights listed twice) is bound to the earlier one's
    view, averaged once and still tied; tensors that partly overlap another, and non-contiguous ones,
    stay separate, after the flat tensors.

    On the CPU, below ``HOROVOD_FUSION_THRESHOLD`` (128 MiB by default), the flat tensor holds the
    same bytes at the same offsets as the fusion buffer Horovod packs for a grouped allreduce of the
    separate tensors (``MemcpyInFusionBuffer``: back to back, no padding), so a round sums exactly what
    it summed before, in the same order: results are bit-identical to the grouped layout. (On GPUs
    Horovod pads each fused tensor to 16 bytes, and above the threshold it split the model into
    several allreduces: there the last bits may differ from the grouped layout, identically on every
    rank.) Horovod reduces a response of one tensor in place (one pass over it, instead of the copies
    into and out of the fusion buffer); the float64 control vector is reduced beside it, fused only
    with float64 models.

    A parameter rebound later (``model.to()``, ``model.half()``, ``p.data = ...``) no longer lives in
    the flat tensor; ``tensors()`` notices (a data-pointer check) and packs the model again. Buffers
    are *replaced* by ``model.to()`` (new tensor objects that no wrapper sees), so, as Horovod's
    recipe has it, move the model before wrapping the optimizer. Packing holds the model twice while
    it runs. ``torch.save`` of one parameter or of a sub-module's ``state_dict()`` writes the whole
    flat tensor (a view is saved with its storage): save the whole model's, or ``clone()`` the part.

    Args:
        tensors: the parameters and buffers themselves (not ``.data``: rebinding a ``.data`` tensor
            would leave the parameter where it was), in the same order on every rank.
        flat: ``False`` keeps every tensor as it is (a strategy that averages gradients, not models,
            only broadcasts them in ``sync_model()``).

    Example:
        >>> net = torch.nn.Linear(3, 2)
        >>> model = TorchModel(list(net.parameters()))
        >>> [tuple(t.shape) for t in model.tensors()]      # weight (6) and bias (2) in one flat tensor
        [(8,)]
        >>> _ = model.tensors()[0].fill_(1.0); float(net.bias.sum())
        2.0
    """

    def __init__(self, tensors: Iterable[torch.Tensor], flat: bool = True) -> None:
        self._sources = list(tensors)
        self._flat = flat
        self._pack()

    def _overlaps(self) -> tuple[dict[int, int], set[int]]:
        """Which tensors share memory: ``({i: j}`` for a tensor that is exactly the earlier tensor j's
        memory (same bytes, dtype, shape, strides), ``{i, ...}`` for tensors that partly overlap)."""
        spans: list[tuple[Any, ...]] = []
        by_storage: dict[int, list[int]] = {}
        for i, t in enumerate(self._sources):
            strided = t.layout == torch.strided
            first = t.storage_offset() * t.element_size() if strided else 0
            spans.append((first, first + t.numel() * t.element_size(), t.dtype, t.shape, t.stride() if strided else None))
            ptr = t.untyped_storage().data_ptr() if strided else 0
            if ptr and t.numel():                              # meta and empty tensors overlap nothing
                by_storage.setdefault(ptr, []).append(i)
        alias_of: dict[int, int] = {}
        overlapping: set[int] = set()
        for members in by_storage.values():                    # sweep each storage's byte ranges in order
            members.sort(key=lambda i: (spans[i][0], i))
            clusters, end = [], None
            for i in members:
                if end is None or spans[i][0] >= end:
                    clusters.append([i])
                    end = spans[i][1]
                else:
                    clusters[-1].append(i)
                    end = max(end, spans[i][1])
            for cluster in clusters:
                first = min(cluster)
                if all(spans[i] == spans[first] for i in cluster):
                    alias_of.update((i, first) for i in cluster if i != first)
                else:
                    overlapping.update(cluster)
        return alias_of, overlapping

    @torch.no_grad()
    def _pack(self) -> None:
        """Copy the contiguous tensors into one flat tensor per (dtype, device), in order; rebind them."""
        alias_of, overlapping = self._overlaps()
        groups: dict[tuple[Any, Any], list[int]] = {}
        loose: list[int] = []
        for i, t in enumerate(self._sources):
            if i in alias_of:
                continue
            packable = (self._flat and i not in overlapping and t.layout == torch.strided and t.numel() > 0
                        and t.is_contiguous())
            (groups.setdefault((t.dtype, t.device), []) if packable else loose).append(i)
        self._tensors = []
        for (dtype, device), members in groups.items():
            flat = torch.empty(sum(self._sources[i].numel() for i in members), dtype=dtype, device=device)
            for i, view in zip(members, flat.split([self._sources[i].numel() for i in members])):
                t = self._sources[i]
                view = view.view(t.shape)
                view.copy_(t)
                t.data = view
            self._tensors.append(flat)
        for i, j in alias_of.items():          # tied: the same view as the tensor it aliases
            self._sources[i].data = self._sources[j].data
        self._tensors += [self._sources[i].data for i in loose]
        self._bound = [t.data_ptr() for t in self._sources]

    def tensors(self) -> list[torch.Tensor]:
        if any(t.data_ptr() != ptr for t, ptr in zip(self._sources, self._bound)):
            self._pack()                        # a tensor was rebound (model.to(), p.data = ...)
        return self._tensors

    @torch.no_grad()
    def assign(self, values: Sequence[torch.Tensor], divisor: float = 1.0, add_current: bool = False) -> None:
        """In place; ``values`` are consumed (summed into, divided)."""
        for t, s in zip(self.tensors(), values):
            if add_current:
                s.add_(t)
            if s is t:
                t.div_(divisor)
            else:
                t.copy_(s.div_(divisor) if divisor != 1.0 else s)

    @torch.no_grad()
    def place(self, values: Sequence[Any]) -> list[torch.Tensor]:
        tensors = self.tensors()
        values = list(values)
        if len(values) != len(tensors):
            raise ValueError(f"{len(values)} tensors do not fit a model of {len(tensors)}: state from another model?")
        out = []
        for v, t in zip(values, tensors):
            v = torch.as_tensor(v)
            if v.shape != t.shape:
                raise ValueError(f"a tensor of shape {tuple(v.shape)} does not fit one of {tuple(t.shape)}: "
                                 f"state from another model?")
            out.append(v.to(device=t.device, dtype=t.dtype, copy=True))
        return out

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())
