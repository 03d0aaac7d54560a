"""Horovod's process sets as the strategies use them: WAGMA's groups, registered before ``hvd.init``
or added to dynamic process sets, and the check of a ``process_set`` argument."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from horovod.common.process_sets import ProcessSet

from horovod_hetero.rules.grouping import process_set_ranks
from horovod_hetero.validation import check_int
from horovod_hetero.errors import troubleshooting

#: Environment variables launchers set to the world size, checked in this order.
SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")

def world_size(size: int | None = None) -> int:
    """``size`` if given, else the world size the launcher (``horovodrun``) exported."""
    if size is not None:
        return check_int("size", size, 1)
    for name in SIZE_VARIABLES:
        if os.environ.get(name):
            return check_int(name, int(os.environ[name]), 1)
    raise ValueError("wagma_process_sets() needs the world size before hvd.init(): launch with horovodrun "
                     "(it sets HOROVOD_SIZE), or pass it, e.g. wagma_process_sets(group_size=2, size=4)")

def check_process_set(process_set: object, name: str = "process_set") -> ProcessSet | None:
    """``process_set`` if it is a Horovod ``ProcessSet`` or ``None`` (all ranks), else a ``TypeError``
    naming ``name``. Only the type: membership can be checked only after ``hvd.init()``.

    Example:
        >>> check_process_set(None) is None
        True
    """
    if process_set is not None and not isinstance(process_set, ProcessSet):
        raise TypeError(f"{name} must be a horovod ProcessSet (e.g. hvd.global_process_set) or None (all ranks), "
                        f"got {process_set!r} ({type(process_set).__name__})")
    return process_set

def wagma_process_sets(group_size: int | None = None, size: int | None = None) -> list[ProcessSet]:
    """The process sets WAGMA averages over, for ``hvd.init(process_sets=...)``.

    Every group of every distinct butterfly partition, in the same order on every rank.

    Args:
        group_size: S, a power of two <= P; ``None``: the power of two nearest sqrt(P).
        size: the world size P; ``None`` reads the one ``horovodrun`` exports.

    Example::

        hvd.init(process_sets=hh.wagma_process_sets(group_size=None))
    """
    return [ProcessSet(ranks) for ranks in process_set_ranks(world_size(size), group_size)]

def registered_ids(table: Mapping[int, Sequence[int]], rank_lists: Sequence[Sequence[int]],
                   init_call: str) -> dict[tuple[int, ...], int]:
    """Map each rank list to its Horovod process-set id, or raise naming the ``hvd.init`` call.

    Args:
        table: Horovod's ``{process_set_id: ranks}`` of registered process sets.
        rank_lists: the sets a strategy needs (e.g. ``rules.grouping.process_set_ranks``).
        init_call: the call that registers them.
    """
    ids = {tuple(ranks): i for i, ranks in table.items()}
    missing = [list(ranks) for ranks in rank_lists if tuple(ranks) not in ids]
    if missing:
        raise ValueError(f"the process sets of the strategy's groups are not registered (missing {missing}); "
                         f"initialise Horovod with {init_call}, or with hvd.init(process_sets=\"dynamic\") "
                         f"(needed with hvd.elastic: its reset keeps only the global process set)\n"
                         f"{troubleshooting('troubleshooting-wagma-process-sets')}")
    return {tuple(ranks): ids[tuple(ranks)] for ranks in rank_lists}
