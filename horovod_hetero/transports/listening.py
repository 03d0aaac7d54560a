"""What the transports' servers share of accepting connections (ESync's state server, WAGMA's activations)."""
from __future__ import annotations

import errno
import socket

#: ``accept`` errors that mean the process is out of descriptors or memory: it would fail at once again.
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


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
