"""ESync's state server decision (QUERY-STATE) as a pure, clock-injected object.

Li et al., "ESync: An Efficient Synchronous Parallel Algorithm for Distributed ML in
Heterogeneous Clusters", Algorithm 2. Before each local iteration a worker asks whether to
aggregate now. It is *ready* when it has made at least one local iteration this round and
(it is the slowest worker, or the slowest is already ready, or it cannot finish another
iteration before the slowest finishes its current one: ``capability + eps > rest time``).
So when the slowest worker completes one iteration the others have done as many as fit.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from horovod_hetero.validation import check_float, check_int


@dataclass
class Record:
    """The listing's record: (rank, local_iterations, capability, last_finish_time, ready, round)."""

    rank: int
    local_iterations: int = 0
    capability: float | None = None      # seconds per local iteration (query round trip included)
    last_finish_time: float | None = None
    ready: bool = False
    round: int = 0
    left: bool = False            # stopped training (joined): not counted as the slowest


class ESyncState:
    """QUERY-STATE and RESET-STATE-SERVER of ESync for ``size`` workers.

    Args:
        size: number of workers.
        epsilon: small slack (seconds) against boundary errors, the paper's eps.
        overshoot: fraction of a worker's own step time by which its next step may end after
            the slowest's (0, the default, is the paper's rule). With speeds in an exact ratio
            (1:4) the paper's rule stops fast workers one step early, since their query round
            trips add up; 0.5 lets the slowest wait at most half a fast step instead.
        clock: the server's clock (injected so tests are exact).

    The slowest worker is the one with the largest capability (ties: the lowest rank). A
    worker that has not reported yet, or a slowest worker still in an earlier round (it has
    not pulled the new model), makes everyone not ready. The slowest is kept incrementally
    (recomputed only when the slowest itself speeds up or leaves), so a query costs O(1) in
    the common case: the simulator runs this object for 10,000 workers.

    Example:
        >>> now = [10.0]
        >>> s = ESyncState(2, epsilon=0.01, clock=lambda: now[0])
        >>> s.query(1, 0, 4.0, 10.0), s.query(0, 1, 1.0, 10.0)   # slow worker starts at 10
        (False, False)
        >>> now[0] = 13.5; s.query(0, 4, 1.0, 13.5)                # 0.5 s left, 1 s step: ready
        True
    """

    def __init__(self, size: int, epsilon: float = 1e-3, overshoot: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.size = check_int("size", size, 1)
        self.epsilon = check_float("epsilon", epsilon, 0.0)
        self.overshoot = check_float("overshoot", overshoot, 0.0, 1.0)
        self.clock = clock
        self.records = [Record(rank) for rank in range(self.size)]
        self.entered_round = -1              # the latest round a worker aggregates without an answer (``enter``)
        self._recount()

    def _recount(self) -> None:
        self._unreported = sum(1 for r in self.records if not r.left and r.capability is None)
        self._slowest: Record | None = None  # None: recompute on demand

    def _record(self, rank: int) -> Record:
        return self.records[check_int("rank", rank, 0, self.size - 1)]

    @staticmethod
    def _key(record: Record) -> tuple[float | None, int]:
        return record.capability, -record.rank

    def slowest(self) -> Record | None:
        """The slowest worker still training, or None while one of them has not reported."""
        if self._unreported:
            return None
        if self._slowest is None:
            active = [r for r in self.records if not r.left]
            self._slowest = max(active, key=self._key) if active else None
        return self._slowest

    def _set_capability(self, record: Record, capability: float) -> None:
        old, record.capability = record.capability, capability
        if old is None:
            self._unreported -= 1
        if record is self._slowest:
            assert old is not None           # the slowest is chosen among reported records
            if capability < old:
                self._slowest = None         # someone else may be slower now
        elif self._slowest is not None and self._key(record) > self._key(self._slowest):
            self._slowest = record

    def _activate(self, record: Record) -> None:
        """A worker that had left trains again (its next query rejoins it)."""
        record.left = False
        if record.capability is None:
            self._unreported += 1
        elif self._slowest is not None and self._key(record) > self._key(self._slowest):
            self._slowest = record

    def query(self, rank: int, local_iterations: int, capability: float | None, last_finish_time: float) -> bool:
        """QUERY-STATE: update ``rank``'s record and answer whether it aggregates now.

        ``capability=None`` leaves it unchanged (the listing's -1), e.g. for the k = 0 query
        that registers a worker before it has measured a step.
        """
        current = self._record(rank)
        local_iterations = check_int("local_iterations", local_iterations, 0)
        if capability is not None:
            capability = check_float("capability", capability, 0.0)
        if current.left:
            self._activate(current)
        current.local_iterations = local_iterations
        if capability is not None:
            self._set_capability(current, capability)
        current.last_finish_time = check_float("last_finish_time", last_finish_time)
        slowest = self.slowest()
        if current.local_iterations > 0 and current.round == self.entered_round:
            current.ready = True             # someone waits in this round's aggregation already
            return True
        if current.local_iterations == 0 or slowest is None or slowest.round < current.round:
            return False
        # every worker reported (a slowest exists), so both records hold a capability and a finish time
        assert (slowest.capability is not None and slowest.last_finish_time is not None
                and current.capability is not None)
        rest = slowest.capability - self.clock() + slowest.last_finish_time
        step = current.capability * (1.0 - self.overshoot)
        if current is slowest or slowest.ready or step + self.epsilon > rest:
            current.ready = True
        return current.ready

    def reset(self, rank: int, round: int, finish_time: float) -> None:
        """RESET-STATE-SERVER: ``rank`` finished the aggregation of round ``round - 1``."""
        current = self._record(rank)
        current.round = check_int("round", round, 0)
        current.local_iterations = 0
        current.ready = False
        current.last_finish_time = check_float("finish_time", finish_time)

    def enter(self, rank: int, round: int) -> None:
        """``rank`` aggregates round ``round`` without waiting for an answer (it fell back: the server
        did not answer in time). Every worker in that round is then ready at its next query with a
        local step, so none waits for records that stay still until the round is done."""
        round = check_int("round", round, 0)
        if round < self._record(rank).round:
            return                           # late: that round is over for this worker
        if round > self._record(rank).round:
            self.reset(rank, round, self.clock())
        self._record(rank).ready = True
        self.entered_round = max(self.entered_round, round)

    def leave(self, rank: int) -> None:
        """``rank`` stopped training (it joins the others' rounds until they stop too)."""
        record = self._record(rank)
        if not record.left:
            record.left = True
            if record.capability is None:
                self._unreported -= 1
            if record is self._slowest:
                self._slowest = None

    def answer(self, rank: int, local_iterations: int, capability: float | None, round: int) -> tuple[bool, bool]:
        """A worker's query as the state server takes it: ``(ready, is_slowest)``.

        A query for a round the record is not in yet means the worker's RESET was lost on the
        way: the record catches up first. Times are this object's clock at arrival.
        """
        round = check_int("round", round, 0)
        if round != self._record(rank).round:
            self.reset(rank, round, self.clock())
        ready = self.query(rank, local_iterations, capability, self.clock())
        slowest = self.slowest()
        return ready, slowest is not None and slowest.rank == rank

    def state_dict(self) -> dict[str, Any]:
        return {"records": [vars(r).copy() for r in self.records]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.records = [Record(**r) for r in state["records"]]
        self._recount()
