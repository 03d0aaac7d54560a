"""ESync's state server and its client: authenticated JSON Lines over TCP, from the standard library.

The server is started on rank 0: one daemon thread serves every connection (``selectors``,
non-blocking sockets); it keeps a ``rules.esync_state.ESyncState`` and answers every worker's QUERY-STATE.
``runtime.strategy_transports.Transports.state_service`` opens both ends for a strategy and closes them.
A client is one TCP connection: ``query`` waits for the answer (blocking mode),
``send_query``/``poll`` let the worker train on while the answer travels (delayed-ACK mode).
Messages are JSON objects, one per line; each query carries a sequence number so a late answer
is never taken for the current one. Every wait has a timeout; ``StateServerError`` (a timeout,
a refused or closed connection) tells the caller to fall back.

Why not ZeroMQ: a DEALER/ROUTER round trip crosses ZeroMQ's I/O thread on both sides, four
thread hand-offs more than a plain socket. Measured on loopback (2 cores, server in another
process): median 0.54 ms with pyzmq, 0.10 ms with this server; under a 4-rank training job the
hand-offs wait for a core, which is what made the ESync round trip exceed 1 ms.

Authentication (``transports.auth``, the job's key): on connecting, the server sends a greeting
with a fresh random challenge (``GREETING``); every line after it, both ways, is a message sealed
by a ``Channel`` bound to that challenge and to who speaks, so a line without the key, altered,
replayed, or copied from another connection is refused. The server hangs up on the first line
that is not authentic (or over ``MAX_LINE_BYTES``, or cut off) and counts it (``rejected``); it
is never parsed. A connection must send its first authentic line within ``AUTH_TIMEOUT_S``; at
most ``size + MAX_PENDING`` connections wait for that (every worker may connect at once; a newer
one ends the oldest) and at most
``max_workers`` authenticated ones are served; every connection it ends this way is counted
(``refused``), as is one that sends without reading its answers (``MAX_UNREAD_BYTES`` waiting
beyond its socket's buffers). A client drops (and counts, ``StateClient.rejected``) an answer that is not
authentic. JSON that does not parse, ``NaN``/``Infinity``, a rank out of range or a missing field
in an authentic message is answered with ``{"error": "..."}`` and counted (``rejected``). An
exception in the server's own code ends the connection it served, is counted (``failures``) and
logged (at most once a minute); the thread serves on. The server raises the process's soft limit on
open files to the hard limit; out of descriptors, it stops accepting for ``ACCEPT_PAUSE_S``.

Protocol (client -> server, message bodies; the server stamps times with its own clock on arrival):
    {"op": "query", "rank": r, "k": k, "c": seconds, "round": t, "seq": n}
        -> {"seq": n, "ready": bool, "round": t, "slowest": bool}
    {"op": "reset", "rank": r, "round": t}       (no answer)
    {"op": "leave", "rank": r}                   (no answer; the next query rejoins)
    {"op": "enter", "rank": r, "round": t}       (no answer; r aggregates round t without an answer:
                                                  every worker in round t is ready at its next query)
"""
from __future__ import annotations

import json
import logging
import resource
import secrets
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from horovod_hetero.errors import StateServerError, StateServerTimeout
from horovod_hetero.rules.esync_state import ESyncState
from horovod_hetero.transports.auth import Channel, check_key, new_key
from horovod_hetero.transports.listening import ACCEPT_PAUSE_S, Handshakes, read_some
from horovod_hetero.validation import parse_address

log = logging.getLogger("horovod_hetero")

#: Interpreter switch interval while a state server runs in this process (seconds).
SWITCH_INTERVAL_S = 2e-4
#: The longest line either side reads (a worker's message is about 200 bytes sealed); a longer one ends the connection.
MAX_LINE_BYTES = 4096
#: Answers a connection may leave unread (beyond what its socket buffers) before it is ended.
MAX_UNREAD_BYTES = 64 * MAX_LINE_BYTES
#: Seconds a new connection has to send its first authentic line.
AUTH_TIMEOUT_S = 5.0
#: Connections waiting to authenticate beyond one per worker; one more ends the oldest.
MAX_PENDING = 64
#: Seconds ``close()`` waits for the server's thread before ending its connections itself.
CLOSE_TIMEOUT_S = 5.0
#: Seconds between two log records of the server's own failures (the rest are only counted).
LOG_INTERVAL_S = 60.0
#: the longest ``StateClient.enter`` waits to connect again (it is sent while falling back, at most once a round)
ENTER_CONNECT_S = 0.5
#: The server's first line on every connection, followed by a 32-digit hex challenge and a newline.
GREETING = b"horovod_hetero-state-server 1 "
_CHALLENGE_BYTES = 16
#: Bytes of the greeting, its newline included.
GREETING_LEN = len(GREETING) + 2 * _CHALLENGE_BYTES + 1


def _channel(key: bytes, challenge: bytes, me: bytes, peer: bytes) -> Channel:
    """The ``Channel`` of one connection: ``me`` seals, ``peer``'s lines are opened (both bound to ``challenge``)."""
    return Channel(key, sends=b"%s|%s" % (me, challenge), receives=b"%s|%s" % (peer, challenge))


def worker_channel(key: bytes, greeting: bytes) -> Channel:
    """A worker's ``Channel`` on a connection whose server sent ``greeting`` (``GREETING_LEN`` bytes);
    an ``OSError`` if it is not a horovod_hetero state server's greeting."""
    challenge = greeting[len(GREETING):-1]
    if not (greeting.startswith(GREETING) and greeting.endswith(b"\n") and len(challenge) == 2 * _CHALLENGE_BYTES):
        raise OSError(f"it is not a horovod_hetero state server (greeting {greeting[:80]!r})")
    return _channel(key, challenge, b"worker", b"server")


def query_body(rank: int, k: int, capability: float | None, round: int, seq: int) -> bytes:
    """The body of a worker's QUERY-STATE message (bytes, before sealing)."""
    return json.dumps({"op": "query", "rank": rank, "k": k, "c": capability, "round": round, "seq": seq}).encode()


def _raise_fd_limit() -> None:
    """Raise this process's soft limit on open files to its hard limit (the server holds one per worker)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):                       # e.g. an unlimited hard limit (macOS)
            pass


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a finite number")


def _loads(body: bytes) -> Any:
    """A JSON message (``NaN``/``Infinity`` refused: ``ValueError``)."""
    return json.loads(body, parse_constant=_no_constant)


class _Peer:
    """One connection as the server keeps it: its ``Channel``, bytes received short of a whole line,
    bytes waiting to be sent."""

    __slots__ = ("sock", "channel", "inbox", "outbox")

    def __init__(self, sock: socket.socket, channel: Channel) -> None:
        self.sock, self.channel = sock, channel
        self.inbox, self.outbox = b"", bytearray()


class StateServer:
    """Serves QUERY-STATE for ``size`` workers from one background thread.

    One thread multiplexes every connection (``selectors``): no thread per worker to wake and
    switch to (``horovod-hetero benchmark state_server_load`` measures both designs; README). The thread shares the interpreter with rank 0's
    training loop, whose Python code would make it wait up to the interpreter's switch interval
    (5 ms) for each answer; while the server runs, the switch interval is lowered to
    ``SWITCH_INTERVAL_S`` (restored on ``close()``).

    Args:
        size: number of workers.
        key: the job's key (``transports.auth``): only clients holding it are answered.
        host: address to bind (``127.0.0.1`` when all workers share this machine).
        epsilon, overshoot: passed to ``ESyncState``.
        clock: the server's clock.
        max_workers: authenticated connections served at once (default ``4 * size + 4``).

    Example:
        >>> key = new_key()
        >>> server = StateServer(1, key)
        >>> client = StateClient(server.address, rank=0, key=key)
        >>> client.query(k=1, capability=0.01, round=0)
        True
        >>> client.close(); server.close()
    """

    def __init__(self, size: int, key: bytes, host: str = "127.0.0.1", epsilon: float = 1e-3,
                 overshoot: float = 0.0, clock: Callable[[], float] = time.monotonic,
                 max_workers: int | None = None) -> None:
        self.state = ESyncState(size, epsilon=epsilon, overshoot=overshoot, clock=clock)
        self._key = check_key(key)
        self._clock = clock
        self._lock = threading.Lock()
        self._workers: set[_Peer] = set()           # authenticated connections
        self.max_workers = 4 * size + 4 if max_workers is None else max_workers
        self.max_pending = size + MAX_PENDING         # all workers connecting at once, and a margin
        _raise_fd_limit()
        # every worker connects at its first query, all at once: a short backlog (socketserver's
        # is 5) drops the SYNs of the rest, retried 1, 3, 7... s later (past the query timeout)
        self._listener = socket.create_server((host, 0), backlog=socket.SOMAXCONN)
        self._listener.setblocking(False)
        self._wake, self._waker = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake, selectors.EVENT_READ, "wake")
        self._handshakes: Handshakes[_Peer] = Handshakes(self._selector, self._listener, "accept")
        self._quiet_until = 0.0       # no log record before then (LOG_INTERVAL_S)
        self.address = f"tcp://{host}:{self._listener.getsockname()[1]}"
        self.handled = 0
        self.rejected = 0             # lines refused: not authentic (the connection ended), or not a valid message
        self.refused = 0              # connections ended: evicted, silent, or over max_workers
        self.failures = 0             # exceptions in the server's own code (logged; the connection ended)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="horovod_hetero-state-server", daemon=True)
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, SWITCH_INTERVAL_S))
        self._thread.start()

    def _serve(self) -> None:
        try:
            while not self._closed:
                for key, mask in self._selector.select(self._handshakes.wake_in()):
                    try:
                        if key.data == "accept":
                            self._accept()
                        elif key.data != "wake":
                            self._serve_peer(key.data, mask)
                    except Exception:               # a bug must not end the server: end that connection
                        self._failed(key.data)
                try:
                    self._expire()
                except Exception:
                    self._failed(None)
        finally:
            for peer in self._handshakes.connections() + list(self._workers):
                self._drop(peer)
            for closing in (self._selector, self._listener, self._wake, self._waker):
                closing.close()

    def _log(self, level: int, message: str, *args: object, exc_info: bool = False) -> None:
        """Log at most one record per ``LOG_INTERVAL_S`` (a peer must not flood rank 0's log)."""
        now = time.monotonic()
        if now >= self._quiet_until:
            self._quiet_until = now + LOG_INTERVAL_S
            log.log(level, message, *args, exc_info=exc_info)

    def _failed(self, peer: _Peer | None) -> None:
        """The server's own code raised while serving ``peer`` (a ``_Peer``, or None): count, log, end it."""
        self.failures += 1
        self._log(logging.ERROR, "the ESync state server failed (%d times so far); it ends that connection and "
                  "serves on", self.failures, exc_info=True)
        if isinstance(peer, _Peer):
            self._drop(peer)

    def _accept(self) -> None:
        """Greet up to ``ACCEPTS_PER_PASS`` waiting connections (ending the oldest unauthenticated ones beyond
        ``max_pending``); out of file descriptors, stop accepting for ``ACCEPT_PAUSE_S``."""
        accepted, exhausted = self._handshakes.accept()
        if exhausted is not None:
            self._log(logging.WARNING, "the ESync state server cannot accept a connection (%s); it retries "
                      "in %g s", exhausted, ACCEPT_PAUSE_S)
        for sock in accepted:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:                                 # e.g. reset before it was set up
                sock.close()
                continue
            challenge = secrets.token_hex(_CHALLENGE_BYTES).encode()
            peer = _Peer(sock, _channel(self._key, challenge, b"server", b"worker"))
            self._selector.register(sock, selectors.EVENT_READ, peer)
            oldest = self._handshakes.add(peer, AUTH_TIMEOUT_S, self.max_pending)
            if oldest is not None:
                self._serve_peer(oldest, selectors.EVENT_READ)   # what it sent already is judged first
                if oldest in self._handshakes:                   # still not authenticated: ended
                    self.refused += 1
                    self._drop(oldest)
            peer.outbox += GREETING + challenge + b"\n"
            self._flush(peer)

    def _serve_peer(self, peer: _Peer, mask: int) -> None:
        if mask & selectors.EVENT_WRITE and not self._flush(peer):
            return
        if mask & selectors.EVENT_READ:
            data = read_some(peer.sock, 65536)
            if data is None:
                return
            if not data:                                    # gone; a line it left unfinished is refused
                self.rejected += bool(peer.inbox)
                self._drop(peer)
                return
            peer.inbox += data
            if self._answer_lines(peer):
                self._flush(peer)

    def _answer_lines(self, peer: _Peer) -> bool:
        """Answer every whole line received; False if the connection was ended."""
        *lines, peer.inbox = peer.inbox.split(b"\n")       # the rest (short of a line) waits for more
        if len(peer.inbox) > MAX_LINE_BYTES:
            lines.append(peer.inbox)                        # refused below, after the lines before it
        for line in lines:
            body = peer.channel.open(line) if len(line) <= MAX_LINE_BYTES else None
            if body is None:                # no key, replayed, or too long: not a worker
                self.rejected += 1
                self._drop(peer)
                return False
            if peer in self._handshakes and not self._admit(peer):
                self._drop(peer)
                return False
            reply = self._answer(body)
            if reply is not None:
                peer.outbox += peer.channel.seal(reply) + b"\n"
        return True

    def _admit(self, peer: _Peer) -> bool:
        """A connection sent its first authentic line: serve it (False: ``max_workers`` are served)."""
        self._handshakes.done(peer)
        if len(self._workers) >= self.max_workers:
            self.refused += 1
            return False
        self._workers.add(peer)
        return True

    def _flush(self, peer: _Peer) -> bool:
        """Send what waits for ``peer`` (waiting for it to be writable if the socket takes less);
        False if the connection was ended."""
        try:
            sent = peer.sock.send(peer.outbox) if peer.outbox else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:                                     # the worker went away mid-answer
            self._drop(peer)
            return False
        del peer.outbox[:sent]
        if len(peer.outbox) > MAX_UNREAD_BYTES:             # it sends and does not read: not a worker
            self.refused += 1
            self._drop(peer)
            return False
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.outbox else 0)
        if self._selector.get_key(peer.sock).events != events:
            self._selector.modify(peer.sock, events, peer)
        return True

    def _expire(self) -> None:
        """End connections silent for ``AUTH_TIMEOUT_S`` since they were greeted; accept again after a pause."""
        for peer in self._handshakes.expired():
            self.refused += 1
            self._drop(peer)

    def _drop(self, peer: _Peer) -> None:
        self._handshakes.done(peer)
        self._workers.discard(peer)
        try:
            self._selector.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        _hang_up(peer.sock)
        peer.sock.close()

    def _answer(self, body: bytes) -> bytes | None:
        """The answer (bytes, unsealed) to one authentic message body (None for messages that get none);
        a message that is not valid is answered with its error and counted (``rejected``)."""
        try:
            msg = _loads(body)
            with self._lock:
                reply = self._handle(msg)
                self.handled += 1
        except (ValueError, KeyError, TypeError, RecursionError) as e:   # what bad input raises
            self.rejected += 1
            reply = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        return None if reply is None else json.dumps(reply).encode()

    def _handle(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        rank = msg["rank"]
        if msg["op"] == "reset":
            self.state.reset(rank, msg["round"], self._clock())
            return None
        if msg["op"] == "leave":
            self.state.leave(rank)
            return None
        if msg["op"] == "enter":
            self.state.enter(rank, msg["round"])
            return None
        ready, slowest = self.state.answer(rank, msg["k"], msg["c"], msg["round"])
        return {"seq": msg["seq"], "ready": ready, "round": msg["round"], "slowest": slowest}

    def close(self) -> None:
        """Stop serving and end every connection (the workers' next query fails fast)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._waker.send(b"x")
        except OSError:                                     # the thread ended already
            pass
        self._thread.join(timeout=CLOSE_TIMEOUT_S)
        if self._thread.is_alive():                         # stuck: end its connections from here
            log.warning("the ESync state server's thread did not stop within %g s; its connections are ended",
                        CLOSE_TIMEOUT_S)
            for sock in [self._listener] + [peer.sock for peer in self._handshakes.connections() + list(self._workers)]:
                _hang_up(sock)
        sys.setswitchinterval(self._switch_interval)


def _hang_up(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class StateClient:
    """A worker's connection to the state server (opened on the first message).

    Args:
        address: the server's ``tcp://host:port``.
        rank: this worker.
        key: the job's key (the server's).
        timeout: seconds to wait for the connection or an answer before ``StateServerError``.

    Attributes:
        rejected: answers dropped because they were not authentic or did not parse.
    """

    def __init__(self, address: str, rank: int, key: bytes, timeout: float = 2.0) -> None:
        self.address = address
        self._host_port = parse_address(address)
        self.rank = rank
        self._key = check_key(key)
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._channel: Channel | None = None
        self._buffer = b""
        self._seq = 0
        self._sent_at: dict[object, float] = {}     # by seq; looked up by an answer's "seq" (any JSON value)
        self.last_rtt: float | None = None
        self.slowest = False
        self.rejected = 0

    def _connect(self, timeout: float | None = None) -> None:
        """Connect and read the server's greeting (its challenge: the ``Channel`` of this connection) within
        ``timeout`` seconds in all (default: ``self.timeout``); ``socket.timeout`` after that."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.perf_counter() + timeout
        self._sock = socket.create_connection(self._host_port, timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        greeting = b""
        while len(greeting) < GREETING_LEN:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise socket.timeout("no greeting in time")
            self._sock.settimeout(left)
            chunk = self._sock.recv(GREETING_LEN - len(greeting))
            if not chunk:
                break
            greeting += chunk
        self._channel = worker_channel(self._key, greeting)
        self._buffer = b""

    def _send(self, msg: dict[str, Any], connect_s: float | None = None) -> None:
        self._send_body(json.dumps(msg).encode(), connect_s)

    def _send_body(self, body: bytes, connect_s: float | None = None) -> None:
        try:
            if self._sock is None:
                self._connect(connect_s)
            assert self._sock is not None and self._channel is not None     # connected
            self._sock.settimeout(self.timeout)            # _receive sets the time it waits
            self._sock.sendall(self._channel.seal(body) + b"\n")
        except socket.timeout:          # no greeting, or a send that did not go (TimeoutError from Python 3.10 on)
            self.close()
            raise StateServerTimeout(f"the ESync state server at {self.address} did not answer within "
                                     f"{self.timeout:g} s") from None
        except OSError as e:
            self.close()
            raise StateServerError(f"cannot reach the ESync state server at {self.address}: {e}") from None

    def _receive(self, wait_s: float) -> list[dict[str, Any]]:
        """Authentic answers received so far, waiting up to ``wait_s`` seconds for the first line."""
        deadline = time.perf_counter() + wait_s
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_LINE_BYTES:
                self.close()
                raise StateServerError(f"the ESync state server at {self.address} sent a line over "
                                       f"{MAX_LINE_BYTES} bytes")
            if self._sock is None:
                return []
            try:            # a socket timeout, not select.select (it fails for descriptors from 1024 on)
                self._sock.settimeout(max(0.0, deadline - time.perf_counter()))
                data = self._sock.recv(65536)
            except (socket.timeout, BlockingIOError):      # nothing came in time (0 s: non-blocking); on Python 3.9
                return []                                  # socket.timeout is an OSError, not a TimeoutError
            except OSError as e:
                data, why = b"", str(e)
            else:
                why = "connection closed"
            if not data:
                self.close()
                raise StateServerError(f"the ESync state server at {self.address} went away ({why})")
            self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        return [reply for reply in map(self._open, lines) if reply is not None]

    def _open(self, line: bytes) -> dict[str, Any] | None:
        """One answer line as a dict, or None (counted in ``rejected``) if it is not authentic or valid."""
        assert self._channel is not None            # lines come only from a connection, which has one
        body = self._channel.open(line)
        try:
            reply = None if body is None else _loads(body)
        except (ValueError, RecursionError):
            reply = None
        if not isinstance(reply, dict):
            self.rejected += 1
            return None
        return reply

    def send_query(self, k: int, capability: float | None, round: int) -> int:
        """Send a query without waiting; returns its sequence number."""
        self._seq += 1
        self._sent_at[self._seq] = time.perf_counter()
        self._send_body(query_body(self.rank, k, capability, round, self._seq))
        return self._seq

    def poll(self, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Answers that have arrived (waiting up to ``wait_s`` for the first): a list of dicts.

        ``last_rtt`` is taken only from the answer to the latest query, read while waiting for
        it: an answer read later (delayed-ACK mode, a step after it came) tells when it was
        read, not how long it took."""
        out = self._receive(wait_s)
        for reply in out:
            sent = self._sent_at.pop(reply.get("seq"), None)
            if sent is not None and wait_s > 0 and reply["seq"] == self._seq:
                self.last_rtt = time.perf_counter() - sent
            self.slowest = bool(reply.get("slowest", self.slowest))
        return out

    def query(self, k: int, capability: float | None, round: int) -> bool:
        """Blocking QUERY-STATE: True if this worker aggregates now."""
        seq = self.send_query(k, capability, round)
        deadline = time.perf_counter() + self.timeout
        while True:
            for reply in self.poll(max(0.0, deadline - time.perf_counter())):
                if reply.get("seq") == seq:
                    return bool(reply.get("ready"))
            if time.perf_counter() >= deadline:
                raise StateServerTimeout(f"the ESync state server did not answer within {self.timeout:g} s")

    def reset(self, round: int) -> None:
        """RESET-STATE-SERVER after this worker's aggregation (no answer is awaited)."""
        self._send({"op": "reset", "rank": self.rank, "round": round})

    def leave(self) -> None:
        """This worker stopped training; it is no longer waited for (no answer is awaited)."""
        self._send({"op": "leave", "rank": self.rank})

    def enter(self, round: int) -> None:
        """This worker aggregates round ``round`` without the server's answer (no answer is awaited).

        Where this worker's connection was closed (a reset that failed, leaving its record a round behind,
        which would keep the others not ready until they fall back too), it connects again first, waiting
        ``ENTER_CONNECT_S`` for the connection and the server's greeting (for each of the server's
        addresses: one where the address is numeric): a server that has gone refuses at once."""
        self._send({"op": "enter", "rank": self.rank, "round": round}, min(self.timeout, ENTER_CONNECT_S))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
