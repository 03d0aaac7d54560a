"""Strategies that plan every round from the speeds the round itself carried."""
from __future__ import annotations

import abc
import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from horovod_hetero.strategies.base import Context, ModelAveraging, Plan, RoundResult, RoundStats


class RoundPlanned(ModelAveraging):
    """Base of strategies that give each rank its local steps before the next round.

    A round carries every rank's mean step time since the previous one (``RoundStats``), so after
    it every rank holds the same measurements and computes the same ``Plan`` with no server and no
    extra message: identical everywhere by construction. A subclass writes ``plan_steps``.

    At a job's start the first two rounds come after one step each: the first step is not a speed (it
    holds what happened since the optimizer was built: start-up, data, tracing), as the paper's interval
    needs two pushes; from the second round on, each plan depends on that round's statistics alone.
    Started again where the rounds have measured every rank (``Context.step_s``: after ``sync_model()``,
    as at each epoch's end, or at ``hh.Auto``'s switch), the first round is planned from those speeds:
    two rounds of one step each would make every fast rank wait for a slow rank's step twice. Ranks
    that stopped stepping (``sync_model()``) are left out and get 1. When a rank stepped in the round
    without a measurement (its only step was the first after ``sync_model()``, which also timed what ran
    between: evaluation, checkpoints, the next epoch's data), the plan runs again; where a rank took no
    step, or before any plan, every rank runs one step, to measure it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.warming_up = False       # the next round measured each rank's first step only

    @abc.abstractmethod
    def plan_steps(self, step_s: npt.NDArray[np.float64]) -> list[int]:
        """Local steps (ints >= 1) for ranks stepping at ``step_s`` seconds per step (finite, > 0)."""

    def on_start(self, ctx: Context) -> Plan:
        self.warming_up = ctx.step_s is None or len(ctx.step_s) != ctx.size
        if self.warming_up:
            return _one_step_each(ctx.size)
        return Plan(tuple(int(s) for s in self.plan_steps(np.array(ctx.step_s, dtype=np.float64))))

    def on_round(self, result: RoundResult) -> Plan | None:
        stats = result.stats
        if stats is None:
            return None
        if self.warming_up:
            self.warming_up = False
            return _one_step_each(self.size)
        # the plan is a function of the statistics and the plan before (the same on every rank): computed once
        # per round where ranks share them (the simulator)
        return stats.memo((type(self), repr(self), self.plan), lambda: self.plan_from(stats, self.plan))

    def plan_from(self, stats: RoundStats, previous: Plan | None = None) -> Plan:
        """The ``Plan`` after a round with these ``RoundStats``; ``previous`` (the plan the round ran) again
        where a rank stepped without a measurement."""
        active = ~np.asarray(stats.done, dtype=bool)
        steps = np.ones(len(active), dtype=np.int64)
        step_s = stats.step_s[active]
        stepped = active.any() and bool((stats.local_steps[active] > 0).all())
        if stepped and np.isfinite(step_s).all():
            # a step measured at 0 s (a coarse clock) counts as the fastest measured one, 1 us at least
            positive = step_s[step_s > 0]
            steps[active] = self.plan_steps(np.maximum(step_s, positive.min() if positive.size else 1e-6))
        elif stepped and previous is not None and len(previous.steps) == len(active):
            return previous
        return Plan(tuple(int(s) for s in steps))

    def state_dict(self) -> dict[str, Any]:
        return dict(super().state_dict(), warming_up=self.warming_up)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.warming_up = bool(state.get("warming_up", False))


@functools.lru_cache(maxsize=8)
def _one_step_each(size: int) -> Plan:
    """``Plan((1,) * size)``, built once per size (the simulator starts thousands of workers)."""
    return Plan((1,) * size)
