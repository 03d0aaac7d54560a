"""ESync's state server and its client, over ZeroMQ (pyzmq).

The server is a ROUTER socket served by a daemon thread (started on rank 0); it keeps an
``esync.ESyncState`` and answers every worker's QUERY-STATE. Clients are DEALER sockets:
``query`` waits for the answer (blocking mode), ``send_query``/``poll`` let the worker train on
while the answer travels (delayed-ACK mode). Messages are JSON objects; each query carries a
sequence number so a late answer is never taken for the current one. Every wait has a
timeout: ``StateServerTimeout`` tells the caller to fall back.

Protocol (client -> server; the server stamps times with its own clock on arrival):
    {"op": "query", "rank": r, "k": k, "c": seconds, "round": t, "seq": n}
        -> {"seq": n, "ready": bool, "round": t, "slowest": bool}
    {"op": "reset", "rank": r, "round": t}       (no answer)
    {"op": "leave", "rank": r}                   (no answer; the next query rejoins)
"""
import atexit
import json
import os
import socket
import sys
import threading
import time

import zmq

from horovod_hetero.common.esync import ESyncState, StateServerTimeout  # noqa: F401 (re-exported)


def server_host(all_local):
    """The address the state server binds and advertises: loopback when every rank runs on this
    machine, else ``$HOROVOD_HETERO_STATE_SERVER_HOST`` or this host's address."""
    if all_local:
        return "127.0.0.1"
    return os.environ.get("HOROVOD_HETERO_STATE_SERVER_HOST") or socket.gethostbyname(socket.gethostname())


#: Interpreter switch interval while a state server runs in this process (seconds).
SWITCH_INTERVAL_S = 2e-4


class StateServer:
    """Serves QUERY-STATE for ``size`` workers from a background thread.

    The thread shares the interpreter with rank 0's training loop, whose Python code would make
    it wait up to the interpreter's switch interval (5 ms) for each answer; while the server
    runs, the switch interval is lowered to ``SWITCH_INTERVAL_S`` (restored on ``close()``):
    median round trip 1.7 ms -> 1.1 ms with 4 ranks on 2 cores.

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
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self.handled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="horovod_hetero-state-server", daemon=True)
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, SWITCH_INTERVAL_S))
        self._thread.start()
        atexit.register(self.close)

    def _serve(self):
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            frames = self._sock.recv_multipart()
            try:
                msg = json.loads(frames[-1])
                reply = self._handle(msg)
            except (ValueError, KeyError, TypeError) as e:   # a bad message must not kill the server
                reply = {"error": str(e)}
            if reply is not None:
                self._sock.send_multipart(frames[:-1] + [json.dumps(reply).encode()])
            self.handled += 1
        self._sock.close()

    def _handle(self, msg):
        rank = msg["rank"]
        if msg["op"] == "reset":
            self.state.reset(rank, msg["round"], self._clock())
            return None
        if msg["op"] == "leave":
            self.state.leave(rank)
            return None
        record = self.state.records[rank]
        if msg["round"] != record.round:                  # a reset lost on the way: catch up
            self.state.reset(rank, msg["round"], self._clock())
        ready = self.state.query(rank, msg["k"], msg["c"], self._clock())
        slowest = self.state.slowest()
        return {"seq": msg["seq"], "ready": ready, "round": msg["round"],
                "slowest": slowest is not None and slowest.rank == rank}

    def close(self):
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(timeout=2.0)
            sys.setswitchinterval(self._switch_interval)


class StateClient:
    """A worker's connection to the state server.

    Args:
        address: the server's ``tcp://host:port``.
        rank: this worker.
        timeout: seconds to wait for an answer before ``StateServerTimeout``.
    """

    def __init__(self, address, rank, timeout=2.0):
        self.rank = rank
        self.timeout = timeout
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(address)
        atexit.register(self.close)
        self._seq = 0
        self._sent_at = {}
        self.last_rtt = None
        self.slowest = False

    def _send(self, msg):
        self._sock.send_multipart([b"", json.dumps(msg).encode()])

    def send_query(self, k, capability, round):
        """Send a query without waiting; returns its sequence number."""
        self._seq += 1
        self._sent_at[self._seq] = time.perf_counter()
        self._send({"op": "query", "rank": self.rank, "k": k, "c": capability, "round": round, "seq": self._seq})
        return self._seq

    def poll(self, wait_s=0.0):
        """Answers that have arrived (waiting up to ``wait_s`` for the first): a list of dicts."""
        out = []
        deadline = time.perf_counter() + wait_s
        while True:
            remaining = max(0.0, deadline - time.perf_counter()) if not out else 0.0
            if not self._sock.poll(int(remaining * 1000) if remaining > 0 else 0):
                return out
            reply = json.loads(self._sock.recv_multipart()[-1])
            sent = self._sent_at.pop(reply.get("seq"), None)
            if sent is not None:
                self.last_rtt = time.perf_counter() - sent
            self.slowest = reply.get("slowest", self.slowest)
            out.append(reply)

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
        if not self._sock.closed:
            self._sock.close()
