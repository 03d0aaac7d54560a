"""Synchronisation strategies: objects that own the schedule of when the model is synchronised.

A strategy is framework-free. The optimizer wrapper (torch) or callback (Keras) calls
``after_step()`` once per local optimizer step and runs an averaging round when it returns True;
the strategy's counters travel in ``state_dict()`` so a resumed run keeps its phase.
"""
import logging
import time

from horovod_hetero.common.esync import StateServerError, StateServerTimeout
from horovod_hetero.common.state_server import StateClient, StateServer, parse_address
from horovod_hetero.common.validation import as_schedule, check_float, check_int

log = logging.getLogger("horovod_hetero")


class Strategy:
    """Base class: decides after each local step whether the model is averaged now.

    Subclasses set ``averages_gradients`` (True: gradients are allreduced every step by
    Horovod itself, as ``hvd.DistributedOptimizer`` does) and implement ``_decide(step)``.
    """

    averages_gradients = False
    global_lr = 1.0     # w_{t+1} = w_t + global_lr * (mean of the models - w_t)

    def __init__(self):
        self.step = 0

    def bind(self, rank, size, broadcast, host="127.0.0.1", group_ops=None):
        """Called once by the controller: this rank, the set's size, ``broadcast(obj)`` from rank 0,
        the address other ranks reach this machine at, and the adapter's group collectives
        (``group_ops``, see ``HeteroController``)."""

    def after_step(self, step_s=None):
        """Count one local optimizer step (it took ``step_s`` seconds); return True if the model
        is averaged after it."""
        self.step += 1
        return self._decide(self.step)

    def _decide(self, step):
        raise NotImplementedError

    def after_round(self, round):
        """Called after every averaging round (``round`` is the same on all ranks)."""

    def leave(self):
        """This rank stopped stepping and only joins the other ranks' rounds from now on."""

    def telemetry_fields(self):
        """Extra per-step telemetry (e.g. a state-server round trip)."""
        return {}

    def close(self):
        """Release connections and threads."""

    def state_dict(self):
        return {"kind": type(self).__name__, "step": self.step}

    def load_state_dict(self, state):
        if state.get("kind") != type(self).__name__:
            raise ValueError(
                f"strategy state is for {state.get('kind')!r}, cannot load it into {type(self).__name__}")
        self.step = check_int("state['step']", state["step"], 0)

    def __repr__(self):
        return f"{type(self).__name__}()"


class Synchronous(Strategy):
    """Plain synchronous data-parallel SGD: gradients averaged every step.

    Behaves exactly like ``hvd.DistributedOptimizer`` (it is built on it), so switching a
    script between synchronous training and any other strategy changes one argument.

    Example:
        >>> Synchronous().after_step()
        False
    """

    averages_gradients = True

    def _decide(self, step):
        return False


class LocalSGD(Strategy):
    """Local SGD: every worker steps alone, the model is averaged every ``period`` steps.

    Periodic model averaging (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD";
    the local-update rule that ADSP's commit rate tunes). After ``warmup_steps`` steps that
    are each averaged, the model is averaged after the ``warmup_steps + period``-th,
    ``warmup_steps + 2*period``-th, ... step. Parameters and floating-point buffers are
    averaged with one fused allreduce.

    Args:
        period: int >= 1, or a ``step -> int`` schedule giving the number of local steps until
            the next averaging (evaluated at each averaging step).
        warmup_steps: int >= 0, number of initial steps averaged after every step.

    Example:
        >>> s = LocalSGD(period=3)
        >>> [s.after_step() for _ in range(7)]
        [False, False, True, False, False, True, False]
    """

    def __init__(self, period, warmup_steps=0):
        super().__init__()
        self.period = as_schedule("period", period, minimum=1)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, 0)
        self._period_arg = period
        self._next = None

    def _decide(self, step):
        if step <= self.warmup_steps:
            return True
        if self._next is None:
            self._next = self.warmup_steps + self.period(self.warmup_steps)
        if step < self._next:
            return False
        self._next = step + self.period(step)
        return True

    def state_dict(self):
        return dict(super().state_dict(), next=self._next)

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self._next = state.get("next")

    def __repr__(self):
        return f"LocalSGD(period={self._period_arg!r}, warmup_steps={self.warmup_steps})"


class ESync(Strategy):
    """ESync: every worker runs as many local steps as fit while the slowest runs one.

    Li et al., "ESync: An Efficient Synchronous Parallel Algorithm for Distributed ML in
    Heterogeneous Clusters". Before each local step a worker asks the state server (started by
    rank 0 in a background thread, address shared with a Horovod broadcast) whether to
    aggregate; its capability is its measured step time plus the query round trip. At the
    round's end the model deltas are averaged: w_{t+1} = w_t + global_lr * mean(w_i - w_t).

    Args:
        global_lr: the paper's epsilon, > 0 (1.0: plain averaging of the replicas).
        mode: ``"blocking"`` (wait for each answer) or ``"delayed_ack"`` (send the query, keep
            training, aggregate at the first step boundary after READY arrives; a worker the
            server reports as the slowest waits for its answer, so it aggregates after one step).
        epsilon: the state server's slack against boundary errors (seconds).
        overshoot: fraction of a worker's step by which its last local step may end after the
            slowest's (0 is the paper's rule; see ``ESyncState``).
        timeout: seconds to wait for the state server before falling back.
        fallback_period: when the server cannot be reached or stops answering, aggregate every
            this many local steps (a warning is logged once).
        server_address: ``tcp://host:port`` of a state server started elsewhere (tests).

    Example::

        opt = hh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      strategy=hh.ESync(global_lr=1.0, mode="blocking"))
    """

    MODES = ("blocking", "delayed_ack")

    def __init__(self, global_lr=1.0, mode="blocking", epsilon=1e-3, overshoot=0.5, timeout=2.0,
                 fallback_period=8, server_address=None):
        super().__init__()
        self.global_lr = check_float("global_lr", global_lr, 0.0, min_exclusive=True)
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {', '.join(map(repr, self.MODES))}, got {mode!r}")
        self.mode = mode
        self.epsilon = check_float("epsilon", epsilon, 0.0)
        self.overshoot = check_float("overshoot", overshoot, 0.0, 1.0)
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
        self.fallback_period = check_int("fallback_period", fallback_period, 1)
        if server_address is not None:
            parse_address(server_address)               # a malformed address fails here, not at bind
        self.server_address = server_address
        self.round = 0
        self.local_steps = 0
        self.capability = None
        self.fallback = False
        self.server = self.client = None
        self._left = False
        self._last_answer = None

    def bind(self, rank, size, broadcast, host="127.0.0.1", group_ops=None):
        address = self.server_address
        if address is None:
            if rank == 0:
                self.server = StateServer(size, host, epsilon=self.epsilon, overshoot=self.overshoot)
                address = self.server.address
            address = broadcast(address)
        self.client = StateClient(address, rank, timeout=self.timeout)
        self._begin_round()

    def _fall_back(self, why):
        if not self.fallback:
            log.warning("ESync: %s; falling back to averaging every %d local steps", why, self.fallback_period)
        self.fallback = True

    def _guarded(self, call):
        """``call()`` (state-server traffic) unless falling back; a server failure starts the
        fallback and gives None."""
        if self.fallback or self.client is None:
            return None
        try:
            return call()
        except StateServerError as e:
            self._fall_back(str(e))
            return None

    def _begin_round(self):
        """The listing's k = 0 query: registers the round and measures the round trip."""
        self.local_steps = 0
        if self._guarded(lambda: self.client.query(0, self.capability, self.round)) is not None:
            self._last_answer = time.perf_counter()

    def after_step(self, step_s=None):
        self.step += 1
        self.local_steps += 1
        if self._left:                                  # training again after a join
            self._left = False
            self._guarded(lambda: self.client.reset(self.round))
        ready = self._guarded(lambda: self._ask(step_s))
        return self.local_steps >= self.fallback_period if ready is None else ready

    def _ask(self, step_s):
        """QUERY-STATE for the step just taken; raises ``StateServerError`` when unreachable or unanswered."""
        if self.step == 1:
            # warm-up: the first step (graph tracing, allocation) can take seconds; reported as
            # capability it would make this rank look slowest and stall the others' readiness,
            # so it is not reported, and nobody is ready before every rank measured a real step
            capability = None
        else:
            capability = self.capability = (step_s or 0.0) + (self.client.last_rtt or 0.0)
        if self.mode == "blocking":
            return self.client.query(self.local_steps, capability, self.round)
        self.client.send_query(self.local_steps, capability, self.round)
        answers = self.client.poll(self.timeout if self.client.slowest else 0.0)
        now = time.perf_counter()
        if answers:
            self._last_answer = now
        elif now - self._last_answer > self.timeout:
            raise StateServerTimeout(f"the state server has not answered for {self.timeout:g} s")
        return any(a.get("ready") and a.get("round") == self.round for a in answers)

    def after_round(self, round):
        self.round = round
        if self._left:                      # joining others' rounds: no server traffic
            self.local_steps = 0
            return
        self._guarded(lambda: self.client.reset(round))
        self._begin_round()

    def leave(self):
        if not self._left:
            self._guarded(lambda: self.client.leave())
        self._left = True

    def telemetry_fields(self):
        fields = {"fallback": self.fallback}
        if self.client is not None and self.client.last_rtt is not None:
            fields["rtt_s"] = self.client.last_rtt
        return fields

    def state_dict(self):
        return dict(super().state_dict(), round=self.round, local_steps=self.local_steps,
                    capability=self.capability)

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.round, self.capability = state["round"], state["capability"]
        self.local_steps = state["local_steps"]

    def close(self):
        if self.client is not None:
            self.client.close()
        if self.server is not None:
            self.server.close()

    def __repr__(self):
        return f"ESync(global_lr={self.global_lr}, mode={self.mode!r})"


def check_strategy(strategy, allowed=(Strategy,)):
    """Return ``strategy`` (default ``Synchronous()``) or raise ``TypeError`` naming the allowed kinds."""
    if strategy is None:
        return Synchronous()
    if isinstance(strategy, type) and issubclass(strategy, Strategy):
        raise TypeError(f"strategy must be an instance, e.g. strategy={strategy.__name__}(...), "
                        f"not the class {strategy.__name__}")
    if not isinstance(strategy, allowed):
        names = ", ".join(sorted(c.__name__ for c in _concrete(allowed)))
        raise TypeError(f"strategy must be one of {names}; got {strategy!r} ({type(strategy).__name__})")
    return strategy


def _concrete(bases):
    seen, todo = set(), list(bases)
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls is not Strategy:
            seen.add(cls)
    return seen
