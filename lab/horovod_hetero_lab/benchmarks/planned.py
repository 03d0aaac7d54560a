"""ElasticBSP, DSSP and ADSP beside Synchronous and ESync, same run: the figures of their issues.

    horovod-hetero benchmark planned [--slowdown 1,1,1,4] [--strategies ...]    (make bench-planned)

Runs ``horovod-hetero demo`` (every row in one run, 4 workers, 100 ms factor-1 steps) and reads
each strategy's telemetry:

- wait per round: in every round each rank's time in it minus the least of any rank's (the last to
  arrive waits for nobody), averaged over rounds and the fastest ranks, and as a share of the
  slowest rank's mean step; "all" averages over every rank;
- ADSP's search: every finished trial rank 0's telemetry recorded (``--plans``);
- planning: the strategy's bookkeeping after rounds (ZipLine or the controller; ``plan_s``) as a
  share of the wall time;
- plans: each distinct plan, from which round and second it holds, and the speeds that round
  carried (to show a plan following a change of speed);
- the simulator's prediction: ``simulate`` on the speeds measured in the run (each rank's mean
  step after its first) and the round cost measured in it, against the samples/s measured after start-up (from
  the end of the first step, whose collective waits for every process to start, to the last step).
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
from typing import Callable

import numpy as np

from horovod_hetero import strategies as lib
from horovod_hetero.runtime.telemetry import load
from horovod_hetero.simulate import Cluster, simulate
from horovod_hetero_lab.commands import DEMO_STRATEGIES

SIMULATED: dict[str, Callable[[], lib.Strategy]] = {
    "sync": lib.Synchronous, "esync": lib.ESync, "localsgd": lambda: lib.LocalSGD(8),
    "elasticbsp": lambda: lib.ElasticBSP(15), "dssp": lambda: lib.DSSP((3, 15)), "adsp": lambda: lib.ADSP("10steps")}


def analyse(key, out, batch):
    by_rank = load(str(out / "telemetry"))
    result = json.loads((out / "result.json").read_text())
    ranks = sorted(by_rank, key=int)
    # each rank's speed: its mean step after the first (which holds start-up, not speed)
    mean_step = np.array([statistics.fmean(r["compute_s"] for r in by_rank[k][1:]) for k in ranks])
    fast = [i for i, s in enumerate(mean_step) if s <= mean_step.min() * 1.2]
    rounds: dict[int, dict[int, float]] = {}           # round -> {rank: seconds in it}
    plans: list[tuple[int, float, object, list[float]]] = []
    searches: list[tuple[int, float, dict]] = []
    plan_s = 0.0
    start = min(r["time"] for k in ranks for r in by_rank[k])
    for i, k in enumerate(ranks):
        for r in by_rank[k]:
            if "round" in r:
                rounds.setdefault(r["round"], {})[i] = r["comm_s"]
                plan_s += r.get("plan_s", 0.0) if i == 0 else 0.0
                if i == 0 and "search" in r:
                    searches.append((r["round"], r["time"] - start, r["search"]))
                if i == 0 and "plan" in r and (not plans or plans[-1][2] != r["plan"]):
                    plans.append((r["round"], r["time"] - start, r["plan"], r["ranks"]["step_s"]))
    full = [v for v in rounds.values() if len(v) == len(ranks)][1:]      # the first: start-up
    waits = [v[i] - min(v.values()) for v in full for i in fast]
    waits_all = [v[i] - min(v.values()) for v in full for i in v]
    if full:
        cost = statistics.median(min(v.values()) for v in full)
    else:                                           # Synchronous: the gradient allreduce of every step
        cost = statistics.median(r["comm_s"] for r in by_rank[ranks[int(np.argmax(mean_step))]][1:])
    began = max(by_rank[k][0]["time"] for k in ranks)
    ended = max(r["time"] for k in ranks for r in by_rank[k])
    steady = sum(r.get("samples", batch) for k in ranks for r in by_rank[k] if r["time"] > began) / (ended - began)
    cluster = Cluster(list(mean_step), model_bytes=0.0, latency_s=cost / (2 * (len(ranks) - 1)),
                      samples_per_step=batch)
    predicted = simulate(cluster, SIMULATED[key](), duration=ended - began).samples_per_s \
        if key in SIMULATED else float("nan")
    return {"samples_per_s": result["samples_per_s"], "accuracy": result["accuracy"],
            "wall_s": result["wall_s"], "wait_s": statistics.fmean(waits) if waits else float("nan"),
            "wait_all_s": statistics.fmean(waits_all) if waits_all else float("nan"), "searches": searches,
            "slowest_step_s": float(mean_step.max()), "plan_share": plan_s / result["wall_s"],
            "steady": steady, "predicted": predicted, "plans": plans, "rounds": len(rounds)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slowdown", default="1,1,1,4")
    p.add_argument("--strategies", default="sync,esync,elasticbsp,dssp")
    p.add_argument("--budget", type=float, default=25.0)
    p.add_argument("--random-delay", default=None, help="COUNT:SECONDS transient stragglers")
    p.add_argument("--keep", default=None, help="keep the runs' telemetry here")
    p.add_argument("--plans", action="store_true", help="print every plan change")
    args = p.parse_args(argv)
    root = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="bench-planned-"))
    env = dict(os.environ, HOROVOD_HETERO_RANDOM_DELAY=args.random_delay) if args.random_delay else None
    subprocess.run([sys.executable, "-m", "horovod_hetero.cli", "demo", "--strategies", args.strategies,
                    "--slowdown", args.slowdown, "--budget", str(args.budget), "--keep", str(root)],
                   check=True, env=env)
    keys = [k.strip() for k in args.strategies.split(",")]
    jobs = {j["label"]: root / "jobs" / j["id"] for j in json.loads((root / "results.json").read_text())["jobs"]}
    rows = {k: analyse(k, jobs[DEMO_STRATEGIES[k][0]], batch=32) for k in keys}
    base = rows[keys[0]]["samples_per_s"]
    esync = rows.get("esync", {}).get("samples_per_s")
    print(f"\nslowdown {args.slowdown}" + (f", random delay {args.random_delay}" if args.random_delay else ""))
    print(f"{'strategy':<16} {'samples/s':>9} {'vs first':>8} {'vs ESync':>8} {'acc':>6} {'rounds':>6} "
          f"{'wait/round':>10} {'of slowest step':>15} {'all ranks':>9} {'planning':>9} {'steady':>7} {'simulated':>9} "
          f"{'sim/steady':>10}")
    for k in keys:
        r = rows[k]
        print(f"{DEMO_STRATEGIES[k][0]:<16} {r['samples_per_s']:>9.0f} {r['samples_per_s'] / base:>7.2f}x "
              f"{(r['samples_per_s'] / esync if esync else float('nan')):>7.2f}x {r['accuracy']:>6.3f} "
              f"{r['rounds']:>6} {r['wait_s'] * 1000:>8.1f}ms {r['wait_s'] / r['slowest_step_s']:>15.1%} "
              f"{r['wait_all_s'] * 1000:>7.1f}ms "
              f"{r['plan_share']:>9.3%} {r['steady']:>7.0f} {r['predicted']:>9.0f} {r['predicted'] / r['steady']:>9.2f}x")
    for k in keys:
        for rnd, t, s in rows[k]["searches"]:
            fitted = (f"a1 {s['a1']:.4g} a2 {s['a2']:.4g} a3 {s['a3']:.4g} reward {s['reward']:.4g}"
                      + (f" (best {s['best_reward']:.4g})" if "best_reward" in s else "")) if "reward" in s else "too few losses"
            print(f"{DEMO_STRATEGIES[k][0]} search, round {rnd:>4} at {t:6.1f} s: rate {s['candidate']} {fitted} "
                  f"-> rate {s['rate']}{'' if s['searching'] else ' (settled)'}")
    for k in keys:
        if rows[k]["plans"] and (args.plans or len(rows[k]["plans"]) <= 12):
            print(f"\n{DEMO_STRATEGIES[k][0]}: plan changes (round, second, plan, speeds the round carried)")
            for rnd, t, plan, step_s in rows[k]["plans"]:
                print(f"  round {rnd:>4} at {t:6.1f} s: {plan}  step_s {[round(s, 3) for s in step_s if s]}")


if __name__ == "__main__":
    main()
