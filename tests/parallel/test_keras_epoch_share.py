"""Keras epochs fast workers can outrun: one ``fit()`` per epoch on ``callback.epoch_indices``, each
rank's share of the epoch proportional to the speed the rounds measured (torch:
``hh.DistributedSampler``)."""
import numpy as np
import pytest

import keras_helpers
from horovod_hetero.runtime.straggler import Slowdown
from keras_helpers import hh, make_model, rank_data

RANK, SIZE = keras_helpers.init()
pytestmark = pytest.mark.skipif(SIZE != 4, reason="written for 4 ranks (slowdown 1,1,1,4)")
N = 8 * 48                                           # one dataset, the same on every rank


def test_fit_per_epoch_on_speed_proportional_shares_sees_every_sample_once():
    x, y = rank_data(0, N)
    model = make_model(RANK)
    callback = hh.callbacks.ESyncCallback(slowdown=Slowdown(RANK, "1,1,1,4", base_step_s=0.05))
    shares = []
    for epoch in range(3):
        idx = callback.epoch_indices(len(x), epoch)
        shares.append(idx)
        model.fit(x[idx], y[idx], batch_size=8, initial_epoch=epoch, epochs=epoch + 1, shuffle=False, verbose=0,
                  callbacks=[callback])
    everyone = keras_helpers.gathered((shares, [w.tolist() for w in keras_helpers.weights(model)]), name="share")
    shares, finals = zip(*everyone)
    for epoch in range(3):                               # every sample once per epoch, over the ranks
        assert sorted(i for rank in shares for i in rank[epoch]) == list(range(N))
    assert [len(s[0]) for s in shares] == [N // 4] * 4   # the first epoch: no round yet, an even split
    later = [len(s[2]) for s in shares]                  # measured 1:4: the slow rank takes far less
    assert later[3] * 1.5 < min(later[:3]), later
    assert all(f == finals[0] for f in finals)           # fit's end synced every epoch
    assert np.isfinite(np.concatenate([np.ravel(w) for w in finals[0]])).all()
