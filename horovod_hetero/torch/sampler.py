"""``hh.DistributedSampler``: torch's ``DistributedSampler``, with each rank's share of the epoch
proportional to its speed; with ``batch_size``, a batch sampler that hands each rank its batch of every
step (``Balanced``'s sizes)."""
from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator, Sized
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np
import numpy.typing as npt
import torch

import horovod.torch as hvd

from horovod_hetero.rules.partition import (epoch_indices, epoch_split, rank_part, resplit_rest, step_batch,
                                            step_times_of, steps_per_epoch)
from horovod_hetero.strategies.balanced import even_split
from horovod_hetero.validation import check_bool, check_int
from horovod_hetero.errors import troubleshooting

if TYPE_CHECKING:
    from horovod_hetero.runtime.controller import HeteroController
    from horovod_hetero.runtime.runner import Runner


class BoundOptimizer(Protocol):
    """What a sampler needs of the ``hh.DistributedOptimizer`` it binds to (``torch.optimizer``, which
    imports this module): the flag it sets; it reads the optimizer's controller (``_hh``) if there is one."""

    _hh_split_by_speed: bool


#: every ``hh.DistributedOptimizer`` of this process (weakly: an optimizer the user dropped is not held)
_optimizers: weakref.WeakSet[BoundOptimizer] = weakref.WeakSet()


def register_optimizer(optimizer: BoundOptimizer) -> None:
    """An ``hh.DistributedOptimizer`` was built: a sampler built without one binds to it."""
    _optimizers.add(optimizer)


def _the_optimizer() -> BoundOptimizer | None:
    """The process's one ``hh.DistributedOptimizer`` (None before there is one); several: ``ValueError``."""
    if len(_optimizers) > 1:
        gc.collect()                    # optimizers the user dropped (reference cycles hold them)
    live = list(_optimizers)
    if len(live) > 1:
        raise ValueError(f"this hh.DistributedSampler is bound to no optimizer, and {len(live)} "
                         f"hh.DistributedOptimizers live in this process: bind it to the one that trains on its "
                         f"batches, hh.DistributedOptimizer(..., sampler=sampler)\n"
                         f"{troubleshooting('troubleshooting-sampler-unbound')}")
    return live[0] if live else None


class DistributedSampler(torch.utils.data.Sampler):
    """Every sample once per epoch; each rank takes a share proportional to its measured speed.

    With ``torch.utils.data.DistributedSampler`` every rank gets the same number of batches, so a
    heterogeneity-aware strategy's fast ranks finish the epoch first and wait for the slowest in
    ``sync_model()``. This sampler reads every rank's speed from the rounds of the optimizer it is
    bound to (each round carries every rank's mean step time, identical on every rank: no extra
    message) and splits the epoch's permutation into contiguous shares proportional to 1 / step
    time (``rules.partition``). The first epoch begins split evenly; with ``loader_batch_size``,
    once the rounds have measured every rank's speed (at the second round that measures them all:
    the first holds the start-up), what is left of it is split by speed (every rank keeps what it
    drew). Call
    ``opt.sync_model()`` at the end of every epoch (before ``set_epoch``): then every rank has seen
    the same rounds and computes the same partition. With ``Synchronous`` (no rounds) the split stays
    even, as ``DistributedSampler``'s.

    With ``batch_size`` it is a *batch sampler* (``DataLoader(dataset, batch_sampler=sampler)``): every step
    takes the next ``global batch`` samples of the epoch's permutation (the same on every rank) and
    each rank its part of them, so every rank takes the same number of steps per epoch (as synchronous
    steps need) and every sample is used once (the epoch's last global batch is completed from its
    start, as torch's ``DistributedSampler`` pads). The parts are the bound optimizer's strategy's
    batch sizes for each step (``Balanced``: proportional to speed, recomputed every
    ``rebalance_every`` steps; the global batch is the strategy's, by default ``num_replicas *
    batch_size``), or ``batch_size`` each for any other strategy.

    Args:
        dataset: the dataset (only ``len(dataset)`` is used).
        num_replicas, rank: the process set's size and this rank's place in it (default: Horovod's
            ``hvd.size()`` and ``hvd.rank()`` whenever the sampler splits an epoch, so after
            ``hvd.elastic.run``'s reset it splits among the new ranks).
        shuffle: a new permutation every epoch (``seed`` and the epoch), the same on every rank.
        seed: the permutation's seed; the same on every rank.
        optimizer: the ``hh.DistributedOptimizer`` whose rounds measure the speeds. Default: the one
            ``hh.DistributedOptimizer(..., sampler=this)`` names, else the process's only one, bound
            when an epoch is first split (several in the process: ``ValueError``, name it).
        batch_size: ``None`` (a sampler of indices), or the samples per step of one rank (an int >= 1): a
            batch sampler, whose batches the bound strategy may size per rank (``Balanced``).
        loader_batch_size: the ``batch_size`` of the ``DataLoader`` that draws from this sampler (an
            int >= 1, optional): every rank's share is then a whole number of batches but the last
            rank's, so no other rank ends its epoch on a short batch (shares follow the speeds and
            change every epoch: without it any rank's last batch may hold a single sample, which
            ``BatchNorm`` refuses in training). With it, the first epoch's rest is split by speed
            once the rounds have measured every rank (each rank counted as having drawn this many
            samples a step); without it the first epoch stays split evenly.

    Example::

        sampler = hh.DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(), loader_batch_size=32)
        loader = torch.utils.data.DataLoader(train_set, batch_size=32, sampler=sampler)
        opt = hh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      strategy=hh.ESync())       # the process's one: the sampler binds to it
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
            opt.sync_model()                 # every rank at the same round: the next split agrees
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, optimizer: BoundOptimizer | None = None, batch_size: int | None = None,
                 loader_batch_size: int | None = None) -> None:
        if not hasattr(dataset, "__len__"):
            raise TypeError(f"dataset must have a length (a map-style dataset), got {type(dataset).__name__}")
        self.dataset = dataset
        self._num_replicas = None if num_replicas is None else check_int("num_replicas", num_replicas, 1)
        self._rank = None if rank is None else check_int("rank", rank, 0, self.num_replicas - 1)
        self.shuffle = check_bool("shuffle", shuffle)
        self.seed = check_int("seed", seed)
        self.epoch = 0
        self._optimizer: BoundOptimizer | None = None
        if optimizer is not None:
            self.optimizer = optimizer
        self.batch_size = None if batch_size is None else check_int("batch_size", batch_size, 1)
        self.loader_batch_size = (1 if loader_batch_size is None
                                  else check_int("loader_batch_size", loader_batch_size, 1))
        self._per_step = loader_batch_size is not None      # samples a step: the first epoch's rest may split
        self.drawn = 0                  # batches handed out (a loader that never draws them is named)
        self._share: list[int] | None = None

    @property
    def optimizer(self) -> BoundOptimizer | None:
        """The ``hh.DistributedOptimizer`` whose rounds measure the speeds (bound at first need, see ``Args``)."""
        if self._optimizer is None:
            found = _the_optimizer()
            if found is not None:
                self.optimizer = found
        return self._optimizer

    @optimizer.setter
    def optimizer(self, optimizer: BoundOptimizer | None) -> None:
        self._optimizer = optimizer
        if optimizer is not None:
            optimizer._hh_split_by_speed = True

    @property
    def num_replicas(self) -> int:
        return hvd.size() if self._num_replicas is None else self._num_replicas

    @property
    def rank(self) -> int:
        return hvd.rank() if self._rank is None else self._rank

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s permutation and the speeds measured so far for the next iteration."""
        self.epoch = check_int("epoch", epoch)
        self._share = None

    def step_times(self) -> npt.NDArray[np.float64]:
        """Every rank's seconds per step, as the optimizer's rounds measured it (``runtime.speeds``; NaN: not
        measured yet, e.g. before any round)."""
        controller = getattr(self.optimizer, "_hh", None)
        try:
            return step_times_of(None if controller is None else controller.step_times, self.num_replicas)
        except ValueError as e:
            raise ValueError(f"num_replicas={self.num_replicas} does not match the optimizer's ranks: {e}") from None

    def _runner(self) -> Runner | None:
        """The runner of the bound optimizer's strategy (``runtime.runner``), or None without one."""
        controller = getattr(self.optimizer, "_hh", None)
        return getattr(controller, "runner", None)

    @property
    def global_batch(self) -> int:
        """Samples per step over every rank (batch mode): the bound strategy's, else ``num_replicas *
        batch_size``."""
        runner, batch_size = self._runner(), cast(int, self.batch_size)      # batch mode: an int
        return (runner.global_batch(batch_size, self.num_replicas) if runner is not None
                else self.num_replicas * batch_size)

    def batch_sizes(self, step: int) -> tuple[int, ...]:
        """Every rank's batch at local step ``step`` (1-based): the bound strategy's plan, else an even split."""
        runner = self._runner()
        sizes = None if runner is None else runner.batch_sizes(step, self.num_replicas)
        if sizes is None:
            return even_split(self.global_batch, self.num_replicas)
        if len(sizes) != self.num_replicas:
            raise ValueError(f"num_replicas={self.num_replicas} does not match the {len(sizes)} ranks the "
                             f"optimizer plans batches for")
        return sizes

    def _batches(self) -> Iterator[list[int]]:
        order = (torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + self.epoch))
                 if self.shuffle else torch.arange(len(self.dataset))).tolist()
        runner = self._runner()
        start = runner.strategy.step if runner is not None else 0
        for step in range(len(self)):
            batch = step_batch(order, step, self.batch_sizes(start + step + 1), self.rank)
            self.drawn += 1
            yield batch

    def _current(self) -> list[int]:
        if self._share is None:
            self._share = epoch_indices(len(self.dataset), self.step_times(), self.rank, self.epoch, self.seed,
                                        self.shuffle, multiple=self.loader_batch_size)
        return self._share

    def __iter__(self) -> Iterator[int] | Iterator[list[int]]:
        if self.batch_size is not None:
            return self._batches()
        controller = getattr(self.optimizer, "_hh", None)
        if controller is None or controller.speeds_measured is not None or not self._per_step:
            share, self._share = self._current(), None      # the next iteration splits with newer speeds
            return iter(share)
        self._share = None
        return self._resplit_when_measured(controller)

    def _resplit_when_measured(self, controller: HeteroController) -> Iterator[int]:
        """This rank's share of the epoch, split with the speeds known now (none, in a first epoch), until
        the controller has measured every rank (``speeds_measured``); from then on what every rank has
        left, split by speed (``rules.partition.resplit_rest``). Every rank has drawn at least
        ``loader_batch_size`` samples a step by then (counted from the rounds: no message). With less
        than half of any rank's part left the split stays (a rank may have drawn it all)."""
        multiple = self.loader_batch_size
        order, counts = epoch_split(len(self.dataset), self.step_times(), self.epoch, self.seed, self.shuffle,
                                    multiple)
        start: npt.NDArray[np.int64] | None
        rank, start = self.rank, controller.steps_seen
        share = rank_part(order, counts, rank)
        i = 0
        while i < len(share):
            if start is not None and controller.speeds_measured is not None:
                steps, step_s = controller.speeds_measured
                drawn = (steps - start) * multiple
                if len(drawn) == len(counts) and (counts - drawn >= counts // 2).all():
                    rest = share[:drawn[rank]] + resplit_rest(order, counts, drawn, step_s, rank, multiple)
                    share = rest if len(rest) >= i else share[:i]    # drew past its new count: it ends here
                start = None
            yield share[i]
            i += 1

    def __len__(self) -> int:
        if self.batch_size is not None:
            return steps_per_epoch(len(self.dataset), self.global_batch)
        return len(self._current())
