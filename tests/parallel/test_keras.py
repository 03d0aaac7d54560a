"""Keras callbacks under horovodrun: identical weights at averaging batches and at the end (any
Keras, any supported backend: see keras_helpers)."""
import numpy as np

import keras_helpers
from keras_helpers import Recorder, hh, keras

RANK, SIZE = keras_helpers.init()


def make_model():
    return keras_helpers.make_model(RANK)


def rank_data(n):
    return keras_helpers.rank_data(RANK, n)


def gathered(arrays):
    return keras_helpers.gathered([a.tolist() for a in arrays], name="test.keras.gather")


def test_localsgd_callback_identical_at_averaging_batches_and_at_the_end():
    model, recorder = make_model(), Recorder()
    x, y = rank_data(40)                              # 5 batches of 8 per epoch, 2 epochs
    callback = hh.callbacks.LocalSGDCallback(period=3, share_epochs=False)     # every rank every batch
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[callback, recorder])
    per_rank = gathered(recorder.kernels)
    final = gathered(keras_helpers.weights(model))
    identical = [all(np.array_equal(per_rank[0][b], per_rank[r][b]) for r in range(SIZE))
                 for b in range(len(recorder.kernels))]
    # batches counted across epochs: averaging after batches 3, 6, 9 (1-based)
    assert identical == [False, False, True, False, False, True, False, False, True, False]
    assert all(np.array_equal(final[0][i], final[r][i]) for r in range(SIZE) for i in range(len(final[0])))
    assert len(model.weights) == 8 and callback.state_dict()["strategy"]["step"] == 10


def test_averaging_batch_holds_the_exact_mean_of_the_ranks_weights():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    model.weights[0].assign([[float(RANK)]])
    recorder = Recorder()
    model.fit(np.ones((4, 1), "float32"), np.ones((4, 1), "float32"), batch_size=2, epochs=1, verbose=0,
              callbacks=[hh.callbacks.HeteroSyncCallback(hh.LocalSGD(period=2)), recorder])
    assert [k[0, 0] for k in recorder.kernels] == [float(RANK), np.mean(range(SIZE))]


def test_ranks_with_different_numbers_of_batches_end_identical():
    model = make_model()
    x, y = rank_data(8 * (2 + RANK))                  # 2, 3, 4, 5 batches per epoch
    model.fit(x, y, batch_size=8, epochs=3, verbose=0,
              callbacks=[hh.callbacks.LocalSGDCallback(period=2, timeout=120)])
    final = gathered(keras_helpers.weights(model))
    assert all(np.array_equal(final[0][i], final[r][i]) for r in range(SIZE) for i in range(len(final[0])))


def test_a_gradient_strategy_needs_hh_distributed_optimizer_and_says_so_when_training_begins():
    model = make_model()
    x, y = rank_data(16)
    try:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[hh.callbacks.HeteroSyncCallback(hh.Synchronous())])
    except TypeError as e:
        assert str(e).startswith("Synchronous averages the gradients inside every step: compile the model with "
                                 "hh.DistributedOptimizer(optimizer) (Keras 3), not with SGD"), e
    else:
        raise AssertionError("HeteroSyncCallback(Synchronous()) over a plain optimizer did not raise")


def test_esync_callback_slowest_runs_one_batch_per_round_all_identical_at_the_end():
    from horovod_hetero.runtime.straggler import Slowdown

    model = make_model()
    x, y = rank_data(8 * (24 if RANK == 3 else 96))    # fast ranks get the data they can process
    callback = hh.callbacks.ESyncCallback(slowdown=Slowdown(RANK, "1,1,1,4", base_step_s=0.03))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    per_round = [r["local_steps"] for r in callback.telemetry.records if r["synced"]]
    final = gathered(keras_helpers.weights(model))
    rounds = keras_helpers.gathered(per_round, name="test.keras.rounds")
    assert all(np.array_equal(final[0][i], final[r][i]) for r in range(SIZE) for i in range(len(final[0])))
    assert callback.epoch_shares is None              # each rank's own number of batches: not shared by speed
    # judge the rounds while the slowest still trains: round 1 is warm-up (the first batch
    # traces the tf.function, which distorts every rank's measured capability), and once the
    # slowest has left, the fast ranks are each other's slowest and rightly average every step
    while_slow = len(rounds[3]) - 1
    steady = [r[1:while_slow] for r in rounds]
    assert len(steady[3]) >= 3 and set(steady[3]) == {1}        # the slowest: one batch per round
    assert all(np.mean(steady[r]) >= 2.0 for r in range(3)), rounds


def test_collectives_pair_by_name_not_by_the_order_ranks_enqueue_them():
    """Horovod matches collectives by name, and TensorFlow's eager ops carry none: the backend's
    collectives must still name theirs. Even ranks enqueue "a" then "b", odd ranks "b" then "a"
    (the first from a second thread, as the group responder does): each sum holds only its own name's
    values (paired by order, "a" on rank 0 would meet "b" on rank 1)."""
    import threading
    import time

    from horovod_hetero.keras._backend import collectives_class

    collectives = collectives_class()(None, 60.0, owner="test")
    first, second = ("a", "b") if RANK % 2 == 0 else ("b", "a")
    value = {"a": float(1 + RANK), "b": float(100 * (1 + RANK))}
    sums = {}

    def run(name):
        sums[name] = collectives.allreduce_sum([], [value[name]], name=f"test.by_name.{name}", what=name)[1]

    thread = threading.Thread(target=run, args=(first,))
    thread.start()
    time.sleep(0.5)                     # the first is enqueued everywhere before the second
    run(second)
    thread.join(60)
    total = SIZE * (SIZE + 1) / 2
    assert sums == {"a": [total], "b": [100 * total]}
