"""``aggregate=Normalized(...)`` and ``Mean(outer=OuterSGD(...))``: the runtime's arithmetic on injected changes, exact.

Values are dyadic (sums of powers of two), so every expectation is exact in float64."""
import copy

import numpy as np
import pytest

from fakes import ArrayCollectives, ArrayModel, ThreadAllreduce, run_ranks
from horovod_hetero.runtime.aggregator import Aggregator
from horovod_hetero.runtime.controller import HeteroController
from horovod_hetero.strategies import (
    ADSP, AGGREGATES, DSSP, WAGMA, Aggregation, Balanced, ElasticBSP, ESync, LocalSGD, Mean, ModelAveraging, Normalized,
    OuterSGD, Plan, Synchronous)
from horovod_hetero.runtime.runner import check_aggregate as check_beside
from horovod_hetero.strategies.aggregation import check_aggregate


def aggregator(aggregate="mean", outer=None, start=(0.0,)):
    agg = Aggregator(AGGREGATES[aggregate](outer), copy=lambda ts: [np.array(t, copy=True) for t in ts])
    agg.begin([np.array(start)])
    return agg


def round_of(agg, changes, steps, samples=None, weights=None):
    """Every rank's contribution summed, then combined (as the fused allreduce and every rank do)."""
    parts = [agg.contribution([agg.start[0] + np.asarray(d, dtype=float)], 1.0 if weights is None else weights[r],
                              steps[r], 0 if samples is None else samples[r]) for r, d in enumerate(changes)]
    summed = [sum(p[0][0] for p in parts)]
    extra = [sum(p[1][i] for p in parts) for i in range(2)]
    return agg.combine(summed, extra)[0]


def test_mean_is_the_mean_of_the_changes():
    agg = aggregator("mean", start=[1.0, 1.0])
    assert round_of(agg, [[4.0, 0.0], [0.0, 1.0]], steps=[4, 1]).tolist() == [3.0, 1.5]


def test_normalized_weighs_every_ranks_step_alike():
    """Fast ranks took 4 steps of +1 in their own coordinate, the slow one 1 step of +1 in its own:
    mean gives the fast coordinates 4x the slow one's share, normalized the same share, scaled by
    tau_eff = 3.25 (the mean steps)."""
    changes = [np.eye(4)[r] * tau for r, tau in enumerate([4, 4, 4, 1])]
    mean = round_of(aggregator("mean", start=[0.0] * 4), changes, steps=[4, 4, 4, 1])
    normalized = round_of(aggregator("normalized", start=[0.0] * 4), changes, steps=[4, 4, 4, 1],
                          samples=[128, 128, 128, 32])
    assert mean.tolist() == [1.0, 1.0, 1.0, 0.25]
    assert normalized.tolist() == [0.8125] * 4


def test_normalized_equals_mean_for_equal_steps():
    changes = [[1.0, -2.0], [3.0, 0.5], [0.25, 4.0], [-1.0, 1.0]]
    mean = round_of(aggregator("mean", start=[0.5, 0.5]), changes, steps=[4] * 4)
    normalized = round_of(aggregator("normalized", start=[0.5, 0.5]), changes, steps=[4] * 4, samples=[64] * 4)
    assert normalized.tolist() == mean.tolist() == [1.3125, 1.375]


def test_normalized_weighs_ranks_by_their_samples_per_step():
    """p_i is a rank's samples per step (its batch size): a rank with 3x the batch counts 3x."""
    out = round_of(aggregator("normalized", start=[0.0, 0.0]), [[2.0, 0.0], [0.0, 2.0]], steps=[2, 2],
                   samples=[32, 96])
    assert out.tolist() == [0.5, 1.5]


def test_a_rank_without_steps_counts_for_nothing_and_takes_the_others_change():
    out = round_of(aggregator("normalized", start=[1.0]), [[4.0], [0.0]], steps=[2, 0], samples=[64, 0],
                   weights=[1.0, 0.0])
    assert out.tolist() == [5.0]
    assert round_of(aggregator("mean", start=[1.0]), [[4.0], [0.0]], steps=[2, 0], weights=[1.0, 0.0]).tolist() == [5.0]
    assert round_of(aggregator("normalized", start=[1.0]), [[0.0]], steps=[0], weights=[0.0]).tolist() == [1.0]


def test_outer_sgd_without_momentum_moves_part_way():
    agg = aggregator("mean", OuterSGD(lr=0.5), start=[1.0])
    assert round_of(agg, [[4.0], [2.0]], steps=[1, 1]).tolist() == [2.5]


@pytest.mark.parametrize("nesterov, expected", [(False, [3.0, 6.0, 8.5]), (True, [4.0, 7.5, 9.75])])
def test_outer_momentum_on_injected_deltas(nesterov, expected):
    """m = 0.5 m + Delta; w = w_t + lr (Delta + 0.5 m) with Nesterov, w_t + lr m without; Delta 2, 2, 1."""
    agg = aggregator("mean", OuterSGD(lr=1.0, momentum=0.5, nesterov=nesterov), start=[1.0])
    seen = []
    for delta in (2.0, 2.0, 1.0):
        new = round_of(agg, [[delta]], steps=[1])
        agg.begin([new])
        seen.append(float(new[0]))
    assert seen == expected


@pytest.mark.parametrize("aggregate", ["mean", "normalized"])
def test_a_round_in_which_no_rank_stepped_takes_no_outer_step(aggregate):
    """sync_model() right after another: the model and the momentum stay (else the momentum moves it)."""
    agg = aggregator(aggregate, OuterSGD(lr=1.0, momentum=0.5, nesterov=True), start=[1.0])
    agg.begin([round_of(agg, [[2.0], [2.0]], steps=[1, 1], samples=[8, 8])])          # 1 + 2 + 0.5 * 2
    assert (agg.start[0].tolist(), agg.momentum[0].tolist()) == ([4.0], [2.0])
    out = round_of(agg, [[0.0], [0.0]], steps=[0, 0], samples=[0, 0], weights=[0.0, 0.0])
    assert (out.tolist(), agg.momentum[0].tolist()) == ([4.0], [2.0])


def test_outer_sgd_lr_1_without_momentum_is_plain_mean():
    assert Mean(OuterSGD(lr=1.0)).outer is None and Mean(OuterSGD(lr=1.0)).plain
    assert check_aggregate(Mean(OuterSGD(lr=1.0))) is None and check_aggregate(None) is None
    assert not Normalized().plain and check_aggregate(Normalized()) == Normalized()


@pytest.mark.parametrize("make, error, match", [
    (lambda: check_aggregate("normalized"), TypeError, r"aggregate must be hh.Mean\(...\) or hh.Normalized\(...\)"),
    (lambda: check_aggregate(OuterSGD(0.7)), TypeError, "aggregate must be hh.Mean"),
    (lambda: Normalized(outer="nesterov"), TypeError, r"outer must be an outer optimiser such as hh.OuterSGD"),
    (lambda: Mean(0.7), TypeError, "outer must be an outer optimiser"),
    (lambda: Aggregation(), TypeError, "Aggregation is the base of hh.Mean and hh.Normalized"),
])
def test_bad_aggregation_arguments_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"lr": 0.0}, ValueError, "OuterSGD lr must be > 0"), ({"lr": float("nan")}, ValueError, "finite"),
    ({"lr": "0.7"}, TypeError, "OuterSGD lr must be a real number"),
    ({"momentum": 1.0}, ValueError, r"OuterSGD momentum must be in \[0, 1\)"),
    ({"momentum": -0.1}, ValueError, "OuterSGD momentum must be"),
    ({"nesterov": True}, ValueError, "nesterov=True needs momentum > 0"),
    ({"momentum": 0.9, "nesterov": 1}, TypeError, "OuterSGD nesterov must be True or False"),
])
def test_bad_outer_sgd_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        OuterSGD(**kwargs)


@pytest.mark.parametrize("strategy", [Synchronous(), Balanced(global_batch=8)])
def test_a_gradient_averaging_strategy_takes_no_aggregation_but_plain_averaging(strategy):
    assert check_beside(Mean(), strategy) is None
    with pytest.raises(ValueError, match=f"{type(strategy).__name__} averages gradients every step"):
        check_beside(Normalized(), strategy)
    with pytest.raises(ValueError, match="averages gradients"):
        check_beside(Mean(OuterSGD(0.5)), strategy)
    assert check_beside(Normalized(), LocalSGD(4)) == Normalized()


@pytest.mark.parametrize("make", [lambda **kw: LocalSGD(4, **kw), lambda **kw: ESync(**kw), lambda **kw: WAGMA(**kw),
                                  lambda **kw: ElasticBSP(**kw), lambda **kw: DSSP(**kw), lambda **kw: ADSP(**kw)])
def test_the_aggregation_is_given_beside_a_strategy_never_to_it(make):
    for given in ({"aggregate": Normalized()}, {"outer": OuterSGD(0.7)}, {"global_lr": 0.5}):
        name = type(make()).__name__
        with pytest.raises(TypeError, match=rf"^{name}\({next(iter(given))}=\.\.\.\) was removed in horovod-hetero "
                                            rf"0\.2\.0: .* \(see CHANGELOG\.md\)$") as error:
            make(**given)
        assert "hh.DistributedOptimizer" in str(error.value) and "aggregate=hh." in str(error.value)
    assert not hasattr(make(), "aggregate") and not hasattr(make(), "outer")


# --- through the controller: four fake ranks, unequal local steps --------------------------------

class FixedPlan(ModelAveraging):
    """Every round after ``steps[rank]`` local steps."""

    def __init__(self, steps):
        super().__init__()
        self.steps = tuple(steps)

    def on_start(self, ctx):
        return Plan(self.steps)

    def on_round(self, result):
        return Plan(self.steps)


def train_ranks(strategy, rounds, start=None, aggregate=None):
    """Four fake ranks; rank r's every local step adds e_r (its own coordinate) to its model and reports
    32 samples; returns every rank's model after each round and the controllers."""
    allreduce = ThreadAllreduce(4)

    def rank(r):
        model = ArrayModel({"w": np.zeros(4) if start is None else np.array(start)})
        ctl = HeteroController(copy.deepcopy(strategy), ArrayCollectives(allreduce, r, 4), model,
                               aggregate=aggregate)
        ctl.start()                          # as the adapters do before the first local step
        seen = []
        while len(seen) < rounds:
            model.arrays["w"] = model.arrays["w"] + np.eye(4)[r]
            ctl.telemetry.annotate(samples=32)
            if ctl.after_step():
                seen.append(model.arrays["w"].tolist())
        ctl.finish()
        return seen

    return run_ranks(4, rank)


@pytest.mark.parametrize("aggregate, outer, expected", [
    ("mean", None, [[1.0, 1.0, 1.0, 0.25], [2.0, 2.0, 2.0, 0.5]]),
    ("normalized", None, [[0.8125] * 4, [1.625] * 4]),
    ("normalized", OuterSGD(lr=1.0, momentum=0.5, nesterov=True), [[1.21875] * 4, [2.640625] * 4]),
])
def test_every_rank_ends_every_round_with_the_same_combination(aggregate, outer, expected):
    """Ranks 0-2 take 4 steps per round, rank 3 one: mean gives rank 3's coordinate a quarter of the
    others' share, normalized the same share (tau_eff = 3.25); Nesterov momentum 0.5 on top:
    1.5 Delta, then Delta + 0.5 (0.5 Delta + Delta) = 1.75 Delta more."""
    models = train_ranks(FixedPlan((4, 4, 4, 1)), rounds=2, aggregate=AGGREGATES[aggregate](outer))
    assert models == [expected] * 4


def test_the_aggregation_state_round_trips_through_state_dict():
    """A controller that loads another's state_dict() (w_t and the outer momentum) continues exactly
    as the other does."""
    strategy, aggregate = LocalSGD(2), Normalized(outer=OuterSGD(lr=0.5, momentum=0.5, nesterov=True))

    def controller(model):
        return HeteroController(copy.deepcopy(strategy), ArrayCollectives(lambda rank, arrays: arrays), model,
                                aggregate=aggregate)

    def steps(ctl, model, n):
        for _ in range(n):
            model.arrays["w"] = model.arrays["w"] + np.array([1.0, -2.0])
            ctl.after_step()
        return model.arrays["w"].tolist()

    a = ArrayModel({"w": np.zeros(2)})
    first = controller(a)
    steps(first, a, 5)                       # mid-round: 2 rounds done, a step into the third
    state = copy.deepcopy(first.state_dict())
    assert set(state) == {"strategy", "rounds", "aggregation"} and state["aggregation"]["momentum"] is not None
    b = ArrayModel({"w": np.array(a.arrays["w"])})
    second = controller(b)
    second.start()
    second.load_state_dict(state)
    assert steps(second, b, 7) == steps(first, a, 7)
    first.finish()
    second.finish()


def test_a_state_without_aggregation_takes_the_model_held_as_the_rounds_start():
    model = ArrayModel({"w": np.array([3.0])})
    ctl = HeteroController(LocalSGD(2), ArrayCollectives(lambda rank, arrays: arrays), model,
                                aggregate=Normalized())
    ctl.start()
    model.arrays["w"] = np.array([5.0])
    ctl.load_state_dict({"strategy": ctl.strategy.state_dict(), "rounds": ctl.protocol.state_dict()})
    assert ctl.aggregator.start[0].tolist() == [5.0]
    with pytest.raises(ValueError, match="do not fit"):
        ctl.load_state_dict(dict(ctl.state_dict(), aggregation={"start": [np.zeros(3), np.zeros(1)], "momentum": None}))
    ctl.finish()
