"""A lost rank (issue 16): one error, RankLostError, naming the collective, the round, the step and the
lost rank; raised by every wait of ours once the collectives' background thread has failed."""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from fakes import ArrayCollectives, ArrayModel
from horovod_hetero.common import failures, horovod_collectives as common_collectives, ranks
from horovod_hetero.errors import CollectiveTimeoutError, HeteroError, RankLostError, troubleshooting
from horovod_hetero.runtime import seams as runtime_collectives
from horovod_hetero.runtime.seams import call_with_timeout
from horovod_hetero.runtime.controller import HeteroController
from horovod_hetero.runtime.membership import Membership
from horovod_hetero.strategies import LocalSGD, Synchronous


def test_a_timeout_is_a_lost_rank_and_a_timeout():
    assert issubclass(CollectiveTimeoutError, RankLostError) and issubclass(CollectiveTimeoutError, TimeoutError)
    assert issubclass(RankLostError, HeteroError) and not issubclass(RankLostError, TimeoutError)


class Lost(ArrayCollectives):
    def lost_ranks(self):
        return {3: "died", 1: "stopped"}


def failing_controller(strategy):
    def allreduce(rank, arrays):
        raise OSError("Connection closed by peer [127.0.0.1]:1234\nmore lines")
    return HeteroController(strategy, Lost(allreduce, rank=2, size=4), ArrayModel({"w": np.zeros(2)}))


def test_the_error_names_the_round_the_step_and_the_lost_ranks():
    ctl = failing_controller(LocalSGD(period=2))
    ctl.start()
    ctl.after_step()                                         # step 1: no round
    with pytest.raises(OSError) as failure:
        ctl.after_step()                                     # step 2: round 1 fails
    error = ctl.rank_lost(failure.value)
    assert type(error) is RankLostError
    assert str(error).startswith("model averaging round (round 1, step 3) failed on rank 2: a rank was lost "
                                 "(rank 1 stopped, rank 3 died)")
    assert str(error).endswith("Cause: OSError: Connection closed by peer [127.0.0.1]:1234\n"
                               + troubleshooting("troubleshooting-rank-lost"))


def test_a_timeout_with_no_rank_of_this_host_lost_says_so_and_keeps_its_cause():
    """A user's MetricAverageCallback before the strategy callback (epoch_sync off) times out a round:
    the error must not claim a lost rank; its cause names the collective of its own to look for."""
    from horovod_hetero.runtime.controller import rank_lost_error
    cause = CollectiveTimeoutError("model averaging round did not complete within 60 s: a rank is in a collective "
                                   "of its own (a metric hvd.allreduce, MetricAverageCallback, ...)")
    error = rank_lost_error(cause, "model averaging round", 1, 3, 3, {})
    assert type(error) is CollectiveTimeoutError
    assert str(error).startswith("model averaging round (round 1, step 3) failed on rank 3: no rank of this host "
                                 "was lost: a rank on another host was lost, or a rank waits elsewhere. ")
    assert str(error).endswith("a rank is in a collective of its own (a metric hvd.allreduce, MetricAverageCallback, ...)\n"
                               + troubleshooting("troubleshooting-collective-timeout"))
    lost = rank_lost_error(OSError("closed"), "model averaging round", 1, 3, 3, {})
    assert "a rank was lost (which rank is not known here)" in str(lost)


def test_a_timeout_keeps_its_class_and_synchronous_names_the_gradient_allreduce():
    ctl = failing_controller(Synchronous())
    error = ctl.rank_lost(CollectiveTimeoutError("waited too long"))
    assert type(error) is CollectiveTimeoutError
    assert str(error).startswith("the gradient allreduce of step 1 (round 0, step 1) failed on rank 2")


def test_the_guard_raises_what_lost_answers_and_lets_other_errors_through():
    class Ctl:
        def rank_lost(self, error):
            return RankLostError(f"lost: {error}")

    def lost(controller, error):
        return controller.rank_lost(error) if isinstance(error, OSError) else None

    m = Membership(lambda previous: Ctl(), lambda: (0, 2), failure=OSError, lost=lost)
    with pytest.raises(RankLostError, match="lost: peer gone") as raised:
        with m.guard():
            raise OSError("peer gone")
    assert isinstance(raised.value.__cause__, OSError)
    with pytest.raises(ValueError):
        with m.guard():
            raise ValueError("not a collective")


def test_every_wait_ends_at_once_when_the_background_thread_failed(monkeypatch):
    monkeypatch.setattr(runtime_collectives.background_failure, "reason", "Horovod's thread failed")
    runtime_collectives.background_failure.set()
    try:
        with pytest.raises(RankLostError, match="the test collective cannot complete: Horovod's thread failed"):
            call_with_timeout(lambda: __import__("time").sleep(5), 10.0, "the test collective")
    finally:
        runtime_collectives.background_failure.clear()
    assert call_with_timeout(lambda: 7, 1.0, "x") == 7


def test_a_wait_ends_within_two_probes_once_the_library_stopped(monkeypatch):
    """Horovod completes no collective enqueued as its loop ended: a wait asks ``library_down`` once it has
    lasted PROBE_AFTER_S, then every PROBE_AFTER_S, and ends with a RankLostError naming the reason."""
    asked = []
    monkeypatch.setattr(runtime_collectives, "PROBE_AFTER_S", 0.2)
    monkeypatch.setattr(runtime_collectives, "library_down",
                        [lambda: asked.append(1) or ("Horovod shut down" if len(asked) >= 2 else None)])
    monkeypatch.setitem(runtime_collectives._probe, "ask", None)
    with pytest.raises(RankLostError, match="the test collective cannot complete: Horovod shut down"):
        call_with_timeout(lambda: time.sleep(5), 10.0, "the test collective")
    assert len(asked) == 2
    runtime_collectives.forget_failure()
    assert call_with_timeout(lambda: 7, 1.0, "x") == 7                   # a quick wait never asks
    assert len(asked) == 2


def test_an_ask_that_blocks_never_blocks_the_wait(monkeypatch):
    """Horovod's background thread can hold the lock the ask takes (its process-set table, through a Gloo
    timeout, then for good once it failed): the wait goes on watching, asks nothing more meanwhile, ends
    at once when the background thread's failure is recorded, and reads the ask's answer once it comes."""
    release, asked = threading.Event(), []

    def ask():
        asked.append(1)
        release.wait()
        return "Horovod shut down"

    monkeypatch.setattr(runtime_collectives, "PROBE_AFTER_S", 0.05)
    monkeypatch.setattr(runtime_collectives, "library_down", [ask])
    monkeypatch.setitem(runtime_collectives._probe, "ask", None)
    done = threading.Event()
    try:
        with pytest.raises(CollectiveTimeoutError):       # the ask never answered: the wait ran to its timeout
            call_with_timeout(done.wait, 0.5, "the test collective")
        assert asked == [1]
        runtime_collectives.failure_seen.clear()
        runtime_collectives.background_failure.reason = "Horovod's thread failed"
        runtime_collectives.background_failure.set()
        with pytest.raises(RankLostError, match="cannot complete: Horovod's thread failed"):
            call_with_timeout(done.wait, 10.0, "the test collective")
        runtime_collectives.background_failure.clear()
        release.set()
        runtime_collectives._probe["ask"].join(1.0)
        with pytest.raises(RankLostError, match="cannot complete: Horovod shut down"):
            call_with_timeout(done.wait, 10.0, "the test collective")
        assert asked == [1]
    finally:
        release.set()
        done.set()
        runtime_collectives.background_failure.clear()
        runtime_collectives.forget_failure()


def test_failed_collectives_are_recognised_and_others_are_not():
    from horovod.common.exceptions import HorovodInternalError

    class OpError(Exception):
        pass

    class UnknownError(OpError):             # TensorFlow's, by name: no TensorFlow import
        pass

    assert ranks.collective_failed(HorovodInternalError("Horovod has been shut down"))
    assert ranks.collective_failed(CollectiveTimeoutError("slow"))
    assert ranks.collective_failed(UnknownError("... Horovod has been shut down ..."))
    assert not ranks.collective_failed(UnknownError("a shape mismatch"))
    assert not ranks.collective_failed(ValueError("Horovod"))


def test_a_dead_or_stopped_process_of_this_host_is_named():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert ranks.process_state(child.pid) is None
        child.send_signal(signal.SIGSTOP)
        for _ in range(100):
            if ranks.process_state(child.pid) == "stopped":
                break
            __import__("time").sleep(0.01)
        assert ranks.process_state(child.pid) == "stopped"
        child.kill()
        child.wait()
        assert ranks.process_state(child.pid) == "died"
    finally:
        if child.poll() is None:
            child.kill()



def test_with_process_sets_an_enqueue_is_refused_once_a_rank_of_this_host_died(monkeypatch):
    """With process sets, Horovod's failed thread holds the lock a torch enqueue waits on while that
    enqueue holds the GIL: a rank of this host that died is seen before the enqueue, a stopped one is not."""
    import socket

    from horovod_hetero.torch.adapter import TorchCollectives
    monkeypatch.setattr(common_collectives, "guard_gil", lambda running: None)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        c = object.__new__(TorchCollectives)
        c.rank = 0
        here = socket.gethostname()
        c._peers = [(here, 0), (here, stopped.pid), ("another-host", 1), (here, dead.pid)]
        c.check_enqueue("the test round")                    # not watched: nothing is checked
        c.watch_peers()
        assert sorted(c._watched) == [1]                      # the dead one is gone already, the other host's unseen
        c._watched[3] = __import__("psutil").Process(stopped.pid)
        stopped.send_signal(signal.SIGSTOP)
        c.check_enqueue("the test round")                    # stopped: it may come back
        stopped.kill()
        stopped.wait()
        with pytest.raises(RankLostError, match=r"^the test round cannot complete: rank 1, rank 3 of this host died\n"
                                                 r"Troubleshooting: docs/troubleshooting\.md#troubleshooting-rank-lost$"):
            c.check_enqueue("the test round")
    finally:
        if stopped.poll() is None:
            stopped.kill()


def test_with_process_sets_an_enqueue_is_refused_once_a_collective_of_this_process_failed(monkeypatch):
    """WAGMA's responder thread may enqueue after the main thread's collective failed: with process sets held,
    Horovod's failed thread holds the lock that enqueue waits on (holding the GIL), so it is refused; without
    them (no such lock), and once the failure is forgotten (a new session), it goes on."""
    from horovod_hetero.torch.adapter import TorchCollectives
    c = object.__new__(TorchCollectives)
    c._watched = {}
    monkeypatch.setattr(runtime_collectives, "library_down", [lambda: None])     # Horovod's table answers
    seen, held = runtime_collectives.failure_seen, runtime_collectives.process_sets_held
    for event in (seen, held, runtime_collectives.background_failure):
        event.clear()
    try:
        held.set()
        c.check_enqueue("the group average")                 # no failure seen: healthy
        seen.set()
        with pytest.raises(RankLostError, match=r"^the group average cannot complete: a collective of this process "
                                                 r"failed, and Horovod cannot complete any other"):
            c.check_enqueue("the group average")
        held.clear()
        c.check_enqueue("the group average")                 # no process sets: Horovod's own error comes
        held.set()
        runtime_collectives.forget_failure()
        c.check_enqueue("the group average")
    finally:
        seen.clear()
        held.clear()


def test_with_process_sets_an_enqueue_waits_for_horovods_table_without_the_gil_and_ends_at_its_failure(monkeypatch):
    """Horovod's background thread fails at a dead peer and, removing the process sets, holds the table's lock;
    an enqueue would wait for it holding the GIL, so that the terminate handler reporting the failure never
    runs. The table is asked first on a thread of its own: the caller waits without the GIL, and ends with the
    failure once the handler (here another thread) reports it."""
    from horovod_hetero.torch.adapter import TorchCollectives
    c = object.__new__(TorchCollectives)
    c._watched, c.timeout = {}, 30.0
    held, failed = runtime_collectives.process_sets_held, runtime_collectives.background_failure
    lock = threading.Lock()
    answer = [None]

    def table():                                             # Horovod's table, behind its lock
        with lock:
            return answer[0]

    monkeypatch.setattr(runtime_collectives, "library_down", [table])
    for event in (held, failed, runtime_collectives.failure_seen):
        event.clear()
    try:
        held.set()
        c.check_enqueue("the group average")                 # it answers: healthy
        answer[0] = "Horovod shut down"
        with pytest.raises(RankLostError, match="^the group average cannot complete: Horovod shut down"):
            c.check_enqueue("the group average")
        runtime_collectives.failure_seen.clear()
        lock.acquire()                                       # the failed thread holds the table
        assert runtime_collectives.library_answers("the group average", 30.0, give_up_s=0.1) is False
        failed.reason = "Horovod's background thread failed"
        threading.Timer(0.3, failed.set).start()             # the terminate handler, which needs the GIL
        start = time.monotonic()
        with pytest.raises(RankLostError, match="^the group average cannot complete: Horovod's background"):
            c.check_enqueue("the group average")
        assert 0.25 <= time.monotonic() - start < 5.0
    finally:
        if lock.locked():
            lock.release()
        for event in (held, failed, runtime_collectives.failure_seen):
            event.clear()
        failed.reason = None


def test_the_runtime_terminate_handler_stands_in_for_ours_from_the_first_enqueue_of_ours_to_the_last(monkeypatch):
    """Horovod's background thread that fails while an enqueue of ours waits on the process-set table's lock it
    holds (holding the GIL that our terminate handler needs) ends the process through the C++ runtime's
    handler, as without this library: swapped in after the checks, and once more after the table answered a
    second ask, so that a failure between the checks and the swap still meets our handler."""
    calls = []
    monkeypatch.setattr(failures, "_hook", {"set": calls.append, "ours": "ours", "runtime": "runtime"})
    assert failures._enqueues == [0]
    with failures.enqueueing(lambda: None):
        with failures.enqueueing(lambda: None):              # the responder's, beside the main thread's
            assert failures._enqueues == [2] and calls == ["runtime"]
    assert calls == ["runtime", "ours"]

    def lost():
        raise RankLostError("the group average cannot complete: rank 0 of this host died")

    calls.clear()
    with pytest.raises(RankLostError), failures.enqueueing(lost):
        pytest.fail("no enqueue after a check that raised")
    assert calls == [] and failures._enqueues == [0]
    # the table did not answer the second ask in time: our handler again while the check waits once more
    answers, checks = iter([False, True]), []
    with failures.enqueueing(lambda: checks.append(list(calls)), lambda give_up_s: next(answers)):
        assert calls == ["runtime", "ours", "runtime"] and checks == [[], ["runtime", "ours"]]
    assert calls[-1] == "ours" and failures._enqueues == [0]
    calls.clear()
    with pytest.raises(RankLostError), failures.enqueueing(lambda: None, lambda give_up_s: lost()):
        pytest.fail("no enqueue after an ask that raised")
    assert calls == ["runtime", "ours"] and failures._enqueues == [0]
    with pytest.raises(OSError), failures.enqueueing(lambda: None):
        raise OSError("an enqueue that failed")
    assert failures._enqueues == [0]


def test_a_failed_background_thread_meets_our_handler_but_during_an_enqueue_of_ours_the_runtimes():
    """In a process: std::terminate on a thread other than the main thread (Horovod's failed background
    thread) is our handler's (``background_failure``, exit status 1 once the main thread ends), but during an
    enqueue of ours the C++ runtime's (its message, then SIGABRT)."""
    code = ("import ctypes, sys, threading\nfrom horovod_hetero.common import failures\n"
            "from horovod_hetero.runtime.seams import background_failure\nfailures.catch_background_abort()\n"
            "failed = threading.Thread(target=ctypes.CDLL('libstdc++.so.6')._ZSt9terminatev)\n"
            "if sys.argv[1] == 'enqueue':\n    with failures.enqueueing(lambda: None):\n"
            "        failed.start(); failed.join(30)\n"
            "else:\n    failed.start(); failed.join(1)\n    print('named', background_failure.is_set())\n")
    done = {mode: subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=120)
            for mode in ("enqueue", "healthy")}
    enqueue, healthy = done["enqueue"], done["healthy"]
    assert enqueue.returncode == -signal.SIGABRT and "terminate called" in enqueue.stderr, enqueue
    assert healthy.returncode == 1 and healthy.stdout == "named True\n", healthy


def test_a_main_thread_blocked_after_the_failure_exits_naming_the_exception_with_every_threads_stack():
    """A C++ exception that nothing caught on a thread other than the main thread (Horovod's background
    thread, here ``std::__throw_runtime_error`` called through ctypes) while the main thread does not exit
    within ``HOLD_S`` (0.5 s here; blocked inside Horovod's reset in a real job): exit status 1, the
    exception's type in the reason, then every thread's Python stack."""
    code = ("import ctypes, threading, time\nfrom horovod_hetero.common import failures\n"
            "failures.HOLD_S = 0.5\nfailures.catch_background_abort()\n"
            "throw = ctypes.CDLL('libstdc++.so.6')._ZSt21__throw_runtime_errorPKc\n"
            "throw.argtypes = [ctypes.c_char_p]\n"
            "threading.Thread(target=throw, args=(b'a peer closed its connection',)).start()\n"
            "time.sleep(30)\nprint('survived')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "survived" not in done.stdout, (done.returncode, done.stderr[-2000:])
    first, *stacks = done.stderr.splitlines()
    assert first == ("horovod_hetero.errors.RankLostError: Horovod's background thread failed (it threw "
                     "std::runtime_error) and shut Horovod down; the main thread is blocked in Horovod: exiting. "
                     "Every thread's Python stack:"), first
    assert stacks[0].startswith("Current thread ") and any("in on_terminate" in line for line in stacks), stacks
    assert any(line.endswith("line 8 in <module>") for line in stacks), stacks    # the main thread's sleep


def test_the_gil_watchdog_follows_horovod_and_ends_only_a_process_whose_python_cannot_run_after_a_failure():
    import threading

    def guards():
        return [t for t in threading.enumerate() if t.name == failures.GIL_GUARD_THREAD]

    running = [True]
    failures.guard_gil(lambda: running[0])
    failures.guard_gil(lambda: running[0])                   # once per process
    assert len(guards()) == 1
    running[0] = False                                       # Horovod shut down: the watchdog ends
    guards()[0].join(5)
    assert guards() == []

    def run(body, limit):
        """A process with the watchdog running (limit from the environment) whose main thread then runs
        ``body``; ``ctypes.PyDLL(None).sleep(n)`` holds the GIL in C for n s."""
        code = ("import ctypes, time\nfrom horovod_hetero.common import failures\nfrom horovod_hetero.runtime import "
                "seams as collectives\nfailures.guard_gil(lambda: True)\ntime.sleep(0.2)\n" + body + "\nprint('survived')")
        env = {**os.environ, failures.ENV_GIL_LIMIT: str(limit)}
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)

    # an enqueue of ours that holds the GIL past the limit (1 s): exit 1 with every thread's traceback
    done = run("with failures.enqueueing(lambda: None):\n    ctypes.PyDLL(None).sleep(3)", 1)
    assert done.returncode == 1 and "survived" not in done.stdout, (done.returncode, done.stdout)
    assert "Timeout (0:00:01)!" in done.stderr and "in <module>" in done.stderr
    # once a collective failed here, any code that holds the GIL past the limit
    done = run("collectives.failure_seen.set(); time.sleep(1.5); ctypes.PyDLL(None).sleep(3)", 1)
    assert done.returncode == 1 and "Timeout (0:00:01)!" in done.stderr, (done.returncode, done.stdout)
    # a failure forgotten (hvd.elastic started Horovod again) ends the countdown the watchdog had armed
    done = run("collectives.failure_seen.set(); time.sleep(1.5); collectives.forget_failure(); "
               "ctypes.PyDLL(None).sleep(3)", 1)
    assert done.returncode == 0 and "survived" in done.stdout, (done.returncode, done.stderr[-2000:])
    # a healthy process holding the GIL past the limit (a multi-GB torch.save: 60 s against the default 45 s;
    # here 3 s against 1 s) lives, and an enqueue that returns disarms the watchdog
    done = run("with failures.enqueueing(lambda: None):\n    pass\nctypes.PyDLL(None).sleep(3)", 1)
    assert done.returncode == 0 and "survived" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_the_gil_limit_is_a_setting_and_zero_turns_the_watchdog_off(monkeypatch):
    monkeypatch.setenv(failures.ENV_GIL_LIMIT, "soon")
    with pytest.raises(ValueError, match=r"HOROVOD_HETERO_GIL_LIMIT_S must be seconds >= 0.*got 'soon'"):
        failures.gil_limit_s()
    monkeypatch.setenv(failures.ENV_GIL_LIMIT, "0")
    assert failures.gil_limit_s() == 0.0
    failures.guard_gil(lambda: True)
    assert not failures._guard["running"]
    monkeypatch.delenv(failures.ENV_GIL_LIMIT)
    assert failures.gil_limit_s() == failures.GIL_LIMIT_S == 45.0


def test_a_rank_of_this_host_still_exiting_is_named_once_it_is_a_zombie(monkeypatch):
    """A killed rank closes its sockets (its peers' collective fails) a moment before the kernel makes
    it a zombie: ``lost_ranks`` waits up to LOST_SETTLE_S for it (a fresh clone's fault run named no
    rank once in 43, torch-dssp-kill-rank1); with nothing lost it answers after that wait."""
    import socket
    import time

    from horovod_hetero.torch.adapter import TorchCollectives
    c = object.__new__(TorchCollectives)
    c.rank = 0
    c._peers = [(socket.gethostname(), 0), (socket.gethostname(), 4242), ("another-host", 7)]
    exits_at = time.monotonic() + 0.3
    monkeypatch.setattr(common_collectives, "process_state", lambda pid: "died" if time.monotonic() >= exits_at else None)
    assert c.lost_ranks() == {1: "died"} and time.monotonic() - exits_at < 0.2
    monkeypatch.setattr(common_collectives, "process_state", lambda pid: None)
    t0 = time.monotonic()
    assert c.lost_ranks() == {} and common_collectives.LOST_SETTLE_S <= time.monotonic() - t0 < common_collectives.LOST_SETTLE_S + 0.5
    c._peers = [(socket.gethostname(), 0), ("another-host", 7)]                 # no rank of this host to wait for
    t0 = time.monotonic()
    assert c.lost_ranks() == {} and time.monotonic() - t0 < 0.1


def test_under_hvd_elastic_a_rank_lost_error_of_ours_takes_horovods_reset(monkeypatch):
    """Under ``hvd.elastic.run`` a failure this library saw first (a dead rank) is raised as
    ``ElasticRankLostError``, a ``HorovodInternalError`` too, which elastic's ``run`` resets on, and the
    next call builds a new controller; Horovod's own error and a timeout of ours pass as they are; outside
    elastic a lost rank stays a plain ``RankLostError``."""
    import types

    from horovod.common.exceptions import HorovodInternalError

    class Controller:
        closed, telemetry = False, None

        def rank_lost(self, error):
            return RankLostError(f"named: {error.args[0]}")

        def close(self):
            self.closed = True

    hvd = types.SimpleNamespace(rank=lambda: 0, size=lambda: 2, global_process_set=object())
    ended = []                          # end_gloo_waits: once a failed session, not for a timeout of ours
    monkeypatch.setattr(ranks, "end_gloo_waits", lambda: ended.append(membership.current()))
    membership = ranks.follow_ranks(hvd, None, None, lambda telemetry: Controller())
    first = membership.current()
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    with pytest.raises(ranks.ElasticRankLostError, match="^group average cannot complete: rank 0 of this host died\n"
                                                         "Troubleshooting: docs/troubleshooting.md#troubleshooting-rank-lost$") as e:
        with membership.guard():
            raise RankLostError("group average cannot complete: rank 0 of this host died")
    assert isinstance(e.value, HorovodInternalError) and isinstance(e.value, RankLostError)
    assert membership.current() is not first and first.closed          # rebuilt, as after Horovod's own failure
    with pytest.raises(HorovodInternalError) as e:
        with membership.guard():
            raise HorovodInternalError("Horovod has been shut down")
    assert type(e.value) is HorovodInternalError
    assert len(ended) == 2 and ended[0] is first and ended[1] is not first
    with pytest.raises(CollectiveTimeoutError, match="^the user's allreduce between rounds\nTroubleshooting: "
                                                      "docs/troubleshooting.md#troubleshooting-collective-timeout$") as e:
        with membership.guard():                                     # a timeout stays one: a reset would repeat it
            raise CollectiveTimeoutError("the user's allreduce between rounds")
    assert not isinstance(e.value, HorovodInternalError) and len(ended) == 2
    monkeypatch.delenv("HOROVOD_ELASTIC")
    with pytest.raises(RankLostError, match="^named: a timeout\nTroubleshooting: docs/troubleshooting.md#troubleshooting-rank-lost$") as e:
        with membership.guard():
            raise CollectiveTimeoutError("a timeout")
    assert not isinstance(e.value, HorovodInternalError)


def closing_members(monkeypatch):
    """``follow_ranks`` over a fake Horovod of 2 ranks whose controllers only close, and the list that
    records each call of ``end_gloo_waits`` (patched)."""
    import types

    class Controller:
        closed, telemetry = False, None

        def close(self):
            self.closed = True

    hvd = types.SimpleNamespace(rank=lambda: 0, size=lambda: 2, global_process_set=object())
    ended = []
    monkeypatch.setattr(ranks, "end_gloo_waits", lambda: ended.append(True))
    return ranks.follow_ranks(hvd, None, None, lambda telemetry: Controller()), ended


def test_end_gloo_waits_is_off_with_its_variable_at_0_and_a_bad_value_fails_at_construction(monkeypatch):
    """``HOROVOD_HETERO_END_GLOO_WAITS=0``: a failed session's connections are left to Gloo's timeout (the
    reset still happens); a value but 0 or 1 is a ``ValueError`` naming the variable when an adapter's
    options are checked, before any training."""
    from horovod.common.exceptions import HorovodInternalError

    from horovod_hetero.common.options import check_run_options

    membership, ended = closing_members(monkeypatch)
    first = membership.current()
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    monkeypatch.setenv("HOROVOD_HETERO_END_GLOO_WAITS", "0")
    with pytest.raises(HorovodInternalError), membership.guard():
        raise HorovodInternalError("Horovod has been shut down")
    assert ended == [] and membership.current() is not first and first.closed
    monkeypatch.setenv("HOROVOD_HETERO_END_GLOO_WAITS", "1")
    with pytest.raises(HorovodInternalError), membership.guard():
        raise HorovodInternalError("Horovod has been shut down")
    assert ended == [True]
    monkeypatch.setenv("HOROVOD_HETERO_END_GLOO_WAITS", "yes")
    with pytest.raises(ValueError, match=r"^HOROVOD_HETERO_END_GLOO_WAITS must be 1 .* or 0 .*got 'yes'$"):
        check_run_options(None, None)


def test_after_a_failed_collective_under_hvd_elastic_every_rank_resets_once_more(monkeypatch):
    """A failed collective marks ``requests_left`` (Horovod may keep what the failed session enqueued as its
    loop ended); the next session's first collective carries every rank's mark, and if any rank has one,
    every rank raises ``StaleRequestsReset`` (a ``HorovodInternalError``: ``hvd.elastic.run`` resets once
    more, which clears Horovod's queue). That reset marks nothing; outside elastic nothing is raised."""
    import socket
    from horovod.common.exceptions import HorovodInternalError

    from horovod_hetero.runtime.seams import requests_left
    from horovod_hetero.torch.adapter import TorchCollectives

    membership, ended = closing_members(monkeypatch)
    membership.current()
    requests_left.clear()
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    with pytest.raises(ValueError), membership.guard():
        raise ValueError("not a failed collective")
    assert not requests_left.is_set()
    with pytest.raises(HorovodInternalError), membership.guard():
        raise HorovodInternalError("Horovod has been shut down")
    assert requests_left.is_set() and ended == [True]

    sent = []
    monkeypatch.setattr(common_collectives.compat, "registered_process_sets", lambda hvd: [0])

    def collectives(others_left):
        c = object.__new__(TorchCollectives)
        c.process_set, c._peers = c.hvd.global_process_set, None

        def allgather_object(obj, *, what):
            sent.append(obj)
            return [obj, ("another-host", 7, others_left)]
        c.allgather_object = allgather_object
        return c

    c = collectives(False)
    with pytest.raises(ranks.StaleRequestsReset, match=r"^the last session of rank 0 ended in a failed collective"):
        c.know_peers()
    assert sent[-1] == (socket.gethostname(), os.getpid(), True) and c._peers is None
    assert not requests_left.is_set()
    requests_left.set()
    with pytest.raises(ranks.StaleRequestsReset) as e, membership.guard():
        c.know_peers()
    assert isinstance(e.value, HorovodInternalError) and not requests_left.is_set()    # that reset is no failure
    assert ended == [True]                                    # nor are its session's connections ended
    with pytest.raises(ranks.StaleRequestsReset, match=r"^the last session of rank 1 ended"):
        collectives(True).know_peers()                        # another rank's mark: this one resets too
    c = collectives(False)
    c.know_peers()
    assert c._peers == [(socket.gethostname(), os.getpid()), ("another-host", 7)]
    requests_left.set()
    monkeypatch.delenv("HOROVOD_ELASTIC")
    c = collectives(False)
    c.know_peers()                                            # outside elastic: no reset follows a failure
    assert sent[-1][2] is False and c._peers is not None and not requests_left.is_set()


def test_under_hvd_elastic_a_held_background_thread_ends_the_worker_with_why(monkeypatch):
    """Once Horovod's background thread failed for good (process sets besides the global one: the
    terminate handler holds it), or while the session holds such process sets (``process_sets_held``: it
    will fail so), Horovod cannot start again in the process: under ``hvd.elastic`` the failure is a plain
    ``RankLostError`` saying so (the worker ends at once), not the reset that would wait for the held
    thread; training with process sets under elastic warns once, on rank 0, whether they were registered
    at ``hvd.init`` or added for WAGMA's groups; a session without them clears the mark."""
    import types
    import warnings

    from horovod.common.exceptions import HorovodInternalError

    from horovod_hetero.runtime.seams import background_failure, process_sets_held, requests_left
    from horovod_hetero.torch.adapter import TorchCollectives

    class Controller:
        closed, telemetry = False, None

        def rank_lost(self, error, advice):
            return RankLostError(f"the group average of step 3 failed on rank 1: {error}. {advice}.")

        def close(self):
            self.closed = True

    hvd = types.SimpleNamespace(rank=lambda: 1, size=lambda: 4, global_process_set=object())
    membership = ranks.follow_ranks(hvd, None, None, lambda telemetry: Controller())
    membership.current()
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    ended = []
    monkeypatch.setattr(ranks, "end_gloo_waits", lambda: ended.append(membership.current()))
    process_sets_held.clear()
    for event in (background_failure, process_sets_held):
        event.set()
        try:
            before = len(ended)
            with pytest.raises(RankLostError), membership.guard():        # a timeout of ours: the session may
                raise CollectiveTimeoutError("the group average did not complete")  # be healthy, left as it is
            assert len(ended) == before
            for error in (RankLostError("a rank was lost"), HorovodInternalError("Horovod has been shut down")):
                with pytest.raises(RankLostError) as e, membership.guard():
                    raise error
                assert not isinstance(e.value, HorovodInternalError)
                assert str(e.value).startswith(f"the group average of step 3 failed on rank 1: {error}. Every "
                                               f"rank stops: hvd.elastic cannot start this worker again, under "
                                               f"hvd.elastic a worker that dies ends the job")
        finally:
            event.clear()
    # the failed session's Gloo connections ended, once a session (another survivor's Horovod thread removing
    # the process sets over them fails then, not at Gloo's timeout): each HorovodInternalError a new session
    assert len(ended) == 2 and ended[0] is not ended[1]
    with pytest.raises(HorovodInternalError) as e, membership.guard():      # neither: Horovod resets
        raise HorovodInternalError("Horovod has been shut down")
    assert type(e.value) is HorovodInternalError and len(ended) == 3

    monkeypatch.setattr(common_collectives.compat, "registered_process_sets", lambda hvd: [0, 1])
    monkeypatch.setattr(common_collectives, "_warned", [])
    requests_left.clear()                       # the failures above marked it: no reset follows here
    warned = []
    for rank in (1, 0, 0):
        c = object.__new__(TorchCollectives)
        c.process_set, c._peers, c.rank = c.hvd.global_process_set, None, rank
        c.allgather_object = lambda obj, *, what: [obj]
        c.watch_peers = lambda: None
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            c.know_peers()
        warned.append([str(w.message) for w in seen])
    assert warned == [[], [ranks.ELASTIC_WITH_PROCESS_SETS], []]                  # rank 0 only, once
    assert process_sets_held.is_set()
    monkeypatch.setattr(common_collectives.compat, "registered_process_sets", lambda hvd: {0: [0, 1, 2, 3]})
    c._peers = None
    c.know_peers()                                                    # a new session without them
    assert not process_sets_held.is_set()

    monkeypatch.setattr(common_collectives, "_warned", [])            # WAGMA's groups added under elastic
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
    table = {0: [0, 1, 2, 3]}
    c.hvd = types.SimpleNamespace(global_process_set=c.hvd.global_process_set,
                                  add_process_set=lambda ranks: table.setdefault(len(table), list(ranks)))
    c.rank, c._sets, c.timeout, c._watched = 0, {}, 5.0, None
    monkeypatch.setattr(common_collectives.compat, "registered_process_sets", lambda hvd: dict(table))
    monkeypatch.setattr(common_collectives.compat, "registered_process_set", lambda group, set_id: (group, set_id))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        c.require_groups([[0, 1], [2, 3]], "hvd.init(...)")
    assert table == {0: [0, 1, 2, 3], 1: [0, 1], 2: [2, 3]} and c._sets == {(0, 1): ((0, 1), 1), (2, 3): ((2, 3), 2)}
    assert [str(w.message) for w in seen] == [ranks.ELASTIC_WITH_PROCESS_SETS] and process_sets_held.is_set()
    process_sets_held.clear()


def test_under_hvd_elastic_a_failed_session_ends_the_connections_no_python_object_holds():
    """``end_gloo_waits`` shuts down a connected TCP socket no Python object holds (Horovod's Gloo pairs: here one
    whose ``socket`` was detached), so its peer reads the end at once; a connection Python holds (this library's
    transports, Horovod's driver's) stays usable, and a listening socket held in C still listens."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    held = socket.create_connection(server.getsockname())
    peer_of_held, _ = server.accept()
    detached = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    fd = detached.detach()                      # now only a descriptor, as Gloo's are
    listening = socket.create_server(("127.0.0.1", 0))
    address, listening_fd = listening.getsockname(), listening.detach()
    try:
        peer.settimeout(5.0)
        ended = failures.end_gloo_waits()
        assert fd in ended and listening_fd not in ended
        socket.create_connection(address, timeout=5.0).close()   # a listening socket still listens
        assert peer.recv(1) == b""              # the end, at once
        held.sendall(b"x")
        peer_of_held.settimeout(5.0)
        assert peer_of_held.recv(1) == b"x"     # Python's: untouched
    finally:
        os.close(fd)
        os.close(listening_fd)
        for s in (server, held, peer_of_held, peer):
            s.close()
