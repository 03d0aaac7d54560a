"""``hh.DistributedSampler``: torch's ``DistributedSampler``, with each rank's share of the epoch
proportional to its speed."""
import torch

import horovod.torch as hvd

from horovod_hetero.rules.partition import epoch_indices, step_times_of
from horovod_hetero.validation import check_bool, check_int


class DistributedSampler(torch.utils.data.Sampler):
    """Every sample once per epoch; each rank takes a share proportional to its measured speed.

    With ``torch.utils.data.DistributedSampler`` every rank gets the same number of batches, so a
    heterogeneity-aware strategy's fast ranks finish the epoch first and wait for the slowest in
    ``sync_model()``. This sampler reads every rank's speed from the rounds of the optimizer it is
    bound to (each round carries every rank's mean step time, identical on every rank: no extra
    message) and splits the epoch's permutation into contiguous shares proportional to 1 / step
    time (``rules.partition``). The first epoch, before any round, is split evenly. Call
    ``opt.sync_model()`` at the end of every epoch (before ``set_epoch``): then every rank has seen
    the same rounds and computes the same partition. With ``Synchronous`` (no rounds) the split stays
    even, as ``DistributedSampler``'s.

    Args:
        dataset: the dataset (only ``len(dataset)`` is used).
        num_replicas, rank: the process set's size and this rank's place in it (default
            ``hvd.size()``, ``hvd.rank()``).
        shuffle: a new permutation every epoch (``seed`` and the epoch), the same on every rank.
        seed: the permutation's seed; the same on every rank.
        optimizer: the ``hh.DistributedOptimizer`` whose rounds measure the speeds; or bind it later
            with ``hh.DistributedOptimizer(..., sampler=this)``.

    Example::

        sampler = hh.DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
        loader = torch.utils.data.DataLoader(train_set, batch_size=32, sampler=sampler)
        opt = hh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      strategy=hh.ESync(), sampler=sampler)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
            opt.sync_model()                 # every rank at the same round: the next split agrees
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, optimizer=None):
        if not hasattr(dataset, "__len__"):
            raise TypeError(f"dataset must have a length (a map-style dataset), got {type(dataset).__name__}")
        self.dataset = dataset
        self.num_replicas = hvd.size() if num_replicas is None else check_int("num_replicas", num_replicas, 1)
        self.rank = hvd.rank() if rank is None else check_int("rank", rank, 0, self.num_replicas - 1)
        self.shuffle = check_bool("shuffle", shuffle)
        self.seed = check_int("seed", seed)
        self.epoch = 0
        self.optimizer = optimizer
        self._share = None

    def set_epoch(self, epoch):
        """Use ``epoch``'s permutation and the speeds measured so far for the next iteration."""
        self.epoch = check_int("epoch", epoch)
        self._share = None

    def step_times(self):
        """Every rank's latest seconds per step (NaN: not measured yet, e.g. before any round)."""
        controller = getattr(self.optimizer, "_hh", None)
        try:
            return step_times_of(None if controller is None else controller.step_times, self.num_replicas)
        except ValueError as e:
            raise ValueError(f"num_replicas={self.num_replicas} does not match the optimizer's ranks: {e}") from None

    def _current(self):
        if self._share is None:
            self._share = epoch_indices(len(self.dataset), self.step_times(), self.rank, self.epoch, self.seed,
                                        self.shuffle)
        return self._share

    def __iter__(self):
        share, self._share = self._current(), None      # the next iteration splits with newer speeds
        return iter(share)

    def __len__(self):
        return len(self._current())
