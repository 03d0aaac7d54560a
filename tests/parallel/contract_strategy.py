"""A strategy that exists only in the tests: it follows docs/architecture.md's checklist and trains
with the torch wrapper and the Keras callback with no change to the library."""
from types import SimpleNamespace

import numpy as np

from horovod_hetero.strategies import DSSP, ElasticBSP, ModelAveraging, Plan, RoundStats
from horovod_hetero.validation import check_int


class SpeedProportional(ModelAveraging):
    """After every round, each rank runs as many local steps as fit in one step of the slowest
    rank (at most ``cap``), planned from the speeds the round carried; every rank computes the
    same plan from the same statistics.

    Args:
        cap: most local steps per round, an int >= 1.

    Example:
        >>> SpeedProportional(cap=4).after_step()
        CONTINUE
    """

    def __init__(self, cap=8):
        super().__init__()
        self.cap = check_int("cap", cap, 1)
        self.plans = []

    def on_start(self, ctx):
        return Plan((1,) * ctx.size)              # one step each, to measure every rank's speed

    def on_round(self, result):
        stats = result.stats
        measured = ~stats.done & (stats.local_steps > 0)
        if not measured.any():
            return None
        step_s = np.where(measured, stats.step_s, np.nan)
        slowest = np.nanmax(step_s)
        steps = [int(min(self.cap, max(1, slowest // s))) if m else 1 for m, s in zip(measured, step_s)]
        self.plans.append(tuple(steps))
        return Plan(tuple(steps))

    def state_dict(self):
        return dict(super().state_dict(), plans=[list(p) for p in self.plans])


def replan(make, recorded):
    """The plan a fresh strategy (``make()``) answers to one round's recorded statistics (telemetry's
    ``ranks``): what the planned strategies' rounds must have planned, whatever the measured times were."""
    nan = lambda values: [np.nan if v is None else v for v in values]  # noqa: E731
    stats = RoundStats(local_steps=np.array(recorded["local_steps"]), step_s=np.array(nan(recorded["step_s"])),
                       loss=np.array(nan(recorded["loss"])), samples=np.array(recorded["samples"]),
                       done=np.array(recorded["done"], dtype=bool))
    return make().on_round(SimpleNamespace(stats=stats)).steps


#: the test-only strategy and the library's planned ones, as both contract tests build them (fresh each call)
PLANNED = {"test-only": SpeedProportional, "ElasticBSP": lambda: ElasticBSP(lookahead=8),
           "DSSP": lambda: DSSP(staleness=(1, 6))}
