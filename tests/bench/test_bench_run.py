"""``horovod-hetero bench`` for real (it launches horovodrun itself, so it runs under plain pytest, not
inside horovodrun): a short bench, then ``report`` on what it left; and a bench killed (SIGTERM) during
its second job. Each case is bounded in time."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ["--np", "2", "--profile", "1,4", "--budget", "3", "--base-step", "0.02", "--eval-interval", "0.2"]


def cli(*args, timeout=240, **kwargs):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "horovod_hetero.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT, **kwargs)


def test_a_short_bench_then_its_report(tmp_path):
    out = tmp_path / "run"
    run = cli("bench", *BENCH, "--strategies", "esync,sync", "--out", str(out))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "2/2 jobs done" in run.stdout
    results = json.loads((out / "results.json").read_text())
    assert [j["strategy"] for j in results["jobs"]] == ["sync", "esync"]       # Synchronous first
    assert results["versions"]["horovod"] and results["command"][1:3] == ["bench", "--np"]
    for job in results["jobs"]:
        s = job["summary"]
        assert job["status"] == "done" and s["samples_per_s"] > 0 and 0 < s["final"] <= 1
        assert len(s["compute_ratio"]) == 2 and s["predicted_samples_per_s"] > 0 and 0 < s["share_of_bound"] <= 1.05
        assert (out / "jobs" / job["id"] / "telemetry" / "rank1.jsonl").exists()
        curve = (out / "jobs" / job["id"] / "curve.jsonl").read_text().splitlines()
        assert json.loads(curve[-1])["final"] and len(curve) >= 2
    rep = cli("report", str(out), "--html", str(tmp_path / "page.html"))
    assert rep.returncode == 0, rep.stderr
    assert "| Synchronous | " in rep.stdout and "| ESync | " in rep.stdout and "Not finished" not in rep.stdout
    for name in ("accuracy-time", "throughput", "compute-ratio", "accuracy-steps"):
        assert (out / f"bench-{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "page.html").read_text().count("data:image/png;base64,") == 4


def test_stop_at_target_ends_each_job_there_and_caps_the_others_by_synchronous(tmp_path):
    out = tmp_path / "run"
    run = cli("bench", "--np", "2", "--profile", "1,4", "--budget", "60", "--base-step", "0.02", "--eval-interval",
              "0.2", "--target", "digits=0.5", "--stop-at-target", "--cap", "3", "--strategies", "sync,esync",
              "--out", str(out))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    sync, esync = (job["summary"] for job in json.loads((out / "results.json").read_text())["jobs"])
    # Synchronous reaches 0.5 within seconds of its 60: it stops there, and ESync gets 3x its time
    assert sync["budget_s"] == 60 and sync["time_to_target_s"] is not None and sync["wall_s"] < 30, sync
    assert esync["budget_s"] == min(60, 3 * sync["time_to_target_s"])
    assert esync["wall_s"] < esync["budget_s"] + 5, esync                  # at the target or at its cap
    for job, s in (("sync", sync), ("esync", esync)):
        job_dir = out / "jobs" / f"torch-digits-iid-1_4-r0-{job}"
        points = [json.loads(line) for line in (job_dir / "curve.jsonl").read_text().splitlines()]
        reached = [p["accuracy"] >= 0.5 for p in points[:-1]]           # the snapshots during training
        # reached: rank 0 wrote the file at that snapshot and took no other (the last point is the final model)
        assert (job_dir / "curve.jsonl.stop").exists() == any(reached), job
        assert reached.count(True) <= 1 and reached[-1] == any(reached), job
        assert s["time_to_target_s"] is not None or not any(reached), job
    assert "every job stopped at the target" in cli("report", str(out)).stdout


def test_an_interrupted_bench_leaves_a_directory_the_report_reads(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-m", "horovod_hetero.cli", "bench", *BENCH, "--strategies",
                             "sync,localsgd,esync", "--out", str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:                    # until the first job is done
            path = out / "results.json"
            if path.exists() and json.loads(path.read_text())["jobs"][0]["status"] == "done":
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.3)
        else:
            pytest.fail("the first job did not finish in 180 s")
        time.sleep(2)                                          # the second job is running
        proc.send_signal(signal.SIGTERM)                       # as Ctrl-C: the running job is killed, recorded
        output = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and "interrupted" in output, output[-2000:]
    survivors = [p.info for p in psutil.process_iter(["pid", "cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]
    assert not survivors, f"processes of the interrupted job survive (orphaned ranks): {survivors}"
    statuses = [j["status"] for j in json.loads((out / "results.json").read_text())["jobs"]]
    assert statuses == ["done", "interrupted", "planned"]
    rep = cli("report", str(out))
    assert rep.returncode == 0, rep.stderr
    assert "| Synchronous | " in rep.stdout and "| LocalSGD(8) | not finished |" in rep.stdout
    assert ("Not finished (2 of 3 jobs): torch-digits-iid-1_4-r0-localsgd (interrupted), "
            "torch-digits-iid-1_4-r0-esync (planned)") in rep.stdout
    assert (out / "bench-accuracy-time.png").exists()
