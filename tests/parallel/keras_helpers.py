"""What the Keras parallel tests share: this run's Keras and Horovod, models, data, a recorder.

``make test`` runs every ``test_*keras*.py`` three times: Keras 3 with the TensorFlow backend (the
default), ``KERAS_BACKEND=torch`` (Horovod's torch collectives, no TensorFlow imported) and
``TF_USE_LEGACY_KERAS=1`` (Keras 2, the ``tf-keras`` package), each stack's files in one horovodrun job.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import horovod_hetero.keras as hh  # noqa: E402
import job  # noqa: E402

keras = hh.keras_module()
BACKEND = keras.backend.backend()
if BACKEND == "torch":
    import horovod.torch as hvd  # noqa: E402
else:
    import horovod.tensorflow as hvd  # noqa: E402
STACK = f"Keras {keras.__version__} ({BACKEND})"


def init():
    """``hvd.init`` of this backend once per job (``job.init``: WAGMA's process sets registered), one
    compute thread per rank; returns (rank, size)."""
    if hvd.is_initialized():                 # an earlier file of this job set it up
        return hvd.rank(), hvd.size()
    job.init(hvd, hh)
    if BACKEND == "torch":
        import torch
        torch.set_num_threads(1)
    else:
        import tensorflow as tf
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.threading.set_intra_op_parallelism_threads(1)
    return hvd.rank(), hvd.size()


def gathered(obj, name):
    """Every rank's ``obj``, by rank."""
    return hvd.allgather_object(obj, name=name)


def weights(model):
    """The model's weights as NumPy arrays."""
    return [np.array(w) for w in model.weights]


class Recorder(keras.callbacks.Callback):
    """Keeps a copy of the first kernel after every batch (put it after the averaging callback
    to see averaged weights, before it to see the local step's)."""

    def __init__(self):
        super().__init__()
        self.kernels = []

    def on_train_batch_end(self, batch, logs=None):
        self.kernels.append(np.array(self.model.weights[0]).copy())


def make_model(rank, optimizer=None, built=True, seeded=True):
    """A small model with BatchNormalization, different on every rank (seeded by ``rank``; Keras'
    seeding also seeds TensorFlow, importing it, whenever it is installed)."""
    if seeded:
        keras.utils.set_random_seed(rank)
    layers = [keras.layers.Dense(4), keras.layers.BatchNormalization(), keras.layers.Dense(3)]
    model = keras.Sequential(([keras.Input((6,))] if built else []) + layers)
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def rank_data(rank, n):
    rng = np.random.default_rng(10 + rank)
    return rng.normal(size=(n, 6)).astype("float32"), rng.integers(0, 3, size=n)
