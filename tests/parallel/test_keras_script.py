"""Horovod's TensorFlow 2 Keras MNIST script (``examples/tensorflow2/tensorflow2_keras_mnist.py``),
digits for MNIST, each strategy changed by one line: a ``Sequential`` without an ``Input`` (built by its
first batch), the learning rate scaled by the size, Horovod's Keras callbacks (broadcast, metric
average, warm-up; hh's, which work on every Keras), a checkpoint on rank 0, three epochs under
slowdown 1,1,1,2. Every run must finish with identical weights and averaged metrics on every rank."""
import os
import tempfile

import numpy as np
import pytest

import keras_helpers
from keras_helpers import hh, keras
from horovod_hetero_lab.data import digits

RANK, SIZE = keras_helpers.init()
pytestmark = pytest.mark.skipif(SIZE != 4, reason="written for 4 ranks")

STRATEGIES = {
    "Synchronous": lambda: hh.callbacks.SlowdownCallback(slowdown="1,1,1,2"),
    "LocalSGD": lambda: hh.callbacks.LocalSGDCallback(period=4, slowdown="1,1,1,2"),
    "ESync": lambda: hh.callbacks.ESyncCallback(slowdown="1,1,1,2"),
    "WAGMA": lambda: hh.callbacks.WAGMACallback(group_size=2, sync_period=4, slowdown="1,1,1,2"),
    "ElasticBSP": lambda: hh.callbacks.ElasticBSPCallback(slowdown="1,1,1,2"),
    "DSSP": lambda: hh.callbacks.DSSPCallback(slowdown="1,1,1,2"),
}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_the_script_trains_with_horovods_callbacks_and_every_strategy(strategy):
    train_the_script(strategy)


@pytest.mark.parametrize("strategy", ["LocalSGD", "ESync"])
def test_metric_averaging_listed_before_the_strategy_callback_still_meets_the_ranks_in_step(strategy):
    """A user who appends the one new callback after Horovod's: MetricAverageCallback's allgather at
    the epoch's end comes first, on ranks at different rounds; the strategy callback syncs them first."""
    train_the_script(strategy, metric_average_first=True)


def train_the_script(strategy, metric_average_first=False):
    x, y, _, _ = digits(RANK, SIZE)
    keras.utils.set_random_seed(RANK)                     # different initial weights: the broadcast fixes them
    model = keras.Sequential([keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10, activation="softmax")])
    optimizer = keras.optimizers.SGD(0.01 * SIZE)
    if strategy == "Synchronous":
        optimizer = hh.DistributedOptimizer(optimizer)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=optimizer, metrics=["accuracy"])
    callbacks = [hh.callbacks.BroadcastGlobalVariablesCallback(0),
                 STRATEGIES[strategy](),                                   # the one line per strategy
                 hh.callbacks.MetricAverageCallback(),
                 hh.callbacks.LearningRateWarmupCallback(initial_lr=0.01 * SIZE, warmup_epochs=1)]
    if metric_average_first:
        callbacks[1], callbacks[2] = callbacks[2], callbacks[1]
    directory = keras_helpers.hvd.broadcast_object(tempfile.mkdtemp() if RANK == 0 else None, root_rank=0,
                                                   name=f"{strategy}.{metric_average_first}.dir")
    path = os.path.join(directory, "checkpoint-{epoch}.weights.h5")
    if RANK == 0:
        callbacks.append(keras.callbacks.ModelCheckpoint(path, save_weights_only=True))
    steps = 8 + (2 * RANK if strategy != "Synchronous" else 0)         # ranks with different numbers of batches
    history = model.fit(x[:16 * steps], y[:16 * steps], batch_size=16, epochs=3, verbose=0, callbacks=callbacks)
    weights = keras_helpers.gathered([w.tolist() for w in keras_helpers.weights(model)], f"{strategy}.{metric_average_first}.w")
    logs = keras_helpers.gathered(history.history, f"{strategy}.{metric_average_first}.logs")
    assert all(w == weights[0] for w in weights)
    assert all(np.allclose(log["loss"], logs[0]["loss"], rtol=1e-6) for log in logs)   # metrics averaged
    if RANK == 0:
        assert sorted(os.listdir(directory)) == [f"checkpoint-{e}.weights.h5" for e in (1, 2, 3)]
