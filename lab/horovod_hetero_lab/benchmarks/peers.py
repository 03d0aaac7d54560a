"""horovod-hetero's averaging against what a PyTorch user would pick instead, same model, same run.

    horovodrun -np 2 -H localhost:2 --gloo python -m horovod_hetero.cli benchmark peers [--width 1024|4864]
    (make bench-peers)

Variants, each on its own copy of the same MLP (width 1024: 1.32 M parameters; 4864: 25 M):
no communication (the floor), torch ``PeriodicModelAverager(8)`` and ``DistributedDataParallel``
over a ``torch.distributed`` Gloo group beside Horovod's, ``hvd.DistributedOptimizer``,
``hh.Synchronous()``, ``hh.LocalSGD(8)`` and Horovod's optimizer with one explicit group (its
gradients allreduced after the backward pass, nothing overlapped). Every repetition times each variant once, back to back,
in a rotating order; ratios are taken within a repetition (paired), and the table gives their median
and interquartile range, so the drifts of a shared machine cancel.
"""
import argparse
import socket
import time
from datetime import timedelta
from typing import cast

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging import averagers

import horovod.torch as hvd
import horovod_hetero.torch as hh

PERIOD = 8


def make(width):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 10))


class Variant:
    """A model, its optimizer and what runs after ``step()`` (torch's averager).

    ``phase``: for a periodic averager, the averaging steps are those with ``(i + phase) % PERIOD == 0``
    (0-based, counted from the first timed step; the warm-up is one period, so the phase holds)."""

    def __init__(self, width, wrap, after=None, model_wrap=None, phase=None):
        self.model = make(width)
        self.forward = model_wrap(self.model) if model_wrap else self.model
        self.opt = wrap(torch.optim.SGD(self.model.parameters(), lr=0.01), self.model)
        self.after = after(self) if after else None
        self.phase = phase
        # seconds per step, by steps since the averaging
        self.by_position: list[list[float]] = [[] for _ in range(PERIOD)]

    def steps(self, x, y, n, record=True):
        times = np.empty(n)
        t0 = start = time.perf_counter()
        for i in range(n):
            self.opt.zero_grad()
            torch.nn.functional.cross_entropy(self.forward(x), y).backward()
            self.opt.step()
            if self.after:
                self.after()
            t1 = time.perf_counter()
            times[i], t0 = t1 - t0, t1
        if record and self.phase is not None:     # position 0: the averaging step; 1..7: the local steps after it
            for position in range(PERIOD):
                self.by_position[position].append(np.median(times[(np.arange(n) + self.phase) % PERIOD == position]))
        return (t0 - start) / n


def periodic_averager(variant):
    averager = averagers.PeriodicModelAverager(period=PERIOD, warmup_steps=0)
    return lambda: averager.average_parameters(variant.model.parameters())


VARIANTS = {
    "no communication": lambda w: Variant(w, lambda o, m: o),
    # torch's averager (warmup_steps=0) averages at its calls 0, 8, ...; hh.LocalSGD(8) after steps 8, 16, ...
    f"torch PeriodicModelAverager({PERIOD})": lambda w: Variant(w, lambda o, m: o, after=periodic_averager, phase=0),
    f"hh.LocalSGD({PERIOD})": lambda w: Variant(w, lambda o, m: hh.DistributedOptimizer(
        o, named_parameters=m.named_parameters(), strategy=hh.LocalSGD(PERIOD)), phase=1),
    "torch DistributedDataParallel": lambda w: Variant(
        w, lambda o, m: o, model_wrap=lambda m: torch.nn.parallel.DistributedDataParallel(m)),
    "hvd.DistributedOptimizer": lambda w: Variant(w, lambda o, m: hvd.DistributedOptimizer(
        o, named_parameters=m.named_parameters())),
    "hh.Synchronous()": lambda w: Variant(w, lambda o, m: hh.DistributedOptimizer(
        o, named_parameters=m.named_parameters(), strategy=hh.Synchronous())),
    # Horovod's explicit grouping with one group: one allreduce, enqueued when the last gradient is
    # ready (after the backward pass), so nothing overlaps; the default overlaps tensor by tensor
    "hvd.DistributedOptimizer(groups=1)": lambda w: Variant(w, lambda o, m: hvd.DistributedOptimizer(
        o, named_parameters=m.named_parameters(), groups=1)),
}
#: (numerator, denominator) pairs printed as paired ratios
RATIOS = [(f"hh.LocalSGD({PERIOD})", f"torch PeriodicModelAverager({PERIOD})"),
          (f"torch PeriodicModelAverager({PERIOD})", "no communication"),
          (f"hh.LocalSGD({PERIOD})", "no communication"),
          ("hh.Synchronous()", "hvd.DistributedOptimizer"),
          ("hh.Synchronous()", "torch DistributedDataParallel"),
          ("hvd.DistributedOptimizer", "torch DistributedDataParallel"),
          ("hvd.DistributedOptimizer", "hvd.DistributedOptimizer(groups=1)")]


def round_costs(runs, reps):
    """Seconds per averaging of the same parameters: hh's round (its flat parameter tensor and the
    round's control vector in one grouped allreduce, then the division), torch's
    ``average_parameters`` (flatten, one Gloo allreduce, copy back), and Horovod's allreduce of one
    flat copy alone and with a control vector (the floors of Horovod's own collective)."""
    from torch.distributed.algorithms.model_averaging.utils import average_parameters
    controller = runs[f"hh.LocalSGD({PERIOD})"].opt._hh
    torch_params = list(runs[f"torch PeriodicModelAverager({PERIOD})"].model.parameters())
    world = cast(dist.ProcessGroup, dist.group.WORLD)
    flat = torch.cat([q.detach().reshape(-1) for q in torch_params])
    control = torch.zeros(3 + 5 * hvd.size(), dtype=torch.float64)      # a round's control vector
    kinds = {"hh round (flat tensor + control)": lambda: controller.protocol.run_round(),
             "torch average_parameters (Gloo)": lambda: average_parameters(iter(torch_params), world),
             "hvd.allreduce_ of one flat tensor": lambda: hvd.allreduce_(flat, op=hvd.Average, name="peers.flat"),
             "one flat tensor + control, grouped": lambda: hvd.grouped_allreduce_(
                 [flat, control], op=hvd.Sum, name="peers.flat_control"),
             "one flat tensor, then control": lambda: (hvd.allreduce_(flat, op=hvd.Sum, name="peers.flat_sum"),
                                                       hvd.allreduce_(control, op=hvd.Sum, name="peers.control"))}
    names = list(kinds)
    times: dict[str, list[float]] = {name: [] for name in kinds}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            t0 = time.perf_counter()
            for _ in range(4):
                kinds[name]()
            times[name].append((time.perf_counter() - t0) / 4)
    return times


def torch_group():
    """A ``torch.distributed`` Gloo group over Horovod's ranks (rank 0 picks the port)."""
    port = None
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, root_rank=0, name="peers.port")
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size(), init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=120))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=1024, help="1024: 1.32 M parameters; 4864: 25 M")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=8 * PERIOD, help="steps per timing (a multiple of the period)")
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args(argv)
    if args.steps % PERIOD:
        p.error(f"--steps must be a multiple of {PERIOD}")
    hvd.init()
    torch.set_num_threads(1)
    torch_group()
    x, y = torch.randn(args.batch, 256), torch.randint(0, 10, (args.batch,))
    runs = {name: build(args.width) for name, build in VARIANTS.items()}
    for variant in runs.values():
        variant.steps(x, y, PERIOD, record=False)                         # warm-up
    names = list(VARIANTS)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(args.reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:    # rotate the order
            times[name].append(runs[name].steps(x, y, args.steps))
    if hvd.rank() == 0:
        params = sum(q.numel() for q in runs["no communication"].model.parameters())
        print(f"peers: {hvd.size()} ranks (Gloo, CPU), MLP with {params / 1e6:.2f} M parameters, batch {args.batch}, "
              f"{args.reps} repetitions x {args.steps} steps, rotating order")
        print(f"{'variant':<40} {'ms/step median':>15} {'IQR':>15}")
        for name in names:
            q1, med, q3 = np.percentile(times[name], [25, 50, 75]) * 1000
            print(f"{name:<40} {med:>15.2f} {q1:>7.2f}-{q3:<7.2f}")
        print(f"\n{'paired ratio':<72} {'median':>7} {'IQR':>15}")
        for a, b in RATIOS:
            q1, med, q3 = np.percentile(np.array(times[a]) / np.array(times[b]), [25, 50, 75])
            print(f"{a + ' / ' + b:<72} {med:>7.3f} {q1:>7.3f}-{q3:<7.3f}")
        floor = np.array(times["no communication"])
        print(f"\nsteps by position after the averaging step (0), ms (median of the repetitions' medians), "
              f"and the local steps' mean over positions 1-{PERIOD - 1} / no communication (paired)")
        print(f"{'variant':<40} " + " ".join(f"{p:>6}" for p in range(PERIOD)) + f" {'local/floor':>12} {'IQR':>13}")
        for name in names:
            if runs[name].phase is None:
                continue
            by = np.array(runs[name].by_position)                          # (position, repetition)
            ratio = by[1:].mean(axis=0) / floor
            q1, med, q3 = np.percentile(ratio, [25, 50, 75])
            print(f"{name:<40} " + " ".join(f"{v:>6.2f}" for v in np.median(by, axis=1) * 1000)
                  + f" {med:>12.3f} {q1:>6.3f}-{q3:<6.3f}")
    rounds = round_costs(runs, args.reps)
    if hvd.rank() == 0:
        torch_round = np.array(rounds["torch average_parameters (Gloo)"])
        print(f"\n{'one averaging of the parameters':<40} {'ms median':>10} {'IQR':>15} {'/ torch':>8}")
        for name, seconds in rounds.items():
            q1, med, q3 = np.percentile(seconds, [25, 50, 75]) * 1000
            print(f"{name:<40} {med:>10.2f} {q1:>7.2f}-{q3:<7.2f} {np.median(np.array(seconds) / torch_round):>8.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
