"""The ``horovod-hetero`` command: ``bench`` and ``report`` (time to accuracy, measured and drawn), ``demo``
(a preset of ``bench``), ``simulate``, ``advise`` (strategies ranked from a run's telemetry), ``plan`` and
``telemetry``."""
import dataclasses
import pathlib
import signal
import sys
import tempfile

import click

from horovod_hetero import bench
from horovod_hetero.data import TASKS, check_available, task_data
from horovod_hetero.runtime.straggler import parse_slowdown
from horovod_hetero.runtime.telemetry import format_summary, load, summarize
from horovod_hetero.strategies.registry import REGISTRY, build, check_names

#: demo rows: name -> (row label, framework, strategy); the strategies are bench's
DEMO_STRATEGIES = {**{name: (label, "torch", name) for name, (label, _) in bench.STRATEGIES.items()},
                   "keras-esync": ("ESync, Keras 3", "keras", "esync")}
#: the demo's rows unless --strategies says otherwise: Balanced sizes batches to speed, and the demo's padded
#: steps take the same time whatever their batch (bench --slowdown proportional measures it)
DEMO_DEFAULT = [name for name in DEMO_STRATEGIES if name != "balanced"]


@click.group()
@click.version_option(package_name="horovod-hetero")
def cli():
    """Heterogeneity-aware synchronisation for Horovod."""


def csv(text, name):
    items = [v.strip() for v in str(text).split(",") if v.strip()]
    if not items:
        raise click.BadParameter("give a comma-separated list", param_hint=name)
    return items


def run_plan(out, jobs, settings):
    """Write the plan, run it with a progress bar per job; returns the results (see ``bench.run_bench``)."""
    try:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        raise click.ClickException("bench and demo show their progress with rich: pip install "
                                   "'horovod-hetero[bench]'") from None

    try:
        bench.horovodrun(settings["np"])
        results = bench.new_results(out, jobs, settings, ["horovod-hetero", *sys.argv[1:]])
    except (ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None
    console = Console(soft_wrap=True)          # one line per finished job, never wrapped
    previous = signal.signal(signal.SIGTERM, _interrupt)     # kill PID: as Ctrl-C (SIGINT, ignored in background)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                      transient=True) as progress:
            echo = lambda line: progress.console.print(line, markup=False, highlight=False)    # noqa: E731 ("[normalized]")
            return bench.run_bench(out, results, echo, progress)
    except KeyboardInterrupt:
        raise click.ClickException(f"interrupted; {out} holds what finished (horovod-hetero report {out})")
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@cli.command("bench")
@click.option("--strategies", default=",".join(bench.STRATEGIES), show_default=True,
              help="comma list; Synchronous runs first in every group")
@click.option("--task", "tasks", default="digits", show_default=True,
              help=f"comma list of {', '.join(TASKS)}")
@click.option("--split", "splits", default=None,
              help="comma list of iid, skew (class-skewed), dirichlet:ALPHA, plays (text); default: each task's own")
@click.option("--aggregate", "aggregates", default="mean", show_default=True,
              help=f"comma list of {', '.join(bench.AGGREGATES)}: how the model-averaging strategies' rounds combine "
                   f"models (each runs once per aggregation)")
@click.option("--outer", default=f"{bench.OUTER[0]:g},{bench.OUTER[1]:g}", show_default=True,
              help="LR,MOMENTUM of the +nesterov aggregations' OuterSGD")
@click.option("--profile", "profiles", multiple=True, default=["1,1,1,4"], show_default=True,
              help="slowdown per worker (1,1,1,4), changing over time (1,1,1,1;10:1,1,1,4), or random "
                   "(2 random workers delayed 3 base steps each step; random:COUNT:SECONDS); repeat the option for several")
@click.option("--np", "num_proc", default=4, show_default=True, help="number of workers")
@click.option("--framework", "frameworks", default="torch", show_default=True, help="torch, keras or torch,keras")
@click.option("--hosts", default=None, help="horovodrun -H (default localhost:NP)")
@click.option("--repeat", default=1, show_default=True, help="repetitions of every job")
@click.option("--budget", default=10.0, show_default=True, help="seconds of training per job")
@click.option("--base-step", default=0.025, show_default=True, help="seconds of a factor-1 step (padded)")
@click.option("--slowdown", "slowdown_mode", type=click.Choice(bench.SLOWDOWNS), default="padded", show_default=True,
              help="padded: a factor-f step is padded to f x --base-step (steady; time does not grow with the batch); "
                   "padded-linear: a factor-f step of b samples is padded to f x --base-step x b / 32 "
                   "(32: every worker's even batch; steady, and time grows with the batch); "
                   "proportional: it sleeps (f - 1) x its measured compute (a slow worker's time grows with its "
                   "batch, as Balanced needs)")
@click.option("--target", "targets", multiple=True,
              help="TASK=VALUE, the quality to reach, or TASK=sync: what Synchronous reaches in its budget "
                   "(default: the task's; sync for fashion-cnn and shakespeare-char)")
@click.option("--eval-interval", default=0.5, show_default=True, help="seconds at least between two evaluations")
@click.option("--stop-at-target", is_flag=True,
              help="end each job once rank 0's curve reaches the target (a number: --target TASK=VALUE); "
                   "its evaluations then run during training, their time left out of the curve's clock")
@click.option("--cap", type=float, default=None,
              help="each strategy's budget: at most CAP x the time Synchronous took to the target in the same "
                   "group and repeat (--budget where it missed)")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="results directory (new or empty)")
def bench_command(strategies, tasks, splits, aggregates, outer, profiles, num_proc, frameworks, hosts, repeat, budget,
                  base_step, slowdown_mode, targets, eval_interval, stop_at_target, cap, out):
    """Time to a target accuracy of each strategy, under horovodrun with simulated stragglers."""
    try:
        parsed = {}
        for t in targets:
            name, eq, value = t.partition("=")
            if not eq or name not in TASKS:
                raise ValueError(f"--target must be TASK=VALUE with TASK one of {', '.join(TASKS)}, got {t!r}")
            try:
                parsed[name] = "sync" if value == "sync" else float(value)
            except ValueError:
                raise ValueError(f"--target {t!r}: VALUE must be a number or sync") from None
        try:
            outer_lr, outer_momentum = (float(v) for v in outer.split(","))
        except ValueError:
            raise ValueError(f"--outer must be LR,MOMENTUM, e.g. 0.7,0.5, got {outer!r}") from None
        settings = bench.settings_of(num_proc, base_step, budget, parsed, eval_interval, hosts=hosts,
                                     outer=(outer_lr, outer_momentum), slowdown=slowdown_mode,
                                     stop_at_target=stop_at_target, cap=cap)
        for prof in profiles:
            bench.parse_profile(prof, num_proc, base_step)
        jobs = bench.plan(csv(frameworks, "--framework"), csv(tasks, "--task"), list(profiles),
                          csv(strategies, "--strategies"), repeat, None if splits is None else csv(splits, "--split"),
                          csv(aggregates, "--aggregate"))
        bench.check_stop(settings, jobs)
        for task, split in dict.fromkeys((j.task, j.split) for j in jobs):
            check_available(task)
            if split != "iid":
                task_data(task, 0, num_proc, split=split)   # a split that cannot shard NP workers fails here
    except (TypeError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    click.echo(f"horovod-hetero bench: {len(jobs)} jobs of {budget:g} s, {num_proc} workers -> {out}")
    results = run_plan(out, jobs, settings)
    done = sum(e["status"] == "done" for e in results["jobs"])
    click.echo(f"{done}/{len(jobs)} jobs done; horovod-hetero report {out}")


@cli.command("report")
@click.argument("directory", type=click.Path())
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="also write one self-contained HTML page here")
@click.option("--png-dir", type=click.Path(file_okay=False), default=None, help="where the PNGs go (default: DIRECTORY)")
@click.option("--prefix", default="bench-", show_default=True, help="PNG file name prefix")
def report_command(directory, html_path, png_dir, prefix):
    """Tables (Markdown) and plots of a bench results directory."""
    from horovod_hetero import report

    try:
        results = report.load_results(directory)
    except report.ReportError as e:
        raise click.ClickException(str(e)) from None
    table = report.markdown(results, report.load_curves(directory, results))
    click.echo(table)
    try:
        pngs = report.plots(directory, results, png_dir, prefix)
    except report.ReportError as e:
        raise click.ClickException(str(e)) from None
    for p in pngs:
        click.echo(f"plot: {p}")
    if html_path:
        pathlib.Path(html_path).write_text(report.html_page(results, table, pngs))
        click.echo(f"page: {html_path}")


@cli.command()
@click.option("--np", "num_proc", default=4, show_default=True, help="number of workers")
@click.option("--slowdown", default="1,1,1,4", show_default=True,
              help="per-rank slowdown factors; changing over time: 1,1,1,1;15:1,1,1,4 (from 15 s on)")
@click.option("--base-step", default=0.1, show_default=True,
              help="seconds one step takes on a factor-1 worker (steps are padded to factor x this)")
@click.option("--budget", default=25.0, show_default=True, help="wall-clock seconds of training per strategy")
@click.option("--keep", type=click.Path(file_okay=False), default=None, help="keep the results in this (new) folder")
@click.option("--strategies", default=",".join(DEMO_DEFAULT), show_default=True,
              help=f"comma list of {', '.join(DEMO_STRATEGIES)} (the first is the baseline)")
def demo(num_proc, slowdown, base_step, budget, keep, strategies):
    """Compare strategies on this machine: digits MLP, simulated stragglers, fixed time budget
    (a preset of ``bench``: one repeat, the rows in the order given)."""
    chosen = csv(strategies, "--strategies")
    unknown = [name for name in chosen if name not in DEMO_STRATEGIES]
    if unknown:
        raise click.UsageError(f"--strategies: unknown {', '.join(unknown)}; choose from {', '.join(DEMO_STRATEGIES)}")
    try:
        factors = parse_slowdown(slowdown, name="--slowdown")[0][1]   # the fast workers: the smallest first factor
        settings = bench.settings_of(num_proc, base_step, budget)
        bench.parse_profile(slowdown, num_proc, base_step)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    jobs = [bench.plan([DEMO_STRATEGIES[k][1]], ["digits"], [slowdown], [DEMO_STRATEGIES[k][2]], 1)[0] for k in chosen]
    jobs = [dataclasses.replace(j, label=DEMO_STRATEGIES[k][0]) for j, k in zip(jobs, chosen)]
    root = pathlib.Path(keep or tempfile.mkdtemp(prefix="horovod-hetero-demo-"))
    click.echo(f"horovod-hetero demo: {num_proc} workers, slowdown {slowdown} (base step {base_step * 1000:g} ms), "
               f"digits MLP, {budget:g} s of training per strategy")
    results = run_plan(root, jobs, settings)
    failed = [job["id"] for job in results["jobs"] if job["status"] != "done"]
    if failed:
        raise click.ClickException(f"{', '.join(failed)} failed: see {root}/jobs/*/output.log")
    rows = []
    for job in results["jobs"]:
        s = job["summary"]
        fast = [r for w, r in enumerate(s["compute_ratio"] or []) if factors[w] == min(factors)]
        rows.append((job["label"], s["samples_per_s"], s["final"], sum(fast) / len(fast) if fast else None,
                     s["median_rtt_s"]))
    base = rows[0][1]
    click.echo("")
    click.echo(f"{'strategy':<14} {'samples/s':>10} {'vs sync':>8} {'test acc':>9} "
               f"{'fast workers compute ratio':>29} {'state server RTT':>17}")
    for label, sps, acc, ratio, rtt in rows:
        rtt_text = f"{rtt * 1000:.2f} ms" if rtt is not None else "-"
        ratio_text = f"{ratio:.2f}" if ratio is not None else "-"
        click.echo(f"{label:<14} {sps:>10.0f} {sps / base:>7.2f}x {acc:>9.3f} {ratio_text:>29} {rtt_text:>17}")
    click.echo(f"\nresults: {root} (horovod-hetero report {root}; horovod-hetero telemetry {root}/jobs/ID/telemetry)")


def parse_speeds(text):
    """``"1,1,1,4"`` or ``"1.0x4,3.2x4"`` (value x count) into a list of step times."""
    out = []
    for part in text.split(","):
        value, _, count = part.strip().partition("x")
        try:
            out += [float(value)] * (int(count) if count else 1)
        except ValueError:
            raise click.BadParameter(f"{part!r}: use numbers, optionally with xCOUNT (e.g. 1.0x4,3.2x4)") from None
    return out


def parse_floats(text, name):
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"{name} must be comma-separated numbers, got {text!r}") from None


@cli.command()
@click.option("--speeds", required=True,
              help="seconds per step of each worker: 1,1,1,4 or 1.0x4,3.2x4 (value x count)")
@click.option("--strategy", "strategies", default="all", show_default=True,
              help=f"all, or a comma list of {', '.join(REGISTRY)}")
@click.option("--duration", default=300.0, show_default=True, help="simulated seconds")
@click.option("--jitter", default=0.0, show_default=True, help="relative std of each step's time")
@click.option("--change-at", type=float, default=None, help="time at which step times change")
@click.option("--change-factors", default=None, help="per-worker factors applied from --change-at on")
@click.option("--model-mb", default=4.0, show_default=True, help="model size in MB")
@click.option("--bandwidth-gbps", default=10.0, show_default=True, help="link bandwidth, Gbit/s")
@click.option("--latency-us", default=50.0, show_default=True, help="per-message latency, microseconds")
@click.option("--batch", default=32, show_default=True, help="samples per step")
@click.option("--batch-share", default=1.0, show_default=True,
              help="Balanced: the share of a step's time that grows with its batch (0: none, as padded steps)")
@click.option("--period", default=8, show_default=True, help="LocalSGD period")
@click.option("-R", "lookahead", default=15, show_default=True, help="ElasticBSP lookahead R")
@click.option("--s-lower", default=3, show_default=True, help="DSSP lower staleness bound")
@click.option("--s-upper", default=15, show_default=True, help="DSSP upper staleness bound")
@click.option("--group-size", type=int, default=None, help="WAGMA group size (default: nearest sqrt(P))")
@click.option("--wagma-period", default=10, show_default=True, help="WAGMA global averaging period")
@click.option("--check-period", default="10steps", show_default=True,
              help="ADSP check period: steps of the slowest worker (10steps) or seconds (4s)")
@click.option("--rebalance-every", default=20, show_default=True,
              help="Balanced: steps between batch plans (its global batch: --batch x the workers)")
@click.option("--seed", default=0, show_default=True)
@click.option("--per-worker", is_flag=True, help="also print every worker's steps and compute ratio")
@click.option("--png", type=click.Path(dir_okay=False), default=None, help="write a bar chart here")
def simulate(speeds, strategies, duration, jitter, change_at, change_factors, model_mb, bandwidth_gbps,
             latency_us, batch, batch_share, period, lookahead, s_lower, s_upper, group_size, wagma_period, check_period,
             rebalance_every, seed, per_worker, png):
    """Simulate the strategies on a cluster of workers with the given speeds.

    The strategies are the library's own objects (one per simulated worker), on a virtual clock."""
    from horovod_hetero import simulate as sim

    step_times = parse_speeds(speeds)
    options = dict(period=period, sync_period=wagma_period, lookahead=lookahead, staleness=(s_lower, s_upper),
                   group_size=group_size, check_period=check_period, rebalance_every=rebalance_every,
                   global_batch=batch * len(step_times))
    names = chosen(strategies, REGISTRY)
    try:
        cluster = sim.Cluster(step_times, jitter=jitter, change_at=change_at,
                              change_factors=parse_floats(change_factors, "--change-factors") if change_factors else None,
                              model_bytes=model_mb * 1e6, latency_s=latency_us * 1e-6,
                              bandwidth=bandwidth_gbps * 1.25e8, samples_per_step=batch, seed=seed,
                              batch_share=batch_share)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"{cluster.n} workers, {duration:g} simulated s, model {model_mb:g} MB, "
               f"{bandwidth_gbps:g} Gbit/s, jitter {jitter:g}")
    results = []
    for name in names:
        try:
            strategy = build(name, **options)
        except (TypeError, ValueError) as e:
            raise click.BadParameter(str(e), param_hint=f"the {name} options") from None
        try:
            results += sim.compare(cluster, [strategy], duration)
        except ValueError as e:
            click.echo(f"{sim.label(strategy)}: skipped ({e})")
    if not results:
        raise click.ClickException("no strategy could be simulated")
    click.echo(sim.format_table(results))
    if per_worker:
        for r in results:
            click.echo(f"{r.strategy}: steps {r.steps.tolist()} compute ratio "
                       f"{[round(float(x), 2) for x in r.compute_ratio]}")
    if png:
        plot_results(results, png)
        click.echo(f"chart: {png}")


#: what ``plan`` prints: the strategies whose rounds' local steps differ per worker by their own plan
#: (ElasticBSP and DSSP from the measured step times, ADSP per commit)
PLANS = ["elasticbsp", "dssp", "adsp"]


def chosen(strategies, registered=REGISTRY):
    """The names ``--strategy`` gives (``all``, or a comma list of ``registered``)."""
    names = list(registered) if strategies == "all" else [n.strip() for n in strategies.split(",")]
    try:
        return check_names(names, registered, also=["all"])
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--strategy") from None


@cli.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--strategy", "strategies", default="all", show_default=True,
              help=f"all, or a comma list of {', '.join(REGISTRY)}")
@click.option("--duration", type=float, default=None,
              help="simulated seconds (default: 300 steps of the slowest rank)")
def advise(directory, strategies, duration):
    """Rank the strategies for the cluster a run's telemetry shows.

    DIRECTORY holds rank<r>.jsonl files (telemetry=DIR in a run with any strategy, e.g.
    Synchronous; or a bench job's directory). The ranks' measured step times, how they vary and what a
    synchronising collective cost go into the simulator, which runs every strategy as bench configures
    it (``bench.STRATEGIES``: LocalSGD(8), WAGMA every 8, ElasticBSP(15), DSSP(3,15), ADSP(10steps), Balanced(5))."""
    from horovod_hetero import advise as adv

    path = pathlib.Path(directory)
    if not list(path.glob("rank*.jsonl")) and (path / "telemetry").is_dir():
        path = path / "telemetry"
    by_rank = load(path)
    if not by_rank:
        raise click.ClickException(f"no rank*.jsonl files in {directory} (run with telemetry=DIR)")
    try:
        measured = adv.measure(by_rank)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    names = chosen(strategies)
    try:
        results = adv.predict(measured, {n: bench.strategy_object(n) for n in names}, duration)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(adv.format_advice(measured, results))


def plot_results(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.strategy for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.bar(names, [r.samples_per_s for r in results], color="tab:blue")
    a.set_ylabel("samples/s")
    a.set_title("throughput")
    x = range(len(results))
    b.bar([i - 0.2 for i in x], [r.compute_ratio.mean() for r in results], 0.4, label="mean")
    b.bar([i + 0.2 for i in x], [r.compute_ratio.min() for r in results], 0.4, label="lowest worker")
    b.set_xticks(list(x), names)
    b.set_ylim(0, 1.05)
    b.set_ylabel("compute-time ratio")
    b.set_title("compute / wall")
    b.legend(loc="upper left", fontsize="small")
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


@cli.command()
@click.option("--step-times", required=True, help="seconds per step of each worker: 0.1,0.1,0.1,0.4 or 0.1x3,0.4")
@click.option("--strategy", "strategies", default="elasticbsp,dssp", show_default=True,
              help=f"comma list of {', '.join(PLANS)}")
@click.option("-R", "lookahead", default=15, show_default=True, help="ElasticBSP lookahead R")
@click.option("--s-lower", default=3, show_default=True, help="DSSP lower staleness bound")
@click.option("--s-upper", default=15, show_default=True, help="DSSP upper staleness bound")
@click.option("--check-period", default="10steps", show_default=True,
              help="ADSP check period: steps of the slowest worker (10steps) or seconds (4s)")
def plan(step_times, strategies, lookahead, s_lower, s_upper, check_period):
    """Print the local steps each worker runs before the next round, as the strategy objects plan
    them after a round that measured these step times (ElasticBSP, DSSP), or as they run them per
    commit at the search's first rate (ADSP, on the simulator's virtual clock)."""
    names = chosen(strategies, PLANS)
    step_s = parse_speeds(step_times)
    if not all(0 < s < float("inf") for s in step_s):
        raise click.BadParameter("step times must be finite seconds > 0", param_hint="--step-times")
    try:
        objects = [build(n, lookahead=lookahead, staleness=(s_lower, s_upper), check_period=check_period)
                   for n in names]
        plans = [s.plan_steps(step_s) if hasattr(s, "plan_steps") else steady_round(s, step_s) for s in objects]
    except (TypeError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"{'worker':>6} {'step s':>8} " + " ".join(f"{s.label:>16}" for s in objects))
    for p, seconds in enumerate(step_s):
        click.echo(f"{p:>6} {seconds:>8g} " + " ".join(f"{steps[p]:>16}" for steps in plans))
    for strategy, steps in zip(objects, plans):
        ends = [k * t for k, t in zip(steps, step_s)]
        click.echo(f"{strategy.label}: barrier at {max(ends):g} s, longest wait {max(ends) - min(ends):g} s")


def steady_round(strategy, step_s, rounds=4):
    """Each worker's local steps in round ``rounds`` of ``strategy`` simulated at these step times
    (no jitter): a strategy that decides step by step, on its own clock (ADSP), instead of planning."""
    from horovod_hetero import simulate as sim

    cluster = sim.Cluster(step_s)
    duration, result = max(step_s), None
    while result is None or len(result.round_steps) < rounds:
        duration *= 2                                     # long enough for that many rounds
        result = sim.simulate(cluster, strategy, duration)
    return [int(k) for k in result.round_steps[rounds - 1]]


@cli.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
def telemetry(directory):
    """Summarise a telemetry directory (one rank<r>.jsonl per worker)."""
    by_rank = load(directory)
    if not by_rank:
        raise click.ClickException(f"no rank*.jsonl files in {directory}")
    click.echo(format_summary(summarize(by_rank)))


def main():
    cli()


if __name__ == "__main__":
    main()
