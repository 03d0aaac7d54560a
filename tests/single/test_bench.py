"""horovod-hetero bench and report: the pure parts (planning, curves, the simulator's prediction, tables)."""
import argparse
import dataclasses
import json
import logging
import os
import pathlib
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from horovod_hetero.cli import cli
from horovod_hetero.runtime.telemetry import round_cost_and_wait
from horovod_hetero.strategies import ESync, Mean, Normalized, OuterSGD, Synchronous
from horovod_hetero.strategies.registry import configured
import horovod_hetero_lab
from horovod_hetero_lab import bench, report
from horovod_hetero_lab.data import TASKS, available, noniid_shard, score, task_data
from horovod_hetero_lab.harness import Curve, add_strategy_arguments, aggregation


def test_plan_runs_synchronous_first_and_interleaves_repeats():
    jobs = bench.plan(["torch", "keras"], ["digits"], ["1,1,1,4", "random"], ["esync", "wagma", "sync"], 2)
    assert len(jobs) == 2 * 2 * 2 * 3
    assert [j.strategy for j in jobs[:6]] == ["sync", "esync", "wagma"] * 2
    assert [j.repeat for j in jobs[:6]] == [0, 0, 0, 1, 1, 1]
    assert jobs[6].profile == "random" and jobs[-1].framework == "keras"
    assert len({j.id for j in jobs}) == len(jobs)


@pytest.mark.parametrize("args, message", [
    ((["torch"], ["digits"], ["1,4"], ["magic"], 1), "unknown magic"),
    ((["torch"], ["digits"], ["1,4"], [], 1), "empty list"),
    ((["jax"], ["digits"], ["1,4"], ["sync"], 1), "framework must be one of torch, keras"),
    ((["torch"], ["mnist"], ["1,4"], ["sync"], 1), "--task must be one of digits"),
    ((["torch"], ["digits"], ["1,4"], ["sync"], 0), "repeats"),
])
def test_plan_refuses_bad_input_by_name(args, message):
    with pytest.raises(ValueError, match=message):
        bench.plan(*args)


def test_profiles():
    assert bench.parse_profile("random", 4, 0.025).env == (("HOROVOD_HETERO_RANDOM_DELAY", "2:0.075"),)
    assert bench.parse_profile("random:1:0.5", 4, 0.025).env == (("HOROVOD_HETERO_RANDOM_DELAY", "1:0.5"),)
    assert bench.parse_profile("1,1,1,1;5:1,1,1,4", 4, 0.025).env == (("HOROVOD_HETERO_SLOWDOWN", "1,1,1,1;5:1,1,1,4"),)
    with pytest.raises(ValueError, match="gives 2 factors; --np is 4"):
        bench.parse_profile("1,4", 4, 0.025)
    with pytest.raises(ValueError, match="COUNT:SECONDS"):
        bench.parse_profile("random:x", 4, 0.025)


def test_time_to_target_in_seconds_and_steps_either_direction(monkeypatch):
    curve = [{"t": 0.5, "step": 4, "distance": 0.5}, {"t": 1.5, "step": 12, "distance": 0.04},
             {"t": 2.5, "step": 20, "distance": 0.06}]
    assert bench.time_to_target(curve, "synthetic", 0.05) == 1.5
    assert bench.time_to_target(curve, TASKS["synthetic"], 0.05, key="step") == 12
    assert bench.time_to_target(curve, "synthetic", 0.01) is None
    assert bench.time_to_target([dict(p, accuracy=1 - p["distance"]) for p in curve], "digits", 0.9) == 1.5
    assert bench.time_to_target([], "digits", 0.9) is None
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    assert bench.versions()["KERAS_BACKEND"] == "torch"


def records(step_s, comm, rounds=True, steps=20):
    """Telemetry of ranks stepping in lockstep: rank r's steps take step_s[r], each step one round."""
    out = {}
    for r, s in enumerate(step_s):
        recs = []
        for k in range(steps):
            rec = {"rank": r, "time": 100.0 + k * max(step_s), "step": k + 1, "compute_s": s,
                   "comm_s": comm + max(step_s) - s, "bytes_sent": 100, "synced": rounds, "samples": 32}
            if rounds:
                rec["round"] = k + 1
            recs.append(rec)
        out[r] = recs
    return out


def test_round_cost_and_wait_from_rounds_or_steps():
    for rounds in (True, False):
        cost, wait = round_cost_and_wait(records([0.1, 0.1, 0.1, 0.4], 0.01, rounds))
        assert cost == pytest.approx(0.01)
        assert wait == pytest.approx(3 * 0.3 / 4)          # three ranks wait 0.3 s, the slow one nothing
    assert round_cost_and_wait({0: [{"step": 1, "comm_s": 0.0, "bytes_sent": 0}]}) == (None, None)


def test_prediction_replays_the_measured_step_times():
    by_rank = records([0.1, 0.4], 0.0, rounds=False, steps=41)          # 40 steady steps of 0.4 s: 16 s
    wall = 16.0
    sync = bench.predict(by_rank, Synchronous(), wall, 32, 0.0)
    assert sync == pytest.approx((2 * 40 + 2) * 32 / wall, rel=0.03)     # every step waits for the slow one
    esync = bench.predict(by_rank, ESync(), wall, 32, 0.0)
    assert esync > 2 * sync                                              # the fast rank keeps stepping
    assert bench.predict(by_rank, Synchronous(), wall, 32, 0.1) == pytest.approx(
        (2 * 32 + 2) * 32 / wall, rel=0.05)                              # 0.5 s a step with the round


def test_the_simulated_autos_switches_stay_out_of_the_bench_log(caplog):
    """The prediction runs ``hh.Auto`` on a simulated cluster; its switches there are no job's: the bench's
    output leaves them out, and the library's logger is as it was afterwards."""
    from horovod_hetero import simulate as sim
    from horovod_hetero.auto import Auto
    by_rank = records([0.05, 0.05, 0.05, 0.2], 0.0, rounds=False, steps=200)
    caplog.set_level("INFO", logger="horovod_hetero")
    assert bench.predict(by_rank, Auto(), 40.0, 32, 0.0) > 0
    assert not [r for r in caplog.records if r.name == "horovod_hetero"]
    assert not logging.getLogger("horovod_hetero").disabled
    sim.simulate(sim.Cluster([0.05, 0.05, 0.05, 0.2]), Auto(), 40.0)             # the same, outside the bench
    assert any("Auto switches from sync" in r.getMessage() for r in caplog.records)


def test_quality_at_equal_steps_in_the_table():
    jobs = bench.plan(["torch"], ["digits"], ["1,4"], ["sync", "esync"], 1)
    results = fake_results([(j, "done", summary(1.0, 100)) for j in jobs])
    curves = {jobs[0].id: [{"step": 0, "accuracy": 0.1}, {"step": 40, "accuracy": 0.9}],
              jobs[1].id: [{"step": 0, "accuracy": 0.1}, {"step": 10, "accuracy": 0.3}, {"step": 100, "accuracy": 0.99}]}
    group = report.groups(results)[("torch", "digits", "iid", "1,4")]
    assert report.equal_steps(group, curves) == 40
    assert [r[5] for r in report.rows(group, curves)] == ["0.900", "0.530"]   # 0.3 + 30/90 * 0.69
    assert "the quality at rank 0's local step 40" in report.markdown(results, curves)
    assert bench.quality_at(curves[jobs[0].id], "accuracy", 41) is None


def test_median_range():
    assert bench.median_range([None, None]) == (None, None, None)
    assert bench.median_range([1.0, 5.0, 2.0]) == (2.0, 1.0, 5.0)


def test_noniid_shards_are_disjoint_cover_everything_and_are_skewed():
    y = task_data("digits", 0, 1)[1]
    shards = [noniid_shard(y, r, 4, skew=0.8) for r in range(4)]
    assert sorted(np.concatenate(shards).tolist()) == list(range(len(y)))
    for r, shard in enumerate(shards):
        home = np.isin(y[shard], [c for c in range(10) if c % 4 == r]).mean()
        assert home > 0.75
    iid = task_data("digits", 1, 4)[1]
    assert np.isin(iid, [1, 5, 9]).mean() < 0.4
    noniid = task_data("digits-noniid", 1, 4)[1]
    assert np.isin(noniid, [1, 5, 9]).mean() > 0.8


def test_tasks_data_and_score():
    for name, task in TASKS.items():
        if available(task) is not None:
            continue                                      # a fetched dataset that is not here (tests/single/test_data.py)
        x, y, xt, yt = task_data(name, 0, 2)
        assert x.dtype == (np.int64 if task.metric == "bpc" else np.float32)
        assert len(x) == len(y) and len(xt) == len(yt)
    x, y, xt, yt = task_data("synthetic", 0, 1)
    w = np.linalg.lstsq(x, y, rcond=None)[0]                 # the whole training set: the optimum itself
    assert score(TASKS["synthetic"], xt @ w, yt) < 1e-4
    assert score(TASKS["synthetic"], np.zeros(len(yt)), yt) == pytest.approx(1.0)
    assert TASKS["synthetic"].reached(0.04) and not TASKS["synthetic"].reached(0.06)


def test_curve_snapshots_after_averaging_at_most_every_interval_and_evaluates_after_training(tmp_path):
    snapshots = iter([0.5, 0.6, 0.7, 0.8])
    path = tmp_path / "curve.jsonl"
    evaluated = []
    curve = Curve(str(path), 1000.0, lambda: next(snapshots), lambda w: evaluated.append(w) or {"accuracy": w},
                  "accuracy")
    curve.begin()
    curve.after_step(1, averaged=False)                      # a local model: not taken
    curve.after_step(2, averaged=True)
    curve.after_step(3, averaged=True)                       # within the interval
    curve.final(4)
    assert evaluated == [] and not path.exists()             # nothing evaluated while training
    curve.evaluate_all()
    points = bench.read_curve(path)
    assert [(p["step"], p["accuracy"], p["final"]) for p in points] == [(2, 0.5, False), (4, 0.6, True)]
    assert points[1]["t"] >= points[0]["t"] >= 0 and evaluated == [0.5, 0.6]


def summary(ttt, sps, final=0.97, ratio=(0.9, 0.9)):
    return {"time_to_target_s": ttt, "target": 0.95, "samples_per_s": sps, "final": final, "predicted_samples_per_s": sps * 1.1,
            "share_of_bound": 0.8, "bytes_per_s": 2e6, "compute_ratio": list(ratio), "wait_per_round_s": 0.01,
            "bound_samples_per_s": sps * 1.2}


def fake_results(jobs):
    settings = bench.settings_of(2, 0.025, 5.0)
    entries = []
    for job, status, s in jobs:
        entry = dict(job.__dict__, status=status)
        if s:
            entry["summary"] = s
        entries.append(entry)
    return {"format": bench.FORMAT, "command": ["horovod-hetero", "bench"], "versions": {}, "settings": settings,
            "jobs": entries}


def test_table_medians_speedups_and_unfinished_jobs():
    jobs = bench.plan(["torch"], ["digits"], ["1,4"], ["sync", "esync"], 3)
    s = {("sync", 0): summary(4.0, 100), ("esync", 0): summary(1.0, 300), ("sync", 1): summary(6.0, 100),
         ("esync", 1): summary(2.0, 330), ("sync", 2): summary(None, 90)}
    results = fake_results([(j, "done" if (j.strategy, j.repeat) in s else "interrupted", s.get((j.strategy, j.repeat)))
                            for j in jobs])
    rows = {r[0]: r for r in report.rows(report.groups(results)[("torch", "digits", "iid", "1,4")], budget=5)}
    assert rows["Synchronous"][1] == "6.0 (4.0->5) [2/3 reached]"        # the miss counts as > 5 s
    assert rows["ESync"][1] == "1.5 (1.0-2.0)"
    assert rows["ESync"][2] == "3.50x (3.00-4.00)"           # per repeat: 4/1 and 6/2
    assert rows["ESync"][7] == "3.15x (3.00-3.30)"
    assert rows["ESync"][11] == "0.90/0.90"
    assert rows["ESync"][5] == "-"                            # no curves given
    assert rows["ESync"][4] == "-"                            # no slowest worker's classes
    text = report.markdown(results)
    assert "| Synchronous | 6.0 (4.0->5) [2/3 reached] |" in text
    assert "Not finished (1 of 6 jobs): torch-digits-iid-1_4-r2-esync (interrupted)" in text


def test_report_refuses_a_missing_or_foreign_directory(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(cli, ["report", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "no such directory" in missing.output
    empty = runner.invoke(cli, ["report", str(tmp_path)])
    assert empty.exit_code == 1 and "is not a horovod-hetero bench directory: it has no results.json" in empty.output
    (tmp_path / "results.json").write_text(json.dumps({"jobs": []}))
    foreign = runner.invoke(cli, ["report", str(tmp_path)])
    assert foreign.exit_code == 1 and "was not written by horovod-hetero bench" in foreign.output


def test_bench_refuses_bad_options_before_running(tmp_path):
    runner = CliRunner()
    bad = runner.invoke(cli, ["bench", "--np", "8", "--out", str(tmp_path / "o")])
    assert bad.exit_code == 2 and "--profile '1,1,1,4' gives 4 factors; --np is 8" in bad.output
    bad = runner.invoke(cli, ["bench", "--target", "digits:0.9", "--out", str(tmp_path / "o")])
    assert bad.exit_code == 2 and "--target must be TASK=VALUE" in bad.output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    full = runner.invoke(cli, ["bench", "--strategies", "sync", "--out", str(tmp_path / "full")])
    assert full.exit_code == 1 and "is not empty" in full.output
    assert not (tmp_path / "o").exists()


def test_bench_runs_the_checkouts_example_scripts_and_says_how_to_get_them(monkeypatch, tmp_path):
    root = pathlib.Path(__file__).resolve().parents[2]
    job = bench.plan(["keras"], ["digits"], ["1,4"], ["esync"], 1)[0]
    cmd, env = bench.job_command(job, bench.settings_of(2, 0.05, 8.0), tmp_path)
    assert cmd[cmd.index(sys.executable) + 1] == str(root / "examples" / "keras_digits.py")
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(root), str(root / "lab")]   # the same copies
    monkeypatch.setattr(horovod_hetero_lab, "EXAMPLES", tmp_path / "elsewhere")
    refused = CliRunner().invoke(cli, ["bench", "--np", "2", "--profile", "1,4", "--out", str(tmp_path / "o")])
    assert refused.exit_code == 1 and "keras_digits.py" not in refused.output
    assert "elsewhere/torch_digits.py not found" in refused.output and "pip install -e lab" in refused.output
    assert not (tmp_path / "o").exists()


def test_misses_count_as_beyond_the_budget_and_speedups_against_synchronous_only(tmp_path):
    jobs = bench.plan(["torch"], ["digits"], ["1,4"], ["sync", "esync", "wagma"], 3)
    s = {("sync", 0): summary(4.0, 100), ("esync", 0): summary(1.0, 300), ("wagma", 0): summary(None, 200),
         ("sync", 1): summary(None, 100), ("esync", 1): summary(2.0, 330), ("wagma", 1): summary(None, 200),
         ("sync", 2): summary(None, 100), ("esync", 2): summary(2.5, 330), ("wagma", 2): summary(3.0, 200)}
    results = fake_results([(j, "done", s[j.strategy, j.repeat]) for j in jobs])
    rows = {r[0]: r for r in report.rows(report.groups(results)[("torch", "digits", "iid", "1,4")], budget=5)}
    assert rows["Synchronous"][1] == ">5 (4.0->5) [1/3 reached]"
    assert rows["ESync"][2] == ">=2.50x (2.00-4.00)"        # 4/1, >=5/2, >=5/2.5
    assert rows["WAGMA(S=2,8)"][1] == ">5 (3.0->5) [1/3 reached]"
    assert rows["WAGMA(S=2,8)"][2] == "~1.23x (0.80-1.67)"   # <=4/5, (both missed: none), >=5/3
    # without Synchronous in the group, no speedup (not a ratio against whatever ran first)
    results["jobs"] = [e for e in results["jobs"] if e["strategy"] != "sync"]
    rows = {r[0]: r for r in report.rows(report.groups(results)[("torch", "digits", "iid", "1,4")], budget=5)}
    assert rows["ESync"][2] == "-" and rows["ESync"][7] == "-"


def test_jobs_without_telemetry_read_n_a_and_are_not_drawn_as_zero(tmp_path):
    pytest.importorskip("matplotlib")
    jobs = bench.plan(["keras"], ["digits"], ["1,4"], ["sync", "esync"], 2)
    no_telemetry = dict(summary(2.0, 100), predicted_samples_per_s=None, share_of_bound=None, bytes_per_s=None,
                        compute_ratio=None, wait_per_round_s=None, bound_samples_per_s=None)
    s = {("sync", 0): no_telemetry, ("sync", 1): no_telemetry, ("esync", 0): summary(1.0, 300),
         ("esync", 1): dict(summary(1.0, 300), compute_ratio=None)}        # one repeat without telemetry
    results = fake_results([(j, "done", s[j.strategy, j.repeat]) for j in jobs])
    rows = {r[0]: r for r in report.rows(report.groups(results)[("keras", "digits", "iid", "1,4")], budget=5)}
    assert rows["Synchronous"][8:] == ["n/a"] * 5
    assert rows["ESync"][11] == "0.90/0.90"
    paths = report.plots(tmp_path, results)
    assert all(p.exists() for p in paths)


def test_plan_dedupes_and_refuses_colliding_job_ids():
    jobs = bench.plan(["torch", "torch"], ["digits", "digits"], ["1,4", "1,4"], ["sync"], 1)
    assert [j.id for j in jobs] == ["torch-digits-iid-1_4-r0-sync"]
    with pytest.raises(ValueError, match="--profile '1.5,1,1,4' and '1,5,1,1,4' give the same job id"):
        bench.plan(["torch"], ["digits"], ["1.5,1,1,4", "1,5,1,1,4"], ["sync"], 1)


@pytest.mark.parametrize("args, message", [
    (["--base-step", "0"], "--base-step must be > 0.0"),
    (["--target", "digits=abc"], "--target 'digits=abc': VALUE must be a number"),
    (["--target", "digits=nan"], "--target digits must be a finite number"),
    (["--target", "digits=1.5"], "--target digits must be <= 1.0"),
    (["--target", "digits=0"], "--target digits must be > 0.0"),
    (["--target", "synthetic=-1"], "--target synthetic must be > 0.0"),
])
def test_bench_refuses_bad_base_step_and_targets(tmp_path, args, message):
    bad = CliRunner().invoke(cli, ["bench", *args, "--out", str(tmp_path / "o")])
    assert bad.exit_code == 2
    assert message in bad.output, bad.output
    assert not (tmp_path / "o").exists()


def test_a_job_whose_summary_fails_is_marked_failed_and_the_bench_goes_on(tmp_path, monkeypatch):
    jobs = bench.plan(["torch"], ["digits"], ["1,4"], ["sync", "esync"], 1)
    settings = bench.settings_of(2, 0.025, 1.0)
    results = bench.new_results(tmp_path / "out", jobs, settings, ["horovod-hetero", "bench"])

    def fake_run(cmd, env, log_path, timeout_s, tick=None):
        (pathlib.Path(log_path).parent / "result.json").write_text("{}")
        return 0

    def fake_summary(job, job_dir, settings):
        if job.strategy == "sync":
            raise KeyError("accuracy")
        return dict(summary(1.0, 300), metric="accuracy", target=0.95)

    monkeypatch.setattr(bench, "run_process", fake_run)
    monkeypatch.setattr(bench, "summarize_job", fake_summary)
    lines = []
    results = bench.run_bench(tmp_path / "out", results, lines.append)
    assert [e["status"] for e in results["jobs"]] == ["failed", "done"]
    assert results["jobs"][0]["error"] == "KeyError: 'accuracy'"
    assert "could not be summarised: KeyError" in lines[0]
    assert json.loads((tmp_path / "out" / "results.json").read_text())["jobs"][0]["status"] == "failed"


def test_a_timed_out_job_leaves_no_process_even_one_in_its_own_session(tmp_path):
    """Horovod's middleman calls os.setsid(): a rank is outside the launcher's process group."""
    psutil = pytest.importorskip("psutil")
    pid_file = tmp_path / "rank.pid"
    rank = "import os, sys, time; os.setsid(); open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    launcher = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {rank!r}, {str(pid_file)!r}]); "
                "time.sleep(60)")
    started = __import__("time").monotonic()
    code = bench.run_process([sys.executable, "-c", launcher], dict(os.environ), tmp_path / "log", 3.0)
    assert code is None and __import__("time").monotonic() - started < 30
    pid = int(pid_file.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_the_page_shows_the_command_as_a_shell_would_run_it():
    results = fake_results([])
    results["command"] = ["horovod-hetero", "bench", "--profile", "1,1;5:1,4", "--out", "my dir"]
    page = report.html_page(results, "", [])
    assert "horovod-hetero bench --profile &#x27;1,1;5:1,4&#x27; --out &#x27;my dir&#x27;" in page


def test_the_noniid_split_refuses_more_workers_than_classes(tmp_path):
    with pytest.raises(ValueError, match="at most one worker per class \\(10 classes\\), got 11 workers"):
        task_data("digits-noniid", 0, 11)
    bad = CliRunner().invoke(cli, ["bench", "--np", "11", "--profile", "random", "--task", "digits-noniid",
                                   "--out", str(tmp_path / "o")])
    assert bad.exit_code == 2 and "got 11 workers" in bad.output and not (tmp_path / "o").exists()
    assert [len(set(np.arange(1000)[noniid_shard(np.arange(1000) % 10, r, 8)] % 10) & set(range(r, 10, 8)))
            for r in range(8)] == [2, 2, 1, 1, 1, 1, 1, 1]


def test_the_bench_runs_every_strategy_the_examples_build_each_from_its_own_options():
    from horovod_hetero.strategies.registry import REGISTRY
    assert list(bench.STRATEGIES) == list(REGISTRY)
    for name, (label, options) in bench.STRATEGIES.items():
        assert options[:2] == ["--strategy", name]
        assert label.startswith(type(configured(name)).__name__), (name, label)


def test_plan_runs_every_split_and_each_model_averaging_strategy_once_per_aggregation():
    jobs = bench.plan(["torch"], ["fashion-cnn"], ["1,1,1,4"], ["esync", "sync"], 1, splits=["skew", "dirichlet:0.10"],
                      aggregates=["mean", "normalized+nesterov", "mean"])
    assert [(j.split, j.label) for j in jobs] == [
        ("skew", "Synchronous"), ("skew", "ESync"), ("skew", "ESync [normalized+nesterov]"),
        ("dirichlet:0.1", "Synchronous"), ("dirichlet:0.1", "ESync"), ("dirichlet:0.1", "ESync [normalized+nesterov]")]
    assert jobs[2].id == "torch-fashion-cnn-skew-1_1_1_4-r0-esync-normalized_nesterov"
    assert len({j.group for j in jobs}) == 2
    cmd, _ = bench.job_command(jobs[2], bench.settings_of(4, 0.05, 8.0), pathlib.Path("/tmp/j"))
    assert cmd[cmd.index("--aggregate"):cmd.index("--aggregate") + 7] == [
        "--aggregate", "normalized", "--outer-lr", "0.7", "--outer-momentum", "0.5", "--nesterov"]
    assert cmd[cmd.index("--split") + 1] == "skew"
    sync_cmd, _ = bench.job_command(jobs[0], bench.settings_of(4, 0.05, 8.0), pathlib.Path("/tmp/j"))
    assert "--aggregate" not in sync_cmd
    parser = argparse.ArgumentParser()
    add_strategy_arguments(parser)
    given = [aggregation(parser.parse_args(bench.aggregate_options(v))) for v in ("normalized+nesterov", "mean+nesterov")]
    assert given == [Normalized(OuterSGD(0.7, 0.5, nesterov=True)), Mean(OuterSGD(0.7, 0.5, nesterov=True))]


@pytest.mark.parametrize("args, kwargs, message", [
    ((["torch"], ["digits"], ["1,4"], ["sync"], 1), {"aggregates": ["median"]}, "--aggregate must be a comma list of"),
    ((["torch"], ["digits"], ["1,4"], ["sync"], 1), {"aggregates": []}, "empty list"),
    ((["torch"], ["digits"], ["1,4"], ["sync"], 1), {"splits": ["plays"]}, "plays is the text task's"),
])
def test_plan_refuses_bad_splits_and_aggregations_by_name(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        bench.plan(*args, **kwargs)


def test_the_slowest_worker_and_its_classes():
    assert bench.slowest_rank("1,1,1,4", 4) == 3 and bench.slowest_rank("2,1,1,1;5:1,1,3,1", 4) == 2
    assert bench.slowest_rank("1,1,1,1", 4) is None and bench.slowest_rank("random:1:0.5", 4) is None
    job = bench.plan(["torch"], ["digits-noniid"], ["1,1,1,4"], ["sync"], 1)[0]
    assert bench.slow_classes(job, 4) == [3, 7]
    assert bench.slow_classes(dataclasses.replace(job, split="iid"), 4) == []
    assert bench.slow_classes(dataclasses.replace(job, profile="random"), 4) is None


def test_a_sync_target_is_synchronous_final_quality_of_the_same_repeat(tmp_path):
    jobs = bench.plan(["torch"], ["fashion-cnn"], ["1,1,1,4"], ["sync", "esync"], 2)
    settings = bench.settings_of(4, 0.05, 8.0)
    assert settings["targets"]["fashion-cnn"] == "sync" and settings["targets"]["digits"] == 0.95
    sync_dir = tmp_path / "jobs" / jobs[2].id
    sync_dir.mkdir(parents=True)
    (sync_dir / "curve.jsonl").write_text('{"t": 1.0, "step": 3, "accuracy": 0.5}\n{"t": 8.0, "step": 30, "accuracy": 0.74}\n')
    assert bench.resolve_target(jobs[3], settings, tmp_path) == 0.74          # repeat 1's ESync: repeat 1's sync
    assert bench.resolve_target(jobs[1], settings, tmp_path) is None          # repeat 0's sync has no curve
    with pytest.raises(ValueError, match="--outer MOMENTUM must be in"):
        bench.settings_of(4, 0.05, 8.0, outer=(0.7, 1.0))


def test_the_table_shows_the_slow_classes_and_a_sync_target():
    jobs = bench.plan(["torch"], ["fashion-cnn"], ["1,1,1,4"], ["sync", "esync"], 1, splits=["skew"])
    s = {"sync": dict(summary(8.0, 100, final=0.79), target=0.79, slow_classes=[3, 7], slow_final=0.85),
         "esync": dict(summary(2.0, 340, final=0.85), target=0.79, slow_classes=[3, 7], slow_final=0.95)}
    results = fake_results([(j, "done", s[j.strategy]) for j in jobs])
    text = report.markdown(results)
    assert ("### torch, Fashion-MNIST CNN (64 k parameters), split skew, profile 1,1,1,4 (target Synchronous's final "
            "accuracy, median 0.790, per repeat; slowest worker's classes 3, 7)") in text
    assert "| ESync | 2.0 | 4.00x | 0.850 | 0.950 | - |" in text


def test_an_iid_split_gives_the_slowest_worker_no_classes_of_its_own_at_any_size():
    for np_ in (2, 4):
        job = bench.plan(["torch"], ["digits"], [",".join(["1"] * (np_ - 1) + ["4"])], ["sync"], 1)[0]
        assert bench.slow_classes(job, np_) == []
    job = bench.plan(["torch"], ["digits-noniid"], ["1,4"], ["sync"], 1)[0]
    assert bench.slow_classes(job, 2) == [1, 3, 5, 7, 9]


@pytest.mark.parametrize("mode, base, per_sample", [
    ("padded", "0.05", None), ("padded-linear", "0", repr(0.05 / 32)), ("proportional", None, None)])
def test_each_slowdown_sets_its_variables_and_clears_the_others(monkeypatch, mode, base, per_sample):
    monkeypatch.setenv("HOROVOD_HETERO_BASE_STEP_S", "9")
    monkeypatch.setenv("HOROVOD_HETERO_SAMPLE_S", "9")
    job = bench.plan(["torch"], ["digits"], ["1,4"], ["sync"], 1)[0]
    _, env = bench.job_command(job, bench.settings_of(2, 0.05, 8.0, slowdown=mode), pathlib.Path("/tmp/j"))
    assert (env.get("HOROVOD_HETERO_BASE_STEP_S"), env.get("HOROVOD_HETERO_SAMPLE_S")) == (base, per_sample)


def test_a_curve_with_stop_at_checks_when_it_snapshots_and_tells_every_rank_once_reached(tmp_path, monkeypatch):
    import horovod_hetero_lab.harness as examples
    now = [100.0]
    monkeypatch.setattr(examples.time, "perf_counter", lambda: now[0])
    path, stop = tmp_path / "curve.jsonl", tmp_path / "curve.jsonl.stop"
    stop.write_text("an earlier run's\n")
    snapshots = iter([0.5, 0.85, 0.95, 0.96])
    pauses = []

    def evaluate(w):
        pauses.append(pathlib.Path(str(stop) + ".eval").exists())
        now[0] += 5.0                                        # an evaluation of 5 s: off the curve's clock
        return {"accuracy": w}
    curve = Curve(str(path), 0.0, lambda: next(snapshots), evaluate, "accuracy",
                  stop_at=(0.9, TASKS["fashion-cnn"].reached), stop_file=str(stop))
    assert not stop.exists()                                 # rank 0's curve removes an earlier run's file
    other = Curve(None, 0.0, lambda: 1 / 0, lambda w: 1 / 0, "accuracy", stop_at=(0.9, TASKS["fashion-cnn"].reached),
                  stop_file=str(stop))                     # another rank: no curve, the file only
    curve.begin()
    for step in (1, 2):
        now[0] += 1.0                                        # a step of 1 s
        curve.after_step(step, averaged=True)
    assert curve.points == [] and pauses == [True, True]    # checked as taken, the others told to wait
    assert not curve.stop_requested() and not other.stop_requested() and not stop.exists()
    now[0] += 1.0
    curve.after_step(3, averaged=True)
    assert curve.stop_requested() and other.stop_requested() and stop.read_text() == "3.0\n"
    assert not pathlib.Path(str(stop) + ".eval").exists()
    now[0] += 1.0
    curve.final(4)                                           # after training: evaluated with the rest, writes no file
    assert curve.clock() == 4.0
    curve.evaluate_all()
    assert [(p["t"], p["step"], p["accuracy"]) for p in bench.read_curve(path)] == [
        (1.0, 1, 0.5), (2.0, 2, 0.85), (3.0, 3, 0.95), (4.0, 4, 0.96)]
    assert curve.eval_s == 20.0 and len(pauses) == 4         # each snapshot evaluated once
    with pytest.raises(ValueError, match="stop_file: a path is needed with stop_at"):
        Curve(str(path), 0.0, list, dict, "accuracy", stop_at=(0.9, TASKS["fashion-cnn"].reached))
    with pytest.raises(ValueError, match="check_interval: seconds >= 0 or None, got -1"):
        Curve(str(path), 0.0, list, dict, "accuracy", check_interval=-1)


def test_a_curve_checks_once_per_check_interval_and_evaluates_the_snapshots_between_after_training(tmp_path,
                                                                                                    monkeypatch):
    import horovod_hetero_lab.harness as examples
    now = [0.0]
    monkeypatch.setattr(examples.time, "perf_counter", lambda: now[0])
    path, stop = tmp_path / "curve.jsonl", tmp_path / "curve.jsonl.stop"
    snapshots, during = iter([0.1, 0.2, 0.3, 0.4, 0.5, 0.95, 0.6]), []
    curve = Curve(str(path), 1.0, lambda: next(snapshots), lambda w: during.append(w) or {"accuracy": w}, "accuracy",
                  stop_at=(0.9, TASKS["fashion-cnn"].reached), stop_file=str(stop), check_interval=3.0)
    curve.begin()
    for step in range(1, 7):                                 # a snapshot a second, a check every third
        now[0] += 1.0
        curve.after_step(step, averaged=True)
    assert during == [0.1, 0.4] and not curve.reached     # the 0.95 at step 6 waits for the end
    curve.final(7)
    curve.evaluate_all()
    assert during == [0.1, 0.4, 0.2, 0.3, 0.5, 0.95, 0.6]
    points = bench.read_curve(path)
    assert [(p["t"], p["accuracy"]) for p in points] == [(1.0, 0.1), (2.0, 0.2), (3.0, 0.3), (4.0, 0.4), (5.0, 0.5),
                                                         (6.0, 0.95), (6.0, 0.6)]
    assert bench.time_to_target(points, "fashion-cnn", 0.9) == 6.0       # the second's resolution, not the check's


def test_another_rank_waits_while_rank_0_checks_and_leaves_the_wait_off_its_clock(tmp_path, monkeypatch):
    import horovod_hetero_lab.harness as examples
    now = [0.0]
    stop = tmp_path / "curve.jsonl.stop"
    pause = pathlib.Path(str(stop) + ".eval")
    monkeypatch.setattr(examples.time, "perf_counter", lambda: now[0])

    def sleep(s):                                            # rank 0's check ends after 0.5 s of waiting
        now[0] += s
        if now[0] >= 10.5:
            pause.unlink(missing_ok=True)
    monkeypatch.setattr(examples.time, "sleep", sleep)
    other = Curve(None, 0.0, list, dict, "accuracy", stop_at=(0.9, TASKS["fashion-cnn"].reached), stop_file=str(stop))
    other.begin()
    now[0] = 10.0
    pause.touch()
    assert not other.stop_requested() and now[0] == pytest.approx(10.5) and other.clock() == pytest.approx(10.0)
    pause.touch()                                            # a check that never ends: the wait gives up, says so
    monkeypatch.setattr(examples.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    assert not other.stop_requested() and pause.exists()
    assert now[0] == pytest.approx(10.5 + Curve.PAUSE_TIMEOUT_S, abs=0.01)


def test_stop_at_target_passes_the_target_and_a_cap_shortens_every_strategy_but_synchronous(tmp_path, monkeypatch):
    jobs = bench.plan(["torch"], ["digits"], ["1,4"], ["sync", "esync"], 2)
    settings = bench.settings_of(2, 0.025, 100.0, {"digits": 0.9}, stop_at_target=True, cap=3.0)
    bench.check_stop(settings, jobs)
    results = bench.new_results(tmp_path / "out", jobs, settings, ["horovod-hetero", "bench"])
    seen = {}

    def fake_run(cmd, env, log_path, timeout_s, tick=None):
        job_dir = pathlib.Path(log_path).parent
        seen[job_dir.name] = (cmd[cmd.index("--time-budget") + 1], cmd[cmd.index("--stop-at") + 1], timeout_s)
        (job_dir / "result.json").write_text("{}")
        return 0

    ttt = {"r0-sync": 5.0, "r1-sync": None, "r0-esync": None, "r1-esync": 2.0}
    monkeypatch.setattr(bench, "run_process", fake_run)
    monkeypatch.setattr(bench, "summarize_job",
                        lambda job, job_dir, s: dict(summary(ttt[job.id.split("-", 4)[-1]], 100), target=0.9,
                                                             metric="accuracy"))
    results = bench.run_bench(tmp_path / "out", results, lambda line: None)
    assert seen == {"torch-digits-iid-1_4-r0-sync": ("100.0", "0.9", 280.0),
                    "torch-digits-iid-1_4-r0-esync": ("15.0", "0.9", 195.0),        # 3 x Synchronous's 5 s
                    "torch-digits-iid-1_4-r1-sync": ("100.0", "0.9", 280.0),
                    "torch-digits-iid-1_4-r1-esync": ("100.0", "0.9", 280.0)}       # Synchronous missed
    assert [e["summary"]["budget_s"] for e in results["jobs"]] == [100.0, 15.0, 100.0, 100.0]
    rows = {r[0]: r for r in report.rows(report.groups(results)[("torch", "digits", "iid", "1,4")], budget=100)}
    assert rows["ESync"][1] == ">15 (2.0->15) [1/2 reached]"          # its own 15 s cap
    assert rows["ESync"][2] == "~25.17x (0.33-50.00)"      # <= 5/15 (missed its 15 s cap), >= 100/2
    assert "each strategy's at most 3x Synchronous's time to the target, every job stopped at the target" in \
        report.markdown(results)


@pytest.mark.parametrize("args,message", [
    (["--stop-at-target"], "--stop-at-target needs a quality to stop at: give --target fashion-cnn=VALUE"),
    (["--cap", "3", "--target", "fashion-cnn=sync"], "--cap needs a quality to stop at"),
    (["--cap", "0", "--target", "fashion-cnn=0.9"], "--cap must be > 0.0"),
    (["--stop-at-target", "--target", "fashion-cnn=0.9", "--framework", "keras"],
     "--stop-at-target runs the torch example only"),
    (["--stop-at-target", "--target", "fashion-cnn=0.9", "--hosts", "a:2,b:2"], "--stop-at-target runs on one host"),
    (["--check-interval", "5", "--target", "fashion-cnn=0.9"],
     "--check-interval spaces the checks of --stop-at-target: give --stop-at-target too"),
    (["--stop-at-target", "--check-interval", "-1", "--target", "fashion-cnn=0.9"], "--check-interval must be a number >= 0.0, got -1.0"),
    (["--cap", "3", "--target", "fashion-cnn=0.9", "--strategies", "esync,elasticbsp"],
     "--cap bounds each strategy by Synchronous's time to the target: give --strategies sync and at least one"),
])
def test_bench_refuses_stop_and_cap_where_they_cannot_apply(tmp_path, args, message):
    strategies = [] if "--strategies" in args else ["--strategies", "sync,esync"]
    bad = CliRunner().invoke(cli, ["bench", "--task", "fashion-cnn", *strategies, *args,
                                   "--out", str(tmp_path / "o")])
    assert bad.exit_code == 2 and message in bad.output, bad.output
    assert not (tmp_path / "o").exists()
