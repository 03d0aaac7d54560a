"""The per-rank driver shared by the torch wrapper and the Keras callbacks.

The adapters only say "a local step happened" and provide ``Collectives`` and a ``Model``; the
controller measures the step, asks the strategy for a ``Decision``, carries it out (an averaging
round, a group average), opens and closes the strategy's transports, simulates slowdown and
records telemetry. It imports no framework and knows no particular strategy.
"""
from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from horovod_hetero.errors import CollectiveTimeoutError, RankLostError
from horovod_hetero.rules.partition import latest_step_times
from horovod_hetero.runtime.aggregator import Aggregator
from horovod_hetero.runtime.seams import Collectives, Model, failure_seen, scaled
from horovod_hetero.runtime.rounds import RoundProtocol, check_counters
from horovod_hetero.runtime.straggler import Slowdown, SlowdownFactors
from horovod_hetero.runtime.telemetry import Telemetry
from horovod_hetero.strategies.aggregation import Aggregation, check_aggregate
from horovod_hetero.strategies.base import (AVERAGE, MEASURE, Context, GradientAveraging, GroupAverage,
                                            RoundResult, StepReport, Strategy, check_decision, check_kind)
from horovod_hetero.runtime.strategy_transports import Transports


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


class HeteroController:
    """Runs a strategy on one rank.

    Args:
        strategy: a ``ModelAveraging`` or ``GradientAveraging`` strategy; its counters are part of ``state_dict()``.
        collectives: the framework's ``Collectives`` (rank and size of the synchronising set).
        model: the ``Model`` averaged by rounds and group averages.
        telemetry: a ``Telemetry``, a directory, or ``None`` (``HOROVOD_HETERO_TELEMETRY``).
        slowdown: a ``Slowdown``, factors (``"1,1,1,4"`` or a list), or ``None``
            (``HOROVOD_HETERO_SLOWDOWN``).
        clock: injected for tests.
        aggregate: how the strategy's global rounds combine the models (an ``Aggregation``: ``Mean(...)``,
            ``Normalized(...)``), or ``None``: their mean; applied here, with the runtime's ``Aggregator``.

    Lifecycle: ``start()`` opens the strategy's transports (the torch wrapper calls it when it is
    built, Keras in ``on_train_begin``); ``finish()`` joins the other ranks' rounds until all are
    done and closes them (``sync_model()``, ``on_train_end``); a step after ``finish()`` starts again.
    """

    def __init__(self, strategy: Strategy, collectives: Collectives, model: Model,
                 telemetry: Telemetry | str | os.PathLike[str] | None = None,
                 slowdown: Slowdown | SlowdownFactors | None = None,
                 clock: Callable[[], float] = time.perf_counter, aggregate: Aggregation | None = None) -> None:
        self.strategy = check_kind(strategy)
        self.collectives, self.model = collectives, model
        self.size, self.rank = collectives.size, collectives.rank
        strategy.check_size(self.size)
        # a gradient-averaging strategy's rounds measure, with each rank's median step (one stall does not
        # move its plan), and it ends in hvd.join, which answers the others' rounds with zeros
        gradients = isinstance(strategy, GradientAveraging)
        self.protocol = RoundProtocol(self._average, self.size, self.rank, median=gradients, absent_zeros=gradients)
        self.telemetry = telemetry if isinstance(telemetry, Telemetry) else Telemetry(self.rank, telemetry)
        self.slowdown = slowdown if isinstance(slowdown, Slowdown) else Slowdown(self.rank, slowdown, size=self.size)
        self.transports: Transports | None = None
        self._clock = clock
        # rounds on changes (aggregate=Normalized(), an outer optimiser): w_t and the outer momentum
        aggregate = check_aggregate(aggregate, strategy)
        self.aggregator = None if aggregate is None else Aggregator(aggregate, collectives.copy)
        self._left = False
        # every rank has joined since this rank left (a join's last round): its group responder may serve
        # what it collects later (this rank steps again); before that, what it serves is never collected
        self._all_joined = True
        self._extra_comm = 0.0
        self._plan_s = 0.0             # the strategy's bookkeeping after the latest round (telemetry)
        # every rank's latest seconds per step, from the rounds (samplers)
        self.step_times: npt.NDArray[np.float64] | None = None
        # every rank's local steps over the rounds; they and the step times at the second round that
        # measured every rank (the first holds the start-up: a rank's first step counts from the
        # optimizer's construction); a sampler that began an epoch before then splits what is left
        self.steps_seen: npt.NDArray[np.int64] = np.zeros(self.size, dtype=np.int64)
        self.speeds_measured: tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None = None
        self._measured_rounds = 0
        self._t_last = clock()
        self._started = False          # the first start() takes the set's first rank's counters
        self._activity: str | None = None  # the collective this rank is in (names it if a rank is lost)

    # -- lifecycle --

    def start(self) -> None:
        """Open the strategy's transports (a collective on every rank); a no-op once started.

        The first start also gives every rank the counters of the set's first rank (one object
        broadcast): ranks that resumed from different checkpoints, or joined an elastic job with
        fresh counters, then count rounds and steps alike."""
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
            self._started = True
        transports = Transports(self.rank, self.size, self.collectives)
        try:
            self.strategy.start(Context(self.rank, self.size, transports,
                                        self.collectives, self._clock))
        except BaseException:
            transports.close()                 # a half-opened strategy stays closed; the next step retries
            raise
        self.transports = transports
        if self._left:                         # a restart after finish(): serve peers with weight 0 until this
            self._all_joined = True            # rank steps again, as before the restart; its step takes what
            self._serve()                      # was served (never runs a served tag again: a peer would not)
        self._initial_round()
        # opening waits for every rank to get here (start-up, imports): neither a step's compute
        # nor its communication, so telemetry leaves it out
        self._t_last += self._clock() - t0
        self._activity = None

    def rank_lost(self, error: BaseException, advice: str = RESTART) -> RankLostError:
        """The ``RankLostError`` a survivor raises when ``error`` (a failed or timed-out collective)
        interrupted this rank: it names the collective, the round, the step and the lost rank where
        this host sees it (``Collectives.lost_ranks``), and what to do (``advice``)."""
        doing = self._activity or (f"the gradient allreduce of step {self.strategy.step + 1}"
                                   if isinstance(self.strategy, GradientAveraging) else f"step {self.strategy.step + 1}")
        return rank_lost_error(error, doing, self.protocol.round, self.strategy.step + 1, self.rank,
                               self.collectives.lost_ranks(), advice)

    def _initial_round(self) -> None:
        """With rounds on changes (``aggregator``), average the initial models once (w_0, the same on
        every rank, broadcast or not); deferred to the first step if the model has no weights yet (Keras)."""
        if self.aggregator is not None and not self.aggregator.ready and self.model.tensors():
            self.protocol.run_round()
            self.aggregator.begin(self.model.tensors())

    def finish(self) -> int:
        """Join rounds until every rank has joined (all then hold identical tensors); close the transports."""
        try:
            return self.join()
        finally:
            self.close()

    def close(self) -> None:
        """Close what the strategy opened (idempotent); the next step opens it again."""
        if self.transports is not None:
            self.transports.close()
            self.transports = None

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
        compute += self.slowdown.pad(compute, step=self.strategy.step + 1, samples=pending.get("samples"))
        report = StepReport(compute, pending.get("loss"), pending.get("samples"))
        local_steps = self.protocol.steps_since_round + 1
        self.protocol.local_step(compute, report.loss, report.samples)
        t0 = self._clock()
        if self._left:                                  # training again after a join
            self._left = False
            self._serve()
        decision = check_decision(self.strategy, self.strategy.after_step(report))
        fields: dict[str, Any] = {}
        if decision is AVERAGE:
            fields = self._round_fields(self._round())
            bytes_sent += ring_bytes(self.model.nbytes, self.size)
        elif decision is MEASURE:
            fields = self._round_fields(self._round(measure=True))
        elif isinstance(decision, GroupAverage):
            fields = self._group_average(decision)
            bytes_sent += ring_bytes(self.model.nbytes, len(decision.group))
        comm_s += self._clock() - t0
        self.telemetry.record(step=self.strategy.step, local_steps=local_steps, compute_s=compute,
                              comm_s=comm_s + self._extra_comm, bytes_sent=bytes_sent, synced=decision is AVERAGE,
                              **fields, **self.strategy.telemetry_fields())
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

    def _round(self, done: bool = False, measure: bool = False) -> RoundResult:
        result = self.protocol.run_round(done, average=self._measure if measure else None)
        self._after_round(result)
        return result

    def _after_round(self, result: RoundResult) -> None:
        if result.stats is not None:
            self.step_times = latest_step_times(self.step_times, result.stats.step_s)
            self.steps_seen = self.steps_seen + result.stats.local_steps
            if self.speeds_measured is None and np.isfinite(result.stats.step_s).all():
                self._measured_rounds += 1
                if self._measured_rounds == 2:
                    self.speeds_measured = (self.steps_seen, self.step_times)
        t0 = self._clock()
        self.strategy.after_round(result)
        self._plan_s = self._clock() - t0
        self._all_joined = result.done >= self.size
        self._serve()

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
        self._serve()
        return {"group": list(decision.group), "stale": result.stale, "group_s": self._clock() - t0}

    def _serve(self) -> None:
        """Hand the model the next step starts from to a wait-avoiding group responder, if any, after
        every change of the model or of this rank's part in training: weight 1 while it steps, 0 once it
        left (a join); what the responder serves is collected by this rank's next group average unless it
        left and not every rank has joined yet (``GroupExchange.publish``)."""
        groups = self.transports.groups if self.transports is not None else None
        if groups is not None and groups.serves:
            groups.publish(self.collectives.copy(self.model.tensors()), 0.0 if self._left else 1.0,
                           collects=not self._left or self._all_joined)

    def join(self) -> int:
        """Join rounds until every rank has joined; all ranks then hold identical tensors."""
        self.start()
        t0 = self._clock()
        self._left, self._all_joined = True, False
        self.strategy.leave()
        self._serve()
        rounds = self.protocol.join(on_round=self._after_round)
        self._activity = None
        self.add_comm(self._clock() - t0)
        self._t_last = self._clock()
        return rounds

    def state_dict(self) -> dict[str, Any]:
        """The strategy's counters, the round number and, with rounds on changes, ``"aggregation"``:
        the round's start ``w_t`` and the outer momentum (the tensors themselves; a checkpoint or
        ``torch.save`` copies them)."""
        state: dict[str, Any] = {"strategy": self.strategy.state_dict(), "rounds": self.protocol.state_dict()}
        if self.aggregator is not None and self.aggregator.ready:
            state["aggregation"] = self.aggregator.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Counters from a checkpoint or from another rank (``broadcast_optimizer_state``), and the
        aggregation state where it has one (put on the model's device); where it has none, with rounds
        on changes, the model now held is taken as the latest round's (it was just loaded or
        broadcast, like the counters)."""
        check_state(state)
        self.strategy.load_state_dict(state["strategy"])
        self.protocol.load_state_dict(state["rounds"])
        if self.aggregator is not None:
            if state.get("aggregation") is not None:
                self.aggregator.load_state_dict(state["aggregation"], self.model.place)
            elif self.aggregator.ready:
                self.aggregator.begin(self.model.tensors())


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

    model = step_times = collectives = rank = size = None

    def __init__(self, strategy: Strategy, rank: int,
                 telemetry: Telemetry | str | os.PathLike[str] | None = None) -> None:
        self.strategy = strategy
        self.telemetry = telemetry if isinstance(telemetry, Telemetry) else Telemetry(rank, telemetry)

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
