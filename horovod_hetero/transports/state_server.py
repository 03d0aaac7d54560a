"""ESync's state server and its client: JSON Lines over TCP, from the standard library.

The server is a ``socketserver.ThreadingTCPServer`` started on rank 0 (daemon threads, one per
connected worker); it keeps a ``rules.esync.ESyncState`` and answers every worker's QUERY-STATE.
``transports.Transports.state_service`` opens both ends for a strategy and closes them.
A client is one TCP connection: ``query`` waits for the answer (blocking mode),
``send_query``/``poll`` let the worker train on while the answer travels (delayed-ACK mode).
Messages are JSON objects, one per line; each query carries a sequence number so a late answer
is never taken for the current one. Every wait has a timeout; ``StateServerError`` (a timeout,
a refused or closed connection) tells the caller to fall back.

Why not ZeroMQ: a DEALER/ROUTER round trip crosses ZeroMQ's I/O thread on both sides, four
thread hand-offs more than a plain socket. Measured on loopback (2 cores, server in another
process): median 0.54 ms with pyzmq, 0.10 ms with this server; under a 4-rank training job the
hand-offs wait for a core, which is what made the ESync round trip exceed 1 ms.

Protocol (client -> server; the server stamps times with its own clock on arrival):
    {"op": "query", "rank": r, "k": k, "c": seconds, "round": t, "seq": n}
        -> {"seq": n, "ready": bool, "round": t, "slowest": bool}
    {"op": "reset", "rank": r, "round": t}       (no answer)
    {"op": "leave", "rank": r}                   (no answer; the next query rejoins)
A line that is not such a message is answered with {"error": "..."}.
"""
import json
import select
import socket
import socketserver
import sys
import threading
import time

from horovod_hetero.errors import StateServerError, StateServerTimeout
from horovod_hetero.rules.esync import ESyncState
from horovod_hetero.validation import parse_address


#: Interpreter switch interval while a state server runs in this process (seconds).
SWITCH_INTERVAL_S = 2e-4
#: The longest line the server reads (a worker's message is about 100 bytes); a longer one ends the connection.
MAX_LINE_BYTES = 4096


class _Connection(socketserver.StreamRequestHandler):
    """One worker's connection: answers its lines until it disconnects."""

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.owner._connections.add(self.connection)

    def handle(self):
        owner = self.server.owner
        try:
            while True:
                line = self.rfile.readline(MAX_LINE_BYTES + 1)
                if not line:
                    return
                if len(line) > MAX_LINE_BYTES:              # no message is this long: not a worker, hang up
                    owner.rejected += 1
                    return
                reply = owner.answer(line)
                if reply is not None:
                    self.wfile.write(reply)
        except OSError:                                     # the worker went away mid-message
            pass

    def finish(self):
        self.server.owner._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class StateServer:
    """Serves QUERY-STATE for ``size`` workers from background threads.

    The threads share the interpreter with rank 0's training loop, whose Python code would make
    them wait up to the interpreter's switch interval (5 ms) for each answer; while the server
    runs, the switch interval is lowered to ``SWITCH_INTERVAL_S`` (restored on ``close()``).

    Args:
        size: number of workers.
        host: address to bind (``127.0.0.1`` when all workers share this machine).
        epsilon, overshoot: passed to ``ESyncState``.
        clock: the server's clock.

    Example:
        >>> server = StateServer(1)
        >>> client = StateClient(server.address, rank=0)
        >>> client.query(k=1, capability=0.01, round=0)
        True
        >>> client.close(); server.close()
    """

    def __init__(self, size, host="127.0.0.1", epsilon=1e-3, overshoot=0.0, clock=time.monotonic):
        self.state = ESyncState(size, epsilon=epsilon, overshoot=overshoot, clock=clock)
        self._clock = clock
        self._lock = threading.Lock()
        self._connections = set()
        self._server = _TCPServer((host, 0), _Connection)
        self._server.owner = self
        self.address = f"tcp://{host}:{self._server.server_address[1]}"
        self.handled = 0
        self.rejected = 0             # lines that were not a worker's message (answered with an error, or cut off)
        self._closed = False
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="horovod_hetero-state-server", daemon=True)
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, SWITCH_INTERVAL_S))
        self._thread.start()

    def answer(self, line):
        """The encoded answer to one received line (None for messages that get none)."""
        try:
            msg = json.loads(line)
            with self._lock:
                reply = self._handle(msg)
                self.handled += 1
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:   # never kills the server
            self.rejected += 1
            reply = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        return None if reply is None else json.dumps(reply).encode() + b"\n"

    def _handle(self, msg):
        rank = msg["rank"]
        if msg["op"] == "reset":
            self.state.reset(rank, msg["round"], self._clock())
            return None
        if msg["op"] == "leave":
            self.state.leave(rank)
            return None
        ready, slowest = self.state.answer(rank, msg["k"], msg["c"], msg["round"])
        return {"seq": msg["seq"], "ready": ready, "round": msg["round"], "slowest": slowest}

    def close(self):
        """Stop serving and drop every worker's connection (their next query fails fast)."""
        if not self._closed:
            self._closed = True
            self._server.shutdown()
            self._server.server_close()
            for conn in list(self._connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            sys.setswitchinterval(self._switch_interval)


class StateClient:
    """A worker's connection to the state server (opened on the first message).

    Args:
        address: the server's ``tcp://host:port``.
        rank: this worker.
        timeout: seconds to wait for the connection or an answer before ``StateServerError``.
    """

    def __init__(self, address, rank, timeout=2.0):
        self.address = address
        self._host_port = parse_address(address)
        self.rank = rank
        self.timeout = timeout
        self._sock = None
        self._buffer = b""
        self._seq = 0
        self._sent_at = {}
        self.last_rtt = None
        self.slowest = False

    def _send(self, msg):
        try:
            if self._sock is None:
                self._sock = socket.create_connection(self._host_port, timeout=self.timeout)
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock.sendall(json.dumps(msg).encode() + b"\n")
        except OSError as e:
            self.close()
            raise StateServerError(f"cannot reach the ESync state server at {self.address}: {e}") from None

    def _receive(self, wait_s):
        """Complete answers received so far, waiting up to ``wait_s`` seconds for the first."""
        deadline = time.perf_counter() + wait_s
        while b"\n" not in self._buffer:
            remaining = max(0.0, deadline - time.perf_counter())
            if self._sock is None or not select.select([self._sock], [], [], remaining)[0]:
                return []
            try:
                data = self._sock.recv(65536)
            except OSError as e:
                data, why = b"", str(e)
            else:
                why = "connection closed"
            if not data:
                self.close()
                raise StateServerError(f"the ESync state server at {self.address} went away ({why})")
            self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        return [json.loads(line) for line in lines]

    def send_query(self, k, capability, round):
        """Send a query without waiting; returns its sequence number."""
        self._seq += 1
        self._sent_at[self._seq] = time.perf_counter()
        self._send({"op": "query", "rank": self.rank, "k": k, "c": capability, "round": round, "seq": self._seq})
        return self._seq

    def poll(self, wait_s=0.0):
        """Answers that have arrived (waiting up to ``wait_s`` for the first): a list of dicts.

        ``last_rtt`` is taken only from the answer to the latest query, read while waiting for
        it: an answer read later (delayed-ACK mode, a step after it came) tells when it was
        read, not how long it took."""
        out = self._receive(wait_s)
        for reply in out:
            sent = self._sent_at.pop(reply.get("seq"), None)
            if sent is not None and wait_s > 0 and reply["seq"] == self._seq:
                self.last_rtt = time.perf_counter() - sent
            self.slowest = reply.get("slowest", self.slowest)
        return out

    def query(self, k, capability, round):
        """Blocking QUERY-STATE: True if this worker aggregates now."""
        seq = self.send_query(k, capability, round)
        deadline = time.perf_counter() + self.timeout
        while True:
            for reply in self.poll(max(0.0, deadline - time.perf_counter())):
                if reply.get("seq") == seq:
                    return bool(reply["ready"])
            if time.perf_counter() >= deadline:
                raise StateServerTimeout(f"the ESync state server did not answer within {self.timeout:g} s")

    def reset(self, round):
        """RESET-STATE-SERVER after this worker's aggregation (no answer is awaited)."""
        self._send({"op": "reset", "rank": self.rank, "round": round})

    def leave(self):
        """This worker stopped training; it is no longer waited for (no answer is awaited)."""
        self._send({"op": "leave", "rank": self.rank})

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None
