"""Keras callbacks: ``HeteroSyncCallback`` drives any strategy; the others fill one in (each names the class it
builds, ``strategy_class``: a strategy needs none of its own); and what Horovod's Keras layer gives on Keras 2
but not on Keras 3 (broadcast, metric average, warm-up).

Every argument, and every environment variable that fills in for one, is checked when a callback is
built: a ``TypeError``/``ValueError`` names it; what needs ``hvd.init()`` (process-set membership,
factors per rank) is checked when training begins."""
from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from horovod_hetero.keras._backend import keras_module
from horovod_hetero.keras._callback import HeteroSyncCallbackImpl, SlowdownCallbackImpl
from horovod_hetero.keras._horovod_callbacks import (
    BroadcastGlobalVariablesCallbackImpl, LearningRateWarmupCallbackImpl, MetricAverageCallbackImpl)
from horovod_hetero.auto import Auto
from horovod_hetero.runtime.seams import DEFAULT_TIMEOUT_S
from horovod_hetero.strategies import ADSP, Balanced, DSSP, ESync, ElasticBSP, LocalSGD, Strategy, WAGMA
from horovod_hetero.validation import check_options, check_removed

if TYPE_CHECKING:
    from horovod.common.process_sets import ProcessSet

    from horovod_hetero.runtime.straggler import Slowdown, SlowdownFactors
    from horovod_hetero.runtime.telemetry import Telemetry
    from horovod_hetero.strategies import Steps

#: the running Keras' ``Callback`` (Keras 2 or 3: chosen at run time)
Callback: Any = keras_module().callbacks.Callback
_C = TypeVar("_C", bound="HeteroSyncCallback")


def _strategy_options(name: str, options: Mapping[str, Any] | None, strategy: type[Strategy],
                      given: Sequence[str]) -> dict[str, Any]:
    """``options`` checked as keyword arguments of ``strategy`` other than those in ``given`` (the
    callback's own arguments)."""
    accepted = [p for p in inspect.signature(strategy).parameters if p not in given]
    check_removed(name, options if isinstance(options, Mapping) else (), accepted)
    for key in given:
        if isinstance(options, Mapping) and key in options:
            raise TypeError(f"{name} holds {key!r}, an argument of the callback itself: pass {key}= directly")
    return check_options(name, options, accepted)


class HeteroSyncCallback(HeteroSyncCallbackImpl, Callback):
    """Train with any strategy: the general form every algorithm uses.

    With a model-averaging strategy (``LocalSGD``, ``ESync``, ...) the model is compiled with a plain local
    optimizer; after each batch the strategy decides
    whether the weights are averaged across ranks (one fused ``grouped_allreduce``) or within a
    group. At the end of training all replicas hold identical weights, even if ranks saw
    different numbers of batches, and what the strategy opened is closed. The strategy's state
    rides in the model's Keras checkpoints (``.weights.h5``, ``.keras``): resume it on every rank
    with ``callback.load_checkpoint_state(path)`` beside ``model.load_weights(path)``.

    With a gradient-averaging strategy (``Synchronous``, ``Balanced``) compile with ``hh.DistributedOptimizer``:
    the callback switches its average on (and weighs each rank's gradient, for ``Balanced``), every rank
    takes the same batches, and the rounds only measure; ``Balanced`` plans every rank's batch, so train
    one ``fit`` per epoch on ``callback.epoch_plan``'s batches. ``Synchronous`` alone needs no callback:
    ``hh.DistributedOptimizer`` is it. ``set_strategy(new)`` at an epoch's end runs another strategy, of
    either kind, from the next batch on (the optimizer compiled with ``hh.DistributedOptimizer``, which the
    callback switches as each strategy needs).

    Ranks share each epoch by speed only where the strategy lets the fast ranks take more steps between
    rounds (ESync, ElasticBSP, DSSP, ADSP, wait-avoiding WAGMA) and the ranks' measured speeds differ beyond
    their noise: then they take different numbers of batches in an epoch, so no collective of your own may
    run per batch (rank 0's log says so once); ``share_epochs=False`` keeps Keras' count.

    Args:
        strategy: any strategy, e.g. ``LocalSGD(period=8)``, ``ESync()``, ``Balanced(...)``, ``Synchronous()``.
        process_set: a Horovod ``ProcessSet`` or ``None`` (all ranks).
        telemetry: directory for per-rank step records, a str or ``os.PathLike`` that can be created and
            written to (default ``$HOROVOD_HETERO_TELEMETRY``), or a ``Telemetry``.
        slowdown: per-rank factors such as ``"1,1,1,4"`` or ``[1, 1, 1, 4]``, factors over time
            (see ``Slowdown``), or a ``Slowdown`` (default ``$HOROVOD_HETERO_SLOWDOWN``).
        batch_size: samples per batch, an int >= 1, for the telemetry's samples/s (optional; needed
            where a batch is padded by its samples, ``HOROVOD_HETERO_SAMPLE_S``).
        timeout: seconds (finite, > 0) any collective may take before ``CollectiveTimeoutError``
            (a ``TimeoutError``).
        epoch_sync: ``True`` or ``False``: ``sync_model()`` at every epoch's end, so the callbacks
            after this one (``MetricAverageCallback``, checkpoints) see identical weights and meet in
            their collectives. Every rank must then end every epoch (the same ``epochs``, no rank
            stopping on its own): a rank that stops early (``stop_training`` on its own clock) is
            gone when the others' next epoch averages, which ends in ``CollectiveTimeoutError``.
            ``False``: rounds run on across epochs and ranks may stop at any batch (average the
            metrics after ``fit``).
        share_epochs: ``True``, ``False`` or ``None`` (the default: ``True`` with ``epoch_sync``,
            ``False`` without; ``True`` with ``epoch_sync=False`` is a ``ValueError``): where the strategy
            lets fast ranks take more steps and the speeds differ beyond their noise, ranks share each
            epoch by speed, so the fast ranks do not wait for the slow one at its end: the fastest rank
            takes the epoch's batches (``steps_per_epoch``, or its arrays'), every other rank as many as
            it takes in the same time (``callback.epoch_shares``); an epoch that begins before the speeds
            are told apart (the first) takes its shares from the round that does; ranks whose ``fit``
            holds different numbers of batches (shards sized by hand) keep them. How many batches a
            slower rank's epoch holds then depends on measured speeds: pass ``False`` for a bit-for-bit
            repeatable schedule (every rank Keras' count, the fast ones waiting at each epoch's end).
        aggregate: how the strategy's global rounds combine the models: ``None`` (their mean),
            ``hh.Mean(outer=...)`` or ``hh.Normalized(outer=...)`` (each rank's change divided by its
            local steps), with an optional ``hh.OuterSGD`` on the combined change (``strategies.aggregation``).

    Example::

        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
        model.fit(x, y, epochs=5, callbacks=[hh.callbacks.BroadcastGlobalVariablesCallback(0),
                                             hh.callbacks.HeteroSyncCallback(hh.LocalSGD(period=8))])
    """

    #: the strategy class the callback fills in from its own arguments (``LocalSGDCallback``: ``LocalSGD``);
    #: ``None`` here: any strategy, of either kind, given to it
    strategy_class: "type[Strategy] | None" = None

    def __new__(cls: type[_C], *args: Any, **options: Any) -> _C:
        check_removed(cls.__name__, options, {*inspect.signature(cls.__init__).parameters,
                                              *inspect.signature(HeteroSyncCallbackImpl.__init__).parameters})
        return super().__new__(cls)


class LocalSGDCallback(HeteroSyncCallback):
    """``HeteroSyncCallback(LocalSGD(period, warmup_steps))``: average every ``period``-th batch.

    Example::

        model.fit(x, y, epochs=5, callbacks=[hh.callbacks.LocalSGDCallback(period=8)])
    """

    strategy_class = LocalSGD

    def __init__(self, period: int | Callable[[int], int], warmup_steps: int = 0, **options: Any) -> None:
        super().__init__(LocalSGD(period, warmup_steps), **options)


class ESyncCallback(HeteroSyncCallback):
    """``HeteroSyncCallback(ESync(mode, **esync_options))``: see ``hh.ESync`` (``esync_options``
    takes its other arguments).

    Example::

        model.fit(x, y, epochs=5, callbacks=[hh.callbacks.ESyncCallback(mode="delayed_ack")])
    """

    strategy_class = ESync

    def __init__(self, mode: str = "blocking", esync_options: Mapping[str, Any] | None = None,
                 **options: Any) -> None:
        esync_options = _strategy_options("esync_options", esync_options, ESync, ("mode",))
        super().__init__(ESync(mode, **esync_options), **options)


class WAGMACallback(HeteroSyncCallback):
    """``HeteroSyncCallback(WAGMA(group_size, sync_period, **wagma_options))``: see ``hh.WAGMA``.

    Horovod must be initialised with ``hvd.init(process_sets=hh.wagma_process_sets(group_size))``.

    Example::

        hvd.init(process_sets=hh.wagma_process_sets(group_size=None))
        model.fit(x, y, epochs=5, callbacks=[hh.callbacks.WAGMACallback(group_size=None, sync_period=10)])
    """

    strategy_class = WAGMA

    def __init__(self, group_size: int | None = None, sync_period: int | Callable[[int], int] = 10,
                 wagma_options: Mapping[str, Any] | None = None, **options: Any) -> None:
        wagma_options = _strategy_options("wagma_options", wagma_options, WAGMA, ("group_size", "sync_period"))
        super().__init__(WAGMA(group_size, sync_period, **wagma_options), **options)


class ElasticBSPCallback(HeteroSyncCallback):
    """``HeteroSyncCallback(ElasticBSP(lookahead))``: see ``hh.ElasticBSP``.

    Example::

        model.fit(x, y, epochs=5, callbacks=[hh.callbacks.ElasticBSPCallback(lookahead=15, aggregate=hh.Normalized())])
    """

    strategy_class = ElasticBSP

    def __init__(self, lookahead: int = 15, **options: Any) -> None:
        super().__init__(ElasticBSP(lookahead), **options)


class DSSPCallback(HeteroSyncCallback):
    """``HeteroSyncCallback(DSSP(staleness, tolerance))``: see ``hh.DSSP``.

    Example::

        model.fit(x, y, epochs=5, callbacks=[hh.callbacks.DSSPCallback(staleness=(3, 15))])
    """

    strategy_class = DSSP

    def __init__(self, staleness: Sequence[int] = (3, 15), tolerance: float = 0.05, **options: Any) -> None:
        super().__init__(DSSP(staleness, tolerance), **options)


class ADSPCallback(HeteroSyncCallback):
    """``HeteroSyncCallback(ADSP(check_period, search_every, **adsp_options))``: see ``hh.ADSP``
    (the training losses come from the batch logs).

    Example::

        model.fit(x, y, epochs=5, callbacks=[hh.callbacks.ADSPCallback(check_period=60.0)])
    """

    strategy_class = ADSP

    def __init__(self, check_period: float | str | Steps = 60.0, search_every: float | str | Steps | None = None,
                 adsp_options: Mapping[str, Any] | None = None, **options: Any) -> None:
        adsp_options = _strategy_options("adsp_options", adsp_options, ADSP, ("check_period", "search_every"))
        super().__init__(ADSP(check_period, search_every, **adsp_options), **options)


class AutoCallback(HeteroSyncCallback):
    """``HeteroSyncCallback(Auto(**auto_options))``: the library chooses the strategy (see ``hh.Auto``). Compile the
    model with ``hh.DistributedOptimizer``: it starts as Synchronous, and the callback switches the optimizer's
    average off and on as the strategy it runs needs. Under Keras it changes strategy at an epoch's end.

    Example::

        model.compile(optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size())), loss=...)
        model.fit(x, y, epochs=5, callbacks=[hh.callbacks.BroadcastGlobalVariablesCallback(0),
                                             hh.callbacks.AutoCallback()])
    """

    strategy_class = Auto

    def __init__(self, auto_options: Mapping[str, Any] | None = None, **options: Any) -> None:
        auto_options = _strategy_options("auto_options", auto_options, Auto, ())
        super().__init__(Auto(**auto_options), **options)


class BalancedCallback(HeteroSyncCallback):
    """``HeteroSyncCallback(Balanced(...))``, built from Balanced's arguments: synchronous SGD at the fast
    workers' pace, each rank's batch sized to its speed.

    Compile with ``hh.DistributedOptimizer`` (gradients averaged inside the step, Keras 3); this callback
    scales each rank's gradients by its share of the global batch before the average (the average is the
    gradient of the union of the ranks' batches) and plans the shares from the step times every epoch
    measured (the gradient average's time left out). Keras fixes a ``fit``'s batch size, so sizes change
    between epochs: train one ``fit`` per epoch on ``epoch_plan``'s indices and batch size (every rank
    the same number of steps, every sample once per epoch); a plan made after epoch ``p`` is used from
    epoch ``p + 2`` (epoch 0, with start-up and tracing, is not measured). The plans ride in the model's
    Keras checkpoints, as ``HeteroSyncCallback``'s state (``load_checkpoint_state``). See ``hh.Balanced``.

    Args:
        global_batch: samples per step over all ranks (an int >= the number of ranks), or ``None``: the
            number of ranks times ``batch_size``.
        max_batch: the largest batch a rank may get (memory), or ``None``.
        batch_size: one rank's batch (the user's), an int >= 1; needed without ``global_batch``.
        process_set, telemetry, slowdown, timeout: as ``HeteroSyncCallback``'s.
        min_batch: the smallest batch a rank may get, or ``None`` (2 where the split allows it).

    Example::

        model.compile(optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss=...)
        balanced = hh.callbacks.BalancedCallback(batch_size=32)
        for epoch in range(epochs):
            idx, batch = balanced.epoch_plan(len(x), epoch)
            model.fit(x[idx], y[idx], batch_size=batch, shuffle=False, initial_epoch=epoch, epochs=epoch + 1,
                      callbacks=[hh.callbacks.BroadcastGlobalVariablesCallback(0), balanced])
    """

    strategy_class = Balanced

    def __init__(self, global_batch: int | None = None, max_batch: int | None = None, batch_size: int | None = None,
                 process_set: ProcessSet | None = None, telemetry: Telemetry | str | os.PathLike[str] | None = None,
                 slowdown: SlowdownFactors | Slowdown | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 min_batch: int | None = None) -> None:
        if global_batch is None and batch_size is None:
            raise ValueError("give batch_size= (one rank's batch; the global batch is the number of ranks times it) "
                             "or global_batch=")
        super().__init__(Balanced(global_batch, rebalance_every=1, max_batch=max_batch, min_batch=min_batch),
                         process_set, telemetry, slowdown, batch_size, timeout)


class BroadcastGlobalVariablesCallback(BroadcastGlobalVariablesCallbackImpl, Callback):
    """Start every rank from ``root_rank``'s model and optimizer state (Horovod's callback of the
    same name, for any Keras and backend). Put it first among the callbacks. Like every hh callback,
    when training begins it makes a lost rank in ``hh.DistributedOptimizer``'s gradient average a
    ``RankLostError`` (``keras._train_guard.guard_train_function``).

    Args:
        root_rank: the (global) rank whose variables every rank takes.
        process_set: Horovod process set (default: all ranks).
        timeout: seconds the broadcast may take.

    Example::

        model.fit(x, y, callbacks=[hh.callbacks.BroadcastGlobalVariablesCallback(0), ...])
    """


class MetricAverageCallback(MetricAverageCallbackImpl, Callback):
    """Average the epoch's metrics (``logs``) over the ranks (Horovod's callback of the same name).

    Put it before callbacks that read the logs. Its allgather runs at every rank's epoch end; with
    a model-averaging strategy its callback (``epoch_sync=True``, the default) first brings every rank
    to the same round, wherever it is in the list. With ``epoch_sync=False`` every rank must reach each
    epoch's end between the same two rounds, or a rank waits in it while another waits in a round,
    until the timeout names it.

    Example::

        model.fit(x, y, callbacks=[hh.callbacks.MetricAverageCallback(), keras.callbacks.ModelCheckpoint(...)])
    """


class LearningRateWarmupCallback(LearningRateWarmupCallbackImpl, Callback):
    """Horovod's learning-rate warm-up (its callback of the same name, for any Keras and backend).

    Args:
        initial_lr: the rate after warm-up (usually the single-worker rate times the number of ranks).
        warmup_epochs: epochs over which the rate grows from ``initial_lr / size``.
        momentum_correction: scale momentum with the rate change (where momentum is a variable).
        steps_per_epoch: batches per epoch, if ``fit`` cannot tell.
        verbose: 1 prints the end of the warm-up on rank 0.

    Example::

        model.fit(x, y, callbacks=[hh.callbacks.LearningRateWarmupCallback(initial_lr=0.05 * hvd.size())])
    """


class SlowdownCallback(SlowdownCallbackImpl, Callback):
    """Simulated heterogeneity (``HOROVOD_HETERO_SLOWDOWN``) for a Keras baseline without a strategy.

    ``HeteroSyncCallback`` applies the slowdown itself; add this one instead when training
    synchronously (``hh.DistributedOptimizer``, or Horovod's on Keras 2), so both are measured
    under the same simulated cluster. Pair it with ``HOROVOD_HETERO_BASE_STEP_S``: a Keras batch
    includes the gradient average, so only a fixed base step pads exactly.

    Args:
        slowdown: per-rank factors such as ``"1,1,1,4"`` (default ``$HOROVOD_HETERO_SLOWDOWN``).
        batch_size: this rank's batch, an int >= 1, needed (and only used) where a batch is padded by
            its samples (``HOROVOD_HETERO_SAMPLE_S``); every batch counts as a full one.

    Example::

        model.compile(optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss=...)
        model.fit(x, y, epochs=5, callbacks=[hh.callbacks.SlowdownCallback()])
    """


#: every callback of this module (``horovod_hetero.tensorflow.keras.callbacks`` re-exports them all)
__all__ = [name for name, value in list(globals().items())
           if name.endswith("Callback") and name != "Callback" and isinstance(value, type)]
