"""``horovod-hetero bench``: time-to-accuracy of the strategies, measured under ``horovodrun``.

A bench is a plan of jobs (framework x task x split x slowdown profile x repeat x strategy x aggregation,
Synchronous first in each group, repeats interleaved so that a drift of the machine's speed spreads over
every strategy), each one ``horovodrun`` of the checkout's ``examples/torch_digits.py`` or ``keras_digits.py``
to a wall-clock budget. The aggregations (``--aggregate mean,normalized,normalized+nesterov``) apply to
the model-averaging strategies: each runs once per aggregation, Synchronous once. Every job leaves, under ``DIR/jobs/<id>/``: the per-rank telemetry
(``telemetry/rank<r>.jsonl``), rank 0's evaluation curve (``curve.jsonl``: test quality against
seconds since the common start barrier and against rank 0's local steps, evaluated right after a
global averaging round, evaluation time left out of the clock; see ``harness.Curve``), the example's
``result.json``, the job's output (``output.log``) and ``summary.json``. ``DIR/results.json`` holds
the command line, the versions, the settings and every planned job with its status (``planned``,
``running``, ``done``, ``failed``, ``interrupted``) and summary; it is written before the first job
and replaced atomically after each, so an interrupted bench leaves a directory ``report`` reads.

The time to the target is read from the curve after the run (the first point at or past the
target): every job runs its whole budget, so the final quality is measured at equal wall time. A
target is a number, or ``sync`` (the default of the real-data tasks): the quality Synchronous's curve
ends with in the same group and repeat (its final point, on the curve's test set), so the speedup says
how much sooner a strategy reaches what Synchronous reaches in the whole budget. Classification jobs
also record every class's final accuracy and, where a profile has a slowest worker, the mean accuracy on
the classes that worker holds most of (``slow_classes``).

Beside each measured samples/s the summary puts the simulator's prediction: ``simulate.simulate``
of the same strategy on a cluster that replays each rank's measured step times (``compute_s`` of
its telemetry, step by step) with the measured cost of one averaging round; and the bound the
strategy would reach if communication were free (the same replay, rounds costing nothing).
"""
import dataclasses
import json
import logging
import os
import pathlib
import platform
import shutil
import signal
import statistics
import subprocess
import sys
from typing import Any
import time
from collections.abc import Mapping
from importlib import metadata

import numpy as np

import horovod_hetero
from horovod_hetero import simulate as sim
from horovod_hetero.runtime.straggler import parse_random_delay, parse_slowdown
from horovod_hetero.runtime.telemetry import load, round_cost_and_wait, summarize
from horovod_hetero.runtime.runner import runner_for
from horovod_hetero.strategies.registry import REGISTRY, check_names
from horovod_hetero.validation import check_bool, check_float, check_int
import horovod_hetero_lab
from horovod_hetero_lab.data import TASKS, check_split, check_task, class_shares
from horovod_hetero_lab.harness import bench_label, bench_options, bench_strategy

#: The directories holding the ``horovod_hetero`` and ``horovod_hetero_lab`` packages this command runs:
#: the jobs' workers import the same copies.
PACKAGE_PARENTS = list(dict.fromkeys(pathlib.Path(str(p.__file__)).resolve().parent.parent
                                     for p in (horovod_hetero, horovod_hetero_lab)))
#: framework -> the example script a job runs (``examples/<name>.py`` of the checkout)
SCRIPTS = {"torch": "torch_digits", "keras": "keras_digits"}


class Strategies(Mapping):
    """name -> (row label, the examples' options that build it) of every strategy ``strategies.registry.REGISTRY``
    holds when it is read (one registered since included), in its order (Synchronous first): labelled and
    configured by the lab's ``harness.BENCH``, a strategy without an entry there by its class's name, with no
    options.

    Example:
        >>> STRATEGIES["dssp"]
        ('DSSP(3,15)', ['--strategy', 'dssp', '--staleness', '3', '15'])
    """

    def __getitem__(self, name):
        if name not in REGISTRY:
            raise KeyError(name)
        return bench_label(name), bench_options(name)

    def __iter__(self):
        return iter(list(REGISTRY))

    def __len__(self):
        return len(REGISTRY)


#: name -> (row label, the examples' options that build it), read from the registry (``Strategies``)
STRATEGIES = Strategies()
RESULTS = "results.json"
FORMAT = "horovod-hetero-bench/2"
#: ``--aggregate`` variants of the model-averaging strategies: how global rounds combine the models
#: (``strategies.aggregation``); ``+nesterov`` adds ``OuterSGD(OUTER_LR, OUTER_MOMENTUM, nesterov=True)``.
AGGREGATES = ("mean", "normalized", "mean+nesterov", "normalized+nesterov")
#: the outer step of the ``+nesterov`` variants (``--outer LR,MOMENTUM``). DiLoCo's 0.7 and 0.9 are for rounds
#: of hundreds of local steps; with rounds of a few steps of SGD with momentum 0.9 they diverged here
#: (Fashion-MNIST, ESync, class-skewed: accuracy 0.11 after 30 s), 0.5 did not.
OUTER = (0.7, 0.5)


def check_aggregate(text):
    """``text`` if it is one of ``AGGREGATES``, else a ``ValueError`` naming ``--aggregate``."""
    if text not in AGGREGATES:
        raise ValueError(f"--aggregate must be a comma list of {', '.join(AGGREGATES)}, got {text!r}")
    return text


def aggregate_options(variant, outer=OUTER):
    """The examples' options of an ``--aggregate`` variant.

    Example:
        >>> aggregate_options("normalized+nesterov")
        ['--aggregate', 'normalized', '--outer-lr', '0.7', '--outer-momentum', '0.5', '--nesterov']
    """
    aggregate, plus, _ = check_aggregate(variant).partition("+")
    options = ["--aggregate", aggregate]
    if plus:
        options += ["--outer-lr", f"{outer[0]:g}", "--outer-momentum", f"{outer[1]:g}", "--nesterov"]
    return options


@dataclasses.dataclass(frozen=True)
class Profile:
    """A simulated-heterogeneity profile: the text given, and the environment the workers get.

    ``"1,1,1,4"`` (per-rank slowdown factors), ``"1,1,1,1;15:1,1,1,4"`` (factors changing over time,
    see ``runtime.straggler``), ``"random"`` (two ranks drawn at random each step are delayed by
    3 base steps, so a delayed step takes 4x: the WAGMA paper's transient stragglers) or
    ``"random:COUNT:SECONDS"``.
    """

    text: str
    env: tuple


def slug(text):
    """``text`` with every character that is not a letter or a digit replaced by ``_`` (for job ids).

    Example:
        >>> slug("1,1;5:1,4")
        '1_1_5_1_4'
    """
    return "".join(c if c.isalnum() else "_" for c in text)


def parse_profile(text, num_proc, base_step):
    """The ``Profile`` of ``text`` for ``num_proc`` workers; a ``ValueError`` naming ``--profile`` otherwise.

    Example:
        >>> parse_profile("random", 4, 0.02).env
        (('HOROVOD_HETERO_RANDOM_DELAY', '2:0.06'),)
        >>> parse_profile("1,4", 2, 0.02).env
        (('HOROVOD_HETERO_SLOWDOWN', '1,4'),)
    """
    text = str(text).strip()
    if text == "random" or text.startswith("random:"):
        spec = text.partition(":")[2] or f"2:{3 * base_step:g}"
        count, seconds = parse_random_delay(spec, name="--profile random:COUNT:SECONDS")
        return Profile(text, (("HOROVOD_HETERO_RANDOM_DELAY", f"{count}:{seconds:g}"),))
    schedule = parse_slowdown(text, name="--profile")
    if len(schedule[0][1]) < num_proc:
        raise ValueError(f"--profile {text!r} gives {len(schedule[0][1])} factors; --np is {num_proc} "
                         f"(one factor per worker, the first NP used; or 'random')")
    return Profile(text, (("HOROVOD_HETERO_SLOWDOWN", text),))


@dataclasses.dataclass(frozen=True)
class Job:
    """One ``horovodrun`` of one strategy."""

    id: str
    framework: str
    task: str
    profile: str
    repeat: int
    strategy: str
    label: str
    split: str = "iid"
    aggregate: str = "mean"

    @property
    def group(self):
        """The jobs compared with each other: same framework, task, split and profile."""
        return (self.framework, self.task, self.split, self.profile)


def plan(frameworks, tasks, profiles, strategies, repeats, splits=None, aggregates=("mean",)):
    """Every job, in the order they run: per framework, task, split and profile, ``repeats`` rounds of
    every strategy (Synchronous first, whatever order they are given in), each model-averaging strategy
    once per aggregation in ``aggregates`` (``AGGREGATES``; Synchronous once). ``splits``: ``None``
    runs each task's own split. A framework, task, split, profile, strategy or aggregation given twice
    runs once; two profiles whose ids coincide (``1.5,1,1,4`` and ``1,5,1,1,4``) are a ``ValueError``,
    as their jobs would write into one directory.

    Example:
        >>> [j.id for j in plan(["torch"], ["digits"], ["1,4"], ["esync", "sync"], 2)]
        ['torch-digits-iid-1_4-r0-sync', 'torch-digits-iid-1_4-r0-esync', 'torch-digits-iid-1_4-r1-sync', 'torch-digits-iid-1_4-r1-esync']
        >>> [j.label for j in plan(["torch"], ["digits"], ["1,4"], ["sync", "esync"], 1, aggregates=["mean", "normalized"])]
        ['Synchronous', 'ESync', 'ESync [normalized]']
    """
    repeats = check_int("repeats", repeats, 1)
    try:
        check_names(strategies, STRATEGIES)
    except ValueError as e:
        raise ValueError(f"strategies: {e}") from None
    bad = [f for f in frameworks if f not in SCRIPTS]
    if bad:
        raise ValueError(f"framework must be one of {', '.join(SCRIPTS)}, got {', '.join(bad)}")
    if not aggregates:
        raise ValueError(f"--aggregate must be a comma list of {', '.join(AGGREGATES)}, got an empty list")
    aggregates = [check_aggregate(a) for a in dict.fromkeys(aggregates)]
    for t in tasks:
        check_task(t, "--task")
    ordered = sorted(dict.fromkeys(strategies), key=lambda s: s != "sync")
    if "keras" in frameworks and "balanced" in ordered:
        raise ValueError("strategies: balanced runs with --framework torch (the Keras example trains one fit() per job; "
                         "BalancedCallback plans a batch size per fit)")
    jobs = []
    for framework in dict.fromkeys(frameworks):
        for task in dict.fromkeys(tasks):
            task_splits = [check_split(None, task)] if splits is None else [check_split(x, task) for x in splits]
            for split in dict.fromkeys(task_splits):
                for profile in dict.fromkeys(profiles):
                    for r in range(repeats):
                        for s in ordered:
                            for agg in (["mean"] if gradient_averaging(s) else aggregates):
                                suffix = "" if agg == "mean" else f"-{slug(agg)}"
                                label = STRATEGIES[s][0] + ("" if agg == "mean" else f" [{agg}]")
                                jobs.append(Job(f"{framework}-{task}-{slug(split)}-{slug(profile)}-r{r}-{s}{suffix}",
                                                framework, task, profile, r, s, label, split, agg))
    seen: dict[str, Job] = {}
    for j in jobs:
        other = seen.setdefault(j.id, j)
        if other is not j:
            raise ValueError(f"--profile {other.profile!r} and {j.profile!r} give the same job id {j.id!r}: "
                             f"write one of them differently")
    return jobs


def versions():
    """Versions of what produced the numbers."""
    out = {"horovod_hetero": horovod_hetero.__version__, "python": platform.python_version(),
           "platform": platform.platform(),
           # which Keras the Keras jobs ran: Keras 3's backend, or Keras 2 through tf.keras
           **{var: os.environ.get(var) for var in ("KERAS_BACKEND", "TF_USE_LEGACY_KERAS")}}
    for dist in ("horovod", "torch", "tensorflow", "keras"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def horovodrun(num_proc, hosts=None):
    """The horovodrun command: beside this interpreter (a virtual environment), else on PATH."""
    beside = pathlib.Path(sys.executable).with_name("horovodrun")
    exe = str(beside) if beside.exists() else shutil.which("horovodrun")
    if exe is None:
        raise FileNotFoundError("horovodrun not found beside this Python or on PATH: install Horovod")
    return [exe, "-np", str(num_proc), "-H", hosts or f"localhost:{num_proc}", "--gloo"]


def job_command(job, settings, job_dir, budget=None):
    """``(argv, env)`` of one job; ``budget``: its seconds of training (default the setting's)."""
    profile = parse_profile(job.profile, settings["np"], settings["base_step"])
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [*map(str, PACKAGE_PARENTS), os.environ.get("PYTHONPATH")])),
               HOROVOD_HETERO_TELEMETRY=str(job_dir / "telemetry"))
    env.update(dict(profile.env))        # a variable of the other kind set in the environment adds to it
    env.pop("HOROVOD_HETERO_SAMPLE_S", None)
    mode = settings.get("slowdown", "padded")
    if mode == "padded":
        env["HOROVOD_HETERO_BASE_STEP_S"] = str(settings["base_step"])
    elif mode == "padded-linear":        # a factor-f step of b samples: f x base_step x b / batch_size
        env["HOROVOD_HETERO_BASE_STEP_S"] = "0"
        env["HOROVOD_HETERO_SAMPLE_S"] = repr(settings["base_step"] / settings["batch_size"])
    else:                                # proportional: a factor-f step sleeps (f - 1) x its measured compute
        env.pop("HOROVOD_HETERO_BASE_STEP_S", None)
    aggregation = [] if gradient_averaging(job.strategy) else aggregate_options(job.aggregate, settings.get("outer", OUTER))
    cmd = horovodrun(settings["np"], settings.get("hosts")) + [
        sys.executable, str(horovod_hetero_lab.example(SCRIPTS[job.framework])), *STRATEGIES[job.strategy][1], *aggregation,
        "--task", job.task, "--split", job.split,
        "--seed", str(job.repeat), "--time-budget", str(settings["budget"] if budget is None else budget),
        "--epochs", "1000000",
        "--eval-interval", str(settings["eval_interval"]), "--batch-size", str(settings["batch_size"]),
        "--curve", str(job_dir / "curve.jsonl"), "--result", str(job_dir / "result.json")]
    if settings.get("stop_at_target"):
        cmd += ["--stop-at", repr(settings["targets"][job.task])]
        if settings.get("check_interval") is not None:
            cmd += ["--check-interval", str(settings["check_interval"])]
    return cmd, env


def sync_job_id(job):
    """The id of the Synchronous job ``job`` is compared with: same group, same repeat (as ``plan`` names it)."""
    return f"{job.framework}-{job.task}-{slug(job.split)}-{slug(job.profile)}-r{job.repeat}-sync"


def job_budget(job, settings, entries):
    """``(seconds, note)``: the seconds of training for ``job`` and what its line says of them. The
    setting's ``budget``; with ``cap`` (a strategy other than Synchronous), at most ``cap`` x the time
    its group's Synchronous job of the same repeat took to the target (``entries``: the results' jobs,
    that one finished before: Synchronous runs first), or the budget, with a note, where that job
    failed or missed the target.

    Example:
        >>> s = {"budget": 900.0, "cap": 3.0}
        >>> sync = {"id": "torch-fashion-cnn-iid-1_1_1_4-r0-sync", "status": "done",
        ...         "summary": {"time_to_target_s": 100.0}}
        >>> job = Job("torch-fashion-cnn-iid-1_1_1_4-r0-esync", "torch", "fashion-cnn", "1,1,1,4", 0, "esync", "ESync")
        >>> job_budget(job, s, [sync]), job_budget(job, dict(s, cap=None), [sync])
        ((300.0, ''), (900.0, ''))
        >>> job_budget(job, s, [dict(sync, status="failed")])
        (900.0, ' (not capped: Synchronous did not reach the target in repeat 0)')
    """
    cap = settings.get("cap")
    if cap is None or job.strategy == "sync":
        return settings["budget"], ""
    sync = next((e for e in entries if e["id"] == sync_job_id(job) and e["status"] == "done"), None)
    ttt = sync["summary"]["time_to_target_s"] if sync else None
    if ttt is None:
        return settings["budget"], f" (not capped: Synchronous did not reach the target in repeat {job.repeat})"
    return min(settings["budget"], cap * ttt), ""


def run_process(cmd, env, log_path, timeout_s, tick=None):
    """Run ``cmd`` in its own process group, its output to ``log_path``; call ``tick()`` about 5 times a
    second. Past ``timeout_s``, or on ``KeyboardInterrupt``, every process it started is killed and
    waited for (the interrupt is raised again). Returns the exit status (``None`` if it was killed for
    the timeout)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    kill_tree(proc)
                    return None
                if tick is not None:
                    tick()
                time.sleep(0.2)
        except BaseException:
            kill_tree(proc)
            raise
    return proc.returncode


def kill_tree(proc, timeout_s=30):
    """Kill ``proc`` (a ``Popen`` started in a new session), its process group and every descendant,
    and wait for them all. The descendants are listed before anything is killed: Horovod's launcher
    starts each rank under a middleman that calls ``os.setsid()``, so the ranks are in neither the
    group of ``proc`` nor, once it is dead, anywhere beneath it."""
    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=timeout_s)
    psutil.wait_procs(tree, timeout=timeout_s)


# -- results --

def write_json(path, data):
    """Replace ``path`` with ``data`` atomically (a reader sees the old file or the new one)."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=float))
    os.replace(tmp, path)


def read_curve(path):
    """The points of a ``curve.jsonl`` (a list of dicts; empty if the file is missing)."""
    path = pathlib.Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def time_to_target(curve, task, target, key="t"):
    """The first ``key`` (seconds ``"t"`` or ``"step"``) at which the curve reaches ``target`` (``task.reached``);
    ``None`` if never. ``task``: a ``data.Task`` or its name.

    Example:
        >>> c = [{"t": 1.0, "step": 5, "accuracy": 0.5}, {"t": 2.0, "step": 9, "accuracy": 0.92}]
        >>> time_to_target(c, "digits", 0.9), time_to_target(c, "digits", 0.9, key="step")
        (2.0, 9)
        >>> time_to_target(c, "digits", 0.95) is None
        True
    """
    task = check_task(task) if isinstance(task, str) else task
    return next((point[key] for point in curve if task.reached(point[task.metric], target)), None)


def quality_at(curve, metric, step):
    """The curve's quality at rank 0's local step ``step`` (linear between points; ``None`` past its end).

    Example:
        >>> quality_at([{"step": 10, "accuracy": 0.5}, {"step": 20, "accuracy": 0.9}], "accuracy", 15)
        0.7
    """
    if not curve or step > curve[-1]["step"]:
        return None
    return float(np.interp(step, [p["step"] for p in curve], [p[metric] for p in curve]))


def predict(by_rank, strategy, wall, batch_size, round_cost):
    """Samples/s the simulator predicts for ``strategy`` over a run of ``wall`` seconds whose ranks'
    steps took what they took (``compute_s``, step by step) and whose global rounds cost ``round_cost``
    seconds (``0``: free communication, the bound). The simulation covers the steady part of the run,
    from the end of the last rank's first step (start-up: process start, the first collective) to the
    last record; the first steps' samples count, the rest of the wall time (start-up, the final
    synchronisation) trains nothing, as in the run. The simulated strategy's own log lines (``hh.Auto``'s
    switches on the simulated rank 0) are kept out of the bench's output: they speak of no job."""
    ranks = sorted(by_rank, key=int)
    begin = max(by_rank[k][0]["time"] for k in ranks)
    end = max(r["time"] for k in ranks for r in by_rank[k])
    # a step of ``batch`` samples (a strategy that plans batches records it) replays as its time per
    # ``batch_size`` samples: the simulation scales it by the batch it plans
    per_step = lambda r: r["compute_s"] * batch_size / r.get("batch", batch_size)     # noqa: E731
    traces = [[per_step(r) for r in by_rank[k][1:]] or [per_step(by_rank[k][0])] for k in ranks]
    n, means = len(traces), [statistics.fmean(t) for t in traces]
    cluster = sim.Cluster(means, step_factors=[[s / mean for s in t] for t, mean in zip(traces, means)], replay=True,
                          model_bytes=0.0, latency_s=(round_cost or 0.0) / (2 * (n - 1)) if n > 1 else 0.0,
                          samples_per_step=batch_size)
    library = logging.getLogger("horovod_hetero")
    was, library.disabled = library.disabled, True
    try:
        steady = sim.simulate(cluster, strategy, max(end - begin, 1e-3))
    finally:
        library.disabled = was
    return (steady.samples.sum() + n * batch_size) / wall


def gradient_averaging(name):
    """True for the strategies that average gradients every step (Synchronous, Balanced): they run once per
    group, whatever ``--aggregate`` says."""
    return runner_for(bench_strategy(name)).steps_together


def slowest_rank(profile, num_proc):
    """The worker a profile makes slowest (the largest factor of any segment, first such rank), or
    ``None`` (equal factors, or ``random``: no worker is slow for long).

    Example:
        >>> slowest_rank("1,1,1,4", 4), slowest_rank("1,1,1,1;15:1,4,1,1", 4), slowest_rank("random", 4)
        (3, 1, None)
    """
    if profile == "random" or profile.startswith("random:"):
        return None
    schedule = parse_slowdown(profile, name="--profile")
    factors = max((fs[:num_proc] for _, fs in schedule), key=max)
    return None if max(factors) == min(factors) else int(np.argmax(factors))


def slow_classes(job, num_proc):
    """The classes the job's slowest worker holds most of: a share of the class's training samples
    (``data.class_shares``) more than halfway from a fair one (1/P) to all of it, ``(1 + 1/P) / 2``
    (0.625 at 4 workers; none under an iid split); ``None`` without classes or a slowest worker."""
    task = TASKS[job.task]
    rank = slowest_rank(job.profile, num_proc)
    if not task.classes or rank is None:
        return None
    shares = class_shares(task, num_proc, seed=job.repeat, split=job.split)
    return [int(c) for c in np.flatnonzero(shares[rank] > (1 + 1 / num_proc) / 2)]


def resolve_target(job, settings, out):
    """The quality ``job`` must reach: the setting for its task, or with ``sync`` the final point of the
    curve of its group's Synchronous job of the same repeat (``None`` if that job has no curve)."""
    target = settings["targets"][job.task]
    if target != "sync":
        return target
    curve = read_curve(pathlib.Path(out) / "jobs" / sync_job_id(job) / "curve.jsonl")
    return curve[-1][TASKS[job.task].metric] if curve else None


def summarize_job(job, job_dir, settings):
    """The summary of a finished job: measured figures, the time to the target, the simulator's prediction."""
    task = TASKS[job.task]
    result = json.loads((job_dir / "result.json").read_text())
    curve = read_curve(job_dir / "curve.jsonl")
    target = resolve_target(job, settings, job_dir.parent.parent)
    by_rank = load(str(job_dir / "telemetry"))
    per_rank = summarize(by_rank)
    wall = result["wall_s"]
    slow = slow_classes(job, settings["np"])
    classes = result.get("classes")
    out = {"samples_per_s": result["samples_per_s"], "wall_s": wall, "final": result[task.metric],
           "metric": task.metric, "target": target, "steps_rank0": result.get("steps_rank0"),
           "eval_s": result.get("eval_s"), "classes": classes, "slow_classes": slow,
           "slow_final": float(np.mean([classes[c] for c in slow])) if slow and classes else None,
           "time_to_target_s": None if target is None else time_to_target(curve, task, target),
           "steps_to_target": None if target is None else time_to_target(curve, task, target, key="step"),
           "compute_ratio": None, "bytes_per_s": None, "wait_per_round_s": None, "round_cost_s": None,
           "predicted_samples_per_s": None, "bound_samples_per_s": None, "share_of_bound": None,
           "median_rtt_s": None}
    if len(by_rank) == settings["np"]:
        strategy = bench_strategy(job.strategy)
        runner = runner_for(strategy)
        runner.use_batch(settings["batch_size"], settings["np"])     # a planned global batch: the job's ranks' batches
        cost, wait = round_cost_and_wait(by_rank, every_step=runner.steps_together)
        rtts = [s["median_rtt_s"] for s in per_rank.values() if s["median_rtt_s"] is not None]
        predicted = predict(by_rank, strategy, wall, settings["batch_size"], cost)   # a fresh copy per worker
        bound = predict(by_rank, strategy, wall, settings["batch_size"], 0.0)
        out.update(compute_ratio=[per_rank[k]["compute_ratio"] for k in sorted(per_rank, key=int)],
                   bytes_per_s=sum(s["bytes_sent"] for s in per_rank.values()) / wall,
                   wait_per_round_s=wait, round_cost_s=cost, predicted_samples_per_s=predicted,
                   bound_samples_per_s=bound, share_of_bound=result["samples_per_s"] / bound if bound else None,
                   median_rtt_s=statistics.median_high(rtts) if rtts else None)
    return out


#: how a profile's factors slow a worker down (``--slowdown``): padded to ``f x base_step``; padded to
#: ``f x base_step x b / batch_size`` for a step of b samples (its time grows with its batch, whatever the
#: machine's cores); or ``f - 1`` times the step's measured compute more
SLOWDOWNS = ("padded", "padded-linear", "proportional")


def settings_of(num_proc, base_step, budget, targets=None, eval_interval=0.5, batch_size=32, hosts=None,
                outer=OUTER, slowdown="padded", stop_at_target=False, cap=None, check_interval=None):
    """The bench's settings, checked (a ``ValueError`` names the option); ``targets``: task -> a quality or
    ``"sync"`` (Synchronous's final quality in the same group and repeat); ``outer``: ``(lr, momentum)``
    of the ``+nesterov`` aggregations; ``stop_at_target``: every job ends once its curve reaches the
    target (``check_stop`` checks the jobs allow it), checked on line at most once per ``check_interval``
    seconds (``None``: at every snapshot, ``eval_interval``); ``cap``: ``None`` or a factor > 0 (``job_budget``)."""
    targets = dict(targets or {})
    for name, value in targets.items():
        task = check_task(name, "--target TASK")
        if value == "sync":
            continue
        # accuracy: in (0, 1]; a distance or bits per character: > 0
        targets[name] = check_float(f"--target {name}", value, 0.0, 1.0 if task.higher_is_better else None,
                                    min_exclusive=True)
    lr, momentum = outer
    check_float("--outer LR", lr, 0.0, min_exclusive=True)
    if not 0.0 < check_float("--outer MOMENTUM", momentum) < 1.0:
        raise ValueError(f"--outer MOMENTUM must be in (0, 1) (the +nesterov aggregations), got {momentum!r}")
    if slowdown not in SLOWDOWNS:
        raise ValueError(f"--slowdown must be one of {', '.join(SLOWDOWNS)}, got {slowdown!r}")
    check_bool("--stop-at-target", stop_at_target)
    if stop_at_target and hosts is not None:
        raise ValueError("--stop-at-target runs on one host (rank 0 tells the others through a file in the job's "
                         "directory): leave --hosts out")
    if cap is not None:
        check_float("--cap", cap, 0.0, min_exclusive=True)
    if check_interval is not None:
        if not stop_at_target:
            raise ValueError("--check-interval spaces the checks of --stop-at-target: give --stop-at-target too")
        check_float("--check-interval", check_interval, 0.0)
    return {"np": check_int("--np", num_proc, 1), "outer": [float(lr), float(momentum)], "slowdown": slowdown,
            "stop_at_target": stop_at_target, "cap": None if cap is None else float(cap),
            "base_step": check_float("--base-step", base_step, 0.0, min_exclusive=True),
            "budget": check_float("--budget", budget, 0.0, min_exclusive=True),
            "eval_interval": check_float("--eval-interval", eval_interval, 0.0),
            "check_interval": None if check_interval is None else float(check_interval),
            "batch_size": check_int("--batch-size", batch_size, 1), "hosts": hosts,
            "targets": {name: targets.get(name, "sync" if task.target is None else task.target)
                        for name, task in TASKS.items()}}


def check_stop(settings, jobs):
    """A ``ValueError`` naming the option if ``--stop-at-target`` or ``--cap`` cannot apply to ``jobs``:
    both need a numeric target for each task (not ``sync``), and stopping needs the torch example.

    Example:
        >>> s = settings_of(4, 0.05, 60, {"fashion-cnn": "sync"}, stop_at_target=True)
        >>> check_stop(s, plan(["torch"], ["fashion-cnn"], ["1,1,1,4"], ["sync"], 1))
        Traceback (most recent call last):
        ...
        ValueError: --stop-at-target needs a quality to stop at: give --target fashion-cnn=VALUE (a number, not sync)
    """
    if not (settings.get("stop_at_target") or settings.get("cap") is not None):
        return
    option = "--stop-at-target" if settings.get("stop_at_target") else "--cap"
    for task in dict.fromkeys(j.task for j in jobs):
        if settings["targets"][task] == "sync":
            raise ValueError(f"{option} needs a quality to stop at: give --target {task}=VALUE (a number, not sync)")
    if settings.get("stop_at_target") and any(j.framework != "torch" for j in jobs):
        raise ValueError("--stop-at-target runs the torch example only: give --framework torch")
    strategies = {j.strategy for j in jobs}
    if settings.get("cap") is not None and ("sync" not in strategies or len(strategies) < 2):
        raise ValueError("--cap bounds each strategy by Synchronous's time to the target: give --strategies "
                         "sync and at least one other")


def new_results(out, jobs, settings, command):
    """Create ``out`` and write its ``results.json`` with every job planned; refuses a directory that
    already holds files (a ``ValueError``)."""
    out = pathlib.Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {str(out)!r} is not empty: give a new directory")
    (out / "jobs").mkdir(parents=True, exist_ok=True)
    results = {"format": FORMAT, "command": command, "versions": versions(), "settings": settings,
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "jobs": [dict(dataclasses.asdict(j), status="planned") for j in jobs]}
    write_json(out / RESULTS, results)
    return results


def escape(text):
    """``text`` for a rich progress bar's description (``[normalized]`` is not markup)."""
    from rich.markup import escape as rich_escape
    return rich_escape(text)


def run_bench(out, results, echo, progress=None):
    """Run every planned job of ``results`` (see ``new_results``), updating ``out/results.json`` after
    each; ``echo(line)`` gets one line per finished job; ``progress`` a rich ``Progress`` (or None).
    On ``KeyboardInterrupt`` the running job is killed and marked ``interrupted``, then the interrupt
    is raised again."""
    out = pathlib.Path(out)
    settings = results["settings"]
    entries = results["jobs"]
    overall = progress.add_task("bench", total=len(entries)) if progress else None
    for i, entry in enumerate(entries, start=1):
        job = Job(**{f.name: entry[f.name] for f in dataclasses.fields(Job)})
        job_dir = out / "jobs" / job.id
        job_dir.mkdir(parents=True, exist_ok=True)
        entry["status"] = "running"
        write_json(out / RESULTS, results)
        budget, note = job_budget(job, settings, entries)
        cmd, env = job_command(job, settings, job_dir, budget)
        name = f"[{i}/{len(entries)}] {job.framework} {job.task} {job.split} {job.profile} r{job.repeat} {job.label}"
        bar = progress.add_task(escape(name), total=budget) if progress else None
        t0 = time.monotonic()

        def tick():
            if progress:
                progress.update(bar, completed=min(time.monotonic() - t0, budget))
        try:
            code = run_process(cmd, env, job_dir / "output.log", budget + 180, tick)
        except KeyboardInterrupt:
            entry["status"] = "interrupted"
            write_json(out / RESULTS, results)
            raise
        finally:
            if progress:
                progress.remove_task(bar)
        summary = error = None
        if code == 0 and (job_dir / "result.json").exists():
            try:
                summary = dict(summarize_job(job, job_dir, settings), budget_s=budget)
            except Exception as e:      # one job's unreadable output fails that job, not the bench
                error = f"{type(e).__name__}: {e}"
        if summary is not None:
            write_json(job_dir / "summary.json", summary)
            entry.update(status="done", summary=summary)
            ttt = summary["time_to_target_s"]
            target = "-" if summary["target"] is None else f"{summary['target']:g}"
            echo(f"{name}: done in {time.monotonic() - t0:.0f} s, {summary['samples_per_s']:.0f} samples/s, "
                 f"{summary['metric']} {summary['final']:.3f}, target {target} "
                 + (f"at {ttt:.1f} s" if ttt is not None else "not reached") + note)
        elif error is not None:
            entry.update(status="failed", exit=code, error=error)
            echo(f"{name}: FAILED (its results could not be summarised: {error}); see {job_dir}")
        else:
            entry.update(status="failed", exit=code)
            echo(f"{name}: FAILED (exit {code}); see {job_dir / 'output.log'}")
        write_json(out / RESULTS, results)
        if progress:
            progress.advance(overall)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_json(out / RESULTS, results)
    return results


def median_range(values):
    """``(median, low, high)`` of the values that are not None; ``(None, None, None)`` if none are.

    Example:
        >>> median_range([3.0, None, 1.0, 2.0])
        (2.0, 1.0, 3.0)
    """
    values = [v for v in values if v is not None]
    if not values:
        return None, None, None
    return float(np.median(values)), float(min(values)), float(max(values))
