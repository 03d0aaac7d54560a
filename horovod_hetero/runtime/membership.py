"""The controller for Horovod's current ranks: rebuilt after an elastic reset, for torch and Keras alike.

``hvd.elastic.run`` shuts Horovod down and initialises it again when a worker is added, removed or
failed (a collective raised ``HorovodInternalError``); the ranks, the size and rank 0's process may
all change. The adapters reach their controller through a ``Membership``: when Horovod's (rank,
size) differ from the ones the controller was built for, or a collective failed, the old controller
closes what the strategy opened and a new one is built for the new ranks. The strategy object
carries over (its step counters), and re-plans when the new controller starts.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Generic, NoReturn, Protocol, TypeVar

from horovod_hetero.runtime.seams import forget_failure, requests_left

log = logging.getLogger(__name__)


class _Closable(Protocol):
    def close(self) -> None: ...


_C = TypeVar("_C", bound=_Closable)


class Membership(Generic[_C]):
    """Follows Horovod's ranks for an adapter.

    Args:
        build: ``build(previous)``: a controller for the current ranks (``previous``: the one it
            replaces, or None the first time).
        world: ``() -> (rank, size)`` of Horovod now (the adapter's ``hvd.rank()``, ``hvd.size()``).
        failure: the exception type of a failed collective (Horovod's ``HorovodInternalError``).
        lost: ``lost(controller, error)``: the error to raise instead of ``error``, which a step or a
            sync raised (a ``RankLostError`` naming what ``controller`` was doing), or None to let
            ``error`` through.

    Example:
        >>> world = [(0, 2)]
        >>> m = Membership(lambda previous: object(), lambda: world[0], RuntimeError)
        >>> first = m.current(); world[0] = (0, 4)
        >>> m.current() is first, m.current() is m.current()
        (False, True)
    """

    def __init__(self, build: Callable[[_C | None], _C], world: Callable[[], tuple[int, int]],
                 failure: type[BaseException],
                 lost: Callable[[_C, BaseException], BaseException | None] | None = None) -> None:
        self._build, self._world, self._failure, self._lost = build, world, failure, lost
        self.controller: _C | None = None
        self._seen: tuple[int, int] | None = None
        self._failed = False

    def current(self) -> _C:
        """The controller for the ranks Horovod has now."""
        world = self._world()
        if self.controller is None or world != self._seen or self._failed:
            previous = self.controller
            if previous is not None:
                log.info("Horovod's ranks changed (%s -> %s%s): the strategy goes on under a new controller",
                         self._seen, world, ", after a failed collective" if self._failed else "")
                with contextlib.suppress(Exception):      # the old ranks' transports: peers may be gone
                    previous.close()
                forget_failure()                          # Horovod started again: its failure is over
            self.controller = self._build(previous)
            self._seen, self._failed = world, False
        return self.controller

    @contextlib.contextmanager
    def guard(self) -> Iterator[_C]:
        """Around a step or a sync: a failed collective means new ranks after ``hvd.elastic``'s reset,
        or, outside it, a lost rank (``lost``)."""
        controller = self.current()
        try:
            yield controller
        except Exception as e:
            self.reraise(e, controller)

    def reraise(self, error: BaseException, controller: _C | None = None) -> NoReturn:
        """Raise what ``error`` (raised by a collective of ``controller``, default: the current one)
        means: the same error after noting a failed collective (and ``requests_left``, unless the
        error says ``clears_requests``: the reset that clears them), or ``lost``'s ``RankLostError``.

        For collectives Horovod enqueues outside a guarded call: the gradient hooks that
        ``loss.backward()`` runs (``hvd.DistributedOptimizer``'s), which must fail as a step does.
        """
        controller = self.controller if controller is None else controller
        replacement = self._lost(controller, error) if self._lost is not None and controller is not None else None
        if isinstance(error, self._failure) or isinstance(replacement, self._failure):
            self._failed = True             # the next call builds a new controller (after elastic's reset)
            if not getattr(error, "clears_requests", False):
                requests_left.set()         # a reset that clears them is not a failure (``know_peers``)
        if replacement is None:
            raise error
        raise replacement from error
