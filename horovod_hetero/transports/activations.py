"""Activation messages between ranks (ZeroMQ PUSH/PULL): "group average ``tag`` of ``group`` has started".

Horovod has no one-sided activation, so wait-avoiding group averaging (``runtime.group_exchange``)
sends one: each rank binds a PULL socket, the addresses are exchanged with one
``allgather_object``, and a rank that starts a group average pushes ``b"<tag> <r1>,<r2>,..."`` to
its peers, sealed with the job's key (``transports.auth``)::

    b"<sender> <counter> <mac> <tag> <r1>,<r2>,..."

The ``Channel`` of each (sender, receiver) pair binds both ranks into the MAC, and its counter
grows with every activation the sender sends that receiver, so a message forged without the key,
replayed, or redirected to another rank is refused. Whatever is refused (not authentic, a sender
out of range, a body that does not parse) is dropped and counted (``dropped``), never acted on.
ZeroMQ itself ends a connection that sends a message over ``MAX_MESSAGE_BYTES`` or does not
complete its handshake within ``HANDSHAKE_MS`` (raw bytes without ZeroMQ's framing), and queues at
most ``QUEUE`` messages.
"""
import zmq

from horovod_hetero.transports.auth import Channel, check_key

#: The longest message the PULL socket accepts (an activation is about 100 bytes plus 5 per rank).
MAX_MESSAGE_BYTES = 8192
#: Milliseconds a connection has to complete ZeroMQ's handshake.
HANDSHAKE_MS = 5000
#: Messages queued for the responder before ZeroMQ stops reading from a connection.
QUEUE = 1000


def encode(tag, group):
    return b"%d %s" % (tag, ",".join(map(str, group)).encode())


def decode(message):
    """``(tag, group)`` from a message body, or ``None`` if it is not one."""
    try:
        tag, ranks = message.split(b" ")
        return int(tag), tuple(int(r) for r in ranks.split(b","))
    except ValueError:
        return None


def _context(sender, receiver):
    return b"activation|%d>%d" % (sender, receiver)


class Activations:
    """A PULL socket for this rank, PUSH sockets to its peers (opened on first use).

    Args:
        host: address to bind.
        allgather: ``allgather(obj) -> list`` over all ranks (exchanges the addresses).
        rank: this rank (its index in the gathered list).
        key: the job's key.

    The ZeroMQ context is this object's own, terminated by ``close()``, so no I/O thread outlives it.
    """

    def __init__(self, host, allgather, rank, key):
        self.rank = rank
        self._key = check_key(key)
        self._context = zmq.Context()
        self._pull = self._context.socket(zmq.PULL)
        for option, value in ((zmq.LINGER, 0), (zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES),
                              (zmq.HANDSHAKE_IVL, HANDSHAKE_MS), (zmq.RCVHWM, QUEUE)):
            self._pull.setsockopt(option, value)
        self._push = {}
        self._sending = {}              # peer -> Channel of what this rank sends it
        self._receiving = {}            # peer -> Channel of what it receives from it
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
            self._sending[rank] = Channel(self._key, sends=_context(self.rank, rank))
        message = b"%d %s" % (self.rank, self._sending[rank].seal(encode(tag, group)))
        try:
            self._push[rank].send(message, zmq.NOBLOCK)
        except zmq.Again:       # the peer's queue is full: it is far behind, its responder will catch up
            pass

    def receive(self, timeout_s):
        """The next ``(tag, group)``, or ``None`` after ``timeout_s`` seconds (or for a refused message)."""
        if not self._pull.poll(int(timeout_s * 1000)):
            return None
        activation = self._open(self._pull.recv())
        if activation is None:
            self.dropped += 1
        return activation

    def _open(self, message):
        sender, _, sealed = message.partition(b" ")
        if not (sender.isdigit() and len(sender) < 10) or int(sender) == self.rank \
                or int(sender) >= len(self.addresses):
            return None
        sender = int(sender)
        if sender not in self._receiving:
            self._receiving[sender] = Channel(self._key, receives=_context(sender, self.rank))
        body = self._receiving[sender].open(sealed)
        return None if body is None else decode(body)

    def close(self):
        if self._context.closed:
            return
        for sock in self._push.values():
            sock.close()
        self._pull.close()
        self._context.term()
