"""How a global round combines the ranks' models: ``aggregate=`` and ``outer=`` of every model-averaging strategy.

When fast ranks take more local steps than slow ones, the plain mean of their models weights each
rank's data by its step count: the model drifts towards the optimum of the fast ranks' data, not of
all data (objective inconsistency; Wang et al., "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020, FedNova). Two options of every model-averaging
strategy (``LocalSGD``, ``ESync``, ``WAGMA``'s global averages, ``ElasticBSP``, ``DSSP``, ``ADSP``)
change how a global round combines the models; the arithmetic is the runtime's
(``runtime.aggregation.Aggregator``), once for every framework and strategy.

- ``aggregate="mean"`` (the default): the ranks' models are averaged, ``w = mean(w_i)``.
- ``aggregate="normalized"``: FedNova's normalised averaging. Each rank's change since the round's
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
- ``outer=OuterSGD(lr, momentum, nesterov)``: the combined change ``Delta = w - w_t`` is a
  pseudo-gradient ``-Delta`` for an outer optimiser on the global model (Reddi et al., "Adaptive
  Federated Optimization"; DiLoCo uses ``OuterSGD(lr=0.7, momentum=0.9, nesterov=True)``).
  ``OuterSGD(lr=1.0)`` is plain averaging; ESync's ``global_lr`` is ``OuterSGD(lr=global_lr)``.

Both travel in the round's one fused allreduce (each rank sends its scaled change and two numbers
beside the control vector): no extra message. Costs: with either option each rank keeps ``w_t``
(one copy of the model, on the model's device), plus the outer momentum (a second copy) when
``momentum > 0``, and a round builds the scaled change (a third, transient); ``mean`` without an
outer optimiser sums the model in place and keeps nothing. ``w_t`` and the momentum are part of the
optimizer's (torch) or callback's (Keras) ``state_dict()``, so checkpoints and ``hvd.elastic``
resume them.
"""
from __future__ import annotations

from dataclasses import dataclass

from horovod_hetero.validation import check_bool, check_float

#: The names ``aggregate=`` accepts.
AGGREGATES = ("mean", "normalized")


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


def check_aggregation(aggregate: object, outer: object) -> tuple[str, OuterSGD | None]:
    """``(aggregate, outer)`` checked; ``outer`` is ``None`` for plain averaging (``OuterSGD(lr=1.0)``
    too). A ``ValueError``/``TypeError`` names the argument and the accepted form.

    Example:
        >>> check_aggregation("normalized", OuterSGD(lr=1.0))
        ('normalized', None)
        >>> check_aggregation("median", None)
        Traceback (most recent call last):
        ...
        ValueError: aggregate must be one of 'mean', 'normalized', got 'median'
    """
    if not isinstance(aggregate, str):
        raise TypeError(f"aggregate must be one of {', '.join(map(repr, AGGREGATES))}, got {aggregate!r} "
                        f"({type(aggregate).__name__})")
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {', '.join(map(repr, AGGREGATES))}, got {aggregate!r}")
    if outer is not None and not isinstance(outer, OuterSGD):
        raise TypeError(f"outer must be an outer optimiser such as hh.OuterSGD(lr=0.7, momentum=0.9, nesterov=True), "
                        f"or None, got {outer!r} ({type(outer).__name__})")
    return aggregate, (None if outer is None or outer.is_identity else outer)


def describe(aggregate: str, outer: OuterSGD | None) -> str:
    """A short suffix for labels: ``""`` for plain averaging, else e.g. ``" [normalized, Nesterov 0.9]"``.

    Example:
        >>> describe("normalized", OuterSGD(0.7, 0.9, True)), describe("mean", None)
        (' [normalized, outer lr 0.7 Nesterov 0.9]', '')
    """
    parts = [] if aggregate == "mean" else [aggregate]
    if outer is not None:
        kind = ("Nesterov " if outer.nesterov else "momentum ") + f"{outer.momentum:g}" if outer.momentum else ""
        parts.append(f"outer lr {outer.lr:g}" + (f" {kind}" if kind else ""))
    return f" [{', '.join(parts)}]" if parts else ""
