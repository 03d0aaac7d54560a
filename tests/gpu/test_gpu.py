"""Every torch strategy with the model on a CUDA GPU (issue 29), as ``make test-gpu`` runs it
(``tools/test_gpu.sh``: one rank per GPU under horovodrun; skipped in one line without a GPU or NCCL).

Each strategy trains a small MLP on the rank's GPU for a few dozen steps and ends with
``sync_model()``; every tensor Horovod is handed by any collective, the library's and Horovod's
optimizer hooks alike, must live on the model's GPU if it is floating-point (recorded by wrapping
``horovod.torch``'s enqueue functions; Horovod's object collectives serialise on the CPU), the model must stay there, and every rank must end with identical weights.
NCCL puts no two ranks of one communicator on one GPU, so a machine with one GPU runs one rank:
the device placement and the CUDA path through Horovod are what it checks there; agreement between
ranks is checked on CPU by the parallel tier (and here wherever several GPUs exist).
"""
import hashlib
import os
import time

import pytest
import torch

hvd = pytest.importorskip("horovod.torch")
#: ``cpu``: run these tests on the CPU (to check the test itself where no GPU exists).
ON = os.environ.get("HOROVOD_HETERO_TEST_DEVICE", "cuda")
if ON == "cuda" and not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import horovod_hetero.torch as hh  # noqa: E402
from horovod_hetero.strategies.registry import REGISTRY, configured  # noqa: E402

hvd.init(process_sets="dynamic")
if ON == "cuda":
    if not hvd.nccl_built():
        pytest.skip("Horovod is not built with NCCL (GPU=1 make env)", allow_module_level=True)
    torch.cuda.set_device(hvd.local_rank())
    DEVICE = torch.device("cuda", hvd.local_rank())
else:
    DEVICE = torch.device(ON)
#: Horovod's enqueue functions the library and Horovod's optimizer call (wrapped to record devices).
ENQUEUES = ("allreduce_async", "allreduce_async_", "grouped_allreduce_async", "grouped_allreduce_async_",
            "broadcast_async", "broadcast_async_", "allgather_async")
SEEN = []


def _recording(function):
    def enqueue(tensor, *args, **kwargs):
        for t in (tensor if isinstance(tensor, (list, tuple)) else [tensor]):
            SEEN.append((function.__name__, t.device, t.dtype))
        return function(tensor, *args, **kwargs)
    return enqueue


@pytest.fixture(autouse=True)
def record_devices(monkeypatch):
    import horovod.torch.mpi_ops as mpi_ops
    import horovod.torch.optimizer as horovod_optimizer
    for module in (hvd, mpi_ops, horovod_optimizer):
        for name in ENQUEUES:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, _recording(getattr(mpi_ops, name)))
    SEEN.clear()
    yield


def check_devices():
    """Every floating-point tensor in a collective (the model's, a gradient, a control vector) on the
    model's device; the others are Horovod's object collectives (``broadcast_object``,
    ``allgather_object``: bytes and their sizes, on the CPU by Horovod's design)."""
    floats = [(n, d) for n, d, dtype in SEEN if dtype.is_floating_point]
    assert floats, "no tensor collective ran"
    assert {d for _, d in floats} == {DEVICE}, sorted({(n, str(d)) for n, d in floats})
    assert {dtype for _, d, dtype in SEEN if d != DEVICE} <= {torch.uint8, torch.int32, torch.int64}


def names():
    out = [n for n in REGISTRY if n != "balanced"]             # Balanced needs its batch sampler: below
    return [n for n in out if n != "wagma" or hvd.size() >= 2]  # WAGMA's groups need two ranks


def checksum(model):
    return hashlib.sha1(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()


@pytest.mark.parametrize("name", names())
def test_every_strategy_trains_on_the_gpu_with_every_collective_tensor_on_it(name):
    torch.manual_seed(hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(DEVICE)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    strategy = configured(name)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=model.named_parameters(), strategy=strategy)
    x = torch.randn(64, 64, device=DEVICE)
    y = torch.randint(0, 10, (64,), device=DEVICE)
    start = time.perf_counter()
    for _ in range(40):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    opt.sync_model()
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    check_devices()
    assert all(p.device == DEVICE for p in model.parameters())
    sums = hvd.allgather_object(checksum(model), name=f"gpu.{name}")
    assert len(set(sums)) == 1, sums
    if hvd.rank() == 0:
        card = torch.cuda.get_device_name() if DEVICE.type == "cuda" else "the CPU"
        print(f"\n[gpu] {strategy.label}: {40 * 64 / seconds:.0f} samples/s on {card}, "
              f"{sum(dtype.is_floating_point for *_, dtype in SEEN)} floating-point tensors in collectives, all on {DEVICE}", flush=True)


def test_balanced_weighs_gradients_on_the_gpu():
    dataset = torch.utils.data.TensorDataset(torch.randn(512, 64), torch.randint(0, 10, (512,)))
    sampler = hh.DistributedSampler(dataset, batch_size=32)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).to(DEVICE)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters(),
                                  strategy=hh.Balanced(rebalance_every=2), sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x.to(DEVICE)), y.to(DEVICE)).backward()
            opt.step()
        opt.sync_model()
    check_devices()
    sums = hvd.allgather_object(checksum(model), name="gpu.balanced")
    assert len(set(sums)) == 1, sums
