"""WAGMA-SGD's butterfly groups: which ranks average together at each step.

Li et al., "Breaking (Global) Barriers in Parallel Stochastic Optimization with
Wait-Avoiding Group Averaging" (WAGMA-SGD). The paper's listing shifts its mask cumulatively
and yields groups of the wrong size; the intended rule, which matches its worked example, is:
with ``shift = (t * log2 S) mod log2 P``, phase r (0-based, r < log2 S) pairs rank p with
``p XOR (1 << ((shift + r) mod log2 P))``. A group is everything reachable in those phases.
"""
import math

from horovod_hetero.common.validation import check_int


def _log2(name, value, hint):
    value = check_int(name, value, 1)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two, got {value}; {hint}")
    return value.bit_length() - 1


def check_sizes(P, S):
    """Validate world size P and group size S; return (log2 P, log2 S)."""
    lp = _log2("P", P, "WAGMA's butterfly groups need 1, 2, 4, 8, ... workers: launch a power-of-two "
                       "number of processes, or use LocalSGD for other sizes")
    near = nearest_group_size(P)
    ls = _log2("S", S, f"use a power of two <= {P}, e.g. {near} (the power of two nearest sqrt(P))")
    if S > P:
        raise ValueError(f"S (group size) must be <= P = {P}, got {S}; e.g. S = {near}")
    return lp, ls


def nearest_group_size(P):
    """The power of two nearest sqrt(P), the group size the WAGMA paper recommends.

    For an odd power of two P, sqrt(P) lies halfway (in log scale) between two powers of two;
    the larger is taken, since larger groups mix models faster.

    Example:
        >>> [nearest_group_size(p) for p in (1, 2, 4, 8, 16)]
        [1, 2, 2, 4, 4]
    """
    return 1 << math.ceil(math.log2(P) / 2) if P >= 1 else 1


def butterfly_groups(P, S, t):
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
    lp, ls = check_sizes(P, S)
    t = check_int("t", t, 0)
    if lp == 0:
        return [(0,)]
    shift = (t * ls) % lp
    masks = [0]
    for r in range(ls):
        bit = 1 << ((shift + r) % lp)
        masks += [m | bit for m in masks]
    groups = {tuple(sorted(p ^ m for m in masks)) for p in range(P)}
    return sorted(groups)


def distinct_partitions(P, S):
    """Every distinct partition ``butterfly_groups`` produces, in order of first use.

    Register each group of each partition as a Horovod process set once, at start-up, in the
    same order on every rank. Step t uses ``partition_index(P, S, t)``.

    Example:
        >>> distinct_partitions(8, 4)
        [[(0, 1, 2, 3), (4, 5, 6, 7)], [(0, 1, 4, 5), (2, 3, 6, 7)], [(0, 2, 4, 6), (1, 3, 5, 7)]]
    """
    lp, _ = check_sizes(P, S)
    out = []
    for t in range(max(1, lp)):
        groups = butterfly_groups(P, S, t)
        if groups not in out:
            out.append(groups)
    return out


def partition_index(P, S, t):
    """Index into ``distinct_partitions(P, S)`` of the partition used at step ``t``."""
    return distinct_partitions(P, S).index(butterfly_groups(P, S, t))
