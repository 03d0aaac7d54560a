"""The strategy contract: what a synchronisation strategy is given, told, and answers.

A strategy owns the *schedule* of synchronisation on one rank; the runtime
(``horovod_hetero.runtime.controller``) owns everything else: the model, the collectives, the
transports, timing, telemetry. The runtime

1. starts the strategy with a ``Context``: rank, size, a clock, the object collectives and the
   ``transports`` it may open (ESync's state server, WAGMA's responders). What it opens, the
   runtime closes when training ends;
2. reports every local step (``StepReport``: compute seconds, loss and samples when known) to
   ``after_step``, which answers a ``Decision``: ``CONTINUE``, ``AVERAGE`` (a global averaging
   round now), ``MEASURE`` (a round of statistics now; ``MEASURE_OVERLAPPED``: its result at the next step)
   or ``GroupAverage(group, tag)`` (average within a group of ranks now);
3. hands it every round's ``RoundResult`` (``after_round``), which holds every rank's step
   statistics since the previous round, identical on every rank; the strategy may answer with a
   ``Plan``: how many local steps each rank runs before the next round (the runtime then runs the
   round when this rank's count is reached);
4. calls ``leave()`` when this rank stops stepping (it only joins other ranks' rounds from then on).

Strategies come in two kinds, each a base class of its own, and the runtime carries out each kind
on one path chosen by type: ``ModelAveraging`` (every rank steps with its own gradients; the
strategy's rounds average the models: ``AVERAGE``, ``GroupAverage``) and ``GradientAveraging``
(Horovod allreduces the gradients every step; rounds only ``MEASURE``), with ``GradientWeighting``
for the gradient strategies that weigh each rank's gradient and plan its batch (``Balanced``).

A strategy writes its schedule by overriding the hooks ``on_start(ctx)``, ``decide(report)``,
``on_round(result)``, ``on_leave()`` (and ``check_size(size)`` to refuse a size when it is built); the template methods above do the common bookkeeping (the step
counter, plans). Counters go into ``state_dict()`` so a resumed run keeps its phase. Nothing here
touches tensors, sockets or threads: the same objects run under ``horovodrun`` and in the simulator.
"""
from __future__ import annotations

import abc
import inspect
import math
import operator
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from horovod_hetero.validation import check_int, check_removed

_T = TypeVar("_T")


# --- what the strategy is given ------------------------------------------------------------------

@runtime_checkable
class StateService(Protocol):
    """ESync's state-server client as a strategy uses it: ``transports.StateClient`` over TCP, and the
    simulator's in-process one over the same ``rules.esync_state.ESyncState``."""

    last_rtt: float | None
    slowest: bool

    def query(self, k: int, capability: float | None, round: int) -> bool: ...

    def send_query(self, k: int, capability: float | None, round: int) -> int: ...

    def poll(self, wait_s: float = 0.0) -> list[dict[str, Any]]: ...

    def reset(self, round: int) -> None: ...

    def leave(self) -> None: ...

    def enter(self, round: int) -> None: ...


@runtime_checkable
class StrategyTransports(Protocol):
    """What a strategy may open (``Context.transports``): ``runtime.strategy_transports.Transports`` under
    Horovod, the simulator's in-process ones on its virtual clock. The runtime closes what was opened."""

    def state_service(self, *, epsilon: float, overshoot: float, timeout: float,
                      address: str | None = None) -> StateService: ...

    def open_groups(self, rank_lists: Sequence[Sequence[int]], init_call: str, *, wait_avoiding: bool,
                    patience: float, timeout: float) -> object: ...

    def groups_available(self, rank_lists: Sequence[Sequence[int]]) -> bool: ...


@runtime_checkable
class ObjectCollectives(Protocol):
    """Object collectives over the ranks (``Context.collectives``; ``runtime.seams.Collectives``)."""

    def broadcast_object(self, obj: Any, *, what: str, root: int | None = None) -> Any: ...

    def allgather_object(self, obj: Any, *, what: str) -> list[Any]: ...


@dataclass(frozen=True)
class Context:
    """What a strategy is given when it starts.

    Attributes:
        rank, size: this rank and the number of ranks synchronising.
        transports: opens the transports a strategy may use (a ``StrategyTransports``: ``state_service``,
            ``open_groups``); the runtime closes them.
        collectives: ``broadcast_object``/``allgather_object`` over the ranks (an ``ObjectCollectives``),
            or ``None`` where there are none (the simulator).
        clock: seconds, monotonic (a virtual clock in the simulator).
        batches_planned: the adapter can hand every rank the batch a strategy plans for it (a batch sampler
            bound to the torch wrapper, Keras' ``epoch_plan``): a strategy that plans batches can run.
        session: the controller's, the same on every rank; another after ``hvd.elastic``'s reset (where a new
            worker may have replaced a lost one), the same whenever this controller starts a strategy again
            (after ``sync_model()``, a switch, ``set_strategy``). Empty where there is none (the simulator).
        step_s: every rank's seconds per step as this controller's rounds have measured them (the same on
            every rank: ``runtime.speeds.Speeds`` once settled), or ``None`` where they have not yet (a job's
            start, a new controller after ``hvd.elastic``'s reset, the simulator): a strategy started again
            (after ``sync_model()``, at a switch) may plan its first round from them instead of measuring.
    """

    rank: int
    size: int
    transports: StrategyTransports
    collectives: ObjectCollectives | None = None
    clock: Callable[[], float] = time.perf_counter
    batches_planned: bool = False
    session: str = ""
    step_s: tuple[float, ...] | None = None


@dataclass(frozen=True)
class StepReport:
    """One local step as the runtime measured it.

    Attributes:
        step_s: seconds the step computed (simulated slowdown included, collectives excluded).
        loss: the training loss of the step, if the user or Keras reported it.
        samples: samples in the step's batch, if known.
    """

    step_s: float = 0.0
    loss: float | None = None
    samples: int | None = None


@dataclass(frozen=True)
class RoundStats:
    """Every rank's statistics since the previous round; travels inside the round's collective.

    Each attribute is an array indexed by rank, identical on every rank after the round.

    Attributes:
        local_steps: local steps since the previous round.
        step_s: mean compute seconds per step since the previous round (NaN: no step).
        loss: mean reported training loss since the previous round (NaN: none reported).
        samples: samples since the previous round (0: not reported).
        done: the rank has stopped stepping (it called ``sync_model()``).
        step_min: the shortest step since the previous round (NaN: no step): its steps without a delay.
        step_mean: the mean of its steps' seconds (NaN: no step; ``step_s`` is their median for a strategy that
            plans from the typical step).
        step_sq: the mean of its steps' squared seconds (NaN: no step): with ``step_min`` and ``step_mean``, how
            its steps vary (a rank delayed now and then).
        comm_s: mean seconds per step it spent in collectives since the previous round (a gradient
            allreduce, a group average, the previous round itself), the waits for slower ranks included.
        wall_s: wall-clock seconds of one round's period, its collective included (NaN: not measured): from the
            start of the previous round to the start of this one.
        (The last five are ``NaN`` everywhere where a caller builds the statistics without them.)
    """

    local_steps: np.ndarray
    step_s: np.ndarray
    loss: np.ndarray
    samples: np.ndarray
    done: np.ndarray
    # given or not, arrays after __post_init__ (NaN where not given)
    step_min: np.ndarray = field(default=None)  # type: ignore[arg-type]
    step_mean: np.ndarray = field(default=None)  # type: ignore[arg-type]
    step_sq: np.ndarray = field(default=None)  # type: ignore[arg-type]
    comm_s: np.ndarray = field(default=None)  # type: ignore[arg-type]
    wall_s: np.ndarray = field(default=None)  # type: ignore[arg-type]

    FIELDS = ("done", "local_steps", "step_s", "loss", "samples", "step_min", "step_mean", "step_sq", "comm_s",
              "wall_s")

    def __post_init__(self) -> None:
        for name in ("step_min", "step_mean", "step_sq", "comm_s", "wall_s"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.full(len(self.local_steps), np.nan))

    @classmethod
    def from_block(cls, block: npt.ArrayLike) -> RoundStats:
        """From the round's summed per-rank block, shape (size, len(FIELDS))."""
        block = np.asarray(block, dtype=np.float64)
        return cls(local_steps=np.rint(block[:, 1]).astype(np.int64), step_s=block[:, 2], loss=block[:, 3],
                   samples=np.rint(block[:, 4]).astype(np.int64), done=block[:, 0] > 0.5, step_min=block[:, 5],
                   step_mean=block[:, 6], step_sq=block[:, 7], comm_s=block[:, 8], wall_s=block[:, 9])

    def memo(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """``compute()``, once per ``key`` for these statistics (immutable; the simulator hands one
        object to every worker, so a plan that depends on them alone is computed once per round)."""
        cache = self.__dict__.setdefault("_memo", {})
        if key not in cache:
            cache[key] = compute()
        return cache[key]

    def as_dict(self) -> dict[str, list[Any]]:
        """Lists, for telemetry (NaN becomes None)."""
        clean = lambda a: [None if isinstance(v, float) and math.isnan(v) else v for v in a.tolist()]  # noqa: E731
        return {"local_steps": self.local_steps.tolist(), "step_s": clean(self.step_s),
                "loss": clean(self.loss), "samples": self.samples.tolist(), "done": self.done.tolist(),
                "step_min": clean(np.asarray(self.step_min)), "comm_s": clean(np.asarray(self.comm_s)),
                "wall_s": clean(np.asarray(self.wall_s))}


@dataclass(frozen=True)
class RoundResult:
    """What every rank learns from one averaging round.

    Attributes:
        round: the round's number (the same on every rank).
        weight: this rank's weight in the average (1: it stepped since the previous round).
        total_weight: the sum of all ranks' weights.
        done: how many ranks have stopped stepping.
        stats: every rank's ``RoundStats`` (``None`` only from protocol-level fakes).
    """

    round: int
    weight: float
    total_weight: float
    done: int
    stats: RoundStats | None = field(default=None, compare=False)


# --- what the strategy answers -------------------------------------------------------------------

class Decision:
    """What a strategy answers after a local step: ``CONTINUE``, ``AVERAGE`` or a ``GroupAverage``."""

    def __bool__(self) -> bool:
        raise TypeError(f"{self!r} is a Decision, not a bool: compare it with AVERAGE or CONTINUE, "
                        f"or use isinstance(decision, GroupAverage)")


class _Named(Decision):
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:                  # copy/deepcopy/pickle keep the singleton
        return self._name


#: Keep stepping locally.
CONTINUE = _Named("CONTINUE")
#: Run a global averaging round now (every rank enters it, in the same order).
AVERAGE = _Named("AVERAGE")
#: Run a round that carries every rank's statistics and averages nothing (every rank enters it, in the
#: same order): how a strategy whose gradients are averaged every step (``Balanced``) learns every
#: rank's speed, with the control vector alone in the collective.
MEASURE = _Named("MEASURE")
#: ``MEASURE`` whose result the strategy takes at the next step instead (``after_round`` runs then, before that
#: step's ``after_step``): where the framework can start a collective and go on (torch), the round's collective
#: goes with the next step's gradient allreduce and costs the ranks little wait; elsewhere (Keras) it is a
#: ``MEASURE``.
MEASURE_OVERLAPPED = _Named("MEASURE_OVERLAPPED")

#: the decisions that run a round of statistics
MEASURES = (MEASURE, MEASURE_OVERLAPPED)


def check_decision(strategy: object, decision: object) -> Decision:
    """``decision`` if it is one ``strategy.after_step`` may answer (``CONTINUE``, ``AVERAGE``,
    ``MEASURE``, ``MEASURE_OVERLAPPED`` or a ``GroupAverage``), else a ``TypeError`` naming the strategy: the
    runtime and the simulator carry out the same five.

    Example:
        >>> check_decision(object(), "AVERAGE")
        Traceback (most recent call last):
        ...
        TypeError: object.after_step answered 'AVERAGE'; a strategy answers CONTINUE, AVERAGE, MEASURE, MEASURE_OVERLAPPED or a GroupAverage
    """
    if isinstance(decision, Decision) and (decision is CONTINUE or decision is AVERAGE or decision in MEASURES
                                           or isinstance(decision, GroupAverage)):
        return decision
    raise TypeError(f"{type(strategy).__name__}.after_step answered {decision!r}; "
                    f"a strategy answers CONTINUE, AVERAGE, MEASURE, MEASURE_OVERLAPPED or a GroupAverage")


@dataclass(frozen=True)
class GroupAverage(Decision):
    """Average the model within ``group`` now (the members must answer the same ``tag``).

    Attributes:
        group: sorted ranks, this rank among them, at least two.
        tag: an int >= 0 naming this group average; every member uses the same one. A rank's tags
            grow, and after a round that every rank joined they continue above every tag any
            rank used before (WAGMA's ``t``).
    """

    group: tuple[int, ...]
    tag: int

    def __post_init__(self) -> None:
        try:
            group = tuple(map(operator.index, self.group))
        except TypeError:
            group = ()
        if len(group) < 2 or group[0] < 0 or not all(map(operator.lt, group, group[1:])):
            raise ValueError(f"group must be two or more distinct ranks (ints >= 0) in ascending order, "
                             f"got {self.group!r}")
        object.__setattr__(self, "group", group)
        check_int("tag", self.tag, 0)


@dataclass(frozen=True)
class Plan:
    """Local steps each rank runs before the next round (index: rank), identical on every rank.

    A strategy returns it from ``on_start``/``on_round``; ``Strategy.after_step`` answers ``AVERAGE``
    when this rank has taken ``steps[rank]`` local steps (or earlier, if ``decide`` does), whatever
    ``decide`` answered for that step. Plans are identical on every rank, so every rank overrides
    the same step.
    """

    steps: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(check_int("Plan.steps[i]", s, 1) for s in self.steps))


# --- the strategy --------------------------------------------------------------------------------

class Strategy(abc.ABC):
    """Base class of every strategy: the template methods the runtime calls, and the hooks.

    A strategy derives from one of the two kinds below, ``ModelAveraging`` or ``GradientAveraging``
    (``GradientWeighting``); the adapters and the runtime choose their path by that type.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Strategy:
        if kwargs:                                 # an argument removed in 0.2.0 is named with its replacement
            check_removed(cls.__name__, kwargs, inspect.signature(cls).parameters)
        strategy = super().__new__(cls)
        strategy._arguments = (args, kwargs)        # what ``config`` saves, to rebuild it from a state
        return strategy

    _arguments: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})

    def __init__(self) -> None:
        self.step = 0
        self.origin = 0                            # the step this strategy took over at (``take_over``)
        self.rank, self.size = 0, 1
        self.plan: Plan | None = None              # the latest Plan, if the strategy makes them
        self._plan_left: int | None = None         # local steps left before the planned round
        self._plan_done: int | None = None         # loaded: the saving rank's steps into its plan (``start``)

    # -- called by the runtime (template methods) --

    def take_over(self, step: int) -> None:
        """Run on from ``step``, the step count of the strategy this one replaces (``set_strategy``): the count
        goes on, and a schedule of this strategy's own counts from here (``origin``)."""
        self.step = self.origin = check_int("step", step, 0)

    def start(self, ctx: Context) -> None:
        """Start (or, after ``sync_model()``, restart) on this rank with a ``Context``."""
        self.rank, self.size, self.clock = ctx.rank, ctx.size, ctx.clock
        if self.plan is not None and len(self.plan.steps) != ctx.size:
            self.plan = self._plan_left = None    # planned for other ranks (an elastic resize, another job's checkpoint)
        elif self.plan is not None and self._plan_done is not None:   # another rank's counters: this rank's share
            self._plan_left = max(self.plan.steps[ctx.rank] - self._plan_done, 1)
        self._plan_done = None
        self._set_plan(self.on_start(ctx))

    def after_step(self, report: StepReport = StepReport()) -> Decision:
        """Count one local step and answer a ``Decision``."""
        self.step += 1
        self._plan_done = None                     # a load into a running strategy: counted from here on
        decision = self.decide(report)
        if self._plan_left is not None:
            self._plan_left -= 1
            if self._plan_left <= 0:
                return AVERAGE
        return decision

    def after_round(self, result: RoundResult) -> None:
        """An averaging round finished (``result`` is a ``RoundResult``, the same on every rank)."""
        self._plan_left = None
        self._set_plan(self.on_round(result))

    def leave(self) -> None:
        """This rank stopped stepping; it only joins the other ranks' rounds from now on."""
        self.on_leave()

    def _set_plan(self, plan: Plan | None) -> None:
        if plan is None:
            return
        if not isinstance(plan, Plan) or len(plan.steps) != self.size:
            raise TypeError(f"{type(self).__name__} must plan with a Plan of {self.size} step counts "
                            f"(one per rank), got {plan!r}")
        self.plan, self._plan_left = plan, plan.steps[self.rank]

    # -- the hooks a strategy overrides --

    #: Every rank takes the same local steps between rounds (a round at fixed step counts, or every step), so
    #: ranks are never given shares of an epoch by speed: a slower rank would only make the others wait at
    #: the next round, and a user's own collective per batch would lose its peers. A strategy whose rounds
    #: let fast ranks take more steps (ESync, ElasticBSP, ...) leaves it ``False``.
    lockstep = False
    #: Modules its decisions import on first use that take long to import (ADSP's curve fit: SciPy's optimizer,
    #: 0.4 s of a core): the runtime imports them in the background when the strategy starts, so that the
    #: decision that first needs them does not hold every rank.
    imports: tuple[str, ...] = ()

    def check_size(self, size: int) -> None:
        """Raise ``ValueError`` if the strategy cannot run on ``size`` ranks (called when an adapter
        is built, before anything opens: the torch wrapper opens at the first step)."""

    def on_start(self, ctx: Context) -> Plan | None:
        """Open what the strategy needs through ``ctx.transports``; may return a first ``Plan``."""

    def decide(self, report: StepReport) -> Decision:
        """The decision after local step ``self.step`` (already counted), from its ``StepReport``."""
        return CONTINUE

    def on_round(self, result: RoundResult) -> Plan | None:
        """Bookkeeping after a round; may return a ``Plan`` for the next one."""

    def on_leave(self) -> None:
        """This rank stopped stepping (e.g. tell a server not to wait for it)."""

    @property
    def runs(self) -> Strategy:
        """The strategy whose kind says how this one runs (``runtime.runner.runner_for``): itself, or for a
        strategy that runs others in turn (``Auto``) the one it runs now."""
        return self

    def handover(self) -> Strategy | None:
        """Asked by the runtime after every global round (``AVERAGE``, a round of statistics), where every rank
        holds the same model: a strategy to run from the next step on (it takes over the step count), or ``None`` to go
        on. Every rank must answer alike: decide from the rounds' statistics alone. ``Auto`` answers itself
        when it changes the strategy it runs (its kind may change)."""
        return None

    def telemetry_fields(self) -> dict[str, Any]:
        """Extra per-step telemetry (e.g. a state-server round trip)."""
        return {}

    @property
    def label(self) -> str:
        """A short name for tables (``LocalSGD(8)``, ``ESync [normalized]``)."""
        return type(self).__name__

    def config(self) -> dict[str, Any] | None:
        """The arguments this strategy was built with, as plain data (JSON: numbers, strings, lists), or
        ``None`` where one is not (a callable schedule): ``state_dict()`` carries it, so a checkpoint or an
        elastic reset after ``set_strategy`` rebuilds the strategy it holds (``strategies.registry.rebuild``).

        Example:
            >>> from horovod_hetero.strategies import DSSP, LocalSGD
            >>> DSSP((2, 8), tolerance=0.1).config(), LocalSGD(lambda step: 4).config()
            ({'args': [[2, 8]], 'kwargs': {'tolerance': 0.1}}, None)
        """
        return portable_config(*self._arguments)

    def state_dict(self) -> dict[str, Any]:
        """The counters. ``plan_done`` (this rank's steps into the current plan) lets a rank that loads
        another's state (a checkpoint of rank 0, an elastic reset) take its own share of a plan its
        ``on_start`` keeps (a strategy that returns ``None`` there; the planned strategies shipped plan
        afresh at every start): at a round's boundary, where ``sync_model()`` leaves every rank, each
        continues exactly as it would have."""
        done = self._plan_done                     # loaded, not started yet
        if done is None and self.plan is not None and self._plan_left is not None and self.rank < len(self.plan.steps):
            done = max(self.plan.steps[self.rank] - self._plan_left, 0)
        return {"kind": type(self).__name__, "config": self.config(), "step": self.step, "origin": self.origin,
                "plan": None if self.plan is None else list(self.plan.steps), "plan_left": self._plan_left,
                "plan_done": done}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") != type(self).__name__:
            raise ValueError(
                f"strategy state is for {state.get('kind')!r}, cannot load it into {type(self).__name__}")
        self.step = check_int("state['step']", state["step"], 0)
        self.origin = check_int("state['origin']", state.get("origin", 0), 0, self.step)
        plan = state.get("plan")
        self.plan = None if plan is None else Plan(tuple(plan))
        self._plan_left = state.get("plan_left")
        done = state.get("plan_done")
        self._plan_done = None if done is None else check_int("state['plan_done']", done, 0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def portable_config(args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{"args": [...], "kwargs": {...}}`` as JSON's plain data, or ``None`` where a value is not plain
    (``Strategy.config``)."""
    try:
        return {"args": _portable(list(args)), "kwargs": _portable(dict(kwargs))}
    except TypeError:
        return None


def _portable(value: Any) -> Any:
    """``value`` as JSON's plain data (tuples become lists), else a ``TypeError``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_portable(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _portable(v) for k, v in value.items()}
    raise TypeError(f"{value!r} is not plain data")


# --- the two kinds -------------------------------------------------------------------------------

class ModelAveraging(Strategy):
    """A strategy whose rounds average the models: every rank steps with its own gradients (the
    optimizer's local step), and ``decide``/plans answer ``AVERAGE`` or a ``GroupAverage`` when the
    models meet. The runtime packs the model into flat tensors and carries a round as one weighted
    allreduce of them (``runtime.rounds``); each round's statistics carry every rank's mean step time.
    How a global round combines the models is given beside the strategy, to the adapter
    (``aggregate=hh.Normalized(...)``, ``strategies.aggregation``), and applied by the runtime.

    Example:
        >>> class EveryFour(ModelAveraging):      # a toy strategy: average the models every 4 steps
        ...     def decide(self, report):
        ...         return AVERAGE if self.step % 4 == 0 else CONTINUE
        >>> s = EveryFour()
        >>> [s.after_step() for _ in range(4)][-1], s.label
        (AVERAGE, 'EveryFour')
    """


class GradientAveraging(Strategy):
    """A strategy whose gradients Horovod allreduces every step, as ``hvd.DistributedOptimizer``'s
    hooks do: no model is averaged here (``decide`` answers ``CONTINUE``, or ``MEASURE`` for a round
    that carries every rank's statistics and nothing else; their step time is each rank's median
    since the previous round, so one stall does not move a plan made from it). The ranks end in
    Horovod's ``hvd.join``, which answers the others' rounds with zeros; ``sync_model()`` broadcasts
    the model of the rank that joined last.

    Example:
        >>> class Plain(GradientAveraging):       # Synchronous, in effect
        ...     pass
        >>> Plain().after_step()
        CONTINUE
    """

    lockstep = True


class GradientWeighting(GradientAveraging):
    """A ``GradientAveraging`` strategy that plans every rank's batch and weighs its gradient by it:
    Horovod sums the gradients (``op=Sum``), each scaled first by ``gradient_weight`` (``Balanced``:
    the rank's share of the global batch), and the batches come from a sampler bound to the adapter
    (``hh.DistributedSampler``), which reports its batch through ``use_batch``.

    A subclass writes ``use_batch``, ``batch_sizes`` and ``gradient_weight`` (abstract: a class
    without them cannot be built).
    """

    @abc.abstractmethod
    def use_batch(self, batch_size: int, size: int) -> None:
        """The batch of the sampler bound to the adapter (``batch_size`` per rank, ``size`` ranks), which
        sets the global batch where the strategy was given none."""

    @abc.abstractmethod
    def batch_sizes(self, step: int, size: int | None = None) -> tuple[int, ...]:
        """Every rank's batch at local step ``step`` (1-based) on ``size`` ranks (default: the running ones)."""

    def batch_size(self, step: int) -> int:
        """This rank's batch at local step ``step`` (1-based)."""
        return self.batch_sizes(step)[self.rank]

    #: samples per step over every rank (``None`` until the bound sampler's batch gives it: ``use_batch``)
    global_batch: int | None = None

    def plan_windows(self, steps: int) -> None:
        """Plan the batches per window of ``steps`` steps from now on (Keras: one window an epoch, whose batch
        size ``fit`` fixes). A strategy with windows of its own overrides it."""

    @abc.abstractmethod
    def gradient_weight(self, rank: int, size: int) -> float:
        """The weight of ``rank`` (of ``size``) in the gradient sum of the step being computed (``step +
        1``; called before the strategy starts, by the first step's gradient hooks); the weights of all
        ranks sum to 1."""


def check_kind(strategy: object, what: str = "strategy") -> Strategy:
    """``strategy`` if it is an instance of one of the two kinds, else a ``TypeError`` naming them: the
    runtime, the simulator and the adapters carry out each kind on its own path.

    Example:
        >>> class Neither(Strategy):
        ...     pass
        >>> check_kind(Neither())
        Traceback (most recent call last):
        ...
        TypeError: strategy must derive from ModelAveraging or GradientAveraging (the runtime carries out each kind on its own path); got Neither()
    """
    if not isinstance(strategy, Strategy) or not isinstance(strategy.runs, (ModelAveraging, GradientAveraging)):
        raise TypeError(f"{what} must derive from ModelAveraging or GradientAveraging (the runtime carries out each "
                        f"kind on its own path); got {strategy!r}")
    return strategy
