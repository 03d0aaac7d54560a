"""transports.listening.Handshakes: the bookkeeping ESync's state server and WAGMA's activations share
(connections waiting to authenticate, oldest first; the listener's pause when out of descriptors)."""
import errno
import selectors
import socket
import time

import pytest

from horovod_hetero.transports import listening
from horovod_hetero.transports.listening import Handshakes


@pytest.fixture
def served():
    selector = selectors.DefaultSelector()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    selector.register(listener, selectors.EVENT_READ, "accept")
    yield selector, listener
    selector.close()
    listener.close()


def test_the_oldest_beyond_the_limit_is_named_and_done_forgets(served):
    handshakes = Handshakes(*served, "accept")
    assert handshakes.add("a", 5.0, limit=2) is None and handshakes.add("b", 5.0, limit=2) is None
    assert handshakes.add("c", 5.0, limit=2) == "a"          # the server judges it, then ends it
    handshakes.done("a")
    handshakes.done("a")                                     # ended twice (authenticated, then dropped): fine
    assert handshakes.connections() == ["b", "c"] and "a" not in handshakes and len(handshakes) == 2


def test_connections_past_their_deadline_expire_oldest_first(served):
    handshakes = Handshakes(*served, "accept")
    assert handshakes.wake_in() is None
    handshakes.add("a", 0.0, limit=8)
    handshakes.add("b", 0.05, limit=8)
    handshakes.add("c", 60.0, limit=8)
    assert handshakes.wake_in() == 0.0
    assert handshakes.expired() == ["a"]
    assert 0.0 < handshakes.wake_in() <= 0.05
    time.sleep(0.06)
    assert handshakes.expired() == ["b"] and handshakes.connections() == ["c"]
    assert 59.0 < handshakes.wake_in() <= 60.0


def test_out_of_descriptors_the_listener_pauses_then_is_watched_again(served, monkeypatch):
    selector, listener = served
    handshakes = Handshakes(selector, listener, "accept")
    exhausted = OSError(errno.EMFILE, "Too many open files")
    monkeypatch.setattr(listening, "accept_waiting", lambda sock, limit: ([], exhausted))
    assert handshakes.accept() == ([], exhausted)
    with pytest.raises(KeyError):
        selector.get_key(listener)                           # not watched: it would wake the loop at once
    assert 0.0 < handshakes.wake_in() <= listening.ACCEPT_PAUSE_S
    assert handshakes.expired() == [] and handshakes.paused_until is not None
    time.sleep(listening.ACCEPT_PAUSE_S)
    assert handshakes.expired() == [] and handshakes.paused_until is None
    assert selector.get_key(listener).data == "accept" and handshakes.wake_in() is None


def test_accept_hands_over_waiting_connections(served):
    selector, listener = served
    handshakes = Handshakes(selector, listener, "accept")
    clients = [socket.create_connection(listener.getsockname()) for _ in range(2)]
    time.sleep(0.05)
    accepted, exhausted = handshakes.accept()
    assert exhausted is None and len(accepted) == 2 and all(not s.getblocking() for s in accepted)
    for sock in accepted + clients:
        sock.close()
