"""The checklist's proof, Keras: the same test-only strategy, through HeteroSyncCallback."""
import numpy as np

import keras_helpers
from contract_strategy import SpeedProportional
from horovod_hetero.runtime.straggler import Slowdown
from keras_helpers import Recorder, hh, make_model, rank_data

RANK, SIZE = keras_helpers.init()


def test_every_rank_plans_the_same_identical_after_rounds_uneven_data_ends():
    model, recorder = make_model(RANK), Recorder()
    x, y = rank_data(RANK, 8 * (40 if RANK < 3 else 10))            # fast ranks get more batches
    callback = hh.callbacks.HeteroSyncCallback(SpeedProportional(),
                                               slowdown=Slowdown(RANK, "1,1,1,4", base_step_s=0.02))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback, recorder])
    synced = [i for i, r in enumerate(callback.telemetry.records) if r["synced"]]
    everyone = keras_helpers.gathered((callback.strategy.plans, [recorder.kernels[i].tolist() for i in synced],
                                       [w.tolist() for w in keras_helpers.weights(model)]), name="contract.keras")
    plans, kernels, finals = zip(*everyone)
    assert all(p == plans[0] for p in plans)
    n = min(len(k) for k in kernels)                               # rounds every rank stepped into
    assert n >= 3 and all(k[:n] == kernels[0][:n] for k in kernels)
    assert all(f == finals[0] for f in finals)
    assert any(plan[3] == 1 and min(plan[:3]) >= 2 for plan in plans[0][1:]), plans[0]
    assert np.isfinite(np.concatenate([np.ravel(w) for w in finals[0]])).all()
