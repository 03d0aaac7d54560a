"""Parallel tests run under ``horovodrun -np 4 --gloo`` (some also under ``horovodrun --mpi`` and
``mpirun``: ``make test-mpi``): every rank runs every test in order.

Tests do all their collectives first and assert afterwards, so a failing rank does not leave
the others waiting in a collective; pytest-timeout bounds anything that still hangs.

A rank's failure is written to the job's stderr when it happens, and so is every way the library
ends a process itself (its GIL watchdog, its C++ terminate handler): a job that loses a rank is
killed before pytest's summary, and the library ends a process with ``os._exit``, so under pytest's
capture none of them would leave a trace.
"""
import contextlib
import faulthandler
import os
import signal
import sys

import pytest

#: the job's own stderr (horovodrun's pipe), kept before pytest's capture covers it
_stderr = []


def pytest_configure(config):
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        return
    with capman.global_and_fixture_disabled():
        _stderr.append(os.fdopen(os.dup(2), "w", buffering=1))
    # common.failures.guard_gil's faulthandler watchdog dumps every thread to sys.__stderr__, then exits
    sys.__stderr__ = _stderr[0]
    # horovodrun ends the other ranks of a job that lost one with SIGTERM: say where each one was
    faulthandler.register(signal.SIGTERM, file=_stderr[0], all_threads=True, chain=True)
    # the terminate handler and the MPI shutdown bound print to sys.stderr (captured), then os._exit
    from horovod_hetero.common import failures
    exit_now = failures._exit_now

    def exit_now_said():
        _stderr[0].write(f"rank {_rank()}: horovod_hetero ends this process (os._exit(1)): "
                         f"{failures.background_failure.reason}; every thread:\n")
        faulthandler.dump_traceback(file=_stderr[0], all_threads=True)
        # what the test printed, Horovod's own log (the Gloo error) included: pytest holds it
        with contextlib.suppress(Exception):
            captured = capman.read_global_capture()
            _stderr[0].write(f"rank {_rank()}: its captured output:\n{captured.out[-4000:]}{captured.err[-4000:]}\n")
        exit_now()
    failures._exit_now = exit_now_said


def _rank():
    return os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))


def pytest_runtest_logreport(report):
    if report.failed and _stderr:
        _stderr[0].write(f"FAILED on rank {_rank()}: {report.nodeid} ({report.when})\n{report.longreprtext}\n")


def pytest_collection_modifyitems(config, items):
    # horovodrun --gloo exports HOROVOD_RANK; under MPI the launcher's own variables name the rank
    if not any(name in os.environ for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")):
        skip = pytest.mark.skip(reason="parallel test: run under horovodrun -np 4 --gloo (make test)")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def healthy_process():
    """Each test starts in a process that has seen no failed collective: ``make test`` runs several files
    in one job, and a test that provokes a failure (a ``RankLostError``, a timeout) would otherwise leave
    the GIL watchdog armed for every later test (``common.failures.guard_gil``: a rank that then waits 45 s
    in Horovod, which holds the GIL while it waits, is ended). Afterwards the failure is forgotten, as
    ``hvd.elastic`` forgets it when it starts Horovod again, unless Horovod itself stopped: the next
    test's collective would then never end, and the armed watchdog ends the rank with its trace."""
    from horovod_hetero.runtime.seams import failure_seen, forget_failure, library_down
    yield
    if failure_seen.is_set() and not any(stopped() for stopped in library_down):
        forget_failure()
