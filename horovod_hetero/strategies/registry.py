"""The one list of strategies the library knows: name -> class, and the arguments its tools build it with.

Everything in the library that lists strategies is derived from ``REGISTRY``: the command's ``simulate``,
``advise``, ``plan`` and ``doctor`` choices and the objects they build (``configured``), ``rebuild`` (a saved
state's class), ``check_strategy``'s message, and the classes ``horovod_hetero.strategies`` and both ``hh``
namespaces export by name. The lab (``horovod_hetero_lab``, beside the library) derives the examples'
``--strategy`` choices and bench's jobs from it too, with its own labels and options.

The library's strategies are the ``BUILT_IN`` entries below, Synchronous first. Adding one, in the library
or beside it, is a module defining the class and one line ``register(Registered("mine", Mine))`` (see
docs/architecture.md).

Example:
    >>> REGISTRY["localsgd"].cls.__name__, REGISTRY["localsgd"].defaults
    ('LocalSGD', {'period': 8})
    >>> configured("wagma", sync_period=4, lookahead=3).label      # each class takes its own options
    'WAGMA(S=auto,4)'
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from horovod_hetero.strategies.adsp import ADSP
from horovod_hetero.strategies.balanced import Balanced
from horovod_hetero.strategies.base import GradientAveraging, ModelAveraging, Strategy, check_kind
from horovod_hetero.strategies.dssp import DSSP
from horovod_hetero.strategies.elastic_bsp import ElasticBSP
from horovod_hetero.strategies.esync import ESync
from horovod_hetero.strategies.local_sgd import LocalSGD
from horovod_hetero.strategies.synchronous import Synchronous
from horovod_hetero.strategies.wagma import WAGMA


@dataclass(frozen=True)
class Registered:
    """One strategy as the library's tools know it.

    Attributes:
        name: its command-line name (``--strategy``, ``--strategies``).
        cls: the ``Strategy`` class, a subclass of ``ModelAveraging`` or ``GradientAveraging``.
        defaults: the keyword arguments the library's tools build it with when the user gives none
            (``configured``: ``simulate``, ``advise``, ``plan``); empty: the class's own defaults.
    """

    name: str
    cls: type[Strategy]
    defaults: dict[str, Any] = field(default_factory=dict)


#: ``{name: Registered}``: every registered strategy, in the order tools list them (the library's own first,
#: Synchronous first among them; then those ``register`` added).
REGISTRY: dict[str, Registered] = {}


def register(entry: Registered) -> Registered:
    """Add ``entry`` to ``REGISTRY`` and return it: the one line a strategy's module needs,
    ``register(Registered("mine", Mine))``. Registering the same entry again is nothing (a module imported
    twice); a name or a class (or a class's name: the ``hh`` namespaces export it by name) already registered
    otherwise is a ``ValueError``; a class of neither kind a ``TypeError``.

    Example:
        >>> register(REGISTRY["dssp"]) is REGISTRY["dssp"]
        True
        >>> register(Registered("dssp", LocalSGD))
        Traceback (most recent call last):
        ...
        ValueError: strategy name 'dssp' is registered already, for DSSP: choose another name
    """
    if not isinstance(entry, Registered):
        raise TypeError(f"register takes a Registered(name, cls, defaults), got {entry!r}")
    if not isinstance(entry.name, str) or not entry.name or entry.name != entry.name.strip() or "," in entry.name:
        raise ValueError(f"name must be a non-empty string without spaces at its ends or commas (a command-line "
                         f"choice), got {entry.name!r}")
    runs_others = isinstance(entry.cls, type) and issubclass(entry.cls, Strategy) and entry.cls.runs is not Strategy.runs
    if not (isinstance(entry.cls, type) and (issubclass(entry.cls, (ModelAveraging, GradientAveraging)) or runs_others)):
        raise TypeError(f"cls must be a class deriving from ModelAveraging or GradientAveraging (or a Strategy that "
                        f"runs others, Strategy.runs), got {entry.cls!r}")
    if not isinstance(entry.defaults, Mapping) or not all(isinstance(key, str) for key in entry.defaults):
        raise TypeError(f"defaults must be a dict of keyword arguments of {entry.cls.__name__}, got {entry.defaults!r}")
    takes = inspect.signature(entry.cls).parameters
    unknown = [key for key in entry.defaults if key not in takes]
    if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in takes.values()):
        raise TypeError(f"defaults: {entry.cls.__name__} takes no argument {', '.join(unknown)}")
    existing = REGISTRY.get(entry.name)
    if existing is not None:
        if existing == entry:
            return existing
        raise ValueError(f"strategy name {entry.name!r} is registered already, for {existing.cls.__name__}: "
                         f"choose another name")
    for other in REGISTRY.values():
        if other.cls is entry.cls or other.cls.__name__ == entry.cls.__name__:
            raise ValueError(f"a class named {entry.cls.__name__} is registered already, as {other.name!r}: "
                             f"register each class once, under one name")
    REGISTRY[entry.name] = entry
    return entry


#: the library's own strategies, Synchronous first; a strategy shipped with the library adds its line here
BUILT_IN = tuple(register(entry) for entry in (
    Registered("sync", Synchronous),
    Registered("localsgd", LocalSGD, {"period": 8}),
    Registered("esync", ESync),
    Registered("wagma", WAGMA, {"sync_period": 8}),
    Registered("elasticbsp", ElasticBSP, {"lookahead": 15}),
    Registered("dssp", DSSP, {"staleness": (3, 15)}),
    Registered("adsp", ADSP, {"check_period": "10steps"}),
    Registered("balanced", Balanced, {"rebalance_every": 5}),
))


def classes() -> dict[str, type[Strategy]]:
    """``{class name: class}`` of every registered strategy: what ``horovod_hetero.strategies`` and the ``hh``
    namespaces export by name (looked up when an attribute is read, so a class registered after they were
    imported is there too).

    Example:
        >>> classes()["ElasticBSP"] is ElasticBSP
        True
    """
    return {entry.cls.__name__: entry.cls for entry in REGISTRY.values()}


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


def configured(name: str, **options: Any) -> Strategy:
    """The strategy ``name`` as the library's tools build it: with its ``Registered.defaults``, each replaced by
    the option of the same name where ``options`` holds it, and those of ``options`` its class takes beside
    them; the others are ignored, so one set of options (``simulate``'s, ``plan``'s) serves every strategy.
    An unknown name is a ``ValueError`` naming the choices.

    Example:
        >>> configured("dssp")
        DSSP(staleness=(3, 15), tolerance=0.05)
        >>> configured("localsgd", period=3, lookahead=9)
        LocalSGD(period=3, warmup_steps=0)
    """
    entry = _lookup(name)
    takes = inspect.signature(entry.cls).parameters
    return entry.cls(**{**entry.defaults, **{key: value for key, value in options.items() if key in takes}})


def rebuild(state: Mapping[str, Any]) -> Strategy:
    """The strategy a ``Strategy.state_dict()`` was saved from, built again from its ``"kind"`` (a class the
    registry holds) and ``"config"`` (its arguments), to load the state into: a checkpoint or an elastic reset
    after ``set_strategy``. A ``ValueError`` names what is missing.

    Example:
        >>> rebuild(configured("dssp").state_dict())
        DSSP(staleness=(3, 15), tolerance=0.05)
    """
    kind, config = state.get("kind"), state.get("config")
    registered = classes()
    if kind not in registered:
        raise ValueError(f"the state is of strategy {kind!r}, which the registry does not hold "
                         f"({', '.join(registered)}): build it, set_strategy() it, then load the state")
    if not isinstance(config, Mapping) or not isinstance(config.get("args"), list) \
            or not isinstance(config.get("kwargs"), Mapping):
        raise ValueError(f"the state of {kind} holds no arguments to build it with (a callable schedule is not "
                         f"saved): build hh.{kind}(...) as it was, set_strategy() it, then load the state")
    try:
        return registered[kind](*config["args"], **config["kwargs"])
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
        names = sorted(classes())
        raise TypeError(f"strategy must be one of {', '.join(names)} (or a subclass of ModelAveraging or "
                        f"GradientAveraging); got {strategy!r} ({type(strategy).__name__})")
    return check_kind(strategy)
