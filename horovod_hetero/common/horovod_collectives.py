"""``HorovodCollectives``: the framework-independent half of an adapter's ``Collectives``.

Horovod's ``ProcessSet`` and its object collectives have the same Python API in ``horovod.torch``
and ``horovod.tensorflow``, so one base class serves both; a framework's ``Collectives`` sets
``hvd`` and adds the tensor operations (``allreduce_sum``, ``copy``).
"""
from __future__ import annotations

import contextlib
import functools
import os
import socket
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from horovod_hetero.common import compat
from horovod_hetero.common.failures import catch_background_abort, enqueueing, guard_gil
from horovod_hetero.common.process_sets import check_process_set, registered_ids
from horovod_hetero.common.ranks import ELASTIC_WITH_PROCESS_SETS, StaleRequestsReset, process_state, under_elastic
from horovod_hetero.errors import RankLostError
from horovod_hetero.runtime.seams import (DEFAULT_TIMEOUT_S, Collectives, call_with_timeout, check_background,
                                                failure_seen, library_answers, library_down, process_sets_held,
                                                requests_left)
from horovod_hetero.transports.addresses import server_host
from horovod_hetero.validation import check_float
from horovod_hetero.errors import troubleshooting

if TYPE_CHECKING:
    import psutil
    from horovod.common.process_sets import ProcessSet

#: Seconds ``lost_ranks`` waits, after a failed collective, for a rank of this host to show as dead.
LOST_SETTLE_S = 1.0
#: whether this process warned that a dead worker ends an elastic job with process sets (once)
_warned: list[bool] = []


def _stopped(hvd: Any) -> str | None:
    """Why Horovod completes no collective any more (``library_down``), or None."""
    if compat.horovod_stopped(hvd):
        return ("Horovod shut down after a collective failed (a rank died or its connection broke) and "
                "did not complete this one")
    return None


class HorovodCollectives(Collectives):
    """The framework-independent half of an adapter's ``Collectives``, over a Horovod process set.

    Args:
        process_set: the Horovod process set that synchronises (``None``: all ranks).
        timeout: seconds any collective may take before ``CollectiveTimeoutError``.
        owner: what the user built (names it in the errors raised here).
        members_only: refuse a rank outside ``process_set`` (else ``included`` is False and the
            adapter steps locally, as Horovod's optimizer does on non-members; ``rank``/``size`` None).
    """

    hvd: Any = None     # horovod.torch or horovod.tensorflow, set by the subclass
    _peers: list[tuple[str, int]] | None = None     # every rank's (host, pid), from know_peers()
    # {rank: psutil.Process} of this host's other ranks, when process sets are registered
    _watched: dict[int, psutil.Process] | None = None

    def __init__(self, process_set: ProcessSet | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 owner: str = "horovod_hetero", members_only: bool = True) -> None:
        hvd = self.hvd
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
        check_process_set(process_set)
        if not hvd.is_initialized():
            raise RuntimeError(f"{owner}: Horovod is not initialized; call hvd.init() first\n"
                               f"{troubleshooting('troubleshooting-not-initialized')}")
        #: Horovod's controller is MPI (asked once; the adapters read it here)
        self.mpi = bool(hvd.mpi_enabled())
        catch_background_abort(mpi=self.mpi)
        library_down[:] = [functools.partial(_stopped, hvd)]     # every wait of ours asks it (check_background)
        self.process_set = ps = process_set or hvd.global_process_set
        if ps.process_set_id is None:        # Horovod's own calls would fail later on its size (None)
            raise ValueError(f"{owner}: process_set {ps.ranks} is not registered with Horovod: register it at "
                             f"hvd.init(process_sets=[...]) or with hvd.add_process_set(...) (after "
                             f"hvd.init(process_sets='dynamic')) on every rank first")
        self.included = ps.included()
        # a non-member has no rank in the set (as Horovod's ProcessSet.rank()); the runtime is never built on it
        self.rank = self.size = None  # type: ignore[assignment]
        if not self.included:
            if members_only:
                raise ValueError(f"this rank is not in process_set; build the {owner} only on its members")
            return
        self.rank, self.size = ps.rank(), ps.size()
        self.root = 0 if ps == hvd.global_process_set else ps.ranks[0]
        self._sets: dict[tuple[int, ...], ProcessSet] = {}
        self._peers = None

    # (writable, as the base class's attribute: mypy takes a cached_property for a read-only property)
    @functools.cached_property
    def host(self) -> str:  # type: ignore[override]
        """``server_host``, found when a transport first needs it (a ``ValueError`` names what to set)."""
        return server_host(self.hvd.local_size() == self.hvd.size())

    def broadcast_object(self, obj: Any, *, what: str, root: int | None = None) -> Any:
        """``obj`` of the set's first rank (or of global rank ``root``) on every rank of the set."""
        check_background(what)
        return call_with_timeout(lambda: self.hvd.broadcast_object(
            obj, root_rank=self.root if root is None else root, process_set=self.process_set,
            name="horovod_hetero.broadcast"), self.timeout, what)

    def allgather_object(self, obj: Any, *, what: str) -> list[Any]:
        """Over all ranks (``horovod.torch`` gathers objects only over the global set)."""
        check_background(what)
        return call_with_timeout(lambda: self.hvd.allgather_object(obj, name="horovod_hetero.allgather"),
                                 self.timeout, what)

    def know_peers(self) -> None:
        """Every rank's (host name, process id), gathered once (object gathers span all ranks: only
        over the global set), with whether its last session ended in a failed collective
        (``requests_left``): under ``hvd.elastic`` every rank then raises ``StaleRequestsReset``."""
        if self.process_set == self.hvd.global_process_set and self._peers is None:
            left = requests_left.is_set() and under_elastic()
            peers = self.allgather_object((socket.gethostname(), os.getpid(), left),
                                          what="the exchange of the ranks' process ids")
            requests_left.clear()
            failed = [rank for rank, peer in enumerate(peers) if peer[2]]
            if failed:
                raise StaleRequestsReset(
                    f"the last session of rank {', '.join(map(str, failed))} ended in a failed collective: one "
                    f"more reset clears what it left in Horovod's queue")
            self._peers = [(host, pid) for host, pid, _ in peers]
            if len(compat.registered_process_sets(self.hvd)) <= 1:
                process_sets_held.clear()       # a new session: Horovod's reset dropped every other set
            else:
                self._hold_process_sets()
                self.watch_peers()

    def _hold_process_sets(self) -> None:
        """This session holds process sets besides the global one (``process_sets_held``): under
        ``hvd.elastic`` rank 0 warns, once, that a worker that dies then ends the job."""
        process_sets_held.set()
        if under_elastic() and self.rank == 0 and not _warned:
            _warned.append(True)
            warnings.warn(ELASTIC_WITH_PROCESS_SETS, stacklevel=3)

    def _local_peers(self) -> dict[int, int]:
        here = socket.gethostname()
        return {rank: pid for rank, (host, pid) in enumerate(self._peers or ()) if host == here and rank != self.rank}

    def lost_ranks(self) -> dict[int, str]:
        """As ``Collectives.lost_ranks``; waits up to ``LOST_SETTLE_S`` for a rank of this host that is
        still exiting (asked after a collective failed: a killed process closes its sockets, which
        fails its peers' collective, a moment before the kernel makes it a zombie)."""
        peers = self._local_peers()
        deadline = time.monotonic() + (LOST_SETTLE_S if peers else 0.0)
        while True:
            states = {rank: process_state(pid) for rank, pid in peers.items()}
            lost = {rank: state for rank, state in states.items() if state}
            if lost or time.monotonic() >= deadline:
                return lost
            time.sleep(0.02)

    def watch_peers(self) -> None:
        """Check this host's other ranks before every enqueue (``check_enqueue``) and end a process
        whose Python code stops running (``guard_gil``): needed once Horovod holds process sets
        besides the global one (``catch_background_abort`` says why)."""
        import psutil
        guard_gil(self.hvd.is_initialized)
        if self._watched is None and self._peers:
            self._watched = {}
            for rank, pid in self._local_peers().items():
                with contextlib.suppress(psutil.NoSuchProcess):
                    self._watched[rank] = psutil.Process(pid)

    def enqueueing(self, what: str) -> contextlib.AbstractContextManager[None]:
        """``common.failures.enqueueing`` with this adapter's checks: around an enqueue of ``what`` into Horovod."""
        def answers(give_up_s: float) -> bool:
            return library_answers(what, self.timeout, give_up_s)
        return enqueueing(lambda: self.check_enqueue(what), answers if process_sets_held.is_set() else None)

    def check_enqueue(self, what: str) -> None:
        """Raise ``RankLostError`` naming ``what`` rather than enqueue a collective that would block.

        Horovod's background thread failed (``check_background``); or, with process sets held, a
        collective of this process failed already (``failure_seen``), a rank of this host died, or
        Horovod's process-set table does not answer (``library_answers``): Horovod's background thread
        fails at a dead peer and, removing the process sets, holds the table's lock, which every enqueue
        takes while it holds the GIL (torch's are pybind calls), so no Python code, the terminate handler
        that reports the failure included, would run again until ``guard_gil`` ended the process. The
        table is asked on a thread of its own that waits without the GIL (some 0.1 ms in a healthy job),
        and the failure comes as a ``RankLostError`` (``enqueueing`` asks once more, then enqueues). About
        8 us more per rank of this host."""
        check_background(what)
        if process_sets_held.is_set():
            if failure_seen.is_set():
                raise RankLostError(f"{what} cannot complete: a collective of this process failed, and Horovod "
                                    f"cannot complete any other while it removes the job's process sets")
            library_answers(what, self.timeout)
        if self._watched:
            dead = sorted(rank for rank, process in self._watched.items() if process_state(process) == "died")
            if dead:
                raise RankLostError(f"{what} cannot complete: {', '.join(f'rank {r}' for r in dead)} of this "
                                    f"host died")

    def require_groups(self, rank_lists: Sequence[Sequence[int]], init_call: str) -> None:
        if self.process_set != self.hvd.global_process_set:
            raise ValueError("group averaging spans all ranks: leave process_set at its default, "
                             "hvd.global_process_set")
        def table() -> dict[int, list[int]]:
            return compat.registered_process_sets(self.hvd)

        if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") == "1":
            # hvd.init(process_sets="dynamic"): add what is missing, in the same order on every rank
            # (so the groups follow an elastic resize: Horovod's reset drops every set but the global one)
            registered = list(table().values())
            for ranks in (list(r) for r in rank_lists if list(r) not in registered):
                call_with_timeout(lambda: self.hvd.add_process_set(ranks), self.timeout,
                                  f"adding the process set {ranks}")
        self.watch_peers()
        for group, set_id in registered_ids(table(), rank_lists, init_call).items():
            self._sets[group] = compat.registered_process_set(group, set_id)
        if self._sets:
            self._hold_process_sets()

    def process_set_of(self, ranks: Sequence[int] | None) -> ProcessSet:
        """The Horovod process set that averages ``ranks`` (the whole set for None or every rank)."""
        if ranks is None or len(ranks) == self.size:
            return self.process_set
        return self._sets[tuple(ranks)]
