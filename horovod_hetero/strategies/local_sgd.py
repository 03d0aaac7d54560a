"""Local SGD: every worker steps alone; the model is averaged every ``period`` steps."""
from horovod_hetero.strategies.base import AVERAGE, CONTINUE, Strategy
from horovod_hetero.validation import as_schedule, check_int


class LocalSGD(Strategy):
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
        aggregate: how global rounds combine the models: ``"mean"`` or ``"normalized"`` (each rank's
            change divided by its local steps; ``strategies.aggregation``).
        outer: an outer optimiser for the global model, e.g. ``OuterSGD(lr=0.7, momentum=0.9,
            nesterov=True)``, or ``None`` (plain averaging).

    Example:
        >>> s = LocalSGD(period=3)
        >>> [s.after_step() for _ in range(7)]
        [CONTINUE, CONTINUE, AVERAGE, CONTINUE, CONTINUE, AVERAGE, CONTINUE]
    """

    def __init__(self, period, warmup_steps=0, aggregate="mean", outer=None):
        super().__init__(aggregate, outer)
        self.period = as_schedule("period", period, minimum=1)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, 0)
        self._period_arg = period
        self._next = None

    def decide(self, report):
        return self._scheduled(self.step)

    def _scheduled(self, step):
        """``AVERAGE`` if ``step`` averages, else ``CONTINUE``; called for every step, in order."""
        if step <= self.warmup_steps:
            return AVERAGE
        if step < self._upcoming():
            return CONTINUE
        self._next = step + self.period(step)
        return AVERAGE

    def _upcoming(self):
        """The next averaging step after the warm-up."""
        if self._next is None:
            self._next = self.warmup_steps + self.period(self.warmup_steps)
        return self._next

    def _skip_to(self, step):
        """Continue the schedule after ``step`` as if every step up to it had been decided."""
        while self._upcoming() <= step:
            self._next += self.period(self._next)

    @property
    def label(self):
        return f"LocalSGD({self._period_arg if isinstance(self._period_arg, int) else 'schedule'})" + self.aggregation_label

    def state_dict(self):
        return dict(super().state_dict(), next=self._next)

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self._next = state.get("next")

    def __repr__(self):
        return f"LocalSGD(period={self._period_arg!r}, warmup_steps={self.warmup_steps}{self._aggregation_repr()})"
