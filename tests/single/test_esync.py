import pytest

from horovod_hetero.rules.esync_state import ESyncState


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def start_round(state, clock, capabilities):
    for rank, c in enumerate(capabilities):
        assert state.query(rank, 0, c, clock.now) is False          # k == 0: never ready


def test_k_zero_is_never_ready_even_for_the_slowest():
    clock = Clock()
    s = ESyncState(2, clock=clock)
    start_round(s, clock, [1.0, 4.0])
    assert s.query(1, 0, 4.0, 0.0) is False


def test_the_slowest_is_ready_after_its_first_iteration_and_makes_everyone_ready():
    clock = Clock()
    s = ESyncState(3, epsilon=0.001, clock=clock)
    start_round(s, clock, [1.0, 1.0, 4.0])
    clock.now = 1.0
    assert s.query(0, 1, 1.0, 1.0) is False                # rest 3 s: go on
    clock.now = 4.0
    assert s.query(2, 1, 4.0, 4.0) is True                 # the slowest: ready at k = 1
    assert s.query(1, 1, 1.0, 4.0) is True                 # slowest already ready


def test_fast_worker_is_ready_when_its_next_iteration_cannot_finish_in_time():
    clock = Clock()
    s = ESyncState(2, epsilon=0.001, clock=clock)
    start_round(s, clock, [1.0, 4.0])
    answers = []
    for k in range(1, 5):
        clock.now = float(k)
        answers.append(s.query(0, k, 1.0, float(k)))
        if answers[-1]:
            break
    # at t = 3 the rest is 1 s: 1 + eps > 1, so it stops after 3 local iterations
    assert answers == [False, False, True]
    exact = ESyncState(2, epsilon=0.0, clock=clock)
    clock.now = 0.0
    start_round(exact, clock, [1.0, 4.0])
    clock.now = 3.0
    assert exact.query(0, 3, 1.0, 3.0) is False             # without eps the 4th step still fits
    clock.now = 4.0
    assert exact.query(0, 4, 1.0, 4.0) is True


def test_two_equally_slow_stragglers_both_aggregate_after_one_iteration():
    """The paper's case: A and B equally slow finish together. With the naive rule ("aggregate
    once everyone has one iteration") whichever reports first trains on and the other, ready,
    waits a whole iteration. Here the second must not trigger a round the first extends."""
    for order in ([1, 2], [2, 1]):
        clock = Clock()
        s = ESyncState(3, epsilon=0.001, clock=clock)
        start_round(s, clock, [1.0, 4.0, 4.0])
        clock.now = 4.0
        answers = [s.query(rank, 1, 4.0, 4.0) for rank in order]
        assert answers == [True, True], order


def test_the_slowest_still_in_the_previous_round_makes_others_wait():
    clock = Clock()
    s = ESyncState(2, clock=clock)
    start_round(s, clock, [1.0, 4.0])
    s.reset(0, 1, 5.0)                                     # worker 0 already in round 1
    clock.now = 6.0
    assert s.query(0, 1, 1.0, 6.0) is False                # slowest has not pulled round 1 yet
    s.reset(1, 1, 5.5)
    assert s.query(0, 1, 1.0, 6.0) is False                # rest 4 - 6 + 5.5 = 3.5
    clock.now = 9.0
    assert s.query(0, 4, 1.0, 9.0) is True                 # rest 0.5


def test_unreported_worker_blocks_readiness_and_reset_clears_round_state():
    clock = Clock()
    s = ESyncState(2, clock=clock)
    assert s.query(0, 3, 1.0, 0.0) is False                # worker 1 never reported
    s.query(1, 1, 2.0, 0.0)
    assert s.records[1].ready
    s.reset(1, 1, 2.0)
    assert (s.records[1].ready, s.records[1].local_iterations, s.records[1].round) == (False, 0, 1)
    restored = ESyncState(2, clock=clock)
    restored.load_state_dict(s.state_dict())
    assert restored.records == s.records


def test_a_worker_that_entered_the_round_without_an_answer_makes_every_worker_in_it_ready():
    """The issue-16 stall: workers 1 and 2 timed out in round 1 (the slowest, worker 2, never
    reported, its records stay still) and entered the aggregation; worker 0 must not wait for them."""
    clock = Clock()
    s = ESyncState(3, clock=clock)
    for rank in range(3):
        s.reset(rank, 1, 0.0)
    s.query(1, 1, 1.0, 0.0)
    assert s.query(0, 1, 1.0, 0.0) is False                # worker 2 unreported: nobody is ready
    s.enter(1, 0)                                          # an old round's entry changes nothing
    assert s.query(0, 2, 1.0, 0.0) is False and s.records[1].round == 1
    s.enter(2, 1)
    assert s.query(0, 0, 1.0, 0.0) is False                # k == 0 is still never ready
    assert s.query(0, 3, 1.0, 0.0) is True and s.records[2].ready
    s.reset(0, 2, 1.0)
    assert s.query(0, 1, 1.0, 1.0) is False                # the next round asks the records again


@pytest.mark.parametrize("args,match", [((5, 1, 1.0, 0.0), "rank"), ((0, -1, 1.0, 0.0), "local_iterations"),
                                        ((0, 1, -1.0, 0.0), "capability")])
def test_bad_queries(args, match):
    with pytest.raises(ValueError, match=match):
        ESyncState(2).query(*args)
