"""ADSP under horovodrun, Keras (3 with TensorFlow or torch, and 2): the losses come from the batch
logs; every rank holds the same commit target after every round, the weights are identical after
each round, fast ranks run more local steps per commit than the slow one, and uneven data ends
without a hang."""
import numpy as np

import keras_helpers
from horovod_hetero.runtime.straggler import Slowdown
from keras_helpers import Recorder, hh, make_model, rank_data

RANK, SIZE = keras_helpers.init()


class Targets(keras_helpers.keras.callbacks.Callback):
    """Every round's (C_target, commit rate, time axis) as the strategy holds it after the round."""

    def __init__(self, adsp):
        super().__init__()
        self.adsp, self.after = adsp, []

    def on_train_batch_end(self, batch, logs=None):
        if self.adsp.telemetry.records[-1]["synced"]:
            strategy = self.adsp.strategy
            self.after.append((strategy.c_target, strategy.commit_rate, strategy.elapsed))


def test_every_rank_commits_at_the_same_rate_identical_after_rounds_uneven_data_ends():
    model, recorder = make_model(RANK), Recorder()
    x, y = rank_data(RANK, 8 * (160 if RANK < 3 else 40))            # every rank trains about as long
    callback = hh.callbacks.ADSPCallback(check_period="5steps", search_every="50steps",
                                         adsp_options={"fit_points": 3},
                                         slowdown=Slowdown(RANK, "1,1,1,4", base_step_s=0.025))
    targets = Targets(callback)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback, recorder, targets])
    records = callback.telemetry.records
    synced = [i for i, r in enumerate(records) if r["synced"]]
    everyone = keras_helpers.gathered((targets.after, [recorder.kernels[i].tolist() for i in synced],
                                       [records[i]["ranks"]["local_steps"] for i in synced],
                                       [records[i]["search"] for i in synced if "search" in records[i]],
                                       [w.tolist() for w in keras_helpers.weights(model)]), name="adsp.keras")
    targets, kernels, steps, searches, finals = zip(*everyone)
    n = min(len(t) for t in targets)                                # rounds every rank stepped into
    assert n >= 6 and all(t[:n] == targets[0][:n] for t in targets), targets
    assert all(k[:n] == kernels[0][:n] for k in kernels)
    assert all(f == finals[0] for f in finals)
    assert np.isfinite(np.concatenate([np.ravel(w) for w in finals[0]])).all()
    m = min(len(s) for s in searches)
    assert m >= 1 and all(s[:m] == searches[0][:m] for s in searches), searches
    assert "reward" in searches[0][0]                                # the batch logs' losses were fitted
    steady = np.array(steps[0][2:n])                                 # after the two warm-up rounds
    fast, slow = steady[:, :3].min(axis=1), steady[:, 3]
    assert (fast > slow).mean() >= 0.7 and steady[:, :3].sum() >= 2 * 3 * slow.sum(), steps[0]
