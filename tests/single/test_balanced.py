"""Balanced: the batch plan from injected step-time lines (exact), its windows and rounds, the batch
sampler's epochs, the simulator, and bad input."""
import numpy as np
import pytest

from fakes import round_result
from horovod_hetero.rules.batch_split import (StepModel, alike, choose_split, fit_step_model, fit_step_time, longest_step,
                                          plan_split)
from horovod_hetero.rules.partition import step_batch, steps_per_epoch
from horovod_hetero.simulate import Cluster, simulate
from horovod_hetero.strategies import MEASURE, Balanced, RoundResult, RoundStats, Synchronous
from horovod_hetero.strategies.balanced import even_split


@pytest.mark.parametrize("alpha, beta, cap, want", [
    ([0.0] * 4, [1.0] * 4, None, [32, 32, 32, 32]),
    ([0.0] * 4, [1.0, 1.0, 1.0, 4.0], None, [40, 39, 39, 10]),     # the most even within the shortest step
    ([0.01, 0.01, 0.01, 0.04], [0.001, 0.001, 0.001, 0.004], None, [42, 42, 41, 3]),
    ([0.0] * 4, [1.0, 1.0, 1.0, 4.0], 34, [34, 34, 34, 26]),
    ([0.0, 0.0], [1.0, 1e-9], None, [1, 127]),
])
def test_the_plan_splits_the_global_batch_exactly_equalising_the_predicted_steps(alpha, beta, cap, want):
    lines = [StepModel(a, b) for a, b in zip(alpha, beta)]
    sizes = plan_split(128, lines, max_batch=cap)
    assert sizes.tolist() == want and sizes.sum() == 128 and (sizes >= 1).all()
    assert cap is None or sizes.max() <= cap
    best = longest_step(lines, sizes)                   # no single move of one sample shortens the longest step
    for a in range(len(sizes)):
        for b in range(len(sizes)):
            if a != b and sizes[a] > 1 and (cap is None or sizes[b] < cap):
                moved = sizes.copy()
                moved[a] -= 1
                moved[b] += 1
                assert longest_step(lines, moved) >= best


def test_a_plan_that_cannot_exist_is_refused():
    with pytest.raises(ValueError, match="cannot be split into 4 batches of 1 to 20"):
        plan_split(128, [StepModel(0.0, 1.0)] * 4, max_batch=20)


def test_step_time_lines():
    assert fit_step_time([10, 20, 40], [0.03, 0.05, 0.09]) == (0.01, 0.002)
    assert fit_step_time([10, 10], [0.05, 0.07]) == (0.0, 0.006)            # one batch size: proportional
    assert fit_step_time([10, 20], [0.09, 0.05]) == (0.0, 0.0038)           # a falling line: through the origin


def test_every_step_gives_every_rank_its_part_and_the_epoch_uses_every_sample():
    order = list(np.random.default_rng(0).permutation(103))
    plans = [(40, 40, 39, 9)] * 2 + [(32, 32, 32, 32)]
    assert steps_per_epoch(103, 128) == 1 and steps_per_epoch(1000, 128) == 8
    seen = []
    for step, sizes in enumerate(plans):
        parts = [step_batch(order, step, sizes, r) for r in range(4)]
        assert [len(p) for p in parts] == list(sizes)
        seen += sum(parts, [])
    assert set(seen) == set(order)                          # every sample, a few more than once (wrapped)


def balanced(size=4, **kwargs):
    s = Balanced(**{"global_batch": 128, "rebalance_every": 2, **kwargs})
    from fakes import context
    ctx, transports = context(rank=0, size=size)
    s.start(ctx)
    return s, transports


def stats(step_s, sizes, steps=2):
    n = len(step_s)
    return RoundStats(local_steps=np.full(n, steps), step_s=np.asarray(step_s, dtype=float), loss=np.full(n, np.nan),
                      samples=np.asarray(sizes) * steps, done=np.zeros(n, dtype=bool))


def run_windows(s, speeds, windows):
    """``windows`` windows of ``rebalance_every`` steps; rank r's step takes ``speeds[r] * batch`` s. Returns
    every window's sizes."""
    seen, rnd = [], 0
    for _ in range(windows):
        sizes = s.batch_sizes(s.step + 1)
        seen.append(sizes)
        for _ in range(s.rebalance_every):
            decision = s.after_step()
        assert decision is MEASURE
        rnd += 1
        s.after_round(RoundResult(rnd, 1.0, 4.0, 0, stats([v * b for v, b in zip(speeds, sizes)], sizes)))
    return seen


def test_windows_are_measured_and_the_sizes_follow_the_speeds_within_three_rebalances():
    s, transports = balanced()
    assert [repr(s.after_step()) for _ in range(4)] == ["CONTINUE", "MEASURE", "CONTINUE", "MEASURE"]
    s, transports = balanced()
    seen = run_windows(s, [1.0, 1.0, 1.0, 4.0], 8)
    assert seen[:3] == [(32, 32, 32, 32)] * 3                 # window 0 is start-up: not measured
    assert seen[3] == (40, 39, 39, 10) and seen[-1] == (40, 39, 39, 10)
    transports.close()


def test_the_sizes_follow_a_change_of_speed():
    s, transports = balanced()
    run_windows(s, [1.0, 1.0, 1.0, 4.0], 5)
    seen = run_windows(s, [4.0, 1.0, 1.0, 1.0], 6)
    assert seen[-1] == (10, 40, 39, 39)
    transports.close()


def test_a_change_of_speed_at_the_even_split_is_confirmed_then_followed_in_one_move():
    """Equal ranks for 8 windows (the even split: one batch size, no model tested), then rank 3 four times
    slower (``1,1,1,1;T:1,1,1,4``), noise 3 %: the first window at 4x is suspect (held out of the history),
    the second confirms it, the history restarts from it and the one plan that follows stays. (Before:
    the fits mixed both speeds, two partial moves, the even split again, then this one.)"""
    s, transports = balanced()
    even = (32, 32, 32, 32)
    assert run_curves(s, [linear(0.0, 0.001)] * 4, 8) == [even] * 8
    seen = run_curves(s, [linear(0.0, 0.001)] * 3 + [linear(0.0, 0.004)], 8, seed=1)
    assert len(s.history) == 7 and s.suspect is None              # from the confirming window on
    assert seen[:3] == [even] * 3                                 # a plan made after window p runs from p + 2
    assert seen[3:] == [(40, 39, 39, 10)] * 5
    transports.close()
    # the change inside a window (rank 3 2.5x as slow over it): that window, suspect, is dropped; the next,
    # 4x, confirms the change: one move, straight to the split that stays
    s, transports = balanced()
    run_curves(s, [linear(0.0, 0.001)] * 4, 8)
    seen = run_curves(s, [linear(0.0, 0.001)] * 3 + [linear(0.0, 0.0025)], 1, seed=1)
    assert s.suspect is not None and s.suspect[2] == (0, 0, 0, 1)
    seen += run_curves(s, [linear(0.0, 0.001)] * 3 + [linear(0.0, 0.004)], 6, seed=2)
    assert seen[:3] == [even] * 3 and seen[3:] == [(40, 39, 39, 10)] * 4
    transports.close()


def test_one_window_off_is_noise_and_joins_the_history():
    s, transports = balanced()
    run_curves(s, [linear(0.0, 0.001)] * 4, 6)
    run_curves(s, [linear(0.0, 0.001)] * 3 + [linear(0.0, 0.002)], 1)      # one window at 2x: suspect
    assert s.suspect is not None and s.suspect[2] == (0, 0, 0, 1) and len(s.history) == 5
    state = s.state_dict()
    run_curves(s, [linear(0.0, 0.001)] * 4, 1)                             # back: it was noise
    assert s.suspect is None and len(s.history) == 7
    restored, other = balanced()
    restored.load_state_dict(state)                                        # a rank that joins holds it too
    assert restored.suspect == (tuple(state["suspect"][0]), tuple(state["suspect"][1]), (0, 0, 0, 1))
    transports.close()
    other.close()


def test_the_hysteresis_rises_to_the_noise_measured():
    """Windows scattered by +-30 % (4 processes sharing 2 cores under the proportional slowdown scatter so):
    the noise measured about the fits, 20.5 %, replaces the 5 % a new split must beat, and a window is off
    only beyond 3 times it; the three equal ranks, which the windows cannot tell apart, share one fit: the
    plan moves once in 20 windows, to the best split for the true lines, and stays (with a fit per rank:
    twice, ending at (36, 44, 37, 11)); at 3 % noise it stays 5 % and the plan moves once."""
    s, transports = balanced()
    seen = run_curves(s, [linear(0.0, 0.001)] * 3 + [linear(0.0, 0.004)], 20, noise=0.3, seed=0)
    assert [w for w in range(1, 20) if seen[w] != seen[w - 1]] == [3]
    assert s.noise() == pytest.approx(0.205, abs=1e-3) and seen[-1] == (40, 39, 39, 10)
    transports.close()
    s, transports = balanced()
    seen = run_curves(s, [linear(0.0, 0.001)] * 3 + [linear(0.0, 0.004)], 20, noise=0.03, seed=0)
    assert [w for w in range(1, 20) if seen[w] != seen[w - 1]] == [3] and s.noise() == 0.05
    transports.close()


def test_gradient_weights_are_the_shares_of_the_global_batch():
    s, transports = balanced()
    run_windows(s, [1.0, 1.0, 1.0, 4.0], 4)
    assert [s.gradient_weight(r, 4) for r in range(4)] == [40 / 128, 39 / 128, 39 / 128, 10 / 128]
    assert sum(s.gradient_weight(r, 4) for r in range(4)) == 1.0
    fresh = Balanced(global_batch=10)                           # before it starts: an even split over the size given
    assert [fresh.gradient_weight(r, 4) for r in range(4)] == [0.3, 0.3, 0.2, 0.2]
    transports.close()


def test_a_loader_that_ignores_the_plan_is_named_at_the_first_measured_round():
    s, transports = balanced()
    run_windows(s, [1.0, 1.0, 1.0, 4.0], 3)
    for _ in range(2):
        s.after_step()
    with pytest.raises(ValueError, match=r"planned batches of 40 samples on rank 0 .* reported 32 on average: draw "
                                         r"the batches from hh.DistributedSampler"):
        s.after_round(RoundResult(9, 1.0, 4.0, 0, stats([0.032, 0.032, 0.032, 0.128], [32] * 4)))
    transports.close()


def test_asking_sizes_beyond_the_plans_made_is_an_error_naming_the_prefetch():
    s, transports = balanced(rebalance_every=5)
    assert s.batch_sizes(10) == (32, 32, 32, 32)
    with pytest.raises(ValueError, match="prefetches more batches than rebalance_every"):
        s.batch_sizes(11)
    transports.close()


def test_the_plans_round_trip_through_state_dict():
    s, transports = balanced()
    run_windows(s, [1.0, 1.0, 1.0, 4.0], 5)
    s.noise_seen = (0.1, 0.2, 0.05, 0.3)
    t = Balanced(rebalance_every=2)
    t.load_state_dict(s.state_dict())
    assert t.global_batch == 128 and t.plans == s.plans and t.history == s.history and t.step == s.step
    assert t.noise_seen == s.noise_seen
    transports.close()


def test_ranks_the_windows_cannot_tell_apart_share_one_fit():
    # 3 x hypot(0.1, 0.1) = 42 %: 31 ms is 24 % above 25 ms, 40 ms 60 % (a group of its own), 120 ms far off
    assert alike([0.031, 0.025, 0.12, 0.04], [0.1] * 4) == [(0, 1), (2,), (3,)]
    assert alike([0.031, 0.025, 0.12, 0.04], [0.2] * 4) == [(0, 1, 3), (2,)]      # 85 %: 40 ms joins
    assert alike([0.1, 0.1], [0.0, 0.0]) == [(0, 1)] and alike([0.1, 0.1001], [0.0, 0.0]) == [(0,), (1,)]
    # three equal ranks under 30 % noise share one model fitted to their windows; the 4x slower keeps its own
    s, transports = balanced()
    run_curves(s, [linear(0.0, 0.001)] * 3 + [linear(0.0, 0.004)], 12, noise=0.3, seed=0)
    models = s.planning_models()
    assert models[0] == models[1] == models[2] != models[3]
    assert models[0] == fit_step_model([h[0][r] for h in s.history for r in range(3)],
                                       [h[1][r] for h in s.history for r in range(3)])
    assert models[3] == s._models(s.history)[3]
    transports.close()


def test_the_noise_measured_outlives_a_change_of_speed():
    """Under 30 % noise rank 0 becomes the slow one: the change is confirmed and the history restarts, but
    the noise measured before it still bounds the plan (not 5 % from a window or two): one move, to the best
    split, which stays."""
    s, transports = balanced()
    run_curves(s, [linear(0.0, 0.001)] * 3 + [linear(0.0, 0.004)], 10, noise=0.3, seed=0)
    before = tuple(s.rank_noise(s._models(s.history)))
    seen = run_curves(s, [linear(0.0, 0.004)] + [linear(0.0, 0.001)] * 3, 8, noise=0.3, seed=1)
    assert s.noise_seen == before and len(s.history) == 7 and min(before) > 0.1
    assert seen == [(40, 39, 39, 10)] * 3 + [(11, 39, 39, 39)] * 5
    transports.close()


@pytest.mark.parametrize("kwargs, size, error, match", [
    ({"global_batch": 0}, 4, ValueError, "global_batch must be an int >= 1"),
    ({"global_batch": 3}, 4, ValueError, r"global_batch must be an int >= the number of ranks \(4\), got 3"),
    ({"global_batch": "128"}, 4, TypeError, "global_batch must be an int"),
    ({"rebalance_every": 0}, 4, ValueError, "rebalance_every must be an int >= 1"),
    ({"global_batch": 128, "max_batch": 30}, 4, ValueError, r"max_batch must be >= global_batch / ranks = 128 / 4 "
                                                            r"\(= 32\), got 30"),
    ({"max_batch": 2.5}, 4, TypeError, "max_batch must be an int"),
    ({"min_batch": 0}, 4, ValueError, "min_batch must be an int >= 1"),
    ({"min_batch": 2.5}, 4, TypeError, "min_batch must be an int"),
    ({"max_batch": 8, "min_batch": 9}, 4, ValueError, r"min_batch must be an int <= max_batch \(8\), got 9"),
    ({"global_batch": 16, "min_batch": 5}, 4, ValueError, r"min_batch must be <= global_batch / ranks = 16 / 4 "
                                                          r"\(= 4\), got 5"),
])
def test_bad_input_is_named(kwargs, size, error, match):
    with pytest.raises(error, match=match):
        Balanced(**kwargs).check_size(size)


def test_without_a_global_batch_it_takes_the_samplers():
    s = Balanced()
    s.use_batch(32, 4)
    assert s.global_batch == 128
    with pytest.raises(ValueError, match="Balanced\\(global_batch=None\\) takes the number of ranks times the batch"):
        from fakes import context
        Balanced().start(context(0, 4)[0])


def test_the_simulator_runs_balanced_at_the_fast_workers_pace():
    cluster = Cluster(step_times=[0.05, 0.05, 0.05, 0.2], samples_per_step=32, model_bytes=0.0, latency_s=0.0)
    sync = simulate(cluster, Synchronous(), 60.0)
    bal = simulate(cluster, Balanced(global_batch=128, rebalance_every=10), 60.0)
    assert bal.steps.min() == bal.steps.max() and bal.samples.tolist()[3] < bal.samples.tolist()[0] / 3
    assert 2.9 < bal.samples_per_s / sync.samples_per_s < 3.25          # 3.2x once planned; the first windows even
    assert even_split(10, 4) == (3, 3, 2, 2)


def run_curves(s, curves, windows, noise=0.03, seed=0):
    """``windows`` windows; rank r's median step at batch b takes ``curves[r](b)`` s, times a factor drawn
    from ``1 +- noise`` (the same draws in every run). Returns every window's sizes."""
    draws = np.random.default_rng(seed).uniform(1 - noise, 1 + noise, size=(windows, len(curves)))
    seen = []
    for w in range(windows):
        sizes = s.batch_sizes(s.step + 1)
        seen.append(sizes)
        for _ in range(s.rebalance_every):
            s.after_step()
        times = [curve(b) * d for curve, b, d in zip(curves, sizes, draws[w])]
        s.after_round(RoundResult(w + 1, 1.0, 4.0, 0, stats(times, sizes)))
    return seen


def padded(seconds):
    return lambda b: seconds


def linear(alpha, beta):
    return lambda b: alpha + beta * b


def knee(floor, beta):
    return lambda b: max(floor, beta * b)


def test_a_step_time_that_does_not_rise_with_the_batch_keeps_the_even_split():
    """A padded step (the slow rank's 4x as long whatever its batch), noise 3 %: the first fit (one batch
    size) takes time as proportional and moves samples once; the next windows see that it did not pay
    and the even split comes back for good."""
    s, transports = balanced()
    seen = run_curves(s, [padded(0.1)] * 3 + [padded(0.4)], 16)
    even = (32, 32, 32, 32)
    assert seen[:3] == [even] * 3 and seen[3] == seen[4] == (40, 39, 39, 10)    # the hypothesis, tried once
    assert seen[5:] == [even] * 11
    transports.close()


def test_a_linear_step_time_with_noise_settles_within_three_rebalances_and_stays():
    s, transports = balanced()
    seen = run_curves(s, [linear(0.01, 0.001)] * 3 + [linear(0.04, 0.004)], 20, noise=0.05)
    assert seen[:3] == [(32, 32, 32, 32)] * 3
    assert [w for w in range(1, 20) if seen[w] != seen[w - 1]] == [3, 5]          # two moves, then none
    assert seen[-1] == (42, 42, 41, 3)                            # the best split for the true lines
    transports.close()


def test_a_knee_is_fitted_as_such_and_the_plan_is_the_best_for_the_true_curve():
    """Flat up to 25 samples, linear after (a GPU below saturation); the slow rank 4x as slow per sample."""
    s, transports = balanced()
    curves = [knee(0.1, 0.004)] * 3 + [knee(0.4, 0.016)]
    seen = run_curves(s, curves, 16, noise=0.02)
    assert [w for w in range(1, 16) if seen[w] != seen[w - 1]] == [3, 5, 7]       # three moves, then none
    # the slow rank's floor is the shortest step any split allows: reached, and with the slow rank's batch
    # as large as what it ran below its knee allows (10 samples: it never ran 11 to 25)
    assert seen[-1] == (40, 39, 39, 10) and max(c(b) for c, b in zip(curves, seen[-1])) == 0.4
    transports.close()


def test_step_models_from_noisy_windows():
    flat = fit_step_model([32, 32, 9, 9], [0.40, 0.42, 0.41, 0.39])             # padded: no rise over 9-32
    assert flat == StepModel(0.0, round(0.405 / 32, 12), 0.405)
    assert flat(9) == flat(32) == 0.405 and flat(64) == pytest.approx(0.81)    # proportional past what ran
    line = fit_step_model([24, 32, 40], [0.058, 0.074, 0.089])                 # 0.01 + 0.002 b, +-1 %
    assert (round(line.alpha, 4), round(line.beta, 5), line.floor) == (0.0117, 0.00194, 0.0)
    bent = fit_step_model([16, 24, 32, 48], [0.101, 0.099, 0.128, 0.193])       # max(0.1, 0.004 b)
    assert (round(bent.floor, 3), round(bent.beta, 4)) == (0.099, 0.0039) and bent(8) == bent.floor
    assert fit_step_model([32, 32], [0.08, 0.1]) == StepModel(0.0, 0.0028125)  # one batch size: proportional


def test_a_split_moves_only_for_a_gain_beyond_the_noise():
    models = [StepModel(0.0, 0.001)] * 3 + [StepModel(0.0, 0.0011)]            # 10 % slower: 6 % to gain
    assert choose_split(128, models, (32, 32, 32, 32), (32, 32, 32, 32)) == (33, 33, 32, 30)
    models = [StepModel(0.0, 0.001)] * 3 + [StepModel(0.0, 0.00104)]           # 4 % slower: within the noise
    assert choose_split(128, models, (32, 32, 32, 32), (32, 32, 32, 32)) == (32, 32, 32, 32)
    assert choose_split(128, models, (33, 33, 32, 30), (32, 32, 32, 32)) == (32, 32, 32, 32)   # back to even
    models = [StepModel(0.0, 0.001)] * 3 + [StepModel(0.0, 0.004)]
    assert choose_split(128, models, (40, 39, 39, 10), (32, 32, 32, 32)) == (40, 39, 39, 10)   # no better one
    assert choose_split(128, models, (40, 39, 39, 10), (32, 32, 32, 32), min_batch=12) == (39, 39, 38, 12)
