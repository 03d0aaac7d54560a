import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horovod_hetero.rules.zipline import (brute_force, full_grid_scan, predict_ends, zipline,
                                           zipline_opt)

SOLVERS = [zipline, zipline_opt, full_grid_scan]


@st.composite
def end_matrices(draw, max_n=4, max_r=4, max_t=8):
    n = draw(st.integers(1, max_n))
    r = draw(st.integers(1, max_r))
    rows = [sorted(draw(st.lists(st.integers(0, max_t), min_size=r, max_size=r))) for _ in range(n)]
    return np.array(rows, dtype=float)


def consistent(ends, result):
    chosen = ends[np.arange(len(ends)), result.steps - 1]
    return result.t_sync == chosen.max() and result.wait == chosen.max() - chosen.min()


@settings(max_examples=3000, deadline=None)
@given(end_matrices())
def test_optimal_and_earliest_against_brute_force_ties_included(ends):
    want = brute_force(ends)
    for solve in SOLVERS:
        got = solve(ends)
        assert (got.wait, got.t_sync) == (want.wait, want.t_sync), solve.__name__
        assert consistent(ends, got) and ((got.steps >= 1) & (got.steps <= ends.shape[1])).all()


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_real_valued_arithmetic_rows(n, r, seed):
    rng = np.random.default_rng(seed)
    ends = predict_ends(rng.uniform(0, 1, n), rng.uniform(0.1, 3.0, n), r)
    want = brute_force(ends) if r ** n <= 20000 else full_grid_scan(ends)
    for solve in SOLVERS:
        got = solve(ends)
        assert (got.wait, got.t_sync) == (want.wait, want.t_sync)


def test_larger_random_instances_agree_with_the_references():
    rng = np.random.default_rng(1)
    for n, r in [(50, 15), (200, 15), (30, 150)]:
        ends = predict_ends(rng.uniform(0, 1, n), rng.uniform(0.5, 3.2, n), r)
        results = [solve(ends) for solve in SOLVERS]
        assert len({(x.wait, x.t_sync) for x in results}) == 1


def test_two_equal_optima_pick_the_earliest_barrier():
    # waits of 1 at t_sync 3 (steps 3, 1) and at t_sync 6 (steps 6, 2): the earlier wins
    ends = np.array([[1, 2, 3, 4, 5, 6], [2.0, 5.0, 8.0, 11.0, 14.0, 17.0]])
    for solve in SOLVERS:
        got = solve(ends)
        assert got.t_sync == 2.0 and got.wait == 0.0 and got.steps.tolist() == [2, 1]
    ends = np.array([[1.0, 3.0, 6.0], [2.0, 7.0, 9.0]])   # waits 1 at t_sync 2 and at 7
    for solve in SOLVERS:
        assert (solve(ends).t_sync, solve(ends).wait, solve(ends).steps.tolist()) == (2.0, 1.0, [1, 1])


def test_edge_cases_r1_and_n1():
    ends = np.array([[3.0], [1.0], [2.0]])
    for solve in SOLVERS:
        got = solve(ends)
        assert got.steps.tolist() == [1, 1, 1] and got.t_sync == 3.0 and got.wait == 2.0
    one = np.array([[1.0, 2.0, 3.0]])
    for solve in SOLVERS:
        got = solve(one)
        assert got.steps.tolist() == [1] and got.t_sync == 1.0 and got.wait == 0.0


def test_speeds_1_and_4_sync_after_4_fast_steps():
    ends = predict_ends([0.0, 0.0], [1.0, 4.0], R=8)
    got = zipline(ends)
    assert got.steps.tolist() == [4, 1] and got.t_sync == 4.0 and got.wait == 0.0


def test_predict_ends():
    assert predict_ends([0.0, 10.0], [1.5, 2.0], 3).tolist() == [[1.5, 3.0, 4.5], [12.0, 14.0, 16.0]]


@pytest.mark.parametrize("ends,match", [
    ([[1.0, float("nan")]], "finite"),
    ([[2.0, 1.0], [0.0, 1.0]], "sorted"),
    ([], "non-empty"),
    ([[]], "non-empty"),
    ([1.0, 2.0], "n x R"),
])
def test_bad_ends_are_rejected(ends, match):
    for solve in SOLVERS:
        with pytest.raises(ValueError, match=match):
            solve(ends)


@pytest.mark.parametrize("args,match", [
    (([0.0, 1.0], [1.0, -1.0], 3), "interval must be >= 0"),
    (([0.0], [float("nan")], 3), "finite"),
    (([0.0, 1.0], [1.0], 3), "same length"),
    (([], [], 3), "non-empty"),
    (([0.0], [1.0], 0), "R must be"),
])
def test_bad_prediction_input_is_rejected(args, match):
    with pytest.raises(ValueError, match=match):
        predict_ends(*args)
