"""The runtime opens a strategy's transports and closes them: on failure, on finish, when dropped."""
import gc
import threading

import numpy as np
import pytest

from fakes import ArrayCollectives, ArrayModel
from horovod_hetero.runtime.controller import HeteroController
from horovod_hetero.strategies import ESync, Mean, ModelAveraging, OuterSGD, StepReport, WAGMA

UNREACHABLE = "tcp://127.0.0.1:9"


def ours():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("horovod_hetero"))


def one_rank(strategy, model=None, **kwargs):
    return HeteroController(strategy, ArrayCollectives(lambda rank, arrays: arrays), model or ArrayModel({}),
                                **kwargs)


class OpensThenFails(ModelAveraging):
    def on_start(self, ctx):
        ctx.transports.state_service(epsilon=0.0, overshoot=0.0, timeout=1.0)     # rank 0: starts a server
        raise RuntimeError("a transport failed after another was opened")


def test_a_strategy_that_fails_to_start_leaves_nothing_open_and_the_next_start_retries():
    before = ours()
    ctl = one_rank(OpensThenFails())
    for _ in range(2):
        with pytest.raises(RuntimeError, match="failed after another was opened"):
            ctl.start()
        assert ctl.transports is None and ours() == before


def test_a_controller_dropped_without_finish_closes_its_transports():
    before = ours()
    ctl = one_rank(ESync())
    ctl.start()
    assert "horovod_hetero-state-server" in ours()
    del ctl
    gc.collect()
    assert ours() == before


class FourRanks(ArrayCollectives):
    """Rank 0 of four: a round sums four copies of its tensors; every group average adds 10 from the peer."""

    def __init__(self):
        super().__init__(None, rank=0, size=4)

    def allreduce_sum(self, tensors, control, *, ranks=None, name, what, inplace=False, like=None):
        if ranks is None:
            return [4 * t for t in tensors], [4 * c for c in control]
        return [tensors[0] + 10.0], [control[0] + 1.0, 2.0, 2 * control[2]]

    def allgather_object(self, obj, *, what):
        return [obj] * 4


def test_after_a_restart_the_responder_serves_weight_zero_until_this_rank_steps_again():
    """As before the lifecycle existed: a rank that finished serves its peers' group averages with
    weight 0 until it steps again, also across the close and reopen of its transports."""
    ctl = HeteroController(WAGMA(group_size=2, sync_period=3), FourRanks(), ArrayModel({"w": np.array([2.0])}))
    ctl.start()
    ctl.after_step()
    assert ctl.transports.groups._snapshot[1] == 1.0
    ctl.finish()
    ctl.start()
    assert ctl.transports.groups._snapshot[1] == 0.0
    ctl.after_step()
    assert ctl.transports.groups._snapshot[1] == 1.0
    ctl.finish()


def test_initial_average_for_an_outer_optimiser_waits_for_weights_that_do_not_exist_yet():
    """A Keras model built by its first batch has no weights when training begins: the initial
    models are then averaged at the first step instead of never."""
    arrays = {}
    ctl = one_rank(ESync(server_address=UNREACHABLE, timeout=0.2, fallback_period=4),
                   ArrayModel(arrays), aggregate=Mean(outer=OuterSGD(lr=0.5)))
    ctl.start()
    assert ctl.protocol.round == 0
    arrays["w"] = np.array([1.0])
    ctl.after_step()
    assert ctl.protocol.round == 1 and ctl.aggregator.start[0].tolist() == [1.0]
    ctl.finish()


def test_a_group_average_that_leaves_out_this_rank_is_refused():
    class Stray(ModelAveraging):
        def on_start(self, ctx):
            ctx.transports.open_groups([[1, 2]], "hvd.init(...)", wait_avoiding=False, patience=0.0, timeout=1.0)

        def decide(self, report):
            from horovod_hetero.strategies import GroupAverage
            return GroupAverage((1, 2), tag=self.step)

    ctl = HeteroController(Stray(), FourRanks(), ArrayModel({"w": np.zeros(1)}))
    with pytest.raises(RuntimeError, match="this rank in the group"):
        ctl.after_step()
    ctl.close()


def test_an_answer_that_is_not_a_decision_is_refused_naming_the_strategy():
    class Answers(ModelAveraging):
        def decide(self, report):
            return "AVERAGE"

    ctl = HeteroController(Answers(), FourRanks(), ArrayModel({"w": np.zeros(1)}))
    with pytest.raises(TypeError, match=r"^Answers.after_step answered 'AVERAGE'; a strategy answers CONTINUE"):
        ctl.after_step()
    ctl.close()


def test_step_reports_carry_the_annotated_loss_and_samples_into_the_rounds_statistics():
    seen = []

    class Spy(ModelAveraging):
        def decide(self, report):
            seen.append(report)
            from horovod_hetero.strategies import AVERAGE
            return AVERAGE

    ctl = one_rank(Spy())
    ctl.telemetry.annotate(loss=0.25, samples=32)
    ctl.after_step()
    assert (seen[0].loss, seen[0].samples) == (0.25, 32) and isinstance(seen[0], StepReport)
    stats = ctl.telemetry.records[0]["ranks"]
    assert (stats["loss"], stats["samples"], stats["local_steps"]) == ([0.25], [32], [1])


def test_a_rounds_wall_time_runs_from_the_previous_rounds_start_its_collective_included():
    """Two steps of 0.25 s between LocalSGD's rounds, each round's collective 1 s: every round after the first
    carries 1.5 s, the period a job runs at (``advise.samples_per_s``), not the 0.5 s between a round's end and
    the next one's start."""
    from horovod_hetero.strategies import LocalSGD

    now = [0.0]

    def allreduce(rank, arrays):
        now[0] += 1.0
        return arrays

    class Recording(LocalSGD):
        walls = []

        def after_round(self, result):
            super().after_round(result)
            if result.stats is not None:
                self.walls.append(float(result.stats.wall_s[0]))

    ctl = HeteroController(Recording(period=2), ArrayCollectives(allreduce), ArrayModel({"w": np.zeros(1)}),
                           clock=lambda: now[0])
    for _ in range(8):
        now[0] += 0.25
        ctl.after_step()
    assert Recording.walls[-3:] == [1.5, 1.5, 1.5], Recording.walls
