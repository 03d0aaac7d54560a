"""The checklist's proof, Keras: the same test-only strategy through HeteroSyncCallback, and the
library's planned strategies through their callbacks, with the same assertions."""
import numpy as np
import pytest

import keras_helpers
from contract_strategy import PLANNED, SpeedProportional, replan
from horovod_hetero.runtime.straggler import Slowdown
from keras_helpers import Recorder, hh, make_model, rank_data

RANK, SIZE = keras_helpers.init()
#: the strategies of the torch test (``contract_strategy.PLANNED``) through their callbacks
CALLBACKS = {"test-only": lambda **kw: hh.callbacks.HeteroSyncCallback(SpeedProportional(), **kw),
             "ElasticBSP": lambda **kw: hh.callbacks.ElasticBSPCallback(lookahead=8, **kw),
             "DSSP": lambda **kw: hh.callbacks.DSSPCallback(staleness=(1, 6), **kw)}


@pytest.mark.parametrize("name", CALLBACKS)
def test_every_rank_plans_the_same_identical_after_rounds_uneven_data_ends(name):
    model, recorder = make_model(RANK), Recorder()
    x, y = rank_data(RANK, 8 * (40 if RANK < 3 else 10))            # fast ranks get more batches
    callback = CALLBACKS[name](slowdown=Slowdown(RANK, "1,1,1,4", base_step_s=0.05))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback, recorder])
    synced = [i for i, r in enumerate(callback.telemetry.records) if r["synced"]]
    plans = [tuple(callback.telemetry.records[i]["plan"]) for i in synced]
    stats = [callback.telemetry.records[i]["ranks"] for i in synced]
    everyone = keras_helpers.gathered((plans, [recorder.kernels[i].tolist() for i in synced],
                                       [w.tolist() for w in keras_helpers.weights(model)], stats),
                                      name=f"contract.keras.{name}")
    plans, kernels, finals, stats = zip(*everyone)
    n = min(len(k) for k in kernels)                               # rounds every rank stepped into
    assert n >= 5 and all(p[:n] == plans[0][:n] for p in plans)
    assert all(k[:n] == kernels[0][:n] for k in kernels)
    assert all(s[:n] == stats[0][:n] for s in stats)                # the same speeds everywhere
    assert all(f == finals[0] for f in finals)
    assert any(plan[3] == 1 and min(plan[:3]) >= 2 for plan in plans[0][1:]), plans[0]
    # each plan is the strategy's rule applied to its round's statistics (measured times: the rule's exact
    # answer, not a fixed plan, which a Keras step outlasting its 50 ms pad on shared cores would break)
    assert list(plans[0][1:n]) == [replan(PLANNED[name], s) for s in stats[0][1:n]], (plans[0], stats[0])
    assert [s["local_steps"] for s in stats[0][1:n]] == [list(p) for p in plans[0][:n - 1]]   # each plan was run
    assert np.isfinite(np.concatenate([np.ravel(w) for w in finals[0]])).all()
