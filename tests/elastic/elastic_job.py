"""Runs an elastic training script under ``horovodrun`` with a host-discovery script, and checks
what its processes logged (shared by the torch and Keras elastic tests).

Two host names, ``localhost`` and ``127.0.0.1``, stand for two machines, as in Horovod's own
elastic tests; the scripts rewrite the hosts file the discovery script prints."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

#: Horovod's horovodrun, its build check answered from a cache (``tools/horovodrun``: 5 s less per job)
HOROVODRUN = [sys.executable, str(Path(__file__).resolve().parents[2] / "tools" / "horovodrun")]


def log(**fields):
    """In a worker: append a record for the test to check."""
    with open(os.environ["HH_ELASTIC_LOG"], "a") as f:
        f.write(json.dumps(dict(pid=os.getpid(), **fields)) + "\n")


def start_together(np, timeout=180.0):
    """In a worker, before ``hvd.init``: wait until the job's ``np`` first workers have imported their
    frameworks. Horovod's Gloo rendezvous waits ``HOROVOD_GLOO_TIMEOUT_SECONDS`` for the last rank, and the kill
    tests lower it to 10 s: the imports of 4 processes on 2 busy cores can take longer than that apart."""
    ready = Path(os.environ["HH_ELASTIC_LOG"]).with_name("ready")
    ready.mkdir(exist_ok=True)
    (ready / str(os.getpid())).touch()
    deadline = time.monotonic() + timeout
    while len(list(ready.iterdir())) < np:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(list(ready.iterdir()))} of {np} workers started in {timeout:.0f} s")
        time.sleep(0.05)


def set_hosts(text):
    """In a worker: the hosts the discovery script prints from now on (Horovod reads them every second)."""
    path = os.environ["HH_ELASTIC_HOSTS"]
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def run(worker, strategy, tmp_path, hosts_text="localhost:2\n", np=2, args=(), launch=(), ok=True, timeout=240,
        **env):
    """Start ``worker strategy *args`` on ``np`` workers of ``hosts_text`` (at least 2, at most 4), with
    ``launch``, more options of horovodrun; the records its processes logged. ``ok``: the job must succeed
    (else its exit status is not checked); ``timeout``: seconds the job may take."""
    hosts, log = tmp_path / "hosts", tmp_path / "log.jsonl"
    hosts.write_text(hosts_text)
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    env = dict(os.environ, HH_ELASTIC_HOSTS=str(hosts), HH_ELASTIC_LOG=str(log), **env,
               PYTHONPATH=os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")]))
    # --network-interface: without it Horovod's elastic Gloo launcher waits for two hosts to compare their NICs
    cmd = [*HOROVODRUN, "-np", str(np), "--min-np", "2", "--max-np", "4", "--network-interface", "lo",
           "--host-discovery-script", str(discover), *launch, "--gloo", sys.executable, str(worker), strategy, *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    (tmp_path / "job.txt").write_text(done.stdout + done.stderr)     # for a test's message (job_output)
    assert not ok or done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


def job_output(tmp_path, chars=6000):
    """The end of what the last job run in ``tmp_path`` printed (its processes' stacks where one was stuck)."""
    return (tmp_path / "job.txt").read_text()[-chars:]


def check_grew_and_shrank(records, planned):
    """Every worker of the 4-worker phase trained; the two survivors end identical; a planned
    strategy planned for 4 ranks, then for 2."""
    ends = [r for r in records if r["event"] == "end"]
    starts = [r for r in records if r["event"] == "start"]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert sorted(r["rank"] for r in ends) == [0, 1] and {r["size"] for r in ends} == {2}
    assert all(r["params"] == ends[0]["params"] for r in ends)                 # identical models
    assert {r["size"] for r in starts} == {2, 4}                               # it grew, then shrank
    assert {r["rank"] for r in epochs if r["size"] == 4} == {0, 1, 2, 3}        # 4 workers trained epochs
    assert len({r["pid"] for r in records}) >= 4                               # new workers joined
    survivor = next(r for r in ends if r["rank"] == 0)
    assert survivor["sizes"][0] == 2 and 4 in survivor["sizes"] and survivor["sizes"][-1] == 2
    assert all(r["step"] > 0 for r in ends)
    if planned:                                                                # planned for each size
        assert {len(r["plan"]) for r in epochs if r["size"] == 4} == {4}
        assert {len(r["plan"]) for r in epochs if r["size"] == 2} == {2}
