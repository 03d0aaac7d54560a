"""What the torch and TensorFlow adapters share of Horovod: process sets, object collectives, addresses.

Horovod's ``ProcessSet`` and its object collectives have the same Python API in ``horovod.torch``
and ``horovod.tensorflow``, so one base class serves both; a framework's ``Collectives`` sets
``hvd`` and adds the tensor operations (``allreduce_sum``, ``copy``).
"""
import atexit
import contextlib
import ctypes
import faulthandler
import functools
import ipaddress
import logging
import os
import socket
import sys
import threading
import time

from horovod.common.exceptions import HorovodInternalError
from horovod.common.process_sets import ProcessSet

from horovod_hetero.errors import ElasticResetError, RankLostError
from horovod_hetero.rules.grouping import process_set_ranks
from horovod_hetero.runtime.collectives import (
    DEFAULT_TIMEOUT_S, Collectives, background_failure, call_with_timeout, check_background, failure_seen)
from horovod_hetero.runtime.membership import Membership
from horovod_hetero.runtime.straggler import Slowdown, check_base_step, check_random_delay, check_slowdown
from horovod_hetero.runtime.telemetry import Telemetry, telemetry_directory
from horovod_hetero.validation import check_float, check_host, check_int

#: The address servers bind and advertise when ranks span machines (default: see ``server_host``).
ENV_SERVER_HOST = "HOROVOD_HETERO_STATE_SERVER_HOST"
#: What horovodrun exports for Gloo: the network interface every host has and routes (its first
#: common one), and the launcher's rendezvous address.
ENV_GLOO_IFACE, ENV_RENDEZVOUS = "HOROVOD_GLOO_IFACE", "HOROVOD_GLOO_RENDEZVOUS_ADDR"
#: Environment variables launchers set to the world size, checked in this order.
SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def world_size(size=None):
    """``size`` if given, else the world size the launcher (``horovodrun``) exported."""
    if size is not None:
        return check_int("size", size, 1)
    for name in SIZE_VARIABLES:
        if os.environ.get(name):
            return check_int(name, int(os.environ[name]), 1)
    raise ValueError("wagma_process_sets() needs the world size before hvd.init(): launch with horovodrun "
                     "(it sets HOROVOD_SIZE), or pass it, e.g. wagma_process_sets(group_size=2, size=4)")


def check_process_set(process_set, name="process_set"):
    """``process_set`` if it is a Horovod ``ProcessSet`` or ``None`` (all ranks), else a ``TypeError``
    naming ``name``. Only the type: membership can be checked only after ``hvd.init()``.

    Example:
        >>> check_process_set(None) is None
        True
    """
    if process_set is not None and not isinstance(process_set, ProcessSet):
        raise TypeError(f"{name} must be a horovod ProcessSet (e.g. hvd.global_process_set) or None (all ranks), "
                        f"got {process_set!r} ({type(process_set).__name__})")
    return process_set


def wagma_process_sets(group_size=None, size=None):
    """The process sets WAGMA averages over, for ``hvd.init(process_sets=...)``.

    Every group of every distinct butterfly partition, in the same order on every rank.

    Args:
        group_size: S, a power of two <= P; ``None``: the power of two nearest sqrt(P).
        size: the world size P; ``None`` reads the one ``horovodrun`` exports.

    Example::

        hvd.init(process_sets=hh.wagma_process_sets(group_size=None))
    """
    return [ProcessSet(ranks) for ranks in process_set_ranks(world_size(size), group_size)]


def registered_ids(table, rank_lists, init_call):
    """Map each rank list to its Horovod process-set id, or raise naming the ``hvd.init`` call.

    Args:
        table: Horovod's ``{process_set_id: ranks}`` of registered process sets.
        rank_lists: the sets a strategy needs (e.g. ``rules.grouping.process_set_ranks``).
        init_call: the call that registers them.
    """
    ids = {tuple(ranks): i for i, ranks in table.items()}
    missing = [list(ranks) for ranks in rank_lists if tuple(ranks) not in ids]
    if missing:
        raise ValueError(f"the process sets of the strategy's groups are not registered (missing {missing}); "
                         f"initialise Horovod with {init_call}, or with hvd.init(process_sets=\"dynamic\") "
                         f"(needed with hvd.elastic: its reset keeps only the global process set)")
    return {tuple(ranks): ids[tuple(ranks)] for ranks in rank_lists}


def server_host(all_local):
    """The address servers bind (that interface only) and advertise to the other ranks.

    Loopback when every rank runs on this machine. Otherwise, the first of:
    ``$HOROVOD_HETERO_STATE_SERVER_HOST``; the IPv4 address of ``$HOROVOD_GLOO_IFACE``, the
    interface horovodrun found on every host and hands Gloo (so the job's own traffic takes it
    too); the address this host reaches the launcher's rendezvous server from
    (``$HOROVOD_GLOO_RENDEZVOUS_ADDR``); this host's name if it resolves to an address that is
    not loopback; the only interface with an IPv4 address that is not loopback. None of them: a
    ``ValueError`` that names the variable to set (many hosts resolve their own name to
    127.0.1.1, which no other host reaches)."""
    if all_local:
        return "127.0.0.1"
    setting = server_host_setting()
    if setting:
        return setting
    candidates = (lambda: interface_address(os.environ.get(ENV_GLOO_IFACE)),
                  lambda: route_address(os.environ.get(ENV_RENDEZVOUS)), _host_name_address, _only_interface_address)
    for candidate in candidates:
        address = candidate()                       # an IPv4 address or None
        if address and not ipaddress.ip_address(address).is_loopback:
            return address
    raise ValueError(f"ranks run on several hosts, but no address other hosts reach this one at was found "
                     f"({ENV_GLOO_IFACE} unset or without an IPv4 address, this host's name resolves to "
                     f"loopback, several interfaces): set {ENV_SERVER_HOST} to this host's address on the "
                     f"network the ranks share, e.g. {ENV_SERVER_HOST}=10.0.0.5")


def _interfaces():
    """``psutil.net_if_addrs()`` (psutil comes with Horovod, which requires it and finds its interfaces with it)."""
    import psutil
    return psutil.net_if_addrs()


def interface_address(name):
    """The IPv4 address of network interface ``name``, or None (no such interface, no IPv4 address)."""
    for address in _interfaces().get(name or "", ()):
        if address.family == socket.AF_INET:
            return address.address
    return None


def route_address(host):
    """The local address packets to ``host`` leave from (a UDP connect: nothing is sent), or None."""
    if not host:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))
            return probe.getsockname()[0]
        except OSError:
            return None


def _host_name_address():
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def _only_interface_address():
    addresses = [a.address for addrs in _interfaces().values() for a in addrs
                 if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback]
    return addresses[0] if len(addresses) == 1 else None


def follow_ranks(hvd, process_set, telemetry, build):
    """The ``Membership`` an adapter reaches its controller through: rebuilt when Horovod's ranks
    change (``hvd.elastic``'s reset) or a collective raised ``HorovodInternalError``.

    Args:
        hvd: ``horovod.torch`` or ``horovod.tensorflow``.
        process_set: the adapter's ``process_set`` (a non-global one does not survive a reset:
            ``ElasticResetError``).
        telemetry: the adapter's ``telemetry`` argument; after a reset the previous controller's
            ``Telemetry`` goes on if this rank kept its number (else a new one: another rank's file).
        build: ``build(telemetry) -> controller`` for the current ranks.
    """
    def rebuild(previous):
        if previous is None:
            return build(telemetry)
        if process_set not in (None, hvd.global_process_set):
            raise ElasticResetError(
                f"Horovod was initialised again (an elastic reset) and process_set={process_set!r} did not "
                f"survive it: with hvd.elastic, train over the global process set (the default)")
        kept = getattr(previous.telemetry, "rank", None) == hvd.rank()
        return build(previous.telemetry if kept else telemetry)

    def lost(controller, error):
        if os.environ.get("HOROVOD_ELASTIC") == "1" or not collective_failed(error):
            return None                     # hvd.elastic resets on HorovodInternalError; other errors pass
        return controller.rank_lost(error)

    return Membership(rebuild, lambda: (hvd.rank(), hvd.size()), HorovodInternalError, lost)


def collective_failed(error):
    """True if ``error`` is Horovod's report of a failed collective: ``HorovodInternalError``
    (torch, object collectives), TensorFlow's ``OpError`` from a Horovod op, or a timeout of ours.
    (In a compiled function the op that was running when Horovod failed reports Gloo's error under
    its node's name, ``horovod_hetero.*``; ops after it, "Horovod has been shut down".)"""
    if isinstance(error, (HorovodInternalError, RankLostError)):
        return True
    op_error = any(c.__name__ == "OpError" for c in type(error).__mro__)    # no TensorFlow import here
    return op_error and ("Horovod" in str(error) or "{{node horovod_hetero." in str(error))


#: Seconds Horovod's failed background thread is held for the main thread to raise ``RankLostError``
#: and exit; a main thread still running then (blocked inside Horovod) is ended with the same error.
HOLD_S = 20.0
#: Seconds without the GIL after which a process with process sets ends (``guard_gil``), unless the
#: environment sets ``ENV_GIL_LIMIT`` (0: never).
GIL_LIMIT_S = 45.0
ENV_GIL_LIMIT = "HOROVOD_HETERO_GIL_LIMIT_S"
#: Seconds ``lost_ranks`` waits, after a failed collective, for a rank of this host to show as dead.
LOST_SETTLE_S = 1.0
#: The name of ``guard_gil``'s thread.
GIL_GUARD_THREAD = "horovod_hetero-gil-guard"
_hook = {}
_guard, _guard_lock = {"running": False}, threading.Lock()


def gil_limit_s():
    """Seconds without the GIL that ``guard_gil`` allows: ``ENV_GIL_LIMIT`` or ``GIL_LIMIT_S`` (0: never)."""
    text = os.environ.get(ENV_GIL_LIMIT)
    if text is None:
        return GIL_LIMIT_S
    try:
        return check_float(ENV_GIL_LIMIT, float(text), 0.0)
    except ValueError:
        raise ValueError(f"{ENV_GIL_LIMIT} must be seconds >= 0 (0: never end the process), got {text!r}") from None


def guard_gil(running):
    """End the process (exit code 1, every thread's traceback on stderr) if no Python code could run
    for ``gil_limit_s()`` seconds *after a failure*: while an enqueue of ours runs (``gil_guarded``), or
    once this process has seen a collective fail (``runtime.collectives.failure_seen``, cleared when
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

    def rearm():
        try:
            while running():
                if failure_seen.is_set() or background_failure.is_set():
                    faulthandler.dump_traceback_later(limit, exit=True, file=sys.__stderr__)
                time.sleep(1.0)
        finally:
            with _guard_lock:
                faulthandler.cancel_dump_traceback_later()
                _guard["running"] = False

    threading.Thread(target=rearm, name=GIL_GUARD_THREAD, daemon=True).start()


@contextlib.contextmanager
def gil_guarded():
    """Around an enqueue into Horovod while ``guard_gil`` runs: the watchdog is armed until it returns
    (about 0.1 ms; an enqueue that waits for a failed background thread holds the GIL forever)."""
    if not _guard["running"]:
        yield
        return
    faulthandler.dump_traceback_later(_guard["limit"], exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        if not (failure_seen.is_set() or background_failure.is_set()):
            faulthandler.cancel_dump_traceback_later()


def catch_background_abort():
    """Turn the ``SIGABRT`` that ends every survivor of a lost rank when the job registered process
    sets (WAGMA's) into a ``RankLostError`` in the main thread. Installed once, by the first adapter.

    Why: after a collective fails, Horovod's background thread leaves its loop and, with process sets
    besides the global one, negotiates their removal with the other ranks (``ProcessSetTable::Finalize``,
    a Gloo allgather outside the loop's ``try``, holding the process-set table's lock); a dead peer
    makes it throw ``gloo::IoException``, nothing catches it, and ``std::terminate`` aborts the process
    before any Python code learns of the failure. This installs a C++ terminate handler that, on a
    thread other than the main thread, records the failure (``runtime.collectives.background_failure``:
    every wait of ours, and every collective before it enqueues, then raises ``RankLostError``) and
    holds that thread. The process then exits with code 1: from the main thread's error (an ``atexit``
    hook ends it with ``os._exit(1)`` before Horovod's shutdown, which would wait for the held
    thread), or, if the main thread is still running after ``HOLD_S`` s (blocked inside Horovod on the
    lock the failed thread holds), from the handler, which prints the error itself. On the main thread,
    or on a second failure, it aborts as before.
    """
    if _hook:
        return
    try:
        set_terminate = ctypes.CDLL("libstdc++.so.6")._ZSt13set_terminatePFvvE
    except (OSError, AttributeError):              # not GNU libstdc++: Horovod's behaviour stays
        return
    handler_type = ctypes.CFUNCTYPE(None)

    def on_terminate():
        if threading.current_thread() is threading.main_thread() or background_failure.is_set():
            os.abort()
        background_failure.reason = ("Horovod's background thread failed (a rank's connection broke: Horovod "
                                     "logged the Gloo error above) and shut Horovod down")
        background_failure.set()
        deadline = time.monotonic() + (0.0 if _hook.get("exiting") else HOLD_S)
        while time.monotonic() < deadline and not _hook.get("exiting"):
            time.sleep(0.05)
        if not _hook.get("exiting"):
            print(f"horovod_hetero.errors.RankLostError: {background_failure.reason}; the main thread is "
                  f"blocked in Horovod: exiting", file=sys.stderr, flush=True)
        exit_now()

    def exit_now():
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(1)

    def at_exit():
        _hook["exiting"] = True
        if background_failure.is_set():
            exit_now()

    handler = handler_type(on_terminate)
    set_terminate.restype = ctypes.c_void_p
    set_terminate.argtypes = [handler_type]
    set_terminate(handler)
    _hook["handler"] = handler                      # kept alive: C++ holds only the pointer
    atexit.register(at_exit)                        # registered after Horovod's: runs before its shutdown


def process_state(process):
    """``"died"`` or ``"stopped"`` for a process of this host (a pid or a ``psutil.Process``) that
    cannot take part any more, else None."""
    import psutil
    try:
        status = (process if isinstance(process, psutil.Process) else psutil.Process(process)).status()
    except psutil.NoSuchProcess:
        return "died"
    return {psutil.STATUS_ZOMBIE: "died", psutil.STATUS_DEAD: "died", psutil.STATUS_STOPPED: "stopped"}.get(status)


def check_run_options(telemetry, slowdown):
    """Check an adapter's ``telemetry`` and ``slowdown`` and the variables that fill in for them
    (``HOROVOD_HETERO_*``) when the adapter is built, before ``hvd.init()`` is needed; the
    ``Telemetry`` and ``Slowdown`` themselves are built later (they need the rank), with the same errors."""
    if not isinstance(telemetry, Telemetry):
        telemetry_directory(telemetry)
    if not isinstance(slowdown, Slowdown):
        check_slowdown(slowdown)
        check_base_step(None)
        check_random_delay(None)
    server_host_setting()


def server_host_setting():
    """``$HOROVOD_HETERO_STATE_SERVER_HOST`` (a host name or IP address), or ``None`` if unset; a
    ``ValueError`` names the variable when it is neither."""
    text = os.environ.get(ENV_SERVER_HOST)
    return check_host(ENV_SERVER_HOST, text) if text else None


class HorovodCollectives(Collectives):
    """The framework-independent half of an adapter's ``Collectives``, over a Horovod process set.

    Args:
        process_set: the Horovod process set that synchronises (``None``: all ranks).
        timeout: seconds any collective may take before ``CollectiveTimeoutError``.
        owner: what the user built (names it in the errors raised here).
        members_only: refuse a rank outside ``process_set`` (else ``included`` is False and the
            adapter steps locally, as Horovod's optimizer does on non-members; ``rank``/``size`` None).
    """

    hvd = None          # horovod.torch or horovod.tensorflow, set by the subclass
    _peers = None       # every rank's (host, pid), from know_peers()
    _watched = None     # {rank: psutil.Process} of this host's other ranks, when process sets are registered

    def __init__(self, process_set=None, timeout=DEFAULT_TIMEOUT_S, owner="horovod_hetero", members_only=True):
        hvd = self.hvd
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
        check_process_set(process_set)
        if not hvd.is_initialized():
            raise RuntimeError(f"{owner}: Horovod is not initialized; call hvd.init() first")
        catch_background_abort()
        self.process_set = ps = process_set or hvd.global_process_set
        self.included = ps.included()
        self.rank = self.size = None
        if not self.included:
            if members_only:
                raise ValueError(f"this rank is not in process_set; build the {owner} only on its members")
            return
        self.rank, self.size = ps.rank(), ps.size()
        self.root = 0 if ps == hvd.global_process_set else ps.ranks[0]
        self._sets = {}
        self._peers = None

    @functools.cached_property
    def host(self):
        """``server_host``, found when a transport first needs it (a ``ValueError`` names what to set)."""
        return server_host(self.hvd.local_size() == self.hvd.size())

    def broadcast_object(self, obj, *, what):
        check_background(what)
        return call_with_timeout(lambda: self.hvd.broadcast_object(
            obj, root_rank=self.root, process_set=self.process_set, name="horovod_hetero.broadcast"), self.timeout, what)

    def allgather_object(self, obj, *, what):
        """Over all ranks (``horovod.torch`` gathers objects only over the global set)."""
        check_background(what)
        return call_with_timeout(lambda: self.hvd.allgather_object(obj, name="horovod_hetero.allgather"),
                                 self.timeout, what)

    def know_peers(self):
        """Every rank's (host name, process id), gathered once (object gathers span all ranks: only
        over the global set)."""
        if self.process_set == self.hvd.global_process_set and self._peers is None:
            self._peers = self.allgather_object((socket.gethostname(), os.getpid()),
                                                what="the exchange of the ranks' process ids")
            if len(self.hvd.mpi_ops._basics._get_process_set_ids_and_ranks()) > 1:
                self.watch_peers()

    def _local_peers(self):
        here = socket.gethostname()
        return {rank: pid for rank, (host, pid) in enumerate(self._peers or ()) if host == here and rank != self.rank}

    def lost_ranks(self):
        """As ``Collectives.lost_ranks``; waits up to ``LOST_SETTLE_S`` for a rank of this host that is
        still exiting (asked after a collective failed: a killed process closes its sockets, which
        fails its peers' collective, a moment before the kernel makes it a zombie)."""
        peers = self._local_peers()
        deadline = time.monotonic() + (LOST_SETTLE_S if peers else 0.0)
        while True:
            states = {rank: process_state(pid) for rank, pid in peers.items()}
            lost = {rank: state for rank, state in states.items() if state}
            if lost or time.monotonic() >= deadline:
                return lost
            time.sleep(0.02)

    def watch_peers(self):
        """Check this host's other ranks before every enqueue (``check_enqueue``) and end a process
        whose Python code stops running (``guard_gil``): needed once Horovod holds process sets
        besides the global one (``catch_background_abort`` says why)."""
        import psutil
        guard_gil(self.hvd.is_initialized)
        if self._watched is None and self._peers:
            self._watched = {}
            for rank, pid in self._local_peers().items():
                with contextlib.suppress(psutil.NoSuchProcess):
                    self._watched[rank] = psutil.Process(pid)

    def check_enqueue(self, what):
        """Raise ``RankLostError`` naming ``what`` rather than enqueue a collective that would block.

        Horovod's background thread failed (``check_background``); or, with process sets registered,
        a rank of this host died: Horovod's thread then fails and, removing the process sets, holds
        the lock that every enqueue takes, while the enqueue holds the GIL (torch's are pybind calls),
        so no Python code would run again until ``guard_gil`` ended the process. About 8 us per rank
        of this host; a rank on another host is not seen (``guard_gil`` remains)."""
        check_background(what)
        if self._watched:
            dead = sorted(rank for rank, process in self._watched.items() if process_state(process) == "died")
            if dead:
                raise RankLostError(f"{what} cannot complete: {', '.join(f'rank {r}' for r in dead)} of this "
                                    f"host died")

    def require_groups(self, rank_lists, init_call):
        if self.process_set != self.hvd.global_process_set:
            raise ValueError("group averaging spans all ranks: leave process_set at its default, "
                             "hvd.global_process_set")
        table = self.hvd.mpi_ops._basics._get_process_set_ids_and_ranks
        if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") == "1":
            # hvd.init(process_sets="dynamic"): add what is missing, in the same order on every rank
            # (so the groups follow an elastic resize: Horovod's reset drops every set but the global one)
            registered = list(table().values())
            for ranks in (list(r) for r in rank_lists if list(r) not in registered):
                call_with_timeout(lambda: self.hvd.add_process_set(ranks), self.timeout,
                                  f"adding the process set {ranks}")
        self.watch_peers()
        for ranks, set_id in registered_ids(table(), rank_lists, init_call).items():
            self._sets[ranks] = ps = ProcessSet(list(ranks))
            ps.process_set_id = set_id

    def process_set_of(self, ranks):
        """The Horovod process set that averages ``ranks`` (the whole set for None or every rank)."""
        if ranks is None or len(ranks) == self.size:
            return self.process_set
        return self._sets[tuple(ranks)]
