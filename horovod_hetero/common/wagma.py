"""WAGMA-SGD: wait-avoiding group model averaging over Horovod process sets.

Li et al., "Breaking (Global) Barriers in Parallel Stochastic Optimization with Wait-Avoiding
Group Averaging" (Algorithm 2). After every local step a worker averages its model within its
butterfly group for that step (``grouping.butterfly_groups``), and every ``sync_period`` steps
with all workers.

Wait-avoidance on Horovod. Horovod has no one-sided activation: a collective completes only
when every member of its process set has enqueued it. So every worker runs a *responder*
thread. The first group member to finish its step (the activator) sends an activation message
(ZeroMQ PUSH/PULL) to its peers and enqueues the group allreduce with its fresh model W'_t; a
peer whose own step is still running has its responder enqueue the same allreduce at once with
the peer's last published model (stale, Algorithm 2's send buffer). The activator therefore
waits only for activation + Horovod's negotiation, not for the straggler's step. When the
straggler finishes, it finds its part already done and takes 1/(S+1) (W_sum + W'_t) (line 13).
What is *not* wait-avoiding: the global average every ``sync_period`` steps (line 16) is a
standard allreduce, and step 1 has no published model yet, so its group averages wait.
"""
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

import zmq

from horovod_hetero.common.grouping import butterfly_groups, check_sizes, distinct_partitions, nearest_group_size
from horovod_hetero.common.rounds import FLOAT32_EXACT, RoundMismatchError
from horovod_hetero.common.strategy import LocalSGD
from horovod_hetero.common.validation import as_schedule, check_float, check_int

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


def resolve_group_size(group_size, size):
    """The group size S for world size P=``size``: ``None`` gives the power of two nearest sqrt(P)."""
    S = nearest_group_size(size) if group_size is None else check_int("group_size", group_size, 1)
    try:
        check_sizes(size, S)
    except ValueError as e:
        raise ValueError(f"WAGMA: {e}") from None
    return S


def process_set_ranks(size, group_size=None):
    """Rank lists of every group of every distinct butterfly partition, to register once.

    Groups of one rank and the group of all ranks (the global process set) are left out.

    Example:
        >>> process_set_ranks(4, 2)
        [[0, 1], [2, 3], [0, 2], [1, 3]]
    """
    S = resolve_group_size(group_size, size)
    return [list(g) for part in distinct_partitions(size, S) for g in part if 1 < len(g) < size]


def init_call(size, group_size):
    """The exact ``hvd.init(...)`` call that registers WAGMA's process sets (for error messages)."""
    return f"hvd.init(process_sets=hh.wagma_process_sets(group_size={group_size!r}))  # P={size}"


def registered_ids(table, rank_lists, init_call):
    """Map each rank list to its Horovod process-set id, or raise naming the ``hvd.init`` call.

    Args:
        table: Horovod's ``{process_set_id: ranks}`` of registered process sets.
        rank_lists: the sets WAGMA needs (``process_set_ranks``).
        init_call: the call that registers them (``init_call``).
    """
    ids = {tuple(ranks): i for i, ranks in table.items()}
    missing = [list(ranks) for ranks in rank_lists if tuple(ranks) not in ids]
    if missing:
        raise ValueError(f"WAGMA's group process sets are not registered (missing {missing}); "
                         f"initialise Horovod with {init_call}")
    return {tuple(ranks): ids[tuple(ranks)] for ranks in rank_lists}


@dataclass(frozen=True)
class GroupResult:
    """One group average as one rank sees it."""

    step: int
    group: tuple
    summed: object         # sum of the members' weighted models (framework tensors)
    total_weight: float
    stale: bool            # this rank's fresh model was not in it (served from its snapshot)


class Activations:
    """Activation messages between ranks: a PULL socket per rank, PUSH sockets to peers.

    Args:
        host: address to bind.
        allgather: ``allgather(obj) -> list`` over all ranks (exchanges the addresses).
    """

    def __init__(self, host, allgather):
        self._context = zmq.Context.instance()
        self._pull = self._context.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(f"tcp://{host}:*")             # a free port chosen by the OS
        self.addresses = allgather(self._pull.getsockopt_string(zmq.LAST_ENDPOINT))
        self._push = {}

    def send(self, rank, step):
        """Tell ``rank`` that group step ``step`` has started (never blocks)."""
        if rank not in self._push:
            sock = self._context.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.addresses[rank])
            self._push[rank] = sock
        try:
            self._push[rank].send(b"%d" % step, zmq.NOBLOCK)
        except zmq.Again:       # the peer's queue is full: it is far behind, its responder will catch up
            pass

    def receive(self, timeout_s):
        """The next activated step, or ``None`` after ``timeout_s`` seconds."""
        if self._pull.poll(int(timeout_s * 1000)):
            return int(self._pull.recv())
        return None

    def close(self):
        for sock in self._push.values():
            sock.close()
        self._pull.close()


class GroupExchange:
    """One rank's side of wait-avoiding group averaging (the core of Algorithm 2, lines 9-14).

    Args:
        rank: this rank.
        group_of: ``step -> tuple of ranks``, this rank's group at that step.
        allreduce: ``allreduce(model, weight, control, group, name) -> (summed, summed_control)``,
            a blocking sum over the group's process set of ``weight * model`` and ``control``,
            callable from any thread.
        activations: an ``Activations``, or ``None`` for plain (waiting) group allreduces.
        patience: seconds the responder waits for this rank's own step before it contributes
            the stale model (0: at once, as the paper).
        timeout: seconds to wait for a group result.

    The main thread calls ``publish(model)`` after every average (the model the next step starts
    from) and ``average(step, fresh)`` after every local step.
    """

    def __init__(self, rank, group_of, allreduce, activations=None, patience=0.0, timeout=300.0):
        self.rank = rank
        self._group_of = group_of
        self._allreduce = allreduce
        self._activations = activations
        self.patience = patience
        self.timeout = timeout
        self._lock = threading.Condition()
        self._snapshot = None          # (model, weight) that the responder contributes
        self._main_step = 0            # last step the main thread reached
        self._served = {}              # step -> Future of the allreduce the responder ran
        self.served_stale = 0
        self._closed = False
        self._thread = None
        if activations is not None:
            self._thread = threading.Thread(target=self._respond, name="horovod_hetero-wagma", daemon=True)
            self._thread.start()

    def _control(self, step, weight, group):
        tag = step % max(2, FLOAT32_EXACT // len(group))
        return [weight, 1.0, float(tag)]

    def _run(self, step, model, weight):
        group = self._group_of(step)
        control = self._control(step, weight, group)
        summed, ctl = self._allreduce(model, weight, control, group, f"horovod_hetero.wagma.{step}")
        if round(ctl[1]) != len(group) or ctl[2] != control[2] * len(group):
            raise RoundMismatchError(f"WAGMA group step {step}: the members of {group} entered different "
                                     f"steps (control sums {ctl}); every rank must step with the same strategy")
        return summed, float(ctl[0])

    def publish(self, model, weight=1.0):
        """The model this rank's responder contributes while its next step runs (weight 0: left)."""
        with self._lock:
            self._snapshot = (model, weight)

    def average(self, step, fresh):
        """Group-average after local step ``step`` with this rank's fresh model; a ``GroupResult``."""
        group = self._group_of(step)
        with self._lock:
            future = self._served.pop(step, None)
            if future is None:
                self._main_step = step
                self._lock.notify_all()
        if future is not None:
            summed, total = future.result(self.timeout)
            return GroupResult(step, group, summed, total, stale=True)
        if self._activations is not None:
            for peer in group:
                if peer != self.rank:
                    self._activations.send(peer, step)
        summed, total = self._run(step, fresh, 1.0)
        return GroupResult(step, group, summed, total, stale=False)

    def _respond(self):
        while not self._closed:
            step = self._activations.receive(0.1)
            if step is not None:        # one thread each: a blocking allreduce never delays the next
                threading.Thread(target=self._serve, args=(step,), name="horovod_hetero-wagma-serve",
                                 daemon=True).start()

    def _serve(self, step):
        with self._lock:
            if self.patience > 0:
                deadline = time.monotonic() + self.patience
                self._lock.wait_for(lambda: self._main_step >= step, max(0.0, deadline - time.monotonic()))
            if self._main_step >= step or step in self._served or self._snapshot is None:
                return          # the main thread does (or did) it fresh; before step 1 it must
            model, weight = self._snapshot
            future = Future()
            if weight > 0:      # a rank that left never collects its results
                self._served[step] = future
                self.served_stale += 1
        try:
            future.set_result(self._run(step, model, weight))
        except BaseException as e:      # handed to the main thread when it collects this step
            future.set_exception(e)

    def close(self):
        self._closed = True
        if self._thread is not None:
            self._thread.join(1.0)
            self._activations.close()


class WAGMA(LocalSGD):
    """WAGMA-SGD: average within butterfly groups every step, globally every ``sync_period`` steps.

    Li et al., "Breaking (Global) Barriers in Parallel Stochastic Optimization with
    Wait-Avoiding Group Averaging". Groups of size S change every step (butterfly phases,
    ``butterfly_groups``); each group average is one fused allreduce over the group's Horovod
    process set, registered once at ``hvd.init``. With ``wait_avoiding=True`` a straggler's peers
    average with its last model instead of waiting for its step (see this module's docstring
    for exactly what waits and what does not).

    Args:
        group_size: S, a power of two <= P; ``None``: the power of two nearest sqrt(P).
        sync_period: tau, int >= 1 or a ``step -> int`` schedule: steps between global averages.
        wait_avoiding: serve a straggler's group averages with its last model (True), or wait
            for it in every group allreduce (False, the paper's plain group allreduce).
        patience: seconds a worker lets its peers wait for its own step before its last model
            is used instead (0.0 is the paper: at once).
        timeout: seconds to wait for a group average before a ``TimeoutError``.

    Example::

        hvd.init(process_sets=hh.wagma_process_sets(group_size=None))
        opt = hh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      strategy=hh.WAGMA(group_size=None, sync_period=10))
    """

    def __init__(self, group_size=None, sync_period=10, wait_avoiding=True, patience=0.0, timeout=300.0):
        super().__init__(as_schedule("sync_period", sync_period, minimum=1))
        self._period_arg = sync_period
        self.group_size = group_size
        if group_size is not None and check_int("group_size", group_size, 1) & (group_size - 1):
            raise ValueError(f"group_size must be a power of two (1, 2, 4, ...), got {group_size}; "
                             f"or None for the power of two nearest sqrt(number of workers)")
        self.wait_avoiding = bool(wait_avoiding)
        self.patience = check_float("patience", patience, 0.0)
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
        self.exchange = None
        self.last = None          # the last GroupResult (tests, telemetry)
        self._wait_s = 0.0
        self._left = False

    def bind(self, rank, size, broadcast, host="127.0.0.1", group_ops=None):
        if group_ops is None:
            raise ValueError("WAGMA needs group collectives, which this adapter does not provide")
        self.rank, self.size = rank, size
        self.S = resolve_group_size(self.group_size, size)
        self._ops = group_ops
        # butterfly partitions repeat every log2(P) steps: this rank's group for each phase
        phases = range(max(1, size.bit_length() - 1))
        self._groups = [next(g for g in butterfly_groups(size, self.S, t) if rank in g) for t in phases]
        if self.S == 1:
            return                 # groups of one: local SGD with period sync_period
        group_ops.require_process_sets(process_set_ranks(size, self.S), init_call(size, self.group_size))
        activations = Activations(host, group_ops.allgather) if self.wait_avoiding else None
        self.exchange = GroupExchange(rank, self.group_of, group_ops.allreduce, activations,
                                      self.patience, self.timeout)

    def group_of(self, step):
        """This rank's group after local step ``step`` (1-based; the paper's t = step - 1)."""
        return self._groups[(step - 1) % len(self._groups)]

    def _publish(self, weight=1.0):
        """Hand this rank's model to its responder (only wait-avoiding exchanges have one)."""
        if self.exchange is not None and self.wait_avoiding:
            self.exchange.publish(self._ops.snapshot(), weight)

    def after_step(self, step_s=None):
        if self._left:             # training again after a join
            self._publish()
        self._left = False
        if super().after_step(step_s):
            return True            # global average: the controller runs the round
        if self.exchange is not None:
            t0 = time.perf_counter()
            self.last = result = self.exchange.average(self.step, self._ops.current())
            if result.stale:       # Algorithm 2, line 13: 1/(S+1) (W_sum + W')
                self._ops.assign(result.summed, result.total_weight + 1.0, add_current=True)
            else:                  # line 11: 1/S W_sum
                self._ops.assign(result.summed, result.total_weight)
            self._publish()
            self._wait_s = time.perf_counter() - t0
        return False

    def after_round(self, round):
        self._publish(0.0 if self._left else 1.0)

    def leave(self):
        self._left = True
        self._publish(0.0)

    def telemetry_fields(self):
        if self.last is None or self.last.step != self.step:
            return {}
        return {"group": list(self.last.group), "stale": self.last.stale, "group_s": self._wait_s}

    def close(self):
        if self.exchange is not None:
            self.exchange.close()

    def __repr__(self):
        return (f"WAGMA(group_size={self.group_size!r}, sync_period={self._period_arg!r}, "
                f"wait_avoiding={self.wait_avoiding})")
