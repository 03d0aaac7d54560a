"""The strategy registry is the one list: every tool's strategies, exports and Keras callbacks agree with it."""
import argparse
import inspect

import pytest

from horovod_hetero import cli, strategies
from horovod_hetero.strategies.registry import REGISTRY, bench_options, build, configured
from horovod_hetero_lab import bench
from horovod_hetero_lab.harness import add_strategy_arguments, build_strategy


def examples_parser():
    parser = argparse.ArgumentParser()
    add_strategy_arguments(parser)
    return parser


def test_every_strategy_class_is_registered_once_and_every_tool_lists_the_registry():
    exported = {name for name, value in vars(strategies).items()
                if inspect.isclass(value) and issubclass(value, strategies.Strategy)
                and value not in (strategies.Strategy, strategies.ModelAveraging, strategies.GradientAveraging,
                                  strategies.GradientWeighting, strategies.RoundPlanned)}
    assert sorted(entry.cls.__name__ for entry in REGISTRY.values()) == sorted(exported)
    assert list(bench.STRATEGIES) == list(REGISTRY) == cli.chosen("all")
    choices = next(a.choices for a in examples_parser()._actions if a.dest == "strategy")
    assert list(choices) == list(REGISTRY)
    assert set(cli.PLANS) <= set(REGISTRY)          # what `plan` prints: registered names


def test_both_hh_namespaces_export_every_registered_class():
    import horovod_hetero.keras as hh_keras
    import horovod_hetero.torch as hh_torch

    for entry in REGISTRY.values():
        assert getattr(hh_torch, entry.cls.__name__) is entry.cls and entry.cls.__name__ in hh_torch.__all__
        assert getattr(hh_keras, entry.cls.__name__) is entry.cls and entry.cls.__name__ in hh_keras.__all__


def test_every_keras_strategy_callback_is_registered_and_both_module_names_hold_every_callback():
    import horovod_hetero.keras.callbacks as callbacks
    import horovod_hetero.tensorflow.keras.callbacks as horovod_named

    strategy_callbacks = {name for name in callbacks.__all__
                          if issubclass(getattr(callbacks, name), callbacks.HeteroSyncCallback)
                          and name != "HeteroSyncCallback"} | {"BalancedCallback"}
    assert {entry.callback for entry in REGISTRY.values() if entry.callback} == strategy_callbacks
    assert [entry.name for entry in REGISTRY.values() if entry.callback is None] == ["sync"]
    assert horovod_named.__all__ == callbacks.__all__
    assert all(getattr(horovod_named, name) is getattr(callbacks, name) for name in callbacks.__all__)
    # each callback trains its own class: built with bench's configuration, it holds that strategy
    for entry in REGISTRY.values():
        if entry.callback and entry.name != "balanced":
            callback = getattr(callbacks, entry.callback)(**entry.bench)
            assert type(callback.strategy) is entry.cls, entry.name


def test_build_gives_each_class_its_own_options_and_bench_options_build_what_bench_labels():
    assert build("wagma", period=4).label == "WAGMA(S=auto,4)"            # from --period (Registered.flags)
    assert build("wagma", period=4, sync_period=16).label == "WAGMA(S=auto,16)"   # its keyword first
    assert repr(build("localsgd", period=3, lookahead=9, staleness=(1, 2))) == "LocalSGD(period=3, warmup_steps=0)"
    assert build("dssp", period=3, staleness=(1, 2)).label == "DSSP(1,2)"
    with pytest.raises(ValueError, match="unknown strategy 'fast'; choose from sync, localsgd, esync"):
        build("fast")
    assert bench_options("dssp") == ["--strategy", "dssp", "--staleness", "3", "15"]
    for name, entry in REGISTRY.items():
        built = build_strategy(examples_parser().parse_args(bench_options(name)))
        assert type(built) is entry.cls and repr(built) == repr(configured(name)), name
        assert entry.label.split("(")[0] == entry.cls.__name__
