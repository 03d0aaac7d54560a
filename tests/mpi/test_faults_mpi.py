"""Faults under Open MPI's own launcher (``make test-mpi``): four ranks of ``tests/faults/worker.py``
(torch: LocalSGD, and Synchronous, whose gradient allreduce is Horovod's) under ``mpirun``, one rank
killed or stopped after step 20.

Under MPI the launcher, not the library, decides what a death does: Open MPI's ``mpirun`` ends every
rank of the job as soon as one exits on a signal (no survivor gets to name an error, and nothing hangs).
A rank that stops answering is the library's case: MPI's collectives have no timeout, so every other
rank raises the named ``CollectiveTimeoutError`` after the strategy's timeout (its own wait), and exits
(status 1) within ``MPI_SHUTDOWN_S`` more although Horovod's background thread still waits in MPI.
"""
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from horovod_hetero.common.failures import MPI_SHUTDOWN_S

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
WORKER = ROOT / "tests" / "faults" / "worker.py"
TIMEOUT_S = 5                     # the strategy's collective timeout in these jobs
START_LIMIT_S = 120               # to step 20 on every rank
TAG = re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>: ?(.*)$")


def mpi_built():
    import horovod.torch as hvd
    return hvd.mpi_built()


pytestmark = pytest.mark.skipif(not (BIN / "mpirun").exists() or not mpi_built(),
                                reason="Horovod without MPI, or no mpirun in .venv (make env builds both)")


def mpirun(*args):
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [str(BIN / "mpirun"), *root, "-np", "4", "-H", "localhost:4", "--bind-to", "none", "--tag-output",
            str(BIN / "python"), *args]


def lines(log):
    """{rank: [its lines]} of a --tag-output log."""
    out = {r: [] for r in range(4)}
    for line in log.read_text(errors="replace").splitlines():
        m = TAG.match(line)
        if m:
            out[int(m.group(1))].append(m.group(2))
    return out


def start(tmp_path, strategy="localsgd"):
    """The job, and every rank's pid once all four passed step 20."""
    log = tmp_path / "mpirun.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT), FAULTS_UNTIL=str(tmp_path / "never"), FAULTS_TIMEOUT=str(TIMEOUT_S),
               PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    job = subprocess.Popen(mpirun(str(WORKER), strategy, "torch", "1000000"), cwd=ROOT, env=env,
                           stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + START_LIMIT_S
    while True:
        seen = lines(log)
        if all(any(l.startswith("PROGRESS 20 ") for l in seen[r]) for r in range(4)):
            return job, log, {r: int(next(l.split()[1] for l in seen[r] if l.startswith("PID "))) for r in range(4)}
        if job.poll() is not None or time.monotonic() > deadline:
            stop(job)
            pytest.fail(f"the job did not reach step 20 on every rank:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


def stop(job):
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.wait()


def ended_within(job, limit_s):
    """Seconds until ``job`` ended (``None``: still running after ``limit_s``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if job.poll() is not None:
            return time.monotonic() - t0
        time.sleep(0.1)
    return None


def test_a_killed_rank_ends_the_whole_job_at_once(tmp_path):
    job, log, pids = start(tmp_path)
    try:
        os.kill(pids[1], signal.SIGKILL)
        took = ended_within(job, 30)
    finally:
        stop(job)
    text = log.read_text(errors="replace")
    assert took is not None, f"the job still ran 30 s after rank 1 was killed:\n{text[-4000:]}"
    assert job.returncode != 0 and "process rank 1" in text and "signal 9" in text, text[-4000:]
    print(f"\nmpirun, rank 1 killed: the job ended {took:.1f} s later (exit {job.returncode})")


@pytest.mark.parametrize("strategy", ["localsgd", "sync"])
def test_a_stopped_rank_every_other_rank_names_the_error_and_exits(tmp_path, strategy):
    job, log, pids = start(tmp_path, strategy)
    try:
        stopped_at = time.monotonic()
        os.kill(pids[1], signal.SIGSTOP)
        took = ended_within(job, TIMEOUT_S + MPI_SHUTDOWN_S + 30)
    finally:
        os.kill(pids[1], signal.SIGCONT) if job.poll() is None else None
        stop(job)
    seen = lines(log)
    assert took is not None, f"the job still ran after rank 1 was stopped:\n{log.read_text()[-4000:]}"
    for r in (0, 2, 3):
        errors = [l for l in seen[r] if l.startswith("ERROR ")]
        assert errors and errors[0].split()[1] == "CollectiveTimeoutError", f"rank {r}: {seen[r][-5:]}"
        raised_after = float(errors[0].split()[2]) - (time.time() - (time.monotonic() - stopped_at))
        assert TIMEOUT_S - 1 <= raised_after <= TIMEOUT_S + 5, f"rank {r} raised {raised_after:.1f} s after the stop"
        assert any("rank 1 stopped" in l for l in seen[r]), f"rank {r} did not name rank 1: {seen[r][-5:]}"
    assert job.returncode != 0
    print(f"\nmpirun, {strategy}, rank 1 stopped: every other rank raised CollectiveTimeoutError, the job ended "
          f"{took:.1f} s later")
