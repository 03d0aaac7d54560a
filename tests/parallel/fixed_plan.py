"""A test-only strategy with a schedule that does not depend on time: every round after a fixed number
of local steps per rank (rank SIZE-1 one, the others ``fast``), as ElasticBSP plans 1,1,1,4."""
from horovod_hetero.strategies import Plan, ModelAveraging


class FixedPlan(ModelAveraging):
    """A round after ``fast`` local steps on every rank but the last, which takes one. ``keep=True``: a
    restart keeps the plan it has (``on_start`` returns ``None``; the planned strategies shipped plan afresh)."""

    def __init__(self, fast=4, keep=False):
        super().__init__()
        self.fast, self.keep = fast, keep

    def _plan(self):
        return Plan(tuple([self.fast] * (self.size - 1) + [1]))

    def on_start(self, ctx):
        return None if self.keep and self.plan is not None else self._plan()

    def on_round(self, result):
        return self._plan()


def reference(grads, taus, rounds, aggregate="mean", outer=None, start=0.0):
    """The model every rank holds after each round, for constant per-rank gradients ``grads`` (lr 1)
    and ``taus`` local steps per round, computed here from the formulas (an independent reference of
    ``runtime.aggregator``): ``(lr, momentum, nesterov)`` or ``None`` for ``outer``."""
    w, m, out = start, None, []
    for _ in range(rounds):
        changes = [-g * t for g, t in zip(grads, taus)]
        if aggregate == "normalized":
            tau_eff = sum(taus) / len(taus)
            delta = tau_eff * sum(d / t for d, t in zip(changes, taus)) / len(taus)
        else:
            delta = sum(changes) / len(changes)
        if outer is None:
            w = w + delta
        else:
            lr, mu, nesterov = outer
            m = delta if m is None else mu * m + delta
            w = w + lr * ((delta + mu * m) if nesterov else m)
        out.append(w)
    return out
