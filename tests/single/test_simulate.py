import numpy as np
import pytest

from horovod_hetero.simulate import Cluster, compare, format_table, simulate
from horovod_hetero.strategies import AVERAGE, DSSP, WAGMA, ElasticBSP, ESync, LocalSGD, Plan, ModelAveraging
from horovod_hetero.strategies import Synchronous as Sync


def free_network(step_times, **kw):
    return Cluster(step_times=step_times, model_bytes=0.0, latency_s=0.0, **kw)


def test_synchronous_runs_everyone_at_the_slowest_pace():
    r = simulate(free_network([1, 1, 1, 4]), Sync(), duration=40.0)
    assert r.steps.tolist() == [10] * 4 and r.duration == 40.0
    np.testing.assert_allclose(r.compute_ratio, [0.25, 0.25, 0.25, 1.0])
    np.testing.assert_allclose(r.wait_s, [30, 30, 30, 0])
    assert r.samples_per_s == 4 * 10 * 32 / 40


def test_localsgd_same_pace_fewer_syncs():
    r = simulate(free_network([1, 1, 1, 4]), LocalSGD(4), duration=32.0)
    assert r.steps.tolist() == [8] * 4 and r.syncs.tolist() == [2] * 4


def test_esync_fast_workers_take_four_local_steps_per_round():
    """The real QUERY-STATE, through the ESync strategy objects. Round 1 is one step longer for the
    fast workers: nobody is ready before every worker reported a step, and at t = 4 the fast
    workers ask just before the slow one reports (the simulator orders equal times by rank)."""
    r = simulate(free_network([1, 1, 1, 4]), ESync(warmup_step=False), duration=40.0)
    assert [s.tolist() for s in r.round_steps] == [[5, 5, 5, 1]] + [[4, 4, 4, 1]] * 9
    assert r.steps.tolist() == [41, 41, 41, 10] and r.syncs.tolist() == [10] * 4 and r.duration == 41.0
    np.testing.assert_allclose(r.compute_ratio, [1.0, 1.0, 1.0, 40 / 41])
    # with the paper's epsilon (and no overshoot) the 4th step, which would end exactly with the
    # slowest, is skipped
    eps = simulate(free_network([1, 1, 1, 4]), ESync(epsilon=1e-3, overshoot=0.0, warmup_step=False), duration=40.0)
    assert [s.tolist() for s in eps.round_steps] == [[5, 5, 5, 1]] + [[3, 3, 3, 1]] * 9
    # a warm-up step is not reported: round 1 then lasts until the slow worker's second step ends
    warm = simulate(free_network([1, 1, 1, 4]), ESync(), duration=40.0)
    assert warm.round_steps[0].tolist() == [9, 9, 9, 2] and warm.steps.tolist() == [41, 41, 41, 10]


class Proportional(ModelAveraging):
    """A plan from the round's statistics: as many steps as fit in the slowest worker's one."""

    def on_start(self, ctx):
        return Plan((1,) * ctx.size)

    def on_round(self, result):
        self.seen = result.stats
        return Plan(tuple(int(s) for s in np.floor(np.nanmax(result.stats.step_s) / result.stats.step_s)))


def test_the_simulator_runs_any_strategy_object_and_hands_it_every_workers_speed():
    r = simulate(free_network([1, 2, 4]), Proportional(), duration=16.0)
    assert [s.tolist() for s in r.round_steps] == [[1, 1, 1]] + [[4, 2, 1]] * 3     # rounds end at 4, 8, 12, 16
    assert r.steps.tolist() == [13, 7, 4] and r.wait_s.tolist() == [3, 2, 0]


def test_elasticbsp_runs_zipline_plans_from_the_rounds_speeds():
    r = simulate(free_network([1, 1, 1, 4]), ElasticBSP(lookahead=8), duration=40.0)
    # two rounds of one step each (the first step is no speed; the fast wait 3 s each), then ZipLine's
    # 4, 4, 4, 1 with no wait
    assert [s.tolist() for s in r.round_steps] == [[1, 1, 1, 1]] * 2 + [[4, 4, 4, 1]] * 8
    assert r.steps.tolist() == [34, 34, 34, 10] and r.wait_s.tolist() == [6, 6, 6, 0]


def test_dssp_without_a_range_averages_every_step_and_a_range_lets_the_fast_run_ahead():
    r = simulate(free_network([1, 4]), DSSP(staleness=(0, 0)), duration=40.0)
    assert r.steps.tolist() == [10, 10] and r.wait_s.tolist() == [30, 0]
    ranged = simulate(free_network([1, 4]), DSSP(staleness=(2, 10)), duration=40.0)
    # 3 free steps, then r* = 1 more ends with the slowest's step: no wait
    assert [s.tolist() for s in ranged.round_steps][:4] == [[1, 1], [1, 1], [4, 1], [4, 1]]
    assert ranged.steps.tolist() == [34, 10] and ranged.wait_s.tolist() == [6, 0]


def test_wagma_groups_every_step_global_every_period():
    c = Cluster([1.0] * 8, model_bytes=1e6, latency_s=0.0, bandwidth=1e9)
    r = simulate(c, WAGMA(group_size=2, sync_period=5), duration=10.0)
    # per period: a group average after each of the first 4 steps, the global one after the 5th
    # (as training does; the simulator's own twin of WAGMA counted a group average on global steps too)
    assert r.syncs[0] == r.steps[0] // 5 * 5
    per_round = 4 * c.ring_bytes(2) + c.ring_bytes(8)
    np.testing.assert_allclose(r.bytes_sent, r.steps // 5 * per_round)
    with pytest.raises(ValueError, match="power of two"):
        simulate(Cluster([1.0] * 6), WAGMA(sync_period=5), duration=5.0)


def test_step_time_change_and_jitter():
    c = free_network([1.0, 1.0], change_at=10.0, change_factors=[1.0, 3.0])
    r = simulate(c, Sync(), duration=16.0)
    assert r.steps.tolist() == [12, 12]           # 10 steps of 1 s, then 2 steps of 3 s
    j = compare(Cluster([1.0, 2.0], jitter=0.2, seed=5), [Sync(), Sync()], duration=50.0)
    assert j[0].steps.tolist() == j[1].steps.tolist()      # same seed, same draws
    assert 0.3 < j[0].compute_ratio[0] < 0.7


def test_communication_cost_model():
    c = Cluster([1.0] * 4, model_bytes=1e8, latency_s=1e-3, bandwidth=1e9)
    assert c.allreduce_s(4) == pytest.approx(6e-3 + 1.5 * 0.1)
    assert c.allreduce_s(1) == 0.0 and c.ring_bytes(4) == 1.5e8


def test_ten_thousand_workers_every_strategy_runs():
    c = Cluster(np.r_[np.full(5000, 1.0), np.full(5000, 3.2)], jitter=0.05)
    results = compare(c, [Sync(), LocalSGD(8), ESync(), ElasticBSP(15), DSSP((3, 15))], duration=15.0)
    assert all(r.steps.size == 10000 for r in results)
    sync, esync = results[0], results[2]
    assert esync.samples_per_s > 1.5 * sync.samples_per_s
    wagma = simulate(Cluster(np.r_[np.full(4096, 1.0), np.full(4096, 3.2)]), WAGMA(sync_period=10), 10.0)
    assert wagma.steps.size == 8192
    assert "ESync" in format_table(results)


def test_bad_clusters():
    with pytest.raises(ValueError, match="step_times"):
        Cluster([1.0, 0.0])
    with pytest.raises(ValueError, match="change_factors"):
        Cluster([1.0], change_at=3.0)
    with pytest.raises(TypeError, match="strategy must be"):
        simulate(Cluster([1.0]), "sync", 1.0)


def test_an_answer_that_is_not_a_decision_is_refused_by_the_simulator_as_by_the_runtime():
    class Answers(ModelAveraging):
        def decide(self, report):
            return True                       # meant AVERAGE

    with pytest.raises(TypeError, match=r"^Answers.after_step answered True; a strategy answers CONTINUE, AVERAGE"):
        simulate(free_network([1, 2]), Answers(), duration=4.0)


def test_replay_takes_each_workers_measured_steps_in_turn_then_the_newer_half_again():
    """A worker that runs out of its measured steps goes on with the newer half of them: where a straggler
    appeared mid-run (worker 0's last two steps 4x), the replay past the end keeps it, never starting again
    from the run's first, even steps."""
    cluster = Cluster([1.0, 2.0], step_factors=[[1.0, 1.0, 4.0, 4.0], [0.5]], replay=True)
    assert [cluster.draw_one(0.0, 0) for _ in range(7)] == [1.0, 1.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert [cluster.draw_one(0.0, 1) for _ in range(2)] == [1.0, 1.0]
    assert cluster.draw(0.0, 2).tolist() == [[4.0, 4.0], [1.0, 1.0]]          # the vector path goes on in turn
    odd = Cluster([1.0], step_factors=[[1.0, 2.0, 3.0, 5.0, 7.0]], replay=True)
    assert odd.draw(0.0, 9).tolist() == [[1.0, 2.0, 3.0, 5.0, 7.0, 5.0, 7.0, 5.0, 7.0]]   # the newest 2 of 5
    drawn = Cluster([1.0], step_factors=[[1.0, 2.0, 3.0]], seed=1)
    assert sorted({drawn.draw_one(0.0, 0) for _ in range(50)}) == [1.0, 2.0, 3.0]   # drawn, not in turn


def test_balanced_gains_only_the_share_of_a_step_that_grows_with_its_batch():
    """At 1,1,1,4 with time proportional to the batch Balanced's settled split is 40,39,39,10 (the 3.25x
    bound); with steps whose time does not depend on the batch it keeps the even split: no gain, no loss."""
    from horovod_hetero.strategies import Balanced, Synchronous
    runs = {share: compare(Cluster(step_times=[1.0, 1.0, 1.0, 4.0], batch_share=share),
                           [Synchronous(), Balanced(global_batch=128, rebalance_every=20)], 600.0)
            for share in (1.0, 0.0)}
    sync, balanced = runs[0.0]
    assert sync.steps.tolist() == balanced.steps.tolist() == [150] * 4      # 4 s steps, 600 s
    sync, balanced = runs[1.0]
    # 3 windows even (60 steps of 4 s), then 40,39,39,10: steps of max(40 / 32, 4 x 10 / 32) = 1.25 s
    assert sync.steps.tolist() == [150] * 4 and balanced.steps.tolist() == [60 + 287] * 4
    assert balanced.samples.tolist() == [60 * 32 + 287 * 40, 60 * 32 + 287 * 39, 60 * 32 + 287 * 39, 60 * 32 + 287 * 10]
    assert Cluster(step_times=[1.0], batch_share=0.25).step_scale(64) == 1.25
    with pytest.raises(ValueError, match="batch_share"):
        Cluster(step_times=[1.0], batch_share=1.5)
