"""Activation messages between ranks (ZeroMQ PUSH/PULL): "group average ``tag`` of ``group`` has started".

Horovod has no one-sided activation, so wait-avoiding group averaging (``group_exchange``)
sends one: each rank binds a PULL socket, the addresses are exchanged with one
``allgather_object``, and a rank that starts a group average pushes ``b"<tag> <r1>,<r2>,..."`` to
its peers. A message that does not parse is dropped and counted (``dropped``), never acted on.
"""
import zmq


def encode(tag, group):
    return b"%d %s" % (tag, ",".join(map(str, group)).encode())


def decode(message):
    """``(tag, group)`` from a message, or ``None`` if it is not one."""
    try:
        tag, ranks = message.split(b" ")
        return int(tag), tuple(int(r) for r in ranks.split(b","))
    except ValueError:
        return None


class Activations:
    """A PULL socket for this rank, PUSH sockets to its peers (opened on first use).

    Args:
        host: address to bind.
        allgather: ``allgather(obj) -> list`` over all ranks (exchanges the addresses).

    The ZeroMQ context is this object's own, terminated by ``close()``, so no I/O thread outlives it.
    """

    def __init__(self, host, allgather):
        self._context = zmq.Context()
        self._pull = self._context.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._push = {}
        self.dropped = 0
        try:
            self._pull.bind(f"tcp://{host}:*")              # a free port chosen by the OS
            self.addresses = allgather(self._pull.getsockopt_string(zmq.LAST_ENDPOINT))
        except BaseException:
            self.close()
            raise

    def send(self, rank, tag, group):
        """Tell ``rank`` that group average ``tag`` of ``group`` has started (never blocks)."""
        if rank not in self._push:
            sock = self._context.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.addresses[rank])
            self._push[rank] = sock
        try:
            self._push[rank].send(encode(tag, group), zmq.NOBLOCK)
        except zmq.Again:       # the peer's queue is full: it is far behind, its responder will catch up
            pass

    def receive(self, timeout_s):
        """The next ``(tag, group)``, or ``None`` after ``timeout_s`` seconds (or for a bad message)."""
        if not self._pull.poll(int(timeout_s * 1000)):
            return None
        activation = decode(self._pull.recv())
        if activation is None:
            self.dropped += 1
        return activation

    def close(self):
        if self._context.closed:
            return
        for sock in self._push.values():
            sock.close()
        self._pull.close()
        self._context.term()
