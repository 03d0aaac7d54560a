import pytest

from horovod_hetero.strategies import (
    AVERAGE, GradientAveraging, GradientWeighting, LocalSGD, ModelAveraging, Strategy, Synchronous, check_strategy)
from horovod_hetero.validation import as_schedule


def averaging_steps(strategy, n):
    return [step for step in range(1, n + 1) if strategy.after_step() is AVERAGE]


def test_localsgd_averages_every_period_th_step():
    assert averaging_steps(LocalSGD(period=3), 10) == [3, 6, 9]
    assert averaging_steps(LocalSGD(period=1), 4) == [1, 2, 3, 4]
    assert averaging_steps(LocalSGD(period=8), 30) == [8, 16, 24]


def test_warmup_steps_average_every_step_then_period_counts_after_warmup():
    assert averaging_steps(LocalSGD(period=3, warmup_steps=2), 11) == [1, 2, 5, 8, 11]


def test_callable_period_is_a_schedule_evaluated_at_each_averaging():
    strategy = LocalSGD(period=lambda step: 2 if step < 6 else 5)
    assert averaging_steps(strategy, 20) == [2, 4, 6, 11, 16]


def test_synchronous_never_averages_models_but_counts_steps():
    s = Synchronous()
    assert averaging_steps(s, 5) == []
    assert s.step == 5 and isinstance(s, GradientAveraging) and not isinstance(s, GradientWeighting)


def test_state_dict_resumes_the_averaging_phase():
    a = LocalSGD(period=4)
    averaging_steps(a, 6)
    b = LocalSGD(period=4)
    b.load_state_dict(a.state_dict())
    assert [s for s in range(7, 17) if b.after_step() is AVERAGE] == [8, 12, 16]


def test_state_of_another_strategy_is_refused():
    with pytest.raises(ValueError, match="LocalSGD"):
        Synchronous().load_state_dict(LocalSGD(2).state_dict())


@pytest.mark.parametrize("period,error", [(0, ValueError), (-3, ValueError), (1.5, TypeError),
                                          ("8", TypeError), (True, TypeError), (None, TypeError)])
def test_bad_period_names_the_argument(period, error):
    with pytest.raises(error, match="period"):
        LocalSGD(period=period)


@pytest.mark.parametrize("warmup,error", [(-1, ValueError), (2.0, TypeError)])
def test_bad_warmup_names_the_argument(warmup, error):
    with pytest.raises(error, match="warmup_steps"):
        LocalSGD(period=2, warmup_steps=warmup)


def test_schedule_returning_a_bad_value_fails_when_evaluated_naming_it():
    strategy = LocalSGD(period=lambda step: 0)
    with pytest.raises(ValueError, match=r"period\(0\)"):
        strategy.after_step()


def test_as_schedule_converts_ints_once():
    assert as_schedule("period", 7)(123) == 7


def test_check_strategy():
    assert isinstance(check_strategy(None), Synchronous)
    with pytest.raises(TypeError, match="instance"):
        check_strategy(LocalSGD)
    with pytest.raises(TypeError, match="LocalSGD, Synchronous"):
        check_strategy("localsgd")
    s = LocalSGD(2)
    assert check_strategy(s) is s
    assert isinstance(s, Strategy)


def test_the_runtime_and_the_simulator_provide_the_seams_strategies_are_typed_against():
    import inspect

    from horovod_hetero import simulate
    from horovod_hetero.runtime.seams import Collectives
    from horovod_hetero.runtime.strategy_transports import Transports
    from horovod_hetero.strategies.base import ObjectCollectives, StateService, StrategyTransports
    from horovod_hetero.transports.state_server import StateClient

    seams = {StrategyTransports: [Transports, simulate._SimTransports], StateService: [StateClient, simulate._SimClient],
             ObjectCollectives: [Collectives]}
    for protocol, implementations in seams.items():
        methods = [n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")]
        assert methods
        for implementation in implementations:
            for name in methods:
                assert (list(inspect.signature(getattr(implementation, name)).parameters)
                        == list(inspect.signature(getattr(protocol, name)).parameters)), (implementation, name)
    world = simulate._World(2)
    assert isinstance(simulate._SimTransports(world, 0), StrategyTransports)
    client = simulate._SimTransports(world, 0).state_service(epsilon=0.1, overshoot=0.0, timeout=1.0)
    assert isinstance(client, StateService) and not isinstance(object(), StrategyTransports)
