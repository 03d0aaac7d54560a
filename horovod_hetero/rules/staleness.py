"""DSSP: a dynamic staleness bound chosen to minimise the fastest worker's waiting.

Zhao et al., "Dynamic Stale Synchronous Parallel Distributed Training for Deep Learning"
(Algorithms 1 and 2). A worker may run up to ``s_lower`` iterations ahead of the slowest; when
the fastest exceeds that, the synchronisation controller simulates the next ``r_max = s_upper -
s_lower`` iterations of it and of the slowest worker and grants the r* extra iterations after
which its wait for the slowest is shortest.

Two slips in the listings are corrected, following the paper's own text and Figure 2:
- Algorithm 2, line 8 minimises ``|Sim_slowest[k] - Sim_p[r]|``, but the fastest worker waits
  until the slowest *completes* its running iteration (the dashed line of Figure 2): the wait
  is one-sided, the first slowest end at or after the stop.
- Algorithm 1 grants an OK at the controller call without spending allowance, so r* = 3 would
  buy 4 extra iterations; here the call's OK spends one, so r* means r* extra iterations.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from horovod_hetero.validation import check_float, check_int


def simulated_waits(fast_prev: float, fast_last: float, slow_prev: float, slow_last: float,
                    r_max: int) -> npt.NDArray[np.float64]:
    """Simulated wait of the fastest worker if it stops after r = 0..r_max more iterations.

    The fastest worker's stops are ``fast_last + r * I_p``; the slowest's iteration ends are
    ``slow_last + (k + 1) * I_s``, k >= 0 (its running iteration first). Returns an array of
    r_max + 1 waits: the first slowest end at or after each stop, minus the stop.
    """
    r_max = check_int("r_max", r_max, 0)
    i_p = _interval("fast", fast_prev, fast_last)
    i_s = _interval("slow", slow_prev, slow_last)
    stops = fast_last + i_p * np.arange(r_max + 1)
    first = slow_last + i_s
    k = np.ceil(np.maximum(stops - first, 0.0) / i_s)
    return first + k * i_s - stops


def _interval(name: str, prev: float, last: float) -> float:
    prev = check_float(f"{name}_prev", prev)
    last = check_float(f"{name}_last", last)
    if last <= prev:
        raise ValueError(f"{name}_last must be later than {name}_prev (the two latest push timestamps), "
                         f"got {prev!r} then {last!r}")
    return last - prev


def synchronization_controller(fast_prev: float, fast_last: float, slow_prev: float, slow_last: float,
                               r_max: int) -> int:
    """Algorithm 2: r* in [0, r_max] minimising the simulated wait (ties: the smallest r).

    Args:
        fast_prev, fast_last: the two latest push timestamps of the worker asking (the fastest).
        slow_prev, slow_last: the two latest push timestamps of the slowest worker.
        r_max: ``s_upper - s_lower``, the most extra iterations allowed.

    Example (the situation of the paper's Figure 2: the fastest runs 3 more iterations):
        >>> synchronization_controller(-1.0, 0.0, -4.7, -2.1, r_max=4)   # slowest ends at 0.5, 3.1, ...
        3
    """
    return int(np.argmin(simulated_waits(fast_prev, fast_last, slow_prev, slow_last, r_max)))


class DSSPServer:
    """Algorithm 1 (server part): per-worker push counts t_p, extra allowance r_p, and OKs.

    ``push(p, timestamp)`` records worker p's push and returns the workers that get their OK now
    (p itself if it may continue, and any waiting workers the push released). A worker not in
    the returned list waits. Time comes in as timestamps, so tests are exact. Counts only grow,
    so workers are kept in buckets by count and a push costs O(1) (amortised) whatever the
    number of workers: the simulator runs it for 10,000 of them.

    Args:
        size: number of workers.
        s_lower, s_upper: the staleness range, 0 <= s_lower <= s_upper.

    Example:
        >>> server = DSSPServer(2, s_lower=0, s_upper=0)
        >>> server.push(0, 1.0), server.push(1, 4.0)
        ([], [1, 0])
    """

    def __init__(self, size: int, s_lower: int, s_upper: int) -> None:
        self.size = check_int("size", size, 1)
        self.s_lower = check_int("s_lower", s_lower, 0)
        self.s_upper = check_int("s_upper", s_upper, self.s_lower)
        self.r_max = self.s_upper - self.s_lower
        self.counts = np.zeros(self.size, dtype=np.int64)      # t_p
        self.allowance = np.zeros(self.size, dtype=np.int64)   # r_p
        self.pushes = np.full((self.size, 2), np.nan)           # [latest, second latest]
        self._by_count = {0: set(range(self.size))}             # count -> workers
        self._min = self._max = 0
        self._waiting: dict[int, set[int]] = {}                 # count -> waiting workers

    @property
    def waiting(self) -> set[int]:
        """The workers waiting for the slowest to catch up."""
        return set().union(*self._waiting.values()) if self._waiting else set()

    def _count(self, p: int) -> None:
        c = int(self.counts[p])
        bucket = self._by_count[c]
        bucket.discard(p)
        self._by_count.setdefault(c + 1, set()).add(p)
        self.counts[p] = c + 1
        self._max = max(self._max, c + 1)
        if not bucket:
            del self._by_count[c]
            while self._min not in self._by_count:
                self._min += 1

    def push(self, p: int, timestamp: float) -> list[int]:
        p = check_int("p", p, 0, self.size - 1)
        self._count(p)
        self.pushes[p, 1], self.pushes[p, 0] = self.pushes[p, 0], timestamp
        released = [p] if self._may_continue(p) else []
        if not released:
            self._waiting.setdefault(int(self.counts[p]), set()).add(p)
        for c in sorted(c for c in self._waiting if c - self._min <= self.s_lower):
            released += sorted(self._waiting.pop(c) - {p})
        return released

    def _may_continue(self, p: int) -> bool:
        if self.allowance[p] > 0:
            self.allowance[p] -= 1
            return True
        if self.counts[p] - self._min <= self.s_lower:
            return True
        slowest = next(iter(self._by_count[self._min]))         # any slowest worker: O(1)
        if self.r_max and self.counts[p] == self._max and not np.isnan(self.pushes[[p, slowest], 1]).any():
            r = synchronization_controller(self.pushes[p, 1], self.pushes[p, 0],
                                           self.pushes[slowest, 1], self.pushes[slowest, 0], self.r_max)
            if r > 0:
                self.allowance[p] = r - 1       # this OK spends one of the r extra iterations
                return True
        return False


def round_plan(step_s: npt.ArrayLike, s_lower: int, s_upper: int, tolerance: float = 0.05) -> list[int]:
    """DSSP's decision at an averaging round: local steps per worker before the next round.

    The round is the synchronisation point and every worker starts from it at once. Without
    extra allowance (r = 0) the next round closes when the slowest worker ends its running
    iteration, and the fastest runs what fits in that time, at most ``s_lower + 1`` iterations
    (``s_lower`` ahead of the slowest). Algorithm 2 then gives the fastest r* in [0, s_upper -
    s_lower] extra iterations: the r that minimises its simulated wait for the slowest's first
    iteration end at or after its stop (``simulated_waits``, ties: the smallest r). The round
    closes at that end; every other worker runs as many iterations as fit before it, never more
    than the fastest. Measured step times are noisy, so a slowest end up to ``tolerance`` of the
    fastest's step before its stop counts as on time, and waits within that much of the least count
    as equal (ties: the fewest extra iterations, so noise does not stretch the round).

    Args:
        step_s: seconds per iteration of each worker (finite, > 0).
        s_lower, s_upper: the staleness range, 0 <= s_lower <= s_upper.
        tolerance: fraction of a step, in [0, 0.5].

    Returns:
        a list of ints >= 1, one per worker; the slowest's count is its iterations before the round.

    Example (the situation of the paper's Figure 2, from a round: the slowest takes 2.9 steps
    of the fastest; the fastest runs 5, ending just before the slowest's second iteration):
        >>> round_plan([1.0, 2.9], s_lower=0, s_upper=4)
        [5, 2]
    """
    step_s = np.asarray(step_s, dtype=np.float64)
    if step_s.ndim != 1 or step_s.size == 0 or not np.isfinite(step_s).all() or (step_s <= 0).any():
        raise ValueError(f"step_s must be finite seconds > 0, one per worker, got {step_s.tolist()!r}")
    s_lower = check_int("s_lower", s_lower, 0)
    s_upper = check_int("s_upper", s_upper, s_lower)
    tolerance = check_float("tolerance", tolerance, 0.0, 0.5)
    fast, slow = int(np.argmin(step_s)), int(np.argmax(step_s))
    i_f, i_s = step_s[fast], step_s[slow]
    late = tolerance * i_f                      # an end this much after a stop still counts as on time

    def fits(t: float) -> npt.NDArray[np.int64]:
        return np.maximum(1, np.floor(t / step_s + tolerance)).astype(np.int64)

    free = int(min(fits(i_s)[fast], s_lower + 1))
    waits = simulated_waits((free - 1) * i_f, free * i_f, late - i_s, late, s_upper - s_lower)
    extra = int(np.argmax(waits <= waits.min() + late))       # near-equal waits tie: the fewest extra
    stop = (free + extra) * i_f
    rounds_of_slowest = max(1, int(np.ceil((stop - late) / i_s - 1e-9)))
    steps = np.minimum(fits(rounds_of_slowest * i_s), free + extra)
    steps[fast], steps[slow] = free + extra, rounds_of_slowest
    return steps.tolist()
