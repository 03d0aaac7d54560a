import errno
import json
import logging
import os
import resource
import selectors
import socket
import threading
import time

import pytest

from fakes import context, round_result, run_ranks, shared_broadcast
from horovod_hetero.errors import StateServerError, StateServerTimeout
from horovod_hetero.rules.esync_state import ESyncState
from horovod_hetero.strategies import AVERAGE, ESync, StepReport
from horovod_hetero.transports import state_server
from horovod_hetero.transports.auth import Channel, new_key
from horovod_hetero.transports.state_server import GREETING, MAX_PENDING, StateClient, StateServer
from horovod_hetero.validation import parse_address

KEY = new_key()


@pytest.fixture
def server():
    s = StateServer(3, KEY, epsilon=0.001)
    yield s
    s.close()


def test_blocking_queries_follow_query_state(server):
    fast, slow, other = (StateClient(server.address, r, KEY) for r in range(3))
    assert fast.query(0, None, 0) is False                 # registration, capability unknown
    assert slow.query(0, None, 0) is False and other.query(0, None, 0) is False
    assert fast.query(1, 0.01, 0) is False                 # others have not measured a step yet
    assert other.query(1, 0.01, 0) is False                # the slow one has not either
    assert slow.query(1, 10.0, 0) is True                  # the slowest: ready after one step
    assert fast.query(2, 0.01, 0) is True                  # slowest already ready
    assert fast.last_rtt is not None and fast.last_rtt < 1.0
    for c in (fast, slow, other):
        c.close()


def test_many_clients_concurrently(server):
    answers = run_ranks(3, lambda r: [StateClient(server.address, r, KEY).query(k, 0.001 * (r + 1), 0)
                                      for k in range(1, 30)])
    assert all(len(a) == 29 for a in answers) and server.handled >= 87


def test_delayed_ack_send_and_poll(server):
    c = StateClient(server.address, 0, KEY)
    seqs = [c.send_query(k, 0.01, 0) for k in range(1, 4)]
    got = []
    deadline = time.monotonic() + 2
    while len(got) < 3 and time.monotonic() < deadline:
        got += c.poll(0.1)
    assert [a["seq"] for a in got] == seqs and all(a["round"] == 0 for a in got)
    c.close()


def test_rtt_is_measured_only_for_an_awaited_answer(server):
    c = StateClient(server.address, 0, KEY)
    c.send_query(1, 0.01, 0)
    time.sleep(0.2)                                        # delayed ACK: the answer comes while training
    assert len(c.poll(0.0)) == 1 and c.last_rtt is None    # read late: not a round trip
    c.query(2, 0.01, 0)
    assert 0 < c.last_rtt < 0.2
    c.close()


def test_server_survives_a_worker_that_disconnects_with_an_answer_pending_or_mid_message(server):
    gone = StateClient(server.address, 1, KEY)
    gone.send_query(1, 0.5, 0)
    gone.close()                                           # disconnects with an answer pending
    half, lines, challenge = raw_connection(server)
    half.sendall(worker_channel(KEY, challenge).seal(b'{"op": "que'))   # in the middle of a message
    half.close()
    alive = StateClient(server.address, 0, KEY)
    assert alive.query(1, 0.01, 0) in (True, False)
    alive.close()


def test_leave_excludes_a_worker_from_the_slowest(server):
    a, b, c = (StateClient(server.address, r, KEY) for r in range(3))
    b.query(1, 10.0, 0)
    c.query(0, None, 0)                                    # c registered, has not measured a step
    assert a.query(1, 0.01, 0) is False                    # nobody knows how slow c is
    c.leave()                                              # c stopped training
    time.sleep(0.05)
    assert a.query(2, 0.01, 0) is False                    # b (10 s) is the slowest: a step fits
    assert b.query(2, 10.0, 0) is True and a.query(3, 0.01, 0) is True
    for client in (a, b, c):
        client.close()


def test_unreachable_server_fails_fast():
    c = StateClient("tcp://127.0.0.1:9", 0, KEY, timeout=0.2)
    t0 = time.monotonic()
    with pytest.raises(StateServerError, match="cannot reach the ESync state server at tcp://127.0.0.1:9"):
        c.query(1, 0.01, 0)
    assert time.monotonic() - t0 < 1.0
    c.close()


def test_silent_server_times_out():
    silent = socket.create_server(("127.0.0.1", 0))       # accepts connections, never answers
    c = StateClient(f"tcp://127.0.0.1:{silent.getsockname()[1]}", 0, KEY, timeout=0.2)
    t0 = time.monotonic()
    with pytest.raises(StateServerTimeout, match="did not answer within 0.2 s"):
        c.query(1, 0.01, 0)
    assert 0.2 <= time.monotonic() - t0 < 1.0
    c.close()
    silent.close()


def test_a_closed_server_makes_the_next_call_fail_not_hang():
    s = StateServer(1, KEY)
    c = StateClient(s.address, 0, KEY, timeout=5.0)
    assert c.query(1, 0.01, 0) is True
    s.close()
    t0 = time.monotonic()
    with pytest.raises(StateServerError, match="went away|cannot reach"):
        for _ in range(3):                                  # the first send may still be accepted
            c.query(2, 0.01, 0)
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("address", ["127.0.0.1", "tcp://:5", "tcp://host:port"])
def test_bad_server_address(address):
    with pytest.raises(ValueError, match="server_address must look like tcp://host:port"):
        StateClient(address, 0, KEY)


def test_esync_falls_back_once_with_a_warning(caplog):
    s = ESync(timeout=0.1, fallback_period=3, server_address="tcp://127.0.0.1:9")
    with caplog.at_level(logging.WARNING, logger="horovod_hetero"):
        ctx, transports = context(0, 1)
        s.start(ctx)
        decisions = []
        for _ in range(7):
            ready = s.after_step(StepReport(step_s=0.01)) is AVERAGE
            decisions.append(ready)
            if ready:
                s.after_round(round_result(s.round + 1))
    assert decisions == [False, False, True, False, False, True, False]
    assert s.fallback and len([r for r in caplog.records if "falling back" in r.message]) == 1
    transports.close()


@pytest.mark.parametrize("kwargs,match", [({"epsilon": -1.0}, "epsilon"), ({"global_lr": 0.5}, "global_lr"),
                                          ({"mode": "async"}, "mode must be one of 'blocking', 'delayed_ack'"),
                                          ({"fallback_period": 0}, "fallback_period"),
                                          ({"overshoot": 2.0}, "overshoot"), ({"timeout": 0}, "timeout"),
                                          ({"server_address": "localhost"}, "server_address must look like")])
def test_esync_bad_configuration(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ESync(**kwargs)


def test_two_workers_through_the_real_server_fast_runs_several_steps_slow_one():
    """Threads stand in for ranks; a barrier stands in for the allreduce."""
    barrier = threading.Barrier(2, timeout=10)
    strategies = [ESync(overshoot=0.0), ESync(overshoot=0.0)]
    root, member = shared_broadcast()
    ctx0, transports0 = context(0, 2, broadcast=root)
    strategies[0].start(ctx0)                                   # rank 0 starts the server
    ctx1, transports1 = context(1, 2, broadcast=member())       # and broadcasts the key and its address
    strategies[1].start(ctx1)

    def rank_main(rank):
        s, step = strategies[rank], (0.01, 0.06)[rank]
        per_round = []
        while len(per_round) < 5:
            time.sleep(step)
            if s.after_step(StepReport(step_s=step)) is AVERAGE:
                per_round.append(s.local_steps)
                barrier.wait()
                s.after_round(round_result(s.round + 1, size=2))
        return per_round

    fast, slow = run_ranks(2, rank_main, timeout=30)
    for transports in (transports1, transports0):
        transports.close()
    assert slow[1:] == [1] * 4                           # round 1 also holds the unreported warm-up step
    assert min(fast[1:]) >= 3                            # ~5 fit in one slow step


def test_a_server_stalled_longer_than_the_query_timeout_does_not_split_the_ranks():
    """Issue 16: in round 2 rank 0's server stalls for 1 s (its lock held, as a SIGSTOP or a long
    step without the GIL would); ranks 1 and 2 give up after 0.3 s, rank 0 (timeout 5 s) waits.
    Ranks 1 and 2 fall back for that round only and tell the server they entered it, which makes
    rank 0 ready: all three reach every round (a barrier stands in for the allreduce), and from
    round 3 on all ask the server again."""
    size, stalled = 3, threading.Event()
    barrier = threading.Barrier(size, timeout=10)
    strategies = [ESync(overshoot=0.0, timeout=5.0 if rank == 0 else 0.3, fallback_period=3) for rank in range(size)]
    root, member = shared_broadcast()
    opened = [context(0, size, broadcast=root)] + [context(rank, size, broadcast=member()) for rank in (1, 2)]
    for strategy, (ctx, _) in zip(strategies, opened):
        strategy.start(ctx)
    server = opened[0][1].server

    def stall():
        with server._lock:
            time.sleep(1.0)

    def rank_main(rank):
        s, fell_back = strategies[rank], []
        while len(fell_back) < 6:
            if rank == 0 and s.round == 2 and not stalled.is_set():
                stalled.set()
                threading.Thread(target=stall).start()
            time.sleep(0.01 if rank < 2 else 0.03)
            if s.after_step(StepReport(step_s=0.01 if rank < 2 else 0.03)) is AVERAGE:
                fell_back.append(s.fallback)
                barrier.wait()
                s.after_round(round_result(s.round + 1, size=size))
        return fell_back

    fell_back = run_ranks(size, rank_main, timeout=30)
    for _, transports in reversed(opened):
        transports.close()
    assert fell_back == [[False] * 6] + [[False, False, True, False, False, False]] * 2
    assert server.state.entered_round == 2


def test_a_worker_whose_connection_closed_still_tells_the_server_it_entered_the_round(server):
    """A worker whose reset failed (its connection closed, its record a round behind) falls back and enters
    the round: it connects again to say so, so the others are ready at their next query instead of waiting
    for its record until they fall back too."""
    worker, other = StateClient(server.address, 1, KEY), StateClient(server.address, 2, KEY)
    assert worker.query(0, None, 0) is False and other.query(0, None, 0) is False
    worker.close()                                         # as a failed reset leaves it
    worker.enter(1)
    deadline = time.monotonic() + 3
    while server.state.entered_round != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.state.entered_round == 1 and server.state.records[1].round == 1
    assert other.query(1, 0.01, 1) is True                 # ready: a worker waits in round 1's aggregation
    for c in (worker, other):
        c.close()


def test_entering_a_round_with_the_server_gone_connects_for_enter_connect_s_and_fails(monkeypatch):
    s = StateServer(2, KEY)
    client = StateClient(s.address, 1, KEY, timeout=5.0)
    client.query(0, None, 0)
    s.close()
    client.close()
    waits = []
    connect = state_server.socket.create_connection

    def recorded(address, *args, **kwargs):
        waits.append(kwargs.get("timeout"))
        return connect(address, *args, **kwargs)

    monkeypatch.setattr(state_server.socket, "create_connection", recorded)
    with pytest.raises(StateServerError):              # refused (or, were the port reused, no greeting)
        client.enter(1)
    assert waits == [state_server.ENTER_CONNECT_S]


def test_a_server_that_accepts_but_never_greets_costs_enter_connect_s_in_all(monkeypatch):
    """A listener whose process is stopped still accepts (its kernel does) but never greets: the connection and
    the greeting share one deadline."""
    listener = socket.create_server(("127.0.0.1", 0))
    monkeypatch.setattr(state_server, "ENTER_CONNECT_S", 0.2)
    client = StateClient(f"tcp://127.0.0.1:{listener.getsockname()[1]}", 1, KEY, timeout=5.0)
    started = time.perf_counter()
    with pytest.raises(StateServerTimeout):
        client.enter(1)
    waited = time.perf_counter() - started
    listener.close()
    assert 0.2 <= waited < 5.0                          # the deadline's, not the client's 5-s timeout


def raw_connection(server):
    """A foreign client: a plain socket to ``server``, its reader, and the challenge of its greeting."""
    sock = socket.create_connection(parse_address(server.address), timeout=3)
    lines = sock.makefile("rb")
    greeting = lines.readline()
    assert greeting.startswith(GREETING) and len(greeting) == len(GREETING) + 33
    return sock, lines, greeting[len(GREETING):-1]


def worker_channel(key, challenge):
    """What a worker holding ``key`` seals on the connection of ``challenge``."""
    return Channel(key, sends=b"worker|" + challenge, receives=b"server|" + challenge)


def hung_up(lines):
    """True if the server closed the connection without a word."""
    try:
        return lines.read() == b""
    except ConnectionResetError:
        return True


def send(sock, data):
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):        # the server hung up before reading it all
        pass


QUERY = b'{"op": "query", "rank": 1, "k": 1, "c": 1000000000.0, "round": 0, "seq": 1}'
FORGERIES = {
    "garbage": lambda challenge: b"junk\n",
    "unsealed query posing as rank 1": lambda challenge: QUERY + b"\n",
    "sealed with another key": lambda challenge: worker_channel(new_key(), challenge).seal(QUERY) + b"\n",
    "sealed for another connection": lambda challenge: worker_channel(KEY, b"0" * 32).seal(QUERY) + b"\n",
    "sealed as the server speaks": lambda challenge: Channel(KEY, sends=b"server|" + challenge).seal(QUERY) + b"\n",
    "altered after sealing": lambda challenge: worker_channel(KEY, challenge).seal(QUERY).replace(b'"rank": 1',
                                                                                                  b'"rank": 2') + b"\n",
    "leave without the key": lambda challenge: b'1 ' + b"0" * 64 + b' {"op": "leave", "rank": 1}\n',
    "100 kB without a newline": lambda challenge: b"x" * 100_000,
    "nested 200,000 deep": lambda challenge: b"[" * 200_000 + b"\n",
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_line_that_is_not_a_workers_ends_its_connection_is_counted_and_never_acted_on(server, forgery):
    sock, lines, challenge = raw_connection(server)
    send(sock, FORGERIES[forgery](challenge))
    assert hung_up(lines)
    sock.close()
    assert (server.rejected, server.handled) == (1, 0)
    assert server.state.state_dict() == ESyncState(3).state_dict()             # nothing acted on
    alive = StateClient(server.address, 0, KEY)                                # workers are still served
    assert alive.query(1, 0.01, 0) is False and server.handled == 1
    alive.close()


def test_a_line_cut_off_by_the_end_of_its_connection_is_refused(server):
    sock, lines, challenge = raw_connection(server)
    sock.sendall(worker_channel(KEY, challenge).seal(b'{"op": "leave", "rank": 1}'))   # no newline
    sock.shutdown(socket.SHUT_WR)
    assert hung_up(lines)
    assert (server.rejected, server.state.records[1].left) == (1, False)


def test_a_replayed_line_is_refused_in_its_own_connection_and_in_another(server):
    sock, lines, challenge = raw_connection(server)
    worker = worker_channel(KEY, challenge)
    leave = worker.seal(b'{"op": "leave", "rank": 2}') + b"\n"
    query = worker.seal(QUERY) + b"\n"
    sock.sendall(leave + query)
    answer = json.loads(worker.open(lines.readline()[:-1]))
    assert answer["seq"] == 1 and server.state.records[2].left
    server.state.records[2].left = False                   # as if rank 2 came back
    other, other_lines, _ = raw_connection(server)
    other.sendall(leave)                                   # recorded, played into another connection
    assert hung_up(other_lines)
    sock.sendall(query)                                    # and again in its own
    assert hung_up(lines)
    assert (server.rejected, server.handled, server.state.records[2].left) == (2, 2, False)


def test_authentic_but_invalid_messages_are_answered_with_an_error_and_counted(server):
    sock, lines, challenge = raw_connection(server)
    worker = worker_channel(KEY, challenge)
    bad = [b"[" * 4000,                                                                # RecursionError in json
           b'{"op": "query", "rank": 7, "k": 1, "c": 0.1, "round": 0, "seq": 1}',       # rank out of range
           b'{"op": "query", "rank": 0, "k": 1, "c": Infinity, "round": 0, "seq": 2}',
           b'{"op": "query", "rank": 0, "k": 1, "c": NaN, "round": 0, "seq": 3}',
           b'{"op": "query", "rank": 0}']
    sock.sendall(b"".join(worker.seal(b) + b"\n" for b in bad))
    answers = [json.loads(worker.open(lines.readline()[:-1])) for _ in bad]
    assert [a["error"].split(":")[0] for a in answers] == ["RecursionError", "ValueError", "ValueError",
                                                           "ValueError", "KeyError"]
    assert (server.rejected, server.handled) == (5, 0)
    sock.sendall(worker.seal(b'{"op": "query", "rank": 0, "k": 1, "c": 0.1, "round": 0, "seq": 4}') + b"\n")
    assert json.loads(worker.open(lines.readline()[:-1]))["seq"] == 4                 # the connection goes on
    sock.close()


def test_connections_waiting_to_authenticate_are_bounded_and_timed_out_and_workers_are_bounded(monkeypatch):
    monkeypatch.setattr(state_server, "AUTH_TIMEOUT_S", 1.5)
    server = StateServer(1, KEY, max_workers=1)
    assert server.max_pending == MAX_PENDING + 1                               # one worker and the margin
    held = [raw_connection(server) for _ in range(server.max_pending + 8)]
    t0 = time.monotonic()
    assert all(hung_up(lines) for _, lines, _ in held[:8])                     # the oldest made room at once
    assert server.refused == 8 and time.monotonic() - t0 < 1.0
    assert all(hung_up(lines) for _, lines, _ in held[8:])                     # the rest after 1.5 s of silence
    assert server.refused == server.max_pending + 8 and time.monotonic() - t0 < 5.0
    first, second = StateClient(server.address, 0, KEY), StateClient(server.address, 0, KEY)
    assert first.query(1, 0.01, 0) is True
    with pytest.raises(StateServerError):
        second.query(1, 0.01, 0)                                               # one worker connection at most
    assert server.refused == server.max_pending + 9 and first.query(2, 0.01, 0) is True
    for sock, _, _ in held:
        sock.close()
    first.close(), second.close(), server.close()


def fake_server(answer):
    """A listener that greets its first client with challenge 0...0, reads one line, sends ``answer``."""
    listener = socket.create_server(("127.0.0.1", 0))
    challenge = b"0" * 32

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.sendall(GREETING + challenge + b"\n")
            conn.recv(4096)
            conn.sendall(answer(challenge))
            time.sleep(1.0)

    threading.Thread(target=serve, daemon=True).start()
    return listener, f"tcp://127.0.0.1:{listener.getsockname()[1]}"


REPLY = b'{"seq": 1, "ready": true, "round": 0, "slowest": false}'


def test_the_client_drops_answers_that_are_not_the_servers_and_counts_them():
    forged = lambda challenge: (REPLY + b"\n" + Channel(new_key(), sends=b"server|" + challenge).seal(REPLY) + b"\n"
                                + Channel(KEY, sends=b"worker|" + challenge).seal(REPLY) + b"\n")
    listener, address = fake_server(forged)
    client = StateClient(address, 0, KEY, timeout=0.3)
    with pytest.raises(StateServerTimeout):
        client.query(1, 0.01, 0)
    assert client.rejected == 3
    listener.close()
    listener, address = fake_server(lambda challenge: Channel(KEY, sends=b"server|" + challenge).seal(REPLY) + b"\n")
    client = StateClient(address, 0, KEY, timeout=0.5)
    assert client.query(1, 0.01, 0) is True and client.rejected == 0                 # the real thing is taken
    listener.close()


def test_the_client_refuses_an_oversized_answer_and_a_peer_that_is_not_a_state_server():
    listener, address = fake_server(lambda challenge: b"x" * 10_000)
    with pytest.raises(StateServerError, match="sent a line over 4096 bytes"):
        StateClient(address, 0, KEY, timeout=1.0).query(1, 0.01, 0)
    listener.close()
    other = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=lambda: other.accept()[0].sendall(b"SSH-2.0-OpenSSH_9.6" + b" " * 60 + b"\n"),
                     daemon=True).start()
    with pytest.raises(StateServerError, match="not a horovod_hetero state server"):
        StateClient(f"tcp://127.0.0.1:{other.getsockname()[1]}", 0, KEY, timeout=1.0).query(1, 0.01, 0)
    other.close()


def test_servers_bind_the_interfaceaddressesrun_gives_gloo_and_never_advertise_loopback_across_hosts(monkeypatch):
    from types import SimpleNamespace

    from horovod_hetero.transports import addresses
    for name in (addresses.ENV_SERVER_HOST, addresses.ENV_GLOO_IFACE, addresses.ENV_RENDEZVOUS, *addresses.ENV_MPI_IFACES):
        monkeypatch.delenv(name, raising=False)
    interfaces = {"lo": ["127.0.0.1"], "eth0": ["10.1.2.3"], "ib0": ["192.168.5.6"]}
    monkeypatch.setattr(addresses, "_interfaces", lambda: {
        name: [SimpleNamespace(family=socket.AF_INET6, address="fe80::1")] +
              [SimpleNamespace(family=socket.AF_INET, address=a) for a in addresses]
        for name, addresses in interfaces.items()})
    monkeypatch.setattr(addresses, "_host_name_address", lambda: "127.0.1.1")    # as on many Linux hosts
    assert addresses.server_host(all_local=True) == "127.0.0.1"
    monkeypatch.setenv(addresses.ENV_GLOO_IFACE, "ib0")
    assert addresses.server_host(all_local=False) == "192.168.5.6"                # Gloo's interface
    monkeypatch.setenv(addresses.ENV_SERVER_HOST, "10.9.9.9")
    assert addresses.server_host(all_local=False) == "10.9.9.9"                   # the user's choice first
    monkeypatch.delenv(addresses.ENV_SERVER_HOST)
    monkeypatch.setenv(addresses.ENV_GLOO_IFACE, "lo")
    monkeypatch.setenv(addresses.ENV_RENDEZVOUS, "127.0.0.1")                     # loopback everywhere:
    with pytest.raises(ValueError, match="set HOROVOD_HETERO_STATE_SERVER_HOST to this host's address"):
        addresses.server_host(all_local=False)                                    # two interfaces, no choice
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "^docker,ib")                       # under horovodrun --mpi
    assert addresses.server_host(all_local=False) == "192.168.5.6"                # prefix "ib": ib0
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=ib")                               # exactly "ib": none
    monkeypatch.setenv("OMPI_MCA_btl_tcp_if_include", "eth0")                     # Open MPI's own choice
    assert addresses.server_host(all_local=False) == "10.1.2.3"
    monkeypatch.delenv("NCCL_SOCKET_IFNAME")
    monkeypatch.delenv("OMPI_MCA_btl_tcp_if_include")
    del interfaces["ib0"]
    assert addresses.server_host(all_local=False) == "10.1.2.3"                   # the only one
    assert addresses.route_address("127.0.0.1") == "127.0.0.1" and addresses.route_address("no-such-host.invalid") is None


def test_a_burst_of_connections_is_accepted_without_syn_retries_and_none_is_evicted():
    """Every worker connects at its first query, all at once: with socketserver's default backlog
    (5) most SYNs of a burst were dropped and retried a second or more later, and beyond 64
    connections waiting to authenticate the oldest were ended."""
    server = StateServer(256, KEY)
    address = parse_address(server.address)
    socks = [socket.socket() for _ in range(256)]
    try:
        with selectors.DefaultSelector() as connecting:
            for s in socks:
                s.setblocking(False)
                s.connect_ex(address)
                connecting.register(s, selectors.EVENT_WRITE)
            deadline = time.monotonic() + 0.5                  # a dropped SYN is sent again after 1 s
            while connecting.get_map() and time.monotonic() < deadline:
                for key, _ in connecting.select(deadline - time.monotonic()):
                    connecting.unregister(key.fileobj)
            assert not connecting.get_map()
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for s in socks)
        for s in socks:
            s.settimeout(10.0)
            assert s.recv(len(GREETING)) == GREETING
        assert server.refused == 0
    finally:
        for s in socks:
            s.close()
        server.close()


def test_a_worker_that_sends_without_reading_its_answers_is_ended_and_the_others_are_served(server):
    """One thread serves every connection: a peer that never reads must not block it."""
    sock, lines, challenge = raw_connection(server)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    worker = worker_channel(KEY, challenge)
    query = b'{"op": "query", "rank": 1, "k": 1, "c": 0.1, "round": 0, "seq": 1}'
    alive = StateClient(server.address, 0, KEY)
    deadline = time.monotonic() + 20
    while server.refused == 0 and time.monotonic() < deadline:
        try:
            sock.sendall(b"".join(worker.seal(query) + b"\n" for _ in range(500)))
        except OSError:
            break
        assert alive.query(1, 0.01, 0) is False                 # served meanwhile
    assert server.refused == 1 and server.rejected == 0
    sock.close(), alive.close()


def test_two_lines_sent_byte_by_byte_are_answered_in_order(server):
    sock, lines, challenge = raw_connection(server)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    worker = worker_channel(KEY, challenge)
    data = b"".join(worker.seal(QUERY.replace(b'"seq": 1', b'"seq": %d' % seq)) + b"\n" for seq in (1, 2))
    for i in range(len(data)):                             # the server reads a line in many pieces
        sock.sendall(data[i:i + 1])
        time.sleep(0.0005)
    assert [json.loads(worker.open(lines.readline()[:-1]))["seq"] for _ in range(2)] == [1, 2]
    assert (server.handled, server.rejected) == (2, 0)
    sock.close()


def test_a_failure_in_the_servers_own_code_ends_that_connection_only_and_is_logged(server, monkeypatch, caplog):
    handle = server._handle

    def flawed(msg):
        if msg["rank"] == 1:
            raise RuntimeError("a bug")
        return handle(msg)

    monkeypatch.setattr(server, "_handle", flawed)
    hit, alive = StateClient(server.address, 1, KEY, timeout=1.0), StateClient(server.address, 0, KEY)
    with caplog.at_level(logging.ERROR, logger="horovod_hetero"):
        with pytest.raises(StateServerError, match="went away"):
            hit.query(1, 0.01, 0)
        assert alive.query(1, 0.01, 0) is False            # served on
    assert (server.failures, server.rejected) == (1, 0)    # not taken for an intruder
    assert [r.exc_info[0] for r in caplog.records] == [RuntimeError]
    hit.close(), alive.close()


def test_a_failure_while_accepting_does_not_end_the_server(server, monkeypatch, caplog):
    port = parse_address(server.address)[1]
    setsockopt, failed = socket.socket.setsockopt, []

    def flaky(sock, *args):
        if not failed and sock.getsockname()[1] == port:  # the server's end of a new connection
            failed.append(sock)
            raise OSError(errno.EINVAL, "Invalid argument")  # as for a connection reset before it is set up
        return setsockopt(sock, *args)

    monkeypatch.setattr(socket.socket, "setsockopt", flaky)
    with pytest.raises(StateServerError, match="not a horovod_hetero state server"):
        StateClient(server.address, 0, KEY, timeout=1.0).query(1, 0.01, 0)   # that connection is closed
    assert failed and server.failures == 0
    # a whole round trip: the server has ended the accept pass that closed that connection (a pass goes on
    # accepting, so a connection made at once could be accepted by it, never reaching the replacement below)
    first = StateClient(server.address, 0, KEY)
    first.query(1, 0.01, 0)
    first.close()

    def flawed():
        del server._accept                                 # fails once
        raise RuntimeError("a bug")

    server._accept = flawed
    with caplog.at_level(logging.ERROR, logger="horovod_hetero"):
        client = StateClient(server.address, 0, KEY)
        assert client.query(1, 0.01, 0) is False           # accepted at the next pass
    assert server.failures == 1 and [r.exc_info[0] for r in caplog.records] == [RuntimeError]
    client.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="lists descriptors in /proc")
def test_out_of_file_descriptors_the_server_pauses_accepting_instead_of_spinning(server, monkeypatch):
    select, selects = server._selector.select, []
    monkeypatch.setattr(server._selector, "select", lambda timeout: selects.append(timeout) or select(timeout))
    socks = [socket.socket() for _ in range(3)]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filler = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(map(int, os.listdir("/proc/self/fd"))) + 1, hard))
        while True:                                         # take every descriptor left
            try:
                filler.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        for s in socks:
            s.setblocking(False)
            s.connect_ex(parse_address(server.address))
        time.sleep(0.5)
        passes = len(selects)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for fd in filler:
            os.close(fd)
    assert passes < 30                                      # paused 0.1 s at a time; a busy loop makes thousands
    for s in socks:                                         # accepted once descriptors are free again
        s.settimeout(5.0)
        assert s.recv(len(GREETING)) == GREETING
        s.close()
    assert server.refused == 0


def open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_close_ends_every_connection_even_with_its_thread_stuck_and_releases_everything(monkeypatch, caplog):
    monkeypatch.setattr(state_server, "CLOSE_TIMEOUT_S", 0.3)
    fds = open_fds()
    server = StateServer(2, KEY)
    client = StateClient(server.address, 0, KEY, timeout=5.0)
    client.query(0, None, 0)
    server.close()
    assert not server._thread.is_alive()
    with pytest.raises(StateServerError):
        for _ in range(3):                                  # the first send may still be accepted
            client.query(1, 0.01, 0)
    assert open_fds() == fds
    server = StateServer(2, KEY)
    client = StateClient(server.address, 0, KEY, timeout=5.0)
    client.query(0, None, 0)
    with server._lock:                                     # the thread answering the next query waits for it
        client.send_query(1, 0.01, 0)
        time.sleep(0.1)
        with caplog.at_level(logging.WARNING, logger="horovod_hetero"):
            server.close()
        with pytest.raises(StateServerError, match="went away"):
            client.poll(2.0)                               # its connection was ended all the same
        assert "did not stop within 0.3 s" in caplog.text
    server._thread.join(2.0)
    assert not server._thread.is_alive()
    with socket.socket() as probe:
        assert probe.connect_ex(parse_address(server.address)) == errno.ECONNREFUSED
    client.close()
    assert open_fds() == fds


def test_a_client_socket_numbered_from_1024_on_is_served(server):
    """Rank 0 holds the server's connections besides Gloo's: select.select refused such a socket (ValueError)."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1200:   # the server raised it to the hard limit
        pytest.skip("fewer than 1200 file descriptors allowed")
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        client = StateClient(server.address, 0, KEY)
        assert client.query(1, 0.01, 0) is False and client._sock.fileno() >= 1024
        assert client.poll(0.0) == [] and client.poll(0.05) == []
        client.close()
    finally:
        for fd in filler:
            os.close(fd)


def test_a_connection_trickling_bytes_is_ended_when_its_time_to_authenticate_is_up(monkeypatch):
    """The time to send the first authentic line runs from the greeting: bytes short of a line do not extend it."""
    monkeypatch.setattr(state_server, "AUTH_TIMEOUT_S", 1.0)
    server = StateServer(1, KEY)
    sock, _, _ = raw_connection(server)
    sock.settimeout(0.1)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5.0:
        try:
            sock.sendall(b"1")                             # a byte every 0.1 s, never a newline
            if sock.recv(1) == b"":
                break
        except TimeoutError:
            continue
        except OSError:
            break
    assert 0.5 < time.monotonic() - t0 < 2.0 and (server.refused, server.rejected) == (1, 0)
    sock.close(), server.close()
