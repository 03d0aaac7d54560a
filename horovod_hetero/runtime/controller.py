"""The per-rank driver shared by the torch wrapper and the Keras callbacks: rounds and membership.

The adapters only say "a local step happened" and provide ``Collectives``, a ``Model`` and their
``Gradients``; the controller measures the step, asks the strategy for a ``Decision`` and carries it out
(an averaging round, a group average), opens and closes the strategy's transports and records telemetry.
How the strategy's kind runs (what a step does with the gradients, what a round carries, what
``sync_model()`` does, how rounds combine the models) is its runner's (``runtime.runner``); every rank's
speed is ``speeds`` (``runtime.speeds``), which the samplers read; a simulated straggler is a step hook the
adapter gives (``step_hooks``); a wait-avoiding group exchange learns of every change of the model from the
``model_changed`` event. It imports no framework and knows no particular strategy, nor any kind.
"""
from __future__ import annotations

import importlib
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from horovod_hetero.errors import CollectiveTimeoutError, RankLostError
from horovod_hetero.runtime.aggregator import Aggregator
from horovod_hetero.runtime.events import ModelChanged, ModelEvents
from horovod_hetero.runtime.runner import Gradients, Runner, check_aggregate, runner_for
from horovod_hetero.runtime.seams import Collectives, Model, failure_seen, scaled
from horovod_hetero.runtime.rounds import RoundProtocol, check_counters
from horovod_hetero.runtime.speeds import Speeds
from horovod_hetero.runtime.telemetry import Telemetry
from horovod_hetero.strategies.aggregation import Aggregation
from horovod_hetero.strategies.base import (AVERAGE, MEASURE, MEASURE_OVERLAPPED, MEASURES, Context, GroupAverage,
                                            RoundResult, StepReport, Strategy, check_decision, check_kind)
from horovod_hetero.strategies.registry import rebuild
from horovod_hetero.runtime.strategy_transports import Transports

#: ``hook(compute_s, step, samples) -> seconds``: what an adapter runs after each step's compute (a simulated
#: straggler's pad, ``runtime.straggler.Slowdown.pad``); the seconds it returns count as the step's compute
StepHook = Callable[[float, int, "int | None"], float]


log = logging.getLogger("horovod_hetero")


def import_ahead(modules: Sequence[str]) -> threading.Thread | None:
    """Import those of ``modules`` not imported yet in a daemon thread (``Strategy.imports``): the first
    decision that needs them then finds them imported, instead of holding every rank for the import
    while the job waits (SciPy's optimizer: 0.4 s of a core). A module that fails to import is left to
    the code that needs it, which raises the error then. The thread, or None where nothing is missing.

    Example:
        >>> import_ahead(["json"]) is None          # imported already
        True
    """
    missing = [name for name in modules if name not in sys.modules]
    if not missing:
        return None

    def run() -> None:
        for name in missing:
            try:
                importlib.import_module(name)
            except Exception:                       # noqa: BLE001 - raised again where it is needed
                log.debug("importing %s ahead failed", name, exc_info=True)

    thread = threading.Thread(target=run, name="horovod_hetero-import-ahead", daemon=True)
    thread.start()
    return thread


def ring_bytes(payload_bytes: int, size: int) -> int:
    """Bytes one rank sends in a ring allreduce of ``payload_bytes``: 2(n-1)/n of the payload."""
    return int(2 * (size - 1) * payload_bytes / size) if size > 1 else 0


#: What a survivor is told to do about a lost rank (``rank_lost_error``'s ``advice``)
RESTART = "Every rank stops; restart from a checkpoint, or train under hvd.elastic.run"


def rank_lost_error(error: BaseException, doing: str, round_: int, step: int, rank: int,
                    lost: Mapping[int, str], advice: str = RESTART) -> RankLostError:
    """The ``RankLostError`` that replaces ``error`` (a failed or timed-out collective; a
    ``CollectiveTimeoutError`` keeps its class) on a surviving rank.

    Args:
        error: what the collective raised (the new error's ``__cause__`` is set by ``raise ... from``).
        doing: the collective, e.g. ``"model averaging round"``.
        round_, step: the round and step it belonged to.
        rank: this rank.
        lost: ``{rank: "died" | "stopped"}`` as this host sees them (``Collectives.lost_ranks``).
        advice: what every survivor does now (``RESTART``).

    Example:
        >>> str(rank_lost_error(OSError("peer gone"), "model averaging round", 3, 12, 0, {1: "died"}))[:88]
        'model averaging round (round 3, step 12) failed on rank 0: a rank was lost (rank 1 died)'
    """
    if lost:
        what = "a rank was lost (" + ", ".join(f"rank {r} {state}" for r, state in sorted(lost.items())) + ")"
    elif isinstance(error, CollectiveTimeoutError):     # its message says what to check
        what = "no rank of this host was lost: a rank on another host was lost, or a rank waits elsewhere"
    else:
        what = "a rank was lost (which rank is not known here)"
    failure_seen.set()
    kind = type(error) if isinstance(error, RankLostError) else RankLostError
    return kind(f"{doing} (round {round_}, step {step}) failed on rank {rank}: {what}. {advice}. Cause: "
                f"{type(error).__name__}: {error_summary(error)}")


def error_summary(error: BaseException) -> str:
    """The line of ``error``'s message that says what happened: the first one that is neither indented
    nor a heading ending in ``:`` (TensorFlow's ``Graph execution error:`` and the stack of the op
    come before Horovod's own line), else the first line, else the class name.

    Example:
        >>> error_summary(RuntimeError("Graph execution error:\\n\\n  File x.py\\nHorovod has been shut down.\\n"
        ...                            "\\t [[{{node a}}]]"))
        'Horovod has been shut down.'
    """
    lines = [line for line in str(error).splitlines() if line.strip()]
    said = [line for line in lines if not line[0].isspace() and not line.rstrip().endswith(":")]
    return (said or lines or [type(error).__name__])[0].strip()


class NoGradients:
    """The ``Gradients`` of a controller whose adapter runs no gradient allreduce itself (the tests' fakes):
    it records what the runner asked (``opened``: ``None`` closed, else the weight, ``True`` for none)."""

    def __init__(self) -> None:
        self.opened: Callable[[], float] | bool | None = None

    def open(self, weight: Callable[[], float] | None) -> None:
        self.opened = True if weight is None else weight

    def close(self) -> None:
        self.opened = None

    def join(self) -> int | None:
        return None


class HeteroController:
    """Runs a strategy on one rank: its rounds and the ranks' membership in them.

    Args:
        strategy: a ``ModelAveraging`` or ``GradientAveraging`` strategy; its counters are part of ``state_dict()``.
        collectives: the framework's ``Collectives`` (rank and size of the synchronising set).
        model: the ``Model`` averaged by rounds and group averages.
        telemetry: a ``Telemetry``, a directory, or ``None`` (``HOROVOD_HETERO_TELEMETRY``).
        step_hooks: ``StepHook``s run after each step's compute (the adapter's simulated straggler).
        clock: injected for tests.
        aggregate: how a model-averaging strategy's global rounds combine the models (an ``Aggregation``:
            ``Mean(...)``, ``Normalized(...)``), or ``None``: their mean; kept across ``set_strategy`` for the
            model-averaging strategies that follow.
        gradients: the adapter's ``Gradients`` (the gradient allreduce its runner opens or closes); default
            ``NoGradients()``.
        batches_planned: the adapter hands every rank a batch its strategy plans (``Context.batches_planned``).
        handover_at_rounds: a strategy may hand over (``Strategy.handover``) at any global round; ``False``: at a
            sync, or at a global round of a lockstep strategy on batches the adapter does not plan, where every
            rank is at the same batch (the Keras callback: ranks may take different numbers of batches within an
            epoch, and a planned epoch holds its plan's batches).

    Lifecycle: ``start()`` opens the strategy's transports (the torch wrapper calls it at the first step,
    Keras in ``on_train_begin``); ``sync()`` brings every rank to identical models and the same round, as the
    strategy's kind does it, and closes them (``sync_model()``, ``on_train_end``); a step after it starts
    again. ``set_strategy(new)`` at such a sync point runs another strategy from the next step on.
    """

    def __init__(self, strategy: Strategy, collectives: Collectives, model: Model,
                 telemetry: Telemetry | str | os.PathLike[str] | None = None, step_hooks: Sequence[StepHook] = (),
                 clock: Callable[[], float] = time.perf_counter, aggregate: Aggregation | None = None,
                 gradients: Gradients | None = None, batches_planned: bool = False,
                 handover_at_rounds: bool = True) -> None:
        self.collectives, self.model = collectives, model
        self.size, self.rank = collectives.size, collectives.rank
        self.aggregate = check_aggregate(aggregate, strategy)
        self.gradients: Gradients = NoGradients() if gradients is None else gradients
        self.batches_planned, self.handover_at_rounds = bool(batches_planned), bool(handover_at_rounds)
        self.runner = self._runner(strategy)
        self.runner.begin(self.gradients, self.rank, self.size)     # the gradient allreduce opened or closed
        self.protocol = RoundProtocol(self._average, self.size, self.rank, policy=self.runner)
        self.telemetry = telemetry if isinstance(telemetry, Telemetry) else Telemetry(self.rank, telemetry)
        self.step_hooks = list(step_hooks)
        #: every rank's speed as the rounds measured it (the samplers read it)
        self.speeds = Speeds(self.size)
        #: every change of the model the next step starts from (a wait-avoiding group exchange serves it)
        self.model_changed = ModelEvents()
        self.transports: Transports | None = None
        self._clock = clock
        self._left = False
        # every rank has joined since this rank left (a join's last round): its group responder may serve
        # what it collects later (this rank steps again); before that, what it serves is never collected
        self._all_joined = True
        self._extra_comm = 0.0
        self._carried_comm = 0.0       # the latest round's or group average's seconds: the next step's statistics
        self._round_t = clock()        # when the latest round began (a round carries the wall seconds since)
        self._plan_s = 0.0             # the strategy's bookkeeping after the latest round (telemetry)
        self._t_last = clock()
        self._resumed = False          # the next step is the first after a sync (its time is not a step's)
        self._started = False          # the first start() takes the set's first rank's counters
        self._session = ""             # this controller's (its first start's collectives' session: Context.session)
        self._activity: str | None = None  # the collective this rank is in (names it if a rank is lost)
        self._overlapped: Callable[[], RoundResult] | None = None   # a round of statistics begun at the latest step

    def _runner(self, strategy: Strategy) -> Runner:
        check_kind(strategy)
        strategy.check_size(self.size)
        return runner_for(strategy, self.aggregate, self.collectives.copy)

    @property
    def strategy(self) -> Strategy:
        """The strategy this controller runs (``set_strategy`` changes it)."""
        return self.runner.strategy

    @property
    def aggregator(self) -> Aggregator | None:
        """The runner's combination of a global round's models, if not their plain mean."""
        return self.runner.aggregator

    @property
    def step_times(self) -> npt.NDArray[np.float64] | None:
        """Every rank's seconds per step, from the rounds (``speeds``: its median over the recent ones)."""
        return self.speeds.step_times

    @property
    def steps_seen(self) -> npt.NDArray[np.int64]:
        return self.speeds.steps_seen

    @property
    def speeds_measured(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None:
        return self.speeds.measured

    # -- lifecycle --

    def start(self) -> None:
        """Open the strategy's transports (a collective on every rank); a no-op once started.

        The first start (and the first after ``set_strategy``) also gives every rank the counters of the
        set's first rank (one object broadcast): ranks that resumed from different checkpoints, or joined an
        elastic job with fresh counters, then count rounds and steps alike."""
        if self.transports is not None:
            return
        t0 = self._clock()
        self._activity = "the start of the strategy (object broadcasts)"
        if not self._started:
            self.collectives.know_peers()
            counters, session = self.collectives.broadcast_object(
                (self.state_dict(), secrets.token_hex(4)), what="the broadcast of the strategy's counters")
            self.load_state_dict(counters)
            self.collectives.session = f".{session}"       # this controller's collectives' names (Collectives)
            self._session = self._session or self.collectives.session
            self._started = True
        transports = Transports(self.rank, self.size, self.collectives, self.model_changed)
        try:
            self.strategy.start(Context(self.rank, self.size, transports, self.collectives, self._clock,
                                        self.batches_planned, self._session, self.speeds.known()))
        except BaseException:
            transports.close()                 # a half-opened strategy stays closed; the next step retries
            raise
        self.transports = transports
        import_ahead(self.strategy.imports)
        if self._left:                         # a restart after a sync: serve peers with weight 0 until this
            self._all_joined = True            # rank steps again, as before the restart; its step takes what
            self._changed()                    # was served (never runs a served tag again: a peer would not)
        self._initial_round()
        # opening waits for every rank to get here (start-up, imports): neither a step's compute
        # nor its communication, so telemetry leaves it out
        self._t_last += self._clock() - t0
        self._activity = None

    def rank_lost(self, error: BaseException, advice: str = RESTART) -> RankLostError:
        """The ``RankLostError`` a survivor raises when ``error`` (a failed or timed-out collective)
        interrupted this rank: it names the collective, the round, the step and the lost rank where
        this host sees it (``Collectives.lost_ranks``), and what to do (``advice``)."""
        doing = self._activity or self.runner.doing(self.strategy.step + 1)
        return rank_lost_error(error, doing, self.protocol.round, self.strategy.step + 1, self.rank,
                               self.collectives.lost_ranks(), advice)

    def _initial_round(self) -> None:
        """With rounds on changes (``aggregator``), average the initial models once (w_0, the same on
        every rank, broadcast or not); deferred to the first step if the model has no weights yet (Keras)."""
        aggregator = self.aggregator
        if aggregator is not None and not aggregator.ready and self.model.tensors():
            self.protocol.run_round()
            aggregator.begin(self.model.tensors())

    def sync(self) -> int | None:
        """Bring every rank to identical models and the same round, as the strategy's kind does it
        (``Runner.sync``: the rounds' join, or ``hvd.join`` and a broadcast), and close the transports;
        return the rank whose integer state every rank should take (``None``: the set's first)."""
        self.start()
        try:
            self._collect_round()
            root = self.runner.sync(self, self.gradients)
        finally:
            self.close()
        self._resumed = True
        self._hand_over()                      # a sync is a point where every rank holds the same model
        return root

    def finish(self) -> int:
        """Join rounds until every rank has joined (all then hold identical tensors); close the transports."""
        try:
            return self.join()
        finally:
            self.close()

    def adopt(self, root: int, counters: bool = False) -> None:
        """Every rank takes the model of ``root`` (one broadcast per tensor), and with ``counters`` its
        strategy's counters too (an object broadcast): the end of ``hvd.join``, where ``root`` joined last."""
        t0 = self._clock()
        self._activity = "sync_model's broadcast of the model"
        self.model.assign(self.collectives.broadcast(self.model.tensors(), root, name="horovod_hetero.sync",
                                                     what="sync_model's broadcast of the model"))
        if counters:
            self.load_state_dict(self.collectives.broadcast_object(
                self.state_dict(), root=root, what="sync_model's broadcast of the counters"))
        self._activity = None
        self.add_comm(self._clock() - t0)

    def close(self) -> None:
        """Close what the strategy opened (idempotent); the next step opens it again. A round of statistics
        still under way is left to Horovod (a new controller after ``hvd.elastic``'s reset names its own)."""
        self._overlapped = None
        if self.transports is not None:
            self.transports.close()
            self.transports = None

    def set_strategy(self, strategy: Strategy) -> None:
        """Run ``strategy`` from the next step on. Every rank calls it at the same point, where every rank
        holds the same model and round (after ``sync()``; an adapter's ``set_strategy`` syncs first). The new
        strategy takes the old one's step count, and at its first start every rank takes the set's first
        rank's counters (one object broadcast); its runner opens or closes the gradient allreduce now."""
        if self.transports is not None:
            raise RuntimeError("set_strategy() between sync_model() and the next step: every rank then holds the "
                               "same model and round (the adapters' set_strategy syncs first)")
        runner, previous = self._runner(strategy), self.runner
        strategy.take_over(previous.strategy.step)
        self._use(runner)
        self.speeds.restart()                  # its steps may differ (Balanced's batches): measured afresh

    def _use(self, runner: Runner) -> None:
        """Carry out ``runner``'s kind from the next step on: the gradient allreduce opened or closed, the rounds'
        policy its, and at the next start every rank takes the set's first rank's counters."""
        previous = self.runner
        self.runner = runner                   # what the gradients name, if they cannot follow
        try:
            runner.begin(self.gradients, self.rank, self.size)
        except BaseException:
            self.runner = previous
            raise
        self.protocol.policy = runner
        self._started = False

    # -- steps and decisions --

    def after_step(self, comm_s: float = 0.0, bytes_sent: int = 0) -> bool:
        """Account for one local optimizer step and carry out the strategy's decision.

        ``comm_s``/``bytes_sent``: communication the adapter did itself during the step
        (the gradient allreduce of a gradient-averaging strategy). Returns True if an averaging round ran.
        """
        self.start()
        self._initial_round()
        now = self._clock()
        compute = max(0.0, now - self._t_last - comm_s)
        pending = self.telemetry.pending
        for hook in self.step_hooks:
            compute += hook(compute, self.strategy.step + 1, pending.get("samples"))
        report = StepReport(compute, pending.get("loss"), pending.get("samples"))
        local_steps = self.protocol.steps_since_round + 1
        # the first step after a sync also timed what ran between the two (an epoch's end: evaluation, checkpoints,
        # the next epoch's data): the rounds' step times leave it out (a rank's speed is its steps')
        timed, self._resumed = not self._resumed, False
        self.protocol.local_step(compute if timed else None, report.loss, report.samples,
                                 comm_s + self._extra_comm + self._carried_comm)
        self._carried_comm = 0.0
        t0 = self._clock()
        if self._left:                                  # training again after a join
            self._left = False
            self._changed()
        fields = self._collect_round()                 # the round of statistics begun at the previous step
        met = bool(fields)                              # a global round ended at this step
        decision = check_decision(self.strategy, self.strategy.after_step(report))
        if decision is AVERAGE:
            fields, met = self._round_fields(self._round()), True
            bytes_sent += ring_bytes(self.model.nbytes, self.size)
        elif decision is MEASURE_OVERLAPPED and self.collectives.overlaps:
            self._begin_round()
        elif decision in MEASURES:
            fields, met = self._round_fields(self._round(measure=True)), True
        elif isinstance(decision, GroupAverage):
            fields = self._group_average(decision)
            bytes_sent += ring_bytes(self.model.nbytes, len(decision.group))
        self._carried_comm = self._clock() - t0
        comm_s += self._carried_comm
        self.telemetry.record(step=self.strategy.step, local_steps=local_steps, compute_s=compute,
                              comm_s=comm_s + self._extra_comm, bytes_sent=bytes_sent, synced=decision is AVERAGE,
                              **fields, **self.strategy.telemetry_fields())
        if met and (self.handover_at_rounds or (self.runner.lockstep and not self.batches_planned)):
            self._hand_over()
        self._extra_comm = 0.0
        self._t_last = self._clock()
        self._activity = None
        return decision is AVERAGE

    def add_comm(self, seconds: float) -> None:
        """Count communication the adapter did outside a step (e.g. a broadcast in sync_model)."""
        self._extra_comm += seconds

    def _measure(self, weight: float, control: list[float]) -> list[float]:
        """A round's collective that carries the control vector alone (``MEASURE``: the statistics)."""
        tensors = self.model.tensors()
        self._activity = "statistics round"
        _, control = self.collectives.allreduce_sum([], control, name="horovod_hetero.measure",
                                                    what="statistics round", like=tensors[0] if tensors else None)
        return control

    def _average(self, weight: float, control: list[float]) -> list[float]:
        """The round protocol's fused collective: the weighted mean sum(w_i x_i) / sum(w_i) over all
        ranks, or, with rounds on changes, the ``aggregator``'s combination of every rank's change."""
        tensors, agg = self.model.tensors(), self.aggregator
        self._activity = "model averaging round"
        if agg is None or not agg.ready:
            summed, control = self.collectives.allreduce_sum(scaled(tensors, weight), control,
                                                             name="horovod_hetero.average",
                                                             what="model averaging round", inplace=True)
            if control[0] > 0:
                self.model.assign(summed, control[0])
            return control
        changes, extra = agg.contribution(tensors, weight, self.protocol.steps_since_round,
                                          self.protocol.samples_since_round)
        summed, control = self.collectives.allreduce_sum(changes, control + extra, name="horovod_hetero.average",
                                                         what="model averaging round", inplace=True)
        head = len(control) - len(extra)
        self.model.assign(agg.combine(summed, control[head:]))
        agg.begin(self.model.tensors())
        return control[:head]

    def _begin_round(self) -> None:
        """Begin a round of statistics whose result the next step collects (``MEASURE_OVERLAPPED``): the
        collectives start its sum (torch: with the next step's gradient allreduce, ``Collectives.start_sum``)."""
        tensors = self.model.tensors()
        began = self._clock()

        def start(control: list[float]) -> Callable[[], list[float]]:
            return self.collectives.start_sum(control, name="horovod_hetero.measure", what="statistics round",
                                              like=tensors[0] if tensors else None)
        self._activity = "statistics round"
        self._overlapped = self.protocol.begin_round(start, wall_s=began - self._round_t)
        self._round_t = began

    def _collect_round(self, tell: bool = True) -> dict[str, Any]:
        """Wait for the round of statistics begun at an earlier step, if any, and hand its result to the strategy
        and the speeds (``tell``; else only wait for it); return its telemetry fields (``{}``: none)."""
        wait, self._overlapped = self._overlapped, None
        if wait is None:
            return {}
        self._activity = "statistics round"
        result = wait()
        self._activity = None
        if not tell:
            return {}
        self._after_round(result)
        return self._round_fields(result)

    def _round(self, done: bool = False, measure: bool = False) -> RoundResult:
        began = self._clock()          # the wall seconds from one round's start to the next: its cost included
        result = self.protocol.run_round(done, average=self._measure if measure else None,
                                         wall_s=began - self._round_t)
        self._round_t = began
        self._after_round(result)
        return result

    def _hand_over(self) -> None:
        """After a global round, where every rank holds the same model and round: if the strategy hands over
        to another (``Strategy.handover``, e.g. ``Auto`` changing the strategy it runs), close what it opened
        and run the other from the next step on (its runner chosen again: the kind may have changed)."""
        successor = self.strategy.handover()
        if successor is not None:
            self._collect_round(tell=False)    # statistics of the strategy it leaves: the successor measures afresh
            self.close()
            self.set_strategy(successor)

    def _after_round(self, result: RoundResult) -> None:
        if result.stats is not None:
            self.speeds.record(result.stats)
        t0 = self._clock()
        self.strategy.after_round(result)
        self._plan_s = self._clock() - t0
        self._all_joined = result.done >= self.size
        self._changed()

    def _round_fields(self, result: RoundResult) -> dict[str, Any]:
        assert result.stats is not None                 # the round protocol's results carry them
        fields = {"round": result.round, "ranks": result.stats.as_dict(), "plan_s": self._plan_s}
        if self.strategy.plan is not None:
            fields["plan"] = list(self.strategy.plan.steps)
        return fields

    def _group_average(self, decision: GroupAverage) -> dict[str, Any]:
        assert self.transports is not None              # after_step started them
        groups = self.transports.groups
        if groups is None or self.rank not in decision.group:
            raise RuntimeError(f"{type(self.strategy).__name__} answered {decision!r} on rank {self.rank}: a "
                               f"group average needs groups opened in on_start (ctx.transports.open_groups) "
                               f"and this rank in the group")
        t0 = self._clock()
        self._activity = f"group average {decision.tag} over ranks {list(decision.group)}"
        result = groups.average(decision.tag, decision.group, self.model.tensors())
        if result.stale:           # Algorithm 2, line 13: 1/(S+1) (W_sum + W')
            self.model.assign(result.summed, result.total_weight + 1.0, add_current=True)
        else:                      # line 11: 1/S W_sum
            self.model.assign(result.summed, result.total_weight)
        self._changed()
        return {"group": list(decision.group), "stale": result.stale, "group_s": self._clock() - t0}

    def _changed(self) -> None:
        """Tell ``model_changed``'s subscribers that the model the next step starts from, or this rank's part
        in training, changed: after a round, a group average, a join and a restart after one, and the first
        step after a join."""
        self.model_changed.emit(ModelChanged(lambda: self.collectives.copy(self.model.tensors()), self._left,
                                             self._all_joined))

    def join(self) -> int:
        """Join rounds until every rank has joined; all ranks then hold identical tensors."""
        self.start()
        self._collect_round()
        t0 = self._clock()
        self._left, self._all_joined = True, False
        self.strategy.leave()
        self._changed()
        rounds = self.protocol.join(on_round=self._after_round)
        self._activity = None
        self.add_comm(self._clock() - t0)
        self._t_last = self._clock()
        return rounds

    def state_dict(self) -> dict[str, Any]:
        """The strategy's counters (with what rebuilds it: ``Strategy.state_dict``), the round number and,
        with rounds on changes, ``"aggregation"``: the round's start ``w_t`` and the outer momentum (the
        tensors themselves; a checkpoint or ``torch.save`` copies them)."""
        state: dict[str, Any] = {"strategy": self.strategy.state_dict(), "rounds": self.protocol.state_dict()}
        aggregator = self.aggregator
        if aggregator is not None and aggregator.ready:
            state["aggregation"] = aggregator.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Counters from a checkpoint or from another rank (``broadcast_optimizer_state``), and the
        aggregation state where it has one (put on the model's device); where it has none, with rounds
        on changes, the model now held is taken as the latest round's (it was just loaded or
        broadcast, like the counters). A state of another strategy (saved after ``set_strategy``) first
        switches to it (``strategies.registry.rebuild``), as every rank that loads it does; a strategy that runs
        another (``hh.Auto``) and now runs one of another kind gets that kind's runner."""
        check_state(state)
        self._collect_round(tell=False)        # under way: its name is used again by the next one
        if state["strategy"].get("kind") != type(self.strategy).__name__:
            self.close()
            self.set_strategy(rebuild(state["strategy"]))
        self.strategy.load_state_dict(state["strategy"])
        runner = self._runner(self.strategy)
        if type(runner) is not type(self.runner):      # it runs another kind now (hh.Auto's state): carry that out
            self.close()
            self._use(runner)
        self.protocol.load_state_dict(state["rounds"])
        aggregator = self.aggregator
        if aggregator is not None:
            if state.get("aggregation") is not None:
                aggregator.load_state_dict(state["aggregation"], self.model.place)
            elif aggregator.ready:
                aggregator.begin(self.model.tensors())


def check_state(state: object) -> None:
    """Raise ``ValueError`` unless ``state`` has the shape of a controller's ``state_dict()``."""
    if not isinstance(state, dict) or not {"strategy", "rounds"} <= state.keys():
        raise ValueError(f"state must be a dict with 'strategy' and 'rounds' (from state_dict()), got {state!r}")
    if not isinstance(state["rounds"], dict):
        raise ValueError(f"state['rounds'] must be a dict (from state_dict()), got {state['rounds']!r}")
    check_counters(state["rounds"])


class OutsideController:
    """The controller of a rank outside the synchronising process set: it steps locally and
    synchronises nothing, as Horovod's ``DistributedOptimizer`` does on a non-member rank.

    Args:
        strategy: the strategy the members run (kept for ``opt.strategy``; never started here).
        rank: this rank's global rank (names the telemetry file).
        telemetry: as ``HeteroController``'s.
    """

    model = step_times = speeds_measured = steps_seen = collectives = rank = size = transports = None

    def __init__(self, strategy: Strategy, rank: int,
                 telemetry: Telemetry | str | os.PathLike[str] | None = None) -> None:
        self.runner = runner_for(strategy)      # never begun: this rank's gradients stay its own
        self.telemetry = telemetry if isinstance(telemetry, Telemetry) else Telemetry(rank, telemetry)

    @property
    def strategy(self) -> Strategy:
        return self.runner.strategy

    def set_strategy(self, strategy: Strategy) -> None:
        self.runner = runner_for(strategy)

    def sync(self) -> None:
        """Nothing to synchronise: ``None`` (no rank's integer state to take)."""
        return None

    def after_step(self, comm_s: float = 0.0, bytes_sent: int = 0) -> bool:
        return False

    def start(self) -> None:
        """Nothing to open, nothing to join (the same no-ops as ``finish``, ``join``, ``close``)."""

    finish = join = close = start

    def add_comm(self, seconds: float) -> None:
        pass

    def rank_lost(self, error: BaseException, advice: str = RESTART) -> None:
        """None: ``error`` goes through as raised (this rank is in no collective of the strategy)."""
        return None

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: object) -> None:
        pass
