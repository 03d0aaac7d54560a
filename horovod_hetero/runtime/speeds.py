"""Every rank's speed as the rounds measure it: a consumer of the rounds' statistics that the samplers read.

Each round carries every rank's mean (or median) step time since the previous round, identical on every
rank (``RoundStats``), so every rank that saw the same rounds holds the same ``Speeds`` and splits an
epoch the same way without a message.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import numpy.typing as npt

from horovod_hetero.rules.partition import latest_step_times, speeds_differ
from horovod_hetero.strategies.base import RoundStats

#: rounds of step times ``differ`` looks back over
HISTORY = 8


class Speeds:
    """Every rank's latest seconds per step, its local steps over the rounds, and whether the ranks' speeds
    differ beyond the noise the rounds measured.

    Args:
        size: the number of ranks the rounds carry.

    Example:
        >>> import numpy as np
        >>> speeds = Speeds(2)
        >>> for step_s in ([0.5, 0.9], [0.1, 0.4], [0.1, 0.41], [0.1, 0.39]):
        ...     speeds.record(RoundStats(np.array([3, 1]), np.array(step_s), np.full(2, np.nan), np.zeros(2, int),
        ...                              np.zeros(2, bool)))
        >>> speeds.step_times.tolist(), speeds.steps_seen.tolist(), speeds.differ()
        ([0.1, 0.39], [12, 4], True)
    """

    def __init__(self, size: int) -> None:
        #: every rank's latest seconds per step (``None`` before any round)
        self.step_times: npt.NDArray[np.float64] | None = None
        #: every rank's local steps over the rounds
        self.steps_seen: npt.NDArray[np.int64] = np.zeros(size, dtype=np.int64)
        #: ``(steps_seen, step_times)`` at the second round that measured every rank (the first holds the
        #: start-up: a rank's first step counts from the optimizer's construction); a sampler that began an
        #: epoch before then splits what is left with them
        self.measured: tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None = None
        self._complete = 0
        self._history: deque[npt.NDArray[np.float64]] = deque(maxlen=HISTORY)

    def record(self, stats: RoundStats) -> None:
        """Take one round's statistics (identical on every rank)."""
        self.step_times = latest_step_times(self.step_times, stats.step_s)
        self.steps_seen = self.steps_seen + stats.local_steps
        if np.isfinite(stats.step_s).all():
            self._complete += 1
            if self._complete > 1:                    # the first holds the start-up
                self._history.append(np.asarray(stats.step_s, dtype=np.float64))
            if self.measured is None and self._complete == 2:
                self.measured = (self.steps_seen, self.step_times)

    def differ(self) -> bool:
        """Whether the ranks' speeds differ beyond the noise the rounds measured (``rules.partition.speeds_differ``
        over the last rounds that measured every rank, start-up's left out): where they do not, splitting an
        epoch by speed would split it by noise."""
        return bool(self._history) and speeds_differ(np.array(self._history))
