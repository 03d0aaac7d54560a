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


@pytest.mark.skipif(keras.__version__ < "3", reason="Keras 2: hh.DistributedOptimizer is hvd.DistributedOptimizer")
def test_keras_3_mistakes_that_would_desynchronise_ranks_are_refused_by_name(tmp_path):
    x, y = rank_data(RANK, 16)
    wrapped = keras.optimizers.LossScaleOptimizer(hh.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    with pytest.raises(TypeError, match=r"LossScaleOptimizer around hh.DistributedOptimizer.*"
                                        r"hh.DistributedOptimizer\(keras.optimizers.LossScaleOptimizer"):
        make_model(RANK, optimizer=wrapped).fit(x, y, verbose=0, callbacks=[hh.callbacks.MetricAverageCallback()])
    if BACKEND == "tensorflow":
        model = make_model(RANK, optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(0.1)))
        model.compile(optimizer=model.optimizer, loss=model.loss, jit_compile=True)
        with pytest.raises(ValueError, match="jit_compile=False"):
            model.fit(x, y, verbose=0, callbacks=[hh.callbacks.BroadcastGlobalVariablesCallback(0)])
    with pytest.raises(ValueError, match=f"root_rank={SIZE} is not in the process set"):
        make_model(RANK).fit(x, y, verbose=0, callbacks=[hh.callbacks.BroadcastGlobalVariablesCallback(SIZE)])


@pytest.mark.skipif(keras.__version__ < "3", reason="Keras 2: hh.DistributedOptimizer is hvd.DistributedOptimizer")
def test_a_model_saved_with_the_averaging_optimizer_reloads_and_keeps_its_state(tmp_path):
    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.5))
    model = make_model(RANK, optimizer=hh.DistributedOptimizer(optimizer))
    assert model.optimizer is optimizer and type(optimizer).__name__ == "Adam"
    x, y = rank_data(RANK, 16)
    model.fit(x, y, batch_size=8, verbose=0)
    path = tmp_path / f"rank{RANK}.keras"
    model.save(path)
    reloaded = keras.models.load_model(path)
    assert isinstance(reloaded.optimizer, keras.optimizers.Adam) and not hasattr(reloaded.optimizer, "_hh_averaging")
    assert int(np.asarray(reloaded.optimizer.iterations)) == 2
