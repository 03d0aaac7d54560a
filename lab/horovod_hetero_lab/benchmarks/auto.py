"""hh.Auto against every fixed strategy, to a converged target, on one cluster profile.

    horovod-hetero benchmark auto --profile 1,1,1,4 --slowdown padded --out DIR

Two ``horovod-hetero bench`` runs into DIR (each resumes where a finished ``results.json`` is already there):

1. ``screen/``: every fixed strategy (``--strategies``) once, until test accuracy reaches ``--target``
   (``--stop-at-target``; every strategy but Synchronous capped at ``--cap`` times Synchronous's time to it).
2. ``final/``: Auto, Synchronous and the two fixed strategies that reached the target soonest in the screening,
   ``--repeats`` times each, in one run.

``--finalists A,B`` names the final run's fixed strategies instead (those of an earlier screening of the same
profile, for example, when only Auto changed) and skips the screening.

Then the table of the final run: each strategy's median time to the target (and its range), its speed-up over
Synchronous (the median of the per-repeat ratios, as ``bench`` reports it), and the verdict the project asks of
Auto: its median time to the target within 10 % of the best fixed strategy's in the same run, and at least
Synchronous's speed (0.95x on a cluster of equal workers). ``DIR/summary.json`` holds the same.
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys

from horovod_hetero_lab.bench import read_curve, time_to_target

#: the fixed strategies screened by default (bench's names)
FIXED = ("sync", "localsgd", "esync", "wagma", "elasticbsp", "dssp", "adsp", "balanced")


def results(out):
    """The jobs of a finished bench run in ``out`` (its ``results.json``), or None."""
    path = pathlib.Path(out) / "results.json"
    if not path.exists():
        return None
    jobs = json.loads(path.read_text())["jobs"]
    return jobs if all(job["status"] in ("done", "failed") for job in jobs) else None


def bench(args, strategies, repeats, out):
    """Run ``horovod-hetero bench`` for ``strategies`` into ``out`` unless it finished there already."""
    if results(out) is not None:
        print(f"{out}: done already (remove it to run it again)", flush=True)
        return results(out)
    cmd = [sys.executable, "-m", "horovod_hetero.cli", "bench", "--np", str(args.np), "--base-step", str(args.base_step),
           "--task", args.task, "--split", "iid", "--eval-interval", str(args.eval_interval), "--profile", args.profile,
           "--slowdown", args.slowdown, "--repeat", str(repeats), "--budget", str(args.budget),
           "--target", f"{args.task}={args.target}", "--stop-at-target", "--check-interval", str(args.check_interval),
           "--cap", str(args.cap),
           "--strategies", ",".join(strategies), "--out", str(out)]
    subprocess.run(cmd, check=False)
    found = results(out)
    if found is None:
        raise SystemExit(f"the bench into {out} did not finish: see {out}/jobs/*/output.log")
    return found


def times(jobs):
    """``{strategy: [time to target or None, per repeat]}`` of a run's jobs."""
    out: dict[str, list[float | None]] = {}
    for job in jobs:
        ttt = (job.get("summary") or {}).get("time_to_target_s") if job["status"] == "done" else None
        out.setdefault(job["strategy"], []).append(ttt)
    return out


def median_time(values):
    """The median time to target, a job that missed it counting as infinite (None if most missed)."""
    spread = sorted(float("inf") if v is None else v for v in values)
    middle = statistics.median(spread) if spread else float("inf")
    return None if middle == float("inf") else middle


def speedups(jobs, name):
    """Synchronous's time over ``name``'s, per repeat where both reached the target."""
    by: dict[int, dict[str, float | None]] = {}
    for job in jobs:
        ttt = (job.get("summary") or {}).get("time_to_target_s") if job["status"] == "done" else None
        by.setdefault(job["repeat"], {})[job["strategy"]] = ttt
    pairs = [(r.get("sync"), r.get(name)) for r in by.values()]
    return [sync / other for sync, other in pairs if sync and other]


def against_best(medians):
    """The best fixed strategy of ``{strategy: median time or None}`` and its time over Auto's (None where
    either is missing).

    >>> against_best({"sync": 30.0, "auto": 12.0, "esync": 10.0, "dssp": None})
    ('esync', 0.8333333333333334)
    """
    fixed = {n: t for n, t in medians.items() if n != "auto" and t is not None}
    best = min(fixed, key=lambda n: fixed[n]) if fixed else None
    auto = medians.get("auto")
    return best, None if auto is None or best is None else fixed[best] / auto


def verdict(final, even):
    """The table's rows and the verdict on Auto (``even``: a cluster of equal workers)."""
    found = times(final)
    medians = {name: median_time(values) for name, values in found.items()}
    best, ratio = against_best(medians)
    rows = []
    for name, values in found.items():
        ups = speedups(final, name)
        done = [v for v in values if v is not None]
        rows.append({"strategy": name, "median_s": medians[name], "min_s": min(done) if done else None,
                     "max_s": max(done) if done else None, "reached": f"{len(done)}/{len(values)}",
                     "speedup": statistics.median(ups) if ups else None})
    within = ratio is not None and medians["auto"] <= 1.10 * medians[best]
    auto_up = next((r["speedup"] for r in rows if r["strategy"] == "auto"), None)
    floor = 0.95 if even else 1.0
    not_behind = auto_up is not None and auto_up >= floor
    return rows, {"best_fixed": best, "auto_vs_best": ratio,
                  "within_10_percent": within, "auto_vs_sync": auto_up, "not_behind_sync": not_behind,
                  "sync_floor": floor}


def table(rows, said):
    lines = ["| strategy | time to target s (median, min-max) | reached | speed-up over Synchronous |",
             "| --- | ---: | ---: | ---: |"]
    for r in rows:
        t = "-" if r["median_s"] is None else f"{r['median_s']:.1f} ({r['min_s']:.1f}-{r['max_s']:.1f})"
        up = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        lines.append(f"| {r['strategy']} | {t} | {r['reached']} | {up} |")
    best = said["best_fixed"]
    ratio = said["auto_vs_best"]
    lines.append("")
    lines.append(f"Auto's median time against the best fixed strategy ({best}): "
                 + ("-" if ratio is None else f"{ratio:.2f}x its speed") + f"; within 10 %: {said['within_10_percent']}")
    sync = said["auto_vs_sync"]
    lines.append(f"Auto against Synchronous: " + ("-" if sync is None else f"{sync:.2f}x")
                 + f" (at least {said['sync_floor']:.2f}x: {said['not_behind_sync']})")
    return "\n".join(lines)


def by_target(out, jobs, task, targets):
    """``{strategy: {target: median seconds or None}}``: each finished job's curve (``out/jobs/ID/curve.jsonl``)
    read for the first point at each of ``targets``, a job whose curve never reached it counting as never
    (``median_time``)."""
    found: dict[str, dict[float, list[float | None]]] = {}
    for job in jobs:
        curve = read_curve(pathlib.Path(out) / "jobs" / job["id"] / "curve.jsonl") if job["status"] == "done" else []
        for target in targets:
            found.setdefault(job["strategy"], {}).setdefault(target, []).append(time_to_target(curve, task, target))
    return {name: {t: median_time(v) for t, v in per.items()} for name, per in found.items()}


def target_table(medians, targets):
    """The markdown table of ``by_target``'s medians, and each target's Auto against the best fixed strategy.

    >>> print(target_table({"sync": {0.8: 20.0, 0.9: None}, "auto": {0.8: 10.0, 0.9: 30.0},
    ...                     "esync": {0.8: 12.0, 0.9: 27.0}}, [0.8, 0.9]))
    | strategy | to 0.8 s | to 0.9 s |
    | --- | ---: | ---: |
    | sync | 20.0 | - |
    | auto | 10.0 | 30.0 |
    | esync | 12.0 | 27.0 |
    | Auto against the best fixed | 1.20x | 0.90x |
    """
    lines = ["| strategy | " + " | ".join(f"to {t:g} s" for t in targets) + " |",
             "| --- | " + " | ".join("---:" for _ in targets) + " |"]
    for name, per in medians.items():
        lines.append(f"| {name} | " + " | ".join("-" if per[t] is None else f"{per[t]:.1f}" for t in targets) + " |")
    ratios = []
    for t in targets:
        ratio = against_best({name: per[t] for name, per in medians.items()})[1]
        ratios.append("-" if ratio is None else f"{ratio:.2f}x")
    lines.append("| Auto against the best fixed | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def equal_workers(profile):
    """Whether ``profile`` slows no worker more than another, ever (``1,1,1,1``; not ``random`` nor a schedule).

    >>> equal_workers("1,1,1,1"), equal_workers("random"), equal_workers("1,1,1,1;15:1,1,1,4"), equal_workers("1,4")
    (True, False, False, False)
    """
    try:
        factors = [float(f) for f in profile.split(",")]
    except ValueError:
        return False
    return len(set(factors)) == 1


def finalists(text):
    """``--finalists``: fixed strategies of ``FIXED`` but Synchronous (always in the final run), comma-separated.

    >>> finalists("esync,wagma")
    ['esync', 'wagma']
    >>> finalists("esync,auto")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: --finalists: fixed strategies among localsgd, esync, wagma, elasticbsp, dssp, adsp, \
balanced, comma-separated, got 'esync,auto'
    """
    names = [n for n in text.split(",") if n]
    allowed = [n for n in FIXED if n != "sync"]
    if not names or any(n not in allowed for n in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"--finalists: fixed strategies among {', '.join(allowed)}, comma-separated, "
                                         f"got {text!r}")
    return names


def lower_targets(text):
    """``--lower``: test accuracies, comma-separated, each in (0, 1); may be empty.

    >>> lower_targets("0.86,0.87"), lower_targets("")
    ([0.86, 0.87], [])
    >>> lower_targets("0.86,high")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: --lower: accuracies in (0, 1), comma-separated, got '0.86,high'
    """
    try:
        values = [float(t) for t in text.split(",") if t]
    except ValueError:
        values = None
    if values is None or any(not 0.0 < v < 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"--lower: accuracies in (0, 1), comma-separated, got {text!r}")
    return values


def main(argv=None):
    parser = argparse.ArgumentParser(prog="horovod-hetero benchmark auto", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="bench's --profile (1,1,1,4; random; 1,1,1,1;15:1,1,1,4)")
    parser.add_argument("--slowdown", default="padded", choices=["padded", "padded-linear", "proportional"])
    parser.add_argument("--out", required=True, type=pathlib.Path, help="results directory (resumed)")
    parser.add_argument("--task", default="fashion-cnn")
    parser.add_argument("--target", type=float, default=0.89)
    parser.add_argument("--strategies", default=None, help=f"the fixed strategies screened (default {','.join(FIXED)})")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the final run")
    parser.add_argument("--screen-repeats", type=int, default=None, help="repeats of the screening (default 1)")
    parser.add_argument("--finalists", default=None, type=finalists,
                        help="the final run's fixed strategies (comma-separated), instead of a screening")
    parser.add_argument("--budget", type=float, default=1200.0, help="seconds a job may train at most")
    parser.add_argument("--cap", type=float, default=3.0, help="a strategy's budget: at most CAP x Synchronous's time")
    parser.add_argument("--eval-interval", type=float, default=1.0,
                        help="seconds between two snapshots of rank 0's curve: the times' resolution")
    parser.add_argument("--check-interval", type=float, default=5.0,
                        help="seconds between two checks of the target during training (every rank waits)")
    parser.add_argument("--lower", default="0.86,0.87,0.88", type=lower_targets,
                        help="lower targets whose medians are also printed (comma-separated, may be empty)")
    parser.add_argument("--base-step", type=float, default=0.05)
    parser.add_argument("--np", type=int, default=4)
    args = parser.parse_args(argv)
    if args.finalists is not None and (args.strategies is not None or args.screen_repeats is not None):
        parser.error("--finalists skips the screening: --strategies and --screen-repeats cannot go with it")
    if args.finalists is not None:
        medians, chosen = None, args.finalists
        print(f"no screening (--finalists); the final run: auto, sync, {', '.join(chosen)}", flush=True)
    else:
        screened = [s for s in (args.strategies or ",".join(FIXED)).split(",") if s]
        if "sync" not in screened:
            screened.insert(0, "sync")
        screen = bench(args, screened, args.screen_repeats or 1, args.out / "screen")
        medians = {n: median_time(v) for n, v in times(screen).items() if n != "sync"}
        reached = {n: t for n, t in medians.items() if t is not None}
        ranked = sorted(reached, key=lambda n: reached[n])
        chosen = ranked[:2] if ranked else []
        print(f"screening: {', '.join(f'{n} {reached[n]:.1f} s' for n in ranked) or 'none reached the target'}; "
              f"the final run: auto, sync, {', '.join(chosen)}", flush=True)
    final = bench(args, ["sync", "auto", *chosen], args.repeats, args.out / "final")
    even = equal_workers(args.profile)
    rows, said = verdict(final, even)
    text = table(rows, said)
    print(text)
    targets = [*args.lower, args.target]
    lower = by_target(args.out / "final", final, args.task, targets)
    print("\nMedian seconds to each target, on the same curves:\n" + target_table(lower, targets))
    (args.out / "summary.json").write_text(json.dumps({"profile": args.profile, "slowdown": args.slowdown,
                                                       "screening": medians, "final": rows, **said,
                                                       "by_target": {n: {str(t): v for t, v in per.items()}
                                                                     for n, per in lower.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
