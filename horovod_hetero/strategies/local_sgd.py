"""Local SGD: every worker steps alone; the model is averaged every ``period`` steps."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from horovod_hetero.strategies.base import AVERAGE, CONTINUE, Decision, ModelAveraging, StepReport
from horovod_hetero.strategies.periodic import Periodic


class LocalSGD(ModelAveraging):
    """Local SGD: every worker steps alone, the model is averaged every ``period`` steps.

    Periodic model averaging (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD";
    the local-update rule that ADSP's commit rate tunes). After ``warmup_steps`` steps that
    are each averaged, the model is averaged after the ``warmup_steps + period``-th,
    ``warmup_steps + 2*period``-th, ... step: the decision is ``AVERAGE`` then, and the runtime
    averages parameters and floating-point buffers with one fused Horovod ``grouped_allreduce``.
    PyTorch's ``PeriodicModelAverager(period, warmup_steps=W)`` skips averaging in its warm-up and
    averages after steps W+1, W+1+period, ...: ``LocalSGD(p, w)`` is "average after each of steps
    1..w" plus ``PeriodicModelAverager(p, w + p - 1)``.

    Args:
        period: int >= 1, or a ``step -> int`` schedule giving the number of local steps until
            the next averaging (evaluated at each averaging step).
        warmup_steps: int >= 0, number of initial steps averaged after every step.

    Example:
        >>> s = LocalSGD(period=3)
        >>> [s.after_step() for _ in range(7)]
        [CONTINUE, CONTINUE, AVERAGE, CONTINUE, CONTINUE, AVERAGE, CONTINUE]
    """

    lockstep = True                # every rank averages at the same step counts

    def __init__(self, period: int | Callable[[int], int], warmup_steps: int = 0) -> None:
        super().__init__()
        self.schedule = Periodic(period, warmup_steps)
        self._period_arg = period

    @property
    def period(self) -> Callable[[int], int]:
        """The schedule of local steps between averages (``step -> int``; a constant for an int ``period``)."""
        return self.schedule.period

    @property
    def warmup_steps(self) -> int:
        return self.schedule.warmup_steps

    def decide(self, report: StepReport) -> Decision:
        return AVERAGE if self.schedule.due(self.step) else CONTINUE

    @property
    def label(self) -> str:
        return f"LocalSGD({self._period_arg if isinstance(self._period_arg, int) else 'schedule'})"

    def state_dict(self) -> dict[str, Any]:
        return dict(super().state_dict(), next=self.schedule.next)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.schedule.next = state.get("next")

    def __repr__(self) -> str:
        return f"LocalSGD(period={self._period_arg!r}, warmup_steps={self.warmup_steps})"
