"""Real multi-host runs on one machine: ``horovodrun -np 4 -H hostA:2,hostB:2 --gloo`` across two
network namespaces (``hosts.py``), every strategy, then a cut link (``make test-multihost``).

Deterministic schedules (Synchronous, LocalSGD, WAGMA without wait-avoidance) end with the same
parameters, bit for bit, as the same job on one host (``-H localhost:4``); time-driven ones
(ESync, WAGMA with wait-avoidance, ElasticBSP, DSSP, ADSP) end with bit-identical models on all
four ranks and a lower loss over the job's data. Both training jobs run with Horovod's fusion off
(``HOROVOD_FUSION_THRESHOLD=0``): which gradients Horovod fuses into one allreduce depends on
timing, and with it the ring's summation order (last-bit differences in Synchronous, on one host too). Every rank's servers bind its own host's address on the job's
network (hostA's ranks 10.77.0.1, hostB's 10.77.0.2; 127.0.0.1 on one host). Then, mid-training,
the link between the hosts goes down: every rank on both sides must exit non-zero within
``CUT_DEADLINE_S``; each rank's last error line is printed. A rank's exit status is the one its parent
saw (``record_exit.py`` runs each rank and writes it), never horovodrun's log, which leaves out ranks
that ended while horovodrun was tearing the job down.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hosts as hosts_mod  # noqa: E402
from cases import DETERMINISTIC, NAMES  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = os.path.join(ROOT, ".venv", "bin", "python")
BIN = os.path.join(ROOT, ".venv", "bin")
#: Horovod's horovodrun, its build check answered from a cache (``tools/horovodrun``: 5 s less per job)
HOROVODRUN = [PY, os.path.join(ROOT, "tools", "horovodrun")]
WORKER = os.path.join("tests", "multihost", "worker.py")
RECORD_EXIT = os.path.join("tests", "multihost", "record_exit.py")
JOB_TIMEOUT_S = 240
CUT_DEADLINE_S = 60.0
#: Horovod's Gloo timeout in the cut jobs. A cut surfaces after one Gloo timeout (two with process
#: sets: WAGMA's survivors measured 60.0 s at the default 30 s), so the default sits right at the limit.
GLOO_TIMEOUT_S = 20
#: Strategies whose job is cut mid-training (``HH_MULTIHOST_CUT``, comma-separated, overrides).
CUT = os.environ.get("HH_MULTIHOST_CUT", "localsgd,esync,wagma").split(",")

why_not = hosts_mod.available()
pytestmark = pytest.mark.skipif(why_not is not None, reason=str(why_not))


def horovodrun(hosts_arg, args, record_exit=None, controller="gloo"):
    """horovodrun of the worker; ``record_exit``: a directory where each rank's exit status is written
    by its parent (``record_exit.py``); ``controller="mpi"``: horovodrun --mpi (Open MPI's mpirun, its
    ssh launcher the stand-in ssh; Open MPI 5 takes only the double-dash binding options)."""
    recorder = [PY, RECORD_EXIT, str(record_exit)] if record_exit is not None else []
    launch = ["--gloo"] if controller == "gloo" else ["--mpi", "--binding-args=--bind-to none --map-by slot"]
    return [*HOROVODRUN, "--disable-cache", "-np", "4", "-H", hosts_arg, *launch, *recorder, PY, WORKER, *args]


def mpi_env(hosts, **extra):
    """The environment of a horovodrun --mpi job on hostA: mpirun found beside horovodrun (on PATH)."""
    env = hosts.env(PYTHONPATH=ROOT, OMPI_MCA_mpi_yield_when_idle="1", **extra)
    env["PATH"] += os.pathsep + BIN
    return env


def mpi_built():
    from horovod.common.util import mpi_built as built
    return os.path.exists(os.path.join(BIN, "mpirun")) and built()


def env_for_job(**extra):
    return dict(os.environ, PYTHONPATH=ROOT, **extra)


@pytest.fixture(scope="module")
def hosts():
    with hosts_mod.Hosts() as h:
        yield h


def run(argv, env, timeout=JOB_TIMEOUT_S):
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(argv[-8:])} failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def results(hosts, tmp_path_factory):
    """Final parameters of every strategy: {where: {strategy: [rank 0..3 npz]}} for two hosts and one."""
    out = {}
    names = list(NAMES)
    for where in ("two_hosts", "one_host"):
        d = tmp_path_factory.mktemp(where)
        if where == "two_hosts":
            argv = hosts.command("hostA", horovodrun("hostA:2,hostB:2", ["train", str(d), *names]))
            run(argv, hosts.env(PYTHONPATH=ROOT, HOROVOD_FUSION_THRESHOLD="0"))
        else:
            run(horovodrun("localhost:4", ["train", str(d), *names]), env_for_job(HOROVOD_FUSION_THRESHOLD="0"))
        out[where] = {n: [dict(np.load(d / f"{n}.rank{r}.npz")) for r in range(4)] for n in names}
    return out


def test_servers_bind_each_hosts_address(results):
    hosts_seen = [str(r["host"]) for r in results["two_hosts"]["sync"]]
    assert hosts_seen == ["10.77.0.1", "10.77.0.1", "10.77.0.2", "10.77.0.2"]
    assert [str(r["host"]) for r in results["one_host"]["sync"]] == ["127.0.0.1"] * 4


@pytest.mark.parametrize("name", list(NAMES))
def test_every_strategy_trains_across_hosts(results, name):
    ranks = results["two_hosts"][name]
    for r in ranks[1:]:
        np.testing.assert_array_equal(r["params"], ranks[0]["params"], err_msg=f"{name}: ranks differ")
    assert np.isfinite(ranks[0]["params"]).all()
    before, after = np.mean([r["data_loss"] for r in ranks], axis=0)     # over every rank's data
    assert after < before, f"{name}: loss {before:.4f} -> {after:.4f}"
    if name in DETERMINISTIC:
        np.testing.assert_array_equal(ranks[0]["params"], results["one_host"][name][0]["params"],
                                      err_msg=f"{name}: two hosts and one host differ")
        for a, b in zip(ranks, results["one_host"][name]):
            np.testing.assert_array_equal(a["losses"], b["losses"], err_msg=f"{name}: losses differ")


@pytest.fixture(scope="module")
def mpi_results(hosts, tmp_path_factory):
    """Final parameters of every strategy trained across the two hosts under horovodrun --mpi."""
    if not mpi_built():
        pytest.skip("Horovod without MPI, or no mpirun beside horovodrun (make env builds both)")
    d = tmp_path_factory.mktemp("two_hosts_mpi")
    for ns in hosts.netns.values():          # a cut case may have run before
        subprocess.run(["ip", "-n", ns, "link", "set", hosts_mod.IFACE, "up"], check=True)
    run(hosts.command("hostA", horovodrun("hostA:2,hostB:2", ["train", str(d), *NAMES], controller="mpi")),
        mpi_env(hosts, HOROVOD_FUSION_THRESHOLD="0"))
    return {n: [dict(np.load(d / f"{n}.rank{r}.npz")) for r in range(4)] for n in NAMES}


@pytest.mark.parametrize("name", list(NAMES))
def test_every_strategy_trains_across_hosts_under_mpi(mpi_results, results, name):
    """As under Gloo: identical models, a lower loss, each host's own address; the deterministic
    schedules end where Gloo's one-host run ends up to the last bits (MPI sums in another order)."""
    ranks = mpi_results[name]
    assert [str(r["host"]) for r in ranks] == ["10.77.0.1", "10.77.0.1", "10.77.0.2", "10.77.0.2"]
    assert [int(r["local_size"]) for r in ranks] == [2, 2, 2, 2]
    for r in ranks[1:]:
        np.testing.assert_array_equal(r["params"], ranks[0]["params"], err_msg=f"{name}: ranks differ")
    before, after = np.mean([r["data_loss"] for r in ranks], axis=0)
    assert after < before, f"{name}: loss {before:.4f} -> {after:.4f}"
    if name in DETERMINISTIC:
        np.testing.assert_allclose(ranks[0]["params"], results["one_host"][name][0]["params"], rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name}: MPI across hosts and Gloo on one host differ")


def last_line(text):
    lines = [re.sub(r"^\[\d+\]<std(out|err)>:", "", l).strip() for l in text.splitlines()]
    lines = [l for l in lines if l]
    return lines[-1] if lines else ""


@pytest.mark.parametrize("name", CUT)
def test_cut_link_fails_every_rank_on_both_sides(hosts, tmp_path, name):
    out = tmp_path
    for ns in hosts.netns.values():          # an earlier case cut the link: up again
        subprocess.run(["ip", "-n", ns, "link", "set", hosts_mod.IFACE, "up"], check=True)
    with open(out / "horovodrun.log", "w") as log:
        job = subprocess.Popen(hosts.command("hostA", horovodrun("hostA:2,hostB:2", ["cut", str(out), name], record_exit=out)),
                               cwd=ROOT, env=hosts.env(PYTHONPATH=ROOT, HOROVOD_GLOO_TIMEOUT_SECONDS=str(GLOO_TIMEOUT_S)),
                               stdout=log, stderr=subprocess.STDOUT)
    ended = {}
    try:
        _cut_after_step_20(hosts, out, job, name, ended)
        try:
            job.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    finally:
        for pid in (p for _, p in map(lambda r: _progress(out, r), range(4)) if p and _alive(p)):
            os.kill(pid, signal.SIGKILL)                # a rank that hung: not left to the next case
        if job.poll() is None:
            job.kill()
    report = _exits(hosts, out, ended)
    print(f"\n{name}: link cut after step 20")
    for r, e in sorted(report.items()):
        print(f"  rank {r} ({e['host']}): exit {e['rc']} {e['after_s']:.1f} s after the cut: {e['line']}")
    for r, e in sorted(report.items()):
        assert e["after_s"] <= CUT_DEADLINE_S, f"{name}: rank {r} still running {e['after_s']:.0f} s after the cut"
        assert e["rc"] is not None, f"{name}: rank {r}: no exit status recorded (record_exit.py did not run?)"
        assert e["rc"] != 0, f"{name}: rank {r} exited with 0"
    for host in ("hostA", "hostB"):
        own = [e for e in report.values() if e["host"] == host and "SIGTERM" not in e["line"]
               and "killed by the launcher" not in e["line"]]
        assert own, f"{name}: no rank on {host} failed by itself (all ended by the launcher)"
        for e in own:
            assert "horovod_hetero.errors.RankLostError" in e["line"], f"{name}: {host}: {e['line']}"


def _cut_after_step_20(hosts, out, job, name, ended):
    """Once every rank passed step 20, cut the link; fill ``ended`` ({rank: seconds from the cut to
    its exit}) until all four ended or ``CUT_DEADLINE_S`` + 30 s passed."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not all(_progress(out, r)[0] >= 20 for r in range(4)):
        assert job.poll() is None, f"{name}: the job ended before the cut:\n{_before_cut(hosts, out)}"
        assert time.monotonic() < deadline, f"{name}: no progress to step 20:\n{_before_cut(hosts, out)}"
        time.sleep(0.1)
    pids = {r: _progress(out, r)[1] for r in range(4)}
    hosts.cut()
    cut_at = time.monotonic()
    while len(ended) < 4 and time.monotonic() - cut_at < CUT_DEADLINE_S + 30:
        for r, pid in pids.items():
            if r not in ended and not _alive(pid):
                ended[r] = time.monotonic() - cut_at
        time.sleep(0.1)


def _before_cut(hosts, out):
    """What every rank said (its exit status, its error record or last line, the steps it took, and
    Horovod's own error lines), then the end of horovodrun's log: which rank failed first, and how."""
    lines = []
    for r, e in sorted(_exits(hosts, out, {}).items()):
        lines.append(f"rank {r} ({e['host']}): exit {e['rc']} after {_progress(out, r)[0]} steps: {e['line']}")
    log = open(out / "horovodrun.log", errors="replace").read()
    remote = "\n".join(x["log"] for x in hosts.remote_runs() if str(out) in x["command"])
    lines += [l for l in (log + "\n" + remote).splitlines() if "Horovod background loop" in l or "Timed out" in l]
    return "\n".join(lines) + "\n--- the end of horovodrun's log:\n" + log[-4000:]


def _progress(out, rank):
    """(steps, process id) that ``rank`` reported last, (0, None) before its first step."""
    try:
        steps, pid = open(out / f"progress.rank{rank}").read().split()
        return int(steps), int(pid)
    except (OSError, ValueError):
        return 0, None


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _exits(hosts, out, ended):
    """{rank: host, rc, after_s, line (the rank's error record, else its last output line)}.

    ``rc`` is the rank's exit status as its parent saw it (``record_exit.py``: a code, or minus a
    signal); a rank that horovodrun terminated and then killed with its parent after the 5 s grace
    (SIGTERM noted, no status) counts as killed by SIGKILL; ``None`` if neither was written."""
    _await_records(out, ended)
    report = {}
    hv = open(out / "horovodrun.log", errors="replace").read()
    remote = [x for x in hosts.remote_runs() if str(out) in x["command"]]
    for r in range(4):
        record = out / f"exit.rank{r}.json"
        error = json.load(open(record))["error"] if record.exists() else None
        status = out / f"status.rank{r}"
        if status.exists():
            rc = int(status.read_text())
        elif (out / f"sigterm.rank{r}").exists():
            rc, error = -signal.SIGKILL, error or "killed by the launcher (SIGTERM, then SIGKILL after its grace)"
        else:
            rc = None
        host = "hostA" if r < 2 else "hostB"
        if host == "hostA":             # started by horovodrun itself
            text = "\n".join(line for line in hv.splitlines() if line.startswith(f"[{r}]<"))
        else:                           # started through ssh
            run_ = [x for x in remote if f"HOROVOD_RANK={r} " in x["command"]]
            text = run_[0]["log"] if run_ else ""
        report[r] = {"host": host, "rc": rc, "line": error or last_line(text),
                     "after_s": ended.get(r, float("inf"))}
    return report


#: Seconds a rank's parent (``record_exit.py``) may take to write its status once the rank ended
RECORD_WAIT_S = 10.0
#: horovodrun's grace between its SIGTERM and its SIGKILL (Horovod 0.28.1's ``terminate_executor_shell_and_children``)
LAUNCHER_GRACE_S = 5.0


def _await_records(out, ended):
    """Wait, at most ``RECORD_WAIT_S``, until every rank in ``ended`` has its status written, or its SIGTERM
    note is older than the launcher's grace (its parent was then killed with it: no status will come). A
    rank counts as ended once it is a zombie, before its parent reaped it and wrote the status; on hostB
    that parent runs detached, so horovodrun can end before it did."""
    def settled(r):
        note = out / f"sigterm.rank{r}"
        return (out / f"status.rank{r}").exists() or (
            note.exists() and time.time() - note.stat().st_mtime > LAUNCHER_GRACE_S + 1)

    deadline = time.monotonic() + RECORD_WAIT_S
    while time.monotonic() < deadline and not all(settled(r) for r in ended):
        time.sleep(0.05)


#: The strategy's collective timeout in the MPI cut case: MPI's collectives have none of their own
MPI_CUT_TIMEOUT_S = 20


def test_cut_link_under_mpi_fails_every_rank_on_both_sides(hosts, tmp_path):
    """horovodrun --mpi, LocalSGD, the link cut after step 20: MPI's collectives never time out, so
    every rank's own wait does (``CollectiveTimeoutError`` after ``MPI_CUT_TIMEOUT_S``) and the rank
    exits within ``failures.MPI_SHUTDOWN_S`` more though its Horovod thread still waits in MPI."""
    if not mpi_built():
        pytest.skip("Horovod without MPI, or no mpirun beside horovodrun (make env builds both)")
    out = tmp_path
    for ns in hosts.netns.values():
        subprocess.run(["ip", "-n", ns, "link", "set", hosts_mod.IFACE, "up"], check=True)
    argv = horovodrun("hostA:2,hostB:2", ["cut", str(out), "localsgd"], record_exit=out, controller="mpi")
    with open(out / "horovodrun.log", "w") as log:
        job = subprocess.Popen(hosts.command("hostA", argv), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                               env=mpi_env(hosts, HH_MULTIHOST_TIMEOUT=str(MPI_CUT_TIMEOUT_S)))
    ended = {}
    try:
        _cut_after_step_20(hosts, out, job, "localsgd", ended)
        _await_records(out, ended)               # a rank ends as a zombie, before its parent writes its status
    finally:
        for pid in (p for _, p in map(lambda r: _progress(out, r), range(4)) if p and _alive(p)):
            os.kill(pid, signal.SIGKILL)
        job.kill()                               # mpirun waits for hostB's daemon, which it cannot reach
        job.wait()
    print("\nlocalsgd under MPI: link cut after step 20")
    for r in range(4):
        status = out / f"status.rank{r}"
        record = out / f"exit.rank{r}.json"
        rc = int(status.read_text()) if status.exists() else None
        line = json.load(open(record))["error"] if record.exists() else "(no record)"
        print(f"  rank {r}: exit {rc} {ended.get(r, float('inf')):.1f} s after the cut: {line}")
        assert ended.get(r, float("inf")) <= CUT_DEADLINE_S, f"rank {r} still running after the cut"
        assert rc is not None and rc != 0, f"rank {r}: exit status {rc}"
        assert "horovod_hetero.errors.CollectiveTimeoutError" in line, f"rank {r}: {line}"
