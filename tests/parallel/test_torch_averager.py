"""``hh.LocalSGD`` against PyTorch's own ``PeriodicModelAverager``, in the same 4-rank job.

The README's porting rule: ``hh.LocalSGD(p, w)`` is "average after each of steps 1..w" plus
``PeriodicModelAverager(period=p, warmup_steps=w + p - 1)``. Each test trains two copies of a
model on the same per-rank data (different on every rank): one with ``hh.DistributedOptimizer``
over Horovod, one with plain ``torch.optim.SGD`` plus torch's averager (and, for steps 1..w,
``utils.average_parameters_or_parameter_groups``, the function the averager itself calls) over a
``torch.distributed`` Gloo process group opened in the same processes. After every step the two
are compared, and every rank checks that the ranks agree exactly on the averaging steps of the
documented schedule and disagree on the others (so the comparison cannot pass with no averaging).

Why not simply ``torch.equal`` on any model: both libraries average with Gloo's ring allreduce
(Horovod's ``GlooAllreduce`` and torch's ``ProcessGroupGloo`` both end in ``gloo::allreduce``), which
splits the flat buffer into one chunk per rank and sums chunk ``c`` of 4 ranks as
``((x[c-1] + x[c-2]) + x[c-3]) + x[c]`` (around the ring, ending at its owner). An element's
summation order thus depends on its offset in the buffer and on the buffer's length, and the two
libraries' buffers differ:

- torch flattens the parameters in ``model.parameters()`` order; ``hh`` fuses them in name order
  (``0.bias`` before ``0.weight``), so some elements land in another chunk;
- ``hh``'s averaging group also carries its float64 control vector (23 values for 4 ranks), which
  Horovod fuses with float64 parameters (at the front of the fusion buffer, as it turned out),
  shifting every float64 offset; float32 parameters are reduced in a buffer of their own.

Evidence (a scratch probe of the first averaging step, 195 parameters, all 4 ranks' inputs
gathered): every averaged element of both libraries equals the left-fold sum in the ring order
predicted from its chunk in that library's buffer, for both dtypes and both name orders. With
``model.named_parameters()`` 9 (float32) and 27 (float64) of the 195 values differ, by 1 and at
most 2 ulp, all of them elements whose chunk differs between the two buffers; none of the elements
whose chunk is the same differ. With 2 ranks (``a + b == b + a``: no association to choose) all 20
steps are bit-identical for both dtypes and every (p, w). After the first 1-ulp difference the
4-rank MLP runs drift apart a little further each step (training amplifies it; by step 20 by up
to 1.5e-7 in float32, 3.3e-16 in float64), so exact equality needs exactness by construction or
identical buffers:

1. ``test_integer_valued_training_is_bit_identical``: MLP-shaped parameters that start as integers
   and per-rank gradients that are integer multiples of 4, with lr 1 and momentum 1 (``buf += g``,
   so the per-rank momentum state, which neither library averages, stays a multiple of 4 too).
   Every rank's parameters stay congruent mod 4 to the last average, so each average is again an
   integer and every partial sum, in any order, is an exact small integer (or quarter: torch
   divides by the world size first, hh after; dividing by 4 is exact). Summation order cannot
   matter, so ``torch.equal`` after every step is the right check, for float32 and float64.
2. ``test_float32_mlp_in_torch_order_is_bit_identical``: the real MLP (cross-entropy, momentum 0.9)
   in float32 with ``named_parameters`` named so that hh's name order is torch's flattening order:
   the two float32 buffers are then laid out identically and ``torch.equal`` holds after every step.
3. ``test_mlp_matches_within_rounding``: the real MLP with ``model.named_parameters()`` (the usual
   call), float32 and float64: bit-identical up to the first averaging step, then within a
   tolerance a few orders of magnitude below what one misplaced averaging step causes.
"""
import socket
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging import averagers
from torch.distributed.algorithms.model_averaging import utils as averaging_utils

import horovod.torch as hvd
import horovod_hetero.torch as hh
from horovod_hetero.torch.adapter import wait
import job

job.init(hvd, hh)
RANK, SIZE = hvd.rank(), hvd.size()
pytestmark = pytest.mark.skipif(SIZE != 4, reason="written for 4 ranks (ring summation order, see docstring)")

STEPS = 20
SCHEDULES = [(4, 0), (3, 2), (1, 0)]          # (period, warmup_steps)
DTYPES = [torch.float32, torch.float64]
#: (rtol, atol) of test 3. Measured worst |diff| / (atol + rtol |ref|) over all steps and schedules:
#: 0.14 (float32) and 0.07 (float64); one averaging step too late or too early fails by far.
TOLERANCE = {torch.float32: (2e-5, 2e-7), torch.float64: (1e-13, 1e-15)}


@pytest.fixture(scope="module", autouse=True)
def torch_process_group():
    """A ``torch.distributed`` Gloo group over the Horovod ranks; destroyed after this module."""
    port = None
    if RANK == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, root_rank=0, name="test_torch_averager.port")
    dist.init_process_group("gloo", rank=RANK, world_size=SIZE, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=120))
    yield
    dist.destroy_process_group()


def averaged_on(step, period, warmup):
    """Whether ``LocalSGD(period, warmup)`` averages after ``step`` (1-based), from its definition."""
    return step <= warmup or (step - warmup) % period == 0


def make_model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(dtype)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def ulps(a, b):
    """Largest ``|a - b|`` in units in the last place of ``b``."""
    spacing = torch.nextafter(b.abs(), torch.full_like(b, float("inf"))) - b.abs()
    return ((a - b).abs() / spacing).max().item()


class TorchAveraging:
    """The torch side of the mapping: warm-up averages by hand, then ``PeriodicModelAverager``."""

    def __init__(self, period, warmup):
        self.warmup, self.step = warmup, 0
        with warnings.catch_warnings():          # period 1: "no need to use model averaging"
            warnings.simplefilter("ignore", UserWarning)
            self.averager = averagers.PeriodicModelAverager(period=period, warmup_steps=warmup + period - 1)

    def after_step(self, params):
        params = list(params)
        self.step += 1
        if self.step <= self.warmup:
            averaging_utils.average_parameters_or_parameter_groups(params, dist.group.WORLD)
        self.averager.average_parameters(params)


def run_pair(dtype, period, warmup, optimizer, step_fn, named=None):
    """Train the hh copy and the torch copy side by side; per step: both flat models and, for
    each, whether all ranks hold identical parameters. All collectives happen here."""
    ours, theirs = make_model(dtype), make_model(dtype)
    step_fn(None, ours, theirs)                                      # set-up hook (e.g. integer init)
    opt = hh.DistributedOptimizer(optimizer(ours.parameters()),
                                  named_parameters=named(ours) if named else ours.named_parameters(),
                                  strategy=hh.LocalSGD(period=period, warmup_steps=warmup))
    ref_opt, ref_avg = optimizer(theirs.parameters()), TorchAveraging(period, warmup)
    history = []
    for step in range(1, STEPS + 1):
        step_fn(step, ours, theirs)                                  # fills .grad of both copies
        opt.step()
        ref_opt.step()
        ref_avg.after_step(theirs.parameters())
        a, b = flat(ours), flat(theirs)
        # polled, as the library waits: hvd.allgather's busy wait stalled Gloo past its timeout here
        gathered = wait(hvd.allgather_async(torch.stack([a, b]).unsqueeze(0), name="test_torch_averager.gather"),
                        60.0, "the test's gather")
        agree = [bool((gathered[:, i] == gathered[0, i]).all()) for i in (0, 1)]
        history.append((step, a, b, agree))
    return history


def check_schedule(history, period, warmup):
    for step, _, _, (ours_agree, theirs_agree) in history:
        want = averaged_on(step, period, warmup)
        assert ours_agree == want, f"step {step}: hh ranks {'dis' if want else ''}agree"
        assert theirs_agree == want, f"step {step}: torch ranks {'dis' if want else ''}agree"


def assert_bit_identical(history):
    for step, a, b, _ in history:
        assert torch.equal(a, b), (f"step {step}: {int((a != b).sum())} of {a.numel()} values differ, "
                                   f"by up to {(a - b).abs().max().item():.3g} ({ulps(a, b):.3g} ulp)")


# --- 1. exact by construction: integer values, summation order cannot matter ---------------------

def integer_steps(dtype):
    """Integer initial weights (same on every rank) and per-rank gradients in 4 * [-3, 3]."""
    gen = torch.Generator().manual_seed(1000 + RANK)

    def step_fn(step, ours, theirs):
        if step is None:
            init = torch.Generator().manual_seed(7)
            with torch.no_grad():
                for p, q in zip(ours.parameters(), theirs.parameters()):
                    p.copy_(torch.randint(-8, 8, p.shape, generator=init))
                    q.copy_(p)
            return
        for p, q in zip(ours.parameters(), theirs.parameters()):
            p.grad = 4 * torch.randint(-3, 4, p.shape, generator=gen).to(dtype)
            q.grad = p.grad.clone()
    return step_fn


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("period,warmup", SCHEDULES)
def test_integer_valued_training_is_bit_identical(dtype, period, warmup):
    history = run_pair(dtype, period, warmup, lambda ps: torch.optim.SGD(ps, lr=1.0, momentum=1.0),
                       integer_steps(dtype))
    check_schedule(history, period, warmup)
    assert_bit_identical(history)
    final = history[-1][1]
    assert torch.equal(final, final.round()), "premise broken: parameters left the integers"
    assert final.abs().max() < 2 ** 20


# --- 2. the real MLP in float32, buffers laid out alike: bit-identical -------------------------------

def rank_batches(dtype):
    g = torch.Generator().manual_seed(100 + RANK)
    return [(torch.randn(5, 8, generator=g, dtype=dtype), torch.randint(0, 3, (5,), generator=g))
            for _ in range(STEPS)]


def mlp_steps(dtype):
    batches = rank_batches(dtype)

    def step_fn(step, ours, theirs):
        if step is None:
            return
        x, y = batches[step - 1]
        for model in (ours, theirs):
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
    return step_fn


def mlp_sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def in_torch_order(model):
    """Names that sort in ``model.parameters()`` order, so hh fuses as torch flattens."""
    return [(f"{i:03d}.{name}", p) for i, (name, p) in enumerate(model.named_parameters())]


@pytest.mark.parametrize("period,warmup", SCHEDULES)
def test_float32_mlp_in_torch_order_is_bit_identical(period, warmup):
    history = run_pair(torch.float32, period, warmup, mlp_sgd, mlp_steps(torch.float32), named=in_torch_order)
    check_schedule(history, period, warmup)
    assert_bit_identical(history)


# --- 3. the real MLP as usually called: exact until the first average, then within rounding ---------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("period,warmup", SCHEDULES)
def test_mlp_matches_within_rounding(dtype, period, warmup):
    history = run_pair(dtype, period, warmup, mlp_sgd, mlp_steps(dtype))
    check_schedule(history, period, warmup)
    first_average = min(s for s, *_ in history if averaged_on(s, period, warmup))
    assert_bit_identical(history[:first_average - 1])
    rtol, atol = TOLERANCE[dtype]
    for step, a, b, _ in history:
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m, s=step: f"step {s}: {m}")
