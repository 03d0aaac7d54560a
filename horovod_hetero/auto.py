"""``hh.Auto()``: the library picks the strategy, and changes it when the cluster changes.

A user with mixed GPUs should not have to study seven synchronisation algorithms. ``Auto`` starts as
``Synchronous`` (safe, and the baseline every user knows) and measures from the statistics every round
already carries (``RoundStats``, identical on every rank: no collective of its own): each rank's compute per
step *before* communication (an allreduce evens out the steps' wall times and hides the straggler), how its
steps vary (a persistent straggler, or transient ones), and what a collective costs. Then it predicts every
candidate strategy with the simulator, which runs the library's own strategy objects on the measured cluster
(``advise.choose``: the same decision ``horovod-hetero advise`` gives from a finished run's telemetry), and
hands over to the best one at the next round where every rank holds the same model, when the predicted gain
beats the measured noise. Then it checks the prediction: the strategy it moved to (and, with
``trial_candidates`` above 1, the next of those predicted within ``advise.TIE`` of the fastest, the simulator's
resolution, in turn) runs ``trial_rounds`` rounds, and ``Auto`` keeps the one that ran the most samples per
second (``advise.samples_per_s``, from the rounds' statistics) where it ran ``advise.MIN_GAIN`` more than the
strategy it left (where no rank is a straggler, a model-averaging strategy's samples counted at
``advise.EVEN_WORTH``: ``advise.worth``); else it goes back, and decides once more on ``HISTORY`` rounds. It keeps
measuring: a straggler that appears or leaves, or a resize under ``hvd.elastic``, makes it decide again, with
hysteresis and a cap on decisions.

Samples per second is not accuracy. A guard compares the training loss the rounds carry (every rank's mean)
against wall time before and after a switch, and goes back when the progress per second falls below
``guard`` times what it was; the strategy it left is not tried again for a while. A loss falls more slowly
as training goes on, so the guard weighs each fall per second by the samples trained so far (a loss that falls
alike per logarithm of the samples, as most do after their first steps, reads alike early and late: a trial's
rounds between the two windows do not read as a switch that slowed it). What the guard cannot see:
the test accuracy (a model-averaging strategy whose training loss falls as fast may generalise differently),
and a strategy that would have been better but was never run (the simulator's prediction decides what runs).

How it maps onto Horovod: ``Auto`` is a strategy that runs another one (``Strategy.runs``), so the runtime
carries out the kind of the one running (``runtime.runner``); a switch is ``Strategy.handover`` after a global
round (an ``AVERAGE``, or a round of statistics it adds while a gradient-averaging strategy, which has no
rounds of its own, runs: ``MEASURE_OVERLAPPED``, whose result comes at the next step; under torch its allreduce
goes with that step's gradient allreduce, into the same Horovod cycle, and costs about a seventh of one of its own;
every step until it has decided on ``HISTORY`` rounds, then every ``measure_every`` steps), so every rank
switches at the same round, with the same model, and the next step takes rank 0's counters.
Under Keras, where ranks may take different numbers of batches in an epoch, a switch away from a strategy whose
ranks do waits for the epoch's end.

Example:
    >>> from horovod_hetero.strategies.base import StepReport
    >>> auto = Auto(candidates=["sync", "esync", "localsgd"], measure_every=2)
    >>> auto.current_name, [str(auto.after_step(StepReport(0.1))) for _ in range(2)]
    ('sync', ['MEASURE_OVERLAPPED', 'MEASURE_OVERLAPPED'])
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from horovod_hetero import advise
from horovod_hetero.runtime.runner import runner_for
from horovod_hetero.strategies.base import (CONTINUE, MEASURE_OVERLAPPED, Context, Decision, Plan, RoundResult,
                                            RoundStats, StepReport, Strategy)
from horovod_hetero.strategies.registry import REGISTRY, Registered, configured, register
from horovod_hetero.validation import check_float, check_int

log = logging.getLogger("horovod_hetero")

#: the candidates ``Auto`` predicts by default: every registered strategy but itself and ADSP (Balanced where the
#: adapter plans batches, WAGMA where its process sets exist). ADSP is left to ``candidates=``: the simulator
#: predicts it among the fastest wherever ranks differ (its fast ranks never wait), yet on the benchmarks
#: (Fashion-MNIST to 0.89, five clusters) it was never the fastest model-averaging strategy to the accuracy
#: (third to sixth of six), and each trial of it cost 50-420 steps at its own pace without being kept
DEFAULT = ("sync", "balanced", "esync", "elasticbsp", "dssp", "localsgd", "wagma")
#: rounds of statistics kept for a decision (the newest)
HISTORY = 12
#: simulated steps of the slowest rank per candidate (a decision costs some 0.2 s of a CPU core)
SIMULATED_STEPS = 40
#: a rank's undelayed step changing by more than this share makes Auto decide again
CHANGE = 0.3
#: a rank's newest steps from which Auto reads its undelayed step when it looks for a change (``undelayed``: one
#: round may hold a single step, delayed or not: under random stragglers each step of a rank is 4x with even
#: odds, and twelve in a row are all 4x once in 4,096)
CHANGE_STEPS = 12
#: steps between rounds of statistics once decided, by default, where a round rides with the next step's gradient
#: allreduce (torch: ``MEASURE_OVERLAPPED``). Each costs about a seventh of a separate one (4 ranks on 2 cores, a
#: 60 ms step: samples/s 0.96x Synchronous's with one every step, 0.99x every 4th, 1.00x every 12th, medians of 3
#: paired runs), and a straggler that appears is read 12 to 15 steps after it appeared (12 to 23 every 12th)
OVERLAPPED_EVERY = 4
#: rounds kept for reading a change (a rank that takes a step every few rounds needs more than ``HISTORY``)
CHANGE_ROUNDS = 4 * HISTORY
#: rounds a strategy the guard left, or a trial found no faster, is not run again
BANNED_ROUNDS = 60
#: Student's t, two-sided 95 %, for 1, 2, ... degrees of freedom (the guard's fits; the last from 12 on)
T95 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18)
#: the candidates predicted alike that a decision runs in turn and measures, by default (``trial_candidates``):
#: the one it moved to alone. Measured with two (``horovod-hetero benchmark auto``, five clusters, and Horovod's
#: two example scripts), the second never replaced the first: measured alike, or slower (DSSP 0.83x ElasticBSP's
#: samples/s under Keras), and each such trial cost its steps at the slower pace and two switches
TRIED = 1
#: rounds after a (re)start that hold start-up and are left out of a decision: a job's first two steps (the
#: first allocations and compilations; a rank's second step measured up to 12x its typical one on a CPU)
STARTUP_ROUNDS = 2


class Auto(Strategy):
    """The strategy chosen by the library: starts as Synchronous, measures, and switches (see the module).

    Args:
        candidates: the registry's names of the strategies it may run (default ``DEFAULT``: all of them but
            ADSP, with WAGMA only where its process sets are registered and Balanced only where the adapter
            plans batches); ``"sync"`` must be among them (it starts there).
        measure_every: steps between the rounds of statistics it adds while Synchronous or Balanced runs
            (they have no rounds of their own) once it has decided, an int >= 1, or ``None``; after a (re)start
            and after the speeds changed, it adds one every step, so that it decides within ``min_rounds +
            STARTUP_ROUNDS`` steps (one more where the round overlaps the next step), and, where that decision
            keeps the strategy running, once more on ``HISTORY`` rounds (a round of statistics is one allreduce
            of 3 + 11 numbers a rank; under a model-averaging strategy it reads that strategy's own rounds
            instead). ``None`` (the default): 4 (``OVERLAPPED_EVERY``) where the adapter sends a round of
            statistics with the next step's gradient allreduce (torch), else 12 (``CHANGE_STEPS``: Keras, where
            the ranks wait for each). A straggler that appears is read from the first rounds that hold
            ``CHANGE_STEPS`` of its slow steps and none before: 12 to 15 steps after it appeared every 4 steps,
            12 to 23 every 12.
        min_rounds: rounds of statistics after a (re)start before it decides, an int in [1, ``HISTORY``]
            (the first ``STARTUP_ROUNDS`` after a start are left out: they hold the start-up); from 4 on, the
            decision also weighs how the predicted gain moves between the older and newer half of them
            (``advise.gain_noise``). Fewer read ranks slow at random as persistent stragglers more often:
            two one-step rounds where two of four ranks are slow at each step, one time in six.
        max_switches: the most decisions to switch in a run, an int >= 0 (the switches of a decision's trial and
            the guard's way back are part of that decision).
        guard: go back where the training loss falls per second by less than this share of what it fell
            before the switch, each fall weighed by the samples trained so far (``_rate``), a number in
            [0, 1) (0: never go back).
        settle_rounds: rounds after a switch before the guard compares, an int >= 1 (counted after the
            ``STARTUP_ROUNDS`` that follow the switch, left out as at a start).
        trial_rounds: rounds each candidate of a decision runs before ``Auto`` measures it, an int in
            [0, ``HISTORY``] (counted after the ``STARTUP_ROUNDS`` that follow each switch): the first
            ``trial_candidates`` of those predicted within ``advise.TIE`` of the fastest run in turn, and it
            keeps the one measured fastest where it ran ``advise.MIN_GAIN`` more samples per second than what
            it left (each counted at its ``advise.worth``), else it goes back there (does not try them again
            for ``BANNED_ROUNDS`` rounds, and decides once more on ``HISTORY`` rounds there). 0: no trial; the
            prediction decides alone.
        trial_candidates: how many of the candidates predicted alike a decision's trial runs in turn, an int
            >= 1 (default ``TRIED``, 1: the one the prediction chose, measured against the strategy it left;
            more: also the next ones in ``advise.PREFERENCE`` order, each at its own pace for its rounds).
        recheck_rounds: rounds between decisions while the measured speeds stay put, an int >= 1, or ``None``
            (the default): decide again only when they change or the job's size does. Measured through a
            model-averaging strategy's rounds (several steps each, a rank's occasional pause inside them), an
            unchanged cluster can predict another strategy 1.2-1.7x faster where it is not, and every switch
            restarts the measurement.

    Example::

        opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                                      named_parameters=model.named_parameters(), strategy=hh.Auto())
        # Keras: hh.callbacks.AutoCallback(), with the model compiled with hh.DistributedOptimizer
    """

    def __init__(self, candidates: Sequence[str] | None = None, measure_every: int | None = None, min_rounds: int = 4,
                 max_switches: int = 6, guard: float = 0.5, settle_rounds: int = 5, trial_rounds: int = 8,
                 recheck_rounds: int | None = None, trial_candidates: int = TRIED) -> None:
        super().__init__()
        names = list(DEFAULT if candidates is None else candidates)
        if isinstance(candidates, str) or not names:
            raise TypeError(f"candidates must be a list of strategy names (of "
                            f"{', '.join(n for n in REGISTRY if n != 'auto')}), got {candidates!r}")
        unknown = [n for n in names if n not in REGISTRY or n == "auto"]
        if unknown and candidates is not None:
            raise ValueError(f"candidates: unknown {', '.join(map(repr, unknown))}; choose from "
                             f"{', '.join(n for n in REGISTRY if n != 'auto')}")
        if "sync" not in names:
            raise ValueError("candidates must hold 'sync': Auto starts as Synchronous")
        self.candidates = [n for n in dict.fromkeys(names) if n in REGISTRY and n != "auto"]
        self.measure_every = None if measure_every is None else check_int("measure_every", measure_every, 1)
        self._every: int = CHANGE_STEPS if self.measure_every is None else self.measure_every
        self.min_rounds = check_int("min_rounds", min_rounds, 1, HISTORY)
        self.max_switches = check_int("max_switches", max_switches, 0)
        self.guard = check_float("guard", guard, 0.0, 1.0)
        if self.guard >= 1.0:
            raise ValueError(f"guard must be in [0, 1), got {guard!r}")
        self.settle_rounds = check_int("settle_rounds", settle_rounds, 1)
        self.trial_rounds = check_int("trial_rounds", trial_rounds, 0, HISTORY)
        self.trial_candidates = check_int("trial_candidates", trial_candidates, 1)
        self.recheck_rounds = None if recheck_rounds is None else check_int("recheck_rounds", recheck_rounds, 1)
        self.current: Strategy                     # the strategy running, its name, whether it adds statistics rounds
        self.current_name: str
        self._measures: bool
        self._run("sync", configured("sync"))
        self.available = list(self.candidates)     # those this job can run (``start``)
        self.switches: list[dict[str, Any]] = []   # every switch: round, step, from, to, why
        self._recent: list[RoundStats] = []        # statistics since the latest (re)start, switch or change,
                                                   # up to ``CHANGE_ROUNDS`` (``_changed``; ``_rounds``: the newest)
        self._startup = STARTUP_ROUNDS             # rounds still to leave out after a (re)start (start-up)
        self._progress: list[tuple[float, float, float]] = []   # (seconds, mean loss, samples trained) per round
        self._before: tuple[float, float] | None = None   # the loss's weighed fall before the latest switch, its error
        self._samples = 0.0                        # every rank's samples in the rounds so far (the training's age)
        self._previous: str | None = None          # the strategy before the latest switch (the guard's way back)
        self._banned: dict[str, int] = {}          # name -> the round it may be tried again from
        self._decisions = 0                        # decisions to switch so far (``max_switches``)
        self._sized = False                        # started, or loaded, at a job size (``size``)
        self._trial: list[str] = []                # the candidates of the latest decision still to run and measure
        self._speeds: dict[str, float] = {}        # samples/s measured this trial, by name (what it left first)
        self._worth: dict[str, float] = {}         # what a sample of each candidate of the trial counts for
        self._decided_at: np.ndarray | None = None  # every rank's typical step at the latest decision
        self._final = False                        # the latest decision read ``HISTORY`` rounds, or switched
        self._session = ""                         # the controller's it was started by (``Context.session``)
        self._reference: np.ndarray | None = None  # every rank's undelayed step since the latest decision (``_changed``)
        self._change = ""                          # the change that made it decide again (for the switch's reason)
        self._slowed = False                       # that change: a rank slowed (``_enough``)
        self._since_decision = 0
        self._since_round = 0                      # steps since the latest round (the statistics rounds)
        self._round = 0
        self._pending: str | None = None
        self._said: dict[str, Any] | None = None   # the switch this step's telemetry reports

    # -- what it runs --

    @property
    def runs(self) -> Strategy:
        return self.current

    @property
    def lockstep(self) -> bool:                  # type: ignore[override]
        return self.current.lockstep

    @property
    def imports(self) -> tuple[str, ...]:       # type: ignore[override]
        """What the candidates it may run import (its decisions simulate them)."""
        return tuple(sorted({module for name in self.available for module in configured(name).imports}))

    @property
    def plan(self) -> Plan | None:
        return self.current.plan

    @plan.setter
    def plan(self, value: Plan | None) -> None:
        """Plans are the strategy's it runs (``Strategy.__init__`` sets none)."""

    @property
    def label(self) -> str:
        return "Auto"

    def __repr__(self) -> str:
        return f"Auto(running {self.current!r})"

    def check_size(self, size: int) -> None:
        self.current.check_size(size)

    # -- the template methods, on the strategy it runs --

    def start(self, ctx: Context) -> None:
        # A new controller (hvd.elastic's reset) or job size: every rank measures afresh alike (a worker that
        # replaced a lost one has measured nothing, and the others must add rounds of statistics when it does)
        resized = self._sized and ctx.size != self.size
        if resized or ctx.session != self._session:
            self._session = ctx.session
            self._restart()
            self._decided_at, self._since_decision, self._final = None, 0, False
        if resized:                                # what it measured before describes the old size
            self._trial, self._speeds, self._worth = [], {}, {}
            self._previous = self._before = None
        self.rank, self.size, self.clock, self._sized = ctx.rank, ctx.size, ctx.clock, True
        if self.measure_every is None:             # more often where a round of statistics rides with the gradients
            self._every = OVERLAPPED_EVERY if getattr(ctx.collectives, "overlaps", False) else CHANGE_STEPS
        self.available = [name for name in self.candidates if self._runs_here(name, ctx)]
        self.current.start(ctx)

    def _runs_here(self, name: str, ctx: Context) -> bool:
        """Whether candidate ``name`` can run in this job: a size it takes, WAGMA's process sets registered,
        Balanced's batches planned by the adapter, SciPy for ADSP."""
        try:
            configured(name).check_size(ctx.size)
        except ValueError:
            return False
        if name == "wagma":
            from horovod_hetero.rules.grouping import nearest_group_size, process_set_ranks
            return ctx.transports.groups_available(process_set_ranks(ctx.size, nearest_group_size(ctx.size)))
        if name == "balanced":
            return ctx.batches_planned
        if name == "adsp":
            try:
                import scipy  # noqa: F401
            except ImportError:
                return False
        return True

    def after_step(self, report: StepReport = StepReport()) -> Decision:
        decision = self.current.after_step(report)
        self.step = self.current.step
        self._since_round += 1
        # rounds of statistics only where the ranks meet at every step (Synchronous, Balanced: the gradient
        # allreduce): no rounds of their own, every rank at the same step, and a rank that stopped early waits
        # in hvd.join, which answers them with zeros. A model-averaging strategy's own rounds carry the
        # statistics, and a rank that stopped early joins those with its model, which a round of statistics
        # would not match.
        # Every step until a decision on ``HISTORY`` rounds (the steps at Synchronous's pace cost the most before
        # it), then every ``measure_every``; none while a switch waits for the round that carries it out. Each
        # round's result comes at the next step (``MEASURE_OVERLAPPED``): where the adapter sends it with that
        # step's gradient allreduce (torch), it costs the ranks little wait.
        every = self._every if self._final else 1
        if decision is CONTINUE and self._measures and self._pending is None and self._since_round >= every:
            return MEASURE_OVERLAPPED
        return decision

    def after_round(self, result: RoundResult) -> None:
        self.current.after_round(result)
        self._since_round = 0
        self._round += 1
        if result.stats is None or result.done:    # a join's rounds: partial statistics
            return
        done = advise.samples_in(result.stats)
        self._samples += done
        if self._startup:                          # start-up: not what the strategy costs
            self._startup -= 1
        else:
            self._recent = (self._recent + [result.stats])[-CHANGE_ROUNDS:]
        walls, losses = result.stats.wall_s, result.stats.loss
        seconds = float(np.nanmedian(walls)) if np.isfinite(walls).any() else float("nan")
        loss = float(np.nanmean(losses)) if np.isfinite(losses).any() else float("nan")
        last = self._progress[-1][0] if self._progress else 0.0
        if np.isfinite(seconds):
            self._progress = (self._progress + [(last + seconds, loss, self._samples - done / 2)])[-HISTORY:]
        if self._pending is None:
            self._decide()

    def leave(self) -> None:
        self.current.leave()

    def take_over(self, step: int) -> None:
        super().take_over(step)
        self.current.take_over(step)

    def telemetry_fields(self) -> dict[str, Any]:
        fields = {**self.current.telemetry_fields(), "auto": self.current_name}
        if self._said is not None:                 # once: in the record of the step whose round decided it
            fields["switch"], self._said = self._said, None
        return fields

    def handover(self) -> Strategy | None:
        """Itself, running the strategy it decided on at a round (``_pending``), else ``None``."""
        if self._pending is None:
            return None
        name, self._pending = self._pending, None
        self._run(name, configured(name))
        self._restart()
        return self

    def _run(self, name: str, strategy: Strategy) -> None:
        """Run ``strategy`` (candidate ``name``) from now on; rounds of statistics where its ranks meet at every
        step (its runner's ``steps_together``)."""
        self.current, self.current_name = strategy, name
        self._measures = runner_for(strategy).steps_together

    # -- deciding --

    @property
    def _rounds(self) -> list[RoundStats]:
        """The newest ``HISTORY`` rounds of statistics: what a decision and a trial read."""
        return self._recent[-HISTORY:]

    def _restart(self) -> None:
        """Measure afresh (a switch, a new job size): the rounds so far describe another strategy or job."""
        self._recent, self._progress, self._since_round = [], [], 0
        self._startup, self._slowed, self._change = STARTUP_ROUNDS, False, ""

    def _changed(self) -> bool:
        """Whether a rank's undelayed step (``undelayed``, over its newest ``CHANGE_STEPS`` steps since the latest
        switch) moved by more than ``CHANGE`` from what it was after the latest decision: a straggler appeared or
        left. Then the rounds before the change are dropped (where a rank slowed, those since it slowed are kept,
        and the next round may be decided on: ``_enough``), and the next decision reads the cluster as it is now.

        What it was: the first such reading after the decision, or the one the decision measured where that was
        shorter (``advise.measure_rounds``: its shortest over the decision's rounds), so that a rank slowed during
        the decision's trial reads as a change; one read slower at the decision than it runs (a few rounds of
        one step each, all delayed at random) does not, nor, so, does a rank sped up during the trial."""
        if self._decided_at is None:
            return False
        now = undelayed(self._recent)
        if now is None or now.size != self._decided_at.size:
            return False
        now = np.maximum(now, 1e-6)
        if self._reference is None:
            self._reference = np.minimum(now, np.maximum(self._decided_at, 1e-6))
        then = self._reference
        ratio = now / then
        moved = np.abs(ratio - 1.0)
        if np.max(moved) <= CHANGE:
            return False
        rank = int(np.argmax(moved))
        self._change = f"rank {rank}'s undelayed step moved from {then[rank]:.3g} s to {now[rank]:.3g} s"
        if self.rank == 0:
            log.info("Auto decides again: %s", self._change)
        # Kept: where ranks only slowed, the newest rounds whose every step of each rank that slowed was slow
        # (its shortest step in them nearer its new undelayed step than its old one): the cluster as it is now,
        # which a decision may read at once. Where one sped up, a round's shortest step reads the change at its
        # first fast step: the newest round alone.
        slowed, sped = ratio > 1.0 + CHANGE, ratio < 1.0 - CHANGE
        kept, self._slowed = 1, not sped.any()
        if self._slowed:
            middle = np.sqrt(now * then)
            slow = [bool(np.all(np.asarray(r.step_min, dtype=float)[slowed] >= middle[slowed]))
                    if np.asarray(r.step_min).size == now.size else False for r in self._recent]
            while kept < len(slow) and slow[-kept - 1]:
                kept += 1
        self._recent = self._recent[-kept:]
        self._progress = []                        # the loss's fall so far was on the cluster before
        self._decided_at, self._reference, self._final = None, None, False
        return True

    def _decide(self) -> None:
        rounds = self._rounds
        if self._trial:                            # a decision's candidates to measure first
            if len(rounds) >= self.trial_rounds:
                self._try(rounds)
            return
        if self._previous is not None and self._before is None:
            self._previous = None                  # nothing for the guard to compare with
        if self._decisions >= self.max_switches and self._previous is None:
            return
        if self._changed():                        # a rank slowed: the rounds since may be decided on at once
            rounds = self._rounds
            self._previous = self._before = None   # and the loss before the switch says nothing of the cluster now
        elif self._previous is not None:           # a switch to judge first
            if len(rounds) >= self.settle_rounds:
                self._judge()
            return
        if self._decisions >= self.max_switches:
            return
        if not self._enough(rounds):
            return
        self._since_decision += 1
        again = self.recheck_rounds is not None and self._since_decision >= self.recheck_rounds
        if self._decided_at is not None and not again and (self._final or len(rounds) < HISTORY):
            return
        try:
            measured = advise.measure_rounds(rounds)
        except ValueError:
            return
        self._decided_at, self._since_decision, self._final = np.array(measured.step_s), 0, len(rounds) >= HISTORY
        self._reference = None
        names = [n for n in self.available if self._banned.get(n, 0) <= self._round or n == self.current_name]
        if self.current_name not in names:
            names.append(self.current_name)
        strategies = {name: configured(name) for name in names}
        duration = SIMULATED_STEPS * max(measured.step_s)
        choice = advise.choose(measured, strategies, self.current_name, duration=duration)
        if choice.switches:                        # the gain must outgrow the measurement's own spread too
            noise = advise.gain_noise(rounds, strategies[choice.name], strategies[self.current_name], duration)
            choice = advise.choose(measured, strategies, self.current_name, noise, duration,
                                   predicted=choice.predicted)
        change, self._change, self._slowed = self._change, "", False
        if choice.switches:
            self._decisions, self._final = self._decisions + 1, True
            if self.trial_rounds:
                self._trial = list(choice.tied[:self.trial_candidates])
                self._speeds = {self.current_name: advise.samples_per_s(rounds)}
                self._worth = {name: choice.worth[name] for name in [*self._trial, self.current_name]}
            self._switch(choice.name, f"{change}: {choice.reason}" if change else choice.reason, choice.gain)
            if change:                             # the loss's fall since the change: too few rounds to judge by
                self._before = None

    def _enough(self, rounds: Sequence[RoundStats]) -> bool:
        """Whether ``rounds`` can be decided on: ``min_rounds`` of them; or, after ranks slowed (``_changed``),
        those that hold ``CHANGE_STEPS`` steps of every rank (a model-averaging strategy's rounds of several
        steps each, or Synchronous's rounds of statistics every ``measure_every`` steps: a straggler that
        appears under LocalSGD(8) is answered at the round its change is read, where three more rounds took
        some 5 s at the straggler's pace). A decision on fewer than four rounds weighs no noise
        (``advise.gain_noise``): the change itself was read on twelve steps."""
        if len(rounds) >= self.min_rounds:
            return True
        if not self._slowed or not rounds:
            return False
        steps = np.sum([np.asarray(r.local_steps, dtype=float) for r in rounds], axis=0)
        return bool(np.min(steps) >= CHANGE_STEPS)

    def _try(self, rounds: Sequence[RoundStats]) -> None:
        """A decision's trial: measure the candidate that ran ``trial_rounds`` rounds, run the next, or, the last
        measured, keep the fastest where it beat the strategy it left (``_previous``) by ``advise.MIN_GAIN``, its
        samples/s counted at its ``advise.worth`` on the decision's cluster, else go back there. Candidates
        measured within ``advise.TIE`` of the fastest are alike, as predicted ones are: the first in
        ``advise.PREFERENCE`` is kept (samples per second do not count the progress per sample, which the order
        does); a candidate whose rounds measured no wall time counts as not faster."""
        speeds, current, left = self._speeds, self.current_name, self._previous
        speeds[current] = advise.samples_per_s(rounds)
        self._trial = [name for name in self._trial if name != current]
        said = ", ".join(f"{name} {speed:.4g}" for name, speed in speeds.items())
        if self._trial:
            self._pending = self._trial[0]
            self._announce(self._pending, f"measured samples/s: {said}; tries {self._pending}, predicted alike", 1.0)
            return
        worth, self._speeds, self._worth = self._worth, {}, {}
        if left is None:                           # no strategy to go back to (restored without one): stay
            return
        base = speeds.get(left, float("nan"))
        fast = {name: speed for name, speed in speeds.items() if name != left and np.isfinite(speed)}
        if not np.isfinite(base) or not fast:      # nothing to compare: the prediction stands
            log.info("Auto keeps %s: its trial measured no comparison (samples/s: %s)", current, said)
            return
        # the samples/s each had to run, as a multiple of what it left ran (``advise.bar``), and each one's
        # samples/s as progress in samples of what it left (``advise.worth``)
        bars = {name: advise.bar(worth, name, left) for name in fast}
        value = {name: speed * worth.get(name, 1.0) / worth.get(left, 1.0) for name, speed in fast.items()}
        passed = {name: value[name] for name, speed in fast.items() if speed > bars[name] * base}
        if passed:
            fastest = max(passed.values())
            # measured alike (within the prediction's TIE): the one the order prefers, as among predicted ties
            best = next(name for name in advise.ordered(passed) if fastest <= (1.0 + advise.TIE) * passed[name])
            if best != current:
                self._pending = best
                why = "keeps the fastest" if passed[best] == fastest else "keeps the first in the order of those alike"
                self._announce(best, f"measured samples/s: {said}; {why}", passed[best] / base)
            elif self.rank == 0:
                log.warning("Auto keeps %s (measured samples/s: %s)", best, said)
            return
        for name in speeds:
            if name != left:
                self._banned[name] = self._round + BANNED_ROUNDS
        # back, and once more on ``HISTORY`` rounds there (measuring every step), without those it tried: a
        # decision on a few rounds may have read ranks slow at random as persistent stragglers, and the
        # strategy for them may be another
        self._pending, self._previous, self._before, self._final = left, None, None, False
        need = " or ".join(sorted({f"{bar:.2f}x" for bar in bars.values()}))
        self._announce(left, f"measured samples/s: {said}; none ran {need} {left}'s",
                       base / fast[current] if current in fast and fast[current] > 0 else 1.0)

    def _rate(self) -> tuple[float, float] | None:
        """How fast the training loss fell this phase, per second (a least-squares slope, sign turned), weighed
        by the samples trained at the phase's middle, and the half-width of that product's 95 % interval (its
        standard error times Student's t for the fit's degrees of freedom: a fit of three rounds has one, and
        its standard error is itself noise); None where the rounds carried too few losses.

        The weight makes windows far apart comparable: a loss that falls by ``b`` per logarithm of the samples
        (``L = a - b ln s``) falls ``b`` times the samples per second divided by ``s`` per second, so the weighed
        fall is ``b`` times the samples per second at any age. Measured on Fashion-MNIST under Synchronous, the
        plain fall per second shrank 30-100x from steps 3-6 to steps 80-200, the weighed one stayed within 2x."""
        points = [(t, loss, age) for t, loss, age in self._progress if np.isfinite(loss)]
        if len(points) < 3:
            return None
        t, loss, age = np.array(points).T
        spread = float(np.sum((t - t.mean()) ** 2))
        if spread <= 0:
            return None
        slope, intercept = np.polyfit(t, loss, 1)
        residual = float(np.sum((loss - (slope * t + intercept)) ** 2))
        weight = float(age.mean())
        error = float(np.sqrt(residual / (len(points) - 2) / spread)) * weight
        return float(-slope) * weight, error * T95[min(len(points) - 2, len(T95)) - 1]

    def _switch(self, name: str, why: str, gain: float) -> None:
        self._before, self._previous = self._rate(), self.current_name
        self._pending = name
        self._announce(name, why, gain)

    def _judge(self) -> None:
        """After a switch: keep it, or go back where the loss falls per second (weighed by the samples trained,
        ``_rate``) by less than ``guard`` times what it fell before (the strategy left is then not tried again
        for ``BANNED_ROUNDS`` rounds). Both rates must be told apart from the losses' noise (the 95 % intervals
        of each slope): where the loss did not measurably fall before, there is no progress to compare, and the
        switch stays."""
        after, before, previous = self._rate(), self._before, self._previous
        self._previous = self._before = None
        if self.guard == 0 or after is None or before is None or previous is None or before[0] <= before[1]:
            return
        if after[0] + after[1] < self.guard * before[0]:
            self._banned[self.current_name] = self._round + BANNED_ROUNDS
            self._pending = previous
            self._announce(previous, f"the training loss fell {after[0]:.3g}/s under {self.current_name}, against "
                                     f"{before[0]:.3g}/s before it, each times the samples trained "
                                     f"(the guard: at least {self.guard:g}x)", 1.0)

    def _announce(self, name: str, why: str, gain: float) -> None:
        said = {"round": self._round, "step": self.step, "from": self.current_name, "to": name, "why": why,
                "gain": round(gain, 3)}
        self.switches.append(said)
        self._said = said
        if self.rank == 0:
            log.warning("Auto switches from %s to %s at round %d (step %d): %s", self.current_name, name,
                        self._round, self.step, why)

    # -- state --

    def state_dict(self) -> dict[str, Any]:
        state = {k: v for k, v in super().state_dict().items() if not k.startswith("plan")}   # the current's
        state.update(current=self.current_name, current_state=self.current.state_dict(),
                     switches=list(self.switches), banned=dict(self._banned), round=self._round,
                     since_round=self._since_round, size=self.size, decisions=self._decisions,
                     trial=list(self._trial), speeds=dict(self._speeds), worth=dict(self._worth),
                     previous=self._previous,
                     before=None if self._before is None else list(self._before), samples=self._samples)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """What it ran and measured, from ``state_dict()`` (a checkpoint, ``hvd.elastic``'s restore, rank 0's
        counters after a switch)."""
        name = state.get("current")
        if name not in self.candidates:
            raise ValueError(f"state['current'] must be one of Auto's candidates ({', '.join(self.candidates)}), "
                             f"got {name!r}")
        current = self.current if name == self.current_name else configured(name)
        current.load_state_dict(state["current_state"])
        super().load_state_dict({k: v for k, v in state.items() if k in ("kind", "step", "origin")})
        self._run(name, current)
        self.switches = [dict(s) for s in state.get("switches", [])]
        self._banned = {str(k): check_int("state['banned']", v, 0) for k, v in dict(state.get("banned", {})).items()}
        self._round = check_int("state['round']", state.get("round", 0), 0)
        self._since_round = check_int("state['since_round']", state.get("since_round", 0), 0)
        if "size" in state:                        # the job size it measured (a new one: measured afresh at start)
            self.size, self._sized = check_int("state['size']", state["size"], 1), True
        self._decisions = check_int("state['decisions']", state.get("decisions", 0), 0)
        self._trial = [name for name in state.get("trial", []) if name in self.candidates]
        self._speeds = {str(k): float(v) for k, v in dict(state.get("speeds", {})).items() if k in self.candidates}
        self._worth = {str(k): check_float("state['worth']", v, 0.0, 1.0, min_exclusive=True)
                       for k, v in dict(state.get("worth", {})).items() if k in self.candidates}
        previous, before = state.get("previous"), state.get("before")
        self._previous = previous if previous in self.candidates else None
        self._before = (float(before[0]), float(before[1])) if before is not None else None
        self._samples = check_float("state['samples']", state.get("samples", 0.0), 0.0)


def undelayed(rounds: Sequence[RoundStats], steps: int = CHANGE_STEPS) -> np.ndarray | None:
    """Each rank's undelayed step: its shortest over the newest rounds that hold at least ``steps`` of its steps.
    Rounds where it took none are passed over, and so are rounds of a smaller batch than its largest in
    ``rounds`` (its samples per step, where reported: an epoch's last, partial batch is not its pace);
    ``None`` where the rounds hold fewer steps for some rank.

    Example:
        >>> import numpy as np
        >>> def stats(mins, steps, samples):
        ...     n = len(mins)
        ...     return RoundStats(np.array(steps), np.array(mins), np.full(n, np.nan), np.array(samples),
        ...                       np.zeros(n, bool), step_min=np.array(mins))
        >>> rounds = [stats([0.05, 0.05], [4, 2], [128, 64]), stats([0.2, 0.02], [4, 1], [128, 8]),
        ...           stats([0.2, 0.05], [4, 2], [128, 64])]          # rank 1's 0.02 s: a batch of 8, not 32
        >>> undelayed(rounds, 4), undelayed(rounds, 5)
        (array([0.2 , 0.05]), None)
    """
    if not rounds:
        return None
    n = np.asarray(rounds[-1].step_min).size
    same = [r for r in rounds if np.asarray(r.step_min).size == n]
    taken = np.array([np.asarray(r.local_steps, dtype=float) for r in same])          # rounds x ranks
    mins = np.array([np.asarray(r.step_min, dtype=float) for r in same])
    with np.errstate(invalid="ignore", divide="ignore"):
        batch = np.array([np.asarray(r.samples, dtype=float) for r in same]) / taken
    full = np.nanmax(np.where(taken > 0, batch, np.nan), axis=0, initial=0.0)
    usable = (taken > 0) & np.isfinite(mins) & ~(batch < 0.99 * full)   # a batch not reported (0): usable
    shortest = np.full(n, np.nan)
    for q in range(n):
        counted = 0.0
        for i in reversed(range(len(same))):   # each rank reads back only as far as it needs
            if usable[i, q]:
                shortest[q] = mins[i, q] if counted == 0 else min(shortest[q], mins[i, q])
                counted += taken[i, q]
                if counted >= steps:
                    break
        if counted < steps:
            return None
    return shortest


#: ``hh.Auto``'s line in the registry (it runs the others: its own module, as any strategy's)
register(Registered("auto", Auto))
