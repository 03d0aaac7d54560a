"""Keras adapter: ``import horovod_hetero.tensorflow.keras as hh`` next to
``import horovod.tensorflow.keras as hvd``; the callbacks are in ``hh.callbacks``."""
from horovod_hetero.common.strategy import ESync, LocalSGD, Strategy, Synchronous  # noqa: F401
from horovod_hetero.common.wagma import WAGMA  # noqa: F401
from horovod_hetero.tensorflow.keras import callbacks  # noqa: F401
from horovod_hetero.process_sets import wagma_process_sets  # noqa: F401
