"""The Keras callbacks under Horovod's module name: every callback of ``horovod_hetero.keras.callbacks``."""
from horovod_hetero.keras.callbacks import *  # noqa: F401,F403
from horovod_hetero.keras.callbacks import __all__  # noqa: F401
