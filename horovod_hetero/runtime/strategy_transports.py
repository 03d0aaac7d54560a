"""``Transports``: what a strategy opens outside Horovod's collectives (``ctx.transports``), closed by the runtime.

A strategy never builds a socket or a thread: it asks ``ctx.transports`` (a ``Transports``) for
what it needs in ``on_start``. The runtime closes everything opened here at the end of
``sync_model()`` / ``on_train_end`` and at interpreter exit, whichever comes first. The sockets
themselves are in ``horovod_hetero.transports``, which imports nothing of the runtime.
"""
from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from horovod_hetero.runtime.events import ModelEvents
from horovod_hetero.runtime.seams import Collectives, Tensor, scaled
from horovod_hetero.runtime.group_exchange import GroupExchange
from horovod_hetero.transports.activations import Activations
from horovod_hetero.transports.auth import check_key, new_key
from horovod_hetero.transports.state_server import StateClient, StateServer


class _Transport(Protocol):
    def close(self) -> None: ...


_TransportT = TypeVar("_TransportT", bound=_Transport)


class Transports:
    """Opens transports for one rank's strategy and closes all of them in ``close()``.

    Args:
        rank, size: this rank and the number of ranks.
        collectives: the runtime's ``Collectives`` (object broadcast/allgather, group allreduce,
            this host's address).
        model_changed: the controller's event of every change of the model (a wait-avoiding group exchange
            subscribes to it while it is open).

    Attributes:
        groups: the ``GroupExchange`` once a strategy opened groups (the runtime runs its
            ``GroupAverage`` decisions through it), else ``None``.
    """

    def __init__(self, rank: int, size: int, collectives: Collectives, model_changed: ModelEvents | None = None) -> None:
        self.rank, self.size = rank, size
        self._collectives = collectives
        self._model_changed = model_changed
        self._opened: list[_Transport] = []
        self.server: StateServer | None = None
        self.groups: GroupExchange | None = None
        self._key: bytes | None = None
        # closes what was opened when this object is closed, collected, or at interpreter exit
        self._finalizer = weakref.finalize(self, _close_all, self._opened)

    def _open(self, transport: _TransportT) -> _TransportT:
        self._opened.append(transport)
        return transport

    def key(self) -> bytes:
        """The job's key for the messages of these transports (``transports.auth``): drawn by the
        set's first rank (rank 0 here) and shared with one Horovod object broadcast the first time
        a transport needs it; a collective, so every rank asks at the same point."""
        if self._key is None:
            key = self._collectives.broadcast_object(new_key() if self.rank == 0 else None,
                                                     what="the broadcast of the job's message key")
            self._key = check_key(key, "the broadcast message key")
        return self._key

    def state_service(self, *, epsilon: float, overshoot: float, timeout: float,
                      address: str | None = None) -> StateClient:
        """ESync's state service: a ``StateClient`` for this rank (rank 0 also starts the
        ``StateServer`` and broadcasts its address), or a client of the server at ``address``
        (which must hold this job's ``key()``)."""
        key = self.key()
        if address is None:
            if self.rank == 0:
                self.server = self._open(StateServer(self.size, key, self._collectives.host, epsilon=epsilon,
                                                     overshoot=overshoot))
                address = self.server.address
            address = self._collectives.broadcast_object(address, what="the broadcast of the state server's address")
        return self._open(StateClient(address, self.rank, key, timeout=timeout))

    def open_groups(self, rank_lists: Sequence[Sequence[int]], init_call: str, *, wait_avoiding: bool,
                    patience: float, timeout: float) -> GroupExchange:
        """Group averaging over the process sets of ``rank_lists`` (registered at ``hvd.init``, else a
        ``ValueError`` naming ``init_call``); wait-avoiding with responders, or plain."""
        collectives = self._collectives
        collectives.require_groups(rank_lists, init_call)
        activations = None
        if wait_avoiding:
            activations = self._open(Activations(collectives.host, lambda address: collectives.allgather_object(
                address, what="the exchange of the group activation addresses"), self.rank, self.key()))

        def allreduce(model: Sequence[Tensor], weight: float, control: list[float], group: Sequence[int],
                      name: str) -> tuple[list[Tensor], list[float]]:
            return collectives.allreduce_sum(scaled(model, weight), control, ranks=group, name=name,
                                             what="group average")

        # the whole job is a group too (S = P: Horovod's global process set, never registered)
        self.groups = self._open(GroupExchange(self.rank, allreduce, activations, patience, timeout,
                                               groups=[*rank_lists, range(self.size)]))
        if self.groups.serves and self._model_changed is not None:
            self._open(_Unsubscribe(self._model_changed.subscribe(self.groups.model_changed)))
        return self.groups

    def groups_available(self, rank_lists: Sequence[Sequence[int]]) -> bool:
        """Whether every group of ``rank_lists`` can be averaged over (its process set registered)."""
        try:
            self._collectives.require_groups(rank_lists, "")
        except ValueError:
            return False
        return True

    def close(self) -> None:
        """Close everything opened, newest first (idempotent)."""
        self._finalizer()
        self.server = self.groups = None


class _Unsubscribe:
    """Closing it ends a subscription (opened after what it feeds, so closed before it)."""

    def __init__(self, unsubscribe: Callable[[], None]) -> None:
        self.close = unsubscribe


def _close_all(opened: list[_Transport]) -> None:
    """Close each transport, newest first; a failing close is logged and does not stop the others."""
    while opened:
        transport = opened.pop()
        try:
            transport.close()
        except Exception:                                   # noqa: BLE001 - keep closing the rest
            logging.getLogger("horovod_hetero").exception("closing %r failed", transport)
