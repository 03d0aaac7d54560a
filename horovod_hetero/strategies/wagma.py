"""WAGMA-SGD: wait-avoiding group model averaging over Horovod process sets."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from horovod_hetero.rules.grouping import butterfly_group, group_process_sets, resolve_group_size
from horovod_hetero.strategies.base import (
    AVERAGE, CONTINUE, Context, Decision, GroupAverage, ModelAveraging, RoundResult, StepReport)
from horovod_hetero.strategies.periodic import Periodic
from horovod_hetero.validation import check_bool, check_float, check_int


def init_call(size: int, group_size: int | None) -> str:
    """The exact ``hvd.init(...)`` call that registers WAGMA's process sets (for error messages)."""
    return f"hvd.init(process_sets=hh.wagma_process_sets(group_size={group_size!r}))  # P={size}"


class WAGMA(ModelAveraging):
    """WAGMA-SGD: average within butterfly groups every step, globally every ``sync_period`` steps.

    Li et al., "Breaking (Global) Barriers in Parallel Stochastic Optimization with
    Wait-Avoiding Group Averaging" (Algorithm 2). Groups of size S change every step (butterfly
    phases, ``rules.grouping.butterfly_groups``): after a local step the decision is
    ``GroupAverage(group, tag=t)``, and every ``sync_period`` steps ``AVERAGE`` (line 16, a
    standard allreduce). The runtime runs each group average as one fused allreduce over the
    group's Horovod process set, registered once at ``hvd.init``.

    Wait-avoidance on Horovod (``runtime.group_exchange``): Horovod has no one-sided
    activation, a collective completes only when every member of its process set has enqueued
    it. So every worker runs a *responder* thread; the first member of a group to finish its step
    activates its peers, and a peer still inside its own step has its responder enqueue the same
    allreduce with its last published model (stale, Algorithm 2's send buffer). The activator
    waits for activation + Horovod's negotiation, not for the straggler; the straggler later takes
    1/(S+1) (W_sum + W') (line 13). What still waits: the global average every ``sync_period``
    steps, and step 1 (no model is published before a worker's first step ends).

    ``sync_model()`` in mid-training, reached after any numbers of steps: groups, tags and the
    global schedule follow ``t``, a step count every rank shares, not this rank's own ``step``.
    Every round carries each rank's steps since the previous one (``RoundStats.local_steps``), so
    in the round in which the last rank joins, every rank knows how many steps the furthest rank
    took since the previous such round and moves ``t`` (and the schedule) up to it. All ranks then
    continue at the same ``t``, above every tag used before: a rank that stopped early skips the
    steps it did not take (its peers' group averages were served with weight 0 meanwhile). With
    equal step counts ``t`` stays ``step``.

    Args:
        group_size: S, a power of two <= P; ``None``: the power of two nearest sqrt(P).
        sync_period: tau, int >= 1 or a ``step -> int`` schedule: steps between global averages.
        wait_avoiding: serve a straggler's group averages with its last model (True), or wait
            for it in every group allreduce (False, the paper's plain group allreduce).
        patience: seconds a worker lets its peers wait for its own step before its last model
            is used instead (0.0 is the paper: at once); none while it waits in ``sync_model()``.
        timeout: seconds to wait for a group average before a ``CollectiveTimeoutError``.

    Example::

        hvd.init(process_sets=hh.wagma_process_sets(group_size=None))
        opt = hh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      strategy=hh.WAGMA(group_size=None, sync_period=10))
    """

    def __init__(self, group_size: int | None = None, sync_period: int | Callable[[int], int] = 10,
                 wait_avoiding: bool = True, patience: float = 0.0, timeout: float = 300.0) -> None:
        super().__init__()
        self.schedule = Periodic(sync_period, name="sync_period")
        self._period_arg = sync_period
        self.group_size = group_size
        if group_size is not None and check_int("group_size", group_size, 1) & (group_size - 1):
            raise ValueError(f"group_size must be a power of two (1, 2, 4, ...), got {group_size}; "
                             f"or None for the power of two nearest sqrt(number of workers)")
        self.wait_avoiding = check_bool("wait_avoiding", wait_avoiding)
        self.patience = check_float("patience", patience, 0.0)
        self.timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
        self.S: int | None = None
        self.t = 0                      # the step every rank shares (== step until ranks join unevenly)
        self._since_sync: list[int] | None = None  # every rank's steps since the latest round all ranks joined

    @property
    def lockstep(self) -> bool:    # type: ignore[override]
        """Without wait-avoidance every group average waits for all its members: the ranks step together."""
        return not self.wait_avoiding

    def check_size(self, size: int) -> None:
        resolve_group_size(self.group_size, size)

    def on_start(self, ctx: Context) -> None:
        self.S = resolve_group_size(self.group_size, ctx.size)
        if self._since_sync is None or len(self._since_sync) != ctx.size:
            self._since_sync = [0] * ctx.size
        # butterfly partitions repeat every log2(P) steps: this rank's group for each phase
        phases = range(max(1, ctx.size.bit_length() - 1))
        self._groups = [butterfly_group(ctx.size, self.S, t, ctx.rank) for t in phases]
        if self.S > 1:
            ctx.transports.open_groups(group_process_sets(ctx.size, self.S), init_call(ctx.size, self.group_size),
                                       wait_avoiding=self.wait_avoiding, patience=self.patience, timeout=self.timeout)

    def group_of(self, step: int) -> tuple[int, ...]:
        """This rank's group after shared step ``step`` (``t``, 1-based; the paper's t = step - 1)."""
        return self._groups[(step - 1) % len(self._groups)]

    def decide(self, report: StepReport) -> Decision:
        self.t += 1
        if self.schedule.due(self.t):
            return AVERAGE                  # global average (line 16)
        assert self.S is not None           # on_start resolved it
        if self.S > 1:
            return GroupAverage(self.group_of(self.t), tag=self.t)
        return CONTINUE                     # groups of one: local SGD with period sync_period

    def on_round(self, result: RoundResult) -> None:
        if result.stats is None:            # protocol-level fakes carry no statistics
            return
        assert self._since_sync is not None     # on_start (or the checkpoint) set it
        self._since_sync = [n + int(k) for n, k in zip(self._since_sync, result.stats.local_steps)]
        if result.done >= self.size:        # every rank joined (sync_model): continue at the furthest t
            self.t += max(self._since_sync) - self._since_sync[self.rank]
            self._since_sync = [0] * self.size
            self.schedule.skip_to(self.t)

    def state_dict(self) -> dict[str, Any]:
        return dict(super().state_dict(), next=self.schedule.next, t=self.t, since_sync=self._since_sync)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.schedule.next = state.get("next")
        self.t = check_int("state['t']", state.get("t", self.step), 0)
        self._since_sync = None if state.get("since_sync") is None else list(state["since_sync"])

    @property
    def label(self) -> str:
        period = self._period_arg if isinstance(self._period_arg, int) else "schedule"
        return f"WAGMA(S={self.group_size or 'auto'},{period})"

    def __repr__(self) -> str:
        return (f"WAGMA(group_size={self.group_size!r}, sync_period={self._period_arg!r}, "
                f"wait_avoiding={self.wait_avoiding})")
