"""BalancedCallback under horovodrun (Keras 3, either backend): the averaged gradient is the gradient of the
union of the ranks' unequal batches, every step leaves identical weights, and under slowdown the slow rank
gets the smallest batch."""
import numpy as np
import pytest

import keras_helpers
from keras_helpers import hh, keras
from horovod_hetero.runtime.straggler import Slowdown

RANK, SIZE = keras_helpers.init()
pytestmark = pytest.mark.skipif(hh.keras_major() < 3, reason="Balanced needs hh.DistributedOptimizer of Keras 3")


def data(n):
    rng = np.random.default_rng(7)
    return rng.normal(size=(n, 6)).astype("float32"), rng.integers(0, 3, size=n)


def model_of(lr):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    model.compile(optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(lr)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.parametrize("make", [lambda: hh.callbacks.BalancedCallback(global_batch=10),
                                  lambda: hh.callbacks.HeteroSyncCallback(hh.Balanced(global_batch=10))],
                         ids=["BalancedCallback", "HeteroSyncCallback"])
def test_the_averaged_gradient_is_the_union_batchs_for_unequal_batches(make):
    """A global batch of 10 over 4 ranks (3, 3, 2, 2): one step of SGD (lr 1) gives every rank the weights a
    single model gets from the mean loss over the union of the 10 samples, with the callback built either way."""
    x, y = data(10)
    model = model_of(1.0)
    before = [np.array(w) for w in model.get_weights()]
    balanced = make()
    idx, batch = balanced.epoch_plan(len(x), 0, shuffle=False)
    model.fit(x[idx], y[idx], batch_size=batch, shuffle=False, epochs=1, verbose=0, callbacks=[balanced])
    everyone = keras_helpers.gathered(([w.tolist() for w in model.get_weights()], batch), name="balanced.keras.one")

    keras.utils.set_random_seed(0)
    reference = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    reference.compile(optimizer=keras.optimizers.SGD(1.0), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    reference.set_weights(before)
    reference.fit(x, y, batch_size=10, shuffle=False, epochs=1, verbose=0)
    assert [b for _, b in everyone] == [3, 3, 2, 2]
    assert all(w == everyone[0][0] for w, _ in everyone)
    for got, want in zip(everyone[0][0], reference.get_weights()):
        np.testing.assert_allclose(np.array(got), want, rtol=0, atol=2e-6)


def test_every_step_leaves_identical_weights_and_the_slow_rank_gets_the_smallest_batch():
    x, y = data(256)                     # 4 steps an epoch at a global batch of 64
    model = model_of(0.05)
    # a step padded to 2 ms a sample, the last rank's to 8 ms (these models take microseconds a sample: their
    # own compute is noise no line fits; the padding is a step time Balanced can equalise)
    slowdown = Slowdown(RANK, "1,1,1,4", base_step_s=0.0, per_sample_s=0.002)
    balanced = hh.callbacks.BalancedCallback(batch_size=16, slowdown=slowdown)
    recorder, batches = keras_helpers.Recorder(), []
    for epoch in range(7):
        idx, batch = balanced.epoch_plan(len(x), epoch)
        batches.append(batch)
        model.fit(x[idx], y[idx], batch_size=batch, shuffle=False, initial_epoch=epoch, epochs=epoch + 1, verbose=0,
                  callbacks=[balanced, recorder])
    everyone = keras_helpers.gathered(([k.tolist() for k in recorder.kernels], batches), name="balanced.keras.steps")
    kernels = [k for k, _ in everyone]
    per_epoch = np.array([b for _, b in everyone])                  # (ranks, epochs)
    assert all(k == kernels[0] for k in kernels) and len(kernels[0]) == 28
    assert (per_epoch.sum(axis=0) == 64).all() and (per_epoch[:, :3] == 16).all()
    assert (per_epoch[SIZE - 1, 3:] < per_epoch[:SIZE - 1, 3:].min(axis=0)).all(), per_epoch
