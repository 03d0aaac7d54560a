"""``Periodic``: averaging every ``period`` steps after a warm-up (LocalSGD's rounds, WAGMA's global averages)."""
from __future__ import annotations

from collections.abc import Callable

from horovod_hetero.validation import as_schedule, check_int


class Periodic:
    """Which steps average: each of the first ``warmup_steps``, then every ``period(step)`` steps.

    Args:
        period: int >= 1, or a ``step -> int`` schedule of the steps until the next averaging
            (evaluated at each averaging step).
        warmup_steps: int >= 0, steps that each average first.
        name: the argument's name in errors (``"period"``, ``"sync_period"``).

    Example:
        >>> p = Periodic(3)
        >>> [s for s in range(1, 10) if p.due(s)]
        [3, 6, 9]
        >>> p.skip_to(13); p.due(14), p.due(15)
        (False, True)
    """

    def __init__(self, period: int | Callable[[int], int], warmup_steps: int = 0, name: str = "period") -> None:
        self.period = as_schedule(name, period, minimum=1)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, 0)
        self.next: int | None = None  # the next averaging step after the warm-up (in checkpoints: "next")

    def due(self, step: int) -> bool:
        """True if ``step`` averages; asked for every step, in order."""
        if step <= self.warmup_steps:
            return True
        if step < self._upcoming():
            return False
        self.next = step + self.period(step)
        return True

    def _upcoming(self) -> int:
        if self.next is None:
            self.next = self.warmup_steps + self.period(self.warmup_steps)
        return self.next

    def skip_to(self, step: int) -> None:
        """Continue after ``step`` as if every step up to it had been asked."""
        while self._upcoming() <= step:
            assert self.next is not None    # _upcoming() set it
            self.next += self.period(self.next)
