"""WAGMA-SGD's butterfly groups: which ranks average together at each step.

Li et al., "Breaking (Global) Barriers in Parallel Stochastic Optimization with
Wait-Avoiding Group Averaging" (WAGMA-SGD). The paper's listing shifts its mask cumulatively
and yields groups of the wrong size; the intended rule, which matches its worked example, is:
with ``shift = (t * log2 S) mod log2 P``, phase r (0-based, r < log2 S) pairs rank p with
``p XOR (1 << ((shift + r) mod log2 P))``. A group is everything reachable in those phases.
"""
from __future__ import annotations

import functools
import math

from horovod_hetero.validation import check_int


def _log2(name: str, value: int, hint: str) -> int:
    value = check_int(name, value, 1)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two, got {value}; {hint}")
    return value.bit_length() - 1


def check_sizes(P: int, S: int) -> tuple[int, int]:
    """Validate world size P and group size S; return (log2 P, log2 S)."""
    lp = _log2("P", P, "WAGMA's butterfly groups need 1, 2, 4, 8, ... workers: launch a power-of-two "
                       "number of processes, or use LocalSGD for other sizes")
    near = nearest_group_size(P)
    ls = _log2("S", S, f"use a power of two <= {P}, e.g. {near} (the power of two nearest sqrt(P))")
    if S > P:
        raise ValueError(f"S (group size) must be <= P = {P}, got {S}; e.g. S = {near}")
    return lp, ls


def nearest_group_size(P: int) -> int:
    """The power of two nearest sqrt(P), the group size the WAGMA paper recommends.

    For an odd power of two P, sqrt(P) lies halfway (in log scale) between two powers of two;
    the larger is taken, since larger groups mix models faster.

    Example:
        >>> [nearest_group_size(p) for p in (1, 2, 4, 8, 16)]
        [1, 2, 2, 4, 4]
    """
    return 1 << math.ceil(math.log2(P) / 2) if P >= 1 else 1


def butterfly_groups(P: int, S: int, t: int) -> list[tuple[int, ...]]:
    """Partition of ranks 0..P-1 into P/S groups of size S for step ``t``.

    Args:
        P: number of ranks, a power of two.
        S: group size, a power of two <= P.
        t: the step (int >= 0); groups change every step and repeat after log2 P steps at most.

    Returns:
        A list of P/S sorted tuples, ordered by their smallest rank.

    Example (the paper's):
        >>> butterfly_groups(8, 4, 0)
        [(0, 1, 2, 3), (4, 5, 6, 7)]
        >>> butterfly_groups(8, 4, 1)
        [(0, 1, 4, 5), (2, 3, 6, 7)]
    """
    masks = _masks(P, S, t)
    groups: list[tuple[int, ...]] = []
    placed: set[int] = set()
    for p in range(P):                    # each group built once, from its smallest rank
        if p not in placed:
            group = tuple(sorted(map(p.__xor__, masks)))
            placed.update(group)
            groups.append(group)
    return groups


def butterfly_group(P: int, S: int, t: int, rank: int) -> tuple[int, ...]:
    """The group of ``rank`` in ``butterfly_groups(P, S, t)``, in O(S) instead of O(P S).

    Example:
        >>> butterfly_group(8, 4, 1, rank=5)
        (0, 1, 4, 5)
    """
    rank = check_int("rank", rank, 0, P - 1)
    return tuple(sorted(map(rank.__xor__, _masks(P, S, t))))


def _masks(P: int, S: int, t: int) -> tuple[int, ...]:
    """XOR masks reaching a rank's group members at step t: phase r flips bit (shift + r) mod log2 P."""
    lp, ls = check_sizes(P, S)
    t = check_int("t", t, 0)
    return _shifted_masks(lp, ls, (t * ls) % lp if lp else 0)


@functools.lru_cache(maxsize=256)
def _shifted_masks(lp: int, ls: int, shift: int) -> tuple[int, ...]:
    if lp == 0:
        return (0,)
    masks = [0]
    for r in range(ls):
        bit = 1 << ((shift + r) % lp)
        masks += [m | bit for m in masks]
    return tuple(masks)


def distinct_partitions(P: int, S: int) -> list[list[tuple[int, ...]]]:
    """Every distinct partition ``butterfly_groups`` produces, in order of first use.

    Register each group of each partition as a Horovod process set once, at start-up, in the
    same order on every rank. Step t uses ``partition_index(P, S, t)``.

    Example:
        >>> distinct_partitions(8, 4)
        [[(0, 1, 2, 3), (4, 5, 6, 7)], [(0, 1, 4, 5), (2, 3, 6, 7)], [(0, 2, 4, 6), (1, 3, 5, 7)]]
    """
    lp, _ = check_sizes(P, S)
    out: list[list[tuple[int, ...]]] = []
    for t in range(max(1, lp)):
        groups = butterfly_groups(P, S, t)
        if groups not in out:
            out.append(groups)
    return out


def partition_index(P: int, S: int, t: int) -> int:
    """Index into ``distinct_partitions(P, S)`` of the partition used at step ``t``."""
    return distinct_partitions(P, S).index(butterfly_groups(P, S, t))


def resolve_group_size(group_size: int | None, size: int) -> int:
    """The group size S for world size P=``size``: ``None`` gives the power of two nearest sqrt(P).

    Example:
        >>> resolve_group_size(None, 16), resolve_group_size(2, 16)
        (4, 2)
    """
    S = nearest_group_size(size) if group_size is None else check_int("group_size", group_size, 1)
    check_sizes(size, S)
    return S


def process_set_ranks(size: int, group_size: int | None = None) -> list[list[int]]:
    """Rank lists of every group of every distinct butterfly partition, to register once.

    Groups of one rank and the group of all ranks (the global process set) are left out.

    Example:
        >>> process_set_ranks(4, 2)
        [[0, 1], [2, 3], [0, 2], [1, 3]]
    """
    return [list(g) for g in group_process_sets(size, resolve_group_size(group_size, size))]


@functools.lru_cache(maxsize=16)
def group_process_sets(size: int, S: int) -> tuple[tuple[int, ...], ...]:
    """``process_set_ranks`` as a tuple of tuples, computed once per (P, S): every rank of a job (and
    every simulated worker) asks for the same sets."""
    return tuple(g for part in distinct_partitions(size, S) for g in part if 1 < len(g) < size)
