"""What the checkout's example scripts share (``examples/`` at its top level; ``horovod-hetero demo`` and
``bench`` run ``torch_digits.py`` and ``keras_digits.py``)::

    horovodrun -np 4 -H localhost:4 --gloo python examples/torch_digits.py --strategy esync
    horovodrun -np 4 -H localhost:4 --gloo python examples/keras_digits.py --strategy localsgd

Both take the same strategy options (``add_strategy_arguments``: ``--strategy`` of
``strategies.registry.REGISTRY`` and every strategy's options) and build the same strategy objects
(``build_strategy``, ``build``: each class its own options, ``BENCH``'s flags mapping an option to the keyword
it gives) and aggregation (``aggregation``): the torch example hands them to
``hh.DistributedOptimizer``, the Keras one to ``hh.callbacks.HeteroSyncCallback``. Both take the same task and evaluation options
(``add_run_arguments``: ``--task`` of ``horovod_hetero_lab.data.TASKS``, ``--split``, ``--curve``, ``--eval-interval``,
...) and record rank 0's evaluation curve with the same ``Curve`` (what ``horovod-hetero bench`` reads).
"""
import contextlib
import json
import os
import sys
import time

import numpy as np

import inspect

from horovod_hetero import strategies
from horovod_hetero.strategies.registry import REGISTRY, configured
from horovod_hetero_lab.data import TASKS

#: the options ``add_strategy_arguments`` adds that go to the strategy's class (each class takes its own:
#: ``build``); ``--aggregate`` and the outer optimiser's go beside it (``aggregation``)
STRATEGY_OPTIONS = ("period", "warmup_steps", "mode", "group_size", "lookahead", "staleness",
                    "check_period", "search_every", "rebalance_every")

#: the lab's own view of the registered strategies: name -> (bench's row label, the keyword arguments bench,
#: demo and the report run it with, ``{keyword: the examples' option that gives it}`` where that option is
#: not named as the keyword: WAGMA's ``sync_period`` comes from ``--period``, as LocalSGD's ``period``). A
#: registered strategy without an entry runs with its class's name as label and no option of its own.
BENCH = {
    "sync": ("Synchronous", {}, {}),
    "localsgd": ("LocalSGD(8)", {"period": 8}, {}),
    "esync": ("ESync", {}, {}),
    "wagma": ("WAGMA(S=2,8)", {"sync_period": 8}, {"sync_period": "period"}),
    "elasticbsp": ("ElasticBSP(15)", {"lookahead": 15}, {}),
    "dssp": ("DSSP(3,15)", {"staleness": (3, 15)}, {}),
    "adsp": ("ADSP(10steps)", {"check_period": "10steps"}, {}),
    "balanced": ("Balanced(5)", {"rebalance_every": 5}, {}),
    "auto": ("Auto", {}, {}),
}


def bench_entry(name):
    """``(label, options, flags)`` of the registered strategy ``name`` (``BENCH``'s entry, else its class's name,
    no options, no flags); an unknown name is a ``ValueError`` naming the choices.

    Example:
        >>> bench_entry("dssp")
        ('DSSP(3,15)', {'staleness': (3, 15)}, {})
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(REGISTRY)}")
    return BENCH.get(name) or (REGISTRY[name].cls.__name__, {}, {})


def bench_label(name):
    """Bench's row label of the strategy ``name``.

    Example:
        >>> bench_label("wagma")
        'WAGMA(S=2,8)'
    """
    return bench_entry(name)[0]


def bench_options(name):
    """The examples' command-line options that build ``name`` as bench runs it.

    Example:
        >>> bench_options("wagma")
        ['--strategy', 'wagma', '--period', '8']
    """
    _, options, flags = bench_entry(name)
    out = ["--strategy", name]
    for key, value in options.items():
        values = value if isinstance(value, (tuple, list)) else (value,)
        out += [f"--{flags.get(key, key).replace('_', '-')}", *map(str, values)]
    return out


def bench_strategy(name):
    """The strategy ``name`` as bench runs it (its ``BENCH`` options; without: the registry's defaults), which the
    bench simulates beside the measured job.

    Example:
        >>> bench_strategy("adsp").label
        'ADSP(10steps)'
    """
    return configured(name, **bench_entry(name)[1])


def build(name, **options):
    """The strategy ``name`` with those of ``options`` its class takes: by keyword, else from the option
    ``BENCH``'s flags name; the others are ignored, so one set of options serves every strategy. A keyword
    none of them gives is the registry's default (``registry.configured``), else the class's.

    Example:
        >>> build("wagma", period=4, lookahead=3).label        # each class takes its own options
        'WAGMA(S=auto,4)'
    """
    flags = bench_entry(name)[2]
    kwargs = {}
    for key in inspect.signature(REGISTRY[name].cls).parameters:
        source = key if key in options else flags.get(key)
        if source in options:
            kwargs[key] = options[source]
    return configured(name, **kwargs)


def aggregation(args):
    """The ``aggregate=`` given beside a model-averaging strategy (``hh.Mean(...)``, ``hh.Normalized(...)``),
    from ``--aggregate``, ``--outer-lr``, ``--outer-momentum`` and ``--nesterov``; ``None``: plain averaging."""
    outer = None
    if args.outer_lr != 1.0 or args.outer_momentum or args.nesterov:
        outer = strategies.OuterSGD(lr=args.outer_lr, momentum=args.outer_momentum, nesterov=args.nesterov)
    aggregate = strategies.AGGREGATES[args.aggregate](outer)
    return None if aggregate.plain else aggregate


def add_strategy_arguments(parser):
    """The options that choose and configure a strategy, on an ``argparse`` parser."""
    parser.add_argument("--strategy", choices=list(REGISTRY), default="localsgd")
    parser.add_argument("--period", type=int, default=8, help="LocalSGD period, WAGMA sync_period")
    parser.add_argument("--warmup-steps", type=int, default=0, help="LocalSGD steps averaged each")
    parser.add_argument("--mode", choices=["blocking", "delayed_ack"], default="blocking", help="ESync mode")
    parser.add_argument("--group-size", type=int, default=None, help="WAGMA group size (default: nearest sqrt(P))")
    parser.add_argument("--lookahead", type=int, default=15, help="ElasticBSP lookahead R")
    parser.add_argument("--staleness", type=int, nargs=2, default=(3, 15), metavar=("LOW", "HIGH"), help="DSSP bounds")
    parser.add_argument("--check-period", default="10steps", help="ADSP check period: 10steps (of the slowest worker) or 4s")
    parser.add_argument("--search-every", default=None, help="ADSP search epoch, in the check period's unit")
    parser.add_argument("--rebalance-every", type=int, default=20, help="Balanced: steps between batch plans")
    parser.add_argument("--aggregate", choices=list(strategies.AGGREGATES), default="mean",
                        help="how global rounds combine models (model-averaging strategies)")
    parser.add_argument("--outer-lr", type=float, default=1.0, help="OuterSGD lr of global rounds (1: plain)")
    parser.add_argument("--outer-momentum", type=float, default=0.0, help="OuterSGD momentum")
    parser.add_argument("--nesterov", action="store_true", help="OuterSGD with Nesterov momentum")


def build_strategy(args):
    """The strategy ``args`` (parsed with ``add_strategy_arguments``) name, with its options."""
    options = {key: getattr(args, key) for key in STRATEGY_OPTIONS}
    options["staleness"] = tuple(options["staleness"])
    return build(args.strategy, **options)


def add_run_arguments(parser):
    """The task, training-length and evaluation options both examples take."""
    parser.add_argument("--task", choices=list(TASKS), default="digits", help="what to train (horovod_hetero_lab.data.TASKS)")
    parser.add_argument("--split", default=None,
                        help="how the training data is sharded: iid, skew, dirichlet:ALPHA or plays (default: the task's)")
    parser.add_argument("--skew", type=float, default=0.8, help="skew split: share of a shard drawn from its own classes")
    parser.add_argument("--seed", type=int, default=0, help="model initialisation and shuffling seed")
    parser.add_argument("--epochs", type=int, default=40, help="(with --time-budget: at most)")
    parser.add_argument("--time-budget", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: the task's)")
    parser.add_argument("--result", default=None, help="rank 0 writes a JSON summary here")
    parser.add_argument("--curve", default=None, help="rank 0 writes its evaluation curve here (JSON lines)")
    parser.add_argument("--eval-interval", type=float, default=0.5,
                        help="seconds at least between two snapshots of the curve")


def write_result(result, task, final, path=None):
    """Rank 0's summary of a run: ``result`` with every class's final score (``final["classes"]``, for a
    classification task), printed as one JSON line and written to ``path`` (``--result``) if given."""
    if task.classes:
        result["classes"] = final["classes"]
    print(json.dumps(result), flush=True)
    if path:
        with open(path, "w") as f:
            json.dump(result, f)


def curve_subset(task, y_test, per_class=200):
    """Indices of the test samples the curve's points are evaluated on: for Fashion-MNIST the first
    ``per_class`` of each class (2,000 of the 10,000; the final quality takes all), else every one."""
    if task.dataset != "fashion-mnist":
        return np.arange(len(y_test))
    y_test = np.asarray(y_test)
    return np.sort(np.concatenate([np.flatnonzero(y_test == c)[:per_class] for c in range(task.classes)]))


class Curve:
    """Rank 0's evaluation curve: the test quality against training time and local steps.

    ``after_step(step, averaged)`` takes a snapshot of the model when it was just averaged over every
    rank (``averaged``: the strategy averages gradients every step, or the step's telemetry record says
    ``synced``: a global round ran), at most once per ``interval`` seconds; ``final(step)`` adds the model
    every rank ends with. The snapshots are evaluated after training (``evaluate_all``), so evaluating
    costs the training nothing (a snapshot is a copy of the weights) and a strategy with local models
    is judged by its averaged model, never by a rank's drifted replica. Each point is a JSON line
    ``{"t", "step", metric, "classes" (per-class accuracy, for classification), "final"}``; ``t`` counts
    from ``begin()`` (after the common start barrier) and leaves out the time the snapshots took.

    With ``stop_at``, training ends once the quality is reached: a snapshot taken at least
    ``check_interval`` seconds after the last one checked is evaluated when it is taken, and the first
    that reaches ``stop_at`` sets ``reached`` and creates the file ``stop_file``, which every rank watches
    (``stop_requested``; the ranks share one file system, as the bench's do on one host). The other
    snapshots are still evaluated after training, so the curve keeps every ``interval``'s point. While
    rank 0 checks, the file ``stop_file + ".eval"`` exists and every other rank waits at its next
    ``stop_requested``: the check is left out of every rank's clock (``clock()``), and no rank trains
    meanwhile (a strategy that lets ranks run ahead would otherwise gain the check's seconds for free).

    Args:
        path: the JSON-lines file, or ``None`` (no curve: every call is a no-op; ranks other than 0).
        interval: seconds at least between two snapshots, a number >= 0.
        snapshot: a function returning a copy of the model's weights.
        evaluate: ``evaluate(weights) -> {metric: value, ...}`` (the curve's test set).
        metric: the quality's name in the records (``accuracy``, ``distance``, ``bpc``).
        stop_at: ``None``, or ``(quality, reached)``: the quality that ends training and
            ``reached(value, quality) -> bool`` (``data.Task.reached``).
        stop_file: the file that tells every rank to stop (needed with ``stop_at``); rank 0's curve
            removes an earlier run's (and its ``.eval`` file) when it is made.
        check_interval: with ``stop_at``, seconds at least between two checks during training, a
            number >= 0 (default ``interval``: every snapshot is checked).

    Example:
        >>> c = Curve(None, 0.5, lambda: [1.0], lambda w: {"accuracy": 1.0}, "accuracy")
        >>> c.begin(); c.after_step(1, True); c.evaluate_all(); c.points
        []
    """

    #: seconds another rank waits at most for rank 0's check (then it goes on, and says so)
    PAUSE_TIMEOUT_S = 300.0

    def __init__(self, path, interval, snapshot, evaluate, metric, stop_at=None, stop_file=None,
                 check_interval=None):
        self.path, self.interval, self.metric = path, interval, metric
        self.snapshot, self.evaluate = snapshot, evaluate
        self.points, self.eval_s, self._start, self._last = [], 0.0, 0.0, float("-inf")
        self._pending = []
        self.snapshot_s = 0.0
        if stop_at is not None and stop_file is None:
            raise ValueError("stop_file: a path is needed with stop_at")
        if check_interval is not None and not check_interval >= 0:
            raise ValueError(f"check_interval: seconds >= 0 or None, got {check_interval!r}")
        self.check_interval = interval if check_interval is None else check_interval
        self.stop_at, self.stop_file, self.reached = stop_at, stop_file, False
        self.pause_file = "" if stop_file is None else f"{stop_file}.eval"      # "": no checks
        self._checked = float("-inf")
        if path is not None and stop_file is not None:
            for earlier in (stop_file, self.pause_file):       # an earlier run's
                if os.path.exists(earlier):
                    os.remove(earlier)

    def begin(self):
        self._start = time.perf_counter()

    def after_step(self, step, averaged):
        if self.path is not None and averaged and time.perf_counter() - self._last >= self.interval:
            self._take(step, final=False)

    def final(self, step):
        if self.path is not None:
            self._take(step, final=True)

    def _take(self, step, final):
        t0 = time.perf_counter()
        weights = self.snapshot()
        self._last = time.perf_counter()
        entry = [t0 - self._start - self.snapshot_s, step, weights, final, None]
        self._pending.append(entry)
        if (self.stop_at is not None and not self.reached and not final
                and t0 - self._checked >= self.check_interval):
            self._checked = t0
            self._check(entry)                  # now, to know whether to stop (its time left out of t)
            self._last = time.perf_counter()
        self.snapshot_s += self._last - t0

    def _check(self, entry):
        """Evaluate the snapshot just taken while the other ranks wait; stop if it reaches the quality."""
        with open(self.pause_file, "w"):
            pass
        try:
            t0 = time.perf_counter()
            entry[4] = self.evaluate(entry[2])
            self.eval_s += time.perf_counter() - t0
            quality, reached = self.stop_at
            if reached(entry[4][self.metric], quality):
                self.reached = True
                with open(self.stop_file, "w") as f:
                    f.write(f"{entry[0]}\n")
        finally:
            os.remove(self.pause_file)

    def clock(self):
        """Seconds on the curve's clock: since ``begin()``, less the time left out of it: the snapshots
        (and their checks, with ``stop_at``), and on another rank its waits for rank 0's checks."""
        return time.perf_counter() - self._start - self.snapshot_s

    def stop_requested(self):
        """Whether training should end here: the target was reached (on rank 0, or by its file elsewhere).
        Another rank first waits while rank 0 checks a snapshot (its ``.eval`` file)."""
        if self.stop_file is None:
            return False
        if self.path is None and os.path.exists(self.pause_file):
            t0 = time.perf_counter()
            while os.path.exists(self.pause_file) and time.perf_counter() - t0 < self.PAUSE_TIMEOUT_S:
                time.sleep(0.002)
            if os.path.exists(self.pause_file):
                print(f"[curve] rank 0's check still runs after {self.PAUSE_TIMEOUT_S:.0f} s: going on",
                      file=sys.stderr, flush=True)
            self.snapshot_s += time.perf_counter() - t0
        if not self.reached and os.path.exists(self.stop_file):
            self.reached = True
        return self.reached

    def evaluate_all(self):
        """Evaluate every snapshot not checked yet, and write the points in order (after training)."""
        t0 = time.perf_counter()
        with open(self.path, "a") if self.path is not None else contextlib.nullcontext() as f:
            for t, step, weights, final, checked in self._pending:
                point = {"t": t, "step": step, **(checked or self.evaluate(weights)), "final": final}
                self.points.append(point)
                if f is not None:
                    f.write(json.dumps(point) + "\n")
        self._pending = []
        self.eval_s += time.perf_counter() - t0
