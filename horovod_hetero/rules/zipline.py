"""ZipLine: the synchronisation barrier of ElasticBSP that minimises the workers' total waiting.

Zhao et al., "ElasticBSP: Elastic Bulk Synchronous Parallel for distributed deep learning"
(ZipLine, Problem 1 and Corollary 1). Given each worker's predicted next R iteration end times
(an n x R matrix, rows sorted), pick one end time per worker so that ``max - min`` (the wait
d_Z of the fastest worker) is minimal; among optimal choices take the one with the earliest
barrier ``t_sync = max``, which keeps gradients least stale.

``zipline`` is the fast, vectorised solver; ``zipline_opt`` (the paper's ZipLineOpt) and
``full_grid_scan`` are reference implementations for tests and ``horovod-hetero benchmark zipline``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from horovod_hetero.validation import check_int


@dataclass(frozen=True)
class ZipLineResult:
    """The chosen barrier.

    Attributes:
        steps: per worker, the chosen future iteration (1..R): the number of iterations it runs
            before the barrier.
        t_sync: the barrier time, the latest chosen end time.
        wait: ``t_sync`` minus the earliest chosen end time (the paper's d_Z).
    """

    steps: np.ndarray
    t_sync: float
    wait: float


def predict_ends(last_end: npt.ArrayLike, interval: npt.ArrayLike, R: int) -> npt.NDArray[np.float64]:
    """Predicted end times of each worker's next ``R`` iterations: ``last_end[p] + i*interval[p]``.

    The paper's lookahead: ``interval`` is the distance between a worker's two latest pushes.

    Args:
        last_end: length-n array of the workers' latest iteration end times.
        interval: length-n array of the workers' iteration intervals (>= 0).
        R: lookahead, an int >= 1.

    Returns:
        n x R float array; row p is ``last_end[p] + interval[p] * [1, 2, ..., R]``.

    Example:
        >>> predict_ends([0.0, 1.0], [2.0, 3.0], R=2).tolist()
        [[2.0, 4.0], [4.0, 7.0]]
    """
    R = check_int("R", R, 1)
    last_end = _vector("last_end", last_end)
    interval = _vector("interval", interval)
    if last_end.shape != interval.shape:
        raise ValueError(f"last_end and interval must have the same length, got {last_end.size} and {interval.size}")
    if (interval < 0).any():
        raise ValueError(f"interval must be >= 0 for every worker; worker {int(np.argmax(interval < 0))} has "
                         f"{interval[interval < 0][0]!r}")
    return last_end[:, None] + interval[:, None] * np.arange(1, R + 1, dtype=np.float64)


def _vector(name: str, values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-d sequence of numbers, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    return arr


def check_ends(ends: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Validate an n x R matrix of end times (finite, each row sorted); return it as float64."""
    ends = np.asarray(ends, dtype=np.float64)
    if ends.ndim != 2 or ends.shape[0] == 0 or ends.shape[1] == 0:
        raise ValueError(f"ends must be a non-empty n x R matrix (n workers, R >= 1 end times), got shape {ends.shape}")
    if not np.isfinite(ends).all():
        raise ValueError("ends must be finite (no NaN or inf)")
    if ends.shape[1] > 1:
        bad = np.diff(ends, axis=1) < 0
        if bad.any():
            raise ValueError(f"each row of ends must be sorted ascending; row {int(np.argmax(bad.any(axis=1)))} is not")
    return ends


def _result(ends: npt.NDArray[np.float64], steps: np.ndarray) -> ZipLineResult:
    chosen = ends[np.arange(ends.shape[0]), steps - 1]
    t_sync = float(chosen.max())
    return ZipLineResult(steps=steps, t_sync=t_sync, wait=t_sync - float(chosen.min()))


def _first_at_or_after(ends: npt.NDArray[np.float64], t: float) -> np.ndarray:
    """Per worker, the 0-based index of its first end time >= t (R if none)."""
    return (ends < t).sum(axis=1)


def _wait_bound(ends: npt.NDArray[np.float64], ts: npt.NDArray[np.float64]) -> float:
    """Upper bound on the optimal wait: for each t <= L, every worker's first end time >= t is a
    feasible window whose wait is at most its maximum minus t. Vectorised over the ts."""
    idx = (ends[None] < ts[:, None, None]).sum(axis=2)          # len(ts) x n, all < R as t <= L
    return float((np.take_along_axis(ends, idx.T, axis=1).max(axis=0) - ts).min())


def zipline(ends: npt.ArrayLike) -> ZipLineResult:
    """Optimal ElasticBSP barrier for predicted end times, earliest among optima (vectorised).

    For a candidate window minimum t every worker takes its first end time >= t; as t sweeps
    the merged timeline that window's maximum can only grow, by the successor of each element
    passed, so all candidates are one sort plus a running maximum. Only end times that can
    still be the minimum of an optimal window are sorted: every window's maximum is at least
    M0 (the latest first end time), so with D the wait of a feasible window, minima below
    M0 - D cannot be optimal, and none can exceed L (the earliest last end time).

    Args:
        ends: n x R matrix, row p the sorted predicted end times of worker p's next R iterations.

    Returns:
        ``ZipLineResult(steps, t_sync, wait)``.

    Example:
        >>> r = zipline([[1.0, 2.0, 3.0], [2.9, 5.8, 8.7]])
        >>> r.steps.tolist(), r.t_sync, round(r.wait, 6)
        ([3, 1], 3.0, 0.1)
    """
    ends = check_ends(ends)
    first_max, last_min = ends[:, 0].max(), ends[:, -1].min()
    # two feasible windows bound the optimal wait: minimum L (always feasible), and M0 if <= L
    # (probing more minima tightens the bound but costs more than the sort it saves)
    bound = _wait_bound(ends, np.array([min(first_max, last_min), last_min]))
    # widen by a few ulps so rounding in M0 - D never drops a minimum (extra ones are harmless)
    low = min(first_max - bound - 4 * np.spacing(max(abs(first_max), bound)), last_min)
    flat = ends.ravel()
    successor = np.empty_like(ends)
    successor[:, :-1] = ends[:, 1:]
    successor[:, -1] = np.inf                                   # past a row's last: no window
    succ = successor.ravel()
    keep = (flat >= low) & (flat <= last_min)
    before = flat < low
    start = max(first_max, succ[before].max()) if before.any() else first_max
    cand, cand_succ = flat[keep], succ[keep]                    # row-major: ties by worker id
    order = np.argsort(cand, kind="stable")
    lows, passed = cand[order], cand_succ[order]
    top = np.empty(lows.size)
    top[0] = start
    np.maximum.accumulate(np.maximum(passed[:-1], start), out=top[1:])
    waits = top - lows                                          # inf once a row is exhausted
    best = np.flatnonzero(waits == waits.min())
    k = best[np.argmin(top[best])]                              # earliest t_sync among optima
    return _result(ends, _first_at_or_after(ends, lows[k]) + 1)


def zipline_opt(ends: npt.ArrayLike) -> ZipLineResult:
    """The paper's ZipLineOpt (reference): scan the merged timeline keeping Z in arrival order.

    O(nR log nR) for the merge plus O(n) per replacement; a plain Python loop, kept to test
    and benchmark ``zipline`` against.
    """
    ends = check_ends(ends)
    n, R = ends.shape
    order = np.argsort(ends.ravel(), kind="stable")
    z: list[tuple[float, int, int]] = []               # (time, worker, index) in arrival order
    best: tuple[float, list[int]] | None = None
    for flat_index in order.tolist():
        p, i = divmod(flat_index, R)
        t = float(ends[p, i])
        if z and z[0][1] == p:                         # case (i): the oldest has the same colour
            z.pop(0)
            z.append((t, p, i))
            if len(z) == n and (best is None or t - z[0][0] < best[0]):
                best = (t - z[0][0], [e[2] for e in sorted(z, key=lambda e: e[1])])
            continue
        for j, e in enumerate(z):                      # case (ii): remove this worker's element
            if e[1] == p:
                del z[j]
                break
        z.append((t, p, i))
        if len(z) == n and best is None:               # the first full Z (Theorem 3 prunes the rest)
            best = (t - z[0][0], [e[2] for e in sorted(z, key=lambda e: e[1])])
    assert best is not None                            # every worker's first end time makes a full Z
    return _result(ends, np.array(best[1]) + 1)


def full_grid_scan(ends: npt.ArrayLike) -> ZipLineResult:
    """FullGridScan (reference): every end time as the window minimum, every other worker its
    first end time at or after it; exact, O(n^2 R log R)."""
    ends = check_ends(ends)
    n, R = ends.shape
    best = None
    for q in range(n):
        for i in range(R):
            t = ends[q, i]
            idx = np.array([np.searchsorted(ends[p], t, side="left") for p in range(n)])
            if (idx >= R).any():
                continue
            top = ends[np.arange(n), idx].max()
            key = (top - t, top)
            if best is None or key < best[0]:
                best = (key, idx + 1)
    assert best is not None                # the earliest last end time is a feasible window minimum
    return _result(ends, best[1])


def brute_force(ends: npt.ArrayLike) -> ZipLineResult:
    """Every one of the R^n choices (tests only): minimal wait, then earliest t_sync."""
    ends = check_ends(ends)
    n, R = ends.shape
    best = None
    for choice in itertools.product(range(R), repeat=n):
        chosen = ends[np.arange(n), choice]
        key = (chosen.max() - chosen.min(), chosen.max())
        if best is None or key < best[0]:
            best = (key, np.array(choice) + 1)
    assert best is not None                # R >= 1: there is a choice
    return _result(ends, best[1])
