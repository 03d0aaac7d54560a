"""``aggregate=hh.Normalized(...)`` and ``outer=hh.OuterSGD(...)`` through the Keras callback under horovodrun: identical
weights after every round with each aggregation, the slow rank's class weighted up, and a resume from the
callback's state, or from a Keras checkpoint, that continues bit for bit with the outer momentum."""
import os
import tempfile

import numpy as np
import pytest

import keras_helpers
from fixed_plan import FixedPlan
from keras_helpers import hh, keras, rank_data

RANK, SIZE = keras_helpers.init()
NESTEROV = hh.Normalized(outer=hh.OuterSGD(lr=0.7, momentum=0.5, nesterov=True))
VARIANTS = {"mean": None, "normalized": hh.Normalized(), "normalized+nesterov": NESTEROV}


class RoundRecorder(keras.callbacks.Callback):
    """The weights after every batch that ended a round (put it after the strategy's callback)."""

    def __init__(self, sync):
        super().__init__()
        self.sync, self.rounds = sync, []

    def on_train_batch_end(self, batch, logs=None):
        if self.sync.telemetry.records[-1]["synced"]:
            self.rounds.append([np.array(w).tolist() for w in self.model.weights])


class Counters(keras.callbacks.Callback):
    """The strategy's counters when the epoch ended (put it after the checkpoint: what the file holds)."""

    def __init__(self, sync):
        super().__init__()
        self.sync, self.counters = sync, None

    def on_epoch_end(self, epoch, logs=None):
        state = self.sync.state_dict()
        self.counters = (state["strategy"], state["rounds"])


def model_of(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_round_leaves_identical_weights_with_each_aggregation(variant):
    model = model_of()
    sync = hh.callbacks.HeteroSyncCallback(FixedPlan(), batch_size=8, aggregate=VARIANTS[variant])
    recorder = RoundRecorder(sync)
    x, y = rank_data(RANK, 8 * (16 if RANK < SIZE - 1 else 4))     # four rounds: 16 batches fast, 4 slow
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[sync, recorder])
    everyone = keras_helpers.gathered(recorder.rounds, name=f"aggregation.keras.{variant}")
    assert len(everyone[0]) == 4 and all(r == everyone[0] for r in everyone), variant


def skewed(aggregate, rounds=6):
    """Logits of SIZE classes from a bias alone (zero inputs); rank r's data are all of class r; the last
    rank steps once per round, the others four times. Returns every rank's softmax."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(SIZE, kernel_initializer="zeros")])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batches = rounds * (4 if RANK < SIZE - 1 else 1)
    sync = hh.callbacks.HeteroSyncCallback(FixedPlan(), batch_size=8, aggregate=VARIANTS[aggregate])
    model.fit(np.zeros((8 * batches, 1), "float32"), np.full(8 * batches, RANK), batch_size=8, epochs=1,
              shuffle=False, verbose=0, callbacks=[sync])
    logits = np.array(model.weights[1], dtype=np.float64)
    return keras_helpers.gathered((np.exp(logits) / np.exp(logits).sum()).tolist(), name=f"aggregation.skew.{aggregate}")


def test_normalized_gives_the_slow_ranks_class_more_weight_than_mean():
    mean, normalized = np.array(skewed("mean")), np.array(skewed("normalized"))
    for probs in (mean, normalized):
        assert (probs == probs[0]).all()
    mean, normalized, slow = mean[0], normalized[0], SIZE - 1
    assert mean[slow] < mean[:slow].min() - 0.05, mean
    assert normalized[slow] > mean[slow] + 0.05, (mean, normalized)
    assert abs(normalized[slow] - normalized[:slow].mean()) < abs(mean[slow] - mean[:slow].mean()) / 2, normalized


def test_a_resume_from_the_callbacks_state_continues_bit_identically_with_outer_momentum():
    def strategy():
        return FixedPlan()

    x, y = rank_data(RANK, 8 * (24 if RANK < SIZE - 1 else 6))
    first, second = slice(0, len(x) // 2), slice(len(x) // 2, None)      # three rounds each
    model, sync = model_of(), hh.callbacks.HeteroSyncCallback(strategy(), batch_size=8, share_epochs=False, aggregate=NESTEROV)
    model.fit(x[first], y[first], batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[sync])
    state, weights = sync.state_dict(), model.get_weights()            # fit ended with sync_model()
    model.fit(x[second], y[second], batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[sync])
    after = [w.tolist() for w in model.get_weights()]

    resumed, again = model_of(seed=1), hh.callbacks.HeteroSyncCallback(strategy(), batch_size=8, share_epochs=False, aggregate=NESTEROV)
    resumed.set_weights(weights)
    again.load_state_dict(state)
    resumed.fit(x[second], y[second], batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[again])
    assert state["aggregation"]["momentum"] is not None
    assert [w.tolist() for w in resumed.get_weights()] == after


@pytest.mark.parametrize("keep", [False, True])
def test_a_resume_from_a_keras_checkpoint_continues_bit_identically_with_outer_momentum(keep):
    """The same resume through the file rank 0's ``ModelCheckpoint`` wrote: weights and optimizer state by
    ``load_weights``, the counters and the outer momentum by ``load_checkpoint_state``, on every rank.
    ``keep``: the plan in rank 0's counters goes on (a strategy whose restart keeps its plan), each rank
    taking its own share (``plan_done``)."""
    def strategy():
        return FixedPlan(keep=keep)

    directory = keras_helpers.hvd.broadcast_object(tempfile.mkdtemp() if RANK == 0 else None, root_rank=0,
                                                   name=f"aggregation.checkpoint.dir.{keep}")
    path = os.path.join(directory, "checkpoint.weights.h5")
    x, y = rank_data(RANK, 8 * (24 if RANK < SIZE - 1 else 6))
    first, second = slice(0, len(x) // 2), slice(len(x) // 2, None)      # three rounds each
    model, sync = model_of(), hh.callbacks.HeteroSyncCallback(strategy(), batch_size=8, share_epochs=False, aggregate=NESTEROV)
    saved = Counters(sync)
    callbacks = [sync] + ([keras.callbacks.ModelCheckpoint(path, save_weights_only=True), saved] if RANK == 0 else [])
    model.fit(x[first], y[first], batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    state = sync.state_dict()
    saved = keras_helpers.hvd.broadcast_object(saved.counters, root_rank=0, name=f"aggregation.checkpoint.saved.{keep}")
    model.fit(x[second], y[second], batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[sync])
    after = [w.tolist() for w in model.get_weights()]

    resumed, again = model_of(seed=1), hh.callbacks.HeteroSyncCallback(strategy(), batch_size=8, share_epochs=False, aggregate=NESTEROV)
    resumed.load_weights(path)
    loaded = again.load_checkpoint_state(path)
    pending = again.state_dict()
    resumed.fit(x[second], y[second], batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[again])
    assert loaded and state["aggregation"]["momentum"] is not None
    assert (pending["strategy"], pending["rounds"]) == saved                 # rank 0's, on every rank
    assert [w.tolist() for w in resumed.get_weights()] == after
