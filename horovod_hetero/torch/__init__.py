"""PyTorch adapter: ``import horovod_hetero.torch as hh`` next to ``import horovod.torch as hvd``.

``hh.DistributedOptimizer`` loads its module on first use (PEP 562), so the Keras adapter on the
PyTorch backend, which needs only ``horovod_hetero.torch.adapter``, does not load the optimizer.
"""
from typing import TYPE_CHECKING, Any

from horovod_hetero.common import compat  # noqa: F401  (checks Horovod's version here, at import)
from horovod_hetero.common.process_sets import wagma_process_sets  # noqa: F401
from horovod_hetero.errors import (  # noqa: F401
    CollectiveTimeoutError, ElasticResetError, HeteroError, RankLostError, RoundMismatchError)
from horovod_hetero.runtime.seams import DEFAULT_TIMEOUT_S  # noqa: F401
from horovod_hetero.strategies import (  # noqa: F401
    ADSP, Balanced, DSSP, ESync, ElasticBSP, GradientAveraging, GradientWeighting, LocalSGD, Mean, ModelAveraging,
    Normalized, OuterSGD, Steps, Strategy, Synchronous, WAGMA)
from horovod_hetero.strategies.registry import REGISTRY
from horovod_hetero.torch.sampler import DistributedSampler  # noqa: F401
from horovod_hetero.torch.slowdown import slow_down  # noqa: F401

__all__ = ["DistributedOptimizer", "DistributedSampler", "slow_down", "wagma_process_sets", "DEFAULT_TIMEOUT_S",
           "Strategy", "ModelAveraging", "GradientAveraging", "GradientWeighting", *(entry.cls.__name__ for entry in REGISTRY.values()), "Steps", "Mean", "Normalized", "OuterSGD",
           "HeteroError", "RankLostError", "CollectiveTimeoutError", "RoundMismatchError", "ElasticResetError"]

if TYPE_CHECKING:
    from horovod_hetero.torch.optimizer import DistributedOptimizer  # noqa: F401


def __getattr__(name: str) -> Any:
    if name == "DistributedOptimizer":
        from horovod_hetero.torch.optimizer import DistributedOptimizer
        return DistributedOptimizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
