"""``hh.DistributedOptimizer``: Horovod's one-line optimizer wrapper, with a synchronisation strategy.

As in Horovod, the wrapper is a factory that builds a subclass of the user's optimizer class
(``isinstance(opt, torch.optim.SGD)`` stays true). The strategy owns the schedule and the runtime
(``HeteroController``) carries it out; the wrapper only reports steps.
"""
import contextlib
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import horovod.torch as hvd
from horovod.torch.compression import Compression

from horovod_hetero.common.compat import torch_join_async, torch_optimizer_bases
from horovod_hetero.common.options import check_run_options
from horovod_hetero.common.ranks import follow_ranks
from horovod_hetero.runtime.seams import DEFAULT_TIMEOUT_S
from horovod_hetero.runtime.controller import HeteroController, OutsideController, ring_bytes
from horovod_hetero.strategies.aggregation import check_aggregate
from horovod_hetero.strategies.base import GradientAveraging, GradientWeighting
from horovod_hetero.strategies.registry import check_strategy
from horovod_hetero.torch.adapter import TorchCollectives, TorchModel, wait, wait_done
from horovod_hetero.torch.sampler import DistributedSampler, register_optimizer
from horovod_hetero.validation import check_bool, check_float, check_int
from horovod_hetero.errors import troubleshooting

_STATE_KEY = "horovod_hetero"
#: sync_model() warns once (no ``hh.DistributedSampler`` bound) when a rank waited there for more than this
#: share of the time since the previous sync_model(): an even split of the epoch left it idle
IDLE_SHARE = 0.25
_DistributedOptimizer, _DistributedAdasumOptimizer = torch_optimizer_bases()


def _named(named, what, fallback):
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


def _named_tensors(optimizer, named_parameters, named_buffers):
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

    def __init__(self, optimizer):
        self._optimizer = optimizer

    def __reduce__(self):
        state = self._optimizer._hh.state_dict()          # None on a rank outside the process set
        return (dict, (state,)) if state is not None else (type(None), ())

    def __repr__(self):
        return f"<horovod_hetero counters {self._optimizer._hh.state_dict()}>"


class _HeteroMethods:
    """Methods shared by every optimizer kind; copied into the dynamic class."""

    # what the dynamic class has from the optimizer it wraps, from its kind's class and from the builder
    param_groups: list[dict[str, Any]]
    _hh_grad_payload: int
    _hh_sampler: Any
    _hh_local_step: Callable[[Any], Any]

    def _hh_setup(self, membership, counts):
        """``membership``: the ``Membership`` that gives the controller for Horovod's current ranks;
        ``counts``: the integer buffers, which sync_model() copies from one rank."""
        self._hh_membership = membership
        self._hh_counts = counts
        self._hh_synced_at = time.monotonic()
        self._hh_idle_warned = False
        self._hh_split_by_speed = False         # set when an hh.DistributedSampler binds to it
        self._hh_comm = 0.0
        self._hh_counters = _Counters(self)
        self.param_groups[0][_STATE_KEY] = self._hh_counters
        self._hh_membership.current()          # built now: a size the strategy refuses fails here

    @property
    def _hh(self):
        """The controller for Horovod's current ranks (a new one after ``hvd.elastic``'s reset)."""
        return self._hh_membership.current()

    def _hh_adopt(self):
        """Take counters that arrived in the param group (broadcast, checkpoint, elastic restore)."""
        group = self.param_groups[0]
        state = group.get(_STATE_KEY)
        if state is self._hh_counters:
            return
        if state is not None:
            self._hh.load_state_dict(state)
        group[_STATE_KEY] = self._hh_counters

    @property
    def strategy(self):
        return self._hh.strategy

    @property
    def telemetry(self):
        """This rank's ``Telemetry``; ``opt.telemetry.annotate(loss=..., samples=...)`` adds fields."""
        return self._hh.telemetry

    def report_loss(self, loss):
        """This step's training loss (a number or a one-element tensor) for the strategy (ADSP's
        search) and the telemetry: ``opt.telemetry.annotate(loss=...)``. Called before ``step()`` it
        goes with that step, after it with the next one."""
        from horovod_hetero.validation import check_loss
        self.telemetry.annotate(loss=check_loss(loss))

    def step(self, closure=None):
        with self._hh_membership.guard() as hh:
            self._hh_adopt()
            hh.start()                  # opens at the first step (no collective when built: hvd.elastic's rule)
            loss = self._hh_local_step(closure)
            comm, self._hh_comm = self._hh_comm, 0.0
            # a gradient allreduce's bytes from this rank (telemetry)
            hh.after_step(comm_s=comm, bytes_sent=ring_bytes(self._hh_grad_payload, hh.size or 1))
        return loss

    def sync_model(self):
        """Average the model across the process set now; every rank must call it.

        A rank that calls it early (it ran out of data) keeps joining the other ranks'
        averaging rounds until they call it too. On return every rank holds bit-identical
        parameters and buffers (those given as ``named_buffers``), and what the strategy opened
        (servers, threads, sockets) is closed; the next ``step()`` opens it again. Call it before
        collectives of your own (a metric ``hvd.allreduce``, ``hvd.broadcast_*``): it brings every
        rank to the same round. A rank that waited here for over a quarter of the time since the
        last call while no ``hh.DistributedSampler`` was bound warns once (an even split of the
        epoch leaves the fast ranks idle).
        """
        t0 = time.monotonic()
        with self._hh_membership.guard() as hh:
            self._hh_adopt()
            hh.finish()
            self._hh_copy_counts(hh, None)
        self._hh_check_idle(t0)

    def _hh_copy_counts(self, hh, root):
        """Integer buffers (BatchNorm's ``num_batches_tracked``) are not averaged: every rank takes those of
        ``root`` (default: the process set's first rank; under ``Synchronous`` the rank that joined last,
        whose model is broadcast), so the whole ``state_dict()`` is identical."""
        collectives = hh.collectives
        if not self._hh_counts or collectives is None:
            return
        counts = collectives.broadcast(self._hh_counts, collectives.root if root is None else root,
                                       name="horovod_hetero.sync.counts",
                                       what="sync_model's broadcast of the integer buffers")
        with torch.no_grad():
            for mine, theirs in zip(self._hh_counts, counts):
                mine.copy_(theirs)

    def _hh_check_idle(self, started):
        """Warn once if this rank waited in sync_model() for over ``IDLE_SHARE`` of the time since the last
        one while the epoch was split evenly (no ``hh.DistributedSampler`` bound to this optimizer)."""
        now, since = time.monotonic(), self._hh_synced_at
        self._hh_synced_at = now
        waited = now - started
        if (self._hh_idle_warned or self._hh_split_by_speed or isinstance(self._hh.strategy, GradientAveraging)
                or waited <= IDLE_SHARE * (now - since)):
            return
        self._hh_idle_warned = True
        warnings.warn(f"this rank waited {waited:.1f} s of the {now - since:.1f} s since the last sync_model() for "
                      f"slower ranks in sync_model(): every rank took the same share of the data (torch's "
                      f"DistributedSampler), so the fast ranks idle at each epoch's end. Use "
                      f"hh.DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank()) as the loader's "
                      f"sampler: it binds to this optimizer and splits every epoch by the ranks' measured speed",
                      stacklevel=3)

    def state_dict(self):
        self._hh_adopt()
        state = super(self.__class__, self).state_dict()  # type: ignore[misc]  # the wrapped optimizer's
        state["param_groups"][0][_STATE_KEY] = self._hh.state_dict()      # a snapshot, not the live object
        return state


class _LocalOptimizer(_HeteroMethods):
    """Local steps with the user's optimizer; the model is averaged when the strategy says so.

    Horovod's gradient API is kept, with the gradients this rank's own: ``synchronize()`` has nothing
    to wait for, ``skip_synchronize()`` is a context as Horovod's, so clipping and ``torch.amp``'s
    ``GradScaler`` run as Horovod documents them (``synchronize()``; unscale and clip; ``with
    skip_synchronize(): step()``); gradients accumulate over backward passes until ``step()``, which
    is what ``backward_passes_per_step`` asks of Horovod."""

    _hh_grad_payload = 0
    backward_passes_per_step = 1

    def synchronize(self):
        """Nothing to wait for: under model averaging each rank steps with its own gradients."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        """As Horovod's (``optimizer.synchronize()``, then ``with optimizer.skip_synchronize(): optimizer.step()``)."""
        yield

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = check_int("passes", passes, 1)

    def _hh_local_step(self, closure):
        return super(self.__class__, self).step(closure)


class _SynchronousOptimizer(_HeteroMethods):
    """Horovod's own optimizer (``_hh_base``: gradient averaging, or Adasum), plus telemetry,
    slowdown and ``sync_model()``; every method it does not name is Horovod's."""

    # Horovod's: the class it builds on (set by the builder), the pending allreduces and parameter names
    _hh_base: Any
    _handles: dict[Any, Any]
    _parameter_names: dict[Any, str]

    def _allreduce_grad_async(self, p):
        # Horovod's gradient hooks enqueue here during loss.backward(), outside step()'s guard: a
        # lost rank must fail there as it fails in step() (RankLostError, or elastic's reset)
        try:
            self._hh_session_names()
            self._hh_before_enqueue([p])
            return self._hh_base._allreduce_grad_async(self, p)
        except Exception as e:
            self._hh_membership.reraise(e)

    def _grouped_allreduce_grad_async(self, ps):
        try:
            self._hh_session_names()
            self._hh_before_enqueue(ps)
            return self._hh_base._grouped_allreduce_grad_async(self, ps)
        except Exception as e:
            self._hh_membership.reraise(e)

    def _hh_before_enqueue(self, ps):
        """What a variant does to the gradients of ``ps`` before Horovod enqueues them (nothing here)."""

    def _hh_session_names(self):
        """Horovod names each gradient allreduce by its parameter (``_parameter_names``): give those
        names the session of the controller for Horovod's current ranks (``Collectives.session``), as
        the rounds' names have it, opening it first (a new one after ``hvd.elastic``'s reset starts at
        the first hook of ``loss.backward()``). Under the last session's names, an allreduce Horovod
        took as its loop ended (never completed, and kept across the reset) would meet the new one of
        the same name: Horovod refuses the name, or pairs the two across ranks and crashes."""
        hh = self._hh
        if hh.transports is None:
            self._hh_adopt()
            hh.start()
        session = getattr(hh.collectives, "session", "")
        if session != self._hh_names_session:
            if self._hh_names is None:
                self._hh_names = dict(self._parameter_names)
            self._parameter_names = {p: name + session for p, name in self._hh_names.items()}
            self._hh_names_session = session

    #: Horovod's names of the parameters (None until a session renames them) and the session they carry
    _hh_names: dict[Any, str] | None = None
    _hh_names_session = ""

    def synchronize(self):
        t0 = time.perf_counter()
        try:
            self._hh_wait_allreduces()
            return self._hh_base.synchronize(self)
        finally:
            self._hh_comm += time.perf_counter() - t0

    def _hh_wait_allreduces(self):
        """Poll the gradient allreduces the hooks started until they are done (``wait_done``), before
        Horovod's ``synchronize`` collects them. Horovod's own wait is a loop of ``sched_yield`` calls
        that takes the GIL back each turn: where ranks outnumber cores, the waiting ranks take the
        cores the computing ranks and Horovod's background threads need (measured on 2 cores and 4
        ranks at 1,1,1,4: steps stalled for seconds, 7-12 s of every 30 s, and none with polling).
        Under MPI, whose collectives have no timeout, it also bounds the wait by ``timeout``: a rank
        that stopped answering is a ``CollectiveTimeoutError``, not a hang."""
        collectives = self._hh.collectives
        if collectives is None:
            return
        for handle, _ in list(self._handles.values()):
            if isinstance(handle, int):
                wait_done(handle, collectives.timeout, "the gradient allreduce")

    def _hh_local_step(self, closure):
        return self._hh_base.step(self, closure)

    def sync_model(self):
        """Wait for every rank (``hvd.join``), then make every rank's model bit-identical.

        Ranks with fewer batches call it early and stay in ``hvd.join()`` (taking part in the
        other ranks' gradient allreduces with zeros) until all have called it; the model of the
        rank that joined last is then broadcast. On a non-global process set (``hvd.join`` is
        global) every rank must call it at the same step, and the model is averaged.

        ``Balanced`` plans batches per window of steps: a rank that joined early takes part in the
        others' rebalancing rounds as absent (its plan is theirs), and leaves with the counters of
        the rank that joined last, so training again after it continues alike on every rank.
        """
        collectives = self._hh.collectives
        if collectives is None or collectives.process_set != hvd.global_process_set:
            return _HeteroMethods.sync_model(self)
        with self._hh_membership.guard() as hh:
            self._hh_adopt()
            t0 = time.perf_counter()
            last = int(collectives.polled(torch_join_async, "hvd.join in sync_model").item())
            handles = [hvd.broadcast_async_(t, root_rank=last, name=collectives.named(f"horovod_hetero.sync.{i}"))
                       for i, t in enumerate(hh.model.tensors())]
            for h in handles:
                wait(h, collectives.timeout, "sync_model broadcast")
            self._hh_copy_counts(hh, last)
            if isinstance(hh.strategy, GradientWeighting):
                counters = collectives.broadcast_object(hh.state_dict(), root=last, name="horovod_hetero.sync.counters",
                                                        what="sync_model broadcast of the counters")
                hh.load_state_dict(counters)
            hh.add_comm(time.perf_counter() - t0)
            hh.close()


class _WeightedGradients(_HeteroMethods):
    """Horovod's gradient sum with each rank's gradient scaled first by the strategy's weight for the
    step (``Balanced``: its share of the global batch; Horovod's ``op`` is ``Sum``), so the sum is the
    mean gradient of the union of the ranks' batches. The scale is one in-place pass over each gradient
    as its hook fires, before Horovod enqueues it."""

    def _hh_before_enqueue(self, ps):
        hh = self._hh
        weight = hh.strategy.gradient_weight(hh.rank, hh.size)
        for p in ps:
            if p.grad is not None:
                p.grad.mul_(weight)

    def step(self, closure=None):
        sampler = self._hh_sampler
        if sampler is not None and sampler.drawn == 0 and self._hh.strategy.step >= 1:
            raise ValueError(f"{type(self._hh.strategy).__name__} plans every rank's batch, but no batch was drawn "
                             f"from the bound sampler: build the loader as DataLoader(dataset, batch_sampler=sampler) "
                             f"(not sampler=), with the hh.DistributedSampler(dataset, batch_size=...) given to "
                             f"hh.DistributedOptimizer(..., sampler=sampler)\n{troubleshooting('troubleshooting-balanced-sampler')}")
        return _HeteroMethods.step(self, closure)


def _methods(*classes):
    out = {}
    for cls in classes:
        out.update({k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")})
    # Horovod's own optimizer classes live in horovod.torch.optimizer; Horovod's functions treat
    # only those as wrappers (broadcast_optimizer_state creates missing state with the *wrapped*
    # class's step: no collective, no counted step), so the wrapper is one of them too
    out["__module__"] = _DistributedOptimizer.__module__
    return out


def DistributedOptimizer(optimizer, named_parameters=None, strategy=None,
                         compression=Compression.none, backward_passes_per_step=1, op=hvd.Average,
                         gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                         process_set=hvd.global_process_set, named_buffers=None, telemetry=None,
                         slowdown=None, timeout=DEFAULT_TIMEOUT_S, num_groups=0, sampler=None, aggregate=None):
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

    Horovod's optimizer contract holds for every strategy: the class is one of Horovod's own
    (``hvd.broadcast_optimizer_state`` creates missing state with the wrapped class's ``step``,
    which is neither a collective nor a counted step), the strategy's counters and round number
    travel in ``param_groups[0]["horovod_hetero"]`` (broadcast by ``hvd.broadcast_optimizer_state``,
    kept by ``hvd.elastic.TorchState`` and checkpoints; a rank adopts counters that arrive there
    before its next step), and a rank outside ``process_set`` wraps and steps locally. Building it
    runs no collective (the strategy opens at the first step), and after ``hvd.elastic.run``'s reset
    the strategy goes on with the new ranks (``runtime.membership``).

    Args:
        optimizer: the ``torch.optim.Optimizer`` to wrap.
        named_parameters: ``model.named_parameters()`` (names the collectives; optional).
        strategy: ``Synchronous()`` (default), ``Balanced(global_batch, rebalance_every)``,
            ``LocalSGD(period, warmup_steps)``, ``ESync(mode)``, ``WAGMA(group_size, sync_period)``,
            or any ``ModelAveraging``/``GradientAveraging`` strategy.
        process_set: Horovod process set to synchronise over (default: all ranks).
        named_buffers: ``model.named_buffers()``: floating-point buffers (BatchNorm's running
            statistics) are averaged with the parameters and the others (``num_batches_tracked``)
            copied from one rank in ``sync_model()`` (the process set's first; under ``Synchronous``
            the one whose model it broadcasts), so the whole ``state_dict()`` is then identical on
            every rank; without it buffers stay each rank's own.
        telemetry: directory for per-rank JSON-lines step records (default
            ``$HOROVOD_HETERO_TELEMETRY``; unset: kept in memory).
        slowdown: per-rank slowdown factors, e.g. ``"1,1,1,4"`` (default
            ``$HOROVOD_HETERO_SLOWDOWN``) to simulate a heterogeneous cluster.
        timeout: seconds any collective may take before ``CollectiveTimeoutError``.
        num_groups: deprecated in Horovod (``groups``); accepted with its ``DeprecationWarning``.
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
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        opt = hh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      named_buffers=model.named_buffers(),
                                      strategy=hh.LocalSGD(period=8))
        for x, y in loader:                  # any number of batches per rank
            opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
        opt.sync_model()                     # every rank: identical state_dict() afterwards
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    strategy = check_strategy(strategy)
    aggregate = check_aggregate(aggregate, strategy)
    # the arguments first, as Horovod checks them: a bad one is a ValueError/TypeError even before hvd.init()
    if check_int("num_groups", num_groups, 0) != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning)
        groups = num_groups if groups is None else groups
    backward_passes_per_step = check_int("backward_passes_per_step", backward_passes_per_step, 1)
    check_bool("sparse_as_dense", sparse_as_dense)
    check_float("gradient_predivide_factor", gradient_predivide_factor, 0.0, min_exclusive=True)
    if op not in (hvd.Average, hvd.Sum, hvd.Adasum):
        raise ValueError(f"op must be hvd.Average, hvd.Sum or hvd.Adasum, got {op!r}")
    check_run_options(telemetry, slowdown)
    if gradient_predivide_factor != 1.0 and op != hvd.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    gradients = isinstance(strategy, GradientAveraging)          # Horovod allreduces them: its options apply
    weighted = isinstance(strategy, GradientWeighting)
    if not gradients and op != hvd.Average:
        raise ValueError(f"op must be hvd.Average with {type(strategy).__name__} (models are averaged); "
                         f"op=hvd.Adasum or hvd.Sum apply to gradients, with strategy=hh.Synchronous()\n"
                         f"{troubleshooting('troubleshooting-gradient-options')}")
    if not gradients:
        given = [name for name, changed in (("compression", compression is not Compression.none),
                                            ("gradient_predivide_factor", gradient_predivide_factor != 1.0),
                                            ("groups" if num_groups == 0 else "num_groups", groups is not None),
                                            ("sparse_as_dense", sparse_as_dense))
                 if changed]
        if given:
            raise ValueError(f"{', '.join(given)}: Horovod's options for the gradient allreduce, which "
                             f"{type(strategy).__name__} does not run (each rank steps with its own gradients and the "
                             f"model itself is averaged, in its own dtype): leave them at Horovod's defaults, or "
                             f"use strategy=hh.Synchronous()\n{troubleshooting('troubleshooting-gradient-options')}")
    params, buffers, counts = _named_tensors(optimizer, named_parameters, named_buffers)
    adasum = gradients and op == hvd.Adasum
    if adasum and process_set is not None and process_set != hvd.global_process_set:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    if sampler is not None and not isinstance(sampler, DistributedSampler):
        raise TypeError(f"sampler must be a horovod_hetero.torch.DistributedSampler, got {type(sampler).__name__}")
    if weighted:
        if op != hvd.Average or gradient_predivide_factor != 1.0:
            raise ValueError(f"op and gradient_predivide_factor are set by {type(strategy).__name__}, which weighs "
                             f"every rank's gradient by its share of the global batch: leave them at hvd.Average, 1.0")
        if sampler is None or sampler.batch_size is None:
            raise ValueError(f"{type(strategy).__name__} plans every rank's batch size: give sampler=hh.DistributedSampler("
                             f"dataset, batch_size=B) and build the loader as DataLoader(dataset, batch_sampler=sampler)\n"
                             f"{troubleshooting('troubleshooting-balanced-sampler')}")
    owner = "horovod_hetero.torch.DistributedOptimizer"
    collectives = TorchCollectives(process_set, timeout, owner=owner, members_only=False)
    named_parameters = None if named_parameters is None else params
    name = optimizer.__class__.__name__
    if gradients:
        adasum = adasum and hvd.size() > 1
        if adasum and not collectives.mpi:              # Horovod would fail at the first step, by name only
            raise ValueError("op=hvd.Adasum needs Horovod's MPI controller (Horovod runs Adasum over MPI only): "
                             "launch with horovodrun --mpi or mpirun, with a Horovod built with MPI; this job "
                             "runs on Gloo, where op must be hvd.Average or hvd.Sum\n" + troubleshooting("troubleshooting-adasum-gloo"))
        base = _DistributedAdasumOptimizer if adasum else _DistributedOptimizer
        mixins = (_WeightedGradients,) if weighted else ()
        cls = type(name, (optimizer.__class__,),
                   dict(_methods(base, _HeteroMethods, _SynchronousOptimizer, *mixins), _hh_base=base))
        if adasum:
            opt = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step)
        else:
            opt = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
                      hvd.Sum if weighted else op, gradient_predivide_factor, groups,
                      sparse_as_dense, collectives.process_set)
        opt._hh_grad_payload = sum(p.numel() * p.element_size() for _, p in params if p.requires_grad)
    else:
        cls = type(name, (optimizer.__class__,), _methods(_HeteroMethods, _LocalOptimizer))
        opt = cls(optimizer.param_groups)
        opt.backward_passes_per_step = backward_passes_per_step
    # model averaging packs the model into flat tensors; gradient averaging only broadcasts it in sync_model()
    model = TorchModel([p for _, p in params] + [b for _, b in buffers], flat=not gradients)

    first = [collectives]               # the first controller's; after an elastic reset, new ones

    def build(records):
        current = first.pop() if first else TorchCollectives(process_set, timeout, owner=owner, members_only=False)
        if not current.included:        # as Horovod: a non-member wraps, and steps locally
            return OutsideController(strategy, hvd.rank(), records)
        return HeteroController(strategy, current, model, records, slowdown, aggregate=aggregate)

    if sampler is not None and sampler.batch_size is not None and weighted:
        strategy.use_batch(sampler.batch_size, collectives.size)     # the global batch: ranks x the user's batch
    opt._hh_sampler = sampler
    opt._hh_setup(follow_ranks(hvd, process_set, telemetry, build), [b for _, b in counts])
    if sampler is not None:
        sampler.optimizer = opt
    register_optimizer(opt)
    return opt
