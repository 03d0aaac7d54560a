"""WAGMA's activation messages (``transports.activations``) without Horovod: several ranks in this
process on 127.0.0.1, addresses exchanged by a fake allgather, one key; forged traffic from raw sockets."""
import os
import socket
import threading
import time

import psutil
import pytest

from horovod_hetero.transports import activations as module
from horovod_hetero.transports.activations import MAX_MESSAGE_BYTES, QUEUE, Activations, _context, encode
from horovod_hetero.transports.auth import Channel, new_key

KEY = new_key()


@pytest.fixture
def ranks():
    """``ranks(n)``: ``n`` Activations sharing one address list (closed after the test)."""
    opened = []

    def make(n, key=KEY):
        addresses = []

        def allgather(address):
            addresses.append(address)
            return addresses                        # filled in by the ranks made after this one

        made = [Activations("127.0.0.1", allgather, r, key) for r in range(n)]
        opened.extend(made)
        return made

    yield make
    for a in opened:
        a.close()


def take(receiver, n, timeout_s=5.0):
    """The next ``n`` activations ``receiver`` gets (fewer if ``timeout_s`` passes)."""
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        activation = receiver.receive(0.05)
        if activation is not None:
            got.append(activation)
    return got


def pump(receiver, condition, timeout_s=5.0):
    """Call ``receiver.receive`` until ``condition()``; the activations it returned meanwhile."""
    got, deadline = [], time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        activation = receiver.receive(0.02)
        if activation is not None:
            got.append(activation)
    assert condition()
    return got


def port(a):
    return int(a.addresses[a.rank].rsplit(":", 1)[1])


def connect(a):
    return socket.create_connection(("127.0.0.1", port(a)), timeout=5)


def ended(sock):
    """True if the other side closed ``sock`` (EOF or reset) within its timeout."""
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:                      # TimeoutError from Python 3.10
        return False


def line(sender, receiver, tag, group, key=KEY, counter=1):
    """What ``sender`` sends ``receiver`` as its ``counter``-th activation (with ``key``)."""
    channel = Channel(key, sends=_context(sender, receiver))
    channel.sent = counter - 1
    return b"%d %s\n" % (sender, channel.seal(encode(tag, group)))


def test_addresses_are_gathered_as_tcp_urls_and_no_thread_is_started(ranks):
    threads = threading.active_count()
    a, b = ranks(2)
    assert a.addresses is b.addresses and len(a.addresses) == 2
    assert all(address.startswith("tcp://127.0.0.1:") for address in a.addresses)
    assert port(a) != port(b) and threading.active_count() == threads


def test_activations_arrive_in_order_between_two_ranks(ranks):
    a, b = ranks(2)
    for tag in range(1, 201):
        a.send(1, tag, (0, 1))
    b.send(0, 7, (0, 1))
    assert take(b, 200) == [(tag, (0, 1)) for tag in range(1, 201)]
    assert take(a, 1) == [(7, (0, 1))]
    assert (a.dropped, b.dropped, a.refused, b.refused) == (0, 0, 0, 0)


def test_a_rank_sends_to_several_peers(ranks):
    a, *peers = ranks(4)
    for tag in (1, 2):
        for peer in (1, 2, 3):
            a.send(peer, tag, (0, 1, 2, 3))
    for peer in peers:
        assert take(peer, 2) == [(1, (0, 1, 2, 3)), (2, (0, 1, 2, 3))]
        assert peer.dropped == 0


def test_forged_replayed_redirected_oversized_and_cut_off_messages_are_refused_and_end_their_connection(ranks):
    """Each connection below sends one bad message (and for the first, an authentic one after it):
    each is refused, counted once, its connection is closed; rank 0 keeps delivering meanwhile."""
    a, b, c = ranks(3)
    a.send(1, 1, (0, 1))
    assert take(b, 1) == [(1, (0, 1))]
    bad = [b"junk\n" + line(2, 1, 99, (1, 2)),                     # not authentic, then an authentic line
           line(0, 1, 5, (0, 1), key=new_key(), counter=50),        # forged: another key
           line(0, 1, 1, (0, 1)),                                   # a replay of what rank 0 sent first
           line(0, 2, 5, (0, 2), counter=50),                       # rank 0's to rank 2, redirected
           line(1, 1, 5, (0, 1)),                                   # from rank 1 itself
           line(7, 1, 5, (0, 1)),                                   # a sender out of range
           b"0 " * (MAX_MESSAGE_BYTES // 2 + 1) + b"\n",            # a line over the limit
           b"\x00" * 10_000]                                        # raw bytes, no newline
    forged = []
    for n, message in enumerate(bad):
        forged.append(connect(b))
        forged[-1].sendall(message)
        a.send(1, n + 2, (0, 1))
    cut = connect(b)
    cut.sendall(line(0, 1, 6, (0, 1), counter=60)[:-10])             # cut off by the end of its connection
    cut.shutdown(socket.SHUT_WR)
    got = pump(b, lambda: b.dropped == len(bad) + 1)
    got += take(b, len(bad) - len(got))
    assert got == [(tag, (0, 1)) for tag in range(2, len(bad) + 2)]
    assert all(ended(sock) for sock in forged + [cut])
    assert (b.dropped, b.refused) == (len(bad) + 1, 0)
    c.send(1, 7, (1, 2))                        # rank 2's first activation: the line after "junk" was never opened
    a.send(1, 100, (0, 1))
    assert sorted(take(b, 2)) == [(7, (1, 2)), (100, (0, 1))]
    assert b.receive(0.05) is None and b.dropped == len(bad) + 1
    for sock in forged + [cut]:
        sock.close()


def test_receive_returns_none_after_its_timeout(ranks):
    a, _ = ranks(2)
    for timeout_s in (0.0, 0.1, 0.3):
        begun = time.monotonic()
        assert a.receive(timeout_s) is None
        assert timeout_s <= time.monotonic() - begun < timeout_s + 0.25


def test_sending_to_a_closed_peer_neither_raises_nor_blocks(ranks):
    a, b, c = ranks(3)
    a.send(1, 1, (0, 1))
    assert take(b, 1) == [(1, (0, 1))]
    b.close()
    c.close()                                   # never connected to
    fds = len(os.listdir("/proc/self/fd"))
    begun = time.monotonic()
    for tag in range(2, 202):
        a.send(1, tag, (0, 1))
        a.send(2, tag, (0, 2))
    assert time.monotonic() - begun < 2.0
    assert all(len(peer.pending) <= QUEUE for peer in a._peers.values())
    assert len(os.listdir("/proc/self/fd")) <= fds + 2       # at most the latest attempt to each


def test_send_never_blocks_when_the_receiver_does_not_read(ranks):
    a, b = ranks(2)
    group = tuple(range(1000))                          # 4 kB messages: the socket buffers fill
    begun = time.monotonic()
    for tag in range(20_000):
        a.send(1, tag, group)
    assert time.monotonic() - begun < 5.0
    assert 0 < len(a._peers[1].pending) <= QUEUE         # the socket took what it could, the rest is bounded
    got = []
    while True:                                          # the receiver catches up; the sender writes the rest
        before = len(got)
        activation = b.receive(0.05)
        while activation is not None:
            got.append(activation)
            activation = b.receive(0.05)
        a.receive(0.0)
        if len(got) == before:
            break
    tags = [tag for tag, _ in got]
    assert tags[0] == 0 and all(x < y for x, y in zip(tags, tags[1:]))   # in order, whole lines only
    assert QUEUE < len(tags) < 20_000 and not a._peers[1].pending
    assert (b.dropped, b.refused) == (0, 0)


def test_a_connection_that_does_not_authenticate_in_time_is_closed(ranks, monkeypatch):
    monkeypatch.setattr(module, "HANDSHAKE_S", 0.3)
    a, b = ranks(2)
    a.send(1, 1, (0, 1))
    assert take(b, 1) == [(1, (0, 1))]                    # an authenticated connection stays open
    idle, partial = connect(b), connect(b)
    partial.sendall(b"0 1 ")
    begun = time.monotonic()
    pump(b, lambda: b.refused == 2)
    assert 0.3 <= time.monotonic() - begun < 1.0
    assert ended(idle) and ended(partial)
    a.send(1, 2, (0, 1))
    assert take(b, 1) == [(2, (0, 1))] and (b.dropped, b.refused) == (0, 2)
    idle.close(), partial.close()


def test_more_waiting_connections_than_the_bound_end_the_oldest(ranks, monkeypatch):
    monkeypatch.setattr(module, "MAX_CONNECTIONS", 4)
    a, b = ranks(2)
    held = [connect(b) for _ in range(6)]
    held[1].sendall(b"junk\n")                           # judged before it is ended: refused, not evicted
    pump(b, lambda: b.refused + b.dropped == 2)
    assert (b.dropped, b.refused) == (1, 1)
    for sock in held:
        sock.settimeout(0.05)                            # the ended ones answer at once
    assert [ended(sock) for sock in held] == [True, True, False, False, False, False]
    a.send(1, 1, (0, 1))                                 # a peer still gets in (it ends the oldest idle one)
    assert take(b, 1) == [(1, (0, 1))] and b.refused == 2
    for sock in held:
        sock.close()


def connections(ports):
    return [c for c in psutil.Process().net_connections(kind="tcp")
            if c.laddr and c.laddr.port in ports or c.raddr and c.raddr.port in ports]


def test_close_is_idempotent_and_leaves_no_socket_open(ranks):
    fds = len(os.listdir("/proc/self/fd"))
    everyone = ranks(3)
    for a in everyone:
        for peer in range(3):
            if peer != a.rank:
                a.send(peer, 1, (a.rank, peer))
    for a in everyone:
        assert len(take(a, 2)) == 2
    idle = connect(everyone[0])
    ports = {port(a) for a in everyone}
    pump(everyone[0], lambda: len(everyone[0]._connections) == 3)
    assert len(connections(ports)) == 3 + 6 + 6 + 2      # listeners, both ends of 6 connections, idle's
    for _ in range(2):
        for a in everyone:
            a.close()
    idle.close()
    assert [c for c in connections(ports) if c.status != psutil.CONN_TIME_WAIT] == []
    assert len(os.listdir("/proc/self/fd")) == fds
    for a in everyone:
        assert a.receive(0.0) is None
        a.send(1 - a.rank % 2, 2, (0, 1))                # after close: nothing, no error


def test_a_failing_allgather_closes_the_listening_socket():
    fds = len(os.listdir("/proc/self/fd"))

    def allgather(address):
        raise RuntimeError("the exchange failed")

    with pytest.raises(RuntimeError, match="the exchange failed"):
        Activations("127.0.0.1", allgather, 0, KEY)
    assert len(os.listdir("/proc/self/fd")) == fds
