"""ElasticBSP and DSSP as strategies: plans from injected round statistics, exact."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horovod_hetero.rules.staleness import round_plan
from horovod_hetero.rules.zipline import brute_force, predict_ends
from horovod_hetero.strategies import (
    AVERAGE, CONTINUE, DSSP, Context, ElasticBSP, Plan, RoundResult, RoundStats, check_strategy)

NAN = math.nan


def stats(step_s, local_steps=None, done=None):
    n = len(step_s)
    return RoundStats(local_steps=np.array(local_steps or [1] * n), step_s=np.array(step_s, dtype=float),
                      loss=np.full(n, NAN), samples=np.zeros(n, dtype=np.int64),
                      done=np.array(done or [False] * n))


def planned(strategy, round_stats, rank=0):
    """The plan ``strategy`` (started on ``rank``) makes after a round with ``round_stats`` (the
    second round: the first measured the start-up step)."""
    n = len(round_stats.step_s)
    strategy.start(Context(rank, n, transports=None))
    strategy.after_round(RoundResult(1, 1.0, float(n), 0, stats([5.0] + [1.0] * (n - 1))))
    strategy.after_round(RoundResult(2, 1.0, float(n), int(round_stats.done.sum()), round_stats))
    return strategy.plan.steps


def test_the_first_two_rounds_come_after_one_step_each_the_first_step_is_no_speed():
    for strategy in (ElasticBSP(), DSSP()):
        strategy.start(Context(2, 4, transports=None))
        assert strategy.plan == Plan((1, 1, 1, 1)) and strategy.after_step() is AVERAGE
        strategy.after_round(RoundResult(1, 1.0, 4.0, 0, stats([3.0, 0.1, 0.1, 0.4])))   # start-up in it
        assert strategy.plan == Plan((1, 1, 1, 1)) and strategy.after_step() is AVERAGE
        strategy.after_round(RoundResult(2, 1.0, 4.0, 0, stats([0.1, 0.1, 0.1, 0.4])))
        assert strategy.plan == Plan((4, 4, 4, 1))
        strategy.start(Context(2, 4, transports=None))                  # a restart measures again
        strategy.after_round(RoundResult(3, 1.0, 4.0, 0, stats([0.1, 0.1, 0.1, 0.4])))
        assert strategy.plan == Plan((1, 1, 1, 1))


def test_started_again_on_measured_speeds_the_first_round_is_planned_from_them():
    """After ``sync_model()`` (an epoch's end) or ``hh.Auto``'s switch the controller hands the speeds its rounds
    measured (``Context.step_s``). Measured under Keras (Horovod's example, 1,1,1,4 of 0.1-s steps), the two
    rounds of one step each at every epoch's start made each fast rank wait for the slow rank's step twice:
    ElasticBSP's epochs took 6.4 s against ESync's 5.9 s."""
    for strategy in (ElasticBSP(), DSSP((3, 15))):
        strategy.start(Context(2, 4, transports=None, step_s=(0.1, 0.1, 0.1, 0.4)))
        assert strategy.plan == Plan((4, 4, 4, 1)) and not strategy.warming_up
        assert [strategy.after_step() for _ in range(4)] == [CONTINUE] * 3 + [AVERAGE]
        # the slow rank's one step was the first after the sync (not timed): the plan runs again
        strategy.after_round(RoundResult(1, 1.0, 4.0, 0, stats([0.1, 0.1, 0.1, NAN], local_steps=[4, 4, 4, 1])))
        assert strategy.plan == Plan((4, 4, 4, 1))
        strategy.after_round(RoundResult(2, 1.0, 4.0, 0, stats([0.1, 0.2, 0.1, 0.4], local_steps=[4, 4, 4, 1])))
        assert strategy.plan == Plan((4, 2, 4, 1))
        # a rank that took no step is measured first; speeds of another job size are not this job's
        strategy.after_round(RoundResult(3, 1.0, 4.0, 0, stats([0.1, NAN, 0.1, 0.4], local_steps=[4, 0, 4, 1])))
        assert strategy.plan == Plan((1, 1, 1, 1))
        strategy.start(Context(0, 2, transports=None, step_s=(0.1, 0.1, 0.1, 0.4)))
        assert strategy.plan == Plan((1, 1)) and strategy.warming_up


def test_elasticbsp_plans_zipline_on_the_rounds_speeds():
    assert planned(ElasticBSP(lookahead=15), stats([0.1, 0.1, 0.1, 0.4])) == (4, 4, 4, 1)
    # 1 vs 2.9: within R = 8 the least wait is 3 steps against 1 (0.1 s)
    assert planned(ElasticBSP(lookahead=8), stats([1.0, 1.0, 2.9])) == (3, 3, 1)
    # a lookahead of 1: everyone one step
    assert planned(ElasticBSP(lookahead=1), stats([1.0, 3.0])) == (1, 1)


def test_elasticbsp_ties_take_the_earliest_barrier():
    # 1 vs 2: zero wait at 2/1, 4/2, 6/3, ...: the earliest
    assert planned(ElasticBSP(lookahead=8), stats([1.0, 2.0])) == (2, 1)


def test_ranks_that_left_are_left_out_and_unmeasured_ranks_are_measured_first():
    left = stats([0.1, 0.2, NAN, 0.4], local_steps=[4, 2, 0, 1], done=[False, False, True, False])
    assert planned(ElasticBSP(), left) == (4, 2, 1, 1)
    assert planned(DSSP((3, 15)), left) == (4, 2, 1, 1)
    unmeasured = stats([0.1, NAN, 0.1, 0.4], local_steps=[4, 0, 4, 1])
    assert planned(ElasticBSP(), unmeasured) == (1, 1, 1, 1)
    everyone_left = stats([NAN] * 3, local_steps=[0] * 3, done=[True] * 3)
    assert planned(DSSP(), everyone_left) == (1, 1, 1)


def test_every_rank_plans_the_same_and_runs_its_own_count():
    round_stats = stats([0.1, 0.1, 0.1, 0.4])
    strategies = [ElasticBSP() for _ in range(4)]
    plans = [planned(s, round_stats, rank) for rank, s in enumerate(strategies)]
    assert plans == [(4, 4, 4, 1)] * 4
    decisions = [[s.after_step() for _ in range(4)] for s in strategies]
    assert decisions[0] == [CONTINUE] * 3 + [AVERAGE] and decisions[3][0] is AVERAGE


def test_a_plan_is_computed_once_per_round_where_ranks_share_the_statistics():
    calls = []

    class Counting(ElasticBSP):
        def plan_steps(self, step_s):
            calls.append(1)
            return super().plan_steps(step_s)

    round_stats = stats([0.1, 0.4])
    assert [planned(Counting(), round_stats, rank) for rank in (0, 1)] == [(4, 1)] * 2 and len(calls) == 1
    assert planned(Counting(lookahead=2), round_stats) == (2, 1) and len(calls) == 2   # other settings


def test_dssp_figure_2_from_a_round():
    # the slowest takes 2.9 steps of the fastest; without allowance the fastest stops after 1 (s_lower 0)
    # and waits 1.9; r* = 4 extra stops it at 5, 0.8 before the slowest's second end
    assert round_plan([1.0, 2.9], s_lower=0, s_upper=4) == [5, 2]
    assert planned(DSSP(staleness=(0, 4)), stats([1.0, 2.9])) == (5, 2)
    assert round_plan([1.0, 2.9], s_lower=0, s_upper=0) == [1, 1]           # no range: staleness 0


def test_dssp_lets_the_fastest_use_the_slowests_step_and_medium_ranks_fit_theirs():
    assert round_plan([0.1, 0.1, 0.1, 0.4], 3, 15) == [4, 4, 4, 1]       # free: s_lower + 1 = 4
    assert round_plan([0.1, 0.1, 0.1, 0.6], 3, 15) == [6, 6, 6, 1]       # r* = 2 extra: no wait
    assert round_plan([0.1, 0.1, 0.1, 0.6], 3, 3) == [4, 4, 4, 1]        # no range: waits 0.2
    assert round_plan([1.0, 1.0, 1.5], 3, 15) == [3, 3, 2]               # two slow steps, no wait
    assert round_plan([1.0, 2.0, 8.0], 0, 2) == [3, 3, 1]                # never beyond the fastest
    assert round_plan([0.1, 0.1, 0.1, 0.1], 3, 15) == [1, 1, 1, 1]       # equal speeds: every step


def test_dssp_tolerance_absorbs_measurement_noise():
    noisy = [0.1003, 0.1001, 0.1005, 0.4010]
    assert round_plan(noisy, 3, 15) == [4, 4, 4, 1]
    # exact: 4 x 0.1003 > 0.4010 and 4 x 0.1005 too, so those two ranks lose a step each round
    assert round_plan(noisy, 3, 15, tolerance=0.0) == [3, 4, 3, 1]
    # the fastest's 4th step ends 1 ms after the slowest's: on time within the tolerance, and the 1 ms
    # smaller wait 12 steps later counts as equal; exactly, the controller stretches the round to 15 vs 4
    late = [0.1005, 0.1005, 0.1005, 0.4010]
    assert round_plan(late, 3, 15) == [4, 4, 4, 1]
    assert round_plan(late, 3, 15, tolerance=0.0) == [15, 15, 15, 4]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=6), st.integers(0, 5), st.integers(0, 10))
def test_dssp_plans_stay_within_the_bound_and_the_round(step_s, s_lower, extra):
    steps = round_plan(step_s, s_lower, s_lower + extra)
    fast, slow = int(np.argmin(step_s)), int(np.argmax(step_s))
    barrier = steps[slow] * step_s[slow]
    assert all(s >= 1 for s in steps) and steps[fast] - steps[slow] <= s_lower + extra
    assert all(s == 1 or s * t <= barrier + 0.05 * t + 1e-9 for s, t in zip(steps, step_s))
    assert max(steps) == steps[fast]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=4), st.integers(1, 5))
def test_elasticbsp_plans_have_the_least_wait(step_s, lookahead):
    steps = ElasticBSP(lookahead).plan_steps(np.array(step_s))
    best = brute_force(predict_ends(np.zeros(len(step_s)), step_s, lookahead))
    ends = np.array(steps) * step_s
    assert math.isclose(ends.max() - ends.min(), best.wait, abs_tol=1e-9)


def test_state_round_trips_and_strategies_are_listed():
    s = ElasticBSP(lookahead=6)
    planned(s, stats([0.1, 0.3]), rank=0)
    s.after_step()
    t = ElasticBSP(lookahead=6)
    t.load_state_dict(s.state_dict())
    assert t.plan == s.plan == Plan((3, 1)) and t.after_step() is CONTINUE and t.after_step() is AVERAGE
    assert not t.warming_up and t.state_dict()["warming_up"] is False
    with pytest.raises(TypeError, match="ElasticBSP, LocalSGD"):
        check_strategy("dssp")
    assert repr(DSSP((1, 4))) == "DSSP(staleness=(1, 4), tolerance=0.05)" and ElasticBSP(7).label == "ElasticBSP(R=7)"


@pytest.mark.parametrize("make,error,match", [
    (lambda: ElasticBSP(0), ValueError, "lookahead must be an int >= 1"),
    (lambda: ElasticBSP(2.5), TypeError, "lookahead must be an int"),
    (lambda: ElasticBSP(True), TypeError, "lookahead must be an int"),
    (lambda: DSSP(3), TypeError, r"staleness must be a pair of ints \(s_lower, s_upper\)"),
    (lambda: DSSP("3,15"), TypeError, "staleness must be a pair"),
    (lambda: DSSP((1, 2, 3)), TypeError, "staleness must be a pair"),
    (lambda: DSSP((5, 2)), ValueError, "0 <= s_lower <= s_upper"),
    (lambda: DSSP((-1, 2)), ValueError, r"staleness\[0\] \(s_lower\) must be an int >= 0"),
    (lambda: DSSP((1.0, 2)), TypeError, r"staleness\[0\] \(s_lower\) must be an int"),
    (lambda: DSSP((1, 2), tolerance=0.7), ValueError, "tolerance must be <= 0.5"),
    (lambda: DSSP((1, 2), tolerance=math.inf), ValueError, "tolerance"),
    (lambda: round_plan([0.1, -1.0], 1, 2), ValueError, "step_s must be finite seconds > 0"),
])
def test_bad_input_fails_at_construction_naming_the_argument(make, error, match):
    with pytest.raises(error, match=match):
        make()
