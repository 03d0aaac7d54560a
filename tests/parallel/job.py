"""One ``hvd.init`` per horovodrun job, whatever parallel files the job runs.

``make test`` runs several parallel files in one pytest session (one horovodrun job for the torch
files, one per Keras stack for the Keras files): the first file imported initialises Horovod, the
others find it initialised. Every job registers the same process sets, WAGMA's pairs
(``hh.wagma_process_sets(group_size=2)``), which the WAGMA tests need and the others do not use;
with ``HH_TEST_PROCESS_SETS=dynamic``, ``hvd.init(process_sets="dynamic")`` instead (WAGMA adds its
groups itself; ``make test-mpi`` runs test_wagma.py so).

In torch jobs every Horovod wait of the test process polls (``poll_horovod_waits``), as the library's
own waits do.
"""
import os

from horovod_hetero.common.process_sets import SIZE_VARIABLES

#: seconds a test's own Horovod wait may take before it fails by name (under pytest-timeout's 240)
WAIT_S = 200.0

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
        if hvd.__name__ == "horovod.torch":
            poll_horovod_waits()
    return _registered


def poll_horovod_waits():
    """Make every wait of ``horovod.torch`` in this process (``hvd.synchronize`` and the collectives,
    ``broadcast_object``, ``allgather_object``, the optimizer's ``synchronize()``) poll with a sleep
    before Horovod's own wait, which then returns at once.

    Horovod's wait is a loop of ``sched_yield``: with 4 ranks on CI's 2 cores, ranks waiting so keep
    the cores from the Horovod background threads that would end the wait, and Gloo's exchanges
    stall past their 30 s timeout (the library's own waits poll for that reason:
    ``horovod_hetero.torch.adapter``). Tests wait in Horovod's loop wherever they gather or
    broadcast results: the torch job failed about one run in ten, its ranks ended in such a wait.
    ``init`` calls it once per process."""
    from horovod.torch import mpi_ops

    from horovod_hetero.torch.adapter import wait_done

    lib = mpi_ops.mpi_lib
    spin = lib.horovod_torch_wait_and_clear

    def wait_and_clear(handle):
        wait_done(handle, WAIT_S, "a test's own Horovod collective")
        return spin(handle)
    lib.horovod_torch_wait_and_clear = wait_and_clear
