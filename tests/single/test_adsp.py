import numpy as np
import pytest

from horovod_hetero.rules.adsp import (CommitRateSearch, commit_period, fit_loss_curve, loss_model,
                                        reward)


def test_fit_recovers_a_noisy_curve():
    rng = np.random.default_rng(0)
    t = np.linspace(100, 160, 80)
    truth = loss_model(t - 100, 0.3, 0.5, 0.1)
    a1, a2, a3 = fit_loss_curve(t, truth + rng.normal(0, 0.002, t.size))
    np.testing.assert_allclose(loss_model(t, a1, a2, a3), truth, atol=0.005)


def synthetic_trial(commit_target, best=7, start=0.0, period=60.0):
    """A trial whose loss falls fastest when commit_target == best (rate peaks there)."""
    speed = 1.0 / (1.0 + 0.15 * (commit_target - best) ** 2)
    t = np.linspace(start, start + period, 40)
    return t, loss_model(t - start, 0.2 * np.sqrt(speed), 0.6, 0.05)


def test_reward_is_higher_for_faster_falling_loss():
    assert reward(*synthetic_trial(7)) > reward(*synthetic_trial(6)) > reward(*synthetic_trial(4))


def test_search_climbs_to_the_best_commit_target_and_stops():
    search = CommitRateSearch([3, 4, 4])
    assert search.target == 5 and search.deltas([3, 4, 4]) == [2, 1, 1]
    start = 0.0
    while not search.done:
        search.report(*synthetic_trial(search.target, best=7, start=start))
        start += 60.0
    assert search.target == 7
    assert [h[0] for h in search.history] == [5, 6, 7, 8]


def test_search_stops_at_once_when_the_first_step_up_is_worse():
    search = CommitRateSearch([9])
    search.report(*synthetic_trial(10, best=10))
    assert not search.done and search.target == 11
    assert search.report(*synthetic_trial(11, best=10))
    assert search.target == 10
    restored = CommitRateSearch([0])
    restored.load_state_dict(search.state_dict())
    assert (restored.target, restored.done, restored.history) == (10, True, search.history)


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
    with pytest.raises(ValueError, match="commits"):
        CommitRateSearch([])
