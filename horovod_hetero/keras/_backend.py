"""Which Keras runs, its collectives, and the backend-agnostic tensor helpers of the Keras adapter.

What Horovod keeps in ``horovod/_keras``: here a private module of the one Keras package."""
from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
from horovod_hetero.errors import troubleshooting

if TYPE_CHECKING:
    from horovod_hetero.common.horovod_collectives import HorovodCollectives

_T = TypeVar("_T")


class EpochSync(Protocol):
    """A strategy callback (``keras._callback.StrategyCallbackImpl``) as ``sync_epoch`` reaches it."""

    def sync_epoch(self, epoch: int) -> None: ...


#: model -> the strategy callbacks training it (``strategy_callbacks``).
_strategy_callbacks: weakref.WeakKeyDictionary[Any, weakref.WeakSet[EpochSync]] = \
    weakref.WeakKeyDictionary()


def keras_module() -> ModuleType:
    """The Keras a script's ``model.fit`` runs, decided as TensorFlow >= 2.16 decides ``tf.keras``:
    Keras 2 (the ``tf_keras`` package) when ``TF_USE_LEGACY_KERAS`` is ``1``/``true``, else the
    ``keras`` package (Keras 3 with any backend, or Keras 2 with TensorFlow <= 2.15)."""
    if os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1"):
        import tf_keras
        return tf_keras
    import keras
    return keras


def keras_major() -> int:
    """2 or 3."""
    return int(keras_module().__version__.split(".")[0])


def collectives_class() -> type[HorovodCollectives]:
    """The ``Collectives`` of the Keras backend: Horovod's TensorFlow ops, or its torch ops
    (``KERAS_BACKEND=torch``: no TensorFlow needed)."""
    backend = keras_module().backend.backend()
    if backend == "tensorflow":
        from horovod_hetero.keras._tensorflow import TensorFlowCollectives
        return TensorFlowCollectives
    if backend == "torch":
        from horovod_hetero.torch.adapter import TorchCollectives
        return TorchCollectives
    raise ValueError(f"Keras backend {backend!r} is not supported: horovod-hetero averages through Horovod's "
                     f"TensorFlow or PyTorch collectives; set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch\n"
                     f"{troubleshooting('troubleshooting-keras-backend')}")


def value(variable: Any) -> Any:
    """A variable's value as the backend's tensor."""
    read = variable.value            # a method on tf.Variable, a property on Keras 3 variables
    return read() if callable(read) else read


def switch(flag: Any, on: Callable[[], _T], off: Callable[[], _T]) -> _T:
    """``on()`` where the Keras variable ``flag`` is set (above 0.5), else ``off()`` (each returns the same
    structure): a graph's conditional inside a compiled TensorFlow step (read at every step, so the flag may
    change between steps), a Python branch where the step runs eagerly (TensorFlow eager, torch), whose errors
    then come out as raised."""
    if keras_module().backend.backend() == "tensorflow":
        import tensorflow as tf
        if not tf.executing_eagerly():
            return tf.cond(value(flag) > 0.5, on, off)
    return on() if float(to_numpy(value(flag))) > 0.5 else off()


def to_numpy(tensor: Any) -> npt.NDArray[Any]:
    """A NumPy copy of a backend tensor (TensorFlow or torch, on any device) or an array."""
    if hasattr(tensor, "detach") and hasattr(tensor, "cpu"):      # torch
        return tensor.detach().cpu().numpy()
    return np.array(tensor)


def to_tensor(array: npt.ArrayLike, variable: Any) -> Any:
    """``array`` as a backend tensor of ``variable``'s dtype (on the backend's default device)."""
    if keras_major() >= 3:
        return keras_module().ops.convert_to_tensor(array, dtype=variable.dtype)
    import tensorflow as tf
    return tf.convert_to_tensor(array, dtype=variable.dtype)


def weights(model: Any) -> list[Any]:
    """``model.weights``, empty while the model is not built (Keras 2 raises then)."""
    return list(model.weights) if getattr(model, "built", True) else []


def strategy_callbacks(model: Any) -> weakref.WeakSet[EpochSync]:
    """The strategy callbacks (``HeteroSyncCallbackImpl``) that train ``model``, a weak set each adds
    itself to when training begins."""
    return _strategy_callbacks.setdefault(model, weakref.WeakSet())


def sync_epoch(model: Any, epoch: int) -> None:
    """Bring ``model``'s strategy callbacks to this epoch's ``sync_model()`` now if they have not yet
    (``epoch_sync=True``): callbacks that meet the other ranks at an epoch's end (``MetricAverageCallback``)
    call it first, so they work before or after the strategy callback in ``fit``'s list."""
    for callback in list(strategy_callbacks(model)):
        callback.sync_epoch(epoch)
