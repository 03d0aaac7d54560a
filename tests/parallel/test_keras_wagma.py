"""WAGMACallback under horovodrun -np 4 (S=2): exact group means per batch, global every sync_period."""
import numpy as np
import pytest

import keras_helpers
from horovod_hetero.rules.grouping import butterfly_groups
from keras_helpers import Recorder, hh, make_model, rank_data

RANK, SIZE = keras_helpers.init()
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


@pytest.mark.parametrize("group_size", [2, 4], ids=["pairs", "the_whole_job"])
def test_wait_avoiding_ranks_with_different_numbers_of_batches_end_identical(group_size):
    """A rank whose epoch ended serves its peers' group averages (weight 0) while they go on; also
    with S = P (groups of the whole job, as a job shrunk to S ranks has)."""
    model = make_model(RANK)
    x, y = rank_data(RANK, 8 * (3 + RANK))                                 # 3, 4, 5, 6 batches per epoch
    callback = hh.callbacks.WAGMACallback(group_size=group_size, sync_period=4, timeout=60)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
    final = keras_helpers.gathered([w.tolist() for w in keras_helpers.weights(model)], name="keras.wagma.final")
    assert all(np.array_equal(final[0][i], final[r][i]) for r in range(SIZE) for i in range(len(final[0])))


class SharedStep(keras_helpers.keras.callbacks.Callback):
    """After every batch (put it after the WAGMA callback): the strategy's shared step t."""

    def __init__(self, strategy):
        super().__init__()
        self.strategy, self.t = strategy, []

    def on_train_batch_end(self, batch, logs=None):
        self.t.append(self.strategy.t)


@pytest.mark.parametrize("uneven, patience", [(False, 0.0), (True, 0.0), (True, 30.0)],
                         ids=["equal_batches", "rank_r_has_3_plus_r", "rank_r_has_3_plus_r_patient"])
def test_a_second_fit_on_the_same_callback_goes_on_from_the_shared_step(uneven, patience):
    """fit() twice on one callback, 2 epochs each: on_train_end syncs (and the epoch ends, with
    epoch_sync), then training goes on, wait-avoiding. Every fit ends with identical weights and the
    furthest rank's shared step t (12, 24), and the groups follow t. With patience 30 s every pair
    whose ranks both have a batch at t averages fresh (post = the exact mean of their pre), a rank
    whose peer has stopped keeps its own step, and global batches are identical everywhere."""
    batches = 3 + RANK if uneven else 4
    model, before, after = make_model(RANK), Recorder(), Recorder()
    x, y = rank_data(RANK, 8 * batches)
    callback = hh.callbacks.WAGMACallback(group_size=2, sync_period=4, timeout=120, share_epochs=False,
                                          wagma_options={"patience": patience})
    shared = SharedStep(callback.strategy)
    finals, ts_end = [], []
    for _ in range(2):
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[before, callback, shared, after])
        finals.append([w.tolist() for w in keras_helpers.weights(model)])
        ts_end.append(callback.strategy.t)
    records = callback.telemetry.records
    everyone = keras_helpers.gathered((before.kernels, after.kernels, shared.t, [r.get("group") for r in records],
                                       [r.get("stale") for r in records], finals, ts_end),
                                      name=f"keras.wagma.refit.{uneven}.{patience}")
    pre, post, ts, groups, stale, finals, ts_end = ([e[i] for e in everyone] for i in range(7))
    most = 6 if uneven else 4                                          # the furthest rank's batches per epoch
    assert ts_end == [[2 * most, 4 * most]] * SIZE
    for f in range(2):                                                 # identical after every fit
        assert all(np.array_equal(w, v) for r in range(SIZE) for w, v in zip(finals[r][f], finals[0][f]))
    per_epoch = getattr(callback, "epoch_sync", False)                 # joined at every epoch's end, or per fit
    for r in range(SIZE):
        n = 3 + r if uneven else 4
        mine = ([most * e + k for e in range(4) for k in range(1, n + 1)] if per_epoch else
                [2 * most * f + k for f in range(2) for k in range(1, 2 * n + 1)])
        assert ts[r] == mine
        for t, g in zip(ts[r], groups[r]):
            assert g == (None if t % 4 == 0 else [list(x) for x in butterfly_groups(SIZE, 2, t - 1) if r in x][0])
    if not patience:
        return
    at = [{t: i for i, t in enumerate(ts[r])} for r in range(SIZE)]    # rank -> {t: its batch}
    for r in range(SIZE):
        assert not any(stale[r])
    for t in range(1, 4 * most + 1):
        active = [r for r in range(SIZE) if t in at[r]]
        if t % 4 == 0:
            assert all(np.array_equal(post[r][at[r][t]], post[active[0]][at[active[0]][t]]) for r in active)
            continue
        for g in butterfly_groups(SIZE, 2, t - 1):
            members = [r for r in g if t in at[r]]
            if len(members) == 2:
                mean = (np.array(pre[g[0]][at[g[0]][t]]) + np.array(pre[g[1]][at[g[1]][t]])) / np.float32(2)
                assert all(np.array_equal(post[r][at[r][t]], mean) for r in g), (t, g)
            elif members:
                r = members[0]
                assert np.array_equal(post[r][at[r][t]], pre[r][at[r][t]]), (t, r)
