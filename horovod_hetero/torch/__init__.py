"""PyTorch adapter: ``import horovod_hetero.torch as hh`` next to ``import horovod.torch as hvd``."""
from horovod_hetero.common.strategy import ESync, LocalSGD, Strategy, Synchronous  # noqa: F401
from horovod_hetero.common.wagma import WAGMA  # noqa: F401
from horovod_hetero.process_sets import wagma_process_sets  # noqa: F401
from horovod_hetero.torch.optimizer import DEFAULT_TIMEOUT_S, CollectiveTimeoutError, DistributedOptimizer  # noqa: F401
