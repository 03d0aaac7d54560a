"""Per-step cost of hh.DistributedOptimizer against plain hvd.DistributedOptimizer, same run.

    horovodrun -np 2 -H localhost:2 --gloo python -m horovod_hetero.cli benchmark averaging_cost
    (make bench: then again under horovodrun --mpi, so that the two controllers' tables come from one run)

Every repetition times each variant once, back to back, in a rotating order; a variant's
ratio is its time over the reference's time *in the same repetition* (paired), and the table
gives the median and the interquartile range of those ratios, so drifts of a shared 2-core
machine cancel. The "hvd.DistributedOptimizer (A/A)" row is a second copy of the reference:
its spread is the noise floor of the measurement. Targets: Synchronous() within 3% of Horovod's own,
LocalSGD(1) within 10%.
"""
import argparse
import time

import numpy as np

import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh


def make(width):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 10))


VARIANTS = {
    "hvd.DistributedOptimizer": lambda m: hvd.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.01), named_parameters=m.named_parameters()),
    "hvd.DistributedOptimizer (A/A)": lambda m: hvd.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.01), named_parameters=m.named_parameters()),
    "hh Synchronous()": lambda m: hh.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.01), named_parameters=m.named_parameters(), strategy=hh.Synchronous()),
    "hh LocalSGD(1)": lambda m: hh.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.01), named_parameters=m.named_parameters(), strategy=hh.LocalSGD(1)),
    "hh LocalSGD(8)": lambda m: hh.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.01), named_parameters=m.named_parameters(), strategy=hh.LocalSGD(8)),
}


def time_steps(model, opt, x, y, steps):
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=16, help="steps per timing (a multiple of 8)")
    p.add_argument("--reps", type=int, default=40)
    args = p.parse_args(argv)
    hvd.init()
    torch.set_num_threads(1)
    x, y = torch.randn(args.batch, 256), torch.randint(0, 10, (args.batch,))
    runs = {}
    for name, build in VARIANTS.items():
        model = make(args.width)
        runs[name] = (model, build(model))
        time_steps(model, runs[name][1], x, y, 8)           # warm-up
    names = list(VARIANTS)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(args.reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:    # rotate the order
            model, opt = runs[name]
            times[name].append(time_steps(model, opt, x, y, args.steps))
    if hvd.rank() == 0:
        params = sum(p.numel() for p in runs["hh LocalSGD(1)"][0].parameters())
        ref = np.array(times["hvd.DistributedOptimizer"])
        controller = "MPI" if hvd.mpi_enabled() else "Gloo"
        print(f"averaging_cost: {hvd.size()} ranks ({controller}, CPU), MLP with {params / 1e6:.2f} M parameters, "
              f"batch {args.batch}, {args.reps} repetitions x {args.steps} steps")
        print(f"{'variant':<32} {'ms/step':>8} {'ratio':>6} {'IQR of ratio':>14}")
        for name in names:
            ratios = np.array(times[name]) / ref
            q1, med, q3 = np.percentile(ratios, [25, 50, 75])
            print(f"{name:<32} {np.median(times[name]) * 1000:>8.2f} {med:>6.3f} {q1:>6.3f}-{q3:<6.3f}")


if __name__ == "__main__":
    main()
