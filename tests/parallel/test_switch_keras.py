"""Switching strategies in one job (Keras): Synchronous, ESync, Balanced and ElasticBSP in turn, one ``fit`` an
epoch on ``callback.epoch_plan``, the model compiled once with ``hh.DistributedOptimizer`` (whose average the
callback switches on and off): identical weights after every epoch, every sample once per epoch, the step
counter carried. On Keras 2, whose ``hh.DistributedOptimizer`` is Horovod's and always averages, a switch to a
model-averaging strategy is refused by name."""
import numpy as np
import pytest

import keras_helpers
from horovod_hetero.runtime.straggler import Slowdown
from keras_helpers import hh, keras, make_model

RANK, SIZE = keras_helpers.init()
N = 8 * SIZE * 5                                   # five global batches of 8 per rank an epoch


class Started(keras.callbacks.Callback):
    """After the strategy callback: its strategy's step count once it started (rank 0's, after a switch)."""

    def __init__(self, strategy_callback):
        super().__init__()
        self.strategy_callback, self.steps = strategy_callback, []

    def on_train_begin(self, logs=None):
        self.steps.append(self.strategy_callback.strategy.step)


def data():
    rng = np.random.default_rng(4)
    return rng.normal(size=(N, 6)).astype("float32"), rng.integers(0, 3, size=N)


@pytest.mark.skipif(hh.keras_major() < 3, reason="Keras 3: hh.DistributedOptimizer switches its average")
def test_one_job_switches_between_both_kinds_with_identical_weights_and_every_sample_once_an_epoch():
    x, y = data()
    model = make_model(RANK, optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(0.05)))
    callback = hh.callbacks.HeteroSyncCallback(hh.Synchronous(), batch_size=8,
                                               slowdown=Slowdown(RANK, "1,1,1,4", base_step_s=0.01))
    first, started = hh.callbacks.BroadcastGlobalVariablesCallback(0), Started(callback)
    schedule = [None, hh.ESync(), hh.Balanced(rebalance_every=1), hh.ElasticBSP(), hh.Synchronous()]
    seen, finals, names, steps = [], [], [], []
    for epoch, strategy in enumerate(schedule):
        if strategy is not None:
            callback.set_strategy(strategy)
        idx, batch = callback.epoch_plan(len(x), epoch)
        model.fit(x[idx], y[idx], batch_size=batch, shuffle=False, initial_epoch=epoch, epochs=epoch + 1, verbose=0,
                  callbacks=([first] if epoch == 0 else []) + [callback, started])
        seen.append(idx.tolist())
        finals.append([w.tolist() for w in keras_helpers.weights(model)])
        names.append(type(callback.strategy).__name__)
    steps = started.steps
    everyone = keras_helpers.gathered((seen, finals, names, steps), name="test.switch.keras")
    for epoch in range(len(schedule)):
        drawn = sorted(i for rank in everyone for i in rank[0][epoch])
        assert set(drawn) == set(range(N)) and len(drawn) >= N, epoch          # every sample, every epoch
        assert all(rank[1][epoch] == everyone[0][1][epoch] for rank in everyone), epoch   # identical weights
    assert all(rank[2] == ["Synchronous", "ESync", "Balanced", "ElasticBSP", "Synchronous"] for rank in everyone)
    ranks_steps = [rank[3] for rank in everyone]                              # at each fit's start
    assert all(s == ranks_steps[0] for s in ranks_steps)                        # rank 0's counters, every switch
    assert ranks_steps[0][:2] == [0, N // (8 * SIZE)] and all(b > a for a, b in zip(ranks_steps[0], ranks_steps[0][1:]))
    assert np.isfinite(np.concatenate([np.ravel(w) for w in everyone[0][1][-1]])).all()


@pytest.mark.skipif(hh.keras_major() >= 3, reason="Keras 2: hh.DistributedOptimizer is Horovod's")
def test_keras_2_refuses_a_switch_its_optimizer_cannot_follow():
    x, y = data()
    model = make_model(RANK, optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(0.05)))
    callback = hh.callbacks.HeteroSyncCallback(hh.Synchronous(), batch_size=8)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    with pytest.raises(TypeError, match=r"^ESync averages the models, but the model's optimizer is Horovod's "
                                        r"hvd\.DistributedOptimizer"):
        callback.set_strategy(hh.ESync())
