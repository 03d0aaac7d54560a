"""Balanced: synchronous SGD at the fast workers' pace, each rank's batch sized to its speed."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from horovod_hetero.rules.batch_split import NOISE, StepModel, alike, choose_split, fit_step_model
from horovod_hetero.strategies.base import CONTINUE, MEASURE, Context, Decision, GradientWeighting, RoundResult, StepReport
from horovod_hetero.validation import check_int

#: windows of measurements a fit looks back over at most (older ones are dropped)
WINDOWS = 12
#: a rank's window off what the windows before it predict (its model where they tested it with two batch
#: sizes or more, else their mean time at this batch) by more than this share, and by more than its
#: noise allows, is suspect; the next window off the same way confirms a change of speed: the windows
#: before it are dropped, so the plan follows the new speeds (one window off is noise, and is kept)
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


class Balanced(GradientWeighting):
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
    steps (``rules.batch_split``; the median, so that one stall, a garbage collection or the OS, does not
    move the plan). Every ``rebalance_every`` steps a round carries every rank's measurements
    (the decision ``MEASURE``: the round's control vector alone, no model), so every rank fits the same
    models and computes the same integer sizes: the split of the global batch that equalises the
    predicted step times, ``min_batch`` to ``max_batch`` each. A split computed after window ``p`` is
    used from window ``p + 2`` on, so a loader that prefetches fewer than ``rebalance_every`` batches draws
    every batch with sizes already known. The first window holds the first step (start-up, tracing) and
    is not measured; the first three windows use an even split.

    Never behind Synchronous by design (``rules.batch_split``): a fit from one batch size takes time as
    proportional to the batch, a hypothesis the next windows test; where the step time does not rise
    with the batch by more than 5 % or its fit's scatter (a padded step, a GPU below saturation) the
    rank is modelled flat up to the largest batch it ran (proportional beyond), and a curve that is flat
    up to a knee and linear after it is fitted as such; a new split replaces the one in use only if it
    promises a step shorter by more than the noise (5 %, or the windows' largest relative scatter about
    a rank's fit, at most 30 %), and where it does not, the even split stays or comes back. Ranks whose
    step times the windows cannot tell apart (predictions at the even share within 3 standard errors)
    share one fit to all their windows, so their samples are split evenly rather than by their noise.
    The fits look back over the last 12 windows, and only as far as the latest change of speed: a
    rank's window off what the windows before predict (its model, or its mean time at that batch) by
    30 % and beyond 3 times its noise (more with many ranks) is held out; the next one off the same way
    confirms the change, and the history restarts from it (the noise measured before it still counts
    until three windows measure it again).

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
        # a window off what the history predicts (``_off``), held out of it until the next one confirms a
        # change of speed or not: (sizes, times, every rank's direction off: -1, 0 or 1)
        self.suspect: tuple[tuple[int, ...], tuple[float, ...], tuple[int, ...]] | None = None
        # every rank's noise (``rank_noise``) when the latest change of speed restarted the history
        self.noise_seen: tuple[float, ...] | None = None

    def plan_windows(self, steps: int) -> None:
        """A window is ``steps`` steps from now on (Keras: an epoch, whose batch size ``fit`` fixes)."""
        self.rebalance_every = check_int("steps", steps, 1)

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
            self.plans, self.history, self.suspect = {}, [], None   # planned for another number of ranks (a resize)
            self.noise_seen = None

    def window(self, step: int) -> int:
        """The window of local step ``step`` (1-based), counted from the step Balanced took over at (``origin``)."""
        return (step - 1 - self.origin) // self.rebalance_every

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

    def gradient_weight(self, rank: int, size: int) -> float:
        assert self.global_batch is not None        # given, or taken from the bound sampler (use_batch)
        return self.batch_sizes(self.step + 1, size)[rank] / self.global_batch

    def decide(self, report: StepReport) -> Decision:
        return MEASURE if (self.step - self.origin) % self.rebalance_every == 0 else CONTINUE

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
                    f"{self.origin + window * self.rebalance_every + 1}-{self.step}, but it reported {used[r]:g} on average: draw "
                    f"the batches from hh.DistributedSampler(dataset, batch_size=...) as DataLoader(dataset, "
                    f"batch_sampler=sampler), and bind it with hh.DistributedOptimizer(..., sampler=sampler)")
        if not measured.all() or window == 0:      # window 0 holds the first step (start-up, tracing): no speed
            return
        latest = (tuple(sizes), tuple(float(t) for t in stats.step_s))
        self._record(latest)
        assert self.global_batch is not None        # on_start refuses to start without it
        models = self.planning_models()
        self.plans[window + 2] = choose_split(self.global_batch, models,
                                              current=self.batch_sizes(self.step + 1),
                                              even=even_split(self.global_batch, self.size),
                                              min_batch=self.smallest_batch(), max_batch=self.max_batch,
                                              noise=max(self.rank_noise(models)))
        self.plans = {w: p for w, p in self.plans.items() if w >= window}

    def smallest_batch(self) -> int:
        """``min_batch``, or by default ``MIN_BATCH`` (2) where ``max_batch`` and the even share allow it."""
        if self.min_batch is not None:
            return self.min_batch
        assert self.global_batch is not None        # on_start refuses to start without it
        return max(1, min(MIN_BATCH, self.max_batch or MIN_BATCH, self.global_batch // self.size))

    def noise(self) -> float:
        """The share of a step's time the windows vary by, the most of any rank's (``rank_noise``): a new
        split must promise a step shorter by more than it."""
        return max(self.rank_noise(self.planning_models()))

    def planning_models(self) -> list[StepModel]:
        """Per rank, the step-time model the plan is made from (fitted to the history). Ranks whose step
        times the windows cannot tell apart (``rules.batch_split.alike``: their models' predictions at the even
        share, within 3 standard errors of their noise over the windows) share one model, fitted to all
        their windows: the plan splits their samples evenly instead of following each one's noise."""
        models = self._models(self.history)
        assert self.global_batch is not None        # on_start refuses to start without it
        share, count = self.global_batch / self.size, max(len(self.history), 1)
        errors = [noise / math.sqrt(count) for noise in self.rank_noise(models)]
        for group in alike([model(share) for model in models], errors):
            if len(group) > 1:
                pooled = fit_step_model([h[0][r] for h in self.history for r in group],
                                        [h[1][r] for h in self.history for r in group], NOISE)
                for r in group:
                    models[r] = pooled
        return models

    def rank_noise(self, models: list[StepModel]) -> list[float]:
        """Per rank, the share of a step's time its windows vary by: ``NOISE`` (5 %), or the relative
        scatter of its windows about its fit (``models``, fitted to the history) where larger (three
        windows or more; fewer, after a change of speed: the noise measured before it), at most ``MAX_NOISE``."""
        spreads = []
        for r, model in enumerate(models):
            points = [(h[0][r], h[1][r]) for h in self.history]
            if len(points) >= 3:
                scatter = float(np.std([(t - model(b)) / model(b) for b, t in points], ddof=1))
            elif self.noise_seen is not None and len(self.noise_seen) == len(models):
                scatter = self.noise_seen[r]
            else:
                scatter = 0.0
            spreads.append(min(max(NOISE, scatter), MAX_NOISE))
        return spreads

    def _record(self, latest: tuple[tuple[int, ...], tuple[float, ...]]) -> None:
        """Add a window to the history: a window off what it predicts is held out as suspect; the next one
        off the same way on a rank confirms a change of speed (the history restarts from it: the suspect
        may hold both speeds), otherwise the suspect was noise and joins the history."""
        off = self._off(latest)
        if self.suspect is not None:
            if any(a == b != 0 for a, b in zip(self.suspect[2], off)):
                # the machine's noise outlives a change of speed: measured so far, it bounds the next windows
                self.noise_seen = tuple(self.rank_noise(self._models(self.history)))
                self.history, self.suspect = [latest], None
                return
            self.history.append(self.suspect[:2])
            self.suspect = None
        if any(off):
            self.suspect = (*latest, off)
        else:
            self.history.append(latest)
        self.history = self.history[-WINDOWS:]

    def _models(self, history: list[tuple[tuple[int, ...], tuple[float, ...]]]) -> list[StepModel]:
        return [fit_step_model([h[0][r] for h in history], [h[1][r] for h in history], NOISE)
                for r in range(self.size)]

    def _off(self, latest: tuple[tuple[int, ...], tuple[float, ...]]) -> tuple[int, ...]:
        """Per rank, whether its time in ``latest`` is off what the history predicts (1 above, -1 below, 0
        not): by more than ``CHANGE`` and than ``z`` times its noise (``rank_noise``) allows for a
        prediction from its windows, ``z`` growing with the ranks (3 up to 8 ranks, 4.7 at 1,000) so that
        one of many ranks off by chance stays rare. Predicted: its model where the history tested it (two
        batch sizes or more), else the mean of its windows at this batch (none: not judged)."""
        sizes, times = latest
        z = max(3.0, 1.0 + math.sqrt(2.0 * math.log(self.size)))
        models = self._models(self.history)
        noise = self.rank_noise(models)
        off = []
        for r in range(self.size):
            if len({h[0][r] for h in self.history}) >= 2:
                predicted, count = models[r](sizes[r]), len(self.history)
            else:
                same = [h[1][r] for h in self.history if h[0][r] == sizes[r]]
                if not same:
                    off.append(0)
                    continue
                predicted, count = float(np.mean(same)), len(same)
            share = (times[r] - predicted) / predicted
            limit = max(CHANGE, z * noise[r] * math.sqrt(1.0 + 1.0 / count))
            off.append(0 if abs(share) <= limit else (1 if share > 0 else -1))
        return tuple(off)

    def telemetry_fields(self) -> dict[str, Any]:
        return {"batch": self.batch_size(self.step)} if self.global_batch is not None and self.step else {}

    @property
    def label(self) -> str:
        return f"Balanced({self.rebalance_every})"

    def state_dict(self) -> dict[str, Any]:
        return dict(super().state_dict(), global_batch=self.global_batch,
                    plans={str(w): list(p) for w, p in self.plans.items()},
                    history=[[list(sizes), list(times)] for sizes, times in self.history],
                    suspect=None if self.suspect is None else [list(part) for part in self.suspect],
                    noise_seen=None if self.noise_seen is None else list(self.noise_seen))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("global_batch") is not None:
            self.global_batch = check_int("state['global_batch']", state["global_batch"], 1)
        self.plans = {int(w): tuple(p) for w, p in state.get("plans", {}).items()}
        self.history = [(tuple(sizes), tuple(times)) for sizes, times in state.get("history", [])]
        suspect = state.get("suspect")
        self.suspect = None if suspect is None else (tuple(suspect[0]), tuple(suspect[1]), tuple(suspect[2]))
        noise_seen = state.get("noise_seen")
        self.noise_seen = None if noise_seen is None else tuple(float(n) for n in noise_seen)

    def __repr__(self) -> str:
        return (f"Balanced(global_batch={self.global_batch!r}, rebalance_every={self.rebalance_every}, "
                f"max_batch={self.max_batch!r}, min_batch={self.min_batch!r})")
