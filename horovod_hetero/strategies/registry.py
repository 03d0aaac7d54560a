"""The one list of strategies: name -> class, the configuration bench runs, its Keras callback.

Everything that lists strategies is derived from ``REGISTRY``: the examples' ``--strategy`` choices
and the objects they build (``build``), ``horovod-hetero bench``'s jobs, row labels and options
(``bench_options``, ``configured``), ``demo``, ``simulate``'s and ``advise``'s strategies, and the Keras callback each
strategy has (``hh.callbacks.<callback>``). Adding a strategy is one ``Registered`` line here (and
its module); see docs/architecture.md.

Example:
    >>> REGISTRY["localsgd"].cls.__name__, bench_options("localsgd")
    ('LocalSGD', ['--strategy', 'localsgd', '--period', '8'])
    >>> build("wagma", period=4, lookahead=3).label        # each class takes its own options
    'WAGMA(S=auto,4)'
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from horovod_hetero.strategies.adsp import ADSP
from horovod_hetero.strategies.balanced import Balanced
from horovod_hetero.strategies.base import Strategy, check_kind
from horovod_hetero.strategies.dssp import DSSP
from horovod_hetero.strategies.elastic_bsp import ElasticBSP
from horovod_hetero.strategies.esync import ESync
from horovod_hetero.strategies.local_sgd import LocalSGD
from horovod_hetero.strategies.synchronous import Synchronous
from horovod_hetero.strategies.wagma import WAGMA


@dataclass(frozen=True)
class Registered:
    """One strategy as the tools know it.

    Attributes:
        name: its command-line name (``--strategy``, ``--strategies``).
        cls: the ``Strategy`` class.
        label: bench's row label for ``bench`` below.
        bench: the keyword arguments bench, demo and advise run it with.
        callback: the name of its Keras callback in ``hh.callbacks`` (``None``: Keras trains it with
            ``hh.DistributedOptimizer`` alone).
        flags: keyword -> the examples' option that gives it where that is not the keyword itself
            (WAGMA's ``sync_period`` comes from ``--period``, as LocalSGD's ``period``).
    """

    name: str
    cls: type[Strategy]
    label: str
    bench: dict[str, Any] = field(default_factory=dict)
    callback: str | None = None
    flags: dict[str, str] = field(default_factory=dict)


#: ``{name: Registered}``, Synchronous first: every strategy this library ships, in the order tools list them.
REGISTRY = {r.name: r for r in (
    Registered("sync", Synchronous, "Synchronous"),
    Registered("localsgd", LocalSGD, "LocalSGD(8)", {"period": 8}, "LocalSGDCallback"),
    Registered("esync", ESync, "ESync", {}, "ESyncCallback"),
    Registered("wagma", WAGMA, "WAGMA(S=2,8)", {"sync_period": 8}, "WAGMACallback", {"sync_period": "period"}),
    Registered("elasticbsp", ElasticBSP, "ElasticBSP(15)", {"lookahead": 15}, "ElasticBSPCallback"),
    Registered("dssp", DSSP, "DSSP(3,15)", {"staleness": (3, 15)}, "DSSPCallback"),
    Registered("adsp", ADSP, "ADSP(10steps)", {"check_period": "10steps"}, "ADSPCallback"),
    Registered("balanced", Balanced, "Balanced(5)", {"rebalance_every": 5}, "BalancedCallback"),
)}


def _lookup(name: str) -> Registered:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(REGISTRY)}") from None


def check_names(names: Sequence[str], allowed: Iterable[str] = REGISTRY, also: Sequence[str] = ()) -> list[str]:
    """``names`` as a list if there is one and each is one of ``allowed`` (names in ``REGISTRY``), else a
    ``ValueError`` naming the unknown ones and the choices, ``also`` first (what else the caller accepts,
    such as the CLI's ``all``): the CLI's and bench's check.

    Example:
        >>> check_names(["esync", "fast"], ["sync", "esync"])
        Traceback (most recent call last):
        ...
        ValueError: unknown fast; choose from sync, esync
    """
    allowed = list(allowed)
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise ValueError(f"unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join([*also, *allowed])}")
    return list(names)


def configured(name: str) -> Strategy:
    """The strategy ``name`` as bench, demo and advise run it (with its ``Registered.bench`` options).

    Example:
        >>> configured("dssp")
        DSSP(staleness=(3, 15), tolerance=0.05)
    """
    entry = _lookup(name)
    return entry.cls(**entry.bench)


def build(name: str, **options: Any) -> Strategy:
    """The strategy ``name`` with those of ``options`` its class takes: by keyword, else from the option
    ``Registered.flags`` names; the others are ignored, so one set of options serves every strategy."""
    entry = _lookup(name)
    kwargs: dict[str, Any] = {}
    for key in inspect.signature(entry.cls).parameters:
        source = key if key in options else entry.flags.get(key)
        if source in options:
            kwargs[key] = options[source]
    return entry.cls(**kwargs)


def bench_options(name: str) -> list[str]:
    """The examples' command-line options that build ``name`` as bench runs it."""
    entry = _lookup(name)
    out = ["--strategy", name]
    for key, value in entry.bench.items():
        values = value if isinstance(value, (tuple, list)) else (value,)
        out += [f"--{entry.flags.get(key, key).replace('_', '-')}", *map(str, values)]
    return out


def rebuild(state: Mapping[str, Any]) -> Strategy:
    """The strategy a ``Strategy.state_dict()`` was saved from, built again from its ``"kind"`` (a class the
    registry holds) and ``"config"`` (its arguments), to load the state into: a checkpoint or an elastic reset
    after ``set_strategy``. A ``ValueError`` names what is missing.

    Example:
        >>> rebuild(configured("dssp").state_dict())
        DSSP(staleness=(3, 15), tolerance=0.05)
    """
    kind, config = state.get("kind"), state.get("config")
    classes = {entry.cls.__name__: entry.cls for entry in REGISTRY.values()}
    if kind not in classes:
        raise ValueError(f"the state is of strategy {kind!r}, which the registry does not hold "
                         f"({', '.join(classes)}): build it, set_strategy() it, then load the state")
    if not isinstance(config, Mapping) or not isinstance(config.get("args"), list) \
            or not isinstance(config.get("kwargs"), Mapping):
        raise ValueError(f"the state of {kind} holds no arguments to build it with (a callable schedule is not "
                         f"saved): build hh.{kind}(...) as it was, set_strategy() it, then load the state")
    try:
        return classes[kind](*config["args"], **config["kwargs"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"the state of {kind} holds arguments it does not take: {error}") from None


def check_strategy(strategy: object) -> Strategy:
    """Return ``strategy`` (default ``Synchronous()``) or raise ``TypeError`` naming the strategies."""
    if strategy is None:
        return Synchronous()
    if isinstance(strategy, type) and issubclass(strategy, Strategy):
        raise TypeError(f"strategy must be an instance, e.g. strategy={strategy.__name__}(...), "
                        f"not the class {strategy.__name__}")
    if not isinstance(strategy, Strategy):
        names = sorted(entry.cls.__name__ for entry in REGISTRY.values())
        raise TypeError(f"strategy must be one of {', '.join(names)} (or a subclass of ModelAveraging or "
                        f"GradientAveraging); got {strategy!r} ({type(strategy).__name__})")
    return check_kind(strategy)
