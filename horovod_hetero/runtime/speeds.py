"""Every rank's speed as the rounds measure it: a consumer of the rounds' statistics that the samplers read.

Each round carries every rank's mean (or median) step time since the previous round, identical on every
rank (``RoundStats``), so every rank that saw the same rounds holds the same ``Speeds`` and splits an
epoch the same way without a message. A rank's speed is its median over the last ``SHARE_ROUNDS`` rounds
that measured it: one quick or slow round (a step that missed a progress bar's print, a rank's
evaluation) does not set a whole epoch's split. The first round that measured every rank is left out (it
holds the start-up), and no epoch is split before ``SETTLE_ROUNDS`` more have measured every rank: a
rank's first steps after Keras traces its step function can take twice its usual time.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from horovod_hetero.rules.partition import latest_step_times, speeds_differ
from horovod_hetero.strategies.base import RoundStats

#: rounds of step times ``differ`` looks back over
HISTORY = 8
#: rounds whose median step time is a rank's speed (``Speeds.step_times``)
SHARE_ROUNDS = 5
#: rounds that measured every rank, after the start-up's, before the speeds split an epoch (``Speeds.settled``)
SETTLE_ROUNDS = 3


class Speeds:
    """Every rank's seconds per step (its median over the last ``SHARE_ROUNDS`` rounds that measured it, the
    first round that measured every rank left out: it holds the start-up), its local steps over the rounds,
    whether ``SETTLE_ROUNDS`` rounds have measured every rank since, and whether the ranks' speeds differ
    beyond the noise the rounds measured.

    Args:
        size: the number of ranks the rounds carry.

    Example:
        >>> import numpy as np
        >>> speeds = Speeds(2)
        >>> for step_s in ([0.5, 0.9], [0.1, 0.4], [0.1, 0.41], [0.1, 0.39], [0.05, 0.4]):
        ...     speeds.record(RoundStats(np.array([3, 1]), np.array(step_s), np.full(2, np.nan), np.zeros(2, int),
        ...                              np.zeros(2, bool)))
        >>> speeds.step_times.tolist(), speeds.steps_seen.tolist(), speeds.settled, speeds.differ()
        ([0.1, 0.4], [15, 5], True, True)
    """

    def __init__(self, size: int) -> None:
        #: every rank's seconds per step: its median over the recent rounds, or its latest before the second round
        #: that measured every rank (NaN: never measured; ``None`` before any round)
        self.step_times: npt.NDArray[np.float64] | None = None
        #: every rank's local steps over the rounds
        self.steps_seen: npt.NDArray[np.int64] = np.zeros(size, dtype=np.int64)
        #: ``(steps_seen, step_times)`` at the second round that measured every rank (the first holds the
        #: start-up: a rank's first step counts from the optimizer's construction); a sampler that began an
        #: epoch before then splits what is left with them (early, before its loader draws half its part:
        #: unlike an epoch's split by ``settled`` speeds, which can end a Keras epoch at any batch)
        self.measured: tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None = None
        self._complete = 0
        self._history: deque[npt.NDArray[np.float64]] = deque(maxlen=HISTORY)
        self._latest: npt.NDArray[np.float64] | None = None
        self._recent: list[deque[float]] = [deque(maxlen=SHARE_ROUNDS) for _ in range(size)]   # per rank

    def record(self, stats: RoundStats) -> None:
        """Take one round's statistics (identical on every rank)."""
        self._latest = latest_step_times(self._latest, stats.step_s)
        self.steps_seen = self.steps_seen + stats.local_steps
        step_s = np.asarray(stats.step_s, dtype=np.float64)
        if self._complete:                            # the first round that measured every rank holds the start-up
            for recent, value in zip(self._recent, step_s):
                if np.isfinite(value) and value > 0:
                    recent.append(float(value))
        if np.isfinite(step_s).all():
            self._complete += 1
            if self._complete > 1:
                self._history.append(step_s)
        self.step_times = typical_step_times(self._latest, self._recent)
        if self.measured is None and self._complete == 2:
            self.measured = (self.steps_seen, self.step_times)

    @property
    def settled(self) -> bool:
        """Whether ``SETTLE_ROUNDS`` rounds have measured every rank since the start-up's (the first that
        did, left out): before then no epoch is split by speed, as a rank's first steps after the start-up
        still hold some of it (measured under Keras: the second step of each rank 1.5-4x its usual)."""
        return self._complete > SETTLE_ROUNDS

    def known(self) -> tuple[float, ...] | None:
        """Every rank's seconds per step once ``settled`` (each finite and positive), else ``None``: what a
        strategy started again may plan its first round from (``Context.step_s``)."""
        times = self.step_times
        if not self.settled or times is None or not (np.isfinite(times).all() and (times > 0).all()):
            return None
        return tuple(float(t) for t in times)

    def restart(self) -> None:
        """Forget the recent rounds' step times (another strategy runs from now on, its steps maybe of other
        batches): every rank's speed is its latest until new rounds measure it."""
        for recent in self._recent:
            recent.clear()
        self.step_times = self._latest

    def differ(self) -> bool:
        """Whether the ranks' speeds differ beyond the noise the rounds measured (``rules.partition.speeds_differ``
        over the last rounds that measured every rank, start-up's left out): where they do not, splitting an
        epoch by speed would split it by noise."""
        return bool(self._history) and speeds_differ(np.array(self._history))


def typical_step_times(latest: npt.NDArray[np.float64],
                       recent: Sequence[Sequence[float]]) -> npt.NDArray[np.float64]:
    """Every rank's median seconds per step over its ``recent`` measurements (one sequence per rank), or its
    ``latest`` where it has none.

    Example:
        >>> typical_step_times(np.array([0.1, 0.4, 0.2]), [[0.1, 0.3, 0.1], [0.4, 0.5], []]).tolist()
        [0.1, 0.45, 0.2]
    """
    return np.array([float(np.median(values)) if len(values) else float(last)
                     for values, last in zip(recent, latest)])
