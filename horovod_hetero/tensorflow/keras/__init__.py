"""Keras adapter under Horovod's name: ``import horovod_hetero.tensorflow.keras as hh`` next to
``import horovod.tensorflow.keras as hvd``. The same objects as ``horovod_hetero.keras``."""
from horovod_hetero.keras import *  # noqa: F401,F403
