"""How a global round combines the ranks' models: the ``aggregate=`` given beside a model-averaging strategy.

When fast ranks take more local steps than slow ones, the plain mean of their models weights each
rank's data by its step count: the model drifts towards the optimum of the fast ranks' data, not of
all data (objective inconsistency; Wang et al., "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020, FedNova). An ``Aggregation``, given beside any
model-averaging strategy (``LocalSGD``, ``ESync``, ``WAGMA``'s global averages, ``ElasticBSP``, ``DSSP``,
``ADSP``) as ``hh.DistributedOptimizer(..., aggregate=...)`` or the Keras callback's ``aggregate=``,
changes how a global round combines the models; the arithmetic is the runtime's
(``runtime.aggregator.Aggregator``), once for every framework and strategy.

- ``Mean()`` (the default, ``aggregate=None``): the ranks' models are averaged, ``w = mean(w_i)``.
- ``Normalized()``: FedNova's normalised averaging. Each rank's change since the round's
  start ``d_i = w_i - w_t`` is divided by its local steps ``tau_i``, the quotients are averaged with
  the ranks' sample weights ``p_i`` (its mean samples per local step: its batch size; equal weights
  where samples are not reported), and the mean is scaled by ``tau_eff = sum(p_i tau_i)``:
  ``w = w_t + tau_eff * sum(p_i d_i / tau_i)``. Every rank's per-step direction then counts alike,
  however many steps it took; with equal steps it is the mean. ``tau_i`` counts steps, also with
  momentum or Adam: FedNova's momentum correction (``a_i = [tau - rho (1 - rho^tau) / (1 - rho)] /
  (1 - rho)``) assumes each round starts with zero momentum, as a federated client does, but here the
  local optimizer keeps its state across rounds, so every rank's step moves about the same multiple
  of a gradient (``1 / (1 - rho)`` in steady state, for SGD with momentum ``rho``; about ``lr`` per
  coordinate for Adam), which cancels out of the weights.
- ``outer=OuterSGD(lr, momentum, nesterov)``, of either: the combined change ``Delta = w - w_t`` is a
  pseudo-gradient ``-Delta`` for an outer optimiser on the global model (Reddi et al., "Adaptive
  Federated Optimization"; DiLoCo uses ``OuterSGD(lr=0.7, momentum=0.9, nesterov=True)``).
  ``OuterSGD(lr=1.0)`` is plain averaging; ESync's global learning rate (the paper's epsilon) is
  ``Mean(outer=OuterSGD(lr=epsilon))``.

Both travel in the round's one fused allreduce (each rank sends its scaled change and two numbers
beside the control vector): no extra message. Costs: with either option each rank keeps ``w_t``
(one copy of the model, on the model's device), plus the outer momentum (a second copy) when
``momentum > 0``, and a round builds the scaled change (a third, transient); ``mean`` without an
outer optimiser sums the model in place and keeps nothing. A gradient-averaging strategy
(``Synchronous``, ``Balanced``) has no rounds that combine models: its runner refuses any other aggregation
beside it (``runtime.runner.check_aggregate``). ``w_t`` and the momentum are part of the
optimizer's (torch) or callback's (Keras) ``state_dict()``, so checkpoints and ``hvd.elastic``
resume them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from horovod_hetero.validation import check_bool, check_float


@dataclass(frozen=True)
class OuterSGD:
    """SGD on the global model, with the round's combined change as the negative gradient.

    After a round, with ``Delta`` the combined change of the ranks' models since the round's start
    ``w_t`` (``aggregate=``) and the buffer ``m`` (zero at first): ``m = momentum * m + Delta``,
    then ``w = w_t + lr * (Delta + momentum * m)`` with ``nesterov`` or ``w = w_t + lr * m``
    without (plain SGD on the pseudo-gradient ``-Delta``, PyTorch's convention for Nesterov).

    Args:
        lr: the outer learning rate, a finite number > 0 (1.0 with no momentum: plain averaging).
        momentum: in [0, 1).
        nesterov: ``True`` or ``False``; ``True`` needs ``momentum > 0``.

    Example:
        >>> OuterSGD(lr=0.7, momentum=0.9, nesterov=True)
        OuterSGD(lr=0.7, momentum=0.9, nesterov=True)
        >>> OuterSGD(lr=1.0).is_identity
        True
    """

    lr: float = 1.0
    momentum: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", check_float("OuterSGD lr", self.lr, 0.0, min_exclusive=True))
        momentum = check_float("OuterSGD momentum", self.momentum, 0.0)
        if momentum >= 1.0:
            raise ValueError(f"OuterSGD momentum must be in [0, 1), got {momentum!r}")
        object.__setattr__(self, "momentum", momentum)
        if check_bool("OuterSGD nesterov", self.nesterov) and momentum == 0.0:
            raise ValueError("OuterSGD nesterov=True needs momentum > 0")

    @property
    def is_identity(self) -> bool:
        """True if the step is plain averaging (``lr == 1``, no momentum)."""
        return self.lr == 1.0 and self.momentum == 0.0


@dataclass(frozen=True)
class Aggregation:
    """How a global round combines the ranks' models (``Mean`` or ``Normalized``), with an optional outer
    optimiser on the combined change.

    Args:
        outer: an ``OuterSGD``, or ``None`` (plain: the combination is the new model). ``OuterSGD(lr=1.0)``
            is plain too, and is kept as ``None``.
    """

    outer: OuterSGD | None = None
    #: the combination's name (``Mean``: ``"mean"``, ``Normalized``: ``"normalized"``)
    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise TypeError("Aggregation is the base of hh.Mean and hh.Normalized: build one of those")
        if self.outer is not None and not isinstance(self.outer, OuterSGD):
            raise TypeError(f"outer must be an outer optimiser such as hh.OuterSGD(lr=0.7, momentum=0.9, nesterov=True), "
                            f"or None, got {self.outer!r} ({type(self.outer).__name__})")
        if self.outer is not None and self.outer.is_identity:
            object.__setattr__(self, "outer", None)

    @property
    def plain(self) -> bool:
        """True for ``Mean()`` with no outer optimiser: rounds average the models in place, nothing kept."""
        return self.name == "mean" and self.outer is None

    @property
    def label(self) -> str:
        """A short suffix for labels: ``""`` for plain averaging, else e.g. ``" [normalized, Nesterov 0.9]"``.

        Example:
            >>> Normalized(OuterSGD(0.7, 0.9, True)).label, Mean().label
            (' [normalized, outer lr 0.7 Nesterov 0.9]', '')
        """
        parts = [] if self.name == "mean" else [self.name]
        outer = self.outer
        if outer is not None:
            kind = ("Nesterov " if outer.nesterov else "momentum ") + f"{outer.momentum:g}" if outer.momentum else ""
            parts.append(f"outer lr {outer.lr:g}" + (f" {kind}" if kind else ""))
        return f" [{', '.join(parts)}]" if parts else ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({'' if self.outer is None else f'outer={self.outer!r}'})"


@dataclass(frozen=True, repr=False)
class Mean(Aggregation):
    """The ranks' models averaged, ``w = mean(w_i)`` (the default), then the outer optimiser if any.

    Example:
        >>> Mean(outer=OuterSGD(lr=0.5))
        Mean(outer=OuterSGD(lr=0.5, momentum=0.0, nesterov=False))
    """

    name: ClassVar[str] = "mean"


@dataclass(frozen=True, repr=False)
class Normalized(Aggregation):
    """FedNova's normalised averaging: each rank's change divided by its local steps, then the outer
    optimiser if any (see this module's text).

    Example:
        >>> Normalized(OuterSGD(0.7, 0.9, nesterov=True)).label
        ' [normalized, outer lr 0.7 Nesterov 0.9]'
    """

    name: ClassVar[str] = "normalized"


#: ``{name: class}`` of every aggregation, for command lines (``--aggregate``).
AGGREGATES: dict[str, type[Aggregation]] = {"mean": Mean, "normalized": Normalized}


def check_aggregate(aggregate: object) -> Aggregation | None:
    """``aggregate`` checked: an ``Aggregation``, or ``None`` for plain averaging (``Mean()`` too). A
    ``TypeError`` names the accepted forms. (Whether the strategy beside it has rounds that combine models is
    its runner's to say: ``runtime.runner.check_aggregate``.)

    Example:
        >>> check_aggregate(Mean(OuterSGD(lr=1.0))) is None
        True
        >>> check_aggregate("normalized")
        Traceback (most recent call last):
        ...
        TypeError: aggregate must be hh.Mean(...) or hh.Normalized(...) (with outer=hh.OuterSGD(...) if any), or None; got 'normalized' (str)
    """
    if aggregate is None:
        return None
    if not isinstance(aggregate, Aggregation):
        raise TypeError(f"aggregate must be hh.Mean(...) or hh.Normalized(...) (with outer=hh.OuterSGD(...) if any), "
                        f"or None; got {aggregate!r} ({type(aggregate).__name__})")
    return None if aggregate.plain else aggregate
