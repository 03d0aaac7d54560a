"""The strategy callback hands the strategy each batch's loss, not Keras' running mean of the epoch.

Keras logs ``loss`` at a batch's end as the mean over the epoch so far; ADSP's commit-rate search
needs the losses of the batches themselves. With learning rate 0 every batch's true loss is known
in advance (a model that does not change), so the recovered values can be compared exactly.
"""
import numpy as np
import pytest

from horovod_hetero.keras._callback import batch_loss


def running_means(losses, calls):
    """Keras' logs for equal batches: after each call (the batch count it covers), the mean so far."""
    out, seen = [], []
    for count in calls:
        seen = losses[:count]
        out.append((count, float(np.mean(seen))))
    return out


@pytest.mark.parametrize("calls", [[1, 2, 3, 4, 5, 6], [2, 4, 6], [3, 6]])   # steps_per_execution 1, 2, 3
def test_the_batches_own_losses_come_back_from_the_running_means(calls):
    losses = [4.0, 2.0, 3.0, 1.0, 0.5, 0.25]
    previous, got = None, []
    for count, mean in running_means(losses, calls):
        got.append(batch_loss(count, mean, previous))
        previous = (count, mean)
    step = calls[0]
    want = [float(np.mean(losses[c - step:c])) for c in calls]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_new_epoch_starts_from_its_first_running_mean():
    assert batch_loss(1, 0.7, (6, 2.0)) == 0.7        # the batch count went back: a new epoch
    assert batch_loss(3, 0.7, None) == 0.7


def test_a_real_fit_logs_running_means_and_the_callback_recovers_each_batch():
    keras = pytest.importorskip("keras")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 4)).astype("float32")
    y = (rng.normal(size=(96, 1)) * np.arange(96)[:, None] / 10).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    true = [float(np.mean((model.predict(x[i:i + 16], verbose=0) - y[i:i + 16]) ** 2)) for i in range(0, 96, 16)]
    logged, recovered, previous = [], [], []

    class Record(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            previous.clear()

        def on_train_batch_end(self, batch, logs=None):
            mean = float(logs["loss"])
            logged.append(mean)
            recovered.append(batch_loss(batch + 1, mean, previous[0] if previous else None))
            previous[:] = [(batch + 1, mean)]

    model.fit(x, y, batch_size=16, shuffle=False, epochs=2, verbose=0, callbacks=[Record()])
    np.testing.assert_allclose(recovered, true * 2, rtol=1e-5)
    assert not np.allclose(logged, true * 2, rtol=1e-2)          # the logs themselves are running means
