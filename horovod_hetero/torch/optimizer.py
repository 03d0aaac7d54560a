"""``hh.DistributedOptimizer``: Horovod's one-line optimizer wrapper, with a synchronisation strategy.

As in Horovod, the wrapper is a factory that builds a subclass of the user's optimizer class
(``isinstance(opt, torch.optim.SGD)`` stays true). The strategy owns the schedule; the wrapper
only counts steps and provides the fused averaging collective.
"""
import time
import warnings

import torch

import horovod.torch as hvd
from horovod.torch.compression import Compression
from horovod.torch.optimizer import _DistributedOptimizer

from horovod_hetero.common.controller import HeteroController, call_with_timeout, ring_bytes
from horovod_hetero.common.state_server import server_host
from horovod_hetero.common.strategy import check_strategy
from horovod_hetero.common.validation import check_float, check_int
from horovod_hetero.process_sets import GroupOpsBase

#: Seconds a collective may take before it is declared stuck (a dead or diverged rank).
DEFAULT_TIMEOUT_S = 300.0
_STATE_KEY = "horovod_hetero"


class CollectiveTimeoutError(RuntimeError):
    """A Horovod collective did not complete within the timeout."""


def wait(handle, timeout_s, what):
    """``hvd.synchronize(handle)``, but raise ``CollectiveTimeoutError`` after ``timeout_s`` seconds."""
    # Back off to 1 ms between polls: polling harder measurably slows training when ranks and
    # Horovod's background threads share cores (LocalSGD(1) step time +20% at a 0.1 ms cap).
    deadline = time.monotonic() + timeout_s
    pause = 0.0
    while not hvd.poll(handle):
        if time.monotonic() > deadline:
            raise CollectiveTimeoutError(
                f"{what} did not complete in {timeout_s:g} s: a rank may have died, or ranks stopped "
                f"entering the same rounds (every rank must call opt.sync_model() at the end). "
                f"Raise the limit with DistributedOptimizer(..., timeout=...).")
        time.sleep(pause)
        pause = min(2 * pause or 1e-5, 1e-3)
    return hvd.synchronize(handle)


class _GroupOps(GroupOpsBase):
    """WAGMA's group collectives over the optimizer's tensors (``self.model``)."""

    hvd = hvd

    def current(self):
        return self.model

    @torch.no_grad()
    def snapshot(self):
        return [t.clone() for t in self.model]

    @torch.no_grad()
    def allreduce(self, model, weight, control, ranks, name):
        sent = model if weight == 1.0 else [t * weight for t in model]
        ctl = torch.tensor(control, dtype=torch.float64)
        handle = hvd.grouped_allreduce_async(list(sent) + [ctl], op=hvd.Sum, name=name,
                                             process_set=self._sets[tuple(ranks)])
        out = wait(handle, self.timeout, "WAGMA group average")
        return out[:-1], out[-1].tolist()

    @torch.no_grad()
    def assign(self, summed, total, add_current=False):
        for t, s in zip(self.model, summed):
            if add_current:
                s.add_(t)
            t.copy_(s.div_(total))


def _require_init():
    if not hvd.is_initialized():
        raise RuntimeError("horovod_hetero.torch.DistributedOptimizer: Horovod is not initialized; "
                           "call hvd.init() before wrapping the optimizer")


def _named(named, what, fallback):
    """List of (name, tensor), validated like Horovod does for named_parameters."""
    if named is None:
        return fallback
    named = list(named)
    if any(not (isinstance(p, tuple) and len(p) == 2) for p in named):
        raise ValueError(f"{what} must be a sequence of (name, tensor) tuples, "
                         f"usually produced by model.{what}()")
    names = [n for n, _ in named]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"names in {what} must be unique; duplicates: {', '.join(dups)}")
    return sorted(named, key=lambda item: item[0])


class _HeteroMethods:
    """Methods shared by both optimizer kinds; copied into the dynamic class."""

    def _hh_setup(self, strategy, named_parameters, named_buffers, telemetry, slowdown, timeout):
        self._hh_timeout = timeout
        unnamed = [(f"param.{i}.{j}", p) for i, g in enumerate(self.param_groups)
                   for j, p in enumerate(g["params"])]
        params = _named(named_parameters, "named_parameters", unnamed)
        known = {id(p) for _, p in params}
        missing = [id(p) for _, p in unnamed if id(p) not in known]
        if missing:
            raise ValueError("named_parameters was given, but one or more optimizer parameters are "
                             "not in it; pass model.named_parameters() of the optimized model")
        buffers = [(n, b) for n, b in _named(named_buffers, "named_buffers", []) if b.is_floating_point()]
        self._hh_tensors = [p.data for _, p in params] + [b.data for _, b in buffers]
        ps = self._hh_process_set
        payload = sum(t.numel() * t.element_size() for t in self._hh_tensors)
        grads = sum(p.numel() * p.element_size() for _, p in params if p.requires_grad)
        self._hh_grad_bytes = ring_bytes(grads, ps.size())     # Synchronous: one gradient allreduce
        root = 0 if ps == hvd.global_process_set else ps.ranks[0]
        self._hh = HeteroController(
            strategy, self._hh_average, ps.size(), ps.rank(), payload, telemetry, slowdown,
            broadcast=lambda obj: call_with_timeout(
                lambda: hvd.broadcast_object(obj, root_rank=root, process_set=ps, name="horovod_hetero.broadcast"),
                timeout, "the broadcast of the state server's address"),
            host=server_host(hvd.local_size() == hvd.size()),
            model_ops=(self._hh_snapshot, self._hh_blend),
            group_ops=_GroupOps(self._hh_tensors, ps, timeout))

    @property
    def strategy(self):
        return self._hh.strategy

    @property
    def telemetry(self):
        """This rank's ``Telemetry``; ``opt.telemetry.annotate(loss=..., samples=...)`` adds fields."""
        return self._hh.telemetry

    def _hh_average(self, weight, control):
        """One fused weighted-average round: grouped allreduce (sum) of w*x and the control vector."""
        tensors = self._hh_tensors
        sent = tensors if weight == 1.0 else [t * weight for t in tensors]
        ctl = torch.tensor(control, dtype=torch.float64)
        handle = hvd.grouped_allreduce_async_(sent + [ctl], op=hvd.Sum, name="horovod_hetero.average",
                                              process_set=self._hh_process_set)
        wait(handle, self._hh_timeout, "model averaging round")
        total = ctl[0].item()
        if total > 0:
            with torch.no_grad():
                for t, s in zip(tensors, sent):
                    if s is t:
                        t.div_(total)
                    else:
                        t.copy_(s.div_(total))
        return ctl.tolist()

    def _hh_snapshot(self):
        self._hh_global = [t.clone() for t in self._hh_tensors]

    @torch.no_grad()
    def _hh_blend(self, lr):
        """w = w_t + lr (w - w_t); then w_t = w (ESync's global step size)."""
        for t, g in zip(self._hh_tensors, self._hh_global):
            t.sub_(g).mul_(lr).add_(g)
            g.copy_(t)

    def sync_model(self):
        """Average the model across the process set now; every rank must call it.

        A rank that calls it early (it ran out of data) keeps joining the other ranks'
        averaging rounds until they call it too. On return every rank holds bit-identical
        parameters and floating-point buffers.
        """
        self._hh.join()

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

    def __init__(self, params, process_set):
        super(self.__class__, self).__init__(params)
        self._hh_process_set = process_set

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
        if self._hh_process_set != hvd.global_process_set:
            return self._hh.join()
        t0 = time.perf_counter()
        last = call_with_timeout(hvd.join, self._hh_timeout, "hvd.join in sync_model")
        handles = [hvd.broadcast_async_(t, root_rank=last, name=f"horovod_hetero.sync.{i}")
                   for i, t in enumerate(self._hh_tensors)]
        for h in handles:
            wait(h, self._hh_timeout, "sync_model broadcast")
        self._hh.add_comm(time.perf_counter() - t0)

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
            ``ESync(global_lr, mode)``, ``WAGMA(group_size, sync_period)``.
        process_set: Horovod process set to synchronise over (default: all ranks).
        named_buffers: ``model.named_buffers()``: floating-point buffers (BatchNorm running
            statistics) are averaged with the parameters; without it only parameters are.
        telemetry: directory for per-rank JSON-lines step records (default
            ``$HOROVOD_HETERO_TELEMETRY``; unset: kept in memory).
        slowdown: per-rank slowdown factors, e.g. ``"1,1,1,4"`` (default
            ``$HOROVOD_HETERO_SLOWDOWN``) to simulate a heterogeneous cluster.
        timeout: seconds an averaging collective may take before ``CollectiveTimeoutError``.

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
    timeout = check_float("timeout", timeout, 0.0, min_exclusive=True)
    if not isinstance(process_set, hvd.ProcessSet):
        raise TypeError(f"process_set must be a horovod ProcessSet, got {type(process_set).__name__}")
    _require_init()
    if not process_set.included():
        raise ValueError("this rank is not in process_set; wrap the optimizer only on its members")
    named_parameters = None if named_parameters is None else list(named_parameters)
    name = optimizer.__class__.__name__
    if strategy.averages_gradients:
        cls = type(name, (optimizer.__class__,),
                   _methods(_DistributedOptimizer, _HeteroMethods, _SynchronousOptimizer))
        opt = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
                  gradient_predivide_factor, groups, sparse_as_dense, process_set)
        opt._hh_process_set = process_set
    else:
        if op != hvd.Average:
            raise ValueError(f"op must be hvd.Average with {type(strategy).__name__} (models are averaged)")
        if backward_passes_per_step != 1:
            warnings.warn("backward_passes_per_step has no effect with model averaging: "
                          "call step() after the backward passes you want to accumulate")
        cls = type(name, (optimizer.__class__,), _methods(_HeteroMethods, _LocalOptimizer))
        opt = cls(optimizer.param_groups, process_set)
    opt._hh_setup(strategy, named_parameters, named_buffers, telemetry, slowdown, timeout)
    return opt
