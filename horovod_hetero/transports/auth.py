"""Authentication of the messages ranks exchange outside Horovod: HMAC-SHA256 with a per-job key.

When a strategy opens its transports, the first rank of the job's process set draws a key
(``new_key``: 32 bytes from ``secrets``) and every rank receives it through Horovod's object
broadcast (``Transports.key``); a process outside the job does not have it (unless it can read
Horovod's own traffic, which carries it once). Every message then travels sealed by a ``Channel``::

    b"<counter> <mac> <body>"      mac = hex HMAC-SHA256(key, context | counter | body)

``counter`` (decimal) grows by one per message the channel seals; ``context`` names the
conversation and its direction (a state-server connection's random challenge and who speaks, or
the sending and the receiving rank of activations). A receiver accepts a message only if the MAC
matches and the counter is above the last one it accepted, so a message forged without the key,
altered, replayed within its conversation or replayed into another one (another connection,
direction or pair of ranks) is refused; a refused message is never parsed. A new key is drawn
each time transports open, so nothing recorded from an earlier run is accepted either.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets

#: Bytes of the key ``new_key`` draws (HMAC-SHA256's block is 64; 32 is its output size).
KEY_BYTES = 32
#: The shortest key a ``Channel`` accepts.
MIN_KEY_BYTES = 16
_MAC_HEX = 2 * hashlib.sha256().digest_size
_MAX_COUNTER_DIGITS = 19


def new_key() -> bytes:
    """A fresh random key (``secrets.token_bytes``)."""
    return secrets.token_bytes(KEY_BYTES)


def check_key(key: object, name: str = "key") -> bytes:
    """``key`` if it is bytes of at least ``MIN_KEY_BYTES``, else a ``TypeError``/``ValueError`` naming ``name``.

    Example:
        >>> check_key(b"short")
        Traceback (most recent call last):
        ...
        ValueError: key must be at least 16 random bytes (e.g. secrets.token_bytes(32)), got 5 bytes
    """
    if not isinstance(key, bytes):
        raise TypeError(f"{name} must be bytes (e.g. secrets.token_bytes(32)), got {type(key).__name__}")
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{name} must be at least {MIN_KEY_BYTES} random bytes (e.g. secrets.token_bytes(32)), "
                         f"got {len(key)} bytes")
    return key


class Channel:
    """Seals the messages one side sends and opens those it receives, in one conversation.

    Args:
        key: the job's key (``check_key``).
        sends: context of the messages this side seals (``None``: it only receives).
        receives: context of the messages it accepts (``None``: it only sends).

    Example:
        >>> key = new_key()
        >>> worker, server = Channel(key, sends=b"w|c1", receives=b"s|c1"), Channel(key, sends=b"s|c1", receives=b"w|c1")
        >>> sealed = worker.seal(b'{"op": "leave"}')
        >>> server.open(sealed), server.open(sealed)            # a replay is refused
        (b'{"op": "leave"}', None)
        >>> worker.open(sealed), Channel(key, receives=b"w|c2").open(sealed)   # wrong direction, other connection
        (None, None)
    """

    def __init__(self, key: bytes, sends: bytes | None = None, receives: bytes | None = None) -> None:
        check_key(key)
        # HMAC keyed with the context once; each message continues a copy
        self._sends, self._receives = (None if c is None else hmac.new(key, c + b"|", hashlib.sha256)
                                       for c in (sends, receives))
        self.sent = 0           # counter of the last message sealed
        self.received = 0       # counter of the last message accepted

    @staticmethod
    def _mac(keyed: hmac.HMAC, counter: int, body: bytes) -> bytes:
        mac = keyed.copy()
        mac.update(b"%d|%s" % (counter, body))
        return mac.hexdigest().encode()

    def seal(self, body: bytes) -> bytes:
        """``body`` (bytes) as a sealed message."""
        self.sent += 1
        assert self._sends is not None, "this Channel only receives (sends=None)"
        return b"%d %s %s" % (self.sent, self._mac(self._sends, self.sent, body), body)

    def open(self, message: bytes) -> bytes | None:
        """The body of ``message`` if it is authentic and newer than the last accepted, else ``None``."""
        if self._receives is None:
            return None
        counter, mac, body = (message.split(b" ", 2) + [b"", b""])[:3]
        if not (counter.isdigit() and len(counter) <= _MAX_COUNTER_DIGITS and len(mac) == _MAC_HEX):
            return None
        n = int(counter)
        if n <= self.received or not hmac.compare_digest(mac, self._mac(self._receives, n, body)):
            return None
        self.received = n
        return body
