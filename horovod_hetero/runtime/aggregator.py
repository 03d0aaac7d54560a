"""The arithmetic of ``aggregate=Normalized(...)`` and of an outer optimiser (``strategies.aggregation``),
once for every framework and strategy.

A global round without either option is the round protocol's weighted mean of the models, summed in
place. With one of them the round works on changes: every rank keeps the round's start ``w_t``
(identical on every rank: the initial models are averaged once, then every round ends with the same
model everywhere), sends ``c_i (w_i - w_t)`` with two numbers beside the control vector in the same
fused allreduce, and every rank combines the sums the same way:

- ``mean``: ``c_i`` is the rank's weight (1, or 0 for a rank with no step since the last round) and
  ``Delta = sum c_i d_i / sum c_i``.
- ``normalized``: ``c_i = b_i / tau_i`` (``b_i`` the rank's samples per local step, 1 where samples are
  not reported, ``tau_i`` its local steps; 0 for a rank with none) and, with ``B = sum b_i`` and
  ``A = sum b_i tau_i`` over those ranks, ``Delta = (A / B) * sum c_i d_i / B``:
  ``tau_eff * sum p_i d_i / tau_i`` with ``p_i = b_i / B``.

then the outer step (``OuterSGD``; none: ``w = w_t + Delta``) gives the new model, which becomes the
next round's ``w_t``. A round in which no rank stepped (``sync_model()`` right after another) takes no
outer step: the model and the momentum stay. Every operation is a Python operator on the framework's
tensors, so the same code runs on torch tensors, TensorFlow tensors and NumPy arrays (the tests use NumPy).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from horovod_hetero.runtime.seams import Tensor
from horovod_hetero.strategies.aggregation import Aggregation


class Aggregator:
    """Combines a global round's changes as ``aggregation`` says; holds ``w_t`` and the momentum.

    Args:
        aggregation: an ``Aggregation`` (``Mean(outer=...)``, ``Normalized(outer=...)``).
        copy: ``copy(tensors) -> new tensors`` (the adapter's ``Collectives.copy``).

    Example:
        >>> import numpy as np
        >>> from horovod_hetero.strategies.aggregation import Normalized
        >>> agg = Aggregator(Normalized(), copy=lambda ts: [t.copy() for t in ts])
        >>> agg.begin([np.zeros(2)])
        >>> fast, fast_extra = agg.contribution([np.array([4.0, 0.0])], 1.0, steps=4, samples=128)
        >>> slow, slow_extra = agg.contribution([np.array([0.0, 1.0])], 1.0, steps=1, samples=32)
        >>> agg.combine([fast[0] + slow[0]], [a + b for a, b in zip(fast_extra, slow_extra)])[0].tolist()
        [1.25, 1.25]
    """

    def __init__(self, aggregation: Aggregation, copy: Callable[[Sequence[Tensor]], list[Tensor]]) -> None:
        if not isinstance(aggregation, Aggregation):
            raise TypeError(f"aggregation must be an Aggregation (Mean(...), Normalized(...)), got {aggregation!r}")
        self.aggregate, self.outer = aggregation.name, aggregation.outer
        self._copy = copy
        # w_t, the round's start (None until the initial models are averaged)
        self.start: list[Tensor] | None = None
        # the outer momentum buffer (None until the first outer step with momentum)
        self.momentum: list[Tensor] | None = None

    @property
    def ready(self) -> bool:
        """True once ``w_t`` is known (rounds then work on changes)."""
        return self.start is not None

    def begin(self, tensors: Sequence[Tensor]) -> None:
        """Take ``tensors`` (the model every rank now holds) as the next round's start."""
        self.start = self._copy(tensors)

    def contribution(self, tensors: Sequence[Tensor], weight: float, steps: int,
                     samples: int) -> tuple[list[Tensor], list[float]]:
        """``(tensors to sum, extra control values)`` of this rank for a round.

        ``weight``: the round protocol's (0 for a rank that has not stepped since the previous round);
        ``steps``, ``samples``: this rank's local steps and samples since then (0: not reported)."""
        assert self.start is not None, "contribution() before begin()"
        if self.aggregate == "normalized":
            if weight == 0 or steps == 0:
                coefficient, extra = 0.0, [0.0, 0.0]
            else:
                per_step = samples / steps if samples else 1.0
                coefficient, extra = per_step / steps, [per_step, per_step * steps]
        else:
            coefficient, extra = weight, [weight, 0.0]
        return [(w - g) * coefficient for w, g in zip(tensors, self.start)], extra

    def combine(self, summed: Sequence[Tensor], extra: Sequence[float]) -> list[Tensor]:
        """The new model from the summed contributions and the summed extra values (every rank gets the
        same); the outer step is taken here, so call it once per round."""
        assert self.start is not None, "combine() before begin()"
        if self.aggregate == "normalized":
            total, weighted_steps = extra
            scale = weighted_steps / (total * total) if total > 0 else 0.0
        else:
            total = extra[0]
            scale = 1.0 / total if total > 0 else 0.0
        delta = [s * scale for s in summed]
        outer = self.outer
        if outer is None or total <= 0:       # no rank stepped since the last round: no outer step either,
            return [g + d for g, d in zip(self.start, delta)]   # so a second sync_model() moves nothing
        if outer.momentum == 0.0:
            step = delta
        else:
            self.momentum = delta if self.momentum is None else [outer.momentum * m + d
                                                                 for m, d in zip(self.momentum, delta)]
            step = ([d + outer.momentum * m for d, m in zip(delta, self.momentum)] if outer.nesterov
                    else self.momentum)
        return [g + outer.lr * s for g, s in zip(self.start, step)]

    def state_dict(self) -> dict[str, Any] | None:
        """``{"start": [...], "momentum": [...] or None}`` (the tensors as held; ``None`` before ``begin``)."""
        if self.start is None:
            return None
        return {"start": list(self.start), "momentum": None if self.momentum is None else list(self.momentum)}

    def load_state_dict(self, state: object, place: Callable[[Sequence[Any]], list[Tensor]]) -> None:
        """Restore from ``state_dict()``; ``place(values)`` puts values on the model's device (new tensors)."""
        if not isinstance(state, dict) or "start" not in state:
            raise ValueError(f"aggregation state must be a dict with 'start' and 'momentum' (from state_dict()), "
                             f"got {type(state).__name__}")
        self.start = place(state["start"])
        self.momentum = None if state.get("momentum") is None else place(state["momentum"])
