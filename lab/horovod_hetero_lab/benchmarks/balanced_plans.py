"""Balanced's plans in a bench run, and its samples/s once settled, against Synchronous in the same run.

    horovod-hetero benchmark balanced_plans OUT   (make bench-publish-planner runs it)

For every Balanced job of a bench results directory (``horovod-hetero bench ... --out OUT``) and the
Synchronous job of the same group and repeat, from their telemetry:

- each distinct split of the global batch, from which step and second (since the job's first step) it
  held, and how many times the plan changed (a rebalance that keeps the split is no change);
- "settled": from the step the last split took over (or, for a profile that changes, the last split
  after the last change of speed) to the end, all ranks' samples over rank 0's seconds, against
  Synchronous's samples/s over the same seconds of its own run; and the whole run's ratio;
- the bound: the ranks' summed speed over Synchronous's, every rank at the slowest's pace (3.25 at
  ``1,1,1,4``), reached when every rank's step is padded in proportion to its batch (``--slowdown
  padded-linear``) and communication is free; whole batches cap it a little lower (at ``1,1,1,4`` and a
  global batch of 128 the best split, 40,39,39,10, gives 3.2x).
A settled span shorter than 10 steps, or a profile whose speeds change with no change of split after
it, is said so.
"""
import argparse
import json
import pathlib
import statistics
import sys

from horovod_hetero.runtime.straggler import parse_slowdown
from horovod_hetero.runtime.telemetry import load


def splits(job_dir):
    """``[(step, seconds since the first step, split), ...]`` at each change of split, and
    ``(times, samples)`` per step of rank 0 (seconds) and of all ranks (samples)."""
    by_rank = load(job_dir / "telemetry")
    ranks = sorted(by_rank)
    steps = min(len(by_rank[r]) for r in ranks)
    t0 = by_rank[ranks[0]][0]["time"]
    changes: list[tuple[int, float, tuple[int, ...]]] = []
    times: list[float] = []
    samples: list[int] = []
    for i in range(steps):
        split = tuple(by_rank[r][i].get("batch", by_rank[r][i].get("samples", 0)) for r in ranks)
        t = by_rank[ranks[0]][i]["time"] - t0
        if not changes or changes[-1][2] != split:
            changes.append((i + 1, t, split))
        times.append(t)
        samples.append(sum(by_rank[r][i].get("samples", 0) for r in ranks))
    return changes, times, samples


def rate(times, samples, since):
    """Samples per second over the steps that ended after ``since`` seconds."""
    idx = [i for i, t in enumerate(times) if t > since]
    if len(idx) < 2:
        return float("nan")
    return sum(samples[i] for i in idx[1:]) / (times[idx[-1]] - times[idx[0]])


def bound(profile):
    """The ranks' summed speed over Synchronous's (every rank at the slowest's), at the profile's last
    segment: 3.25 at ``1,1,1,4``."""
    factors = parse_slowdown(profile)[-1][1]
    return sum(1 / f for f in factors) / (len(factors) / max(factors))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path, help="a bench results directory")
    args = parser.parse_args(argv)
    jobs = json.loads((args.out / "results.json").read_text())["jobs"]
    done = {(j["framework"], j["task"], j["split"], j["profile"], j["repeat"], j["strategy"]): args.out / "jobs" / j["id"]
            for j in jobs if j["status"] == "done"}
    pairs = [(key[3], path, done.get(key[:5] + ("sync",))) for key, path in done.items() if key[5] == "balanced"]
    if not pairs:
        sys.exit(f"no finished Balanced job in {args.out / 'results.json'}")
    rows: dict[str, list[tuple[float, float, int]]] = {}
    for profile, job, sync in pairs:
        if sync is None:
            print(f"{job.name}: no finished Synchronous job in its group and repeat")
            continue
        changes, times, samples = splits(job)
        last_change = parse_slowdown(profile)[-1][0]
        settled = [c for c in changes if c[1] >= last_change]
        if not settled:
            print(f"{job.name}: no change of split after the speeds changed at {last_change:g} s")
            settled = changes[-1:]
        settle_step, settle_t, _ = settled[-1]
        if len(times) - settle_step < 10:
            print(f"{job.name}: settled for {len(times) - settle_step} steps only: its rate is noise")
        _, s_times, s_samples = splits(sync)
        ratio = rate(times, samples, settle_t) / rate(s_times, s_samples, settle_t)
        whole = (sum(samples) / times[-1]) / (sum(s_samples) / s_times[-1])
        print(f"{job.name}: {len(changes) - 1} plan changes; "
              + "; ".join(f"step {s} ({t:.1f} s): {','.join(map(str, sp))}" for s, t, sp in changes))
        print(f"  settled from step {settle_step} ({settle_t:.1f} s, {len(times) - settle_step} steps to "
              f"{times[-1]:.1f} s): {ratio:.2f}x Synchronous's samples/s "
              f"(bound {bound(profile):.2f}x, share {ratio / bound(profile):.2f}); whole run {whole:.2f}x")
        rows.setdefault(profile, []).append((ratio, whole, len(changes) - 1))
    for profile, got in rows.items():
        print(f"{profile}: median over {len(got)} repeats: settled {statistics.median(r for r, _, _ in got):.2f}x "
              f"(share of the {bound(profile):.2f}x bound {statistics.median(r for r, _, _ in got) / bound(profile):.2f}), "
              f"whole run {statistics.median(w for _, w, _ in got):.2f}x, plan changes "
              f"{'/'.join(str(c) for _, _, c in got)}")


if __name__ == "__main__":
    main()
