"""WAGMA's Horovod process sets, shared by the PyTorch and Keras adapters.

Horovod's ``ProcessSet`` class is framework-independent (``horovod.torch`` and
``horovod.tensorflow`` re-export the same one), so one implementation serves both.
"""
from horovod.common.process_sets import ProcessSet

from horovod_hetero.common.controller import call_with_timeout
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


class GroupOpsBase:
    """The framework-independent half of an adapter's WAGMA ``group_ops`` (contract in ``HeteroController``).

    Subclasses set ``hvd`` (``horovod.torch`` or ``horovod.tensorflow``) and add ``current``,
    ``snapshot``, ``allreduce`` and ``assign`` over ``self.model`` (the tensors or variables).
    """

    hvd = None

    def __init__(self, model, process_set, timeout):
        self.model, self.process_set, self.timeout = model, process_set, timeout
        self._sets = {}

    def allgather(self, obj):
        return call_with_timeout(lambda: self.hvd.allgather_object(obj, name="horovod_hetero.allgather"),
                                 self.timeout, "the exchange of WAGMA's activation addresses")

    def require_process_sets(self, rank_lists, init_call):
        if self.process_set not in (None, self.hvd.global_process_set):
            raise ValueError("WAGMA averages over all ranks: leave process_set at its default, "
                             "hvd.global_process_set")
        self._sets = registered_sets(self.hvd.mpi_ops._basics, rank_lists, init_call)
