"""Process-wide hooks for Horovod's own failure paths, installed once per process and only where
Horovod would otherwise hang or abort without a word: a C++ terminate handler that turns the
abort of a failed background thread into ``RankLostError`` (``catch_background_abort``), a
watchdog for a main thread blocked inside Horovod holding the GIL (``guard_gil``), armed only
during our enqueues or after a failure was seen, so that a healthy process is never ended, and,
under ``hvd.elastic`` once a collective failed, the end of the failed session's Gloo connections
(``end_gloo_waits``), which Horovod keeps open through its reset."""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import gc
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from horovod_hetero.runtime.seams import background_failure, failure_seen
from horovod_hetero.validation import check_float

#: Seconds Horovod's failed background thread is held for the main thread to raise ``RankLostError``
#: and exit; a main thread still running then (blocked inside Horovod) is ended with the same error.
HOLD_S = 20.0
#: Seconds Horovod's shutdown may take at exit under MPI once a collective of ours failed; then the
#: process ends with status 1 (MPI's collectives have no timeout: the background thread waits for the
#: lost rank for ever, and Horovod's shutdown at exit waits for that thread).
MPI_SHUTDOWN_S = 10.0
#: Seconds without the GIL after which a process with process sets ends (``guard_gil``), unless the
#: environment sets ``ENV_GIL_LIMIT`` (0: never).
GIL_LIMIT_S = 45.0
ENV_GIL_LIMIT = "HOROVOD_HETERO_GIL_LIMIT_S"

#: "0": a failed session's Gloo connections are left to Gloo's timeout (``end_gloo_waits`` is not called);
#: "1" or unset: they are ended at the failure.
ENV_END_GLOO = "HOROVOD_HETERO_END_GLOO_WAITS"

#: The name of ``guard_gil``'s thread.
GIL_GUARD_THREAD = "horovod_hetero-gil-guard"
_hook: dict[str, Any] = {}      # the terminate handlers (catch_background_abort), "mpi", "exiting"
_guard: dict[str, float]        # "running" (a bool) and, once it ran, "limit" (seconds)
_guard, _guard_lock = {"running": False}, threading.Lock()
#: threads inside an enqueue of ours now, its checks included (``enqueueing``): while there is one, a failure of
#: Horovod's background thread takes the C++ runtime's terminate handler, not ours (``catch_background_abort``)
_enqueues = [0]

def gil_limit_s() -> float:
    """Seconds without the GIL that ``guard_gil`` allows: ``ENV_GIL_LIMIT`` or ``GIL_LIMIT_S`` (0: never)."""
    text = os.environ.get(ENV_GIL_LIMIT)
    if text is None:
        return GIL_LIMIT_S
    try:
        return check_float(ENV_GIL_LIMIT, float(text), 0.0)
    except ValueError:
        raise ValueError(f"{ENV_GIL_LIMIT} must be seconds >= 0 (0: never end the process), got {text!r}") from None

def ends_gloo_waits() -> bool:
    """Whether a failed session's Gloo connections are ended at the failure (``end_gloo_waits``):
    ``ENV_END_GLOO`` unset or "1"; "0" leaves them to Gloo's timeout; anything else is a ``ValueError``.

    Example:
        >>> ends_gloo_waits()
        True
    """
    text = os.environ.get(ENV_END_GLOO, "1").strip()
    if text not in ("0", "1"):
        raise ValueError(f"{ENV_END_GLOO} must be 1 (end a failed session's Gloo connections at the failure, the "
                         f"default) or 0 (leave them to Gloo's timeout), got {text!r}")
    return text == "1"

def guard_gil(running: Callable[[], object]) -> None:
    """End the process (exit code 1, every thread's traceback on stderr) if no Python code could run
    for ``gil_limit_s()`` seconds *after a failure*: while an enqueue of ours runs (``enqueueing``), or
    once this process has seen a collective fail (``runtime.seams.failure_seen``, cleared when
    ``hvd.elastic`` has started Horovod again). Python's
    ``faulthandler`` watchdog, a C thread that needs no GIL, armed then and re-armed every second by a
    daemon thread of ours, which ends when Horovod shuts down (``running()``: ``hvd.is_initialized``;
    the next adapter that needs it starts it again). A healthy process is never ended: a user's step
    that holds the GIL for minutes (a multi-GB ``pickle`` or ``torch.save``) runs outside our enqueues
    and before any failure.

    Started when process sets are used: there a main thread that enqueues a collective while
    Horovod's failed background thread holds the process-set lock waits for it forever holding the
    GIL, and the terminate handler (``catch_background_abort``), which needs the GIL, never runs.
    (``check_enqueue`` keeps this rank's own enqueues out of that lock when it sees a rank of this
    host die; the watchdog covers the rest: a rank lost on another host, a user's own collective after
    a failure. Not covered: a user's own collective that blocks before any failure was seen here.)"""
    limit = gil_limit_s()
    with _guard_lock:
        if _guard["running"] or sys.__stderr__ is None or not limit:
            return
        _guard["running"], _guard["limit"] = True, limit

    def rearm() -> None:
        armed = False
        try:
            while running():
                if failure_seen.is_set() or background_failure.is_set():
                    # (not None: guard_gil checked it; faulthandler would take None as sys.stderr anyway)
                    faulthandler.dump_traceback_later(limit, exit=True, file=sys.__stderr__)  # type: ignore[arg-type]
                    armed = True
                elif armed:                 # the failure was forgotten (forget_failure) as this loop armed it
                    faulthandler.cancel_dump_traceback_later()
                    armed = False
                time.sleep(1.0)
        finally:
            with _guard_lock:
                faulthandler.cancel_dump_traceback_later()
                _guard["running"] = False

    threading.Thread(target=rearm, name=GIL_GUARD_THREAD, daemon=True).start()

#: Seconds ``enqueueing`` gives Horovod's process-set table to answer once more before the enqueue (an ask
#: answers in some 0.2 ms; with dynamic process sets Horovod holds the table for about a millisecond a cycle).
#: A failure while it waits ends the process through the C++ runtime's handler: the shorter, the rarer.
RECHECK_S = 0.005

def _runtime_terminate(step: int) -> None:
    """One more (``step`` 1) or one less (-1) enqueue of ours in progress: the C++ runtime's terminate
    handler stands in for ours from the first to the last (``enqueueing``)."""
    with _guard_lock:
        _enqueues[0] += step
        if "runtime" in _hook and _enqueues[0] == (1 if step > 0 else 0):
            _hook["set"](_hook["runtime"] if step > 0 else _hook["ours"])

@contextlib.contextmanager
def enqueueing(check: Callable[[], None], answers: Callable[[float], bool] | None = None) -> Iterator[None]:
    """Around an enqueue of ours into Horovod (the body, about 0.1 ms), after ``check()``, which raises rather
    than enqueue into a failed Horovod (the adapter's ``check_enqueue``: with process sets held it waits,
    without the GIL, until Horovod's process-set table answers).

    While the enqueue runs, a failure of Horovod's background thread ends the process as Horovod ends it
    without this library, through the C++ runtime's terminate handler (which prints the exception and
    aborts), not ours (``catch_background_abort``), which needs the GIL: that thread fails holding the
    table's lock, which the enqueue takes holding the GIL, so the two would wait for each other until
    ``guard_gil``'s watchdog, and every other survivor for Gloo's timeout. So that a failure between the
    check and that change still meets our handler, ``answers(RECHECK_S)`` asks the table once more after
    it (True: it answered; the failed thread holds the lock for good, so it cannot): otherwise the change
    is undone and ``check()`` waits, with our handler, for the answer or the failure. While ``guard_gil``
    runs, its watchdog is armed during the enqueue.

    Args:
        check: raises where the enqueue must not run; returns once it may.
        answers: with process sets held, ``seams.library_answers`` given seconds to answer (None: no ask).

    Example:
        >>> with enqueueing(lambda: None):
        ...     handle = 7                      # an enqueue: hvd.allreduce_async(...)
    """
    while True:
        check()
        _runtime_terminate(1)
        try:
            if answers is None or answers(RECHECK_S):
                break
        except BaseException:
            _runtime_terminate(-1)
            raise
        _runtime_terminate(-1)
    try:
        if not _guard["running"]:
            yield
            return
        # (not None while the guard runs: guard_gil checked it; faulthandler would take None as sys.stderr anyway)
        faulthandler.dump_traceback_later(_guard["limit"], exit=True, file=sys.__stderr__)  # type: ignore[arg-type]
        try:
            yield
        finally:
            if not (failure_seen.is_set() or background_failure.is_set()):
                faulthandler.cancel_dump_traceback_later()
    finally:
        _runtime_terminate(-1)

def catch_background_abort(mpi: bool = False) -> None:
    """Turn the ``SIGABRT`` that ends every survivor of a lost rank when the job registered process
    sets (WAGMA's) into a ``RankLostError`` in the main thread. Installed once, by the first adapter.

    Why: after a collective fails, Horovod's background thread leaves its loop and, with process sets
    besides the global one, negotiates their removal with the other ranks (``ProcessSetTable::Finalize``,
    a Gloo allgather outside the loop's ``try``, holding the process-set table's lock); a dead peer
    makes it throw ``gloo::IoException``, nothing catches it, and ``std::terminate`` aborts the process
    before any Python code learns of the failure. This installs a C++ terminate handler that, on a
    thread other than the main thread, records the failure (``runtime.seams.background_failure``:
    every wait of ours, and every collective before it enqueues, then raises ``RankLostError``) and
    holds that thread. The process then exits with code 1: from the main thread's error (an ``atexit``
    hook ends it with ``os._exit(1)`` before Horovod's shutdown, which would wait for the held
    thread), or, if the main thread is still running after ``HOLD_S`` s (blocked inside Horovod on the
    lock the failed thread holds), from the handler, which prints the error itself, the type of the C++
    exception (``cxx_exception_type``) and every thread's Python stack. While an enqueue of ours runs
    (``enqueueing``), which would wait for that lock holding the GIL that this handler needs, the C++
    runtime's handler stands in for it. On the main thread, or on a second failure, it aborts as before.

    ``mpi``: Horovod's controller is MPI (``hvd.mpi_enabled()``). There a rank that stops answering
    (stopped, or cut off) leaves the background thread in an MPI collective for ever: our own wait
    raises its named error, but Horovod's shutdown at exit would then wait for that thread. So when
    the process exits after a collective of ours failed (``failure_seen``), it ends with status 1 if
    Horovod has not shut down within ``MPI_SHUTDOWN_S`` s. (A rank that dies is another matter: Open
    MPI's launcher then ends every rank of the job at once.)
    """
    if _hook:
        _hook["mpi"] = bool(_hook.get("mpi")) or mpi
        return
    _hook["mpi"] = mpi
    atexit.register(_at_exit)                       # registered after Horovod's: runs before its shutdown
    try:
        set_terminate = ctypes.CDLL("libstdc++.so.6")._ZSt13set_terminatePFvvE
    except (OSError, AttributeError):              # not GNU libstdc++: Horovod's behaviour stays
        return
    handler_type = ctypes.CFUNCTYPE(None)

    def on_terminate() -> None:
        if threading.current_thread() is threading.main_thread() or background_failure.is_set():
            os.abort()
        thrown = cxx_exception_type()
        background_failure.reason = (f"Horovod's background thread failed ("
                                     f"{f'it threw {thrown}' if thrown else 'std::terminate, no exception'}"
                                     f") and shut Horovod down")
        background_failure.set()
        deadline = time.monotonic() + HOLD_S
        while time.monotonic() < deadline and not _hook.get("exiting"):
            time.sleep(0.05)
        if not _hook.get("exiting"):
            print(f"horovod_hetero.errors.RankLostError: {background_failure.reason}; the main thread is "
                  f"blocked in Horovod: exiting. Every thread's Python stack:", file=sys.stderr, flush=True)
            if sys.__stderr__ is not None:
                faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
        _exit_now()

    handler = handler_type(on_terminate)
    set_terminate.restype = ctypes.c_void_p
    set_terminate.argtypes = [ctypes.c_void_p]
    ours = ctypes.cast(handler, ctypes.c_void_p)
    runtime = set_terminate(ours)                   # (installed by the first adapter, before any enqueue of ours)
    if runtime:                                     # the C++ runtime's: what enqueueing() puts back meanwhile
        _hook.update(set=set_terminate, ours=ours, runtime=ctypes.c_void_p(runtime))
    _hook["handler"] = handler                      # kept alive: C++ holds only the pointer

def cxx_exception_type() -> str | None:
    """The type of the C++ exception this thread is handling, demangled (``gloo::IoException``), as a C++
    terminate handler sees the exception that nothing caught; ``None`` when there is none, or off GNU
    libstdc++ (``__cxa_current_exception_type`` returns a ``std::type_info``, whose name follows its vtable).

    Example:
        >>> cxx_exception_type() is None           # Python code handling no C++ exception
        True
    """
    try:
        cxx = ctypes.CDLL("libstdc++.so.6")
        current, demangle = cxx.__cxa_current_exception_type, cxx.__cxa_demangle
    except (OSError, AttributeError):
        return None
    current.restype, current.argtypes = ctypes.c_void_p, []
    info = current()
    if not info:
        return None
    mangled = ctypes.c_char_p.from_address(info + ctypes.sizeof(ctypes.c_void_p)).value or b""
    mangled = mangled.lstrip(b"*")                  # a type local to one object file
    demangle.restype = ctypes.c_void_p
    demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    status = ctypes.c_int(-1)
    named = demangle(mangled, None, None, ctypes.byref(status))
    if not named or status.value != 0:
        return mangled.decode("ascii", "replace")
    try:
        return ctypes.string_at(named).decode("ascii", "replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(named))


def _exit_now() -> NoReturn:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(1)

def _at_exit() -> None:
    """Before Horovod's shutdown: end at once if its background thread failed (held by the terminate
    handler); under MPI after a failed collective, end if the shutdown has not returned in ``MPI_SHUTDOWN_S``."""
    _hook["exiting"] = True
    if background_failure.is_set():
        _exit_now()
    if _hook.get("mpi") and failure_seen.is_set():
        threading.Thread(target=_bound_shutdown, name="horovod_hetero-mpi-shutdown", daemon=True).start()

def _bound_shutdown() -> None:
    time.sleep(MPI_SHUTDOWN_S)                      # Horovod's shutdown runs meanwhile (a C call: no GIL held)
    print(f"horovod_hetero: Horovod did not shut down within {MPI_SHUTDOWN_S:g} s of the exit after a failed "
          f"collective (its background thread waits in an MPI collective for the lost rank): exiting with "
          f"status 1", file=sys.stderr, flush=True)
    _exit_now()


def _tcp_connections() -> set[int]:
    """The inodes of the TCP connections in this network namespace (``/proc/self/net/tcp`` and ``tcp6``) that
    are established or ended by their peer (a listening socket is left out); empty off Linux."""
    inodes: set[int] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] in ("01", "08"):    # ESTABLISHED, CLOSE_WAIT
                        inodes.add(int(fields[9]))
        except (OSError, ValueError):
            pass
    return inodes


def end_gloo_waits() -> list[int]:
    """Shut down (``SHUT_RDWR``, the descriptors left open) this process's TCP connections that no Python
    object holds: Horovod's Gloo connections of a session that failed. Their file descriptors, by number.

    Why: when a rank dies, every survivor's collective fails within a second, and ``hvd.elastic`` resets
    Horovod (``shutdown()``, ``init()``). But a survivor whose Horovod loop left the failed collective keeps
    that session's Gloo connections open (Horovod 0.28 does not close them), and a survivor still inside the
    collective, waiting to receive from it, waits for Gloo's timeout (``HOROVOD_GLOO_TIMEOUT_SECONDS``, 30 s):
    only then does its loop end and its reset begin, and every other survivor's ``init()`` waits for it.
    Shut down here, the connection ends at the other end too, and that wait fails at once. Called on a
    collective's failure under ``hvd.elastic`` (``common.ranks.follow_ranks``), once per session. Left alone:
    listening sockets, and connections a Python socket object holds (this library's, Horovod's driver's,
    most of yours). A connection held only in C besides Horovod's (``torch.distributed``'s, gRPC's, ZeroMQ's)
    would be ended too: do not mix those with ``hvd.elastic`` and this library's optimizer, or set
    ``HOROVOD_HETERO_END_GLOO_WAITS=0`` (``ends_gloo_waits``), which leaves the wait to Gloo's timeout. NCCL's,
    on GPUs, belong to the failed session, which Horovod's reset ends anyway.

    Example:
        >>> end_gloo_waits() == [] or True         # a process without such connections: nothing to end
        True
    """
    tcp = _tcp_connections()
    candidates: dict[int, int] = {}                # fd -> inode, read before the Python objects (a socket
    try:                                           # Python opens meanwhile is then among those objects)
        names = os.listdir("/proc/self/fd")
    except OSError:                                # not Linux: Horovod's behaviour stays
        return []
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
            if target.startswith("socket:[") and int(target[8:-1]) in tcp:
                candidates[int(name)] = int(target[8:-1])
        except (OSError, ValueError):
            continue
    owned = {s.fileno() for s in gc.get_objects() if issubclass(type(s), socket.socket)}   # type(): no proxy runs
    ended: list[int] = []
    for fd, inode in candidates.items():
        if fd in owned:
            continue
        try:
            if os.fstat(fd).st_ino != inode:       # closed and its number reused since
                continue
            connection = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            connection.shutdown(socket.SHUT_RDWR)
            ended.append(fd)
        except OSError:                            # ended already
            pass
        finally:
            connection.detach()                    # the descriptor stays Horovod's
    return ended
