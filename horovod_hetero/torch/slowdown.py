"""``hh.slow_down(optimizer)``: simulated heterogeneity for a plain ``hvd.DistributedOptimizer``."""
from __future__ import annotations

from typing import Any

import torch

import horovod.torch as hvd

from horovod_hetero.common.options import check_run_options, check_samples_known
from horovod_hetero.runtime.straggler import Pacer, Slowdown, SlowdownFactors
from horovod_hetero.validation import check_int


def slow_down(optimizer: torch.optim.Optimizer, slowdown: SlowdownFactors | Slowdown | None = None,
              batch_size: int | None = None) -> Pacer:
    """Make this rank's steps of ``optimizer`` slower as ``HOROVOD_HETERO_SLOWDOWN`` says.

    ``hh.DistributedOptimizer`` applies the slowdown itself; this gives a plain
    ``hvd.DistributedOptimizer`` (or any torch optimizer) the same, so a Synchronous baseline is
    measured under the same simulated cluster. The step's own work is timed from the end of the
    previous step to the start of ``step()`` (before Horovod waits for the gradient allreduce), and
    the sleep comes after ``step()``, so the next step's allreduces start late, as on a slower worker.

    Args:
        optimizer: a ``torch.optim.Optimizer`` (``hvd.DistributedOptimizer`` included).
        slowdown: factors as for ``hh.DistributedOptimizer`` (``"1,1,1,4"``) or a ``Slowdown``; ``None`` reads
            ``HOROVOD_HETERO_SLOWDOWN`` (and ``HOROVOD_HETERO_BASE_STEP_S``, ``..._RANDOM_DELAY``).
        batch_size: this rank's batch, an int >= 1, needed (and only used) where a step is padded by its
            samples (``HOROVOD_HETERO_SAMPLE_S``); every step counts as a full batch.

    Returns:
        the ``Pacer``; ``pacer.hooks`` are the torch hook handles (``.remove()`` them to stop).

    Example::

        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                       named_parameters=model.named_parameters())
        hh.slow_down(opt)            # HOROVOD_HETERO_SLOWDOWN=1,1,1,4 applies to this baseline too
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    check_run_options(None, slowdown)
    batch_size = None if batch_size is None else check_int("batch_size", batch_size, 1)
    check_samples_known(slowdown, batch_size)
    pacer = Pacer(slowdown if isinstance(slowdown, Slowdown) else Slowdown(hvd.rank(), slowdown, size=hvd.size()))
    def after_step(*_: Any) -> None:
        pacer.pad(samples=batch_size)

    pacer.hooks = (optimizer.register_step_pre_hook(lambda *_: pacer.stop()),
                   optimizer.register_step_post_hook(after_step))
    return pacer
