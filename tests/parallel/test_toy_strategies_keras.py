"""A strategy is one module and one registry line, Keras: the toys of ``toy_strategies`` (one of each kind,
each registered with one ``register`` line) train by name through ``HeteroSyncCallback`` with the unchanged
Keras adapter, on every Keras stack (see keras_helpers). The torch half is ``test_toy_strategies.py``."""
import numpy as np

import keras_helpers
import toy_strategies
from horovod_hetero.strategies.registry import configured
from keras_helpers import Recorder, hh, keras, make_model, rank_data

RANK, SIZE = keras_helpers.init()


def fit(name, model):
    """Two epochs of 5 batches of 8 on this rank's own data with ``configured(name)``: every rank's first kernel
    after each batch and its weights at the end, and the callback."""
    recorder = Recorder()
    x, y = rank_data(RANK, 40)
    callback = hh.callbacks.HeteroSyncCallback(configured(name), share_epochs=False)   # every rank every batch
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[callback, recorder])
    everyone = keras_helpers.gathered(([k.tolist() for k in recorder.kernels],
                                       [w.tolist() for w in keras_helpers.weights(model)]), name=f"toy.keras.{name}")
    kernels, finals = zip(*everyone)
    return callback, kernels, finals


def test_each_toy_is_exported_by_name():
    assert hh.EveryThird is toy_strategies.EveryThird and hh.MeasureEveryFourth is toy_strategies.MeasureEveryFourth
    assert hh.callbacks.HeteroSyncCallback.strategy_class is None       # it runs any strategy: a toy needs no callback


def test_the_model_averaging_toy_averages_every_third_batch_and_ends_identical():
    callback, kernels, finals = fit("everythird", make_model(RANK))       # a different model on every rank
    same = [all(k[b] == kernels[0][b] for k in kernels) for b in range(len(kernels[0]))]
    assert same == [False, False, True, False, False, True, False, False, True, False]   # batches across epochs
    assert [r["step"] for r in callback.telemetry.records if r["synced"]] == [3, 6, 9]
    assert all(f == finals[0] for f in finals) and callback.state_dict()["strategy"]["step"] == 10
    assert type(callback.strategy) is toy_strategies.EveryThird


def test_the_gradient_averaging_toy_steps_in_lockstep_with_hh_distributed_optimizer():
    """Keras 2's ``hh.DistributedOptimizer`` is Horovod's, which always averages: the same toy runs on it."""
    model = make_model(0, optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(0.1)))   # one start everywhere
    callback, kernels, finals = fit("measureeveryfourth", model)
    assert len(kernels[0]) == 10 and all(k == kernels[0] for k in kernels)   # identical after every batch
    records = callback.telemetry.records
    assert [r["step"] for r in records if "round" in r] == [4, 8] and not any(r["synced"] for r in records)
    assert all(f == finals[0] for f in finals)
    assert np.isfinite(np.concatenate([np.ravel(w) for w in finals[0]])).all()
