"""``horovod-hetero bench``, ``report``, ``demo`` and ``benchmark``: time to accuracy, measured and drawn, the
demo (a preset of ``bench``) and the lab's other benchmarks (``benchmarks``). ``horovod-hetero`` adds them
through this package's ``horovod_hetero.commands`` entry points (lab/pyproject.toml)."""
import dataclasses
import pathlib
import signal
import sys
import tempfile

import click

from horovod_hetero.runtime.straggler import parse_slowdown
import horovod_hetero_lab
from horovod_hetero_lab import bench, benchmarks
from horovod_hetero_lab.data import TASKS, check_available, task_data

#: demo rows: name -> (row label, framework, strategy); the strategies are bench's. Each row's "vs sync" is
#: against the Synchronous row of its own framework (the first of that framework when it has none)
DEMO_STRATEGIES = {**{name: (label, "torch", name) for name, (label, _) in bench.STRATEGIES.items()},
                   "keras-sync": ("Sync, Keras 3", "keras", "sync"),
                   "keras-esync": ("ESync, Keras 3", "keras", "esync")}
#: the demo's rows unless --strategies says otherwise: Balanced sizes batches to speed, and the demo's padded
#: steps take the same time whatever their batch (bench --slowdown proportional measures it)
DEMO_DEFAULT = [name for name in DEMO_STRATEGIES if name != "balanced"]


def csv(text, name):
    items = [v.strip() for v in str(text).split(",") if v.strip()]
    if not items:
        raise click.BadParameter("give a comma-separated list", param_hint=name)
    return items


def run_plan(out, jobs, settings):
    """Write the plan, run it with a progress bar per job; returns the results (see ``bench.run_bench``)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    try:
        bench.horovodrun(settings["np"])
        for framework in dict.fromkeys(job.framework for job in jobs):
            horovod_hetero_lab.example(bench.SCRIPTS[framework])       # the checkout's scripts the jobs run
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


@click.command("bench")
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
@click.option("--eval-interval", default=0.5, show_default=True,
              help="seconds at least between two snapshots of rank 0's curve (each evaluated after training)")
@click.option("--stop-at-target", is_flag=True,
              help="end each job once rank 0's curve reaches the target (a number: --target TASK=VALUE); "
                   "snapshots are then checked during training, every rank waiting and the checks' time left "
                   "out of the curve's clock")
@click.option("--check-interval", type=float, default=None,
              help="with --stop-at-target: seconds at least between two checks during training "
                   "(default: every snapshot)")
@click.option("--cap", type=float, default=None,
              help="each strategy's budget: at most CAP x the time Synchronous took to the target in the same "
                   "group and repeat (--budget where it missed)")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="results directory (new or empty)")
def bench_command(strategies, tasks, splits, aggregates, outer, profiles, num_proc, frameworks, hosts, repeat, budget,
                  base_step, slowdown_mode, targets, eval_interval, stop_at_target, check_interval, cap, out):
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
                                     stop_at_target=stop_at_target, cap=cap, check_interval=check_interval)
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


@click.command("report")
@click.argument("directory", type=click.Path())
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="also write one self-contained HTML page here")
@click.option("--png-dir", type=click.Path(file_okay=False), default=None, help="where the PNGs go (default: DIRECTORY)")
@click.option("--prefix", default="bench-", show_default=True, help="PNG file name prefix")
def report_command(directory, html_path, png_dir, prefix):
    """Tables (Markdown) and plots of a bench results directory."""
    from horovod_hetero_lab import report

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


@click.command()
@click.option("--np", "num_proc", default=4, show_default=True, help="number of workers")
@click.option("--slowdown", default="1,1,1,4", show_default=True,
              help="per-rank slowdown factors; changing over time: 1,1,1,1;15:1,1,1,4 (from 15 s on)")
@click.option("--base-step", default=0.1, show_default=True,
              help="seconds one step takes on a factor-1 worker (steps are padded to factor x this)")
@click.option("--budget", default=25.0, show_default=True, help="wall-clock seconds of training per strategy")
@click.option("--keep", type=click.Path(file_okay=False), default=None, help="keep the results in this (new) folder")
@click.option("--strategies", default=",".join(DEMO_DEFAULT), show_default=True,
              help=f"comma list of {', '.join(DEMO_STRATEGIES)} (each framework's baseline: its Synchronous row, "
                   f"else its first)")
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
        rows.append((job["label"], job["framework"], job["strategy"], s["samples_per_s"], s["final"],
                     sum(fast) / len(fast) if fast else None, s["median_rtt_s"]))
    base: dict[str, float] = {}                    # each framework's baseline: its Synchronous row, else its first
    for _, framework, strategy, sps, *_ in rows:
        base.setdefault(framework, sps)
    base.update({framework: sps for _, framework, strategy, sps, *_ in rows if strategy == "sync"})
    click.echo("")
    click.echo(f"{'strategy':<14} {'samples/s':>10} {'vs sync':>8} {'test acc':>9} "
               f"{'fast workers compute ratio':>29} {'state server RTT':>17}")
    for label, framework, _, sps, acc, ratio, rtt in rows:
        rtt_text = f"{rtt * 1000:.2f} ms" if rtt is not None else "-"
        ratio_text = f"{ratio:.2f}" if ratio is not None else "-"
        click.echo(f"{label:<14} {sps:>10.0f} {sps / base[framework]:>7.2f}x {acc:>9.3f} {ratio_text:>29} {rtt_text:>17}")
    click.echo("vs sync: against the Synchronous row of the same framework")
    click.echo(f"\nresults: {root} (horovod-hetero report {root}; horovod-hetero telemetry {root}/jobs/ID/telemetry)")


@click.command("benchmark", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--list", "listing", is_flag=True, help="list the benchmarks, each with its description")
@click.argument("name", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def benchmark(ctx, listing, name, args):
    """Run the lab's benchmark NAME with its own options, ARGS (benchmark NAME --help gives them).

    --list lists the benchmarks. Those of several ranks run under horovodrun, as the Makefile's bench-*
    targets run them (horovodrun -np 2 -H localhost:2 --gloo python -m horovod_hetero.cli benchmark peers).
    Time to accuracy, the lab's main benchmark, is horovod-hetero bench."""
    if listing:
        width = max(map(len, benchmarks.names()))
        for each in benchmarks.names():
            click.echo(f"{each:<{width}}  {benchmarks.summary(each)}")
        click.echo("\nhorovod-hetero bench times strategies to accuracy (the lab's main benchmark); "
                   "horovod-hetero benchmark NAME --help: NAME's options")
        return
    if name is None:
        raise click.UsageError(f"give a benchmark NAME (one of {', '.join(benchmarks.names())}) or --list")
    try:
        main = benchmarks.entry(name)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    argv0 = sys.argv[0]
    sys.argv[0] = f"{ctx.command_path} {name}"          # NAME's usage and errors name the command that ran it
    try:
        code = main(list(args))
    finally:
        sys.argv[0] = argv0
    if code:
        ctx.exit(code if isinstance(code, int) else 1)
