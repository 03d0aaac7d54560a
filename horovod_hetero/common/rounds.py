"""The round protocol: how ranks that make different numbers of steps still meet in every collective.

Every synchronisation is a *round*: one fused allreduce (sum) of the rank's tensors scaled by
its weight w_i, plus a small control vector ``[w_i, done_i, round]``. Each rank then sets its
tensors to ``sum(w_i * x_i) / sum(w_i)``, so a rank with weight 0 contributes nothing and adopts
the weighted mean of the others. Ranks count rounds, not steps, so a fast rank and a slow rank
that made different numbers of steps still enter the same round with the same name.

A rank that has run out of data or reached its stop condition calls ``join()``: it keeps
entering rounds as *done* (weight 1 in the first, if it stepped since the last round; 0 after)
until the summed ``done`` equals the number of ranks. The round in which the last rank joins
averages every rank's final model, so all ranks leave ``join()`` with identical tensors. This
needs no extra round trip: the done flags travel in the averaging collective itself.

The collective is injected (``average``), as Horovod's ``common/elastic.py`` takes its
broadcast: the protocol runs unchanged over torch, TensorFlow or a fake in tests.
"""
from dataclasses import dataclass

from horovod_hetero.common.validation import check_int

#: Sums of round tags stay below this, so the control vector is exact even in float32.
FLOAT32_EXACT = 1 << 24


@dataclass(frozen=True)
class RoundResult:
    """What every rank learns from one round."""

    round: int
    weight: float          # this rank's weight
    total_weight: float    # sum of the weights of all ranks
    done: int              # number of ranks that have joined (are done)


class RoundMismatchError(RuntimeError):
    """Ranks entered different rounds: a rank skipped or added a synchronisation."""


class RoundProtocol:
    """Weighted-averaging rounds that all ranks of a process set enter in the same order.

    Args:
        average: ``average(weight, control) -> summed_control``. Must allreduce-sum this rank's
            tensors multiplied by ``weight`` together with ``control`` (a list of 3 floats) in
            one collective (float32 is enough for the control vector), set each tensor to
            ``sum / summed_control[0]`` when that total is > 0 (else leave it unchanged), and
            return the summed control vector.
        size: number of ranks in the process set.

    Example:
        >>> fake = lambda weight, control: [c * 2 for c in control]   # two identical ranks
        >>> protocol = RoundProtocol(fake, size=2)
        >>> protocol.local_step(); protocol.run_round().total_weight
        2.0
    """

    def __init__(self, average, size):
        self._average = average
        self.size = check_int("size", size, 1)
        self.modulus = max(2, FLOAT32_EXACT // self.size)   # round tags modulo this
        self.round = 0
        self.steps_since_round = 0

    def local_step(self):
        """Record one local update that the next round must carry."""
        self.steps_since_round += 1

    def run_round(self, done=False):
        """Enter the next round; return its ``RoundResult``.

        The weight is 1 if this rank has updates the others have not seen (it stepped since
        the last round, or no round has happened yet), else 0.
        """
        weight = 1.0 if (self.steps_since_round > 0 or self.round == 0) else 0.0
        self.round += 1
        tag = self.round % self.modulus
        summed = self._average(weight, [weight, 1.0 if done else 0.0, float(tag)])
        if summed[2] != tag * self.size:
            raise RoundMismatchError(
                f"round {self.round}: ranks entered different rounds (sum of round tags {summed[2]}, "
                f"expected {tag * self.size}). Every rank must synchronise through the same "
                f"strategy and end with sync_model()/join().")
        self.steps_since_round = 0
        return RoundResult(self.round, weight, float(summed[0]), int(round(summed[1])))

    def join(self, on_round=None):
        """Enter rounds as *done* until every rank has joined; return the number of rounds entered.

        ``on_round()`` runs after each of them (the controller's per-round bookkeeping).
        """
        entered = 0
        while True:
            result = self.run_round(done=True)
            entered += 1
            if on_round is not None:
                on_round()
            if result.done >= self.size:
                return entered

    def state_dict(self):
        return {"round": self.round, "steps_since_round": self.steps_since_round}

    def load_state_dict(self, state):
        self.round = check_int("state['round']", state["round"], 0)
        self.steps_since_round = check_int("state['steps_since_round']", state["steps_since_round"], 0)
