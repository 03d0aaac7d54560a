"""What the transports' servers share of accepting connections (ESync's state server, WAGMA's activations)."""
from __future__ import annotations

import collections
import errno
import selectors
import socket
import time
from typing import Generic, Hashable, TypeVar

#: ``accept`` errors that mean the process is out of descriptors or memory: it would fail at once again.
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
#: connections accepted per pass of a server's loop (the rest wait in the listener's backlog)
ACCEPTS_PER_PASS = 64
#: out of descriptors: seconds before the listener is watched again
ACCEPT_PAUSE_S = 0.1

C = TypeVar("C", bound=Hashable)


class Handshakes(Generic[C]):
    """A server's listener and the connections it accepted that have not yet authenticated.

    Each such connection has a deadline; the oldest are ended first (silent past their deadline, or
    beyond the server's limit of waiting connections). Out of descriptors, the listener is taken out
    of ``selector`` for ``ACCEPT_PAUSE_S`` (it stays readable: ``accept`` would fail at once again).
    The server owns the connections: ``Handshakes`` only says which to end; the server ends them
    (``done``) and counts them.

    Args:
        selector: the server's selector, where ``listener`` is registered with ``data``.
        listener: the non-blocking listening socket.
        data: what the listener is registered with (registered again after a pause).
    """

    def __init__(self, selector: selectors.BaseSelector, listener: socket.socket, data: object) -> None:
        self._selector, self._listener, self._data = selector, listener, data
        self._deadlines: collections.OrderedDict[C, float] = collections.OrderedDict()   # oldest first
        self.paused_until: float | None = None

    def __contains__(self, connection: object) -> bool:
        return connection in self._deadlines

    def __len__(self) -> int:
        return len(self._deadlines)

    def connections(self) -> list[C]:
        return list(self._deadlines)

    def accept(self) -> tuple[list[socket.socket], OSError | None]:
        """``accept_waiting`` (up to ``ACCEPTS_PER_PASS``); out of resources, pause the listener."""
        accepted, exhausted = accept_waiting(self._listener, ACCEPTS_PER_PASS)
        if exhausted is not None:
            self._selector.unregister(self._listener)
            self.paused_until = time.monotonic() + ACCEPT_PAUSE_S
        return accepted, exhausted

    def add(self, connection: C, timeout_s: float, limit: int) -> C | None:
        """``connection`` waits to authenticate for ``timeout_s``; the oldest waiting one if more
        than ``limit`` wait (the server judges what it sent, and ends it if still waiting)."""
        self._deadlines[connection] = time.monotonic() + timeout_s
        return next(iter(self._deadlines)) if len(self._deadlines) > limit else None

    def done(self, connection: C) -> None:
        """``connection`` authenticated, or was ended."""
        self._deadlines.pop(connection, None)

    def wake_in(self) -> float | None:
        """Seconds until the oldest deadline or the end of a pause (``None``: neither)."""
        deadlines = [next(iter(self._deadlines.values()))] if self._deadlines else []
        if self.paused_until is not None:
            deadlines.append(self.paused_until)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def expired(self) -> list[C]:
        """The connections past their deadline, oldest first (taken out; the server ends them);
        after a pause, the listener is watched again."""
        now = time.monotonic()
        if self.paused_until is not None and self.paused_until <= now:
            self.paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ, self._data)
        late: list[C] = []
        while self._deadlines:
            connection, deadline = next(iter(self._deadlines.items()))
            if deadline > now:
                break
            late.append(connection)
            del self._deadlines[connection]
        return late


def accept_waiting(listener: socket.socket, limit: int) -> tuple[list[socket.socket], OSError | None]:
    """Up to ``limit`` connections waiting on the non-blocking ``listener``, each made non-blocking,
    and the error that stopped accepting if the process is out of resources (``OUT_OF_RESOURCES``:
    the caller pauses accepting, as the listener stays readable); a connection that failed before it
    was accepted, or while being set up, is skipped."""
    accepted: list[socket.socket] = []
    for _ in range(limit):
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            break
        except OSError as e:
            if e.errno in OUT_OF_RESOURCES:
                return accepted, e
            continue                                # that connection failed before it was accepted
        try:
            sock.setblocking(False)
        except OSError:                             # e.g. reset before it was set up
            sock.close()
            continue
        accepted.append(sock)
    return accepted, None


def read_some(sock: socket.socket, size: int) -> bytes | None:
    """Up to ``size`` bytes from the non-blocking ``sock``: ``b""`` if the connection is gone (closed
    or reset), ``None`` if nothing has arrived yet."""
    try:
        return sock.recv(size)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:                                 # reset
        return b""
