import numpy as np
import pytest

from horovod_hetero.rules.staleness import DSSPServer, simulated_waits, synchronization_controller


def test_figure_2_the_fastest_runs_three_more_iterations():
    # fastest: interval 1, stops possible at 0, 1, 2, 3, 4; slowest: interval 2.6, running
    # iteration ends at 0.5, then 3.1, 5.7: waits 0.5, 2.1, 1.1, 0.1, 1.7 -> r* = 3 in [0, 4]
    waits = simulated_waits(-1.0, 0.0, -4.7, -2.1, r_max=4)
    np.testing.assert_allclose(waits, [0.5, 2.1, 1.1, 0.1, 1.7])
    assert synchronization_controller(-1.0, 0.0, -4.7, -2.1, r_max=4) == 3


def test_wait_is_one_sided_not_the_listings_absolute_difference():
    # the slowest ends at 0.5, 3.5, 6.5; stopping at 3.6 (r = 3) is 0.1 *after* an end, which the
    # listing's |difference| would score 0.1 (and pick), but the real wait is until 6.5 (2.9)
    waits = simulated_waits(-1.2, 0.0, -5.5, -2.5, r_max=3)
    np.testing.assert_allclose(waits, [0.5, 2.3, 1.1, 2.9])
    assert synchronization_controller(-1.2, 0.0, -5.5, -2.5, r_max=3) == 0


def test_ties_choose_the_fewest_extra_iterations_and_r_max_zero():
    assert synchronization_controller(-1.0, 0.0, -4.0, -2.0, r_max=4) == 0   # waits 0,1,0,1,0
    assert synchronization_controller(-1.0, 0.0, -4.0, -2.0, r_max=0) == 0


@pytest.mark.parametrize("args,match", [((1.0, 1.0, 0.0, 1.0, 2), "fast_last must be later"),
                                        ((0.0, 1.0, 2.0, 1.0, 2), "slow_last must be later"),
                                        ((0.0, 1.0, 0.0, 1.0, -1), "r_max")])
def test_bad_controller_input(args, match):
    with pytest.raises(ValueError, match=match):
        synchronization_controller(*args)


def test_server_bounds_staleness_by_s_lower_without_a_range():
    server = DSSPServer(2, s_lower=1, s_upper=1)
    assert server.push(0, 1.0) == [0]            # 1 - 0 <= 1
    assert server.push(0, 2.0) == []             # 2 - 0 > 1: waits
    assert server.push(1, 4.0) == [1, 0]         # slowest caught up: both go


def test_server_grants_the_controllers_extra_iterations_exactly():
    """Figure 2's moment: worker 0 (interval 1) is one ahead of worker 1 (interval 2.6, running
    iteration ends at 0.5) with s_lower = 0, s_upper = 4; r* = 3 means exactly 3 more OKs."""
    server = DSSPServer(2, s_lower=0, s_upper=0)
    for t0, t1 in zip([-5.0, -4.0, -3.0, -2.0, -1.0], [-12.5, -9.9, -7.3, -4.7, -2.1]):
        assert server.push(0, t0) == [] and server.push(1, t1) == [1, 0]    # lock-step
    server.r_max = 4                             # now open the range: s_upper = 4
    oks = [server.push(0, t) for t in (0.0, 1.0, 2.0, 3.0)]
    assert oks == [[0], [0], [0], []]            # 3 extra iterations, then it waits at t = 3
    assert server.push(1, 0.5) == [1]            # the slowest goes on; worker 0 is 3 ahead
    assert server.waiting == {0}
    assert server.push(1, 3.1) == [1] and server.push(1, 5.7) == [1]
    assert server.push(1, 8.3) == [1, 0]         # caught up: worker 0 released


def test_server_bad_arguments():
    with pytest.raises(ValueError, match="s_upper"):
        DSSPServer(2, s_lower=3, s_upper=2)
    with pytest.raises(ValueError, match="p must be"):
        DSSPServer(2, 0, 1).push(2, 0.0)
