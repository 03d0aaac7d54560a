"""WAGMA's Horovod process sets, shared by the PyTorch and Keras adapters.

Horovod's ``ProcessSet`` class is framework-independent (``horovod.torch`` and
``horovod.tensorflow`` re-export the same one), so one implementation serves both.
"""
from horovod.common.process_sets import ProcessSet

from horovod_hetero.common.wagma import process_set_ranks, registered_ids, world_size


def wagma_process_sets(group_size=None, size=None):
    """The process sets WAGMA averages over, for ``hvd.init(process_sets=...)``.

    Every group of every distinct butterfly partition, in the same order on every rank.

    Args:
        group_size: S, a power of two <= P; ``None``: the power of two nearest sqrt(P).
        size: the world size P; ``None`` reads the one ``horovodrun`` exports.

    Example::

        hvd.init(process_sets=hh.wagma_process_sets(group_size=None))
    """
    return [ProcessSet(ranks) for ranks in process_set_ranks(world_size(size), group_size)]


def registered_sets(basics, rank_lists, init_call):
    """``{tuple(ranks): ProcessSet}`` for the registered sets, from the framework's Horovod ``basics``;
    ``ValueError`` naming ``init_call`` if any is missing."""
    out = {}
    for ranks, set_id in registered_ids(basics._get_process_set_ids_and_ranks(), rank_lists, init_call).items():
        out[ranks] = ps = ProcessSet(list(ranks))
        ps.process_set_id = set_id
    return out
