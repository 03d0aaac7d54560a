"""Keras models, data and a recorder shared by the Keras parallel tests (no hvd.init here)."""
import numpy as np
import tensorflow as tf


class Recorder(tf.keras.callbacks.Callback):
    """Keeps a copy of the first kernel after every batch (put it after the averaging callback
    to see averaged weights, before it to see the local step's)."""

    def __init__(self):
        super().__init__()
        self.kernels = []

    def on_train_batch_end(self, batch, logs=None):
        self.kernels.append(self.model.weights[0].numpy().copy())


def make_model(rank):
    tf.keras.utils.set_random_seed(rank)            # a different start on every rank
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(4),
                                 tf.keras.layers.BatchNormalization(), tf.keras.layers.Dense(3)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), run_eagerly=False,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def rank_data(rank, n):
    rng = np.random.default_rng(10 + rank)
    return rng.normal(size=(n, 6)).astype("float32"), rng.integers(0, 3, size=n)
