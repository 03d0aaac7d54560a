"""One ``hvd.init`` per horovodrun job, whatever parallel files the job runs.

``make test`` runs several parallel files in one pytest session (one horovodrun job for the torch
files, one per Keras stack for the Keras files): the first file imported initialises Horovod, the
others find it initialised. Every job registers the same process sets, WAGMA's pairs
(``hh.wagma_process_sets(group_size=2)``), which the WAGMA tests need and the others do not use;
with ``HH_TEST_PROCESS_SETS=dynamic``, ``hvd.init(process_sets="dynamic")`` instead (WAGMA adds its
groups itself; ``make test-mpi`` runs test_wagma.py so).
"""
import os

from horovod_hetero.common.process_sets import SIZE_VARIABLES

#: hvd.init(process_sets="dynamic") in this job
DYNAMIC = os.environ.get("HH_TEST_PROCESS_SETS") == "dynamic"
_registered = None


def init(hvd, hh):
    """``hvd.init`` of this framework once per process; the process sets it registered ([] if dynamic)."""
    global _registered
    if _registered is None:
        # outside a launcher (pytest collecting these files alone: conftest.py skips them) one rank, no sets
        launched = any(os.environ.get(name) for name in SIZE_VARIABLES)
        sets = hh.wagma_process_sets(group_size=2) if launched and not DYNAMIC else []
        hvd.init(process_sets="dynamic" if DYNAMIC else sets)
        _registered = sets
    return _registered
