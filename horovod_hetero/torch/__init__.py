"""PyTorch adapter: ``import horovod_hetero.torch as hh`` next to ``import horovod.torch as hvd``.

``hh.DistributedOptimizer`` loads its module on first use (PEP 562), so the Keras adapter on the
PyTorch backend, which needs only ``horovod_hetero.torch.adapter``, does not load the optimizer. Every
strategy class of ``strategies.registry.REGISTRY`` is ``hh.<its name>``, looked up when it is read.
"""
from typing import TYPE_CHECKING, Any

from horovod_hetero.common import compat  # noqa: F401  (checks Horovod's version here, at import)
from horovod_hetero.common.process_sets import wagma_process_sets  # noqa: F401
from horovod_hetero.errors import (  # noqa: F401
    CollectiveTimeoutError, ElasticResetError, HeteroError, RankLostError, RoundMismatchError)
from horovod_hetero.runtime.seams import DEFAULT_TIMEOUT_S  # noqa: F401
from horovod_hetero.strategies import (  # noqa: F401
    GradientAveraging, GradientWeighting, Mean, ModelAveraging, Normalized, OuterSGD, Steps, Strategy)
import horovod_hetero.auto  # noqa: F401  (registers hh.Auto, the strategy the library chooses)
from horovod_hetero.strategies.registry import REGISTRY, classes
from horovod_hetero.torch.sampler import DistributedSampler  # noqa: F401
from horovod_hetero.torch.slowdown import slow_down  # noqa: F401

__all__ = ["DistributedOptimizer", "DistributedSampler", "slow_down", "wagma_process_sets", "DEFAULT_TIMEOUT_S",
           "Strategy", "ModelAveraging", "GradientAveraging", "GradientWeighting", *(entry.cls.__name__ for entry in REGISTRY.values()), "Steps", "Mean", "Normalized", "OuterSGD",
           "HeteroError", "RankLostError", "CollectiveTimeoutError", "RoundMismatchError", "ElasticResetError"]

if TYPE_CHECKING:
    from horovod_hetero.strategies import (  # noqa: F401
        ADSP, Balanced, DSSP, ESync, ElasticBSP, LocalSGD, Synchronous, WAGMA)
    from horovod_hetero.torch.optimizer import DistributedOptimizer  # noqa: F401


def __getattr__(name: str) -> Any:
    """``DistributedOptimizer`` (its module loaded now), and every registered strategy class by its name
    (``strategies.registry.classes``: one registered after this module was imported too)."""
    if name == "DistributedOptimizer":
        from horovod_hetero.torch.optimizer import DistributedOptimizer
        return DistributedOptimizer
    try:
        return classes()[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(classes()))
