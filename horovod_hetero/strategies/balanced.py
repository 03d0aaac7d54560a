"""Balanced: synchronous SGD at the fast workers' pace, each rank's batch sized to its speed."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from horovod_hetero.rules.balance import NOISE, StepModel, choose_split, fit_step_model
from horovod_hetero.strategies.base import CONTINUE, MEASURE, Context, Decision, RoundResult, StepReport, Strategy
from horovod_hetero.validation import check_int

#: windows of measurements a fit looks back over at most (older ones are dropped)
WINDOWS = 12
#: a window whose step time differs from what the windows before it predict by more than this share
#: (for a rank whose model they tested with two batch sizes or more, or, beyond three times their
#: scatter, that ran this batch size in two windows or more) is a change of speed: the windows before it
#: are dropped, so the plan follows the new speeds
CHANGE = 0.3
#: the most the measured noise may raise the hysteresis to (a plan still moves for a gain beyond it)
MAX_NOISE = 0.3
#: the smallest batch a rank gets by default (BatchNorm needs two samples to normalise a batch)
MIN_BATCH = 2


def even_split(global_batch: int, size: int) -> tuple[int, ...]:
    """``global_batch`` samples in ``size`` batches as equal as integers allow (the first ranks take the
    remainder).

    Example:
        >>> even_split(10, 4)
        (3, 3, 2, 2)
    """
    base, extra = divmod(global_batch, size)
    return tuple(base + (r < extra) for r in range(size))


class Balanced(Strategy):
    """Synchronous SGD at the fast workers' pace: every rank's batch is sized so that all finish together.

    Plain synchronous SGD (``Synchronous``), but each rank computes the gradient of a batch it can finish
    in the same time as the others (LB-BSP, Chen et al. 2020; Cannikin, Li et al. 2024): the averaged
    gradient is exactly the gradient of one large batch (the union of the ranks' batches), so convergence
    per sample is Synchronous's, no hyper-parameter changes (the global batch is fixed, so the learning
    rate is too), and no rank waits.

    On Horovod: the gradients are allreduced by Horovod's own hooks, as ``hvd.DistributedOptimizer``'s,
    with ``op=Sum`` and each rank's gradient scaled first by its share ``b_i / sum(b)`` of the global batch
    (``gradient_weight``): for a mean-reduced loss the sum is the mean gradient of the union batch. Each
    rank's step is modelled as ``t_i(b) = alpha_i + beta_i * b`` (Cannikin: a fixed part and a part per
    sample), fitted from the median step time and batch size of the last windows of ``rebalance_every``
    steps (``rules.balance``; the median, so that one stall, a garbage collection or the OS, does not
    move the plan). Every ``rebalance_every`` steps a round carries every rank's measurements
    (the decision ``MEASURE``: the round's control vector alone, no model), so every rank fits the same
    models and computes the same integer sizes: the split of the global batch that equalises the
    predicted step times, ``min_batch`` to ``max_batch`` each. A split computed after window ``p`` is
    used from window ``p + 2`` on, so a loader that prefetches fewer than ``rebalance_every`` batches draws
    every batch with sizes already known. The first window holds the first step (start-up, tracing) and
    is not measured; the first three windows use an even split.

    Never behind Synchronous by design (``rules.balance``): a fit from one batch size takes time as
    proportional to the batch, a hypothesis the next windows test; where the step time does not rise
    with the batch by more than the noise (a padded step, a GPU below saturation) the rank is modelled
    flat up to the largest batch it ran (proportional beyond), and a curve that is flat up to a knee and
    linear after it is fitted as such; a new split replaces the one in use only if it promises a step
    shorter by more than the noise (5 %, or the windows' scatter about the fits where larger, at most
    30 %), and where it does not, the even split stays or comes back.
    The fits look back over the last 12 windows, and only as far as the latest change of speed (a
    window 30 % off what the windows before it predict, for a rank whose model they tested, or whose
    batch they ran at a steady time).

    The batches come from ``hh.DistributedSampler(dataset, batch_size=B)``, a batch sampler bound to the
    optimizer (``sampler=``): every step it hands each rank its current size, every rank takes the same
    number of steps per epoch, and every sample is used once per epoch (the last global batch is completed
    from the epoch's start, as torch's ``DistributedSampler`` pads). BatchNorm sees each rank's batch of
    its own size: its statistics are per rank, as in Synchronous.

    Args:
        global_batch: samples per step over all ranks, an int >= the number of ranks; ``None``: the number
            of ranks times the bound sampler's ``batch_size`` (the user's batch).
        rebalance_every: steps per window, an int >= 1 (a ``MEASURE`` round after each).
        max_batch: the largest batch a rank may get (memory), an int with ``max_batch * ranks >=
            global_batch``, or ``None``.
        min_batch: the smallest batch a rank may get, an int >= 1, at most ``max_batch`` and
            ``global_batch / ranks``, or ``None``: 2 (BatchNorm normalises a batch of two or more)
            where ``max_batch`` and ``global_batch / ranks`` allow it.

    Example:
        >>> s = Balanced(global_batch=128, rebalance_every=2)
        >>> s.check_size(4); s.batch_sizes(1, size=4)
        (32, 32, 32, 32)

    With Horovod::

        sampler = hh.DistributedSampler(train_set, batch_size=32)       # the user's batch: 128 over 4 ranks
        loader = torch.utils.data.DataLoader(train_set, batch_sampler=sampler)
        opt = hh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      strategy=hh.Balanced(rebalance_every=20), sampler=sampler)
    """

    averages_gradients = True
    weighs_gradients = True
    median_step_time = True          # a window's step time is its median step: one stall does not move the plan

    def __init__(self, global_batch: int | None = None, rebalance_every: int = 20,
                 max_batch: int | None = None, min_batch: int | None = None) -> None:
        super().__init__()
        self.global_batch = None if global_batch is None else check_int("global_batch", global_batch, 1)
        self.rebalance_every = check_int("rebalance_every", rebalance_every, 1)
        self.max_batch = None if max_batch is None else check_int("max_batch", max_batch, 1)
        self.min_batch = None if min_batch is None else check_int("min_batch", min_batch, 1)
        if self.max_batch is not None and self.min_batch is not None and self.min_batch > self.max_batch:
            raise ValueError(f"min_batch must be an int <= max_batch ({self.max_batch}), got {self.min_batch}")
        if self.global_batch is not None and self.max_batch is not None and self.max_batch > self.global_batch:
            self.max_batch = self.global_batch
        self.plans: dict[int, tuple[int, ...]] = {}      # window -> the batch sizes of every rank in it
        # the last windows' (sizes, seconds per step) of every rank
        self.history: list[tuple[tuple[int, ...], tuple[float, ...]]] = []
        self._cut = False              # the history was just cut at a change of speed: it holds that window alone

    def check_size(self, size: int) -> None:
        if self.global_batch is not None and self.global_batch < size:
            raise ValueError(f"global_batch must be an int >= the number of ranks ({size}), got {self.global_batch}")
        if self.global_batch is not None and self.max_batch is not None and self.max_batch * size < self.global_batch:
            raise ValueError(f"max_batch must be >= global_batch / ranks = {self.global_batch} / {size} "
                             f"(= {-(-self.global_batch // size)}), got {self.max_batch}")
        if self.global_batch is not None and self.min_batch is not None and self.min_batch * size > self.global_batch:
            raise ValueError(f"min_batch must be <= global_batch / ranks = {self.global_batch} / {size} "
                             f"(= {self.global_batch // size}), got {self.min_batch}")

    def use_batch(self, batch_size: int, size: int) -> None:
        """Take ``size * batch_size`` as the global batch where none was given (the bound sampler's)."""
        if self.global_batch is None:
            self.global_batch = check_int("batch_size", batch_size, 1) * size
            self.check_size(size)

    def on_start(self, ctx: Context) -> None:
        if self.global_batch is None:
            raise ValueError("Balanced(global_batch=None) takes the number of ranks times the batch of the bound "
                             "sampler: bind hh.DistributedSampler(dataset, batch_size=B) (sampler=...), or give "
                             "global_batch=")
        self.check_size(ctx.size)
        if any(len(sizes) != ctx.size for sizes in self.plans.values()):
            self.plans, self.history = {}, []          # planned for another number of ranks (an elastic resize)

    def window(self, step: int) -> int:
        """The window of local step ``step`` (1-based)."""
        return (step - 1) // self.rebalance_every

    def batch_sizes(self, step: int, size: int | None = None) -> tuple[int, ...]:
        """Every rank's batch at local step ``step`` (1-based): the plan of its window, or an even split
        over ``size`` ranks (default: the ranks it started with) before the first plan; a ``ValueError``
        for a window whose plan is not made yet (a loader that prefetches ``rebalance_every`` batches or
        more ahead). Plans made for another number of ranks (before an elastic resize) are not used."""
        size = size or self.size
        plans = {w: p for w, p in self.plans.items() if len(p) == size}
        window = self.window(step)
        if window in plans:
            return plans[window]
        if window > self.window(self.step + 1) + 1:
            raise ValueError(f"batch sizes asked for step {step}, {step - self.step - 1} steps ahead of training: "
                             f"the loader prefetches more batches than rebalance_every ({self.rebalance_every}); "
                             f"raise rebalance_every or lower the DataLoader's prefetch (num_workers x prefetch_factor)")
        latest = [w for w in plans if w <= window]
        if latest:
            return plans[max(latest)]
        assert self.global_batch is not None        # given, or taken from the bound sampler (use_batch)
        return even_split(self.global_batch, size)

    def batch_size(self, step: int) -> int:
        return self.batch_sizes(step)[self.rank]

    def gradient_weight(self, rank: int, size: int) -> float:
        assert self.global_batch is not None        # given, or taken from the bound sampler (use_batch)
        return self.batch_sizes(self.step + 1, size)[rank] / self.global_batch

    def decide(self, report: StepReport) -> Decision:
        return MEASURE if self.step % self.rebalance_every == 0 else CONTINUE

    def on_round(self, result: RoundResult) -> None:
        stats = result.stats
        if stats is None or result.done:
            return
        window = self.window(self.step)
        sizes = self.batch_sizes(self.step)
        measured = (stats.local_steps > 0) & np.isfinite(stats.step_s) & (stats.step_s > 0)
        reported = stats.samples > 0
        if reported.any():
            used = stats.samples / np.maximum(stats.local_steps, 1)
            wrong = [r for r in range(self.size) if reported[r] and abs(used[r] - sizes[r]) > 0.5]
            if wrong:
                r = wrong[0]
                raise ValueError(
                    f"Balanced planned batches of {sizes[r]} samples on rank {r} in steps "
                    f"{window * self.rebalance_every + 1}-{self.step}, but it reported {used[r]:g} on average: draw "
                    f"the batches from hh.DistributedSampler(dataset, batch_size=...) as DataLoader(dataset, "
                    f"batch_sampler=sampler), and bind it with hh.DistributedOptimizer(..., sampler=sampler)")
        if not measured.all() or window == 0:      # window 0 holds the first step (start-up, tracing): no speed
            return
        latest = (tuple(sizes), tuple(float(t) for t in stats.step_s))
        if self._changed(latest):
            self.history, self._cut = [], True
        else:
            self._cut = False
        self.history = (self.history + [latest])[-WINDOWS:]
        assert self.global_batch is not None        # on_start refuses to start without it
        noise = self.noise()
        self.plans[window + 2] = choose_split(self.global_batch, self._models(self.history, noise),
                                              current=self.batch_sizes(self.step + 1),
                                              even=even_split(self.global_batch, self.size),
                                              min_batch=self.smallest_batch(), max_batch=self.max_batch, noise=noise)
        self.plans = {w: p for w, p in self.plans.items() if w >= window}

    def smallest_batch(self) -> int:
        """``min_batch``, or by default ``MIN_BATCH`` (2) where ``max_batch`` and the even share allow it."""
        if self.min_batch is not None:
            return self.min_batch
        assert self.global_batch is not None        # on_start refuses to start without it
        return max(1, min(MIN_BATCH, self.max_batch or MIN_BATCH, self.global_batch // self.size))

    def noise(self) -> float:
        """The share of a step's time the windows vary by: ``NOISE`` (5 %), or more where a rank's windows
        scatter more about its fit (their relative residuals' standard deviation, over three windows or
        more; at most ``MAX_NOISE``). A rise in the step time smaller than it is no rise, and a new split
        must promise a step shorter by more than it."""
        spreads = [NOISE]
        for r, model in enumerate(self._models(self.history)):
            points = [(h[0][r], h[1][r]) for h in self.history]
            if len(points) >= 3:
                spreads.append(float(np.std([(t - model(b)) / model(b) for b, t in points], ddof=1)))
        return min(max(spreads), MAX_NOISE)

    def _models(self, history: list[tuple[tuple[int, ...], tuple[float, ...]]],
                noise: float = NOISE) -> list[StepModel]:
        return [fit_step_model([h[0][r] for h in history], [h[1][r] for h in history], noise)
                for r in range(self.size)]

    def _changed(self, latest: tuple[tuple[int, ...], tuple[float, ...]]) -> bool:
        """Whether a rank's step time in ``latest`` is ``CHANGE`` off what the windows before predict, for a
        rank whose model they tested (two batch sizes or more: a one-size fit is a hypothesis), or off
        the windows that ran ``latest``'s batch on that rank by ``CHANGE`` and by three times their scatter
        (two such windows or more: the same batch taking another time is a change of speed where its
        time was steady, not where it is noise; or the one window a change left, which may have held
        both speeds)."""
        sizes, times = latest
        tested = [r for r in range(self.size) if len({h[0][r] for h in self.history}) >= 2]
        if tested:
            models = self._models(self.history)
            for r in tested:
                predicted = models[r](sizes[r])
                residuals = np.array([h[1][r] - models[r](h[0][r]) for h in self.history])
                scatter = float(residuals.std(ddof=1)) if residuals.size >= 3 else 0.0
                off = abs(times[r] - predicted)
                if off > CHANGE * predicted and off > 3 * scatter:
                    return True
        for r in set(range(self.size)) - set(tested):
            same = np.array([h[1][r] for h in self.history if h[0][r] == sizes[r]])
            if same.size >= 2 or (same.size == 1 and self._cut):
                off = abs(times[r] - float(same.mean()))
                if off > CHANGE * float(same.mean()) and (same.size == 1 or off > 3 * float(same.std(ddof=1))):
                    return True
        return False

    def telemetry_fields(self) -> dict[str, Any]:
        return {"batch": self.batch_size(self.step)} if self.global_batch is not None and self.step else {}

    @property
    def label(self) -> str:
        return f"Balanced({self.rebalance_every})"

    def state_dict(self) -> dict[str, Any]:
        return dict(super().state_dict(), global_batch=self.global_batch,
                    plans={str(w): list(p) for w, p in self.plans.items()},
                    history=[[list(sizes), list(times)] for sizes, times in self.history])

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("global_batch") is not None:
            self.global_batch = check_int("state['global_batch']", state["global_batch"], 1)
        self.plans = {int(w): tuple(p) for w, p in state.get("plans", {}).items()}
        self.history = [(tuple(sizes), tuple(times)) for sizes, times in state.get("history", [])]

    def __repr__(self) -> str:
        return (f"Balanced(global_batch={self.global_batch!r}, rebalance_every={self.rebalance_every}, "
                f"max_batch={self.max_batch!r}, min_batch={self.min_batch!r})")
