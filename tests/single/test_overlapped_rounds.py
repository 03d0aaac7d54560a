"""``MEASURE_OVERLAPPED``: a round of statistics begun after one step and collected at the next, before that
step's decision, where the collectives start a sum and return (torch); elsewhere a ``MEASURE`` at once."""
import numpy as np
import pytest

from fakes import ArrayCollectives, ArrayModel
from horovod_hetero.runtime.controller import HeteroController
from horovod_hetero.runtime.rounds import RoundProtocol
from horovod_hetero.strategies import CONTINUE, MEASURE_OVERLAPPED, GradientAveraging, LocalSGD, check_decision


class Overlapping(ArrayCollectives):
    """``ArrayCollectives`` whose ``start_sum`` returns before the sum: what it started and waited for is in
    ``log``, in order."""

    overlaps = True

    def __init__(self, allreduce, rank=0, size=1, log=None):
        super().__init__(allreduce, rank, size)
        self.log = [] if log is None else log

    def start_sum(self, control, *, name, what, like=None):
        self.log.append(("started", name, int(control[2])))
        _, summed = self.allreduce_sum([], control, name=name, what=what, like=like)

        def wait():
            self.log.append(("waited", name, int(control[2])))
            return summed
        return wait


class MeasureEveryThird(GradientAveraging):
    """Horovod averages the gradients; a round of statistics after every third step, taken at the next; what it
    is told goes to ``log``. ``successor``: handed over at the first global round after a round of statistics."""

    def __init__(self, log, successor=None):
        super().__init__()
        self.log, self.successor, self.seen = log, successor, 0

    def decide(self, report):
        self.log.append(("after_step", self.step))
        return MEASURE_OVERLAPPED if self.step % 3 == 0 else CONTINUE

    def on_round(self, result):
        self.seen += 1
        self.log.append(("after_round", result.round, int(result.stats.local_steps[0])))

    def handover(self):
        successor = self.successor if self.seen else None
        self.successor = None
        return successor


def doubled(rank, arrays):
    return [2 * a for a in arrays]


def controller(log, overlaps=True, successor=None):
    collectives = (Overlapping(doubled, size=2, log=log) if overlaps else ArrayCollectives(doubled, size=2))
    return HeteroController(MeasureEveryThird(log, successor), collectives, ArrayModel({"w": np.array([3.0])}))


def test_the_round_begun_after_the_third_step_reaches_the_strategy_at_the_fourth_before_its_decision():
    log = []
    ctl = controller(log)
    for _ in range(4):
        ctl.after_step()
    assert log == [("after_step", 1), ("after_step", 2), ("after_step", 3),
                   ("started", "horovod_hetero.measure", 1),
                   ("waited", "horovod_hetero.measure", 1), ("after_round", 1, 6),   # 3 steps (doubled: two ranks)
                   ("after_step", 4)]
    rounds = [(r["step"], r.get("round")) for r in ctl.telemetry.records]
    assert rounds == [(1, None), (2, None), (3, None), (4, 1)]                    # in the record of its result
    assert ctl.protocol.steps_since_round == 1                                    # step 4: the next round's


def test_where_the_collectives_cannot_overlap_it_is_a_round_of_statistics_at_once():
    log = []
    ctl = controller(log, overlaps=False)
    for _ in range(4):
        ctl.after_step()
    assert log == [("after_step", 1), ("after_step", 2), ("after_step", 3), ("after_round", 1, 6), ("after_step", 4)]
    assert [r.get("round") for r in ctl.telemetry.records] == [None, None, 1, None]


def test_sync_model_collects_it_first_and_a_loaded_state_waits_for_it_unseen():
    log = []
    ctl = controller(log)
    for _ in range(3):
        ctl.after_step()
    ctl.sync()                                 # then the rounds' join (no hvd.join here): round 2
    assert log[-3:] == [("waited", "horovod_hetero.measure", 1), ("after_round", 1, 6), ("after_round", 2, 0)]
    log.clear()
    for _ in range(3):
        ctl.after_step()
    ctl.load_state_dict(ctl.state_dict())      # its name is used again: waited for, its statistics dropped
    assert log[-2:] == [("started", "horovod_hetero.measure", 3), ("waited", "horovod_hetero.measure", 3)]
    ctl.after_step()
    assert ("after_round", 3, 6) not in log and ctl.protocol.round == 3


def test_close_leaves_it_to_horovod_without_waiting():
    log = []
    ctl = controller(log)
    for _ in range(3):
        ctl.after_step()
    ctl.close()                                # hvd.elastic's reset: a new controller names its own
    assert log[-1] == ("started", "horovod_hetero.measure", 1) and ctl._overlapped is None


def test_a_handover_decided_on_it_runs_the_successor_from_the_step_after_the_one_that_collected_it():
    log = []
    ctl = controller(log, successor=LocalSGD(period=2))
    for _ in range(4):
        ctl.after_step()
    assert type(ctl.strategy) is LocalSGD and ctl.strategy.step == 4
    assert log[-2:] == [("after_round", 1, 6), ("after_step", 4)]


def test_the_steps_after_a_begun_round_belong_to_the_next_one():
    sums = []
    protocol = RoundProtocol(lambda weight, control: control, size=1)

    def start(control):
        sums.append(list(control))
        return lambda: sums[-1]
    protocol.local_step(0.5)
    protocol.local_step(0.25)
    wait = protocol.begin_round(start)
    protocol.local_step(1.0)
    first = wait()
    assert (first.round, first.stats.local_steps.tolist(), first.stats.step_s.tolist()) == (1, [2], [0.375])
    second = protocol.run_round()
    assert (second.round, second.stats.local_steps.tolist(), second.stats.step_s.tolist()) == (2, [1], [1.0])


def test_it_is_a_decision_the_runtime_and_the_simulator_carry_out():
    assert check_decision(object(), MEASURE_OVERLAPPED) is MEASURE_OVERLAPPED
    with pytest.raises(TypeError, match="MEASURE_OVERLAPPED or a GroupAverage"):
        check_decision(object(), "MEASURE_OVERLAPPED")
