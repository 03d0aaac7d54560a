"""ADSP: every rank commits at the same searched rate; fast ranks fill the time with local steps."""
from __future__ import annotations

import logging
import math
import numbers
import re
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from horovod_hetero.rules.commit_rate import CommitRateSearch, commit_period
from horovod_hetero.strategies.base import (
    AVERAGE, CONTINUE, Context, Decision, ModelAveraging, RoundResult, RoundStats, StepReport, portable_config)
from horovod_hetero.validation import check_float, check_int

log = logging.getLogger("horovod_hetero")


@dataclass(frozen=True)
class Steps:
    """A period counted in steps of the slowest rank (its latest mean step time, from the rounds).

    ``hh.ADSP(check_period=hh.Steps(10))`` is ``hh.ADSP(check_period="10steps")``.

    Example:
        >>> Steps(10)
        Steps(count=10)
    """

    count: int

    def __post_init__(self) -> None:
        check_int("Steps.count", self.count, 1)

    def __str__(self) -> str:
        return f"{self.count}steps"


def as_period(name: str, value: object) -> Steps | float:
    """Seconds (a finite number > 0) or ``Steps``; a string ``"200steps"`` (or ``"200 steps"``) is
    ``Steps(200)``, ``"60s"`` is 60 seconds. Anything else raises a ``TypeError``/``ValueError``
    naming ``name``.

    Example:
        >>> as_period("check_period", "8steps"), as_period("check_period", 60), as_period("check_period", "2.5s")
        (Steps(count=8), 60.0, 2.5)
    """
    accepted = "seconds (a number > 0, or a string such as '60s'), a step count such as '200steps', or hh.Steps(200)"
    if isinstance(value, Steps):
        return value
    if isinstance(value, str):
        steps = re.fullmatch(r"\s*(\d+)\s*steps?\s*", value)
        seconds = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*s\s*", value)
        if steps and int(steps.group(1)) >= 1:
            return Steps(int(steps.group(1)))
        if seconds and float(seconds.group(1)) > 0:
            return float(seconds.group(1))
        raise ValueError(f"{name} must be {accepted}, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {accepted}, got {value!r} ({type(value).__name__})")
    return check_float(name, value, 0.0, min_exclusive=True)


class ADSP(ModelAveraging):
    """ADSP: every rank commits at the same rate, searched online; fast ranks run more local steps.

    Hu, Wang and Wu, "Distributed Machine Learning through Heterogeneous Edge Systems" (AAAI 2020).
    The paper's workers push their accumulated update to a parameter server on a timer, Γ/ΔC - O_i
    seconds apart (Algorithm 2), so that every worker makes the same number of commits ΔC_target per
    check period Γ; a scheduler searches C_target online (Algorithm 1, ``rules.commit_rate``).

    On Horovod a commit is an averaging round that every rank enters (one fused allreduce of the
    model). Every rank's commit rate is the same, so every rank's timer fires for the same round:
    after a round a rank keeps taking local steps while its next step (the median of its latest
    step times) is predicted to end before its commit deadline, Γ/ΔC_target after the round minus
    its measured commit overhead O_i, then answers ``AVERAGE``. Fast ranks thus run more local steps
    per commit, and a round waits at most about one step of the slowest rank. O_i is this rank's
    time from round to round less the longest compute any rank did in it (the round's statistics):
    the round's own cost, not the wait for the slowest (a rank that waited would otherwise stop
    earlier each round and wait longer).

    The search runs on what every round carries, so every rank takes the same decisions with no
    extra message: the global loss of a round is the mean of the ranks' mean training losses since
    the previous one (NaN and infinite ones are skipped, with one warning), and the time axis is
    the sum over rounds of max(Γ/ΔC_target, the longest compute in the round). A trial of rate C
    runs whole check periods (C rounds each), enough for ``fit_points`` samples; it stops before a
    rate whose commit interval is shorter than the slowest rank's step (that worker could not keep
    it), and a trial without enough losses (none reported) keeps the rate it ran. A new search
    starts every ``search_every`` (the paper's epoch), from ΔC_target = 1. The first two rounds
    come after one step each: the first step holds start-up, not speed.

    Report the training loss each step: ``opt.report_loss(loss)`` (torch); Keras passes the batch
    logs' ``loss``. The telemetry of every step carries ``commit_rate`` (ΔC_target) and
    ``c_target`` (the commits every rank makes by the next checkpoint); a round's step also
    ``overhead_s`` (O_i), ``global_loss`` and, when a trial ends, ``search`` (candidate, fitted
    a1..a3, reward, the best's reward at the same loss, the rate chosen).

    Args:
        check_period: Γ: seconds (a number > 0), or a number of steps of the slowest rank
            (``"200steps"`` or ``hh.Steps(200)``).
        search_every: how often a new search starts (the paper's epoch), in the unit of
            ``check_period`` and at least two check periods long; ``None``: twenty check periods (the
            paper's 60 s and 20 minutes).
        fit_points: rounds (loss samples) a trial's fit needs, an int >= 3.
        window: step times the prediction of the next step takes the median of, an int >= 1.

    Example:
        >>> s = ADSP(check_period="10steps", search_every="600steps")
        >>> s.label, s.commit_rate
        ('ADSP(10steps)', 1)
        >>> ADSP(check_period=60.0, search_every=100.0)
        Traceback (most recent call last):
        ...
        ValueError: search_every must be at least two check periods (>= 120), got 100.0
    """

    def config(self) -> dict[str, Any] | None:
        """As ``Strategy.config``, a ``Steps`` period as its string (``"10steps"``, which ADSP takes)."""
        args, kwargs = self._arguments
        text = lambda value: str(value) if isinstance(value, Steps) else value   # noqa: E731
        return portable_config([text(a) for a in args], {k: text(v) for k, v in kwargs.items()})

    imports = ("scipy.optimize",)      # the commit-rate search's fit (rules.commit_rate)

    def __init__(self, check_period: float | str | Steps = 60.0, search_every: float | str | Steps | None = None,
                 fit_points: int = 4, window: int = 5) -> None:
        super().__init__()
        self.check_period = as_period("check_period", check_period)
        self._search_every_arg = search_every
        if search_every is None:
            period = self.check_period
            search_every = Steps(20 * period.count) if isinstance(period, Steps) else 20 * period
        self.search_every = as_period("search_every", search_every)
        if isinstance(self.check_period, Steps) != isinstance(self.search_every, Steps):
            raise ValueError(f"search_every must be in the unit of check_period "
                             f"({'steps' if isinstance(self.check_period, Steps) else 'seconds'}), "
                             f"got {search_every!r}")
        period, every = (float(p.count if isinstance(p, Steps) else p) for p in (self.check_period, self.search_every))
        if every < 2 * period:
            raise ValueError(f"search_every must be at least two check periods (>= {2 * period:g}), "
                             f"got {search_every!r}")
        self.window = check_int("window", window, 1)
        self.search = CommitRateSearch(start=1, fit_points=fit_points)
        # identical on every rank (computed from the rounds' statistics alone); in state_dict
        self.warmup = 2               # rounds of one step each still to run
        self.commits = 0              # rounds so far: every rank's c_i
        self.c_target: int | None = None  # commits every rank has made by the next checkpoint
        self._period_left = 0         # rounds left in this check period
        self.elapsed = 0.0            # the shared time axis (seconds)
        self.elapsed_steps = 0.0      # the same, in steps of the slowest rank
        self._search_began = 0.0      # on the axis of search_every's unit
        self.slow_step_s: float | None = None  # the slowest rank's mean step in the latest round that measured one
        # this rank's own measurements
        self.overhead_s = 0.0
        self.deadline: float | None = None
        self._step_s: deque[float] = deque(maxlen=self.window)
        self._overheads: deque[float] = deque(maxlen=self.window)
        self._exit: float | None = None
        self._left = False
        self._warned = False
        self._fields: dict[str, Any] = {}

    @property
    def commit_rate(self) -> int:
        """ΔC_target: commits (rounds) per check period, the same on every rank."""
        return self.search.rate

    def check_period_s(self) -> float | None:
        """Γ in seconds (a step count times the slowest rank's latest mean step; None before one)."""
        if not isinstance(self.check_period, Steps):
            return self.check_period
        return None if self.slow_step_s is None else self.check_period.count * self.slow_step_s

    def interval_s(self) -> float | None:
        """Γ / ΔC_target: seconds from one commit to the next."""
        gamma = self.check_period_s()
        return None if gamma is None else gamma / self.commit_rate

    # -- the hooks --

    def on_start(self, ctx: Context) -> None:
        self._exit, self._left = None, False
        if not self.warmup:
            self._set_deadline(self.clock())

    def decide(self, report: StepReport) -> Decision:
        self._left = False
        if report.loss is not None and not math.isfinite(report.loss) and not self._warned:
            self._warned = True
            log.warning("ADSP: a training loss of %r (step %d) is left out of the commit-rate search; "
                        "non-finite losses are skipped (warned once)", report.loss, self.step)
        if self.step > 1:                               # the first step holds start-up, not speed
            self._step_s.append(float(report.step_s))
        if self.warmup or self.deadline is None:
            return AVERAGE
        predicted = statistics.median(self._step_s) if self._step_s else report.step_s
        return CONTINUE if self.clock() + predicted <= self.deadline else AVERAGE

    def on_round(self, result: RoundResult) -> None:
        arrived = self.clock()
        stats = result.stats
        if stats is None:                               # protocol-level fakes carry no statistics
            self._exit = arrived
            return
        measured = (stats.local_steps > 0) & np.isfinite(stats.step_s)
        busy = float((stats.local_steps * np.where(measured, stats.step_s, 0.0)).max()) if measured.any() else 0.0
        interval = self.interval_s()
        if measured.any():
            self.slow_step_s = float(stats.step_s[measured].max())
        stepped = stats.local_steps[self.rank] > 0 and not self._left
        if self._exit is not None and stepped and not self.warmup:
            self._overheads.append(max(0.0, arrived - self._exit - busy))
            self.overhead_s = statistics.median(self._overheads)
        self._fields = {"overhead_s": self.overhead_s}
        self.commits += 1
        if self.warmup:
            self.warmup -= 1
            if not self.warmup:
                self._checkpoint()                      # the search starts at a checkpoint
        else:
            self._advance(stats, interval, busy)
        # the next period starts now, after the search's fit (which every rank runs at the same time)
        self._exit = self.clock()
        if not self.warmup:
            self._set_deadline(self._exit)

    def _advance(self, stats: RoundStats, interval: float | None, busy: float) -> None:
        """The search and the checkpoints after a round, from its statistics alone (identical on every rank)."""
        span = max(interval or 0.0, busy)
        self.elapsed += span
        self.elapsed_steps += span / self.slow_step_s if self.slow_step_s else 0.0
        losses = stats.loss[np.isfinite(stats.loss)]
        loss = float(losses.mean()) if losses.size else math.nan
        self._fields["global_loss"] = None if math.isnan(loss) else loss
        trial = self.search.add(self.elapsed, loss, max_rate=self.max_rate())
        if trial is not None:
            self._fields["search"] = trial
            if trial.get("stalled") and self.rank == 0:
                log.warning("ADSP: a search trial got %d of the %d training losses its fit needs; the commit rate "
                            "stays at %d (report the loss: opt.report_loss(loss))", trial["points"],
                            self.search.fit_points, self.commit_rate)
        axis = self.elapsed_steps if isinstance(self.search_every, Steps) else self.elapsed
        every = float(self.search_every.count if isinstance(self.search_every, Steps) else self.search_every)
        if not self.search.searching and axis - self._search_began >= every:
            self.search.restart()
            self._search_began = axis
            self._checkpoint()
        else:
            self._period_left -= 1
            if self._period_left <= 0:
                self._checkpoint()

    def max_rate(self) -> int | None:
        """The highest rate whose commit interval holds one step of the slowest rank (None: unmeasured)."""
        if isinstance(self.check_period, Steps):
            return self.check_period.count
        if not self.slow_step_s:
            return None
        return max(1, math.floor(self.check_period / self.slow_step_s + 1e-9))

    def _checkpoint(self) -> None:
        """A checkpoint: C_target = c_i + ΔC_target commits by the next one, ΔC_target rounds away."""
        self._period_left = self.commit_rate
        self.c_target = self.commits + self.commit_rate

    def _set_deadline(self, now: float) -> None:
        gamma = self.check_period_s()
        # no deadline (a round after every step) until the slowest rank's step has been measured
        self.deadline = now + commit_period(gamma, self.commit_rate, self.overhead_s) if gamma else None

    def on_leave(self) -> None:
        self._left = True

    def telemetry_fields(self) -> dict[str, Any]:
        fields, self._fields = self._fields, {}
        return dict(fields, commit_rate=self.commit_rate, c_target=self.c_target)

    @property
    def label(self) -> str:
        period = self.check_period if isinstance(self.check_period, Steps) else f"{self.check_period:g}s"
        return f"ADSP({period})"

    def state_dict(self) -> dict[str, Any]:
        return dict(super().state_dict(), warmup=self.warmup, commits=self.commits, c_target=self.c_target,
                    period_left=self._period_left, elapsed=self.elapsed, elapsed_steps=self.elapsed_steps,
                    search_began=self._search_began, slow_step_s=self.slow_step_s, search=self.search.state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.warmup = check_int("state['warmup']", state["warmup"], 0)
        self.commits = check_int("state['commits']", state["commits"], 0)
        self.c_target = state["c_target"]
        self._period_left = int(state["period_left"])
        self.elapsed, self.elapsed_steps = float(state["elapsed"]), float(state["elapsed_steps"])
        self._search_began = float(state["search_began"])
        self.slow_step_s = state["slow_step_s"]
        self.search.load_state_dict(state["search"])

    def __repr__(self) -> str:
        period, every = (str(p) if isinstance(p, Steps) else p for p in (self.check_period, self._search_every_arg))
        return f"ADSP(check_period={period!r}, search_every={every!r})"
