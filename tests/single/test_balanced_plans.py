"""``horovod-hetero benchmark balanced_plans`` on a bench results directory written here: the plans it finds,
the settled span it measures, the ratio against Synchronous over the same seconds, and the bound."""
import json

import pytest

from horovod_hetero_lab.benchmarks import balanced_plans


def write_job(out, job_id, steps):
    """``steps``: per step, (seconds since the start, every rank's batch)."""
    telemetry = out / "jobs" / job_id / "telemetry"
    telemetry.mkdir(parents=True)
    for rank in range(len(steps[0][1])):
        with open(telemetry / f"rank{rank}.jsonl", "w") as f:
            for t, batches in steps:
                f.write(json.dumps({"rank": rank, "time": 1000.0 + t, "batch": batches[rank],
                                    "samples": batches[rank]}) + "\n")


def test_plans_the_settled_span_and_the_ratio_against_synchronous(tmp_path, capsys):
    # Balanced: 10 even steps of 4 s, then 40 steps of 1.25 s at 40,39,39,10; Synchronous: 4 s a step
    even, planned = (32, 32, 32, 32), (40, 39, 39, 10)
    write_job(tmp_path, "b", [(4.0 * (i + 1), even) for i in range(10)]
              + [(40.0 + 1.25 * (i + 1), planned) for i in range(40)])
    write_job(tmp_path, "s", [(4.0 * (i + 1), even) for i in range(23)])
    jobs = [{"id": job_id, "framework": "torch", "task": "fashion-cnn", "split": "iid", "profile": "1,1,1,4",
             "repeat": 0, "strategy": strategy, "status": "done"} for job_id, strategy in (("b", "balanced"),
                                                                                          ("s", "sync"))]
    (tmp_path / "results.json").write_text(json.dumps({"jobs": jobs}))
    balanced_plans.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "b: 1 plan changes; step 1 (0.0 s): 32,32,32,32; step 11 (37.2 s): 40,39,39,10" in out
    # seconds from the first step (which ends at 4 s); settled: 128 samples every 1.25 s against 128 every 4 s
    assert "settled from step 11 (37.2 s, 39 steps to 86.0 s): 3.20x Synchronous's samples/s (bound 3.25x, " \
           "share 0.98)" in out


@pytest.mark.parametrize("profile, bound", [("1,1,1,4", 3.25), ("1,1,1,1;10:1,1,1,4", 3.25), ("1,2", 1.5),
                                            ("1,1", 1.0)])
def test_the_bound_is_the_summed_speed_over_synchronous(profile, bound):
    assert balanced_plans.bound(profile) == pytest.approx(bound)
