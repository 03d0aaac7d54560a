"""WAGMA-SGD against plain hvd.DistributedOptimizer and LocalSGD, same run, transient stragglers.

    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.cli benchmark wagma    (make bench-wagma)

As in the WAGMA paper's ResNet experiment, at every step two ranks drawn at random (the same
draw on every rank, for every variant) are delayed: each step sleeps ``--base`` seconds, the
drawn ranks ``--delay`` more. Every variant trains the digits MLP for the same number of steps
from the same initial model and the same batches; the variants run back to back in a rotating
order, ``--repeats`` times. The table gives samples/s (all ranks, median over repetitions) as
ratios to hvd.DistributedOptimizer and to LocalSGD(sync_period), the share of the variant's bound
(its rate if computing and communicating were free, ``sleep_bound``), test accuracy at equal steps,
and how often the models are identical where they must be: all ranks after a global average,
the group's members after a group average (a stale member, served from its last model, differs
from its peers by design: Algorithm 2, line 13).
"""
import argparse
import hashlib
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

import horovod.torch as hvd
import horovod_hetero.torch as hh
from horovod_hetero.rules.grouping import butterfly_groups, resolve_group_size
from horovod_hetero.runtime.straggler import Slowdown, delayed_ranks
from horovod_hetero_lab.data import digits

DELAYED = 2          # ranks drawn at random and delayed at every step, as in the paper's ResNet experiment


def variants(S, tau, patience):
    def hh_opt(strategy):
        return lambda model, opt: hh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                                          strategy=strategy(), slowdown=[1.0] * hvd.size())
    return {
        "hvd.DistributedOptimizer": lambda model, opt: hvd.DistributedOptimizer(
            opt, named_parameters=model.named_parameters()),
        f"hh LocalSGD({tau})": hh_opt(lambda: hh.LocalSGD(tau)),
        f"hh WAGMA(S={S}, tau={tau}, patience={patience:g})": hh_opt(lambda: hh.WAGMA(S, tau, patience=patience)),
        f"hh WAGMA(S={S}, tau={tau}), waiting": hh_opt(lambda: hh.WAGMA(S, tau, wait_avoiding=False)),
    }


def digest(model):
    h = hashlib.blake2b(digest_size=8)
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def train(make_opt, data, args):
    x, y, x_test, y_test = data
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = make_opt(model, torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9))
    pad = Slowdown(hvd.rank(), base_step_s=args.base, size=hvd.size(), random_delay=(DELAYED, args.delay))
    batches = torch.Generator().manual_seed(hvd.rank())
    order = torch.cat([torch.randperm(len(y), generator=batches) for _ in range(args.steps * args.batch // len(y) + 1)])
    digests = []
    hvd.allreduce(torch.zeros(1), name="bench.barrier")
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        pad.pad(0.0, step)                                   # base step + the random straggler delay
        idx = order[(step - 1) * args.batch: step * args.batch]
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        digests.append(digest(model))
    wall = time.perf_counter() - t0
    if hasattr(opt, "sync_model"):
        opt.sync_model()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    records = opt.telemetry.records if hasattr(opt, "telemetry") else []
    waits = [r["group_s"] for r in records if "group_s" in r]
    stale = sum(bool(r.get("stale")) for r in records)
    return {"wall": wall, "accuracy": accuracy, "digests": digests, "stale": stale, "groups": len(waits),
            "group_ms": 1000 * statistics.median(waits) if waits else None}


def sleep_bound(size, steps, base, delay, period):
    """Wall time if computing and communicating were free: every ``period`` steps all ranks meet, so each
    period lasts as long as its slowest rank's sleeps. Per step (hvd) for period 1; the same for
    LocalSGD(tau) and WAGMA(tau), whose only barrier is the global average every tau steps."""
    sleeps = np.full((steps, size), base)
    for step in range(1, steps + 1):
        sleeps[step - 1, delayed_ranks(size, DELAYED, step)] += delay
    return sleeps.reshape(-1, period, size).sum(axis=1).max(axis=1).sum()


def identical_shares(digests, S, tau):
    """(share of global steps where all ranks agree, share of group steps where members agree)."""
    size, steps = len(digests), len(digests[0])
    glob, group, n_glob, n_group = 0, 0, 0, 0
    for s in range(1, steps + 1):
        if s % tau == 0:
            n_glob += 1
            glob += len({d[s - 1] for d in digests}) == 1
        else:
            for g in butterfly_groups(size, S, s - 1):
                n_group += 1
                group += len({digests[r][s - 1] for r in g}) == 1
    return glob / max(1, n_glob), group / max(1, n_group)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=120, help="steps per variant (a multiple of --sync-period)")
    p.add_argument("--sync-period", type=int, default=10)
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--base", type=float, default=0.05, help="seconds every step takes")
    p.add_argument("--delay", type=float, default=0.05, help="extra seconds of the 2 drawn ranks")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--patience", type=float, default=0.0, help="WAGMA's patience (seconds)")
    args = p.parse_args(argv)
    if args.sync_period < 1 or args.steps % args.sync_period:
        p.error(f"--steps ({args.steps}) must be a multiple of --sync-period ({args.sync_period}) >= 1")

    hvd.init(process_sets=hh.wagma_process_sets(group_size=args.group_size))
    torch.set_num_threads(1)
    S, tau = resolve_group_size(args.group_size, hvd.size()), args.sync_period
    data = [torch.from_numpy(a) for a in digits(hvd.rank(), hvd.size())]
    table = variants(S, tau, args.patience)
    names = list(table)
    results: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(args.repeats):
        for i in range(len(names)):
            name = names[(i + rep) % len(names)]
            results[name].append(train(table[name], data, args))
    everyone = hvd.allgather_object(results, name="bench.results")
    if hvd.rank() != 0:
        return
    total = args.steps * args.batch * hvd.size()
    rate = {n: statistics.median(total / max(e[n][k]["wall"] for e in everyone) for k in range(args.repeats))
            for n in names}
    ref, local = rate[names[0]], rate[names[1]]
    print(f"{hvd.size()} workers, {args.steps} steps of {args.base * 1000:g} ms; {DELAYED} random ranks "
          f"{args.delay * 1000:g} ms slower each step; median of {args.repeats} repetitions\n")
    print("| variant | samples/s | vs hvd | vs LocalSGD | of its bound | test acc | global steps identical "
          "| group steps identical | stale group steps | median group wait |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in names:
        period = 1 if n == names[0] else tau
        bound = total / sleep_bound(hvd.size(), args.steps, args.base, args.delay, period)
        acc = statistics.mean(e[n][k]["accuracy"] for e in everyone for k in range(args.repeats))
        cells = ["", "", "", ""]
        if n != names[0]:
            shares = [identical_shares([e[n][k]["digests"] for e in everyone], S, tau) for k in range(args.repeats)]
            stale = sum(e[n][k]["stale"] for e in everyone for k in range(args.repeats))
            groups = sum(e[n][k]["groups"] for e in everyone for k in range(args.repeats))
            waits = [e[n][k]["group_ms"] for e in everyone for k in range(args.repeats) if e[n][k]["group_ms"]]
            cells = [f"{np.mean([s[0] for s in shares]):.0%}",
                     f"{np.mean([s[1] for s in shares]):.0%}" if groups else "",
                     f"{stale / groups:.0%}" if groups else "",
                     f"{statistics.median(waits):.1f} ms" if waits else ""]
        print(f"| {n} | {rate[n]:.0f} | {rate[n] / ref:.2f}x | {rate[n] / local:.2f}x | {rate[n] / bound:.0%} "
              f"| {acc:.3f} | "
              + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
