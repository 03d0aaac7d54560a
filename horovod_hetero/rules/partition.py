"""Epochs that fast workers can outrun: every sample once per epoch, each rank's share proportional
to its speed.

Every round carries every rank's mean step time (``RoundStats.step_s``), identical on every rank,
so ranks that have gone through the same rounds (after ``sync_model()``, at an epoch's end) hold the
same speeds and compute the same partition without a message. Pure: the samplers of the adapters
(``horovod_hetero.torch.DistributedSampler``, the Keras callback's ``epoch_indices``) call these.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt


def latest_step_times(previous: npt.ArrayLike | None, step_s: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Each rank's latest measured seconds per step: ``step_s`` where it is finite and > 0 (the rank
    stepped since the previous round), else the previous value (NaN: never measured).

    Example:
        >>> latest_step_times([0.1, 0.4], [float("nan"), 0.2]).tolist()
        [0.1, 0.2]
    """
    step_s = np.asarray(step_s, dtype=np.float64)
    previous = np.full(step_s.shape, np.nan) if previous is None else np.asarray(previous, dtype=np.float64)
    measured = np.isfinite(step_s) & (step_s > 0)
    return np.where(measured, step_s, previous)


#: the least relative gap between the slowest and the fastest rank's typical step that splits an epoch by speed
SPEED_GAP = 0.1
#: how many times a rank's measured noise (relative spread of its step time over the rounds) the gap must exceed
NOISE_FACTOR = 3.0


def speeds_differ(step_s: npt.ArrayLike, gap: float = SPEED_GAP, noise_factor: float = NOISE_FACTOR) -> bool:
    """Whether the ranks' speeds differ beyond the noise the rounds measured: ``step_s`` holds one row per
    round of every rank's seconds per step. The slowest rank's typical step (its median over the rounds)
    must exceed the fastest's by more than ``gap`` and by more than ``noise_factor`` times the largest
    relative spread (standard deviation over median) of any rank's step time over the rounds; one round
    has no spread, so only ``gap`` counts there. NaN (a rank not measured in a round) is left out.

    Example:
        >>> speeds_differ([[0.10, 0.40], [0.11, 0.41]])          # 4x slower, steady
        True
        >>> speeds_differ([[0.10, 0.104], [0.102, 0.101]])       # the same speed, within noise
        False
        >>> speeds_differ([[0.1, 0.4], [0.4, 0.1], [0.1, 0.4]])  # a straggler that moves: noise, not speed
        False
    """
    rows = np.atleast_2d(np.asarray(step_s, dtype=np.float64))
    with np.errstate(all="ignore"):
        typical = np.nanmedian(rows, axis=0)
        known = np.isfinite(typical) & (typical > 0)
        if known.sum() < 2:
            return False
        spread = np.nanstd(rows[:, known], axis=0) / typical[known] if len(rows) > 1 else np.zeros(known.sum())
    relative = typical[known].max() / typical[known].min() - 1.0
    return bool(relative > max(gap, noise_factor * float(np.nanmax(spread))))


def proportional_counts(n: int, step_s: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Split ``n`` samples into per-rank counts proportional to speed (1 / seconds per step).

    Largest remainders, ties to the lower rank, so the counts sum to ``n`` exactly and every rank
    computes the same ones. Ranks without a measurement (NaN) count as the mean speed of those with
    one; with none measured the split is even.

    Example:
        >>> proportional_counts(13, [0.1, 0.1, 0.1, 0.4]).tolist()
        [4, 4, 4, 1]
    """
    step_s = np.asarray(step_s, dtype=np.float64)
    rates = np.where(np.isfinite(step_s) & (step_s > 0), 1.0 / np.where(step_s > 0, step_s, 1.0), np.nan)
    known = np.isfinite(rates)
    rates = np.where(known, rates, rates[known].mean() if known.any() else 1.0)
    exact = n * rates / rates.sum()
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:n - counts.sum()]] += 1
    return counts


def step_times_of(step_times: Sequence[float] | npt.NDArray[np.float64] | None,
                  size: int) -> npt.NDArray[np.float64]:
    """Every rank's latest seconds per step for a split among ``size`` ranks: ``step_times`` (from
    the rounds), or NaN for each rank before any round (an even split); a ``ValueError`` when the
    rounds measured another number of ranks.

    Example:
        >>> step_times_of(None, 2).tolist(), step_times_of([0.1, 0.4], 2).tolist()
        ([nan, nan], [0.1, 0.4])
    """
    if step_times is None:
        return np.full(size, np.nan)
    if len(step_times) != size:
        raise ValueError(f"the split is for {size} ranks, but the rounds measured {len(step_times)}: "
                         f"pass the size of the process set that synchronises")
    return np.asarray(step_times, dtype=np.float64)


def epoch_indices(n: int, step_s: npt.ArrayLike, rank: int, epoch: int = 0, seed: int = 0,
                  shuffle: bool = True, multiple: int = 1) -> list[int]:
    """This rank's sample indices for ``epoch``: a contiguous share, proportional to its speed, of
    the epoch's permutation (the same permutation on every rank: ``seed`` and ``epoch``). With
    ``multiple``, every share is a whole number of ``multiple`` samples but the last rank's, which
    also takes the ``n % multiple`` left over (whole batches: only one rank's last batch is short).

    Example:
        >>> shares = [epoch_indices(10, [0.1, 0.4], r, epoch=3) for r in (0, 1)]
        >>> [len(s) for s in shares], sorted(shares[0] + shares[1]) == list(range(10))
        ([8, 2], True)
        >>> [len(epoch_indices(67, [0.1, 0.1, 0.1, 0.4], r, multiple=8)) for r in range(4)]
        [24, 16, 16, 11]
    """
    return rank_part(*epoch_split(n, step_s, epoch, seed, shuffle, multiple), rank)


def rank_part(order: npt.NDArray[np.int64], counts: npt.NDArray[np.int64], rank: int) -> list[int]:
    """Rank ``rank``'s part of ``order`` split by ``counts`` (the ``counts[rank]`` after the lower ranks').

    Example:
        >>> rank_part(np.arange(10), np.array([8, 2]), 1)
        [8, 9]
    """
    start = int(counts[:rank].sum())
    return order[start:start + counts[rank]].tolist()


def epoch_split(n: int, step_s: npt.ArrayLike, epoch: int = 0, seed: int = 0, shuffle: bool = True,
                multiple: int = 1) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The epoch's permutation and every rank's count of it (rank r takes the ``counts[r]`` after the
    lower ranks'): ``epoch_indices`` for every rank at once.

    Example:
        >>> order, counts = epoch_split(10, [0.1, 0.4], shuffle=False)
        >>> order.tolist(), counts.tolist()
        ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [8, 2])
    """
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    return order, _counts(n, step_s, multiple)


def _counts(n: int, step_s: npt.ArrayLike, multiple: int) -> npt.NDArray[np.int64]:
    """``n`` split by speed into whole ``multiple``s, the last rank taking the ``n % multiple`` left."""
    counts = proportional_counts(n // multiple, step_s) * multiple
    counts[-1] += n - counts.sum()
    return counts


def resplit_rest(order: npt.ArrayLike, counts: npt.ArrayLike, drawn: npt.ArrayLike, step_s: npt.ArrayLike,
                 rank: int, multiple: int = 1) -> list[int]:
    """This rank's rest of an epoch that began split by ``counts`` (ranks' contiguous parts of
    ``order``, e.g. evenly before any speed was measured) once every rank has drawn at least
    ``drawn[r]`` of its part: what is left, split again by speed (``step_s``), so that every rank
    ends the epoch at about the same time.

    Each rank keeps the head of what it has left, up to its new count: a rank may have drawn more
    than ``drawn`` says (a loader prefetches), and those samples stay its own. What a rank has
    left beyond its new count goes, in rank order, to the ranks whose count exceeds what they have
    left. Every sample is still drawn once, as long as no rank drew more than its new count.

    Example:
        >>> drawn = [2, 1]                    # two parts of 4; rank 1 three times slower
        >>> [resplit_rest(list(range(8)), [4, 4], drawn, [0.1, 0.3], r) for r in (0, 1)]
        [[2, 3, 6, 7], [5]]
    """
    counts, drawn = np.asarray(counts, dtype=np.int64), np.asarray(drawn, dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    rest = [np.asarray(order)[bounds[r] + drawn[r]:bounds[r + 1]].tolist() for r in range(len(counts))]
    quota = _counts(sum(len(r) for r in rest), step_s, multiple)
    keep = [min(int(q), len(r)) for q, r in zip(quota, rest)]
    spare = [i for r, k in zip(rest, keep) for i in r[k:]]
    start = int(sum(q - k for q, k in zip(quota[:rank], keep[:rank])))
    return rest[rank][:keep[rank]] + spare[start:start + int(quota[rank]) - keep[rank]]


def epoch_steps(steps: int, step_s: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Every rank's batches in an epoch that the framework caps at ``steps`` batches a rank (Keras'
    ``steps_per_epoch``): the fastest rank takes all ``steps``, every other rank as many as it takes
    in the same time (at least one), so no rank waits for another at the epoch's end. Before every
    rank's speed is known (NaN), every rank takes ``steps``.

    Example:
        >>> epoch_steps(8, [0.1, 0.1, 0.1, 0.4]).tolist(), epoch_steps(8, [0.1, float("nan")]).tolist()
        ([8, 8, 8, 2], [8, 8])
    """
    step_s = np.asarray(step_s, dtype=np.float64)
    if not (np.isfinite(step_s) & (step_s > 0)).all():
        return np.full(step_s.shape, steps, dtype=np.int64)
    return np.clip(np.rint(steps * step_s.min() / step_s), 1, steps).astype(np.int64)


def steps_per_epoch(n: int, global_batch: int) -> int:
    """Steps of an epoch of ``n`` samples in global batches of ``global_batch`` (the last one completed
    from the epoch's start).

    Example:
        >>> steps_per_epoch(10, 4)
        3
    """
    return -(-n // global_batch)


def step_batch(order: Sequence[int] | npt.NDArray[np.integer[Any]], step: int, sizes: Sequence[int],
               rank: int) -> list[int]:
    """This rank's sample indices at ``step`` (0-based, within the epoch) when every step takes
    ``sum(sizes)`` samples of the epoch's ``order`` in turn and rank r the ``sizes[r]`` after the lower
    ranks'; the epoch's last global batch is completed from the start of ``order`` (every rank takes the
    same number of steps, every sample is used, a few twice: as torch's ``DistributedSampler`` pads).

    Example:
        >>> order = list(range(10))
        >>> [step_batch(order, 2, (3, 1), r) for r in (0, 1)]
        [[8, 9, 0], [1]]
    """
    total = sum(sizes)
    start = step * total + sum(sizes[:rank])
    return [order[(start + i) % len(order)] for i in range(sizes[rank])]
