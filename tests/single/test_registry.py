"""The strategy registry is the library's one list: every tool's strategies, the exports and the Keras callbacks
agree with it; a strategy is added with one ``register`` line, and the lab's table beside it is optional."""
import argparse
import importlib
import inspect
import pkgutil

import pytest

from horovod_hetero.auto import Auto

from horovod_hetero import cli, strategies
from horovod_hetero.strategies import AVERAGE, CONTINUE, ModelAveraging
from horovod_hetero.strategies.registry import (
    BUILT_IN, REGISTRY, Registered, check_strategy, classes, configured, rebuild, register)
from horovod_hetero_lab import bench
from horovod_hetero_lab.harness import (
    BENCH, add_strategy_arguments, bench_label, bench_options, bench_strategy, build, build_strategy)

#: the kinds and the bases of the strategies, which are not strategies of their own
BASES = {strategies.Strategy, strategies.ModelAveraging, strategies.GradientAveraging, strategies.GradientWeighting,
         strategies.RoundPlanned}


def examples_parser():
    parser = argparse.ArgumentParser()
    add_strategy_arguments(parser)
    return parser


def defined_strategies():
    """Every strategy class the modules of ``horovod_hetero.strategies`` define."""
    found = {}
    for module in pkgutil.iter_modules(strategies.__path__):
        loaded = importlib.import_module(f"{strategies.__name__}.{module.name}")
        found.update({value.__name__: value for value in vars(loaded).values()
                      if inspect.isclass(value) and issubclass(value, strategies.Strategy)
                      and value.__module__ == loaded.__name__ and value not in BASES})
    return found


class Mine(ModelAveraging):
    """A toy strategy registered by the tests below (and taken out again): average every ``every``-th step."""

    def __init__(self, every=2):
        super().__init__()
        self.every = every

    def decide(self, report):
        return AVERAGE if self.step % self.every == 0 else CONTINUE


@pytest.fixture
def registered_mine():
    """``Mine`` registered as ``"mine"`` with ``{"every": 3}`` for one test; the registry as it was afterwards."""
    before = dict(REGISTRY)
    try:
        yield register(Registered("mine", Mine, {"every": 3}))
    finally:
        REGISTRY.clear()
        REGISTRY.update(before)


def test_every_strategy_class_is_registered_once_and_every_tool_lists_the_registry():
    # the built-ins, then hh.Auto, which registers itself in its own module (the hh namespaces import it)
    assert list(REGISTRY.values()) == [*BUILT_IN, REGISTRY["auto"]] and list(REGISTRY)[0] == "sync"
    assert REGISTRY["auto"].cls is Auto and REGISTRY["auto"].defaults == {}
    assert sorted(classes()) == sorted([*defined_strategies(), "Auto"])
    assert all(getattr(strategies, name) is cls for name, cls in classes().items())
    assert set(classes()) <= set(dir(strategies))
    assert list(bench.STRATEGIES) == list(REGISTRY) == cli.chosen("all")
    choices = next(a.choices for a in examples_parser()._actions if a.dest == "strategy")
    assert list(choices) == list(REGISTRY)
    assert set(cli.PLANS) <= set(REGISTRY)          # what `plan` prints: registered names
    assert set(BENCH) == set(REGISTRY)              # the lab labels every built-in strategy itself


def test_both_hh_namespaces_export_every_registered_class():
    import horovod_hetero.keras as hh_keras
    import horovod_hetero.tensorflow.keras as hh_horovod_named
    import horovod_hetero.torch as hh_torch

    for entry in REGISTRY.values():
        for hh in (hh_torch, hh_keras, hh_horovod_named):
            assert getattr(hh, entry.cls.__name__) is entry.cls and entry.cls.__name__ in hh.__all__, hh.__name__
        assert entry.cls.__name__ in dir(hh_torch) and entry.cls.__name__ in dir(hh_keras)
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        hh_torch.Nothing


def test_every_built_in_strategy_but_synchronous_has_one_keras_callback_naming_its_class():
    import horovod_hetero.keras.callbacks as callbacks
    import horovod_hetero.tensorflow.keras.callbacks as horovod_named

    filling = {}
    for name in callbacks.__all__:
        value = getattr(callbacks, name)
        if getattr(value, "strategy_class", None) is not None:
            assert issubclass(value, callbacks.HeteroSyncCallback), name
            filling.setdefault(value.strategy_class, []).append(name)
    assert callbacks.HeteroSyncCallback.strategy_class is None           # it runs any strategy
    assert set(filling) == {entry.cls for entry in REGISTRY.values() if entry.name != "sync"}
    assert all(len(names) == 1 for names in filling.values()), filling
    assert filling[strategies.Balanced] == ["BalancedCallback"]
    assert horovod_named.__all__ == callbacks.__all__
    assert all(getattr(horovod_named, name) is getattr(callbacks, name) for name in callbacks.__all__)
    # each callback trains its own class: built with the registry's defaults, it holds that strategy
    for entry in REGISTRY.values():
        if entry.name not in ("sync", "balanced"):
            (name,) = filling[entry.cls]
            callback = getattr(callbacks, name)(**entry.defaults)
            assert type(callback.strategy) is entry.cls and repr(callback.strategy) == repr(configured(entry.name))


def test_configured_builds_with_the_defaults_and_each_class_takes_its_own_options():
    assert repr(configured("dssp")) == "DSSP(staleness=(3, 15), tolerance=0.05)"
    assert configured("wagma", sync_period=4, period=2).label == "WAGMA(S=auto,4)"     # no flags in the library
    assert repr(configured("localsgd", period=3, lookahead=9, staleness=(1, 2))) == "LocalSGD(period=3, warmup_steps=0)"
    assert configured("balanced").rebalance_every == 5 and repr(configured("sync")) == "Synchronous()"
    with pytest.raises(ValueError, match="unknown strategy 'fast'; choose from sync, localsgd, esync"):
        configured("fast")
    for name in REGISTRY:
        assert repr(rebuild(configured(name).state_dict())) == repr(configured(name)), name


def test_the_lab_builds_each_class_from_the_examples_options_and_bench_options_build_what_bench_labels():
    assert build("wagma", period=4).label == "WAGMA(S=auto,4)"            # from --period (BENCH's flags)
    assert build("wagma", period=4, sync_period=16).label == "WAGMA(S=auto,16)"   # its keyword first
    assert repr(build("localsgd", period=3, lookahead=9, staleness=(1, 2))) == "LocalSGD(period=3, warmup_steps=0)"
    assert build("dssp", period=3, staleness=(1, 2)).label == "DSSP(1,2)"
    with pytest.raises(ValueError, match="unknown strategy 'fast'; choose from sync, localsgd, esync"):
        build("fast")
    assert bench_options("dssp") == ["--strategy", "dssp", "--staleness", "3", "15"]
    labels = {name: bench_label(name) for name in REGISTRY}
    assert labels == {"sync": "Synchronous", "localsgd": "LocalSGD(8)", "esync": "ESync", "wagma": "WAGMA(S=2,8)",
                      "elasticbsp": "ElasticBSP(15)", "dssp": "DSSP(3,15)", "adsp": "ADSP(10steps)",
                      "balanced": "Balanced(5)", "auto": "Auto"}
    for name, entry in REGISTRY.items():
        built = build_strategy(examples_parser().parse_args(bench_options(name)))
        # what bench runs is what the library's tools run (advise predicts bench's jobs)
        assert type(built) is entry.cls and repr(built) == repr(bench_strategy(name)) == repr(configured(name)), name
        assert labels[name].split("(")[0] == entry.cls.__name__
        assert bench.STRATEGIES[name] == (labels[name], bench_options(name))


def test_register_adds_a_strategy_every_tool_and_namespace_sees_and_refuses_a_clash(registered_mine):
    import horovod_hetero.keras as hh_keras
    import horovod_hetero.tensorflow.keras as hh_horovod_named
    import horovod_hetero.torch as hh_torch

    entry = registered_mine
    assert REGISTRY["mine"] is entry and list(REGISTRY)[-1] == "mine"
    assert register(Registered("mine", Mine, {"every": 3})) is entry             # the same entry again: nothing
    for clash, error in [(Registered("mine", Mine), "strategy name 'mine' is registered already, for Mine"),
                         (Registered("mine", strategies.LocalSGD), "strategy name 'mine' is registered already"),
                         (Registered("mine2", Mine), "a class named Mine is registered already, as 'mine'"),
                         (Registered("localsgd2", type("LocalSGD", (ModelAveraging,), {})),
                          "a class named LocalSGD is registered already, as 'localsgd'"),
                         (Registered("", Mine), "name must be a non-empty string"),
                         (Registered("a,b", Mine), "name must be a non-empty string")]:
        with pytest.raises(ValueError, match=error):
            register(clash)
    with pytest.raises(TypeError, match="cls must be a class deriving from ModelAveraging or GradientAveraging"):
        register(Registered("neither", strategies.Strategy))
    with pytest.raises(TypeError, match="defaults: Mine3 takes no argument period"):
        register(Registered("mine3", type("Mine3", (Mine,), {}), {"period": 8}))
    with pytest.raises(TypeError, match="register takes a Registered"):
        register(("other", Mine))
    assert list(REGISTRY)[-1] == "mine" and len(REGISTRY) == len(BUILT_IN) + 2     # Auto, and nothing refused

    # the library: its tools, the exports by name, rebuild, the message of a wrong strategy
    assert configured("mine").every == 3 and configured("mine", every=5, period=9).every == 5
    assert rebuild(configured("mine").state_dict()).every == 3
    assert all(getattr(hh, "Mine") is Mine for hh in (strategies, hh_torch, hh_keras, hh_horovod_named))
    assert "Mine" in dir(hh_torch) and "Mine" in dir(strategies)
    assert "mine" in cli.chosen("all")
    with pytest.raises(TypeError, match=r"strategy must be one of .*Mine"):
        check_strategy(object())
    # the lab, with no entry of its own: the class's name, no options
    assert "mine" not in BENCH and bench.STRATEGIES["mine"] == ("Mine", ["--strategy", "mine"])
    assert list(bench.STRATEGIES)[-1] == "mine"
    assert [job.label for job in bench.plan(["torch"], ["digits"], ["1,4"], ["mine"], 1)] == ["Mine"]
    built = build_strategy(examples_parser().parse_args(["--strategy", "mine"]))
    assert type(built) is Mine and built.every == 3                                # the registry's defaults
