"""How each kind of strategy runs on a rank: one runner per kind, chosen once from the strategy.

A strategy owns its schedule (``strategies.base``); how that schedule is carried out depends on its kind,
and the runner is where that lives: what a step does with the gradients (each rank's own, Horovod's
allreduce of them, weighted or not), what a round's statistics carry (each rank's mean step time, or its
median), what ``sync_model()`` does (join the rounds, or ``hvd.join`` and a broadcast), how the rounds
combine the models (``aggregate=``), each rank's batch and its share of an epoch. ``runner_for`` is the one
place in the library that looks at a strategy's kind; the controller, the adapters, the samplers, the
simulator and ``advise`` call the runner's hooks and never ask.

=============================  ========================  ==================================================
kind                           runner                    a step, a round, ``sync_model()``
=============================  ========================  ==================================================
``ModelAveraging``             ``ModelAveragingRunner``  the rank's own gradients; rounds average the models
                                                         (``aggregate=``), carry mean step times; rounds join
``GradientAveraging``          ``GradientRunner``        Horovod's gradient allreduce every step; rounds only
                                                         measure (median step times, a rank in ``hvd.join``
                                                         absent); ``hvd.join``, then the last rank's model
``GradientWeighting``          ``WeightedGradientRunner``  as above, each gradient weighted by its rank's
                                                         share of the planned global batch
=============================  ========================  ==================================================

The framework's side of a step is a ``Gradients`` (torch: Horovod's optimizer hooks; Keras: the average
inside ``hh.DistributedOptimizer``'s update), which a runner opens or closes when it begins. Switching
strategies at a sync point (``opt.set_strategy``) is a new runner beginning on the same ``Gradients``.
"""
from __future__ import annotations

import abc
import statistics
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from horovod_hetero.rules.partition import epoch_steps, steps_per_epoch
from horovod_hetero.runtime.aggregator import Aggregator
from horovod_hetero.runtime.seams import Tensor
from horovod_hetero.strategies.aggregation import Aggregation
from horovod_hetero.strategies.aggregation import check_aggregate as check_form
from horovod_hetero.strategies.base import GradientAveraging, GradientWeighting, Strategy, check_kind

from horovod_hetero.runtime.speeds import Speeds


class Gradients(Protocol):
    """The framework's gradient allreduce inside a step, which a runner opens or closes.

    torch: Horovod's optimizer hooks (``hh.DistributedOptimizer``); Keras: the average inside
    ``hh.DistributedOptimizer``'s update (a model compiled with a plain optimizer has none: ``open`` refuses)."""

    def open(self, weight: Callable[[], float] | None) -> None:
        """Allreduce every step's gradients: their mean, or with ``weight`` their sum, each rank's scaled first
        by ``weight()`` (its share of the step's global batch)."""

    def close(self) -> None:
        """Each rank steps with its own gradients."""

    def join(self) -> int | None:
        """``hvd.join()`` where the framework can (every rank, with the gradient allreduce open): the rank that
        joined last; ``None`` where it cannot (a process set, Keras): the rounds bring the ranks together."""


class Rounds(Protocol):
    """What a runner's ``sync`` asks of the controller (``runtime.controller.HeteroController``)."""

    def finish(self) -> int:
        """Join rounds until every rank has joined; close the transports."""

    def adopt(self, root: int, counters: bool = False) -> None:
        """Every rank takes ``root``'s model (and with ``counters`` its strategy's counters)."""


class Runner(abc.ABC):
    """How one kind of strategy runs on a rank (see the module). Built by ``runner_for``.

    Args:
        strategy: the strategy it runs.
    """

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy

    # -- the round protocol (``runtime.rounds.RoundPolicy``) --

    def step_time(self, times: Sequence[float]) -> float:
        """The step time a round carries for this rank: the mean of its steps since the previous round."""
        return sum(times) / len(times)

    def absent(self, blocks: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_] | None:
        """Ranks whose whole block of a round's statistics summed to zero, if they count as absent rather than
        in another round (``None``: none do)."""
        return None

    # -- a step --

    @abc.abstractmethod
    def begin(self, gradients: Gradients, rank: int, size: int) -> None:
        """Open or close the framework's gradient allreduce for this kind (at the start, and at a switch)."""

    def doing(self, step: int) -> str:
        """What this rank is doing at ``step`` (a lost rank's error names it)."""
        return f"step {step}"

    #: every step meets the other ranks (the gradient allreduce): the simulator costs one after each
    steps_together = False
    #: a global round combines the ranks' models (``aggregate=`` applies)
    combines_models = False
    #: the strategy plans every rank's batch (``batch_sizes``): the adapter needs a batch sampler
    plans_batches = False

    # -- batches and epochs --

    @property
    def lockstep(self) -> bool:
        """Every rank takes the same local steps between rounds (``Strategy.lockstep``): an epoch is never
        shared by speed (a slower rank would only make the others wait at the next round)."""
        return self.strategy.lockstep

    def use_batch(self, batch_size: int, size: int) -> None:
        """The batch of the sampler bound to the adapter (``batch_size`` per rank, ``size`` ranks)."""

    def global_batch(self, batch_size: int, size: int) -> int:
        """Samples per step over every rank: ``size`` times the sampler's ``batch_size``."""
        return size * batch_size

    def batch_sizes(self, step: int, size: int) -> tuple[int, ...] | None:
        """Every rank's batch at local step ``step`` (1-based) where the strategy plans it, else ``None``."""
        return None

    def epoch_sizes(self, n: int, batch_size: int | None, size: int) -> tuple[int, tuple[int, ...]] | None:
        """``(steps, every rank's batch)`` of an epoch of ``n`` samples where the strategy plans the batches, one
        window an epoch (Keras fixes a ``fit``'s batch size); ``None`` where it does not (each rank its own
        ``batch_size``)."""
        return None

    def epoch_shares(self, steps: int, speeds: Speeds | None) -> list[int] | None:
        """Every rank's batches of an epoch of ``steps`` batches, by speed (``rules.partition.epoch_steps``), or
        ``None`` (the framework's own count, every rank alike): a lockstep strategy's, before the speeds are
        ``settled``, or where they do not differ beyond their measured noise."""
        if (self.lockstep or speeds is None or speeds.step_times is None or not speeds.settled
                or not speeds.differ()):
            return None
        return [int(s) for s in epoch_steps(steps, speeds.step_times)]

    # -- the rounds' combination of the models --

    @property
    def aggregator(self) -> Aggregator | None:
        """What combines a global round's models where it is not their plain mean (``aggregate=``)."""
        return None

    # -- sync_model() --

    @abc.abstractmethod
    def sync(self, controller: Rounds, gradients: Gradients) -> int | None:
        """Bring every rank to identical models and the same round (``sync_model()``); return the rank whose
        integer state (BatchNorm's counts) every rank takes, or ``None`` for the set's first rank."""


class ModelAveragingRunner(Runner):
    """A ``ModelAveraging`` strategy: every rank steps with its own gradients; rounds average the models (or
    combine them as ``aggregate`` says) and carry each rank's mean step time; ``sync_model()`` joins rounds
    until every rank has joined.

    Args:
        strategy: a ``ModelAveraging``.
        aggregate: how global rounds combine the models (``None``: their mean, in place).
        copy: ``copy(tensors)``, the adapter's ``Collectives.copy`` (the aggregator's ``w_t``).
    """

    combines_models = True

    def __init__(self, strategy: Strategy, aggregate: Aggregation | None = None,
                 copy: Callable[[Sequence[Tensor]], list[Tensor]] | None = None) -> None:
        super().__init__(strategy)
        self._aggregator = None if aggregate is None or copy is None else Aggregator(aggregate, copy)

    @property
    def aggregator(self) -> Aggregator | None:
        return self._aggregator

    def begin(self, gradients: Gradients, rank: int, size: int) -> None:
        gradients.close()

    def sync(self, controller: Rounds, gradients: Gradients) -> int | None:
        controller.finish()
        return None


class GradientRunner(Runner):
    """A ``GradientAveraging`` strategy: Horovod allreduces the gradients every step; rounds only measure
    (``MEASURE``), with each rank's median step time (one stall does not move a plan made from it), a rank in
    ``hvd.join`` (which answers with zeros) absent; ``sync_model()`` is ``hvd.join`` and a broadcast of the
    model of the rank that joined last (the rounds' join where there is no ``hvd.join``)."""

    steps_together = True

    @property
    def lockstep(self) -> bool:
        return True

    def step_time(self, times: Sequence[float]) -> float:
        return statistics.median(times)

    def absent(self, blocks: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_] | None:
        return np.all(blocks == 0, axis=1)

    def begin(self, gradients: Gradients, rank: int, size: int) -> None:
        gradients.open(None)

    def doing(self, step: int) -> str:
        return f"the gradient allreduce of step {step}"

    #: ``sync_model()`` also gives every rank the counters of the rank that joined last (its plans)
    carries_counters = False

    def sync(self, controller: Rounds, gradients: Gradients) -> int | None:
        last = gradients.join()
        if last is None:
            controller.finish()
            return None
        controller.adopt(last, counters=self.carries_counters)
        return last


class WeightedGradientRunner(GradientRunner):
    """A ``GradientWeighting`` strategy (``Balanced``): as ``GradientRunner``, each rank's gradient scaled by its
    share of the step's global batch before Horovod sums them; the strategy plans every rank's batch."""

    carries_counters = True
    plans_batches = True

    def __init__(self, strategy: Strategy, weighting: GradientWeighting) -> None:
        super().__init__(strategy)
        self.weighting = weighting             # ``strategy`` itself, or the one it runs now (``Strategy.runs``)

    def begin(self, gradients: Gradients, rank: int, size: int) -> None:
        gradients.open(lambda: self.weighting.gradient_weight(rank, size))

    def use_batch(self, batch_size: int, size: int) -> None:
        self.weighting.use_batch(batch_size, size)

    def global_batch(self, batch_size: int, size: int) -> int:
        planned = self.weighting.global_batch
        return planned if planned is not None else super().global_batch(batch_size, size)

    def batch_sizes(self, step: int, size: int) -> tuple[int, ...] | None:
        return self.weighting.batch_sizes(step, size)

    def epoch_sizes(self, n: int, batch_size: int | None, size: int) -> tuple[int, tuple[int, ...]] | None:
        weighting = self.weighting
        if weighting.global_batch is None:
            if batch_size is None:
                raise ValueError(f"{type(weighting).__name__} has no global_batch: give batch_size= (one rank's "
                                 f"batch; the global batch is the number of ranks times it)")
            weighting.use_batch(batch_size, size)
        weighting.check_size(size)
        assert weighting.global_batch is not None              # given, or use_batch set it
        steps = steps_per_epoch(n, weighting.global_batch)
        if (weighting.step - weighting.origin) % steps:
            raise ValueError(f"epoch_plan: {weighting.step - weighting.origin} steps were taken, not a whole number "
                             f"of epochs of {steps} steps: train every epoch on its plan, to its end")
        weighting.plan_windows(steps)
        return steps, weighting.batch_sizes(weighting.step + 1, size)


def runner_for(strategy: Strategy, aggregate: Aggregation | None = None,
               copy: Callable[[Sequence[Tensor]], list[Tensor]] | None = None) -> Runner:
    """The runner of ``strategy``'s kind: the one place that looks at it. ``aggregate`` (with ``copy``)
    applies to a model-averaging strategy's rounds; a gradient-averaging strategy has none that combine
    models, and runs without it (the adapters refuse one given beside such a strategy when they are built).

    Example:
        >>> from horovod_hetero.strategies import Balanced, LocalSGD, Synchronous
        >>> [type(runner_for(s)).__name__ for s in (LocalSGD(4), Synchronous(), Balanced(global_batch=8))]
        ['ModelAveragingRunner', 'GradientRunner', 'WeightedGradientRunner']
    """
    check_kind(strategy)
    kind = strategy.runs                   # the strategy itself, or the one it runs now (Auto)
    if isinstance(kind, GradientWeighting):
        return WeightedGradientRunner(strategy, kind)
    if isinstance(kind, GradientAveraging):
        return GradientRunner(strategy)
    return ModelAveragingRunner(strategy, aggregate, copy)


def check_aggregate(aggregate: object, strategy: Strategy) -> Aggregation | None:
    """``aggregate`` as ``strategies.aggregation.check_aggregate`` checks it, given beside ``strategy``: anything
    but plain averaging beside a strategy whose rounds combine no models (one that averages gradients every
    step) is a ``ValueError``.

    Example:
        >>> from horovod_hetero.strategies import LocalSGD, Normalized, Synchronous
        >>> check_aggregate(Normalized(), LocalSGD(4))
        Normalized()
        >>> check_aggregate(Normalized(), Synchronous())
        Traceback (most recent call last):
        ...
        ValueError: aggregate=Normalized() combines the models of a model-averaging strategy's rounds; Synchronous averages gradients every step, so it has none: leave aggregate=None, or use a model-averaging strategy such as hh.LocalSGD(period=8)
    """
    checked = check_form(aggregate)
    runs_others = strategy.runs is not strategy              # it may run a model-averaging strategy (Auto)
    if checked is not None and not runner_for(strategy).combines_models and not runs_others:
        raise ValueError(f"aggregate={checked!r} combines the models of a model-averaging strategy's rounds; "
                         f"{type(strategy).__name__} averages gradients every step, so it has none: leave "
                         f"aggregate=None, or use a model-averaging strategy such as hh.LocalSGD(period=8)")
    return checked
