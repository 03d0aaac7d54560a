"""Synchronous Keras training on any Keras: hh.DistributedOptimizer averages gradients every step, and
what Horovod's Keras layer gives on Keras 2 but not on Keras 3 (broadcast, metric average, warm-up)."""
import sys

import numpy as np
import pytest

import keras_helpers
from keras_helpers import BACKEND, Recorder, hh, keras, make_model, rank_data

RANK, SIZE = keras_helpers.init()


@pytest.mark.skipif(BACKEND != "torch", reason="the PyTorch backend")
def test_the_torch_backend_trains_without_importing_tensorflow():
    """First in the file: nothing before it may import TensorFlow (Keras' own seeding would)."""
    model = make_model(RANK, optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(0.1)), seeded=False)
    x, y = rank_data(RANK, 16)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0,
              callbacks=[hh.callbacks.BroadcastGlobalVariablesCallback(0), hh.callbacks.MetricAverageCallback()])
    model = make_model(RANK, seeded=False)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[hh.callbacks.LocalSGDCallback(period=2)])
    assert "tensorflow" not in sys.modules


def test_ranks_with_different_data_and_starts_are_identical_after_every_step():
    model, recorder = make_model(RANK, optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))), Recorder()
    x, y = rank_data(RANK, 40)                                      # different data on every rank
    start = keras_helpers.weights(model)[0]
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
              callbacks=[hh.callbacks.BroadcastGlobalVariablesCallback(0), recorder])
    everyone = keras_helpers.gathered((start.tolist(), [k.tolist() for k in recorder.kernels]), name="sync.kernels")
    starts, kernels = zip(*everyone)
    assert len(kernels[0]) == 10 and all(k == kernels[0] for k in kernels)      # identical after every step
    assert starts[0] != starts[1]                                   # they did start apart
    assert kernels[0][0] != kernels[0][-1]                          # and trained
    assert isinstance(model.optimizer, keras.optimizers.SGD)


def trainable(model):
    """The trainable weights as lists (learning rate 0 freezes them; BatchNorm's moving statistics
    still follow each rank's own data)."""
    return [np.array(w).tolist() for w in model.trainable_weights]


def test_the_broadcast_gives_every_rank_the_root_model_built_before_or_by_the_first_batch():
    finals = {}
    for built in (True, False):
        model = make_model(RANK, optimizer=keras.optimizers.SGD(0.0), built=built)
        x, y = rank_data(RANK, 16)
        start = trainable(model) if built else None
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[hh.callbacks.BroadcastGlobalVariablesCallback(0)])
        finals[built] = keras_helpers.gathered((trainable(model), start), name=f"sync.bcast.{built}")
    for built, everyone in finals.items():
        assert all(e[0] == everyone[0][0] for e in everyone), built
    assert finals[True][0][0] == finals[True][0][1]                 # rank 0's own start (lr 0 keeps it)


class RankMetric(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        logs["rank_metric"] = float(RANK + epoch)


class Seen(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.metrics, self.rates = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(np.asarray(self.model.optimizer.learning_rate)))

    def on_epoch_end(self, epoch, logs=None):
        self.metrics.append(logs["rank_metric"])


def test_metrics_are_averaged_over_the_ranks_and_the_learning_rate_warms_up_as_horovods():
    model, seen = make_model(RANK), Seen()
    x, y = rank_data(RANK, 32)                                      # 4 batches per epoch
    model.fit(x, y, batch_size=8, epochs=3, verbose=0,
              callbacks=[RankMetric(), hh.callbacks.MetricAverageCallback(),
                         hh.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2), seen])
    mean = np.mean(range(SIZE))
    assert seen.metrics == [mean, mean + 1, mean + 2]
    steps, expected = 4, []
    for epoch in range(3):
        for batch in range(steps):
            e = epoch + batch / steps + 1 / steps
            expected.append(0.4 / SIZE * (e * (SIZE - 1) / 2 + 1) if epoch < 2 else expected[-1])
    np.testing.assert_allclose(seen.rates, expected, rtol=1e-6)


@pytest.mark.skipif(keras.__version__ < "3" or BACKEND != "tensorflow",
                    reason="hvd.DistributedOptimizer averages on Keras 2; it needs TensorFlow")
def test_horovods_optimizer_that_would_average_nothing_on_keras_3_is_refused_by_name():
    import horovod.tensorflow.keras as hvd_keras

    model = make_model(RANK, optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    x, y = rank_data(RANK, 16)
    for callback in (hh.callbacks.BroadcastGlobalVariablesCallback(0), hh.callbacks.LocalSGDCallback(period=2)):
        with pytest.raises(TypeError, match="hvd.DistributedOptimizer, which averages nothing under Keras 3.*"
                                            "hh.DistributedOptimizer"):
            model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
