"""The ``horovod-hetero`` command: ``simulate``, ``advise`` (strategies ranked from a run's telemetry),
``plan``, ``telemetry`` and ``doctor`` (what will and will not work in this environment); and the commands installed packages add through the ``horovod_hetero.commands``
entry points: the lab's ``bench``, ``report``, ``demo`` and ``benchmark`` (lab/ in a checkout; ``make``
installs it)."""
from __future__ import annotations

import pathlib
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata
from typing import TYPE_CHECKING

import click

import horovod_hetero.auto  # noqa: F401  (registers hh.Auto: simulate and advise list it)
import horovod_hetero.doctor as doctor_checks
from horovod_hetero.runtime.telemetry import format_summary, format_switches, load, summarize, switches
from horovod_hetero.strategies.registry import REGISTRY, check_names, configured

if TYPE_CHECKING:
    from horovod_hetero.simulate import SimResult
    from horovod_hetero.strategies import Strategy

#: the entry point group whose commands ``horovod-hetero`` adds (each ``name = "module:click_command"``)
COMMANDS = "horovod_hetero.commands"
#: the commands of horovod-hetero's lab, named in the hint where it is not installed
LAB_COMMANDS = ("bench", "report", "demo", "benchmark")


class Commands(click.Group):
    """``horovod-hetero``'s group: its own commands, and those of the ``horovod_hetero.commands`` entry points,
    each imported only when it is run (or listed by ``--help``, which leaves out one that cannot be imported;
    running that one names the error)."""

    @staticmethod
    def installed() -> dict[str, metadata.EntryPoint]:
        if sys.version_info >= (3, 10):
            group = metadata.entry_points(group=COMMANDS)
        else:                                       # Python 3.9: a dict of groups
            group = metadata.entry_points().get(COMMANDS, [])
        return {ep.name: ep for ep in group}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.installed()})

    def plugin(self, name: str) -> tuple[click.Command | None, str | None]:
        """``(command, why)``: the command entry point ``name`` gives, or ``None`` and why there is none
        (``None`` too for a name that is no plugin's and no lab command: click's own message says so)."""
        entry = self.installed().get(name)
        hint = "; from a checkout, pip install -e lab (make does it)" if name in LAB_COMMANDS else ""
        if entry is None:
            return None, hint and f"{name!r} is a command of horovod-hetero's lab, not installed here{hint}"
        try:
            return entry.load(), None
        except ImportError as e:
            return None, f"{name!r} ({entry.value}) cannot be imported: {e}{hint}"

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        return command if command is not None else self.plugin(name)[0]

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if not ctx.resilient_parsing and super().get_command(ctx, name) is None:
            why = self.plugin(name)[1]
            if why:
                ctx.fail(why)
        return super().resolve_command(ctx, args)


@click.group(cls=Commands)
@click.version_option(package_name="horovod-hetero")
def cli() -> None:
    """Heterogeneity-aware synchronisation for Horovod."""


def parse_speeds(text: str) -> list[float]:
    """``"1,1,1,4"`` or ``"1.0x4,3.2x4"`` (value x count) into a list of step times."""
    out = []
    for part in text.split(","):
        value, _, count = part.strip().partition("x")
        try:
            out += [float(value)] * (int(count) if count else 1)
        except ValueError:
            raise click.BadParameter(f"{part!r}: use numbers, optionally with xCOUNT (e.g. 1.0x4,3.2x4)") from None
    return out


def parse_floats(text: str, name: str) -> list[float]:
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
def simulate(speeds: str, strategies: str, duration: float, jitter: float, change_at: float | None,
             change_factors: str | None, model_mb: float, bandwidth_gbps: float, latency_us: float, batch: int,
             batch_share: float, period: int, lookahead: int, s_lower: int, s_upper: int, group_size: int | None,
             wagma_period: int, check_period: str, rebalance_every: int, seed: int, per_worker: bool,
             png: str | None) -> None:
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
            strategy = configured(name, **options)
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


def chosen(strategies: str, registered: Iterable[str] = REGISTRY) -> list[str]:
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
def advise(directory: str, strategies: str, duration: float | None) -> None:
    """Rank the strategies for the cluster a run's telemetry shows.

    DIRECTORY holds rank<r>.jsonl files (telemetry=DIR in a run with any strategy, e.g.
    Synchronous; or a bench job's directory). The ranks' measured step times, how they vary and what a
    synchronising collective cost go into the simulator, which runs every strategy as bench configures
    it (``registry.configured``: LocalSGD(8), WAGMA every 8, ElasticBSP(15), DSSP(3,15), ADSP(10steps), Balanced(5))."""
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
        results = adv.predict(measured, {n: configured(n) for n in names}, duration)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(adv.format_advice(measured, results))
    from horovod_hetero.auto import DEFAULT, SIMULATED_STEPS
    candidates = {n: configured(n) for n in DEFAULT if n in REGISTRY}
    choice = adv.choose(measured, candidates, "sync", duration=SIMULATED_STEPS * max(measured.step_s))
    click.echo(f"hh.Auto, started as Synchronous on this cluster, would run {choice.name}: {choice.reason}")
    if choice.switches:
        from horovod_hetero.auto import TRIED
        tried = choice.tied[:TRIED]
        bars = sorted({f"{adv.bar(choice.worth, n, 'sync'):.2f}x" for n in tried})
        kept = "it" if len(tried) == 1 else "the fastest of them"
        click.echo(f"  (it would measure {' then '.join(tried)} for a few rounds and keep {kept} where it ran "
                   f"{' or '.join(bars)} Synchronous's samples/s, else go back to Synchronous)")


def plot_results(results: Sequence[SimResult], path: str) -> None:
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
def plan(step_times: str, strategies: str, lookahead: int, s_lower: int, s_upper: int, check_period: str) -> None:
    """Print the local steps each worker runs before the next round, as the strategy objects plan
    them after a round that measured these step times (ElasticBSP, DSSP), or as they run them per
    commit at the search's first rate (ADSP, on the simulator's virtual clock)."""
    names = chosen(strategies, PLANS)
    step_s = parse_speeds(step_times)
    if not all(0 < s < float("inf") for s in step_s):
        raise click.BadParameter("step times must be finite seconds > 0", param_hint="--step-times")
    try:
        objects = [configured(n, lookahead=lookahead, staleness=(s_lower, s_upper), check_period=check_period)
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


def steady_round(strategy: Strategy, step_s: Sequence[float], rounds: int = 4) -> list[int]:
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
def telemetry(directory: str) -> None:
    """Summarise a telemetry directory (one rank<r>.jsonl per worker)."""
    by_rank = load(directory)
    if not by_rank:
        raise click.ClickException(f"no rank*.jsonl files in {directory}")
    click.echo(format_summary(summarize(by_rank)))
    found = switches(by_rank[min(by_rank)])
    if found:
        click.echo(f"\nstrategy switches (hh.Auto, rank {min(by_rank)}):\n{format_switches(found)}")


#: how ``doctor`` shows each status
STATUS_COLOURS = {"OK": "green", "WARN": "yellow", "FAIL": "red"}


@cli.command()
@click.option("-np", "--num-proc", "np", type=click.IntRange(min=1), default=None,
              help="ranks of the launch to check, as horovodrun's -np (default: report the cores only)")
@click.option("-H", "--hosts", default=None,
              help="the launch's hosts and slots, as horovodrun's -H: H1:2,H2:2 (more than one host: multi-host)")
@click.option("--framework", type=click.Choice(doctor_checks.FRAMEWORK_CHOICES), default="any", show_default=True,
              help="the framework the job needs")
@click.option("--strategy", type=click.Choice(list(REGISTRY)), default=None, help="the strategy the job runs")
@click.option("--elastic", is_flag=True, help="the job runs under hvd.elastic")
def doctor(np: int | None, hosts: str | None, framework: str, strategy: str | None, elastic: bool) -> None:
    """Say what will and will not work in this environment, and why.

    As horovodrun --check-build does for Horovod (Horovod is not initialised): Horovod's version and
    build, the frameworks and Keras, process sets, Gloo's timeout, this host's name, ranks against cores,
    the optional packages and MPI. Each line is OK, WARN (works, with a cost or a limit) or FAIL, with
    the fix. Exits 1 when a line is FAIL: a launch as configured cannot work."""
    try:
        parsed = doctor_checks.parse_hosts(hosts) if hosts else None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="-H/--hosts") from None
    checks = doctor_checks.run_checks(np, parsed, framework, strategy, elastic)
    asked = " ".join(part for part in (f"-np {np}" if np else "", f"-H {hosts}" if hosts else "",
                                       f"--framework {framework}" if framework != "any" else "",
                                       f"--strategy {strategy}" if strategy else "", "--elastic" if elastic else "")
                     if part)
    click.echo(f"horovod-hetero doctor{f' ({asked})' if asked else ''}")
    width = max(len(c.name) for c in checks)
    for check in checks:
        status = click.style(f"{check.status:<4}", fg=STATUS_COLOURS[check.status], bold=check.status != "OK")
        click.echo(f"  {status}  {check.name:<{width}}  {check.detail}")
        if check.fix or check.anchor:
            see = f"see docs/{check.anchor}" if check.anchor else ""
            click.echo(f"  {'':<4}  {'':<{width}}  -> {'; '.join(p for p in (check.fix, see) if p)}")
    counts = {s: sum(c.status == s for c in checks) for s in STATUS_COLOURS}
    code = doctor_checks.exit_status(checks)
    verdict = ("a launch as configured cannot work: fix the FAIL lines" if code else
               "a launch as configured can work" + (" (see the WARN lines)" if counts["WARN"] else ""))
    click.echo(f"{counts['OK']} OK, {counts['WARN']} WARN, {counts['FAIL']} FAIL: {verdict}")
    raise SystemExit(code)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
