"""ESync: every worker runs as many local steps as fit while the slowest runs one."""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from horovod_hetero.errors import StateServerError, StateServerTimeout
from horovod_hetero.strategies.base import (
    AVERAGE, CONTINUE, Context, Decision, ModelAveraging, RoundResult, StateService, StepReport)
from horovod_hetero.validation import check_bool, check_float, check_int, parse_address

log = logging.getLogger("horovod_hetero")

_T = TypeVar("_T")


class ESync(ModelAveraging):
    """ESync: every worker runs as many local steps as fit while the slowest runs one.

    Li et al., "ESync: An Efficient Synchronous Parallel Algorithm for Distributed ML in
    Heterogeneous Clusters". On Horovod: the state server (``ctx.transports.state_service``:
    started on rank 0, its address shared with a Horovod broadcast) keeps the paper's records
    (``rules.esync_state.ESyncState``); after each local step a worker asks it whether to aggregate
    (QUERY-STATE; its capability is its measured step time plus the query round trip) and answers
    ``AVERAGE`` when it is ready. The aggregation is the runtime's averaging round, one fused
    allreduce of the models: w_{t+1} = mean(w_i). The paper's global learning rate epsilon,
    w_{t+1} = w_t + epsilon * mean(w_i - w_t), is given beside the strategy, as every aggregation is:
    ``aggregate=hh.Mean(outer=hh.OuterSGD(lr=epsilon))`` (``hh.Normalized`` divides each delta by its
    local steps; ``strategies.aggregation``).

    Falling back never splits the ranks (a rank stalled longer than ``timeout``, e.g. rank 0 with
    the server, makes the others time out while it does not): a rank that falls back tells the
    server it aggregates the round without an answer (``enter``), which makes every rank still
    asking ready at its next query, so all of them reach the round's allreduce; the message waits
    in the connection until a stalled server reads it. Every rank tries the server again when the
    next round starts, so ranks come back as soon as it answers. A rank that cannot reach the
    server at all while the others can (a network partition) still leaves them waiting up to the
    collective timeout.

    Args:
        mode: ``"blocking"`` (wait for each answer) or ``"delayed_ack"`` (send the query, keep
            training, aggregate at the first step boundary after READY arrives; a worker the
            server reports as the slowest waits for its answer, so it aggregates after one step).
        epsilon: the state server's slack against boundary errors (seconds).
        overshoot: fraction of a worker's step by which its last local step may end after the
            slowest's (0 is the paper's rule; see ``ESyncState``).
        timeout: seconds to wait for the state server before falling back.
        fallback_period: when the server cannot be reached or stops answering, aggregate after
            this many local steps of the round (a warning is logged once).
        server_address: ``tcp://host:port`` of a state server started elsewhere (tests: it must hold the
            job's key, ``Transports.key()``), or ``None``.
        warmup_step: the first local step is a warm-up (tf.function tracing, allocation): its time
            is not reported as capability, and no worker is ready before every worker reported a
            real step. ``False`` reports it (steps that cost the same from the first on).

    Example::

        opt = hh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      strategy=hh.ESync(mode="blocking"))
    """

    MODES = ("blocking", "delayed_ack")

    def __init__(self, mode: str = "blocking", epsilon: float = 1e-3, overshoot: float = 0.5,
                 timeout: float = 2.0, fallback_period: int = 8, server_address: str | None = None,
                 warmup_step: bool = True) -> None:
        super().__init__()
        if not isinstance(mode, str) or mode not in self.MODES:
            error = ValueError if isinstance(mode, str) else TypeError
            was = (" (ESync's first argument was global_lr before 0.2.0: give it as hh.DistributedOptimizer(..., "
                   "aggregate=hh.Mean(outer=hh.OuterSGD(lr=...))), see CHANGELOG.md)"
                   if isinstance(mode, (int, float)) and not isinstance(mode, bool) else "")
            raise error(f"mode must be one of {', '.join(map(repr, self.MODES))}, got {mode!r}{was}")
        self.mode = mode
        self.epsilon = check_float("epsilon", epsilon, 0.0)
        self.overshoot = check_float("overshoot", overshoot, 0.0, 1.0)
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
        self.fallback_period = check_int("fallback_period", fallback_period, 1)
        if server_address is not None:
            parse_address(server_address)               # a malformed address fails here, not at start
        self.server_address = server_address
        self.warmup_step = check_bool("warmup_step", warmup_step)
        self.round = 0
        self.local_steps = 0
        self.capability: float | None = None
        self.fallback = False           # this round runs without the server
        self._warned = False
        self.client: StateService | None = None
        self._left = False
        self._last_answer: float | None = None

    def on_start(self, ctx: Context) -> None:
        self.client = ctx.transports.state_service(epsilon=self.epsilon, overshoot=self.overshoot,
                                                   timeout=self.timeout, address=self.server_address)
        self._begin_round()

    def _fall_back(self, why: str) -> None:
        if not self._warned:
            log.warning("ESync: %s; falling back to averaging after %d local steps in each round without an "
                        "answer (the server is tried again at every round)", why, self.fallback_period)
            self._warned = True
        self.fallback = True

    def _guarded(self, call: Callable[[StateService], _T]) -> _T | None:
        """``call(client)`` (state-server traffic) unless falling back; a server failure starts the
        fallback and gives None."""
        if self.fallback or self.client is None:
            return None
        try:
            return call(self.client)
        except StateServerError as e:
            self._fall_back(str(e))
            return None

    def _begin_round(self) -> None:
        """The listing's k = 0 query: registers the round and measures the round trip."""
        self.local_steps = 0
        if self._guarded(lambda client: client.query(0, self.capability, self.round)) is not None:
            self._last_answer = self.clock()

    def decide(self, report: StepReport) -> Decision:
        self.local_steps += 1
        if self._left:                                  # training again after a join
            self._left = False
            self._guarded(lambda client: client.reset(self.round))
        ready = self._guarded(lambda client: self._ask(client, report.step_s))
        if ready is None:
            ready = self.local_steps >= self.fallback_period
            if ready:
                self._best_effort(lambda client: client.enter(self.round))   # nobody waits for this rank's answer
        return AVERAGE if ready else CONTINUE

    def _best_effort(self, call: Callable[[StateService], object]) -> None:
        """``call(client)`` (state-server traffic) even while falling back; a failure is ignored."""
        if self.client is not None:
            try:
                call(self.client)
            except StateServerError:
                pass

    def _ask(self, client: StateService, step_s: float) -> bool:
        """QUERY-STATE for the step just taken; raises ``StateServerError`` when unreachable or unanswered."""
        if self.step == 1 and self.warmup_step:
            # the first step (graph tracing, allocation) can take seconds; reported as capability
            # it would make this rank look slowest and stall the others' readiness, so it is not
            # reported, and nobody is ready before every rank measured a real step
            capability = None
        else:
            capability = self.capability = (step_s or 0.0) + (client.last_rtt or 0.0)
        if self.mode == "blocking":
            return client.query(self.local_steps, capability, self.round)
        client.send_query(self.local_steps, capability, self.round)
        answers = client.poll(self.timeout if client.slowest else 0.0)
        now = self.clock()
        if answers:
            self._last_answer = now
        elif self._last_answer is None or now - self._last_answer > self.timeout:
            raise StateServerTimeout(f"the state server has not answered for {self.timeout:g} s")
        return any(a.get("ready") and a.get("round") == self.round for a in answers)

    def on_round(self, result: RoundResult) -> None:
        self.round = result.round
        if self._left:                      # joining others' rounds: no server traffic
            self.local_steps = 0
            return
        self.fallback = False               # every round asks the server again
        self._guarded(lambda client: client.reset(self.round))
        self._begin_round()

    def on_leave(self) -> None:
        if not self._left:
            self._best_effort(lambda client: client.leave())
        self._left = True

    def telemetry_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"fallback": self.fallback}
        if self.client is not None and self.client.last_rtt is not None:
            fields["rtt_s"] = self.client.last_rtt
        return fields

    def state_dict(self) -> dict[str, Any]:
        return dict(super().state_dict(), round=self.round, local_steps=self.local_steps,
                    capability=self.capability)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.round, self.capability = state["round"], state["capability"]
        self.local_steps = state["local_steps"]

    def __repr__(self) -> str:
        return f"ESync(mode={self.mode!r})"
