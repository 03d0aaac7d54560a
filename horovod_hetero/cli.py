"""The ``horovod-hetero`` command: ``demo`` (a real comparison on this machine) and ``telemetry``."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import click

from horovod_hetero.common.telemetry import format_summary, load, summarize

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
DEMO_STRATEGIES = {"Synchronous": ["--strategy", "sync"], "LocalSGD(8)": ["--strategy", "localsgd", "--period", "8"]}


@click.group()
@click.version_option(package_name="horovod-hetero")
def cli():
    """Heterogeneity-aware synchronisation for Horovod."""


def horovodrun(num_proc):
    exe = pathlib.Path(sys.executable).with_name("horovodrun")
    return [str(exe), "-np", str(num_proc), "-H", f"localhost:{num_proc}", "--gloo"]


def run_worker_job(cmd, env, label, timeout_s):
    """Run a horovodrun job, echoing rank 0's progress lines; return (returncode, output)."""
    lines = []
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout_s
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("[0]<stdout>:  ["):
                click.echo(f"    {label}: {line.split(':', 1)[1].strip()}")
            if time.monotonic() > deadline:
                proc.kill()
                break
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, "".join(lines)


@cli.command()
@click.option("--np", "num_proc", default=4, show_default=True, help="number of workers")
@click.option("--slowdown", default="1,1,1,4", show_default=True, help="per-rank slowdown factors")
@click.option("--base-step", default=0.01, show_default=True,
              help="seconds one step takes on a factor-1 worker (steps are padded to factor x this)")
@click.option("--budget", default=30.0, show_default=True, help="wall-clock seconds of training per strategy")
@click.option("--keep", type=click.Path(file_okay=False), default=None, help="keep telemetry in this folder")
def demo(num_proc, slowdown, base_step, budget, keep):
    """Compare strategies on this machine: digits MLP, simulated stragglers, fixed time budget."""
    script = EXAMPLES / "torch_digits.py"
    if not script.exists():
        raise click.ClickException(f"{script} not found: run the demo from a checkout (make demo)")
    root = pathlib.Path(keep or tempfile.mkdtemp(prefix="horovod-hetero-demo-"))
    click.echo(f"horovod-hetero demo: {num_proc} workers, slowdown {slowdown} (base step {base_step * 1000:g} ms), "
               f"digits MLP, {budget:g} s of training per strategy")
    rows = []
    for i, (label, args) in enumerate(DEMO_STRATEGIES.items(), start=1):
        out = root / label.replace("(", "_").replace(")", "")
        out.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, HOROVOD_HETERO_SLOWDOWN=slowdown, HOROVOD_HETERO_BASE_STEP_S=str(base_step),
                   HOROVOD_HETERO_TELEMETRY=str(out / "telemetry"), PYTHONUNBUFFERED="1")
        cmd = horovodrun(num_proc) + [sys.executable, str(script), *args, "--time-budget", str(budget),
                                      "--epochs", "100000", "--result", str(out / "result.json")]
        click.echo(f"[{i}/{len(DEMO_STRATEGIES)}] {label}: starting {num_proc} workers ...")
        t0 = time.perf_counter()
        code, output = run_worker_job(cmd, env, label, timeout_s=budget + 120)
        if code != 0 or not (out / "result.json").exists():
            click.echo(output[-3000:], err=True)
            raise click.ClickException(f"{label} run failed (exit {code})")
        result = json.loads((out / "result.json").read_text())
        summary = summarize(load(str(out / "telemetry")))
        fastest = max(summary.values(), key=lambda s: s["steps"])
        rows.append((label, result["samples_per_s"], result["accuracy"], fastest["compute_ratio"],
                     fastest["mean_local_steps"]))
        click.echo(f"[{i}/{len(DEMO_STRATEGIES)}] {label}: done in {time.perf_counter() - t0:.0f} s, "
                   f"test accuracy {result['accuracy']:.3f}")
    base = rows[0][1]
    click.echo("")
    click.echo(f"{'strategy':<14} {'samples/s':>10} {'vs sync':>8} {'test acc':>9} {'fastest worker compute ratio':>29}")
    for label, sps, acc, ratio, _ in rows:
        click.echo(f"{label:<14} {sps:>10.0f} {sps / base:>7.2f}x {acc:>9.3f} {ratio:>29.2f}")
    click.echo(f"\ntelemetry: {root} (horovod-hetero telemetry DIR prints per-worker figures)")


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
