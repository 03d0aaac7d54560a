"""Synchronous data-parallel SGD: gradients averaged every step, as ``hvd.DistributedOptimizer``."""
from horovod_hetero.strategies.base import GradientAveraging


class Synchronous(GradientAveraging):
    """Plain synchronous data-parallel SGD: gradients averaged every step.

    The baseline every other strategy is measured against. On Horovod it *is*
    ``hvd.DistributedOptimizer`` (the torch wrapper builds on it: same hooks, same results bit
    for bit), so switching a script between synchronous training and any other strategy changes
    one argument. Its decision after every step is ``CONTINUE``: Horovod's gradient allreduce
    already synchronised the step (a ``GradientAveraging`` strategy).

    Example:
        >>> s = Synchronous()
        >>> s.after_step(), Synchronous.__bases__
        (CONTINUE, (<class 'horovod_hetero.strategies.base.GradientAveraging'>,))
    """
