"""Batch sizes that make every rank's step take the same time (``Balanced``): a linear model of each
rank's step time, fitted from what the rounds measured, and the integer split of a fixed global batch
that equalises the predicted times.

A rank's step takes ``t_i(b) = alpha_i + beta_i * b`` seconds for a batch of ``b`` samples: a fixed part
(kernel launches, the optimizer update, Python) and a part per sample (Cannikin's observation: time is
not proportional to the batch). Pure: no framework, no collective; every rank calls these with the same
numbers and gets the same answer.
"""
from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt


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


def plan_batches(global_batch: int, alpha: npt.ArrayLike, beta: npt.ArrayLike,
                 max_batch: int | None = None) -> npt.NDArray[np.int64]:
    """Integer batch sizes, one per rank, summing to ``global_batch`` (each at least 1, at most
    ``max_batch``), that minimise the longest predicted step ``alpha_i + beta_i * b_i``: every sample is
    given, one at a time, to the rank whose step it lengthens least (ties to the lower rank). The
    predicted times are non-decreasing in ``b``, so this is optimal.

    Example:
        >>> plan_batches(128, [0.0] * 4, [1.0, 1.0, 1.0, 4.0]).tolist()
        [40, 40, 39, 9]
        >>> plan_batches(128, [0.0] * 4, [1.0, 1.0, 1.0, 4.0], max_batch=36).tolist()
        [36, 36, 36, 20]
    """
    alpha, beta = np.asarray(alpha, dtype=np.float64), np.asarray(beta, dtype=np.float64)
    size = len(alpha)
    cap = global_batch if max_batch is None else max_batch
    if size * cap < global_batch or global_batch < size:
        raise ValueError(f"{global_batch} samples cannot be split into {size} batches of 1 to {cap}")
    sizes = np.ones(size, dtype=np.int64)
    heap = [(alpha[r] + beta[r] * 2, r) for r in range(size) if cap > 1]
    heapq.heapify(heap)
    for _ in range(global_batch - size):
        _, r = heapq.heappop(heap)
        sizes[r] += 1
        if sizes[r] < cap:
            heapq.heappush(heap, (alpha[r] + beta[r] * (sizes[r] + 1), r))
    return sizes


def predicted_step(alpha: npt.ArrayLike, beta: npt.ArrayLike, sizes: npt.ArrayLike) -> float:
    """The longest predicted step of a split (seconds).

    Example:
        >>> predicted_step([0.0, 0.0], [1.0, 4.0], [8, 2])
        8.0
    """
    return float(np.max(np.asarray(alpha) + np.asarray(beta) * np.asarray(sizes)))
