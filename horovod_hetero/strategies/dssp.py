"""DSSP: bounded-staleness local SGD whose bound the synchronisation controller picks every round."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from horovod_hetero.rules.staleness import round_plan
from horovod_hetero.strategies.planned import RoundPlanned
from horovod_hetero.validation import check_float, check_int


def check_staleness(staleness: object) -> tuple[int, int]:
    """``(s_lower, s_upper)``: two ints with 0 <= s_lower <= s_upper, else a TypeError/ValueError naming it."""
    if isinstance(staleness, np.ndarray) and staleness.ndim == 1:
        staleness = staleness.tolist()
    if not isinstance(staleness, (tuple, list)) or len(staleness) != 2:
        raise TypeError(f"staleness must be a pair of ints (s_lower, s_upper) with 0 <= s_lower <= s_upper, "
                        f"got {staleness!r} ({type(staleness).__name__})")
    low = check_int("staleness[0] (s_lower)", staleness[0], 0)
    high = check_int("staleness[1] (s_upper)", staleness[1], 0)
    if high < low:
        raise ValueError(f"staleness must be (s_lower, s_upper) with 0 <= s_lower <= s_upper, got {tuple(staleness)!r}")
    return low, high


class DSSP(RoundPlanned):
    """DSSP: the fastest rank runs up to ``s_lower`` iterations ahead of the slowest, plus the r*
    extra (at most ``s_upper - s_lower``) after which it waits least.

    Zhao et al., "Dynamic Stale Synchronous Parallel Distributed Training for Deep Learning"
    (Algorithms 1 and 2; ``rules.staleness``). In the paper every worker pushes its update to a
    parameter server after each iteration; a worker more than ``s_lower`` iterations ahead of the
    slowest waits, except that the fastest asks the synchronisation controller, which simulates the
    next ``s_upper - s_lower`` iterations of it and of the slowest and grants the r* extra ones
    after which its wait for the slowest's next push is shortest.

    On Horovod the push and the pull become the averaging round (one fused allreduce of the
    model), which carries every rank's step time, so every rank computes the same decision
    (``rules.staleness.round_plan``): without extra allowance the next round closes when the slowest
    ends its running iteration and the fastest runs what fits, at most ``s_lower + 1`` iterations;
    the controller's r* moves the round to the slowest's first iteration end at or after the
    fastest's stop; every other rank runs what fits before it. What that changes: updates are
    exchanged at rounds, not after every iteration, so between two rounds a rank computes on its
    own model (local SGD), and the staleness between the fastest and the slowest is the
    difference of their local steps in a round (at most ``s_upper``). The slowest never
    waits for a push of the others, and ranks of equal speed average after every step (with
    pushes after every iteration the paper's workers never diverge further either). At a job's
    start the first two rounds come after one step each (the first step is start-up, not speed);
    after ``sync_model()`` the first round is planned from the speeds measured before it.

    Args:
        staleness: ``(s_lower, s_upper)``, ints with 0 <= s_lower <= s_upper.
        tolerance: a stop up to this fraction of the fastest's step after the slowest's iteration
            end counts as on time, and waits within it of the least count as equal (measured step
            times are noisy), in [0, 0.5].

    Example:
        >>> DSSP(staleness=(3, 15)).plan_steps([0.1, 0.1, 0.1, 0.4])
        [4, 4, 4, 1]

    With Horovod::

        opt = hh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      strategy=hh.DSSP(staleness=(3, 15)))
    """

    def __init__(self, staleness: Sequence[int] = (3, 15), tolerance: float = 0.05) -> None:
        super().__init__()
        self.s_lower, self.s_upper = check_staleness(staleness)
        self.tolerance = check_float("tolerance", tolerance, 0.0, 0.5)

    def plan_steps(self, step_s: npt.NDArray[np.float64]) -> list[int]:
        return round_plan(step_s, self.s_lower, self.s_upper, self.tolerance)

    @property
    def label(self) -> str:
        return f"DSSP({self.s_lower},{self.s_upper})"

    def __repr__(self) -> str:
        return f"DSSP(staleness=({self.s_lower}, {self.s_upper}), tolerance={self.tolerance})"
