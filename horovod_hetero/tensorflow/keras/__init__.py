"""Keras adapter: ``import horovod_hetero.tensorflow.keras as hh`` next to
``import horovod.tensorflow.keras as hvd``; the callbacks are in ``hh.callbacks``."""
from horovod_hetero._horovod import wagma_process_sets  # noqa: F401
from horovod_hetero.errors import CollectiveTimeoutError, HeteroError, RoundMismatchError  # noqa: F401
from horovod_hetero.strategies import ESync, LocalSGD, Strategy, Synchronous, WAGMA  # noqa: F401
from horovod_hetero.tensorflow.keras import callbacks  # noqa: F401
