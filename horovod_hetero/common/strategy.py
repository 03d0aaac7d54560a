"""Synchronisation strategies: objects that own the schedule of when the model is synchronised.

A strategy is framework-free. The optimizer wrapper (torch) or callback (Keras) calls
``after_step()`` once per local optimizer step and runs an averaging round when it returns True;
the strategy's counters travel in ``state_dict()`` so a resumed run keeps its phase.
"""
from horovod_hetero.common.validation import as_schedule, check_int


class Strategy:
    """Base class: decides after each local step whether the model is averaged now.

    Subclasses set ``averages_gradients`` (True: gradients are allreduced every step by
    Horovod itself, as ``hvd.DistributedOptimizer`` does) and implement ``_decide(step)``.
    """

    averages_gradients = False

    def __init__(self):
        self.step = 0

    def after_step(self):
        """Count one local optimizer step; return True if the model is averaged after it."""
        self.step += 1
        return self._decide(self.step)

    def _decide(self, step):
        raise NotImplementedError

    def state_dict(self):
        return {"kind": type(self).__name__, "step": self.step}

    def load_state_dict(self, state):
        if state.get("kind") != type(self).__name__:
            raise ValueError(
                f"strategy state is for {state.get('kind')!r}, cannot load it into {type(self).__name__}")
        self.step = check_int("state['step']", state["step"], 0)

    def __repr__(self):
        return f"{type(self).__name__}()"


class Synchronous(Strategy):
    """Plain synchronous data-parallel SGD: gradients averaged every step.

    Behaves exactly like ``hvd.DistributedOptimizer`` (it is built on it), so switching a
    script between synchronous training and any other strategy changes one argument.

    Example:
        >>> Synchronous().after_step()
        False
    """

    averages_gradients = True

    def _decide(self, step):
        return False


class LocalSGD(Strategy):
    """Local SGD: every worker steps alone, the model is averaged every ``period`` steps.

    Periodic model averaging (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD";
    the local-update rule that ADSP's commit rate tunes). After ``warmup_steps`` steps that
    are each averaged, the model is averaged after the ``warmup_steps + period``-th,
    ``warmup_steps + 2*period``-th, ... step. Parameters and floating-point buffers are
    averaged with one fused allreduce.

    Args:
        period: int >= 1, or a ``step -> int`` schedule giving the number of local steps until
            the next averaging (evaluated at each averaging step).
        warmup_steps: int >= 0, number of initial steps averaged after every step.

    Example:
        >>> s = LocalSGD(period=3)
        >>> [s.after_step() for _ in range(7)]
        [False, False, True, False, False, True, False]
    """

    def __init__(self, period, warmup_steps=0):
        super().__init__()
        self.period = as_schedule("period", period, minimum=1)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, 0)
        self._period_arg = period
        self._next = None

    def _decide(self, step):
        if step <= self.warmup_steps:
            return True
        if self._next is None:
            self._next = self.warmup_steps + self.period(self.warmup_steps)
        if step < self._next:
            return False
        self._next = step + self.period(step)
        return True

    def state_dict(self):
        return dict(super().state_dict(), next=self._next)

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self._next = state.get("next")

    def __repr__(self):
        return f"LocalSGD(period={self._period_arg!r}, warmup_steps={self.warmup_steps})"


def check_strategy(strategy, allowed=(Strategy,)):
    """Return ``strategy`` (default ``Synchronous()``) or raise ``TypeError`` naming the allowed kinds."""
    if strategy is None:
        return Synchronous()
    if isinstance(strategy, type) and issubclass(strategy, Strategy):
        raise TypeError(f"strategy must be an instance, e.g. strategy={strategy.__name__}(...), "
                        f"not the class {strategy.__name__}")
    if not isinstance(strategy, allowed):
        names = ", ".join(sorted(c.__name__ for c in _concrete(allowed)))
        raise TypeError(f"strategy must be one of {names}; got {strategy!r} ({type(strategy).__name__})")
    return strategy


def _concrete(bases):
    seen, todo = set(), list(bases)
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls is not Strategy:
            seen.add(cls)
    return seen
