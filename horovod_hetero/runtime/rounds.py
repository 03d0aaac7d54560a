"""The round protocol: how ranks that make different numbers of steps still meet in every collective.

Every synchronisation is a *round*: one fused allreduce (sum) of the rank's tensors scaled by
its weight w_i, plus a small control vector. Each rank then sets its tensors to
``sum(w_i * x_i) / sum(w_i)``, so a rank with weight 0 contributes nothing and adopts the
weighted mean of the others. Ranks count rounds, not steps, so a fast rank and a slow rank that
made different numbers of steps still enter the same round with the same name.

The control vector is ``[w_i, done_i, round]`` followed by one block per rank of
``RoundStats.FIELDS`` (done, local steps, mean step time, mean loss, samples, shortest step, mean squared
step, its mean, the mean squared step, communication seconds per step and wall seconds from the previous
round's start to this one's), where rank i fills only
its own block. The sum therefore hands every rank every rank's
statistics, bit-identical everywhere (each slot is one value plus zeros): after a round every rank
knows every rank's speed with no extra message, and rank-independent plans computed from them are
identical by construction.

A rank that has run out of data or reached its stop condition calls ``join()``: it keeps
entering rounds as *done* (weight 1 in the first, if it stepped since the last round; 0 after)
until the summed ``done`` equals the number of ranks. The round in which the last rank joins
averages every rank's final model, so all ranks leave ``join()`` with identical tensors.

A strategy that averages gradients (``Balanced``) ends with Horovod's own ``hvd.join`` instead: a
rank inside it answers every allreduce with zeros, so a round the others run meanwhile sums its
whole block (and its round tag) as zero. Its runner's ``absent`` then names such a rank absent, not
in another round; its block reads as no steps, and plans made from the statistics keep theirs. What a
round carries as a rank's step time (the mean of its steps, or their median) is the runner's too:
the protocol takes both from its ``policy`` (a ``RoundPolicy``: ``runtime.runner``'s runners).

A round of statistics may also be begun and read later (``begin_round``, ``MEASURE_OVERLAPPED``): its sum is
started, the rank steps on (those steps belong to the next round), and the result is read at the next step.
Every rank begins and reads the same rounds in the same order, so they stay identical on every rank.

The collective is injected (``average``), as Horovod's ``common/elastic.py`` takes its
broadcast: the protocol runs unchanged over torch, TensorFlow or a fake in tests.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from horovod_hetero.errors import RoundMismatchError
from horovod_hetero.strategies.base import RoundResult, RoundStats
from horovod_hetero.validation import check_int

#: Sums of round tags stay below this, so the control vector is exact even in float32.
FLOAT32_EXACT = 1 << 24


def tag(value: int, members: int) -> int:
    """``value`` reduced so that the sum of ``members`` copies stays exact in float32."""
    return value % max(2, FLOAT32_EXACT // members)
_HEAD = 3                                   # [weight, done, round tag]
_WIDTH = len(RoundStats.FIELDS)


class RoundPolicy(Protocol):
    """What a round carries and how it reads zeros, by the strategy's kind (``runtime.runner.Runner``)."""

    def step_time(self, times: Sequence[float]) -> float:
        """This rank's step time in the round's statistics, from its steps' times since the previous round."""

    def absent(self, blocks: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_] | None:
        """Which ranks count as absent where the round tags do not add up (``None``: none may)."""


class MeanSteps:
    """The default ``RoundPolicy``: each rank's mean step time, no rank absent."""

    def step_time(self, times: Sequence[float]) -> float:
        return sum(times) / len(times)

    def absent(self, blocks: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_] | None:
        return None


class RoundProtocol:
    """Weighted-averaging rounds that all ranks of a process set enter in the same order.

    Args:
        average: ``average(weight, control) -> summed_control``. Must allreduce-sum this rank's
            tensors multiplied by ``weight`` together with ``control`` (a list of floats) in
            one collective (float32 is enough for the control vector), set each tensor to
            ``sum / summed_control[0]`` when that total is > 0 (else leave it unchanged), and
            return the summed control vector.
        size: number of ranks in the process set.
        rank: this rank (which block of the control vector it fills).
        policy: a ``RoundPolicy``: the step time a round carries for this rank (the mean of its steps
            since the previous round, or their median: a strategy that plans from the typical step, which
            one stall does not move), and which ranks whose whole block sums to zero are absent (inside
            ``hvd.join``, the end of a gradient-averaging strategy) rather than in another round: the
            round tags must then sum to the tag times the ranks present. Default: ``MeanSteps()``. The
            controller sets it from the strategy's runner (``policy`` may change between rounds).

    Example:
        >>> fake = lambda weight, control: [c * 2 for c in control]   # two identical ranks
        >>> protocol = RoundProtocol(fake, size=2)
        >>> protocol.local_step(step_s=0.5); protocol.run_round().total_weight
        2.0
    """

    def __init__(self, average: Callable[[float, list[float]], Sequence[float]], size: int, rank: int = 0,
                 policy: RoundPolicy | None = None) -> None:
        self._average = average
        self.policy: RoundPolicy = MeanSteps() if policy is None else policy
        self.size = check_int("size", size, 1)
        self.rank = check_int("rank", rank, 0, self.size - 1)
        self.round = 0
        self.steps_since_round = 0
        self._reset_stats()

    def _reset_stats(self) -> None:
        self._loss, self._losses, self._samples, self._comm = 0.0, 0, 0, 0.0
        self._times: list[float] = []

    @property
    def samples_since_round(self) -> int:
        """Samples this rank reported since the previous round (0: none reported)."""
        return self._samples

    def local_step(self, step_s: float | None = 0.0, loss: float | None = None, samples: int | None = None,
                   comm_s: float = 0.0) -> None:
        """Record one local update that the next round must carry, and its statistics (``comm_s``: the seconds
        it spent in collectives; ``step_s`` ``None``: a step whose time says nothing of the rank's speed, left
        out of the round's step times, which are NaN where no step of the round was timed)."""
        self.steps_since_round += 1
        if step_s is not None:
            self._times.append(step_s)
        self._comm += comm_s
        if loss is not None and math.isfinite(loss):
            self._loss += loss
            self._losses += 1
        if samples:
            self._samples += samples

    def _control(self, weight: float, done: bool, tag: int, wall_s: float) -> list[float]:
        control = [0.0] * (_HEAD + _WIDTH * self.size)
        control[:_HEAD] = [weight, 1.0 if done else 0.0, float(tag)]
        steps = self.steps_since_round
        start = _HEAD + _WIDTH * self.rank
        control[start:start + _WIDTH] = [
            1.0 if done else 0.0, float(steps),
            self.policy.step_time(self._times) if self._times else math.nan,
            self._loss / self._losses if self._losses else math.nan, float(self._samples),
            min(self._times) if self._times else math.nan,
            sum(self._times) / len(self._times) if self._times else math.nan,
            sum(t * t for t in self._times) / len(self._times) if self._times else math.nan,
            self._comm / steps if steps else math.nan, wall_s]
        return control

    def run_round(self, done: bool = False, average: Callable[[float, list[float]], Sequence[float]] | None = None,
                  wall_s: float = math.nan) -> RoundResult:
        """Enter the next round; return its ``RoundResult``.

        The weight is 1 if this rank has updates the others have not seen (it stepped since
        the last round, or no round has happened yet), else 0. ``average``: this round's
        collective, with the same contract as the protocol's (for example one that carries the
        control vector alone: a round of statistics); by default the protocol's. ``wall_s``: this rank's
        wall-clock seconds from the previous round's start to this one's, carried in its statistics.
        """
        weight, control = self._enter(done, wall_s)
        summed = (average or self._average)(weight, control)
        self.steps_since_round = 0
        self._reset_stats()
        return self._read(self.round, weight, control, summed)

    def begin_round(self, start: Callable[[list[float]], Callable[[], Sequence[float]]],
                    wall_s: float = math.nan) -> Callable[[], RoundResult]:
        """Enter the next round of statistics without waiting for it (``MEASURE_OVERLAPPED``): ``start(control)``
        starts the sum of the control vector and returns what waits for it (``Collectives.start_sum``). Return
        what waits for the round and returns its ``RoundResult``; the steps this rank takes meanwhile belong to
        the round after it. The round carries no model: its weight is that of a round of statistics."""
        weight, control = self._enter(False, wall_s)
        summed = start(control)
        number = self.round
        self.steps_since_round = 0
        self._reset_stats()
        return lambda: self._read(number, weight, control, summed())

    def _enter(self, done: bool, wall_s: float) -> tuple[float, list[float]]:
        """The next round's number taken, and this rank's weight and control vector for it."""
        weight = 1.0 if (self.steps_since_round > 0 or self.round == 0) else 0.0
        self.round += 1
        return weight, self._control(weight, done, tag(self.round, self.size), wall_s)

    def _read(self, number: int, weight: float, control: list[float], summed: Sequence[float]) -> RoundResult:
        """Round ``number``'s ``RoundResult`` from its summed control vector, or ``RoundMismatchError``."""
        mine = tag(number, self.size)
        present, absent = self.size, None
        if summed[2] != mine * present and len(summed) == len(control):
            absent = self.policy.absent(np.reshape(np.asarray(summed[_HEAD:], dtype=np.float64), (self.size, _WIDTH)))
            present -= 0 if absent is None else int(absent.sum())
        if summed[2] != mine * present:
            raise RoundMismatchError(
                f"round {number}: ranks entered different rounds (sum of round tags {summed[2]}, "
                f"expected {mine * present}). Every rank must synchronise through the same "
                f"strategy and end with sync_model()/join().")
        if len(summed) != len(control):
            raise RoundMismatchError(f"round {number}: control vectors of {len(summed)} and {len(control)} "
                                     f"values: ranks disagree on the number of ranks")
        blocks = np.array(np.reshape(summed[_HEAD:], (self.size, _WIDTH)), dtype=np.float64)
        if absent is not None:          # read as a rank with no step since the round: no time, no loss
            blocks[absent, 2:4] = math.nan
            blocks[absent, 5:] = math.nan
        stats = RoundStats.from_block(blocks)
        return RoundResult(number, weight, float(summed[0]), int(round(summed[1])), stats)

    def join(self, on_round: Callable[[RoundResult], object] | None = None) -> int:
        """Enter rounds as *done* until every rank has joined; return the number of rounds entered.

        ``on_round(result)`` runs after each of them (the controller's per-round bookkeeping).
        """
        entered = 0
        while True:
            result = self.run_round(done=True)
            entered += 1
            if on_round is not None:
                on_round(result)
            if result.done >= self.size:
                return entered

    def state_dict(self) -> dict[str, int]:
        return {"round": self.round, "steps_since_round": self.steps_since_round}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.round, self.steps_since_round = check_counters(state)


def check_counters(state: Mapping[str, Any]) -> tuple[int, int]:
    """``(round, steps_since_round)`` of a ``RoundProtocol.state_dict()``, each an int >= 0, else raise naming it."""
    return (check_int("state['round']", state.get("round"), 0),
            check_int("state['steps_since_round']", state.get("steps_since_round"), 0))
