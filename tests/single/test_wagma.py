"""WAGMA without Horovod: process sets, errors, the wait-avoiding exchange over real sockets, the
strategy's decisions carried out by the runtime."""
import queue
import socket
import threading
import time

import numpy as np
import pytest

from fakes import ArrayCollectives, ArrayModel, context, run_ranks
from horovod_hetero.common.process_sets import registered_ids, world_size
from horovod_hetero.errors import CollectiveTimeoutError
from horovod_hetero.rules.grouping import butterfly_groups, process_set_ranks, resolve_group_size
from horovod_hetero.runtime.controller import HeteroController
from horovod_hetero.runtime.straggler import Slowdown, delayed_ranks, parse_random_delay
from horovod_hetero.strategies import WAGMA
from horovod_hetero.transports.activations import MAX_MESSAGE_BYTES, Activations, encode
from horovod_hetero.transports.auth import Channel, new_key
from horovod_hetero.runtime.group_exchange import MAX_SERVING, NAME_SLOTS, GroupExchange

KEY = new_key()


def test_process_sets_every_group_of_every_partition_without_singletons_or_the_world():
    assert process_set_ranks(4, 2) == [[0, 1], [2, 3], [0, 2], [1, 3]]
    assert process_set_ranks(4) == process_set_ranks(4, 2)           # None: nearest sqrt(4)
    assert process_set_ranks(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 4, 5], [2, 3, 6, 7],
                                       [0, 2, 4, 6], [1, 3, 5, 7]]
    assert process_set_ranks(4, 4) == [] and process_set_ranks(4, 1) == []


def test_sizes_fail_early_and_name_the_fix(monkeypatch):
    with pytest.raises(ValueError, match="launch a power-of-two number of processes"):
        resolve_group_size(None, 6)
    with pytest.raises(ValueError, match=r"must be <= P = 4, got 8; e.g. S = 2"):
        resolve_group_size(8, 4)
    with pytest.raises(ValueError, match="group_size must be a power of two"):
        WAGMA(group_size=3)
    with pytest.raises(ValueError, match=r"sync_period must be an int >= 1, got 0"):
        WAGMA(sync_period=0)
    with pytest.raises(ValueError, match=r"patience must be"):
        WAGMA(patience=-1)
    for name in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r"launch with horovodrun.*wagma_process_sets\(group_size=2, size=4\)"):
        world_size()
    monkeypatch.setenv("HOROVOD_SIZE", "8")
    assert world_size() == 8 and world_size(4) == 4


def test_unregistered_process_sets_name_the_init_call():
    table = {0: [0, 1, 2, 3], 1: [0, 1], 2: [2, 3]}
    assert registered_ids(table, [[0, 1], [2, 3]], "x") == {(0, 1): 1, (2, 3): 2}
    with pytest.raises(ValueError, match=r"missing \[\[0, 2\], \[1, 3\]\].*initialise Horovod with hvd.init"):
        registered_ids(table, process_set_ranks(4, 2), "hvd.init(process_sets=hh.wagma_process_sets())")


class GroupAllreduce:
    """Fake group allreduce matched by name (as Horovod matches ops), callable from any thread."""

    def __init__(self):
        self._cond = threading.Condition()
        self._parts = {}
        self.calls = []

    def __call__(self, model, weight, control, group, name):
        with self._cond:
            self.calls.append((name, weight))
            self._parts.setdefault(name, []).append((weight * np.asarray(model, float), np.asarray(control)))
            self._cond.notify_all()
            assert self._cond.wait_for(lambda: len(self._parts[name]) >= len(group), timeout=5)
            parts = self._parts[name]
            return sum(p[0] for p in parts), sum(p[1] for p in parts).tolist()


def exchanges(patience=0.0, wait_avoiding=True):
    """Two ranks' exchanges (group (0, 1) at every step) over real activation sockets."""
    allreduce, slots, barrier = GroupAllreduce(), [None, None], threading.Barrier(2)

    def make(rank):
        def allgather(address):
            slots[rank] = address
            barrier.wait()
            return list(slots)

        acts = Activations("127.0.0.1", allgather, rank, KEY) if wait_avoiding else None
        return GroupExchange(rank, allreduce, acts, patience=patience, timeout=5, groups=[(0, 1)])

    return run_ranks(2, make), allreduce


def test_a_straggler_is_served_from_its_last_model_and_its_peer_does_not_wait():
    (fast, slow), allreduce = exchanges()
    fast.publish([0.0]), slow.publish([10.0])
    results = {}

    def straggler():
        time.sleep(0.5)
        results["slow"] = slow.average(1, (0, 1), [11.0])

    t = threading.Thread(target=straggler)
    t.start()
    t0 = time.perf_counter()
    results["fast"] = fast.average(1, (0, 1), [1.0])
    fast_wait = time.perf_counter() - t0
    t.join()
    for e in (fast, slow):
        e.close()
    assert fast_wait < 0.3                                           # not the straggler's 0.5 s
    assert not results["fast"].stale and results["slow"].stale and slow.served_stale == 1
    assert results["fast"].summed.tolist() == [11.0] == results["slow"].summed.tolist()   # 1 + stale 10
    assert results["fast"].total_weight == 2.0


def test_patience_waits_for_a_late_own_step_and_plain_mode_always_waits():
    (a, b), _ = exchanges(patience=0.5)
    a.publish([0.0]), b.publish([10.0])
    late = threading.Thread(target=lambda: (time.sleep(0.1), b.average(1, (0, 1), [12.0])))
    late.start()
    result = a.average(1, (0, 1), [1.0])
    late.join()
    assert not result.stale and result.summed.tolist() == [13.0] and b.served_stale == 0
    for e in (a, b):
        e.close()
    (a, b), _ = exchanges(wait_avoiding=False)
    a.publish([0.0]), b.publish([10.0])
    late = threading.Thread(target=lambda: (time.sleep(0.3), b.average(1, (0, 1), [12.0])))
    late.start()
    t0 = time.perf_counter()
    result = a.average(1, (0, 1), [1.0])
    assert time.perf_counter() - t0 >= 0.25 and result.summed.tolist() == [13.0]
    late.join()


def test_a_rank_that_left_contributes_weight_zero_and_keeps_nothing():
    (a, b), allreduce = exchanges()
    a.publish([1.0]), b.publish([5.0], weight=0.0)
    result = a.average(3, (0, 1), [2.0])
    time.sleep(0.1)
    assert result.total_weight == 1.0 and result.summed.tolist() == [2.0] and b._served == {}
    for e in (a, b):
        e.close()


class FakeGroups(ArrayCollectives):
    """Collectives of rank 0 among 4: in a group the peer always contributes ``peer``; a global round
    sums four copies of this rank's model (so the average leaves it unchanged)."""

    def __init__(self, peer=10.0):
        super().__init__(None, rank=0, size=4)
        self.peer = peer

    def allreduce_sum(self, tensors, control, *, ranks=None, name, what, inplace=False, like=None):
        if ranks is None:
            return [4 * t for t in tensors], [4 * c for c in control]
        return [tensors[0] + self.peer], [control[0] + 1.0, 2.0, 2 * control[2]]

    def require_groups(self, rank_lists, init_call):
        self.required = [list(ranks) for ranks in rank_lists]


def test_wagma_strategy_groups_every_step_global_every_period():
    ops, model = FakeGroups(), ArrayModel({"w": np.array([2.0])})
    ctl = HeteroController(WAGMA(group_size=2, sync_period=3, wait_avoiding=False), ops, model)
    ctl.start()
    s = ctl.strategy
    assert ops.required == [[0, 1], [2, 3], [0, 2], [1, 3]]
    decisions = [ctl.after_step() for _ in range(4)]
    assert decisions == [False, False, True, False]                  # True: the global round
    assert model.arrays["w"][0] == 9.0             # 2 -> (2+10)/2 = 6 -> 8 -> (global) -> 9
    assert [s.group_of(t) for t in (1, 2, 3, 4)] == [(0, 1), (0, 2), (0, 1), (0, 2)]
    last = ctl.telemetry.records[-1]
    assert {k: last[k] for k in ("group", "stale", "group_s")} == {"group": [0, 2], "stale": False,
                                                                    "group_s": last["group_s"]}
    assert s.state_dict()["step"] == 4


def test_random_delay_draws_the_same_ranks_everywhere_and_pads_only_them():
    assert parse_random_delay("2:0.05") == (2, 0.05)
    with pytest.raises(ValueError, match="COUNT:SECONDS"):
        parse_random_delay("2")
    for step in range(20):
        drawn = delayed_ranks(4, 2, step)
        assert len(set(drawn)) == 2
        slept = {r: Slowdown(r, size=4, random_delay=(2, 0.5), sleep=lambda s: None).pad(0.0, step) for r in range(4)}
        assert sorted(r for r, s in slept.items() if s == 0.5) == sorted(drawn)
    counts = np.bincount(np.concatenate([delayed_ranks(4, 2, s) for s in range(400)]), minlength=4)
    assert counts.min() > 150                                        # every rank drawn about half the time
    with pytest.raises(ValueError, match="size="):
        Slowdown(0, random_delay="1:0.1")


def test_group_of_follows_the_butterfly_at_every_step_for_p8():
    for rank in range(8):
        s = WAGMA(group_size=4, wait_avoiding=False)
        s.start(context(rank, 8)[0])
        for step in range(1, 13):
            assert s.group_of(step) == [g for g in butterfly_groups(8, 4, step - 1) if rank in g][0]


def test_after_a_join_every_rank_reached_a_weight_zero_serve_is_collected_not_run_again():
    """Between a completed sync_model() and its next step a rank serves weight 0; its step then takes
    the served result ((W_peer + W') / 2) instead of running the group allreduce again alone."""
    (a, b), allreduce = exchanges()
    a.publish([1.0]), b.publish([5.0], weight=0.0, collects=True)
    result = a.average(7, (0, 1), [2.0])
    assert (result.total_weight, result.summed.tolist(), result.stale) == (1.0, [2.0], False)
    mine = b.average(7, (0, 1), [6.0])
    assert (mine.total_weight, mine.summed.tolist(), mine.stale) == (1.0, [2.0], True)
    assert sorted(allreduce.calls) == [("horovod_hetero.group.7", 0.0), ("horovod_hetero.group.7", 1.0)]
    for e in (a, b):
        e.close()


def test_a_rank_in_a_join_answers_at_once_and_a_rank_yet_to_publish_is_waited_for():
    (a, b), _ = exchanges(patience=5.0)
    a.publish([1.0]), b.publish([5.0], weight=0.0)                   # b left: its step will not come
    t0 = time.perf_counter()
    assert a.average(1, (0, 1), [2.0]).total_weight == 1.0
    assert time.perf_counter() - t0 < 2.0                            # not b's 5 s patience
    for e in (a, b):
        e.close()
    (a, b), _ = exchanges()
    a.publish([1.0])                                                 # b has published nothing yet
    late = threading.Thread(target=lambda: (time.sleep(0.3), b.publish([5.0], weight=0.0)))
    late.start()                                                     # ... then joins without a step
    result = a.average(1, (0, 1), [2.0])
    late.join()
    assert (result.total_weight, result.summed.tolist()) == (1.0, [2.0])
    for e in (a, b):
        e.close()


def test_after_a_join_of_every_rank_all_continue_at_the_furthest_ranks_step():
    """Ranks stop after 3, 4, 5, 6 steps (sync_period 4): one round at t = 4 (rank 0 is in it as
    joined) and one when the last rank joins. From then on all continue at t = 6: the same groups,
    tags and global averages; ``step`` still counts this rank's own steps."""
    from horovod_hetero.strategies.base import AVERAGE, GroupAverage, RoundResult, RoundStats

    def result(number, steps, done):
        n = len(steps)
        stats = RoundStats(local_steps=np.array(steps), step_s=np.zeros(n), loss=np.full(n, np.nan),
                           samples=np.zeros(n, dtype=np.int64), done=np.arange(n) < done)
        return RoundResult(number, 1.0, 4.0, done, stats)

    rounds = [result(1, [3, 4, 4, 4], 1), result(2, [0, 0, 1, 2], 4)]
    for rank, steps in enumerate([3, 4, 5, 6]):
        s = WAGMA(group_size=2, sync_period=4, wait_avoiding=False)
        s.start(context(rank, 4)[0])
        first = [s.after_step() for _ in range(min(steps, 4))]
        s.after_round(rounds[0])
        first += [s.after_step() for _ in range(steps - 4)]
        s.after_round(rounds[1])
        assert first[3:4] in ([], [AVERAGE]) and s.t == 6
        later = [s.after_step() for _ in range(5)]
        assert later == [AVERAGE if t == 8 else GroupAverage(s.group_of(t), t) for t in range(7, 12)]
        assert s.group_of(7) == [g for g in butterfly_groups(4, 2, 6) if rank in g][0]
        assert s.step == steps + 5
        restored = WAGMA(group_size=2, sync_period=4)
        restored.load_state_dict(s.state_dict())
        assert (restored.t, restored.schedule.next) == (11, 12)


def wait_until(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def hung_up(sock):
    """True if the other side closed ``sock`` (EOF, or a reset: it left bytes unread)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_forged_replayed_and_malformed_activations_are_dropped_counted_and_the_responder_goes_on():
    """A foreign process sends rank 1's activation socket, each on a connection of its own: garbage,
    an unsealed activation, one with a made-up MAC, one sealed with another key, one from rank 1
    itself or a rank out of range, a replay of rank 0's real activation, an empty line, bytes that
    are not text, a line over the limit and raw bytes without a newline. None is acted on (nothing
    is served for them), each is counted and ends its connection; the responder still serves rank 0."""
    (a, b), allreduce = exchanges()
    target = ("127.0.0.1", int(a._activations.addresses[1].rsplit(":", 1)[1]))
    raws = []
    try:
        a.publish([1.0]), b.publish([5.0])
        assert a.average(1, (0, 1), [2.0]).summed.tolist() == [7.0]             # b served stale: 2 + 5
        assert wait_until(lambda: b.served_stale == 1)
        real = b"0 " + Channel(KEY, sends=b"activation|0>1").seal(encode(1, (0, 1)))   # what rank 0 sent
        forged = [b"junk", encode(2, (0, 1)), b"0 5 " + b"0" * 64 + b" " + encode(2, (0, 1)),
                  b"0 " + Channel(new_key(), sends=b"activation|0>1").seal(encode(2, (0, 1))),
                  b"1 " + Channel(KEY, sends=b"activation|1>1").seal(encode(2, (0, 1))),
                  b"7 " + Channel(KEY, sends=b"activation|7>1").seal(encode(2, (0, 1))), real, b"", b"\xff" * 64,
                  b"0 " * (MAX_MESSAGE_BYTES // 2 + 1)]                                      # over the limit
        for data in [message + b"\n" for message in forged] + [b"\x00" * 10_000]:            # the last: no newline
            raws.append(socket.create_connection(target, timeout=5))
            raws[-1].sendall(data)
        assert wait_until(lambda: b._activations.dropped == len(forged) + 1)
        time.sleep(0.2)
        assert b.served_stale == 1 and b._thread.is_alive() and b._activations.dropped == len(forged) + 1
        assert all(hung_up(raw) for raw in raws)
        result = a.average(2, (0, 1), [3.0])                                     # rank 0's next activation
        assert (result.summed.tolist(), result.total_weight) == ([8.0], 2.0)      # 3 + b's stale 5
        assert wait_until(lambda: b.served_stale == 2)
    finally:
        for raw in raws:
            raw.close()
        for e in (a, b):
            e.close()


class QueuedActivations:
    """Activations from a queue (``None`` entries raise, as a broken message might)."""

    def __init__(self):
        self.queue = queue.Queue()
        self.sent = []

    def receive(self, timeout_s):
        try:
            activation = self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if activation is None:
            raise RuntimeError("a message the responder cannot handle")
        return activation

    def send(self, rank, tag, group):
        self.sent.append((rank, tag, group))

    def close(self):
        pass


def test_responder_threads_are_bounded_and_other_activations_dropped_and_counted():
    """500 activations with future tags whose group averages nobody joins start at most MAX_SERVING
    threads; activations for groups this rank is not in (or that are not its groups) and a failure
    while receiving are dropped and counted, and the responder goes on."""
    release = threading.Event()
    started = []

    def blocked_allreduce(model, weight, control, group, name):
        started.append(name)
        release.wait(10)
        return np.asarray(model, float) * 2, [2 * weight, 2.0, 2 * control[2]]

    acts = QueuedActivations()
    exchange = GroupExchange(0, blocked_allreduce, acts, timeout=5, groups=[(0, 1), (2, 3), (0, 2), (1, 3)])
    exchange.publish([1.0])
    before = threading.active_count()
    for activation in [(5, (2, 3)), (5, (1, 3)), (5, (0, 3)), None]:
        acts.queue.put(activation)
    for tag in range(10, 510):
        acts.queue.put((tag, (0, 1)))
    assert wait_until(lambda: exchange.dropped == 4 + 500 - MAX_SERVING)
    assert len(started) == MAX_SERVING and threading.active_count() - before <= MAX_SERVING
    assert exchange._thread.is_alive()
    release.set()
    assert wait_until(lambda: not any(t.is_alive() for t in exchange._serving), timeout=30)
    acts.queue.put((600, (0, 2)))                                                  # served once threads are free
    assert wait_until(lambda: f"horovod_hetero.group.{600 % NAME_SLOTS}" in started)   # names cycle
    exchange.close()


def test_a_served_group_average_that_never_completes_ends_the_rank_with_a_named_timeout():
    """The responder served tag 7 from the published model and its allreduce hangs (a peer stopped):
    when this rank reaches tag 7 it waits ``timeout`` for that result, then raises a
    ``CollectiveTimeoutError`` naming the group average, not the futures module's bare
    ``TimeoutError`` (seen in 1 fault run of 43: torch-wagma-stop-rank1)."""
    release = threading.Event()

    def hung_allreduce(model, weight, control, group, name):
        release.wait(10)
        raise RuntimeError("released")

    acts = QueuedActivations()
    exchange = GroupExchange(0, hung_allreduce, acts, timeout=0.3, groups=[(0, 1)])
    exchange.publish([1.0])
    acts.queue.put((7, (0, 1)))
    assert wait_until(lambda: exchange.served_stale == 1)
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match=r"group average 7 over ranks \[0, 1\].* in 0.3 s"):
        exchange.average(7, (0, 1), [2.0])
    assert 0.3 <= time.monotonic() - t0 < 2.0
    release.set()
    exchange.close()
