"""``hh.DistributedOptimizer``: Horovod's one-line optimizer wrapper, with a synchronisation strategy.

The wrapper is a ``torch.optim.Optimizer`` that composes three things, as PyTorch's
``PostLocalSGDOptimizer(optim, averager)`` does: the user's optimizer (its parameters, state and ``step``),
the gradient allreduce (``HorovodGradients``: Horovod's own ``DistributedOptimizer`` machinery, its hooks,
``synchronize`` and ``skip_synchronize``, used while the strategy's runner opens it) and the controller that
runs the strategy (``runtime.controller``). It only reports steps; the strategy owns the schedule, the
runner of its kind decides what a step does with the gradients, and ``set_strategy`` swaps the strategy at a
sync point. It can be subclassed like any optimizer.
"""
from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, cast, overload

import torch

import horovod.torch as hvd
from horovod.torch.compression import Compression, Compressor

from horovod_hetero.common.compat import horovod_optimizer_module, torch_join_async, torch_optimizer_bases
from horovod_hetero.common.options import check_run_options
from horovod_hetero.common.ranks import follow_ranks
from horovod_hetero.errors import troubleshooting
from horovod_hetero.runtime.seams import DEFAULT_TIMEOUT_S
from horovod_hetero.runtime.controller import HeteroController, OutsideController, ring_bytes
from horovod_hetero.runtime.runner import check_aggregate, runner_for
from horovod_hetero.runtime.straggler import Slowdown
from horovod_hetero.strategies.registry import check_strategy
from horovod_hetero.torch.adapter import TorchCollectives, TorchModel, wait_done
from horovod_hetero.torch.sampler import DistributedSampler, register_optimizer
from horovod_hetero.validation import check_bool, check_float, check_int

if TYPE_CHECKING:
    from horovod.common.process_sets import ProcessSet

    from horovod_hetero.common.ranks import Controller
    from horovod_hetero.runtime.membership import Membership
    from horovod_hetero.runtime.runner import Runner
    from horovod_hetero.runtime.telemetry import Telemetry
    from horovod_hetero.runtime.straggler import SlowdownFactors
    from horovod_hetero.strategies import Aggregation, Strategy

#: ``(name, tensor)`` pairs, as ``model.named_parameters()`` and ``model.named_buffers()`` give them
Named = list[tuple[str, torch.Tensor]]
_STATE_KEY = "horovod_hetero"
#: sync_model() warns once (no ``hh.DistributedSampler`` bound) when a rank waited there for more than this
#: share of the time since the previous sync_model(): an even split of the epoch left it idle
IDLE_SHARE = 0.25
_DistributedOptimizer, _DistributedAdasumOptimizer = torch_optimizer_bases()


def _named(named: Iterable[tuple[str, torch.Tensor]] | None, what: str, fallback: Named) -> Named:
    """List of (name, tensor), validated like Horovod does for named_parameters."""
    if named is None:
        return fallback
    try:
        named = list(named)
    except TypeError:
        named = None
    if named is None or any(not (isinstance(p, tuple) and len(p) == 2 and torch.is_tensor(p[1])) for p in named):
        raise ValueError(f"{what} must be a sequence of (name, tensor) tuples, "
                         f"usually produced by model.{what}()")
    names = [n for n, _ in named]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"names in {what} must be unique; duplicates: {', '.join(dups)}")
    return sorted(named, key=lambda item: item[0])


def _named_tensors(optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                   named_buffers: Iterable[tuple[str, torch.Tensor]] | None) -> tuple[Named, Named, Named]:
    """The optimizer's parameters, the model's floating-point buffers and its other buffers (integer or
    bool, BatchNorm's ``num_batches_tracked``: broadcast, not averaged), each as sorted (name, tensor);
    a complex buffer is refused by name."""
    unnamed = [(f"param.{i}.{j}", p) for i, g in enumerate(optimizer.param_groups)
               for j, p in enumerate(g["params"])]
    params = _named(named_parameters, "named_parameters", unnamed)
    known = {id(p) for _, p in params}
    if any(id(p) not in known for _, p in unnamed):
        raise ValueError("named_parameters was given, but one or more optimizer parameters are "
                         "not in it; pass model.named_parameters() of the optimized model")
    buffers = _named(named_buffers, "named_buffers", [])
    complex_ = [n for n, b in buffers if b.is_complex()]
    if complex_:
        raise ValueError(f"named_buffers: complex buffers ({', '.join(complex_)}) cannot be averaged or broadcast by "
                         f"Horovod; pass named_buffers without them")
    return params, [(n, b) for n, b in buffers if b.is_floating_point()], [(n, b) for n, b in buffers
                                                                          if not b.is_floating_point()]


class _Counters:
    """What ``param_groups[0]["horovod_hetero"]`` holds while the wrapper's own counters are current.

    The strategy's counters and the round number live in the first param group, so they travel
    wherever Horovod and torch move an optimizer's state: ``hvd.broadcast_optimizer_state`` (its
    options are broadcast with ``broadcast_object``), ``hvd.elastic.TorchState`` (deep copies of
    ``state_dict()``), checkpoints and ``load_state_dict``. Copied or pickled it becomes a snapshot
    of the counters (a plain dict); finding a dict there instead of this object, the wrapper adopts
    it before its next step. Any rank may so take rank 0's counters: ranks count rounds, and all then
    count from the same one.
    """

    def __init__(self, optimizer: DistributedOptimizer) -> None:
        self._optimizer = optimizer

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        state = self._optimizer._hh.state_dict()          # None on a rank outside the process set
        return (dict, (state,)) if state is not None else (type(None), ())

    def __repr__(self) -> str:
        return f"<horovod_hetero counters {self._optimizer._hh.state_dict()}>"


class _HorovodOptions:
    """Horovod's options of the gradient allreduce, checked once, as Horovod checks them (a ``ValueError`` or
    ``TypeError`` even before ``hvd.init()``), and against each strategy the wrapper runs (``check_for``)."""

    def __init__(self, compression: type[Compressor], backward_passes_per_step: int, op: int,
                 gradient_predivide_factor: float, groups: int | Sequence[Sequence[torch.Tensor]] | None,
                 sparse_as_dense: bool, num_groups: int) -> None:
        if check_int("num_groups", num_groups, 0) != 0:
            warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                          DeprecationWarning)
            groups = num_groups if groups is None else groups
        self.backward_passes_per_step = check_int("backward_passes_per_step", backward_passes_per_step, 1)
        check_bool("sparse_as_dense", sparse_as_dense)
        check_float("gradient_predivide_factor", gradient_predivide_factor, 0.0, min_exclusive=True)
        if op not in (hvd.Average, hvd.Sum, hvd.Adasum):
            raise ValueError(f"op must be hvd.Average, hvd.Sum or hvd.Adasum, got {op!r}")
        if gradient_predivide_factor != 1.0 and op != hvd.Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        self.compression, self.op, self.groups = compression, op, groups
        self.gradient_predivide_factor, self.sparse_as_dense = gradient_predivide_factor, sparse_as_dense
        self._groups_name = "groups" if num_groups == 0 else "num_groups"

    def check_for(self, strategy: Strategy, sampler: DistributedSampler | None) -> None:
        """Refuse, naming them, the options ``strategy``'s runner cannot honour: Horovod's gradient options beside
        a model-averaging strategy (it runs no gradient allreduce), ``op`` and ``gradient_predivide_factor`` beside
        one that weighs the gradients itself, and a strategy that plans every rank's batch without a batch
        sampler (``sampler``) bound."""
        runner, name = runner_for(strategy), type(strategy).__name__
        if not runner.steps_together or strategy.runs is not strategy:   # or it may run a model-averaging one (Auto)
            if self.op != hvd.Average:
                raise ValueError(f"op must be hvd.Average with {name} (models are averaged); "
                                 f"op=hvd.Adasum or hvd.Sum apply to gradients, with strategy=hh.Synchronous()\n"
                                 f"{troubleshooting('troubleshooting-gradient-options')}")
            given = [option for option, changed in (("compression", self.compression is not Compression.none),
                                                    ("gradient_predivide_factor", self.gradient_predivide_factor != 1.0),
                                                    (self._groups_name, self.groups is not None),
                                                    ("sparse_as_dense", self.sparse_as_dense)) if changed]
            if given:
                raise ValueError(f"{', '.join(given)}: Horovod's options for the gradient allreduce, which {name} does "
                                 f"not run (each rank steps with its own gradients and the model itself is averaged, "
                                 f"in its own dtype): leave them at Horovod's defaults, or use "
                                 f"strategy=hh.Synchronous()\n{troubleshooting('troubleshooting-gradient-options')}")
        if runner.plans_batches:
            if self.op != hvd.Average or self.gradient_predivide_factor != 1.0:
                raise ValueError(f"op and gradient_predivide_factor are set by {name}, which weighs every rank's "
                                 f"gradient by its share of the global batch: leave them at hvd.Average, 1.0")
            if sampler is None or sampler.batch_size is None:
                raise ValueError(f"{name} plans every rank's batch size: give sampler=hh.DistributedSampler("
                                 f"dataset, batch_size=B) and build the loader as DataLoader(dataset, "
                                 f"batch_sampler=sampler)\n{troubleshooting('troubleshooting-balanced-sampler')}")


class _Engine:
    """What the gradient allreduce adds to Horovod's own optimizer class (copied into the class built from it,
    as Horovod builds its own: a subclass of the user's optimizer class with Horovod's methods): hooks that run
    only while the allreduce is open, and the enqueue and the wait of ``HorovodGradients``."""

    # set on the class built from Horovod's: Horovod's class it copies, and the HorovodGradients it serves
    _hh_base: Any
    _hh_gradients: HorovodGradients
    _handles: dict

    def _make_hook(self, p: torch.Tensor) -> Callable[..., Any]:
        hook = self._hh_base._make_hook(self, p)

        def gated(*args: Any) -> Any:
            if self._hh_gradients.active:           # closed: each rank keeps its own gradients
                return hook(*args)
        return gated

    # Horovod's gradient hooks enqueue here during loss.backward(), outside step()'s guard: a lost rank
    # must fail there as it fails in step() (RankLostError, or elastic's reset)
    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[Any, Any]:
        try:
            self._hh_gradients.before_enqueue(self, [p])
            return self._hh_base._allreduce_grad_async(self, p)
        except Exception as e:
            self._hh_gradients.reraise(e)

    def _grouped_allreduce_grad_async(self, ps: list[torch.Tensor]) -> tuple[Any, Any]:
        try:
            self._hh_gradients.before_enqueue(self, ps)
            return self._hh_base._grouped_allreduce_grad_async(self, ps)
        except Exception as e:
            self._hh_gradients.reraise(e)

    def synchronize(self) -> None:
        t0 = time.perf_counter()
        try:
            self._hh_gradients.wait_allreduces(self._handles)
            return self._hh_base.synchronize(self)
        finally:
            self._hh_gradients.comm += time.perf_counter() - t0


class HorovodGradients:
    """The torch ``Gradients`` (``runtime.runner``): Horovod's own ``DistributedOptimizer`` around the user's
    optimizer (its hooks in ``loss.backward()``, ``synchronize``, ``skip_synchronize``, bit for bit), sharing the
    optimizer's parameters and state, used while the strategy's runner opens it; closed, each rank steps with
    the user's optimizer on its own gradients (``step`` is then the user's).

    Args:
        optimizer: the user's optimizer.
        named_parameters: its ``(name, parameter)`` pairs, or ``None``.
        options: the checked ``_HorovodOptions``.
        process_set: Horovod's process set of the allreduce.
        adasum: Horovod's Adasum optimizer instead of its averaging one.
        current: ``current()``, the controller for Horovod's current ranks, started (counters adopted).
        reraise: ``reraise(error)``, what a failed enqueue raises instead (``Membership.reraise``).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Named | None, options: _HorovodOptions,
                 process_set: ProcessSet, adasum: bool, current: Callable[[], Controller],
                 reraise: Callable[[BaseException], NoReturn]) -> None:
        self.optimizer, self._named, self.options = optimizer, named_parameters, options
        self.process_set, self.adasum = process_set, adasum
        self._current, self.reraise = current, reraise
        self.active = False
        self.comm = 0.0                 # seconds waited for the allreduces since the last step (telemetry)
        self._engine: Any = None        # Horovod's optimizer, built at the first open
        self._weight: Callable[[], float] | None = None
        self._names: dict[torch.Tensor, str] | None = None      # Horovod's names of the parameters, as built
        self._names_session = ""

    # -- Gradients --

    def open(self, weight: Callable[[], float] | None) -> None:
        engine = self._engine if self._engine is not None else self._build()
        engine.op = hvd.Sum if weight is not None else self.options.op
        self._weight, self.active = weight, True

    def close(self) -> None:
        self._weight, self.active = None, False

    def join(self) -> int | None:
        """``hvd.join`` (polled: Horovod's own wait spins) over every rank, with the allreduce open; ``None``
        on another process set (``hvd.join`` is global)."""
        if self.process_set != hvd.global_process_set or not self.active:
            return None
        collectives = cast(TorchCollectives, self._current().collectives)      # open: a member's
        return int(collectives.polled(torch_join_async, "hvd.join in sync_model").item())

    # -- what the wrapper's methods do --

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        return self._engine.step(closure) if self.active else self.optimizer.step(closure)

    def synchronize(self) -> None:
        """Horovod's ``synchronize`` while open; under model averaging nothing to wait for."""
        if self.active:
            self._engine.synchronize()

    def skip_synchronize(self) -> contextlib.AbstractContextManager[Any]:
        return self._engine.skip_synchronize() if self.active else contextlib.nullcontext()

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.active and self._engine._handles:
            self._engine.zero_grad()            # Horovod's refusal after backward(), before step()
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.options.backward_passes_per_step = check_int("passes", passes, 1)
        if self._engine is not None:
            self._engine.set_backward_passes_per_step(self.options.backward_passes_per_step)

    def rebind(self) -> None:
        """After the user's optimizer loaded a state (new param groups and state objects), share them again."""
        if self._engine is not None:
            self._engine.param_groups, self._engine.state = self.optimizer.param_groups, self.optimizer.state
            self._engine._handles = {}
            self._engine.set_backward_passes_per_step(self.options.backward_passes_per_step)

    # -- the engine --

    def _build(self) -> Any:
        """Horovod's optimizer over the user's optimizer's param groups, built as Horovod builds it (its hooks
        registered now: a collective where ``groups`` is given, so every rank opens at the same point), then
        sharing the user's optimizer's param groups and state."""
        base = _DistributedAdasumOptimizer if self.adasum else _DistributedOptimizer
        cls = type(self.optimizer.__class__.__name__, (self.optimizer.__class__,),
                   {**{k: v for k, v in base.__dict__.items() if k not in ("__dict__", "__weakref__")},
                    **{k: v for k, v in _Engine.__dict__.items()
                       if k not in ("__dict__", "__weakref__", "__doc__", "__qualname__", "__annotations__")},
                    "_hh_base": base, "_hh_gradients": self, "__module__": base.__module__})
        o = self.options
        if self.adasum:
            engine = cls(self.optimizer.param_groups, self._named, o.compression, o.backward_passes_per_step)
        else:
            engine = cls(self.optimizer.param_groups, self._named, o.compression, o.backward_passes_per_step, o.op,
                         o.gradient_predivide_factor, o.groups, o.sparse_as_dense, self.process_set)
        engine.param_groups, engine.state = self.optimizer.param_groups, self.optimizer.state
        self._engine = engine
        return engine

    def before_enqueue(self, engine: Any, ps: Sequence[torch.Tensor]) -> None:
        """Before Horovod enqueues the allreduce of ``ps``: the controller for Horovod's current ranks started
        (a new one after ``hvd.elastic``'s reset starts at the first hook of ``loss.backward()``), Horovod's
        names of the allreduces in its session (``Collectives.session``, as the rounds' names: an allreduce
        Horovod took as its loop ended after a failure, kept across the reset, would meet the new one of the
        same name), and each gradient weighted where the runner weighs them (Horovod then sums)."""
        session = getattr(self._current().collectives, "session", "")
        if session != self._names_session:
            if self._names is None:
                self._names = dict(engine._parameter_names)
            engine._parameter_names = {p: name + session for p, name in self._names.items()}
            self._names_session = session
        if self._weight is not None:
            weight = self._weight()
            for p in ps:
                if p.grad is not None:
                    p.grad.mul_(weight)

    def wait_allreduces(self, handles: dict[torch.Tensor, tuple[Any, Any]]) -> None:
        """Poll the gradient allreduces the hooks started until they are done (``wait_done``), before
        Horovod's ``synchronize`` collects them. Horovod's own wait is a loop of ``sched_yield`` calls
        that takes the GIL back each turn: where ranks outnumber cores, the waiting ranks take the
        cores the computing ranks and Horovod's background threads need (measured on 2 cores and 4
        ranks at 1,1,1,4: steps stalled for seconds, 7-12 s of every 30 s, and none with polling).
        Under MPI, whose collectives have no timeout, it also bounds the wait by ``timeout``: a rank
        that stopped answering is a ``CollectiveTimeoutError``, not a hang."""
        collectives = cast(TorchCollectives, self._current().collectives)
        if collectives is None:
            return
        collectives.flush()             # a round of statistics begun at the previous step: with the gradients
        for handle, _ in list(handles.values()):
            if isinstance(handle, int):
                wait_done(handle, collectives.timeout, "the gradient allreduce")


class _WrappedStep(torch.optim.Optimizer):
    """The step ``hvd.broadcast_optimizer_state`` reaches through ``super(type(opt), opt).step()``, taking the
    wrapper for one of Horovod's own (its ``__module__``): the wrapped optimizer's own step on the zeroed
    gradients it made, which is neither a collective nor a counted step."""

    optimizer: torch.optim.Optimizer

    @overload
    def step(self, closure: None = None) -> None: ...
    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        return self.optimizer.step(closure)


class DistributedOptimizer(_WrappedStep):
    """Wrap a torch optimizer so that training follows a heterogeneity-aware strategy.

    With ``strategy=Synchronous()`` (the default) this *is* ``hvd.DistributedOptimizer``
    (same hooks, same results bit for bit). With a model-averaging strategy such as
    ``LocalSGD`` each rank steps its own replica with the user's optimizer and the model is
    averaged (one fused ``grouped_allreduce``) when the strategy says so. The argument names
    are Horovod's; ``op`` (``hvd.Adasum`` too, under MPI) applies to gradient averaging only, and so do
    ``compression``, ``gradient_predivide_factor``, ``groups`` and ``sparse_as_dense``, which a
    model-averaging strategy refuses (``ValueError``) unless left at Horovod's defaults. Horovod's
    methods work under every strategy: under model averaging the gradients are this rank's own, so
    ``synchronize()`` has nothing to wait for, ``skip_synchronize()`` is a context as Horovod's
    (clipping and ``GradScaler`` run as Horovod documents them), and gradients accumulate over
    ``backward_passes_per_step`` backward passes until ``step()`` as they would in Horovod.

    Horovod's optimizer contract holds for every strategy: ``hvd.broadcast_optimizer_state`` creates
    missing state with the wrapped optimizer's ``step``, which is neither a collective nor a counted
    step; the strategy's counters and round number travel in ``param_groups[0]["horovod_hetero"]``
    (broadcast by ``hvd.broadcast_optimizer_state``, kept by ``hvd.elastic.TorchState`` and checkpoints;
    a rank adopts counters that arrive there before its next step), and a rank outside ``process_set``
    wraps and steps locally. Building it runs no collective (the strategy opens at the first step),
    and after ``hvd.elastic.run``'s reset the strategy goes on with the new ranks (``runtime.membership``).
    The wrapper shares the wrapped optimizer's ``param_groups`` and ``state`` (an LR scheduler built on
    either works), and can be subclassed like any optimizer.

    Args:
        optimizer: the ``torch.optim.Optimizer`` to wrap.
        named_parameters: ``model.named_parameters()`` (names the collectives; optional).
        strategy: ``Synchronous()`` (default), ``Balanced(global_batch, rebalance_every)``,
            ``LocalSGD(period, warmup_steps)``, ``ESync(mode)``, ``WAGMA(group_size, sync_period)``,
            or any ``ModelAveraging``/``GradientAveraging`` strategy; ``set_strategy`` changes it.
        compression: Horovod's, as ``hvd.DistributedOptimizer`` takes it (gradient averaging only); so are
            ``backward_passes_per_step``, ``op``, ``gradient_predivide_factor``, ``groups``, ``sparse_as_dense``,
            ``process_set`` and ``num_groups``.
        named_buffers: ``model.named_buffers()``: floating-point buffers (BatchNorm's running
            statistics) are averaged with the parameters and the others (``num_batches_tracked``)
            copied from one rank in ``sync_model()`` (the process set's first; under ``Synchronous``
            the one whose model it broadcasts), so the whole ``state_dict()`` is then identical on
            every rank; without it buffers stay each rank's own.
        telemetry: directory for per-rank JSON-lines step records (default
            ``$HOROVOD_HETERO_TELEMETRY``; unset: kept in memory).
        slowdown: per-rank slowdown factors, e.g. ``"1,1,1,4"`` (default
            ``$HOROVOD_HETERO_SLOWDOWN``) to simulate a heterogeneous cluster: a step hook beside the
            strategy, checked here.
        timeout: seconds any collective may take before ``CollectiveTimeoutError``.
        sampler: an ``hh.DistributedSampler`` to bind: its epochs are split by the speeds this
            optimizer's rounds measure; with ``batch_size`` its batches are sized by the strategy
            (``Balanced`` needs one). A sampler built without one binds to the process's only
            ``hh.DistributedOptimizer`` by itself; with several, name it here.
        aggregate: how a model-averaging strategy's global rounds combine the models: ``None`` (their
            mean), ``hh.Mean(outer=...)`` or ``hh.Normalized(outer=...)`` (each rank's change divided by
            its local steps), with an optional ``hh.OuterSGD`` on the combined change
            (``strategies.aggregation``). A gradient-averaging strategy takes ``None`` only.

    Example::

        import horovod.torch as hvd
        import horovod_hetero.torch as hh
        hvd.init()
        opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
        opt = hh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      named_buffers=model.named_buffers(),
                                      strategy=hh.LocalSGD(period=8))
        for x, y in loader:                  # any number of batches per rank
            opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
        opt.sync_model()                     # every rank: identical state_dict() afterwards
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None, strategy: Strategy | None = None,
                 compression: type[Compressor] = Compression.none, backward_passes_per_step: int = 1,
                 op: int = hvd.Average, gradient_predivide_factor: float = 1.0,
                 groups: int | Sequence[Sequence[torch.Tensor]] | None = None, sparse_as_dense: bool = False,
                 process_set: ProcessSet | None = hvd.global_process_set,
                 named_buffers: Iterable[tuple[str, torch.Tensor]] | None = None,
                 telemetry: Telemetry | str | os.PathLike[str] | None = None,
                 slowdown: SlowdownFactors | Slowdown | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 num_groups: int = 0, sampler: DistributedSampler | None = None,
                 aggregate: Aggregation | None = None) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        strategy = check_strategy(strategy)
        aggregate = check_aggregate(aggregate, strategy)
        # the arguments first, as Horovod checks them: a bad one is a ValueError/TypeError even before hvd.init()
        options = _HorovodOptions(compression, backward_passes_per_step, op, gradient_predivide_factor, groups,
                                  sparse_as_dense, num_groups)
        check_run_options(telemetry, slowdown)
        if sampler is not None and not isinstance(sampler, DistributedSampler):
            raise TypeError(f"sampler must be a horovod_hetero.torch.DistributedSampler, got {type(sampler).__name__}")
        options.check_for(strategy, sampler)
        params, buffers, counts = _named_tensors(optimizer, named_parameters, named_buffers)
        if op == hvd.Adasum and process_set is not None and process_set != hvd.global_process_set:
            raise NotImplementedError("Adasum does not support non-global process sets yet.")
        owner = "horovod_hetero.torch.DistributedOptimizer"
        collectives = TorchCollectives(process_set, timeout, owner=owner, members_only=False)
        adasum = op == hvd.Adasum and hvd.size() > 1
        if adasum and not collectives.mpi:              # Horovod would fail at the first step, by name only
            raise ValueError("op=hvd.Adasum needs Horovod's MPI controller (Horovod runs Adasum over MPI only): "
                             "launch with horovodrun --mpi or mpirun, with a Horovod built with MPI; this job "
                             "runs on Gloo, where op must be hvd.Average or hvd.Sum\n"
                             + troubleshooting("troubleshooting-adasum-gloo"))
        torch.optim.Optimizer.__init__(self, optimizer.param_groups, optimizer.defaults)  # its hooks and profiling
        self.optimizer = optimizer
        self.param_groups, self.state = optimizer.param_groups, optimizer.state         # the wrapped optimizer's
        self.__module__ = horovod_optimizer_module()     # hvd.broadcast_optimizer_state's test for its own
        self._hh_options, self._hh_sampler = options, sampler
        self._hh_gradients = HorovodGradients(optimizer, None if named_parameters is None else params, options,
                                              collectives.process_set, adasum, self._hh_ready,
                                              lambda error: self._hh_membership.reraise(error))
        # Horovod's gradient allreduce: this rank's bytes of it (telemetry)
        self._hh_grad_payload = sum(p.numel() * p.element_size() for _, p in params if p.requires_grad)
        # packed into flat tensors: a round is one in-place allreduce; sync_model() broadcasts them
        model = TorchModel([p for _, p in params] + [b for _, b in buffers], flat=True)
        first = [collectives]               # the first controller's; after an elastic reset, new ones
        # follow_ranks' below; build() reads it only once it is set (at the first current())
        self._hh_membership = cast("Membership[Controller]", None)

        def build(records: Telemetry | str | os.PathLike[str] | None) -> Controller:
            previous = self._hh_membership.controller
            current = first.pop() if first else TorchCollectives(process_set, timeout, owner=owner, members_only=False)
            running = strategy if previous is None else previous.strategy        # set_strategy's, after a reset
            if not current.included:        # as Horovod: a non-member wraps, and steps locally
                return OutsideController(running, hvd.rank(), records)
            hooks = [Slowdown(current.rank, slowdown, size=current.size).pad] if not isinstance(slowdown, Slowdown) \
                else [slowdown.pad]
            return HeteroController(running, current, model, records, hooks, aggregate=aggregate,
                                    batches_planned=sampler is not None and sampler.batch_size is not None,
                                    gradients=self._hh_gradients)

        self._hh_counts = [b for _, b in counts]
        self._hh_synced_at = time.monotonic()
        self._hh_idle_warned = False
        self._hh_split_by_speed = False         # set when an hh.DistributedSampler binds to it
        self._hh_counters = _Counters(self)
        self.param_groups[0][_STATE_KEY] = self._hh_counters
        self._hh_membership = follow_ranks(hvd, process_set, telemetry, build)
        self._hh_bind_batches(self._hh_membership.current())   # built now: a size the strategy refuses fails here
        if sampler is not None:
            sampler.optimizer = self
        register_optimizer(self)

    # -- what the strategy and the runtime need --

    @property
    def _hh(self) -> Controller:
        """The controller for Horovod's current ranks (a new one after ``hvd.elastic``'s reset)."""
        return self._hh_membership.current()

    def _hh_ready(self) -> Controller:
        """The controller, started (its counters adopted first): before a step, and at the first gradient hook
        of ``loss.backward()`` after a reset."""
        hh = self._hh
        if hh.transports is None:
            self._hh_adopt()
            hh.start()
        return hh

    def _hh_adopt(self) -> None:
        """Take counters that arrived in the param group (broadcast, checkpoint, elastic restore)."""
        group = self.param_groups[0]
        state = group.get(_STATE_KEY)
        if state is self._hh_counters:
            return
        if state is not None:
            self._hh.load_state_dict(state)
            self._hh_bind_batches(self._hh)
        group[_STATE_KEY] = self._hh_counters

    def _hh_bind_batches(self, hh: Controller) -> None:
        """Give the strategy the bound batch sampler's batch (``Balanced``'s global batch)."""
        sampler = self._hh_sampler
        if sampler is not None and sampler.batch_size is not None and hh.collectives is not None:
            hh.runner.use_batch(sampler.batch_size, hh.collectives.size)

    @property
    def strategy(self) -> Strategy:
        """The strategy the optimizer runs (``set_strategy`` changes it)."""
        return self._hh.strategy

    @property
    def runner(self) -> Runner:
        """How the current strategy's kind runs (``runtime.runner.Runner``): e.g. ``opt.runner.steps_together``,
        whether every step averages the gradients, so that every rank holds the same model after each."""
        return self._hh.runner

    @property
    def telemetry(self) -> Telemetry:
        """This rank's ``Telemetry``; ``opt.telemetry.annotate(loss=..., samples=...)`` adds fields."""
        return self._hh.telemetry

    @property
    def backward_passes_per_step(self) -> int:
        return self._hh_options.backward_passes_per_step

    def report_loss(self, loss: float | torch.Tensor) -> None:
        """This step's training loss (a number or a one-element tensor) for the strategy (ADSP's
        search) and the telemetry: ``opt.telemetry.annotate(loss=...)``. Called before ``step()`` it
        goes with that step, after it with the next one."""
        from horovod_hetero.validation import check_loss
        self.telemetry.annotate(loss=check_loss(loss))

    # -- the optimizer --

    @overload
    def step(self, closure: None = None) -> None: ...
    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        with self._hh_membership.guard() as hh:
            self._hh_check_drawn(hh)
            self._hh_ready()            # opens at the first step (no collective when built: hvd.elastic's rule)
            gradients = self._hh_gradients
            loss = gradients.step(closure)
            comm, gradients.comm = gradients.comm, 0.0
            # a gradient allreduce's bytes from this rank (telemetry)
            payload = self._hh_grad_payload if gradients.active else 0
            hh.after_step(comm_s=comm, bytes_sent=ring_bytes(payload, hh.size or 1))
        return loss

    def _hh_check_drawn(self, hh: Controller) -> None:
        sampler = self._hh_sampler
        if sampler is not None and sampler.drawn == 0 and hh.runner.plans_batches and hh.strategy.step >= 1:
            raise ValueError(f"{type(hh.strategy).__name__} plans every rank's batch, but no batch was drawn from the "
                             f"bound sampler: build the loader as DataLoader(dataset, batch_sampler=sampler) (not "
                             f"sampler=), with the hh.DistributedSampler(dataset, batch_size=...) given to "
                             f"hh.DistributedOptimizer(..., sampler=sampler)\n"
                             f"{troubleshooting('troubleshooting-balanced-sampler')}")

    def synchronize(self) -> None:
        """Horovod's ``synchronize()`` under gradient averaging; under model averaging each rank steps with its
        own gradients, and there is nothing to wait for."""
        self._hh_gradients.synchronize()

    def skip_synchronize(self) -> contextlib.AbstractContextManager[Any]:
        """As Horovod's (``optimizer.synchronize()``, then ``with optimizer.skip_synchronize(): optimizer.step()``)."""
        return self._hh_gradients.skip_synchronize()

    def set_backward_passes_per_step(self, passes: int) -> None:
        self._hh_gradients.set_backward_passes_per_step(passes)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._hh_gradients.zero_grad(set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if "optimizer" not in self.__dict__:       # torch's __init__ filling a list the wrapped optimizer's replaces
            return super().add_param_group(param_group)
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        self._hh_adopt()
        state = self.optimizer.state_dict()
        state["param_groups"][0][_STATE_KEY] = self._hh.state_dict()      # a snapshot, not the live object
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)
        self.param_groups, self.state = self.optimizer.param_groups, self.optimizer.state   # new objects
        self._hh_gradients.rebind()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r}, strategy={self.strategy!r})"

    # -- synchronising --

    def sync_model(self) -> None:
        """Bring every rank to identical models and the same round now; every rank must call it.

        With a model-averaging strategy, a rank that calls it early (it ran out of data) keeps joining
        the other ranks' averaging rounds until they call it too; with a gradient-averaging one, ranks
        with fewer batches wait in Horovod's ``hvd.join()`` (taking part in the others' gradient
        allreduces with zeros) and the model of the rank that joined last is broadcast (on a non-global
        process set every rank must call it at the same step, and the model is averaged). On return every
        rank holds bit-identical parameters and buffers (those given as ``named_buffers``), and what the
        strategy opened (servers, threads, sockets) is closed; the next ``step()`` opens it again. Call it
        before collectives of your own (a metric ``hvd.allreduce``, ``hvd.broadcast_*``): it brings every
        rank to the same round. A rank that waited here for over a quarter of the time since the last call
        while no ``hh.DistributedSampler`` was bound warns once (an even split of the epoch leaves the fast
        ranks idle).
        """
        t0 = time.monotonic()
        with self._hh_membership.guard() as hh:
            self._hh_adopt()
            root = hh.sync() if hh.collectives is not None else None
            self._hh_copy_counts(hh, root)
        self._hh_check_idle(t0)

    def set_strategy(self, strategy: Strategy) -> None:
        """Run ``strategy`` from the next step on, of either kind (ESync to Balanced, Synchronous to ElasticBSP,
        and back). Every rank calls it at the same point: it first syncs the model (``sync_model()``: the old
        strategy finishes, every rank holds the same model and round), then the new strategy starts from rank
        0's counters at the next step. Checkpoints and ``hvd.elastic`` states taken from then on hold the new
        strategy, and loading one brings it back. Horovod's options given to the wrapper must suit it (as at
        construction: ``ValueError``).

        Example::

            opt.set_strategy(hh.ElasticBSP())        # every rank, e.g. at an epoch's end
        """
        strategy = check_strategy(strategy)
        self._hh_options.check_for(strategy, self._hh_sampler)
        self.sync_model()
        with self._hh_membership.guard() as hh:
            hh.set_strategy(strategy)
            self._hh_bind_batches(hh)

    def _hh_copy_counts(self, hh: Controller, root: int | None) -> None:
        """Integer buffers (BatchNorm's ``num_batches_tracked``) are not averaged: every rank takes those of
        ``root`` (default: the process set's first rank; under ``Synchronous`` the rank that joined last,
        whose model is broadcast), so the whole ``state_dict()`` is identical."""
        collectives = cast("TorchCollectives | None", hh.collectives)
        if not self._hh_counts or collectives is None:
            return
        counts = collectives.broadcast(self._hh_counts, collectives.root if root is None else root,
                                       name="horovod_hetero.sync.counts",
                                       what="sync_model's broadcast of the integer buffers")
        with torch.no_grad():
            for mine, theirs in zip(self._hh_counts, counts):
                mine.copy_(theirs)

    def _hh_check_idle(self, started: float) -> None:
        """Warn once if this rank waited in sync_model() for over ``IDLE_SHARE`` of the time since the last
        one while the epoch was split evenly (no ``hh.DistributedSampler`` bound to this optimizer) under a
        strategy whose ranks do not step together."""
        now, since = time.monotonic(), self._hh_synced_at
        self._hh_synced_at = now
        waited = now - started
        if (self._hh_idle_warned or self._hh_split_by_speed or self._hh.runner.steps_together
                or waited <= IDLE_SHARE * (now - since)):
            return
        self._hh_idle_warned = True
        warnings.warn(f"this rank waited {waited:.1f} s of the {now - since:.1f} s since the last sync_model() for "
                      f"slower ranks in sync_model(): every rank took the same share of the data (torch's "
                      f"DistributedSampler), so the fast ranks idle at each epoch's end. Use "
                      f"hh.DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank()) as the loader's "
                      f"sampler: it binds to this optimizer and splits every epoch by the ranks' measured speed",
                      stacklevel=3)
