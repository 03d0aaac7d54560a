"""WAGMACallback under horovodrun -np 4 (S=2): exact group means per batch, global every sync_period."""
import numpy as np
import pytest

import keras_helpers
from horovod_hetero.rules.grouping import butterfly_groups
from keras_helpers import Recorder, hh, make_model, rank_data

RANK, SIZE = keras_helpers.init(process_sets=hh.wagma_process_sets(group_size=2))
pytestmark = pytest.mark.skipif(SIZE != 4, reason="written for 4 ranks (S=2)")


def test_group_batches_hold_the_exact_pair_mean_global_batches_all_identical():
    model, before, after = make_model(RANK), Recorder(), Recorder()      # around the averaging callback
    x, y = rank_data(RANK, 48)                                             # 6 batches of 8
    callback = hh.callbacks.WAGMACallback(group_size=2, sync_period=3, wagma_options={"wait_avoiding": False})
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[before, callback, after])
    everyone = keras_helpers.gathered((before.kernels, after.kernels), name="keras.wagma")
    pre, post = (np.array([e[i] for e in everyone]) for i in (0, 1))     # [rank, batch, ...]
    groups = [r.get("group") for r in callback.telemetry.records]
    for batch in range(6):
        if (batch + 1) % 3 == 0:                                     # global: everyone identical
            assert all(np.array_equal(post[0, batch], post[r, batch]) for r in range(SIZE))
            assert groups[batch] is None
            continue
        pair = [g for g in butterfly_groups(SIZE, 2, batch) if RANK in g][0]
        assert groups[batch] == list(pair)
        for g in butterfly_groups(SIZE, 2, batch):
            mean = (pre[g[0], batch] + pre[g[1], batch]) / np.float32(2)
            assert np.array_equal(post[g[0], batch], mean) and np.array_equal(post[g[1], batch], mean)
        assert not np.array_equal(post[0, batch], post[3, batch])    # different groups differ


def test_wait_avoiding_ranks_with_different_numbers_of_batches_end_identical():
    model = make_model(RANK)
    x, y = rank_data(RANK, 8 * (3 + RANK))                                 # 3, 4, 5, 6 batches per epoch
    callback = hh.callbacks.WAGMACallback(group_size=2, sync_period=4, timeout=120)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
    final = keras_helpers.gathered([w.tolist() for w in keras_helpers.weights(model)], name="keras.wagma.final")
    assert all(np.array_equal(final[0][i], final[r][i]) for r in range(SIZE) for i in range(len(final[0])))
