"""What lets a strategy follow Horovod's ranks (an elastic resize, a resume): the first start takes
the first rank's counters, a plan for another size is dropped, a size is refused when built."""
import pytest

from fakes import ArrayCollectives, ArrayModel
from horovod_hetero.runtime.controller import HeteroController
from horovod_hetero.runtime.seams import failure_seen
from horovod_hetero.runtime.membership import Membership
from horovod_hetero.strategies import DSSP, WAGMA, Context, ElasticBSP, LocalSGD, Plan


def controller(strategy, size=1, broadcast=lambda obj: obj):
    collectives = ArrayCollectives(lambda rank, arrays: arrays, size=size, broadcast=broadcast)
    return HeteroController(strategy, collectives, ArrayModel({}))


def test_the_first_start_takes_the_first_ranks_counters_and_a_restart_does_not_broadcast():
    sent = []

    def rank0(obj):                         # what the set's first rank holds: step 7, round 3, its session
        sent.append(obj)
        state, _ = obj
        return {"strategy": dict(state["strategy"], step=7), "rounds": {"round": 3, "steps_since_round": 1}}, "c0ffee"

    ctl = controller(LocalSGD(period=4), broadcast=rank0)
    assert ctl.collectives.named("horovod_hetero.average") == "horovod_hetero.average"
    ctl.start()
    assert (ctl.strategy.step, ctl.protocol.round, ctl.protocol.steps_since_round) == (7, 3, 1)
    assert [state for state, _ in sent] == [{"strategy": LocalSGD(period=4).state_dict(),
                                              "rounds": {"round": 0, "steps_since_round": 0}}]
    assert len(sent[0][1]) == 8                                             # a session of 4 random bytes
    assert ctl.collectives.named("horovod_hetero.average") == "horovod_hetero.average.c0ffee"   # rank 0's
    ctl.finish()
    ctl.start()                             # after sync_model: ranks may differ legitimately; no broadcast
    assert len(sent) == 1


@pytest.mark.parametrize("make", [ElasticBSP, DSSP])
def test_a_planned_strategy_plans_again_for_a_new_size(make):
    two = make()
    two.start(Context(0, 2, None, None, lambda: 0.0))
    two.plan, two._plan_left = Plan((5, 1)), 5               # planned for two ranks
    four = make()
    four.load_state_dict(two.state_dict())                   # e.g. rank 0's counters after a resize
    four.start(Context(2, 4, None, None, lambda: 0.0))
    assert four.plan == Plan((1, 1, 1, 1)) and four._plan_left == 1


def test_a_plan_for_another_size_is_dropped_where_on_start_plans_nothing():
    s = LocalSGD(period=4)
    s.load_state_dict(dict(s.state_dict(), step=5, plan=[3, 1], plan_left=2))
    s.start(Context(0, 4, None, None, lambda: 0.0))
    assert (s.plan, s._plan_left, s.step) == (None, None, 5)
    kept = LocalSGD(period=4)
    kept.load_state_dict(dict(kept.state_dict(), plan=[3, 1, 1, 1], plan_left=2))
    kept.start(Context(0, 4, None, None, lambda: 0.0))
    assert (kept.plan, kept._plan_left) == (Plan((3, 1, 1, 1)), 2)      # the same size: kept


def test_a_size_the_strategy_cannot_run_on_is_refused_when_built():
    with pytest.raises(ValueError, match=r"S \(group size\) must be <= P = 4, got 8"):
        controller(WAGMA(group_size=8), size=4)


class Closing:
    def __init__(self, fails=False):
        self.closed, self._fails = False, fails

    def close(self):
        self.closed = True
        if self._fails:
            raise ConnectionError("a peer of the old ranks is gone")


def test_membership_rebuilds_after_a_new_world_or_a_failed_collective_and_closes_the_old_controller():
    world, built = [(0, 2)], []

    def build(previous):
        built.append(previous)
        return Closing(fails=len(built) == 2)

    m = Membership(build, lambda: world[0], failure=OSError)
    first = m.current()
    assert m.current() is first and built == [None]                  # the same ranks: the same controller
    world[0] = (1, 4)                                                # hvd.elastic's reset, new ranks
    second = m.current()
    assert second is not first and first.closed and built == [None, first]
    with pytest.raises(OSError):
        with m.guard() as ctl:
            assert ctl is second
            raise OSError("HorovodInternalError stands in: a rank died in a collective")
    failure_seen.set()                                               # what a failed collective of ours sets
    third = m.current()                                              # the same (rank, size), but failed
    assert third is not second and second.closed                     # its close raised: suppressed
    assert not failure_seen.is_set()                                 # Horovod again: the GIL watchdog disarmed
    with pytest.raises(ValueError):
        with m.guard():
            raise ValueError("not a failed collective")
    assert m.current() is third


def test_a_rank_that_loads_another_ranks_counters_at_a_round_boundary_takes_its_own_share_of_the_plan():
    """Rank 0's checkpoint (or an elastic reset's counters) after sync_model(): every rank at a boundary
    (a strategy whose on_start keeps the plan: returns None; the planned strategies shipped plan afresh)."""
    saver = LocalSGD(period=4)
    saver.start(Context(0, 4, None, None, lambda: 0.0))
    saver._set_plan(Plan((4, 4, 4, 1)))
    state = saver.state_dict()
    assert (state["plan_left"], state["plan_done"]) == (4, 0)
    slow = LocalSGD(period=4)
    slow.load_state_dict(state)
    assert slow.state_dict() == state                        # loaded, not started: as saved
    slow.start(Context(3, 4, None, None, lambda: 0.0))
    assert (slow.plan, slow._plan_left) == (Plan((4, 4, 4, 1)), 1)
    for _ in range(2):                                       # a step into the plan: one left for rank 0
        saver.after_step()
    ahead = LocalSGD(period=4)
    ahead.load_state_dict(saver.state_dict())
    ahead.start(Context(1, 4, None, None, lambda: 0.0))
    assert ahead._plan_left == 2
    ahead = LocalSGD(period=4)
    ahead.load_state_dict(saver.state_dict())
    ahead.start(Context(3, 4, None, None, lambda: 0.0))
    assert ahead._plan_left == 1                             # past its share: it averages at its next step
