"""Every tensor the torch adapter puts into a collective lives on the model's device.

Horovod's torch grouped allreduce reads the whole group on its *first* tensor's device
(mpi_ops_v2.cc, DoGroupedAllreduce), so a CPU control vector beside CUDA parameters would be read
as GPU memory. A recording stand-in for Horovod's async ops notes the device and dtype of every
tensor of every group. CPU-only machines cannot tell "made on the model's device" from "made on
the CPU" with real tensors, so the meta device (shapes without data) stands in for a GPU there.
"""
import itertools

import pytest
import torch

import horovod.torch as hvd
from horovod_hetero.runtime.controller import HeteroController
from horovod_hetero.strategies import LocalSGD
from horovod_hetero.torch.adapter import TorchCollectives, TorchModel


class RecordingHorovod:
    """One rank: a sum is the tensors themselves. Records (name, [(device, dtype), ...]) per group."""

    def __init__(self, monkeypatch, polls_per_op=1):
        self.groups, self._out, self._handles = [], {}, itertools.count(1000)
        self.polls_left, self.polls_per_op, self.objects = {}, polls_per_op, []
        monkeypatch.setattr(hvd, "grouped_allreduce_async_", lambda t, **kw: self._enqueue(t, kw, inplace=True))
        monkeypatch.setattr(hvd, "grouped_allreduce_async", lambda t, **kw: self._enqueue(t, kw, inplace=False))
        monkeypatch.setattr(hvd, "allreduce_async_", self._enqueue_one)
        monkeypatch.setattr(hvd, "poll", self._poll)
        monkeypatch.setattr(hvd, "synchronize", self._synchronize)
        monkeypatch.setattr(hvd, "rank", lambda: 0)
        # the first start's counters and its ranks' pids: object collectives over byte tensors
        monkeypatch.setattr(hvd, "broadcast_async_", lambda t, root, **kw: self._object_op(t, kw))
        monkeypatch.setattr(hvd, "allgather_async", lambda t, **kw: self._object_op(t, kw))
        monkeypatch.setattr(hvd.mpi_ops._basics, "_get_process_set_ids_and_ranks", lambda: {0: [0]})  # no sets

    def _object_op(self, tensor, kwargs):
        self.objects.append(kwargs["name"])
        return self._handle(tensor)

    def _handle(self, out):
        handle = next(self._handles)
        self._out[handle], self.polls_left[handle] = out, self.polls_per_op
        return handle

    def _poll(self, handle):
        self.polls_left[handle] -= 1
        return self.polls_left[handle] <= 0

    def _synchronize(self, handle):
        """Horovod's busy wait: only ever reached once the collective is done."""
        assert self.polls_left[handle] <= 0, "synchronize before poll said done"
        return self._out.pop(handle)

    def _enqueue_one(self, tensor, **kwargs):
        handle = self._enqueue([tensor], kwargs, inplace=True)
        self._out[handle] = self._out[handle][0]
        return handle

    def _enqueue(self, tensors, kwargs, inplace):
        self.groups.append((kwargs["name"], [(t.device, t.dtype) for t in tensors]))
        if tensors[0].device.type == "meta":                 # no data: a control vector that checks out
            out = list(tensors[:-1]) + [torch.zeros(tensors[-1].shape, dtype=torch.float64)]
        else:
            out = tensors if inplace else [t.clone() for t in tensors]
        return self._handle(out)


def collectives(sets=None):
    """A TorchCollectives of one rank, built without hvd.init (this tier never initialises Horovod)."""
    c = object.__new__(TorchCollectives)
    c.rank, c.size, c.timeout, c.process_set, c._sets = 0, 1, 5.0, hvd.global_process_set, dict(sets or {})
    c.root, c._deferred = 0, []
    return c


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_every_tensor_of_every_round_is_on_the_models_device_control_in_float64(monkeypatch, device):
    fake = RecordingHorovod(monkeypatch)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).to(device)
    tensors = list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]
    ctl = HeteroController(LocalSGD(period=2), collectives(), TorchModel(tensors))
    for _ in range(4):
        ctl.after_step()
    session = ctl.collectives.session                        # from the first start's broadcast
    assert len(session) == 9 and [name for name, _ in fake.groups] == [f"horovod_hetero.average{session}"] * 2
    for _, group in fake.groups:
        assert {d for d, _ in group} == {tensors[0].device}
        assert [t for _, t in group] == [torch.float32, torch.float64]      # one flat tensor, the control


def test_object_collectives_poll_before_horovods_busy_wait(monkeypatch):
    """Objects go as a size then pickled bytes; every wait polls until done, and only then
    calls Horovod's ``synchronize`` (a loop of ``sched_yield`` that starves shared cores)."""
    fake = RecordingHorovod(monkeypatch, polls_per_op=3)
    c = collectives()
    state = {"round": 7, "steps": [1, 2]}
    assert c.broadcast_object(state, what="a broadcast") == state
    assert c.allgather_object(("host", 12), what="a gather") == [("host", 12)]
    assert fake.objects == ["horovod_hetero.broadcast.sz", "horovod_hetero.broadcast.t",
                            "horovod_hetero.allgather.sz", "horovod_hetero.allgather.t"]
    assert all(left == 0 for left in fake.polls_left.values())


def test_the_control_vector_follows_the_model_to_another_device_rounds_and_groups(monkeypatch):
    fake = RecordingHorovod(monkeypatch)
    c = collectives({(0, 1): hvd.global_process_set})
    on_meta = [torch.empty(5, device="meta"), torch.empty(2, 2, device="meta", dtype=torch.float16)]
    c.allreduce_sum(on_meta, [1.0, 0.0, 1.0], name="round", what="a round", inplace=True)
    c.allreduce_sum(on_meta, [1.0, 1.0, 3.0], ranks=(0, 1), name="group", what="a group average")
    for name, group in fake.groups:
        assert [d.type for d, _ in group] == ["meta"] * 3, name
        assert group[-1][1] == torch.float64


def test_a_group_of_every_rank_is_averaged_over_the_whole_set():
    """WAGMA with S = P (e.g. 2 workers, group_size=None): the group is the global process set, which
    is not registered as a group of its own."""
    c = collectives()
    c.size = 2
    assert c.process_set_of((0, 1)) is c.process_set and c.process_set_of(None) is c.process_set


# --- the flat layout: parameters as views into one tensor per (dtype, device) ---------------------

def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))


def _floating(net):
    return list(net.parameters()) + [b for b in net.buffers() if b.is_floating_point()]


def test_the_flat_tensor_holds_the_fusion_buffers_bytes_and_the_parameters_are_views_into_it():
    net = _net()
    tensors = _floating(net)
    before = torch.cat([t.detach().reshape(-1).clone() for t in tensors])   # what Horovod's fusion buffer held
    ids = [id(t) for t in tensors]
    model = TorchModel(tensors)
    (flat,) = model.tensors()
    assert torch.equal(flat, before)
    assert [id(t) for t in _floating(net)] == ids                           # the same Parameter objects
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in net.parameters())
    offset = 0
    for t in tensors:                                                      # each at its offset, no copy
        assert t.data_ptr() == flat.data_ptr() + offset * flat.element_size()
        offset += t.numel()
    opt = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
    net(torch.randn(5, 3)).sum().backward()
    grads = [p.grad.clone() for p in net.parameters()]
    old = [p.detach().clone() for p in net.parameters()]
    opt.step()                                                             # the optimizer writes into the flat
    assert all(torch.equal(p.detach(), o - 0.5 * g) for p, o, g in zip(net.parameters(), old, grads))
    assert torch.equal(model.tensors()[0], torch.cat([t.detach().reshape(-1) for t in tensors]))
    model.assign([torch.full_like(flat, 6.0)], divisor=3.0)                 # a round's result lands in the model
    assert all(bool((t == 2.0).all()) for t in tensors)


def test_rebinding_after_wrapping_packs_again_with_the_values_kept():
    """Parameters rebound by ``module.to()``/``double()`` are followed (buffers are replaced by new
    tensor objects there, which no wrapper sees: move the model before wrapping, as Horovod says)."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model = TorchModel(list(net.parameters()))
    net.double()                                                           # rebinds every .data (module._apply)
    (flat,) = model.tensors()
    assert flat.dtype == torch.float64 and torch.equal(flat, torch.cat([t.detach().reshape(-1) for t in net.parameters()]))
    weight = net[0].weight
    weight.data = torch.full((4, 3), 7.0, dtype=torch.float64)             # one tensor rebound by the user
    (flat,) = model.tensors()
    assert torch.equal(flat[:12], torch.full((12,), 7.0, dtype=torch.float64))
    assert weight.data_ptr() == flat.data_ptr()
    assert model.tensors() is model.tensors()                              # no repacking while bound


def test_dtypes_get_a_flat_tensor_each_and_non_contiguous_tensors_stay_separate():
    shared = torch.zeros(10)
    half = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    full = torch.nn.Parameter(torch.full((2,), 2.0))
    transposed = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3).t())    # not contiguous
    view = torch.nn.Parameter(shared[2:5])                                  # in a buffer nobody else lists
    model = TorchModel([half, full, transposed, view])
    out = model.tensors()
    assert [(t.dtype, t.numel()) for t in out] == [(torch.float16, 3), (torch.float32, 5), (torch.float32, 6)]
    assert out[2].data_ptr() == transposed.data_ptr() and not out[2].is_contiguous()
    assert view.data_ptr() == out[1].data_ptr() + 2 * 4                     # packed after `full`
    model.assign([t * 0 + 3 for t in out])
    assert float(transposed.detach().sum()) == 18.0 and float(half.detach().sum()) == 9.0
    assert float(view.detach().sum()) == 9.0 and float(shared.sum()) == 0.0  # the user's buffer is left alone


def test_the_layout_depends_on_what_every_rank_shares_not_on_one_ranks_memory():
    """A rank that loaded a checkpoint into one shared storage (torch.load(mmap=True),
    load_state_dict(assign=True)) packs exactly like a rank whose tensors each own their memory;
    otherwise the ranks would enter a round with different tensors."""
    fresh = _net()
    loaded = _net()
    storage = torch.cat([t.detach().reshape(-1) for t in _floating(loaded)])   # one storage, as a loaded checkpoint
    offset = 0
    for t in _floating(loaded):
        t.data = storage[offset:offset + t.numel()].view(t.shape)
        offset += t.numel()
    shapes = [[(t.dtype, tuple(t.shape)) for t in TorchModel(_floating(net)).tensors()] for net in (fresh, loaded)]
    assert shapes[0] == shapes[1] == [(torch.float32, (offset,))]


def test_tied_tensors_are_averaged_once_and_stay_tied_partial_overlaps_stay_separate():
    a = torch.nn.Parameter(torch.full((4,), 4.0))
    b = torch.nn.Parameter(torch.zeros(3))
    tied = torch.nn.Parameter(torch.empty(0))
    tied.data = a.data                                   # the same memory under a second name
    model = TorchModel([a, b, tied, a])                  # and the same object listed twice
    (flat,) = model.tensors()
    assert flat.numel() == 7 and tied.data_ptr() == a.data_ptr() == flat.data_ptr()
    model.assign([flat.clone()], divisor=2.0)            # a round: divided once, not once per name
    assert a.detach().tolist() == [2.0] * 4 and tied.detach().tolist() == [2.0] * 4
    with torch.no_grad():
        a.add_(1.0)
    assert tied.detach().tolist() == [3.0] * 4           # still tied after packing
    base = torch.arange(6.0)
    left, right = torch.nn.Parameter(base[0:4]), torch.nn.Parameter(base[2:6])   # partly overlapping
    out = TorchModel([left, right, b]).tensors()
    assert [t.numel() for t in out] == [3, 4, 4]          # b packed; the overlapping pair as they were
    assert out[1].data_ptr() == base.data_ptr() and out[2].data_ptr() == base.data_ptr() + 2 * 4


def test_flat_false_keeps_every_tensor_where_it_is():
    net = _net()
    ptrs = [t.data_ptr() for t in _floating(net)]
    model = TorchModel(_floating(net), flat=False)
    assert [t.data_ptr() for t in model.tensors()] == ptrs


def test_a_round_of_statistics_is_enqueued_with_the_next_steps_gradients_or_when_waited_for(monkeypatch):
    """``start_sum`` enqueues nothing; the optimizer's wait for the gradient allreduce enqueues it (``flush``),
    in float64 on the model's device; a sum waited for before any flush is enqueued then, once."""
    fake = RecordingHorovod(monkeypatch)
    c = collectives()
    waited = c.start_sum([1.0, 0.0, 2.0], name="horovod_hetero.measure", what="statistics round",
                         like=torch.empty(3, device="meta"))
    assert fake.groups == []
    c.flush()
    c.flush()
    assert fake.groups == [("horovod_hetero.measure", [(torch.device("meta"), torch.float64)])]
    late = c.start_sum([3.0, 1.0, 4.0], name="horovod_hetero.measure", what="statistics round")
    assert late() == [3.0, 1.0, 4.0] and len(fake.groups) == 2       # enqueued when waited for
    c.flush()
    assert len(fake.groups) == 2 and callable(waited)
