"""Backend-agnostic logic of the Keras callbacks (as Horovod's ``horovod/_keras``), and which Keras runs."""
import os

import numpy as np


def keras_module():
    """The Keras a script's ``model.fit`` runs, decided as TensorFlow >= 2.16 decides ``tf.keras``:
    Keras 2 (the ``tf_keras`` package) when ``TF_USE_LEGACY_KERAS`` is ``1``/``true``, else the
    ``keras`` package (Keras 3 with any backend, or Keras 2 with TensorFlow <= 2.15)."""
    if os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1"):
        import tf_keras
        return tf_keras
    import keras
    return keras


def keras_major():
    """2 or 3."""
    return int(keras_module().__version__.split(".")[0])


def collectives_class():
    """The ``Collectives`` of the Keras backend: Horovod's TensorFlow ops, or its torch ops
    (``KERAS_BACKEND=torch``: no TensorFlow needed)."""
    backend = keras_module().backend.backend()
    if backend == "tensorflow":
        from horovod_hetero.tensorflow.collectives import TensorFlowCollectives
        return TensorFlowCollectives
    if backend == "torch":
        from horovod_hetero.torch.collectives import TorchCollectives
        return TorchCollectives
    raise ValueError(f"Keras backend {backend!r} is not supported: horovod-hetero averages through Horovod's "
                     f"TensorFlow or PyTorch collectives; set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch")


def value(variable):
    """A variable's value as the backend's tensor."""
    read = variable.value            # a method on tf.Variable, a property on Keras 3 variables
    return read() if callable(read) else read


def to_numpy(tensor):
    """A NumPy copy of a backend tensor (TensorFlow or torch, on any device) or an array."""
    if hasattr(tensor, "detach") and hasattr(tensor, "cpu"):      # torch
        return tensor.detach().cpu().numpy()
    return np.array(tensor)


def to_tensor(array, variable):
    """``array`` as a backend tensor of ``variable``'s dtype (on the backend's default device)."""
    if keras_major() >= 3:
        return keras_module().ops.convert_to_tensor(array, dtype=variable.dtype)
    import tensorflow as tf
    return tf.convert_to_tensor(array, dtype=variable.dtype)


def weights(model):
    """``model.weights``, empty while the model is not built (Keras 2 raises then)."""
    return list(model.weights) if getattr(model, "built", True) else []
