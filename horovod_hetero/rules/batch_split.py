"""Batch sizes that make every rank's step take the same time (``Balanced``): a model of each rank's
step time, fitted from what the rounds measured, and the integer split of a fixed global batch that
equalises the predicted times.

A rank's step takes ``t(b) = max(floor, alpha + beta * b)`` seconds for a batch of ``b`` samples
(``StepModel``): a fixed part (kernel launches, the optimizer update, Python) and a part per sample
(Cannikin's observation: time is not proportional to the batch), and, where a step does not get
longer below some batch (a GPU below saturation, a padded step), a floor: flat up to a knee, linear
after it. Pure: no framework, no collective; every rank calls these with the same numbers and gets the
same answer.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

#: The share of a step's time that measurements are assumed to vary by, at least (window medians on a
#: shared machine): a rise smaller than this over the measured batches is no rise, and a plan must
#: promise a step shorter by more than this share to replace the one in use.
NOISE = 0.05
#: A knee (flat, then linear) replaces the straight line only where it leaves at most this share of
#: the line's squared error.
KNEE_GAIN = 0.25
#: Ranks whose predicted step times differ by at most this many of their combined standard errors are
#: not told apart (``alike``).
ALIKE_Z = 3.0


@dataclass(frozen=True)
class StepModel:
    """A rank's predicted step time, ``max(floor, alpha + beta * b)`` seconds for a batch of ``b``
    (non-decreasing in ``b``: ``beta >= 0``).

    Example:
        >>> StepModel(alpha=-0.1, beta=0.005, floor=0.1)(25), StepModel(-0.1, 0.005, 0.1)(100)
        (0.1, 0.4)
    """

    alpha: float
    beta: float
    floor: float = 0.0

    def __call__(self, batch: float) -> float:
        return max(self.floor, self.alpha + self.beta * batch)


def fit_step_time(batches: npt.ArrayLike, seconds: npt.ArrayLike) -> tuple[float, float]:
    """``(alpha, beta)``: the least-squares line ``seconds = alpha + beta * batch`` through one rank's
    measurements (lists of the same length). With one batch size only (or a line that would have a
    negative part) the time is taken as proportional to the batch (``alpha = 0``, ``beta`` the least
    squares through the origin); ``beta`` is always > 0.

    Example:
        >>> fit_step_time([8, 16, 32], [0.05, 0.07, 0.11])
        (0.03, 0.0025)
        >>> fit_step_time([16, 16], [0.08, 0.08])
        (0.0, 0.005)
    """
    b, t = np.asarray(batches, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if b.size and np.ptp(b) > 0:
        beta, alpha = np.polyfit(b, t, 1)
        if alpha >= 0 and beta > 0:
            return round(float(alpha), 12), round(float(beta), 12)
    beta = float((b * t).sum() / (b * b).sum()) if b.size else 0.0
    return 0.0, round(max(beta, 1e-12), 12)


def fit_step_model(batches: npt.ArrayLike, seconds: npt.ArrayLike, noise: float = NOISE) -> StepModel:
    """The ``StepModel`` of one rank's measurements (window medians: batch sizes and seconds per step).

    - One batch size measured: time proportional to the batch (a hypothesis the next windows test).
    - The step time does not rise over the measured batches by more than the noise (``noise`` of the
      mean time, or the line's own scatter if larger): flat, the mean time, up to the largest batch
      measured, and proportional to the batch beyond it (nothing beyond was seen).
    - Three batch sizes or more, and a knee (flat up to one of the measured sizes, linear after it)
      that leaves at most ``KNEE_GAIN`` of the line's squared error: that knee.
    - Else the least-squares line (``fit_step_time``).

    Example:
        >>> fit_step_model([32, 9], [0.4, 0.41])                       # a padded step: flat, then proportional
        StepModel(alpha=0.0, beta=0.01265625, floor=0.405)
        >>> fit_step_model([16, 32, 64], [0.1, 0.1, 0.3])               # flat up to 32, then linear
        StepModel(alpha=-0.1, beta=0.00625, floor=0.1)
    """
    b, t = np.asarray(batches, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    sizes = np.unique(b)
    if sizes.size < 2:
        alpha, beta = fit_step_time(b, t)
        return StepModel(alpha, beta)
    slope, intercept = np.polyfit(b, t, 1)
    line_sse = float(((intercept + slope * b - t) ** 2).sum())
    scatter = float(np.sqrt(line_sse / max(b.size - 2, 1)))
    if slope * np.ptp(b) <= max(noise * float(t.mean()), scatter):
        level, top = float(t.mean()), float(b.max())
        return StepModel(0.0, round(level / top, 12), round(level, 12))
    if sizes.size >= 3:
        knees = []
        for knee in sizes[1:-1]:
            design = np.stack([np.ones_like(b), np.maximum(0.0, b - knee)], axis=1)
            (level, rise), *_ = np.linalg.lstsq(design, t, rcond=None)
            sse = float(((design @ np.array([level, rise]) - t) ** 2).sum())
            if level > 0 and rise > 0:
                knees.append((sse, float(knee), float(level), float(rise)))
        if knees:
            sse, knee, level, rise = min(knees)
            if sse <= KNEE_GAIN * line_sse:
                return StepModel(round(level - rise * knee, 12), round(rise, 12), round(level, 12))
    alpha, beta = fit_step_time(b, t)
    return StepModel(alpha, beta)


def alike(predicted: Sequence[float], errors: Sequence[float], z: float = ALIKE_Z) -> list[tuple[int, ...]]:
    """Groups of ranks the measurements cannot tell apart. ``predicted``: each rank's predicted step time
    at one batch size (> 0); ``errors``: the relative standard error of each prediction. In order of
    prediction, a rank joins the group of the fastest rank before it if its time exceeds that rank's by
    at most ``z`` times their combined error (``hypot``), else it starts a group.

    Example:
        >>> alike([0.031, 0.025, 0.12, 0.04], [0.1] * 4)            # 3 x hypot(0.1, 0.1) = 42 %
        [(0, 1), (2,), (3,)]
    """
    groups: list[list[int]] = []
    for r in sorted(range(len(predicted)), key=lambda r: (predicted[r], r)):
        if groups:
            first = groups[-1][0]
            rise = (predicted[r] - predicted[first]) / max(predicted[first], 1e-12)
            if rise <= z * math.hypot(errors[first], errors[r]):
                groups[-1].append(r)
                continue
        groups.append([r])
    return sorted(tuple(sorted(g)) for g in groups)


def plan_split(global_batch: int, models: Sequence[StepModel], min_batch: int = 1,
               max_batch: int | None = None) -> npt.NDArray[np.int64]:
    """Integer batch sizes, one per rank, summing to ``global_batch`` (each ``min_batch`` to
    ``max_batch``), that minimise the longest predicted step, and among those the most even split.

    The least longest step: every sample is given, one at a time, to the rank whose step it lengthens
    least (ties to the lower rank); the predicted times are non-decreasing in ``b``, so this is optimal.
    Then each rank may take as many samples as keep its step within that time, and the samples are
    shared as evenly as these bounds allow (``even_within``): a rank whose step does not grow with its
    batch (a floor, a padded step) keeps its share instead of the few samples that the first pass left it.

    Example:
        >>> plan_split(128, [StepModel(0.0, 1.0)] * 3 + [StepModel(0.0, 4.0)]).tolist()
        [40, 39, 39, 10]
        >>> plan_split(128, [StepModel(0.0, 1.0)] * 3 + [StepModel(0.0, 4.0)], max_batch=36).tolist()
        [36, 36, 36, 20]
        >>> plan_split(128, [StepModel(0.0, 0.004, 0.1)] * 3 + [StepModel(0.0, 0.016, 0.4)]).tolist()
        [35, 34, 34, 25]
    """
    size = len(models)
    cap = global_batch if max_batch is None else max_batch
    if size * cap < global_batch or size * min_batch > global_batch or min_batch > cap:
        raise ValueError(f"{global_batch} samples cannot be split into {size} batches of {min_batch} to {cap}")
    sizes = np.full(size, min_batch, dtype=np.int64)
    heap = [(models[r](min_batch + 1), r) for r in range(size) if cap > min_batch]
    heapq.heapify(heap)
    for _ in range(global_batch - size * min_batch):
        _, r = heapq.heappop(heap)
        sizes[r] += 1
        if sizes[r] < cap:
            heapq.heappush(heap, (models[r](sizes[r] + 1), r))
    longest = longest_step(models, sizes.tolist())
    bounds = [max(int(b), largest_batch(m, longest, cap)) for m, b in zip(models, sizes)]
    return even_within(global_batch, bounds, min_batch)


def largest_batch(model: StepModel, seconds: float, cap: int) -> int:
    """The largest batch, at most ``cap``, whose predicted step takes at most ``seconds`` (0 if none).

    Example:
        >>> largest_batch(StepModel(0.0, 0.004, 0.1), 0.4, 128), largest_batch(StepModel(0.0, 0.0, 0.1), 0.4, 64)
        (100, 64)
    """
    if model.floor > seconds * (1 + 1e-9):
        return 0
    if model.beta <= 0:
        return cap if model.alpha <= seconds * (1 + 1e-9) else 0
    return int(min(cap, max(0, np.floor((seconds - model.alpha) / model.beta * (1 + 1e-9) + 1e-9))))


def even_within(total: int, bounds: Sequence[int], low: int) -> npt.NDArray[np.int64]:
    """``total`` samples in batches of ``low`` to ``bounds[r]``, as even as the bounds allow: one at a
    time to the smallest batch below its bound (ties to the lower rank). ``sum(bounds) >= total``.

    Example:
        >>> even_within(128, [100, 100, 100, 25], 2).tolist()
        [35, 34, 34, 25]
    """
    sizes = np.full(len(bounds), low, dtype=np.int64)
    heap = [(low, r) for r in range(len(bounds)) if bounds[r] > low]
    heapq.heapify(heap)
    for _ in range(total - low * len(bounds)):
        b, r = heapq.heappop(heap)
        sizes[r] = b + 1
        if b + 1 < bounds[r]:
            heapq.heappush(heap, (b + 1, r))
    return sizes


def longest_step(models: Sequence[StepModel], sizes: Sequence[int]) -> float:
    """The longest predicted step of a split (seconds).

    Example:
        >>> longest_step([StepModel(0.0, 1.0), StepModel(0.0, 0.0, 5.0)], [8, 2])
        8.0
    """
    return max(model(b) for model, b in zip(models, sizes))


def choose_split(global_batch: int, models: Sequence[StepModel], current: Sequence[int], even: Sequence[int],
                 min_batch: int = 1, max_batch: int | None = None, noise: float = NOISE) -> tuple[int, ...]:
    """The split to use next: the best one (``plan_split``) if it promises a longest step shorter than
    the ``current`` one's by more than ``noise`` of it; else the ``even`` split if it promises no
    longer a step than the current one (up to that noise: where the batch does not explain the step
    time, the even split stays); else the best one if it promises no longer a step and is closer to
    even (a move toward even costs nothing); else the current one (no move that noise could explain).
    A current split outside ``min_batch``-``max_batch`` is replaced by the best one.

    Example:
        >>> flat = [StepModel(0.0, 0.1 / 40, 0.1)] * 3 + [StepModel(0.0, 0.4 / 32, 0.4)]
        >>> choose_split(128, flat, current=(40, 39, 39, 10), even=(32, 32, 32, 32))
        (32, 32, 32, 32)
    """
    best = tuple(int(b) for b in plan_split(global_batch, models, min_batch, max_batch))
    if min(current) < min_batch or (max_batch is not None and max(current) > max_batch):
        return best
    now, fastest = longest_step(models, current), longest_step(models, best)
    margin = noise * now
    if now - fastest > margin:
        return best
    if longest_step(models, even) <= now + margin:
        return tuple(even)

    def uneven(split: Sequence[int]) -> int:
        return sum(abs(b - e) for b, e in zip(split, even))
    if fastest <= now + margin and uneven(best) < uneven(current):
        return best
    return tuple(current)
