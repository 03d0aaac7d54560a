import json
import logging
import socket
import threading
import time

import pytest

from fakes import context, round_result, run_ranks
from horovod_hetero.errors import StateServerError, StateServerTimeout
from horovod_hetero.strategies import AVERAGE, ESync, StepReport
from horovod_hetero.transports.state_server import StateClient, StateServer
from horovod_hetero.validation import parse_address


@pytest.fixture
def server():
    s = StateServer(3, epsilon=0.001)
    yield s
    s.close()


def test_blocking_queries_follow_query_state(server):
    fast, slow, other = (StateClient(server.address, r) for r in range(3))
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
    answers = run_ranks(3, lambda r: [StateClient(server.address, r).query(k, 0.001 * (r + 1), 0)
                                      for k in range(1, 30)])
    assert all(len(a) == 29 for a in answers) and server.handled >= 87


def test_delayed_ack_send_and_poll(server):
    c = StateClient(server.address, 0)
    seqs = [c.send_query(k, 0.01, 0) for k in range(1, 4)]
    got = []
    deadline = time.monotonic() + 2
    while len(got) < 3 and time.monotonic() < deadline:
        got += c.poll(0.1)
    assert [a["seq"] for a in got] == seqs and all(a["round"] == 0 for a in got)
    c.close()


def test_rtt_is_measured_only_for_an_awaited_answer(server):
    c = StateClient(server.address, 0)
    c.send_query(1, 0.01, 0)
    time.sleep(0.2)                                        # delayed ACK: the answer comes while training
    assert len(c.poll(0.0)) == 1 and c.last_rtt is None    # read late: not a round trip
    c.query(2, 0.01, 0)
    assert 0 < c.last_rtt < 0.2
    c.close()


def test_server_survives_a_disconnecting_worker_and_garbage(server):
    gone = StateClient(server.address, 1)
    gone.send_query(1, 0.5, 0)
    gone.close()                                           # disconnects with an answer pending
    with socket.create_connection(parse_address(server.address), timeout=2) as raw:
        raw.sendall(b"not json\n" + b'{"op": "query"}\n')
        lines = raw.makefile("rb")
        answers = lines.readline(), lines.readline()
    assert all("error" in json.loads(a) for a in answers)
    half = socket.create_connection(parse_address(server.address), timeout=2)
    half.sendall(b'{"op": "que')                            # disconnects in the middle of a message
    half.close()
    alive = StateClient(server.address, 0)
    assert alive.query(1, 0.01, 0) in (True, False)
    alive.close()


def test_leave_excludes_a_worker_from_the_slowest(server):
    a, b, c = (StateClient(server.address, r) for r in range(3))
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
    c = StateClient("tcp://127.0.0.1:9", 0, timeout=0.2)
    t0 = time.monotonic()
    with pytest.raises(StateServerError, match="cannot reach the ESync state server at tcp://127.0.0.1:9"):
        c.query(1, 0.01, 0)
    assert time.monotonic() - t0 < 1.0
    c.close()


def test_silent_server_times_out():
    silent = socket.create_server(("127.0.0.1", 0))       # accepts connections, never answers
    c = StateClient(f"tcp://127.0.0.1:{silent.getsockname()[1]}", 0, timeout=0.2)
    t0 = time.monotonic()
    with pytest.raises(StateServerTimeout, match="did not answer within 0.2 s"):
        c.query(1, 0.01, 0)
    assert 0.2 <= time.monotonic() - t0 < 1.0
    c.close()
    silent.close()


def test_a_closed_server_makes_the_next_call_fail_not_hang():
    s = StateServer(1)
    c = StateClient(s.address, 0, timeout=5.0)
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
        StateClient(address, 0)


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


@pytest.mark.parametrize("kwargs,match", [({"global_lr": 0}, "global_lr"), ({"global_lr": -1.0}, "global_lr"),
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
    ctx0, transports0 = context(0, 2)
    strategies[0].start(ctx0)                                   # rank 0 starts the server
    ctx1, transports1 = context(1, 2, broadcast=lambda x: transports0.server.address)
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


def test_deep_nesting_oversized_lines_and_bad_numbers_are_rejected_and_counted(server):
    with socket.create_connection(parse_address(server.address), timeout=2) as raw:
        raw.sendall(b"[" * 4000 + b"\n")                                       # RecursionError in json
        raw.sendall(b'{"op": "query", "rank": 7, "k": 1, "c": 0.1, "round": 0, "seq": 1}\n')   # rank out of range
        raw.sendall(b'{"op": "query", "rank": 0, "k": 1, "c": Infinity, "round": 0, "seq": 2}\n')
        lines = raw.makefile("rb")
        answers = [json.loads(lines.readline()) for _ in range(3)]
    assert [a["error"].split(":")[0] for a in answers] == ["RecursionError", "ValueError", "ValueError"]
    assert server.rejected == 3
    with socket.create_connection(parse_address(server.address), timeout=2) as big:
        try:
            big.sendall(b"x" * 100_000)                                        # no newline for 100 kB: cut off
            hung_up = big.recv(1) == b""                                       # the server closed ...
        except ConnectionResetError:                                           # ... with our bytes unread
            hung_up = True
        assert hung_up
    assert server.rejected == 4
    alive = StateClient(server.address, 0)                                     # and still serves workers
    assert alive.query(1, 0.01, 0) is False and server.handled >= 1
    alive.close()
