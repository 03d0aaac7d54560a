"""Runnable examples, shipped with the package (``horovod-hetero demo`` runs ``torch_digits``)::

    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.torch_digits --strategy esync
    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.keras_digits --strategy localsgd

Both take the same strategy options (``add_strategy_arguments``) and build the same strategy objects
(``build_strategy``): the torch example hands it to ``hh.DistributedOptimizer``, the Keras one to
``hh.callbacks.HeteroSyncCallback``. Both take the same task and evaluation options
(``add_run_arguments``: ``--task`` of ``horovod_hetero.data.TASKS``, ``--curve``, ``--eval-interval``, ...)
and record rank 0's evaluation curve with the same ``Curve`` (what ``horovod-hetero bench`` reads).
"""
import json
import time

from horovod_hetero import strategies
from horovod_hetero.data import TASKS


#: ``--strategy`` name -> the strategy, from the parsed options (``build_strategy``); one table for the
#: examples' choices and ``horovod-hetero bench``'s strategies.
BUILDERS = {
    "sync": lambda args: strategies.Synchronous(),
    "localsgd": lambda args: strategies.LocalSGD(period=args.period, warmup_steps=args.warmup_steps),
    "esync": lambda args: strategies.ESync(global_lr=args.global_lr, mode=args.mode),
    "wagma": lambda args: strategies.WAGMA(group_size=args.group_size, sync_period=args.period),
    "elasticbsp": lambda args: strategies.ElasticBSP(lookahead=args.lookahead),
    "dssp": lambda args: strategies.DSSP(staleness=tuple(args.staleness)),
    "adsp": lambda args: strategies.ADSP(check_period=args.check_period, search_every=args.search_every),
}


def add_strategy_arguments(parser):
    """The options that choose and configure a strategy, on an ``argparse`` parser."""
    parser.add_argument("--strategy", choices=list(BUILDERS), default="localsgd")
    parser.add_argument("--period", type=int, default=8, help="LocalSGD period, WAGMA sync_period")
    parser.add_argument("--warmup-steps", type=int, default=0, help="LocalSGD steps averaged each")
    parser.add_argument("--mode", choices=["blocking", "delayed_ack"], default="blocking", help="ESync mode")
    parser.add_argument("--global-lr", type=float, default=1.0, help="ESync global step size")
    parser.add_argument("--group-size", type=int, default=None, help="WAGMA group size (default: nearest sqrt(P))")
    parser.add_argument("--lookahead", type=int, default=15, help="ElasticBSP lookahead R")
    parser.add_argument("--staleness", type=int, nargs=2, default=(3, 15), metavar=("LOW", "HIGH"), help="DSSP bounds")
    parser.add_argument("--check-period", default="10steps", help="ADSP check period: 10steps (of the slowest worker) or 4s")
    parser.add_argument("--search-every", default=None, help="ADSP search epoch, in the check period's unit")


def build_strategy(args):
    """The strategy ``args`` (parsed with ``add_strategy_arguments``) name."""
    return BUILDERS[args.strategy](args)


def add_run_arguments(parser):
    """The task, training-length and evaluation options both examples take."""
    parser.add_argument("--task", choices=list(TASKS), default="digits", help="what to train (horovod_hetero.data.TASKS)")
    parser.add_argument("--skew", type=float, default=0.8, help="non-iid tasks: share of a shard drawn from its own classes")
    parser.add_argument("--seed", type=int, default=0, help="model initialisation and shuffling seed")
    parser.add_argument("--epochs", type=int, default=40, help="(with --time-budget: at most)")
    parser.add_argument("--time-budget", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--result", default=None, help="rank 0 writes a JSON summary here")
    parser.add_argument("--curve", default=None, help="rank 0 writes its evaluation curve here (JSON lines)")
    parser.add_argument("--eval-interval", type=float, default=0.5,
                        help="seconds at least between two evaluations of the curve")


class Curve:
    """Rank 0's evaluation curve: the test quality against training time and local steps.

    ``after_step(step, averaged)`` evaluates when this rank's model was just averaged over every
    rank (``averaged``: the strategy averages gradients every step, or the step's telemetry record
    says ``synced``: a global round ran), at most once per ``interval`` seconds; ``final(step)`` adds
    the model every rank ends with. So a strategy with local models is judged by its averaged model,
    never by a rank's drifted replica. Each point is a JSON line ``{"t", "step", metric, "eval_s",
    "final"}``; ``t`` counts from ``begin()`` (after the common start barrier) and leaves out the time
    spent evaluating (a few ms for these tasks; other ranks may wait for it at the next round).

    Args:
        path: the JSON-lines file, or ``None`` (no curve: every call is a no-op; ranks other than 0).
        interval: seconds at least between two evaluations, a number >= 0.
        evaluate: a function returning the model's test quality (a float).
        metric: the quality's name in the records (``accuracy``, ``distance``).

    Example:
        >>> c = Curve(None, 0.5, lambda: 1.0, "accuracy")
        >>> c.begin(); c.after_step(1, True); c.points
        []
    """

    def __init__(self, path, interval, evaluate, metric):
        self.path, self.interval, self.evaluate, self.metric = path, interval, evaluate, metric
        self.points, self.eval_s, self._start, self._last = [], 0.0, None, float("-inf")

    def begin(self):
        self._start = time.perf_counter()

    def after_step(self, step, averaged):
        if self.path is not None and averaged and time.perf_counter() - self._last >= self.interval:
            self._point(step, final=False)

    def final(self, step):
        if self.path is not None:
            self._point(step, final=True)

    def _point(self, step, final):
        t0 = time.perf_counter()
        value = float(self.evaluate())
        self._last = time.perf_counter()
        spent = self._last - t0
        point = {"t": t0 - self._start - self.eval_s, "step": step, self.metric: value, "eval_s": spent,
                 "final": final}
        self.eval_s += spent
        self.points.append(point)
        with open(self.path, "a") as f:
            f.write(json.dumps(point) + "\n")
