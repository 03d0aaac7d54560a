"""ADSP: the loss-curve fit, the reward, the commit-rate search and the strategy's commit deadlines,
from injected clocks, step reports and round statistics (exact)."""
import logging
import math

import numpy as np
import pytest

from horovod_hetero.rules.commit_rate import CommitRateSearch, commit_period, fit_loss_curve, loss_model, reward
from horovod_hetero.simulate import Cluster, simulate
from horovod_hetero.strategies import (
    ADSP, AVERAGE, CONTINUE, Context, RoundResult, RoundStats, StepReport, Steps, check_strategy)

NAN = math.nan


# --- the rules ---------------------------------------------------------------------------------------

def test_fit_recovers_a_noisy_curve():
    rng = np.random.default_rng(0)
    t = np.linspace(100, 160, 80)
    truth = loss_model(t - 100, 0.3, 0.5, 0.1)
    a1, a2, a3 = fit_loss_curve(t, truth + rng.normal(0, 0.002, t.size))
    np.testing.assert_allclose(loss_model(t, a1, a2, a3), truth, atol=0.005)


def test_reward_is_one_over_the_time_the_curve_reaches_the_loss():
    assert reward((0.5, 1.0, 0.2), 0.2 + 1 / 3) == 0.125          # 1/(0.25 t + 1) = 1/3 at t = 8
    assert reward((-0.5, 1.0, 0.2), 0.2 + 1 / 3) == 0.125         # a1 enters squared
    assert reward((0.5, 1.0, 0.2), 0.2) == 0.0                    # the asymptote is never reached
    assert reward((0.0, 1.0, 0.2), 0.5) == 0.0                    # a flat curve never gets there
    assert reward((0.5, 1.0, 0.2), 1.5) == math.inf               # above the curve at t = 0 already
    with pytest.raises(ValueError, match="loss"):
        reward((0.5, 1.0, 0.2), NAN)


def run_search(speed, fit_points=4, max_rate=None, rounds=200):
    """Feed a search one round a second; the loss falls at ``speed[rate]`` of the rate that ran.

    The loss is a function of the progress made so far, so each trial starts where the previous one
    stopped (the online search's changing system state)."""
    search, t, progress = CommitRateSearch(fit_points=fit_points), 0.0, 0.0
    for _ in range(rounds):
        if not search.searching:
            break
        t, progress = t + 1.0, progress + speed(search.rate)
        search.add(t, float(loss_model(progress, 0.2, 1.0, 0.1)), max_rate=max_rate)
    return search


@pytest.mark.parametrize("best", [1, 2, 3, 5])
def test_the_search_settles_on_the_commit_rate_whose_loss_falls_fastest(best):
    search = run_search(lambda rate: 1.0 / (1.0 + 0.2 * (rate - best) ** 2))
    assert search.rate == best and not search.searching and not search.stalled
    assert [h["candidate"] for h in search.history] == list(range(1, best + 2))
    assert [h["rate"] for h in search.history] == list(range(2, best + 2)) + [best]
    # each trial ran whole check periods (rate rounds each), at least fit_points rounds
    assert [h["points"] for h in search.history] == [rate * -(-4 // rate) for rate in range(1, best + 2)]


def test_a_higher_rate_is_tried_only_while_every_worker_can_keep_it():
    search = run_search(lambda rate: float(rate), max_rate=3)       # higher is always better
    assert search.rate == 3 and [h["candidate"] for h in search.history] == [1, 2, 3]


def test_trials_without_losses_keep_the_rate_they_ran():
    search = CommitRateSearch(fit_points=3)
    for t in range(1, 4):
        search.add(float(t), [NAN, math.inf, 0.5][t - 1])
    assert not search.searching and search.stalled and search.rate == 1
    assert search.history == [{"candidate": 1, "points": 1, "rate": 1, "searching": False, "stalled": True}]
    assert search.add(4.0, 0.4) is None                              # settled: nothing more is recorded


def test_search_state_round_trip_mid_trial():
    speed = lambda rate: 1.0 / (1.0 + 0.2 * (rate - 3) ** 2)       # noqa: E731
    a = CommitRateSearch(fit_points=3)
    t = progress = 0.0
    for _ in range(5):                                                # mid-way through the second trial
        t, progress = t + 1.0, progress + speed(a.rate)
        a.add(t, float(loss_model(progress, 0.2, 1.0, 0.1)))
    b = CommitRateSearch(fit_points=3)
    b.load_state_dict(a.state_dict())
    while a.searching:
        t, progress = t + 1.0, progress + speed(a.rate)
        loss = float(loss_model(progress, 0.2, 1.0, 0.1))
        assert a.add(t, loss) == b.add(t, loss)
    assert (b.rate, b.searching, b.history) == (3, False, a.history)


def test_commit_timer():
    assert commit_period(60.0, 3, 1.0) == 19.0
    assert commit_period(1.0, 4, 2.0) == 0.0
    with pytest.raises(ValueError, match="delta_commits"):
        commit_period(60.0, 0, 0.0)
    with pytest.raises(ValueError, match="gamma"):
        commit_period(0.0, 1, 0.0)


def test_bad_samples():
    with pytest.raises(ValueError, match="same length"):
        fit_loss_curve([0, 1, 2], [1.0, 0.5])
    with pytest.raises(ValueError, match="finite"):
        fit_loss_curve([0, 1, 2], [1.0, float("nan"), 0.2])
    with pytest.raises(ValueError, match="fit_points"):
        CommitRateSearch(fit_points=2)


# --- the strategy ------------------------------------------------------------------------------------

class Clock:
    def __init__(self, now=0.0):
        self.now = now

    def __call__(self):
        return self.now


def stats(local_steps, step_s, loss=None, done=None):
    n = len(local_steps)
    return RoundStats(local_steps=np.array(local_steps, dtype=np.int64), step_s=np.array(step_s, dtype=float),
                      loss=np.array(loss if loss is not None else [NAN] * n, dtype=float),
                      samples=np.zeros(n, dtype=np.int64), done=np.array(done or [False] * n))


def started(rank=0, size=4, clock=None, **kwargs):
    clock = clock or Clock()
    s = ADSP(**kwargs)
    s.start(Context(rank, size, None, None, clock))
    return s, clock


def warm_up(s, clock, step_s, exit_at):
    """The two warm-up rounds (one step each; the first holds start-up); the second exits at ``exit_at``."""
    n = len(step_s)
    clock.now = 5.0
    assert s.after_step(StepReport(5.0)) is AVERAGE
    s.after_round(RoundResult(1, 1.0, n, 0, stats([1] * n, [5.0] * n)))
    clock.now = 5.0 + step_s[s.rank]
    assert s.after_step(StepReport(step_s[s.rank])) is AVERAGE
    clock.now = exit_at
    s.after_round(RoundResult(2, 1.0, n, 0, stats([1] * n, step_s)))


def steps_until_average(s, clock, step_s):
    """Step at ``step_s`` seconds a step until the strategy answers AVERAGE; the steps taken."""
    for k in range(1, 1000):
        clock.now += step_s
        if s.after_step(StepReport(step_s)) is AVERAGE:
            return k
    raise AssertionError("never averaged")


SPEEDS = [0.125, 0.125, 0.125, 0.5]          # binary fractions: the clock's sums are exact


@pytest.mark.parametrize("rank, expected", [(0, 16), (3, 4)])
def test_a_rank_steps_while_its_next_step_ends_before_its_commit_deadline(rank, expected):
    s, clock = started(rank, check_period=2.0, search_every=None)
    warm_up(s, clock, SPEEDS, exit_at=5.5)
    assert s.deadline == 7.5 and s.overhead_s == 0.0 and s.commit_rate == 1 and s.c_target == 3
    # the fast rank's 16th step ends at 7.5 (its 17th would end after the deadline); the slow one's 4th
    assert steps_until_average(s, clock, SPEEDS[rank]) == expected and clock.now == 7.5
    # the round ends at 7.75: 0.25 s past the longest compute (2 s) is this rank's commit overhead
    clock.now = 7.75
    s.after_round(RoundResult(3, 1.0, 4, 0, stats([16, 16, 16, 4], SPEEDS, [1.0] * 4)))
    assert s.overhead_s == 0.25 and s.deadline == 7.75 + 2.0 - 0.25
    assert steps_until_average(s, clock, SPEEDS[rank]) == expected - (2 if rank < 3 else 1)


def test_the_prediction_is_the_median_of_the_latest_step_times():
    s, clock = started(0, check_period=2.0, search_every=None, window=3)
    warm_up(s, clock, SPEEDS, exit_at=5.5)
    for step_s in (0.125, 1.0, 0.25):                  # median 0.25
        clock.now += step_s
        assert s.after_step(StepReport(step_s)) is CONTINUE
    assert clock.now == 6.875
    clock.now = 7.25                                   # 7.25 + 0.25 = 7.5: still on time
    assert s.after_step(StepReport(0.25)) is CONTINUE
    clock.now = 7.25 + 0.0078125                       # now a step ends after 7.5
    assert s.after_step(StepReport(0.25)) is AVERAGE


def test_a_step_count_period_is_steps_of_the_slowest_rank():
    s, clock = started(0, check_period="8steps", search_every="40steps")
    warm_up(s, clock, SPEEDS, exit_at=5.5)
    assert s.check_period_s() == 4.0 and s.deadline == 9.5
    assert steps_until_average(s, clock, 0.125) == 32
    assert s.max_rate() == 8 and started(0, check_period=2.0)[0].max_rate() is None
    s, clock = started(0, check_period=2.0)
    warm_up(s, clock, SPEEDS, exit_at=5.5)
    assert s.max_rate() == 4                                      # 2 s holds four of the slowest rank's steps
    assert Steps(8) == ADSP(check_period=Steps(8)).check_period == ADSP(check_period=" 8 steps").check_period


def feed(strategies, clocks, round_stats):
    """One round with these statistics on every rank; each rank exits at its own clock."""
    for s, clock in zip(strategies, clocks):
        clock.now += 1.0 + 0.001 * s.rank
        s.after_round(RoundResult(s.commits + 1, 1.0, 4, 0, round_stats))


def test_every_rank_searches_the_same_on_the_rounds_statistics_and_settles_on_the_best():
    best = 3
    speed = lambda rate: 1.0 / (1.0 + 0.2 * (rate - best) ** 2)     # noqa: E731
    ranks = [started(r, check_period=2.0, search_every=None) for r in range(4)]
    strategies, clocks = [s for s, _ in ranks], [c for _, c in ranks]
    for s, clock in ranks:
        warm_up(s, clock, SPEEDS, exit_at=5.5)
    progress, rng = 0.0, np.random.default_rng(1)
    while strategies[0].search.searching:
        rate = strategies[0].commit_rate
        interval = 2.0 / rate
        progress += interval * speed(rate)
        loss = float(loss_model(progress, 0.2, 1.0, 0.1))
        # every rank's mean loss since the round; the mean over them is the curve's value
        spread = rng.normal(0, 0.01, 3)
        feed(strategies, clocks, stats([4, 4, 4, 1], SPEEDS, [*(loss + spread), loss - spread.sum()]))
        assert len({(s.commit_rate, s.c_target, s.elapsed) for s in strategies}) == 1
    assert all(s.commit_rate == best and not s.search.searching for s in strategies)
    history = strategies[0].search.history
    assert [h["candidate"] for h in history] == [1, 2, 3, 4]
    assert all(s.search.history == history for s in strategies)
    # the time axis: the commit interval of each round (the compute, 0.5 s, was shorter)
    assert strategies[0].elapsed == pytest.approx(sum(2.0 / h["candidate"] * h["points"] for h in history))
    fields = strategies[0].telemetry_fields()
    assert fields["commit_rate"] == best and fields["search"] is history[-1]
    assert strategies[0].telemetry_fields().keys() == {"commit_rate", "c_target"}


def test_checkpoints_set_the_commit_target_and_a_new_search_starts_every_search_every():
    s, clock = started(0, check_period=2.0, search_every=20.0, fit_points=3)
    warm_up(s, clock, SPEEDS, exit_at=5.5)
    assert (s.commits, s.c_target) == (2, 3)                 # the search starts at a checkpoint
    targets = []
    for k in range(12):                                       # rounds of 2 s; one loss curve whatever the rate
        clock.now += 2.0
        s.after_round(RoundResult(3 + k, 1.0, 4, 0, stats([16, 16, 16, 4], SPEEDS, [1.0 / (k + 1)] * 4)))
        targets.append((s.commits, s.commit_rate, s.c_target, s.search.searching, s.elapsed))
    # rate 1 for 3 rounds (its fit's 3 points), rate 2 for two periods of 2 rounds: no better, back to 1;
    # c_target = c_i + rate at each checkpoint; at 20 s of rounds a new search starts from rate 1
    assert targets == [(3, 1, 4, True, 2.0), (4, 1, 5, True, 4.0), (5, 2, 7, True, 6.0), (6, 2, 7, True, 8.0),
                       (7, 2, 9, True, 10.0), (8, 2, 9, True, 12.0), (9, 1, 10, False, 14.0),
                       (10, 1, 11, False, 16.0), (11, 1, 12, False, 18.0), (12, 1, 13, True, 20.0),
                       (13, 1, 14, True, 22.0), (14, 1, 15, True, 24.0)]
    assert [h["candidate"] for h in s.search.history] == [1, 2]


def test_non_finite_losses_are_skipped_with_one_warning_and_no_losses_keep_the_rate(caplog):
    s, clock = started(0, check_period=2.0, search_every=None, fit_points=3)
    warm_up(s, clock, SPEEDS, exit_at=5.5)
    with caplog.at_level(logging.WARNING, logger="horovod_hetero"):
        for loss in (NAN, math.inf, NAN):
            clock.now += 0.125
            s.after_step(StepReport(0.125, loss=loss))
        for k in range(3):
            clock.now += 2.0
            s.after_round(RoundResult(3 + k, 1.0, 4, 0, stats([16, 16, 16, 4], SPEEDS)))
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "left out of the commit-rate search" in m]) == 1
    assert len([m for m in messages if "report the loss" in m]) == 1
    assert s.commit_rate == 1 and s.search.stalled and not s.search.searching


def test_a_rank_that_left_or_did_not_step_measures_no_overhead():
    s, clock = started(0, check_period=2.0, search_every=None)
    warm_up(s, clock, SPEEDS, exit_at=5.5)
    s.leave()
    clock.now = 20.0
    s.after_round(RoundResult(3, 0.0, 3, 1, stats([0, 16, 16, 4], SPEEDS, done=[True, False, False, False])))
    assert s.overhead_s == 0.0 and s.deadline == 22.0


def test_state_dict_round_trip():
    s, clock = started(0, check_period="8steps", search_every="40steps")
    warm_up(s, clock, SPEEDS, exit_at=5.5)
    for k in range(3):
        clock.now += 4.0
        s.after_round(RoundResult(3 + k, 1.0, 4, 0, stats([32, 32, 32, 8], SPEEDS, [1.0 / (k + 1)] * 4)))
    state = s.state_dict()
    t, _ = started(0, check_period="8steps", search_every="40steps")
    t.load_state_dict(state)
    assert t.state_dict() == state and t.commit_rate == s.commit_rate and t.c_target == s.c_target
    clock.now += 4.0
    result = RoundResult(6, 1.0, 4, 0, stats([32, 32, 32, 8], SPEEDS, [0.2] * 4))
    s.after_round(result)
    t.after_round(result)
    assert t.state_dict() == s.state_dict()
    with pytest.raises(ValueError, match="cannot load it into ADSP"):
        t.load_state_dict({"kind": "ESync", "step": 0})


@pytest.mark.parametrize("kwargs, error, match", [
    ({"check_period": 0}, ValueError, "check_period"),
    ({"check_period": -1.0}, ValueError, "check_period"),
    ({"check_period": math.inf}, ValueError, "check_period"),
    ({"check_period": "60"}, ValueError, "check_period must be seconds"),
    ({"check_period": "0steps"}, ValueError, "check_period"),
    ({"check_period": "0s"}, ValueError, "check_period"),
    ({"check_period": "-1s"}, ValueError, "check_period"),
    ({"check_period": None}, TypeError, "check_period"),
    ({"check_period": True}, TypeError, "check_period"),
    ({"check_period": [60]}, TypeError, "check_period"),
    ({"search_every": "x"}, ValueError, "search_every"),
    ({"search_every": 119.0}, ValueError, "search_every must be at least two check periods"),
    ({"check_period": "10steps", "search_every": "19steps"}, ValueError, "at least two check periods"),
    ({"check_period": "10steps", "search_every": 600.0}, ValueError, "search_every must be in the unit"),
    ({"fit_points": 2}, ValueError, "fit_points"),
    ({"window": 0}, ValueError, "window"),
])
def test_bad_arguments_fail_at_construction_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        ADSP(**{"check_period": 60.0, **kwargs})
    with pytest.raises(ValueError, match="Steps.count"):
        Steps(0)


def test_simulated_cluster_fast_workers_step_more_per_commit_and_wait_little():
    r = simulate(Cluster([0.1, 0.1, 0.1, 0.4], latency_s=1e-3), ADSP(check_period="10steps", search_every=None),
                 duration=60.0)
    steady = np.array(r.round_steps[2:])
    assert (steady[:, :3] >= 3 * steady[:, 3:]).all() and (steady[:, 3] >= 1).all()
    assert r.compute_ratio[:3].min() > 0.9
    assert check_strategy(ADSP()).label == "ADSP(60s)" and repr(ADSP("8steps", None)) == \
        "ADSP(check_period='8steps', search_every=None)"
    assert ADSP("8steps").search_every == Steps(160) and ADSP(60.0).search_every == 1200.0
    assert ADSP("1.5s", "30s").check_period == 1.5 and ADSP("1.5s", "30s").search_every == 30.0
