"""``horovod-hetero benchmark auto``'s verdict on a final run (``bench``'s jobs): medians of time to the target,
a job that missed it counting as never, Synchronous's time over each strategy's per repeat, Auto against the
best fixed strategy and against Synchronous (0.95x on a cluster of equal workers)."""
import json

from horovod_hetero_lab.benchmarks.auto import (by_target, equal_workers, median_time, speedups, table, target_table,
                                                verdict)


def job(strategy, repeat, seconds):
    done = seconds is not None
    return {"strategy": strategy, "repeat": repeat, "status": "done" if done else "failed",
            "summary": {"time_to_target_s": seconds} if done else None}


FINAL = [job("sync", r, t) for r, t in enumerate([300.0, 310.0, 290.0])] + \
        [job("esync", r, t) for r, t in enumerate([100.0, 105.0, 95.0])] + \
        [job("auto", r, t) for r, t in enumerate([108.0, 104.0, None])] + \
        [job("localsgd", r, t) for r, t in enumerate([None, None, 250.0])]


def test_medians_count_a_missed_target_as_never():
    assert median_time([100.0, None, 90.0]) == 100.0 and median_time([None, None, 90.0]) is None


def test_auto_within_ten_percent_of_the_best_fixed_strategy_and_ahead_of_synchronous():
    rows, said = verdict(FINAL, even=False)
    by = {r["strategy"]: r for r in rows}
    assert by["auto"]["median_s"] == 108.0 and by["auto"]["reached"] == "2/3" and by["localsgd"]["median_s"] is None
    assert speedups(FINAL, "auto") == [300.0 / 108.0, 310.0 / 104.0]
    assert said["best_fixed"] == "esync" and said["within_10_percent"] and said["not_behind_sync"]
    assert round(said["auto_vs_best"], 3) == round(100.0 / 108.0, 3)
    assert "within 10 %: True" in table(rows, said)


def test_a_slower_auto_fails_the_verdict_and_equal_workers_allow_five_percent():
    slow = [j if j["strategy"] != "auto" else job("auto", j["repeat"], 120.0) for j in FINAL]
    assert not verdict(slow, even=False)[1]["within_10_percent"]
    behind = [j for j in FINAL if j["strategy"] in ("sync", "auto")]
    behind = [j if j["strategy"] != "auto" else job("auto", j["repeat"], 310.0) for j in behind]
    said = verdict(behind, even=True)[1]
    assert said["sync_floor"] == 0.95 and said["not_behind_sync"] and said["best_fixed"] == "sync"
    assert not verdict(behind, even=False)[1]["not_behind_sync"]


def test_equal_workers_is_a_constant_profile():
    assert equal_workers("1,1,1,1") and not equal_workers("random") and not equal_workers("1,1,1,1;15:1,1,1,4")


def test_lower_targets_are_read_from_each_jobs_curve(tmp_path):
    curves = {"auto": [(5.0, 0.85), (10.0, 0.875), (15.0, 0.86), (20.0, 0.891)],
              "sync": [(5.0, 0.80), (10.0, 0.862), (15.0, 0.87)]}
    jobs = []
    for name, points in curves.items():
        jobs.append({"id": f"{name}-r0", "strategy": name, "repeat": 0, "status": "done"})
        (tmp_path / "jobs" / f"{name}-r0").mkdir(parents=True)
        (tmp_path / "jobs" / f"{name}-r0" / "curve.jsonl").write_text(
            "".join(json.dumps({"t": t, "accuracy": a}) + "\n" for t, a in points))
    jobs.append({"id": "sync-r1", "strategy": "sync", "repeat": 1, "status": "failed"})
    found = by_target(tmp_path, jobs, "fashion-cnn", [0.86, 0.87, 0.89])
    assert found["auto"] == {0.86: 10.0, 0.87: 10.0, 0.89: 20.0}
    # a failed repeat counts as never: the median of (10, never) is never, as for the verdict
    assert found["sync"] == {0.86: None, 0.87: None, 0.89: None}
    assert "| Auto against the best fixed | - | - | - |" in target_table(found, [0.86, 0.87, 0.89])
