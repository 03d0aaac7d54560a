import json

import pytest

from fakes import ArrayCollectives, ArrayModel, scripted
from horovod_hetero.runtime.controller import HeteroController, ring_bytes
from horovod_hetero.runtime.straggler import Slowdown, parse_factors
from horovod_hetero.runtime.telemetry import Telemetry, format_summary, load, summarize
from horovod_hetero.strategies import ESync, LocalSGD


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_slowdown_proportional_and_fixed_base():
    slept = []
    s = Slowdown(rank=3, factors="1,1,1,4", sleep=slept.append)
    assert s.pad(5.0) == 0.0 and slept == []                            # the first step (start-up) is not slowed
    assert s.pad(0.01) == pytest.approx(0.03) and slept == [pytest.approx(0.03)]
    fixed = Slowdown(rank=1, factors=[1, 2], base_step_s=0.05, sleep=slept.append)
    assert fixed.pad(0.01) == pytest.approx(0.09)
    assert Slowdown(rank=0, factors=[1, 2], base_step_s=0.05, sleep=slept.append).pad(0.07) == 0.0
    assert not Slowdown(rank=0, factors=None).active


def test_a_padded_linear_step_grows_with_its_batch(monkeypatch):
    slept = []
    slow = Slowdown(rank=1, factors=[1, 4], base_step_s=0.01, per_sample_s=0.001, sleep=slept.append)
    assert slow.pad(0.02, samples=10) == pytest.approx(4 * (0.01 + 0.010) - 0.02)
    assert slow.pad(0.02, samples=40) == pytest.approx(4 * (0.01 + 0.040) - 0.02)
    assert slept == [pytest.approx(0.06), pytest.approx(0.18)]
    # no base step: the step is the per-sample part alone; a step longer than its padding is not padded
    assert Slowdown(rank=0, factors=[1, 4], per_sample_s=0.001, sleep=slept.append).pad(0.05, samples=30) == 0.0
    monkeypatch.setenv("HOROVOD_HETERO_SAMPLE_S", "0.002")
    assert Slowdown(rank=1, factors=[1, 4], sleep=slept.append).pad(0.0, samples=5) == pytest.approx(0.04)
    with pytest.raises(ValueError, match=r"per_sample_s \(HOROVOD_HETERO_SAMPLE_S\) pads a step by its samples"):
        Slowdown(rank=1, factors=[1, 4], sleep=slept.append).pad(0.0)


def test_an_adapter_that_cannot_count_samples_needs_a_batch_size_when_built(monkeypatch):
    from horovod_hetero.common.options import check_samples_known
    check_samples_known(None, None)                                    # no per-sample padding: nothing needed
    check_samples_known(Slowdown(0, per_sample_s=0.001), 32)
    with pytest.raises(ValueError, match=r"HOROVOD_HETERO_SAMPLE_S \(per_sample_s\) pads each batch by its "
                                         r"samples: give batch_size="):
        check_samples_known(Slowdown(0, per_sample_s=0.001), None)
    monkeypatch.setenv("HOROVOD_HETERO_SAMPLE_S", "0.001")
    with pytest.raises(ValueError, match="give batch_size="):
        check_samples_known("1,4", None)
    with pytest.raises(ValueError, match="give batch_size="):
        check_samples_known(Slowdown(0), None)                         # an instance built here reads it too
    with pytest.raises(ValueError, match="samples must be"):
        Slowdown(0, per_sample_s=0.001).pad(0.0, samples=-1)


@pytest.mark.parametrize("value", ["slow", "inf", "-0.001", "nan", "1e300"])
def test_a_bad_per_sample_time_names_its_variable(monkeypatch, value):
    monkeypatch.setenv("HOROVOD_HETERO_SAMPLE_S", value)
    with pytest.raises(ValueError, match="HOROVOD_HETERO_SAMPLE_S must be finite seconds per sample from 0 to 3600"):
        Slowdown(0)


@pytest.mark.parametrize("value, error", [(-0.1, ValueError), (float("nan"), ValueError), ("1ms", TypeError)])
def test_a_bad_per_sample_argument_is_named(value, error):
    with pytest.raises(error, match="per_sample_s"):
        Slowdown(0, per_sample_s=value)


def test_slowdown_reads_the_environment(monkeypatch):
    monkeypatch.setenv("HOROVOD_HETERO_SLOWDOWN", "1,2.5")
    assert Slowdown(rank=1).factor == 2.5


@pytest.mark.parametrize("text", ["1,x", "1,0", "1,-2", "", "1,1e300"])
def test_bad_factors_name_the_variable(text):
    with pytest.raises((ValueError, TypeError), match="HOROVOD_HETERO_SLOWDOWN"):
        parse_factors(text)


def test_too_few_factors_for_the_rank():
    with pytest.raises(ValueError, match="one factor per rank"):
        Slowdown(rank=4, factors="1,1,1,4")


def test_controller_records_compute_comm_and_bytes(tmp_path):
    clock = FakeClock()
    slept = []

    def sleep(s):
        slept.append(s)
        clock.now += s

    def collective(control):
        clock.now += 0.5                           # the collective takes 0.5 s
        return [c * 2 for c in control]

    ctl = HeteroController(LocalSGD(period=2), ArrayCollectives(scripted(collective), rank=1, size=2),
                           ArrayModel({}, nbytes=1000), telemetry=str(tmp_path),
                           step_hooks=[Slowdown(1, "1,3", sleep=sleep).pad], clock=clock)
    for _ in range(4):
        clock.now += 0.1                           # 0.1 s of compute, padded to 0.3 s (the first step: not padded)
        ctl.telemetry.annotate(samples=32, loss=1.0)
        ctl.after_step()
    ctl.telemetry.close()
    recs = load(str(tmp_path))[1]
    assert [r["synced"] for r in recs] == [False, True, False, True]
    assert [r["local_steps"] for r in recs] == [1, 2, 1, 2]
    assert [round(r["compute_s"], 9) for r in recs] == [0.1, 0.3, 0.3, 0.3]
    assert [round(r["comm_s"], 9) for r in recs] == [0.0, 0.5, 0.0, 0.5]
    assert [r["bytes_sent"] for r in recs] == [0, 1000, 0, 1000] == [0, ring_bytes(1000, 2), 0, 1000]
    summary = summarize({1: recs})[1]
    assert summary["steps"] == 4 and summary["syncs"] == 2 and summary["samples"] == 128
    assert summary["compute_ratio"] == pytest.approx(1.0 / 2.0)
    assert summary["wait_share"] == pytest.approx(1.0 / 2.0)
    assert summary["samples_per_s"] == pytest.approx(128 / 2.0)
    assert summary["mean_local_steps"] == 2.0
    assert "samples/s" in format_summary(summarize({1: recs}))
    assert json.loads((tmp_path / "rank1.jsonl").read_text().splitlines()[0])["rank"] == 1


def test_annotations_go_to_the_next_record_only():
    t = Telemetry(rank=0, directory="")
    t.annotate(loss=2.0)
    t.record(step=1)
    t.record(step=2)
    assert "loss" in t.records[0] and "loss" not in t.records[1]


def test_opening_a_strategys_transports_is_neither_compute_nor_communication():
    """ESync's server-address broadcast waits for every rank to start (imports, model set-up): 5 s
    here. The first step's record holds only its own 0.1 s of compute."""
    clock = FakeClock()

    def broadcast(obj):
        clock.now += 5.0
        return obj

    ctl = HeteroController(ESync(warmup_step=False), ArrayCollectives(lambda rank, arrays: arrays, broadcast=broadcast),
                           ArrayModel({}), clock=clock)
    ctl.start()
    clock.now += 0.1
    ctl.after_step()
    ctl.finish()
    record = ctl.telemetry.records[0]
    assert (record["compute_s"], record["comm_s"], record["synced"]) == (pytest.approx(0.1), 0.0, True)


def test_slowdown_schedule_changes_speeds_from_the_ranks_first_step():
    now = [100.0]
    rank3 = Slowdown(3, "1,1,1,1;15:1,1,1,4;30:2,1,1,4", base_step_s=0.1, sleep=lambda s: None, clock=lambda: now[0])
    rank0 = Slowdown(0, [(0, [1, 1, 1, 1]), (15, [1, 1, 1, 4]), (30, [2, 1, 1, 4])], base_step_s=0.1,
                     sleep=lambda s: None, clock=lambda: now[0])
    pads = []
    for t in (100.0, 114.9, 115.0, 129.9, 130.0):        # the first pad starts the schedule's clock
        now[0] = t
        pads.append((round(rank0.pad(0.0), 9), round(rank3.pad(0.0), 9)))
    assert pads == [(0.1, 0.1), (0.1, 0.1), (0.1, 0.4), (0.1, 0.4), (0.2, 0.4)]
    assert rank0.active and not Slowdown(0, "1,1;5:1,1").active


@pytest.mark.parametrize("factors,error,match", [
    ("1,1;5:1", ValueError, "same number of factors"),
    ("5:1,1", ValueError, "times increasing from 0"),
    ("1,1;5:1,2;3:1,1", ValueError, "times increasing from 0"),
    ("1,1;inf:1,2", ValueError, "times increasing from 0"),
    ("1,inf", ValueError, "must be a finite number"),
    (5, TypeError, "a list of per-rank factors or of"),
    ([(0, [1, 2]), (10, [1])], ValueError, "same number of factors"),
    ([1, float("inf")], ValueError, "slowdown factor must be a finite number"),
    ("1,1e300", ValueError, r"slowdown must be <= 1000.0, got 1e\+300"),     # not an OverflowError mid-training
])
def test_bad_slowdown_schedules_name_the_form(factors, error, match):
    with pytest.raises(error, match=match):
        Slowdown(1, factors)


@pytest.mark.parametrize("value", ["fast", "inf", "-0.1", "nan", "1e300"])
def test_a_bad_base_step_names_its_variable(monkeypatch, value):
    monkeypatch.setenv("HOROVOD_HETERO_BASE_STEP_S", value)
    with pytest.raises(ValueError, match="HOROVOD_HETERO_BASE_STEP_S must be finite seconds from 0 to 3600"):
        Slowdown(0)


@pytest.mark.parametrize("text", ["1:inf", "1:nan", "1:1e300"])
def test_a_random_delay_must_be_finite(text):
    with pytest.raises((ValueError, TypeError), match="random_delay seconds"):
        Slowdown(0, size=2, random_delay=text)
