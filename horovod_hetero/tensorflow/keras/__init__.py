"""Keras adapter under Horovod's name: ``import horovod_hetero.tensorflow.keras as hh`` next to
``import horovod.tensorflow.keras as hvd``. The same objects as ``horovod_hetero.keras``."""
from typing import Any

import horovod_hetero.keras as _keras
from horovod_hetero.keras import *  # noqa: F401,F403
from horovod_hetero.keras import __all__  # noqa: F401


def __getattr__(name: str) -> Any:
    """What ``horovod_hetero.keras`` gives that its ``__all__`` did not list when this module was imported: a
    strategy class registered since (``strategies.registry.register``)."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_keras, name)
