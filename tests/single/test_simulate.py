import numpy as np
import pytest

from horovod_hetero.common.esync import ESyncState
from horovod_hetero.common.simulate import (DSSP, WAGMA, Cluster, ElasticBSP, ESync, LocalSGD, Sync, compare,
                                            format_table, simulate)


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
    r = simulate(free_network([1, 1, 1, 4]), ESync(), duration=40.0)
    assert r.steps.tolist() == [40, 40, 40, 10] and r.syncs.tolist() == [10] * 4
    np.testing.assert_allclose(r.compute_ratio, 1.0)
    # with the paper's epsilon the 4th step (which would end exactly with the slowest) is skipped
    eps = simulate(free_network([1, 1, 1, 4]), ESync(epsilon=1e-3), duration=40.0)
    assert eps.steps.tolist() == [30, 30, 30, 10]


def test_esync_vectorised_rule_matches_the_state_server_object():
    """Replay each round's queries, in time order, against ESyncState. Actual step times deviate
    from the capabilities (jitter), which is when "the slowest is already ready" matters."""
    rng = np.random.default_rng(3)
    for trial in range(40):
        caps = rng.uniform(0.3, 3.0, 5)
        k_max = int(np.ceil(caps.max() / caps.min())) + 2
        durations = caps[:, None] * (1.0 + (0.3 if trial % 2 else 0.0) * rng.standard_normal((5, k_max)))
        durations = np.maximum(durations, 0.05)
        planned = ESync(epsilon=0.01).plan(0.0, caps, durations)
        ends = np.cumsum(durations, axis=1)
        now = [0.0]
        state = ESyncState(5, epsilon=0.01, clock=lambda: now[0])
        for rank in range(5):
            state.query(rank, 0, caps[rank], 0.0)
        got = {}
        for t, r, k in sorted((ends[r, k - 1], r, k) for r in range(5) for k in range(1, k_max + 1)):
            if r in got:
                continue
            now[0] = t
            if state.query(r, k, caps[r], t) or k == k_max:
                got[r] = k
        assert [got[r] for r in range(5)] == planned.tolist(), trial


def test_elasticbsp_uses_zipline_and_matches_esync_on_exact_speeds():
    r = simulate(free_network([1, 1, 1, 4]), ElasticBSP(R=8), duration=40.0)
    assert r.steps.tolist() == [40, 40, 40, 10] and r.wait_s.max() == 0.0


def test_dssp_without_a_range_is_bounded_staleness():
    r = simulate(free_network([1, 4]), DSSP(s_lower=0, s_upper=0), duration=40.5)
    assert abs(int(r.steps[0]) - int(r.steps[1])) <= 1
    ranged = simulate(free_network([1, 4]), DSSP(s_lower=2, s_upper=10), duration=40.5)
    assert ranged.steps[0] > r.steps[0] and ranged.compute_ratio[0] > r.compute_ratio[0]


def test_wagma_groups_every_step_global_every_period():
    c = Cluster([1.0] * 8, model_bytes=1e6, latency_s=0.0, bandwidth=1e9)
    r = simulate(c, WAGMA(group_size=2, period=5), duration=10.0)
    assert r.syncs[0] == r.steps[0] // 5 * 6
    per_round = 5 * c.ring_bytes(2) + c.ring_bytes(8)
    np.testing.assert_allclose(r.bytes_sent, r.steps // 5 * per_round)
    with pytest.raises(ValueError, match="power of two"):
        simulate(Cluster([1.0] * 6), WAGMA(period=5), duration=5.0)


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
    results = compare(c, [Sync(), LocalSGD(8), ESync(), ElasticBSP(15), DSSP(3, 15)], duration=15.0)
    assert all(r.steps.size == 10000 for r in results)
    sync, esync = results[0], results[2]
    assert esync.samples_per_s > 1.5 * sync.samples_per_s
    wagma = simulate(Cluster(np.r_[np.full(4096, 1.0), np.full(4096, 3.2)]), WAGMA(period=10), 10.0)
    assert wagma.steps.size == 8192
    assert "ESync" in format_table(results)


def test_bad_clusters():
    with pytest.raises(ValueError, match="step_times"):
        Cluster([1.0, 0.0])
    with pytest.raises(ValueError, match="change_factors"):
        Cluster([1.0], change_at=3.0)
    with pytest.raises(TypeError, match="strategy must be"):
        simulate(Cluster([1.0]), "sync", 1.0)
