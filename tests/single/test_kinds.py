"""Two kinds of strategy, each carried out on its own path chosen by type: a new strategy is one class."""
import numpy as np
import pytest

from fakes import ArrayCollectives, ArrayModel
from horovod_hetero import simulate as sim
from horovod_hetero.runtime.controller import HeteroController
from horovod_hetero.runtime.runner import GradientRunner, ModelAveragingRunner
from horovod_hetero.strategies import (
    AVERAGE, CONTINUE, MEASURE, Balanced, GradientAveraging, GradientWeighting, ModelAveraging, Normalized, OuterSGD, Strategy,
    Synchronous, check_strategy)
from horovod_hetero.strategies.registry import REGISTRY


class EveryThird(ModelAveraging):
    """A toy strategy, all a contributor writes: average the models every third local step."""

    def decide(self, report):
        return AVERAGE if self.step % 3 == 0 else CONTINUE


class MeasureEveryOther(GradientAveraging):
    """A toy gradient strategy: Horovod averages the gradients; every other step a round measures."""

    def decide(self, report):
        return MEASURE if self.step % 2 == 0 else CONTINUE


def doubled(rank, arrays):
    """Two identical ranks: every sum is twice this rank's part."""
    return [2 * a for a in arrays]


def controller(strategy, model=None, aggregate=None):
    return HeteroController(strategy, ArrayCollectives(doubled, rank=0, size=2),
                            model or ArrayModel({"w": np.array([3.0])}), aggregate=aggregate)


def test_every_registered_strategy_is_exactly_one_kind():
    # Auto runs the others in turn (Strategy.runs): the kind is the one it runs
    assert [entry.name for entry in REGISTRY.values() if entry.cls.runs is not Strategy.runs] == ["auto"]
    kinds = {entry.name: (issubclass(entry.cls, ModelAveraging), issubclass(entry.cls, GradientAveraging),
                          issubclass(entry.cls, GradientWeighting)) for entry in REGISTRY.values() if entry.name != "auto"}
    assert {name for name, (model, _, _) in kinds.items() if not model} == {"sync", "balanced"}
    assert all(model != gradient for model, gradient, _ in kinds.values())
    assert {name for name, (_, _, weighted) in kinds.items() if weighted} == {"balanced"}


def test_a_toy_model_averaging_strategy_runs_in_the_runtime_and_the_simulator_as_written():
    ctl = controller(EveryThird())
    synced = [ctl.after_step() for _ in range(7)]
    assert synced == [False, False, True, False, False, True, False]
    assert ctl.protocol.round == 2 and ctl.aggregator is None
    result = sim.simulate(sim.Cluster([0.1, 0.2]), EveryThird(), duration=3.0)
    assert len(result.round_steps) >= 3 and all(steps.tolist() == [3, 3] for steps in result.round_steps)


def test_an_aggregation_goes_beside_a_model_averaging_strategy_and_the_runtime_applies_it():
    ctl = controller(EveryThird(), aggregate=Normalized(outer=OuterSGD(0.7, 0.9)))
    ctl.start()                    # rounds on changes: the initial models are averaged once
    assert ctl.protocol.round == 1 and ctl.aggregator.start[0].tolist() == [3.0]
    assert (ctl.aggregator.aggregate, ctl.aggregator.outer) == ("normalized", OuterSGD(0.7, 0.9))
    ctl.close()


def test_a_gradient_strategy_measures_with_median_step_times_and_counts_joined_ranks_as_absent():
    ctl = controller(MeasureEveryOther())
    assert type(ctl.runner) is GradientRunner and ctl.protocol.policy is ctl.runner and ctl.aggregator is None
    assert ctl.runner.step_time([0.1, 5.0, 0.2]) == 0.2                    # the median: one stall moves nothing
    assert ctl.runner.absent(np.array([[0.0, 0.0], [1.0, 0.0]])).tolist() == [True, False]
    model = controller(EveryThird())
    assert type(model.runner) is ModelAveragingRunner and model.protocol.policy is model.runner
    assert model.runner.step_time([0.1, 5.0, 0.2]) == pytest.approx(5.3 / 3)
    assert model.runner.absent(np.zeros((2, 2))) is None
    synced = [ctl.after_step() for _ in range(4)]
    assert synced == [False] * 4 and ctl.protocol.round == 2           # measuring rounds average no model
    with pytest.raises(ValueError, match="MeasureEveryOther averages gradients every step"):
        controller(MeasureEveryOther(), aggregate=Normalized())        # no models to aggregate


def test_a_strategy_of_neither_kind_is_refused_where_it_would_run():
    class Neither(Strategy):
        pass

    for run in (check_strategy, controller, lambda s: sim.simulate(sim.Cluster([0.1]), s, 1.0)):
        with pytest.raises(TypeError, match="must derive from ModelAveraging or GradientAveraging"):
            run(Neither())


def test_a_gradient_weighting_strategy_without_its_weights_cannot_be_built():
    class Unweighted(GradientWeighting):
        def use_batch(self, batch_size, size):
            pass

    with pytest.raises(TypeError, match="abstract method.*batch_sizes.*gradient_weight"):
        Unweighted()
    assert isinstance(Balanced(global_batch=8), GradientWeighting) and not isinstance(Synchronous(), GradientWeighting)


def test_only_the_runners_selection_looks_at_a_strategys_kind():
    """The adapters, the controller, the samplers, the simulator, advise, the lab and the examples call a runner's
    hooks (``runtime.runner``); ``runner_for`` picks the runner, and ``check_kind`` (beside the kinds' own
    definitions) refuses a strategy of neither kind. Nothing else tests a kind, and nothing builds on
    ``super(self.__class__, ...)``, which recurses in a user's subclass."""
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parents[2]
    kind = re.compile(r"isinstance\([^)]*\b(ModelAveraging|GradientAveraging|GradientWeighting)\b")
    allowed = {("horovod_hetero/runtime/runner.py", "runner_for"), ("horovod_hetero/strategies/base.py", "check_kind")}
    found, recursing = [], []
    for path in [*root.glob("horovod_hetero/**/*.py"), *root.glob("lab/**/*.py"), *root.glob("examples/*.py")]:
        function = None
        for line in path.read_text().splitlines():
            match = re.match(r"\s*def (\w+)", line)
            function = match.group(1) if match else function
            if kind.search(line) and (path.relative_to(root).as_posix(), function) not in allowed:
                found.append(f"{path.relative_to(root)}: {line.strip()}")
            if "super(self.__class__" in line:
                recursing.append(f"{path.relative_to(root)}: {line.strip()}")
    assert found == [] and recursing == []


def test_the_first_step_after_a_sync_is_not_timed_as_a_step():
    """What runs between a sync and the next step (an epoch's end: evaluation, a checkpoint, the next epoch's
    data) is not the rank's speed: the rounds' step times leave that step out."""
    now = [0.0]
    ctl = HeteroController(EveryThird(), ArrayCollectives(lambda rank, arrays: arrays, rank=0, size=1),
                           ArrayModel({"w": np.array([3.0])}), clock=lambda: now[0])

    def steps(n, seconds):
        for _ in range(n):
            now[0] += seconds
            ctl.after_step()

    steps(3, 0.1)
    ctl.sync()
    now[0] += 5.0                                  # the evaluation after the epoch
    steps(3, 0.1)                                  # the next round: its first step timed the evaluation too
    assert ctl.speeds.step_times.tolist() == pytest.approx([0.1])
    assert [r["local_steps"] for r in ctl.telemetry.records if r.get("synced")][-1] == 3
