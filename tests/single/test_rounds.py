import numpy as np
import pytest

from fakes import ArrayCollectives, ArrayModel, ThreadAllreduce, run_ranks, weighted_average_fn
from horovod_hetero.errors import RoundMismatchError
from horovod_hetero.runtime.controller import HeteroController
from horovod_hetero.runtime.rounds import RoundProtocol
from horovod_hetero.runtime.runner import GradientRunner
from horovod_hetero.strategies import LocalSGD, Synchronous
from horovod_hetero.strategies.base import RoundStats


def test_round_averages_models_exactly():
    allreduce = ThreadAllreduce(4)

    def rank_main(rank):
        model = {"w": np.full(3, float(rank))}
        protocol = RoundProtocol(weighted_average_fn(allreduce, rank, model), size=4)
        protocol.local_step()
        result = protocol.run_round()
        return model["w"], result

    out = run_ranks(4, rank_main)
    for w, result in out:
        assert np.array_equal(w, np.full(3, 1.5))
        assert result.total_weight == 4.0 and result.done == 0 and result.round == 1


def test_ranks_with_different_step_counts_end_identical_without_hanging():
    """Rank r makes 5 + 7r local steps (period 2); join() carries the short ranks through."""
    size, allreduce = 3, ThreadAllreduce(3)
    steps = [5, 12, 19]

    def rank_main(rank):
        model = {"w": np.array([100.0 * rank])}
        ctl = HeteroController(LocalSGD(period=2), ArrayCollectives(allreduce, rank, size), ArrayModel(model))
        for _ in range(steps[rank]):
            model["w"] = model["w"] + 1.0        # a local "update"
            ctl.after_step()
        joined = ctl.join()
        return model["w"][0], ctl.protocol.round, joined

    out = run_ranks(size, rank_main)
    finals = {w for w, _, _ in out}
    assert len(finals) == 1
    # every rank entered the same number of rounds: rank 2's 9 scheduled rounds + the final one
    assert {r for _, r, _ in out} == {10}
    assert [j for _, _, j in out] == [8, 4, 1]


def test_joined_rank_adopts_the_mean_of_active_ranks_and_contributes_nothing():
    allreduce = ThreadAllreduce(2)

    def rank_main(rank):
        model = {"w": np.array([10.0 * (rank + 1)])}
        protocol = RoundProtocol(weighted_average_fn(allreduce, rank, model), size=2)
        protocol.local_step()
        protocol.run_round()                      # both: (10 + 20) / 2 = 15
        seen = []
        if rank == 0:
            protocol.join()                       # no new steps: weight 0 from now on
        else:
            model["w"] = model["w"] + 4.0         # 19
            protocol.local_step()
            result = protocol.run_round()         # rank 0 joined with weight 0: result is 19
            seen.append((model["w"][0], result.total_weight, result.done))
            protocol.join()
        return model["w"][0], seen

    (w0, _), (w1, seen) = run_ranks(2, rank_main)
    assert seen == [(19.0, 1.0, 1)]
    assert w0 == w1 == 19.0


def test_round_mismatch_is_detected():
    def average(weight, control):
        return [control[0] * 2, control[1] * 2, control[2] + 7.0]   # the other rank is in another round
    with pytest.raises(RoundMismatchError, match="different rounds"):
        RoundProtocol(average, size=2).run_round()


def inside_join(rank_blocks):
    """An average over 4 ranks where ranks 0-2 enter the same round as this one and rank 3 sits in
    Horovod's join (zeros for the whole vector); ``rank_blocks`` other than 3 copy this rank's block."""
    def average(weight, control):
        width = len(RoundStats.FIELDS)
        block = control[3:3 + width]
        return [c * 3 for c in control[:3]] + block * rank_blocks + [0.0] * width * (4 - rank_blocks)
    return average


def test_a_rank_inside_hvd_join_is_absent_from_a_round_of_a_gradient_runner():
    protocol = RoundProtocol(inside_join(3), size=4, policy=GradientRunner(Synchronous()))
    protocol.local_step(step_s=0.5, samples=8)
    result = protocol.run_round()
    assert result.stats.local_steps.tolist() == [1, 1, 1, 0]
    assert result.stats.samples.tolist() == [8, 8, 8, 0]
    assert result.stats.step_s[:3].tolist() == [0.5] * 3 and np.isnan(result.stats.step_s[3])
    assert result.total_weight == 3.0 and protocol.round == 1
    strict = RoundProtocol(inside_join(3), size=4)             # every other strategy: a mismatch, as before
    strict.local_step(step_s=0.5)
    with pytest.raises(RoundMismatchError, match=r"sum of round tags 3.0, expected 4"):
        strict.run_round()


def test_a_gradient_runner_still_refuses_a_rank_in_another_round():
    def average(weight, control):              # 3 ranks in this round, the fourth in round 5 (its block filled)
        summed = inside_join(4)(weight, control)
        summed[2] += 5.0
        return summed
    protocol = RoundProtocol(average, size=4, policy=GradientRunner(Synchronous()))
    protocol.local_step(step_s=0.5)
    with pytest.raises(RoundMismatchError, match=r"sum of round tags 8.0, expected 4"):
        protocol.run_round()


def test_a_round_runs_the_collective_it_is_given_and_the_protocols_by_default():
    calls = []

    def collective(name):
        def average(weight, control):
            calls.append((name, weight))
            return [x * 1 for x in control]
        return average
    protocol = RoundProtocol(collective("model"), size=1)
    protocol.local_step(step_s=0.5)
    measured = protocol.run_round(average=collective("statistics"))
    protocol.local_step(step_s=0.25)
    averaged = protocol.run_round()
    assert calls == [("statistics", 1.0), ("model", 1.0)]
    assert (measured.round, measured.stats.step_s.tolist(), averaged.stats.step_s.tolist()) == (1, [0.5], [0.25])


def test_state_dict_round_trip():
    protocol = RoundProtocol(lambda w, c: [x * 1 for x in c], size=1)
    protocol.local_step()
    protocol.run_round()
    protocol.local_step()
    other = RoundProtocol(lambda w, c: c, size=1)
    other.load_state_dict(protocol.state_dict())
    assert (other.round, other.steps_since_round) == (1, 1)
