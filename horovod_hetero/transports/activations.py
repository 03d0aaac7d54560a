"""Activation messages between ranks (TCP lines, standard library): "group average ``tag`` of ``group`` has started".

Horovod has no one-sided activation, so wait-avoiding group averaging (``runtime.group_exchange``)
sends one: each rank listens on a TCP socket, the addresses are exchanged with one
``allgather_object``, and a rank that starts a group average sends ``b"<tag> <r1>,<r2>,..."`` to
its peers, sealed with the job's key (``transports.auth``), one message per line::

    b"<sender> <counter> <mac> <tag> <r1>,<r2>,...\\n"

The ``Channel`` of each (sender, receiver) pair binds both ranks into the MAC, and its counter
grows with every activation the sender sends that receiver, so a message forged without the key,
replayed, or redirected to another rank is refused. Whatever is refused (not authentic, a sender
out of range, a body that does not parse, a line over ``MAX_MESSAGE_BYTES``, a line cut off by the
end of its connection) is dropped and counted (``dropped``), never acted on, and ends the
connection it came on.

No thread: ``send`` (non-blocking sockets) writes what the peer's socket takes and keeps the rest,
whole messages only, at most ``QUEUE`` per peer (beyond that the newest is dropped: the peer is far
behind, its responder catches up); every ``send`` and ``receive`` call writes more of it. A
connection error drops that peer's connection and what waits for it; the next ``send`` connects
again. ``receive`` serves the listening socket and its connections with ``selectors``: a connection
must deliver its first authentic message within ``HANDSHAKE_S`` (else it is ended), at most
``MAX_CONNECTIONS`` wait for that (a newer one ends the oldest), and at most ``QUEUE`` received
messages wait for the responder (then no connection is read until it catches up). Connections
ended this way, without a refused message, are counted in ``refused``.
"""
from __future__ import annotations

import collections
import errno
import selectors
import socket
import threading
import time
from typing import Callable, Iterable, Optional, Tuple

from horovod_hetero.transports.auth import Channel, check_key
from horovod_hetero.transports.listening import Handshakes, read_some
from horovod_hetero.validation import parse_address

#: The longest line (one message, its newline not counted) a connection may send; a longer one ends it
#: (an activation is about 100 bytes plus 5 per rank).
MAX_MESSAGE_BYTES = 8192
#: Seconds a new connection has to deliver its first authentic message before it is ended.
HANDSHAKE_S = 5.0
#: Connections waiting to deliver their first authentic message; one more ends the oldest.
MAX_CONNECTIONS = 64
#: Messages waiting, per peer, for its socket to take them (beyond: the newest is dropped); and
#: received messages waiting for the responder (beyond: no connection is read until it catches up).
QUEUE = 1000
#: Bytes read from a connection at once.
RECV_BYTES = 65536

Activation = Tuple[int, Tuple[int, ...]]

_IN_PROGRESS = (0, errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR)
_NO_SIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)     # a closed peer: EPIPE, not SIGPIPE


def encode(tag: int, group: Iterable[int]) -> bytes:
    return b"%d %s" % (tag, ",".join(map(str, group)).encode())


def decode(message: bytes) -> Optional[Activation]:
    """``(tag, group)`` from a message body, or ``None`` if it is not one."""
    try:
        tag, ranks = message.split(b" ")
        return int(tag), tuple(int(r) for r in ranks.split(b","))
    except ValueError:
        return None


def _context(sender: int, receiver: int) -> bytes:
    return b"activation|%d>%d" % (sender, receiver)


class _Peer:
    """This rank's connection to one peer: the socket (``None``: not connected), whole messages
    waiting for it, and how many bytes of the first of them were written."""

    __slots__ = ("sock", "pending", "written")

    def __init__(self) -> None:
        self.sock: Optional[socket.socket] = None
        self.pending: collections.deque[bytes] = collections.deque()
        self.written = 0


class _Connection:
    """A connection accepted by this rank: bytes received short of a parsed line."""

    __slots__ = ("sock", "inbox")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox = bytearray()


class Activations:
    """A listening socket for this rank, connections to its peers (opened on first use).

    Args:
        host: address to bind.
        allgather: ``allgather(obj) -> list`` over all ranks (exchanges the addresses).
        rank: this rank (its index in the gathered list).
        key: the job's key.

    Attributes:
        addresses: every rank's ``tcp://host:port``.
        dropped: messages refused (each ended its connection).
        refused: connections ended without a refused message (silent past ``HANDSHAKE_S``, or the
            oldest of more than ``MAX_CONNECTIONS`` waiting).

    No thread is started: ``send`` may be called from one thread while another calls ``receive``
    (a lock guards what ``send`` writes); ``close()`` closes every socket.
    """

    def __init__(self, host: str, allgather: Callable[[str], list], rank: int, key: bytes) -> None:
        self.rank = rank
        self._key = check_key(key)
        self._lock = threading.Lock()                   # the sending side: _peers, _sending, _targets
        self._peers: dict[int, _Peer] = {}
        self._sending: dict[int, Channel] = {}          # peer -> Channel of what this rank sends it
        self._targets: dict[int, tuple] = {}            # peer -> (family, socket address), resolved once
        self._receiving: dict[int, Channel] = {}        # peer -> Channel of what it receives from it
        self._connections: dict[_Connection, None] = {}
        self._waiting: dict[_Connection, None] = {}     # connections with whole lines left unparsed (QUEUE full)
        self._queue: collections.deque[Activation] = collections.deque()
        self._closed = False
        self.dropped = 0
        self.refused = 0
        self._listener: Optional[socket.socket] = None
        self._handshakes: Optional[Handshakes[_Connection]] = None
        self._selector = selectors.DefaultSelector()
        try:
            # every rank may connect at once: a short backlog would drop (and delay) their SYNs
            self._listener = socket.create_server((host, 0), backlog=socket.SOMAXCONN)   # a port chosen by the OS
            self._listener.setblocking(False)
            self._selector.register(self._listener, selectors.EVENT_READ, None)
            self._handshakes = Handshakes(self._selector, self._listener, None)
            self.addresses = allgather(f"tcp://{host}:{self._listener.getsockname()[1]}")
        except BaseException:
            self.close()
            raise

    # --- sending -----------------------------------------------------------------------------

    def send(self, rank: int, tag: int, group: Iterable[int]) -> None:
        """Tell ``rank`` that group average ``tag`` of ``group`` has started (never blocks)."""
        with self._lock:
            if self._closed:
                return
            if rank not in self._sending:
                self._sending[rank] = Channel(self._key, sends=_context(self.rank, rank))
            peer = self._peers.setdefault(rank, _Peer())
            if peer.sock is None:
                self._connect(rank, peer)
            if peer.sock is not None and len(peer.pending) < QUEUE:   # else: the peer is far behind
                peer.pending.append(b"%d %s\n" % (self.rank, self._sending[rank].seal(encode(tag, group))))
            self._flush_all()

    def _connect(self, rank: int, peer: _Peer) -> None:
        """Start a non-blocking connection to ``rank`` (``peer.sock`` stays ``None`` if it failed at once)."""
        try:
            if rank not in self._targets:
                host, port = parse_address(self.addresses[rank], "an activation address")
                family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
                self._targets[rank] = (family, address)
            family, address = self._targets[rank]
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:                                     # e.g. out of file descriptors: this message is lost
            return
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connected = sock.connect_ex(address)
        except OSError:
            connected = -1
        if connected not in _IN_PROGRESS:
            sock.close()
            return
        peer.sock = sock

    def _flush_all(self) -> None:
        """Write what waits for every peer, as much as each socket takes (the caller holds ``_lock``)."""
        for peer in self._peers.values():
            if peer.pending:
                self._flush(peer)

    def _flush(self, peer: _Peer) -> None:
        """Write ``peer``'s waiting messages until its socket takes no more; a connection error
        closes it and drops them (the next ``send`` connects again)."""
        sock = peer.sock
        assert sock is not None
        while peer.pending:
            head = peer.pending[0]
            try:
                peer.written += sock.send(memoryview(head)[peer.written:], _NO_SIGNAL)
            except (BlockingIOError, InterruptedError):     # full, or still connecting: the rest waits
                return
            except OSError:                                 # refused, reset, EPIPE: the peer went away
                sock.close()
                peer.sock, peer.written = None, 0
                peer.pending.clear()
                return
            if peer.written < len(head):                    # the tail of a started message stays first
                return
            peer.pending.popleft()
            peer.written = 0

    # --- receiving ---------------------------------------------------------------------------

    def receive(self, timeout_s: float) -> Optional[Activation]:
        """The next ``(tag, group)``, or ``None`` after ``timeout_s`` seconds (or for a refused message)."""
        deadline = time.monotonic() + timeout_s
        dropped = self.dropped
        waited = False
        while not self._closed:
            with self._lock:                                # what waits for a peer whose connection was in progress
                self._flush_all()
            if not self._queue:
                for connection in list(self._waiting):
                    self._parse(connection)
            if self._queue:
                return self._queue.popleft()
            now = time.monotonic()
            if self.dropped != dropped or (waited and now >= deadline):
                return None
            assert self._handshakes is not None
            wait_s = deadline - now
            wake_in = self._handshakes.wake_in()            # the oldest connection's deadline, a pause's end
            if wake_in is not None:
                wait_s = min(wait_s, wake_in)
            self._select(max(0.0, wait_s))
            waited = True
        return None

    def _select(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for connections or lines; handle them; end silent connections."""
        for key, _ in self._selector.select(timeout_s):
            if self._closed:
                return
            if key.data is None:
                self._accept()
            elif key.data in self._connections:             # not ended earlier in this pass
                self._read(key.data)
        assert self._handshakes is not None
        for connection in self._handshakes.expired():
            self.refused += 1
            self._drop(connection)

    def _accept(self) -> None:
        """Accept waiting connections (``Handshakes.accept``), ending the oldest unauthenticated ones
        beyond ``MAX_CONNECTIONS``."""
        assert self._handshakes is not None
        accepted, _ = self._handshakes.accept()
        for sock in accepted:
            try:
                connection = _Connection(sock)
                self._selector.register(sock, selectors.EVENT_READ, connection)
            except (OSError, ValueError):                   # e.g. reset before it was set up
                sock.close()
                continue
            self._connections[connection] = None
            oldest = self._handshakes.add(connection, HANDSHAKE_S, MAX_CONNECTIONS)
            if oldest is not None:
                self._read(oldest)                          # what it sent already is judged first
                if oldest in self._handshakes:              # still not authenticated: ended
                    self.refused += 1
                    self._drop(oldest)

    def _read(self, connection: _Connection) -> None:
        """Read what ``connection`` sent and parse its lines (nothing while ``QUEUE`` messages wait)."""
        if len(self._queue) >= QUEUE or connection in self._waiting:
            return
        data = read_some(connection.sock, RECV_BYTES)
        if data is None:
            return
        if not data:                                        # gone; a line it left unfinished is refused
            self.dropped += bool(connection.inbox)
            self._drop(connection)
            return
        connection.inbox += data
        self._parse(connection)

    def _parse(self, connection: _Connection) -> None:
        """Queue the activations of the whole lines received on ``connection`` (up to ``QUEUE`` waiting);
        the first refused one (or a line over ``MAX_MESSAGE_BYTES``) is counted and ends the connection."""
        inbox, start = connection.inbox, 0
        while len(self._queue) < QUEUE:
            end = inbox.find(b"\n", start, start + MAX_MESSAGE_BYTES + 1)
            if end < 0:
                break
            activation = self._open(bytes(inbox[start:end]))
            start = end + 1
            if activation is None:
                self.dropped += 1
                self._drop(connection)
                return
            if self._handshakes is not None:                # its first authentic message, perhaps
                self._handshakes.done(connection)
            self._queue.append(activation)
        del inbox[:start]
        if inbox.find(b"\n", 0, MAX_MESSAGE_BYTES + 1) >= 0:   # QUEUE is full: parsed when it is not
            self._waiting[connection] = None
            return
        self._waiting.pop(connection, None)
        if len(inbox) > MAX_MESSAGE_BYTES:                  # a line over the limit (or raw bytes)
            self.dropped += 1
            self._drop(connection)

    def _open(self, message: bytes) -> Optional[Activation]:
        sender_digits, _, sealed = message.partition(b" ")
        if not (sender_digits.isdigit() and len(sender_digits) < 10) or int(sender_digits) == self.rank \
                or int(sender_digits) >= len(self.addresses):
            return None
        sender = int(sender_digits)
        if sender not in self._receiving:
            self._receiving[sender] = Channel(self._key, receives=_context(sender, self.rank))
        body = self._receiving[sender].open(sealed)
        return None if body is None else decode(body)

    def _drop(self, connection: _Connection) -> None:
        self._connections.pop(connection, None)
        if self._handshakes is not None:
            self._handshakes.done(connection)
        self._waiting.pop(connection, None)
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError, RuntimeError):        # not registered, or the selector is closed
            pass
        connection.sock.close()

    def close(self) -> None:
        """Close every socket (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for peer in self._peers.values():
                if peer.sock is not None:
                    peer.sock.close()
                    peer.sock = None
                peer.pending.clear()
        for connection in list(self._connections):
            self._drop(connection)
        self._queue.clear()
        self._selector.close()
        if self._listener is not None:
            self._listener.close()
