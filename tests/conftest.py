import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "single"))

#: make test's timing table (tools/timed, tools/timing_table.py): where HH_TIMING_LOG names a file, each
#: test file's seconds (HH_TIMING_BY=test: each test's) are appended to it, as a job of HH_TIMING_PART.
#: Not under a launcher's ranks: tools/run_parallel.sh records a horovodrun job as a whole.
_LOG = os.environ.get("HH_TIMING_LOG")
_RANKED = any(name in os.environ for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"))
_seconds = defaultdict(float)
_failed = set()
_started = {}


def _job(nodeid):
    return nodeid if os.environ.get("HH_TIMING_BY") == "test" else nodeid.split("::")[0]


def pytest_runtest_logstart(nodeid, location):
    _started[nodeid] = time.monotonic()


def pytest_runtest_logfinish(nodeid, location):
    if nodeid in _started:
        _seconds[_job(nodeid)] += time.monotonic() - _started.pop(nodeid)


def pytest_runtest_logreport(report):
    if report.failed:
        _failed.add(_job(report.nodeid))


def pytest_sessionfinish(session, exitstatus):
    if _LOG and not _RANKED and _seconds:
        part = os.environ.get("HH_TIMING_PART", "pytest")
        with open(_LOG, "a") as f:
            for job, seconds in _seconds.items():
                f.write(f"{part}\t{job}\t{seconds:.1f}\t{int(job in _failed)}\n")
