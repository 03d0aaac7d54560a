"""Keras epochs fast workers can outrun: one ``fit()`` per epoch on ``callback.epoch_indices``, each
rank's share of the epoch proportional to the speed the rounds measured (torch:
``hh.DistributedSampler``)."""
import numpy as np
import pytest

import keras_helpers
from horovod_hetero.runtime.speeds import SETTLE_ROUNDS
from horovod_hetero.runtime.straggler import Slowdown
from horovod_hetero.strategies.base import AVERAGE, CONTINUE
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


class Recorder(keras_helpers.keras.callbacks.Callback):
    """After the strategy callback: each epoch's shares as it computed them (at the epoch's begin and
    end), this rank's batches, and the weights at the epoch's end."""

    def __init__(self, strategy_callback):
        super().__init__()
        self.strategy_callback = strategy_callback
        self.shares, self.ends, self.batches, self.finals = [], [], [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.shares.append(self.strategy_callback.epoch_shares)
        self.batches.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.batches[-1] += 1

    def on_epoch_end(self, epoch, logs=None):
        self.ends.append(self.strategy_callback.epoch_shares)
        self.finals.append([w.tolist() for w in keras_helpers.weights(self.model)])


def forever(x, y, batch):
    """Batches of ``x``, ``y`` in turn, endlessly."""
    while True:
        for i in range(0, len(x), batch):
            yield x[i:i + batch], y[i:i + batch]


class StopAt(keras_helpers.keras.callbacks.Callback):
    """Before the strategy callback: ends ``fit`` at ``epoch``'s end, as ``EarlyStopping`` would."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            self.model.stop_training = True


class EverySecond(hh.ModelAveraging):
    """Rounds on a fixed schedule (every second batch), fast ranks free to take more batches (not lockstep)."""

    def decide(self, report):
        return AVERAGE if self.step % 2 == 0 else CONTINUE


@pytest.mark.parametrize("steps_per_epoch", [None, 12])
def test_fit_shares_each_epoch_by_speed_and_every_rank_ends_it_together(steps_per_epoch):
    """Horovod's pattern with the callback's default (``share_epochs``): ``fit(x, y, batch_size)`` on
    arrays (Keras counts the epoch's batches) and ``fit(..., steps_per_epoch=N)``. The fast ranks take
    Keras' count and the slow one what it takes in the same time, every rank computing the same shares:
    in the first epoch from its fourth measuring round on (the slow rank ends that epoch early too),
    then from each epoch's begin; weights identical at every epoch's end; a stop set by another callback
    still ends ``fit``, the callback's own ends only the epoch.

    The rounds come on a fixed schedule (every second batch, a strategy that lets fast ranks take more
    batches: LocalSGD's ranks step together, and never share), so that the first epoch holds the four
    measuring rounds on every rank (at its 8th batch of 12). With ESync they come when the state server
    answers: a slow rank whose queries time out under load falls back to 8 local steps a round and can end
    a first epoch of 12 batches after the start-up round alone, without shares (CI, once: the slow rank had
    none while a fast one took them from a later round)."""
    steps = steps_per_epoch or 12
    x, y = rank_data(RANK, 8 * steps)
    model = make_model(RANK)
    callback = hh.callbacks.HeteroSyncCallback(EverySecond(), slowdown=Slowdown(RANK, "1,1,1,4", base_step_s=0.05))
    recorder = Recorder(callback)
    if steps_per_epoch:                               # an endless stream, as dataset.repeat() (any backend)
        data = dict(x=forever(x, y, 8), steps_per_epoch=steps_per_epoch, shuffle=False)
    else:
        data = dict(x=x, y=y, batch_size=8, shuffle=False)
    history = model.fit(**data, epochs=5, verbose=0, callbacks=[StopAt(3), callback, recorder])
    assert len(history.history["loss"]) == 4                          # StopAt(3) ended fit, the shares did not
    everyone = keras_helpers.gathered((recorder.shares, recorder.ends, recorder.batches, recorder.finals),
                                      name=f"shared.{steps}")
    shares, ends, batches, finals = zip(*everyone)
    assert all(s == shares[0] for s in shares) and all(e[1:] == ends[0][1:] for e in ends)   # the same everywhere
    # no speed at the first epoch's begin: its shares come with its fourth measuring round, which a rank
    # still in the epoch takes (every such rank the same: the slow one; the fast ones may be done by then)
    first = [e[0] for e in ends]
    assert shares[0][0] is None and first[3] is not None and all(f in (None, first[3]) for f in first), first
    assert max(first[3]) == steps and first[3][3] < steps, first
    # the slow rank ends the first epoch at its share, or at the round that set it if it had passed it
    assert [b[0] for b in batches] == [steps] * 3 + [max(first[3][3], 2 * (SETTLE_ROUNDS + 1))], batches
    assert ends[0][1:4] == shares[0][1:4]                             # later epochs: shares from their begin
    for epoch in range(1, 4):
        share = shares[0][epoch]
        assert share is not None and max(share) == steps and share[3] < steps, share
        assert [b[epoch] for b in batches] == share                   # each rank ended its epoch at its share
        assert all(f[epoch] == finals[0][epoch] for f in finals)      # synced at every epoch's end


class GatherEveryBatch(keras_helpers.keras.callbacks.Callback):
    """A user's collective at every batch (an allgather of the batch number), as a metric callback might run."""

    def __init__(self):
        super().__init__()
        self.gathered = []

    def on_train_batch_end(self, batch, logs=None):
        self.gathered.append(keras_helpers.gathered(batch, name=f"user.{len(self.gathered)}"))


@pytest.mark.parametrize("strategy", [hh.LocalSGD(period=3), hh.WAGMA(group_size=2, sync_period=4, wait_avoiding=False)],
                         ids=["LocalSGD", "WAGMA without wait-avoidance"])
def test_a_lockstep_strategy_keeps_keras_count_and_a_collective_of_ones_own_per_batch_meets(strategy):
    """Ranks of different speeds under a strategy whose ranks step together take Keras' count: a user's
    collective at every batch meets its peers at every batch (no rank waits in the epoch's end sync)."""
    x, y = rank_data(RANK, 8 * 9)
    model = make_model(RANK)
    callback = hh.callbacks.HeteroSyncCallback(strategy, slowdown=Slowdown(RANK, "1,1,1,4", base_step_s=0.02))
    user = GatherEveryBatch()
    model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[callback, user])
    assert len(user.gathered) == 27 and all(g == [i % 9] * 4 for i, g in enumerate(user.gathered))
    assert callback.epoch_shares is None
