"""``hh.DistributedOptimizer``: Horovod's one-line optimizer wrapper, with a synchronisation strategy.

As in Horovod, the wrapper is a factory that builds a subclass of the user's optimizer class
(``isinstance(opt, torch.optim.SGD)`` stays true). The strategy owns the schedule and the runtime
(``HeteroController``) carries it out; the wrapper only reports steps.
"""
import time
import warnings

import torch

import horovod.torch as hvd
from horovod.torch.compression import Compression
from horovod.torch.optimizer import _DistributedOptimizer

from horovod_hetero.runtime.collectives import DEFAULT_TIMEOUT_S, call_with_timeout
from horovod_hetero.runtime.controller import HeteroController, ring_bytes
from horovod_hetero.strategies.base import check_strategy
from horovod_hetero.torch.collectives import TorchCollectives, TorchModel, wait
from horovod_hetero.validation import check_int

_STATE_KEY = "horovod_hetero"


def _named(named, what, fallback):
    """List of (name, tensor), validated like Horovod does for named_parameters."""
    if named is None:
        return fallback
    try:
        named = list(named)
    except TypeError:
        named = None
    if named is None or any(not (isinstance(p, tuple) and len(p) == 2) for p in named):
        raise ValueError(f"{what} must be a sequence of (name, tensor) tuples, "
                         f"usually produced by model.{what}()")
    names = [n for n, _ in named]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"names in {what} must be unique; duplicates: {', '.join(dups)}")
    return sorted(named, key=lambda item: item[0])


class _HeteroMethods:
    """Methods shared by both optimizer kinds; copied into the dynamic class."""

    def _hh_setup(self, strategy, named_parameters, named_buffers, telemetry, slowdown, collectives):
        unnamed = [(f"param.{i}.{j}", p) for i, g in enumerate(self.param_groups)
                   for j, p in enumerate(g["params"])]
        params = _named(named_parameters, "named_parameters", unnamed)
        known = {id(p) for _, p in params}
        if any(id(p) not in known for _, p in unnamed):
            raise ValueError("named_parameters was given, but one or more optimizer parameters are "
                             "not in it; pass model.named_parameters() of the optimized model")
        buffers = [(n, b) for n, b in _named(named_buffers, "named_buffers", []) if b.is_floating_point()]
        self._hh_collectives = collectives
        grads = sum(p.numel() * p.element_size() for _, p in params if p.requires_grad)
        self._hh_grad_bytes = ring_bytes(grads, collectives.size)     # Synchronous: one gradient allreduce
        model = TorchModel([p.data for _, p in params] + [b.data for _, b in buffers])
        self._hh = HeteroController(strategy, collectives, model, telemetry, slowdown)
        self._hh.start()

    @property
    def strategy(self):
        return self._hh.strategy

    @property
    def telemetry(self):
        """This rank's ``Telemetry``; ``opt.telemetry.annotate(loss=..., samples=...)`` adds fields."""
        return self._hh.telemetry

    def sync_model(self):
        """Average the model across the process set now; every rank must call it.

        A rank that calls it early (it ran out of data) keeps joining the other ranks'
        averaging rounds until they call it too. On return every rank holds bit-identical
        parameters and floating-point buffers, and what the strategy opened (servers, threads,
        sockets) is closed; the next ``step()`` opens it again.
        """
        self._hh.finish()

    def state_dict(self):
        state = super(self.__class__, self).state_dict()
        state[_STATE_KEY] = self._hh.state_dict()
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        hetero = state_dict.pop(_STATE_KEY, None)
        self._hh_load_base(state_dict)
        if hetero is not None:
            self._hh.load_state_dict(hetero)


class _LocalOptimizer(_HeteroMethods):
    """Local steps with the user's optimizer; the model is averaged when the strategy says so."""

    def step(self, closure=None):
        loss = super(self.__class__, self).step(closure)
        self._hh.after_step()
        return loss

    def _hh_load_base(self, state_dict):
        super(self.__class__, self).load_state_dict(state_dict)


class _SynchronousOptimizer(_HeteroMethods):
    """``hvd.DistributedOptimizer`` itself, plus telemetry, slowdown and sync_model()."""

    def step(self, closure=None):
        t0 = time.perf_counter()
        if self._should_synchronize:
            self.synchronize()
        comm = time.perf_counter() - t0
        with self.skip_synchronize():
            loss = _DistributedOptimizer.step(self, closure)
        self._hh.after_step(comm_s=comm, bytes_sent=self._hh_grad_bytes)
        return loss

    def sync_model(self):
        """Wait for every rank (``hvd.join``), then make every rank's model bit-identical.

        Ranks with fewer batches call it early and stay in ``hvd.join()`` (taking part in the
        other ranks' gradient allreduces with zeros) until all have called it; the model of the
        rank that joined last is then broadcast. On a non-global process set (``hvd.join`` is
        global) every rank must call it at the same step, and the model is averaged.
        """
        collectives = self._hh_collectives
        if collectives.process_set != hvd.global_process_set:
            return self._hh.finish()
        t0 = time.perf_counter()
        last = call_with_timeout(hvd.join, collectives.timeout, "hvd.join in sync_model")
        handles = [hvd.broadcast_async_(t, root_rank=last, name=f"horovod_hetero.sync.{i}")
                   for i, t in enumerate(self._hh.model.tensors())]
        for h in handles:
            wait(h, collectives.timeout, "sync_model broadcast")
        self._hh.add_comm(time.perf_counter() - t0)
        self._hh.close()

    def _hh_load_base(self, state_dict):
        _DistributedOptimizer.load_state_dict(self, state_dict)


def _methods(*classes):
    out = {}
    for cls in classes:
        out.update({k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")})
    return out


def DistributedOptimizer(optimizer, named_parameters=None, strategy=None,
                         compression=Compression.none, backward_passes_per_step=1, op=hvd.Average,
                         gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                         process_set=hvd.global_process_set, named_buffers=None, telemetry=None,
                         slowdown=None, timeout=DEFAULT_TIMEOUT_S):
    """Wrap a torch optimizer so that training follows a heterogeneity-aware strategy.

    With ``strategy=Synchronous()`` (the default) this *is* ``hvd.DistributedOptimizer``
    (same hooks, same results bit for bit). With a model-averaging strategy such as
    ``LocalSGD`` each rank steps its own replica with the user's optimizer and the model is
    averaged (one fused ``grouped_allreduce``) when the strategy says so. The argument names
    are Horovod's; ``compression``, ``backward_passes_per_step``, ``gradient_predivide_factor``,
    ``groups`` and ``sparse_as_dense`` apply to gradient averaging (``Synchronous``) only.

    Args:
        optimizer: the ``torch.optim.Optimizer`` to wrap.
        named_parameters: ``model.named_parameters()`` (names the collectives; optional).
        strategy: ``Synchronous()`` (default), ``LocalSGD(period, warmup_steps)``,
            ``ESync(global_lr, mode)``, ``WAGMA(group_size, sync_period)``, or any ``Strategy``.
        process_set: Horovod process set to synchronise over (default: all ranks).
        named_buffers: ``model.named_buffers()``: floating-point buffers (BatchNorm running
            statistics) are averaged with the parameters; without it only parameters are.
        telemetry: directory for per-rank JSON-lines step records (default
            ``$HOROVOD_HETERO_TELEMETRY``; unset: kept in memory).
        slowdown: per-rank slowdown factors, e.g. ``"1,1,1,4"`` (default
            ``$HOROVOD_HETERO_SLOWDOWN``) to simulate a heterogeneous cluster.
        timeout: seconds any collective may take before ``CollectiveTimeoutError``.

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
        opt.sync_model()                     # every rank: identical model afterwards
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    strategy = check_strategy(strategy)
    backward_passes_per_step = check_int("backward_passes_per_step", backward_passes_per_step, 1)
    collectives = TorchCollectives(process_set, timeout, owner="horovod_hetero.torch.DistributedOptimizer")
    named_parameters = None if named_parameters is None else list(named_parameters)
    name = optimizer.__class__.__name__
    if strategy.averages_gradients:
        cls = type(name, (optimizer.__class__,),
                   _methods(_DistributedOptimizer, _HeteroMethods, _SynchronousOptimizer))
        opt = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
                  gradient_predivide_factor, groups, sparse_as_dense, collectives.process_set)
    else:
        if op != hvd.Average:
            raise ValueError(f"op must be hvd.Average with {type(strategy).__name__} (models are averaged)")
        if backward_passes_per_step != 1:
            warnings.warn("backward_passes_per_step has no effect with model averaging: "
                          "call step() after the backward passes you want to accumulate")
        cls = type(name, (optimizer.__class__,), _methods(_HeteroMethods, _LocalOptimizer))
        opt = cls(optimizer.param_groups)
    opt._hh_setup(strategy, named_parameters, named_buffers, telemetry, slowdown, collectives)
    return opt
