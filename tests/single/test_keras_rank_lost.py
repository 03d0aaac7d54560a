"""Keras synchronous training (``hh.DistributedOptimizer``) with a lost rank (issue 16): the gradient
average runs inside Keras' train step, so its failure comes out of ``fit()``; the hh callbacks wrap
``model.train_function`` so that it is a ``RankLostError`` naming the step and the lost rank.

A real Keras ``fit`` over a real ``hh.DistributedOptimizer``, whose collectives are a fake that fails
at a chosen gradient average: compiled (TensorFlow's ``OpError`` from inside the graph, as Horovod's
op raises it) and eager (``HorovodInternalError``, as the torch backend's collectives raise it).
"""
import os

import numpy as np
import pytest
from horovod.common.exceptions import HorovodInternalError

from horovod_hetero.keras._backend import keras_module
from horovod_hetero.keras._optimizer import averaging_optimizer
from horovod_hetero.keras._train_guard import GuardedTrainFunction, begin_training
from horovod_hetero.errors import CollectiveTimeoutError, RankLostError, troubleshooting

keras = keras_module()
pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow" or int(keras.__version__[0]) < 3,
                                reason="Keras 3 with the TensorFlow backend")
import tensorflow as tf  # noqa: E402

SHUTDOWN = "Horovod has been shut down. This was caused by an exception on one of the ranks"
#: What the op that was running reports when Horovod's thread fails: Gloo's error, under the op's node name
GLOO = "[gloo/transport/tcp/pair.cc:589] Read error [127.0.0.1]:25487: Connection reset by peer"


class StepCollectives:
    """The optimizer's collectives on rank 2 of 4, whose ``fail_at``-th gradient average fails with
    ``failure`` (``"op"``: a TensorFlow op error inside the step, as Horovod's op raises it)."""

    rank, size, included = 2, 4, True

    def __init__(self, fail_at, failure="op", message=SHUTDOWN):
        self.fail_at, self.failure, self.message = fail_at, failure, message
        self.count = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.peers_known = 0

    def mean(self, tensors, *, name):
        self.count.assign_add(1)
        if self.failure == "op":
            with tf.name_scope(name):                # Horovod names its op so: name="horovod_hetero.gradients"
                check = tf.debugging.assert_less(self.count, tf.constant(self.fail_at, tf.int64), message=self.message)
            with tf.control_dependencies([check]):
                return [tf.identity(t) for t in tensors]
        if int(self.count.numpy()) >= self.fail_at:
            raise self.failure
        return list(tensors)

    def timed_mean(self, tensors, *, name):
        return self.mean(tensors, name=name), 0.0

    def know_peers(self):
        self.peers_known += 1

    def lost_ranks(self):
        return {1: "died"}


class Begin(keras.callbacks.Callback):
    """What every hh callback does in ``on_train_begin`` (they need ``hvd.init()`` for the rest)."""

    def on_train_begin(self, logs=None):
        begin_training(self.model)


def fitted(collectives, run_eagerly=False, optimizer=None):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer or averaging_optimizer(keras.optimizers.SGD(0.1), collectives), loss="mse",
                  run_eagerly=run_eagerly)
    return model


def fit(model, batches):
    x, y = np.ones((batches * 2, 3), "float32"), np.zeros((batches * 2, 2), "float32")
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0, callbacks=[Begin()])


@pytest.mark.parametrize("run_eagerly, said", [(False, GLOO), (False, SHUTDOWN), (True, SHUTDOWN)])
def test_a_failed_gradient_average_in_fit_is_a_rank_lost_error_naming_the_step_and_the_rank(run_eagerly, said):
    collectives = StepCollectives(fail_at=3, message=said)
    model = fitted(collectives, run_eagerly)
    with pytest.raises(RankLostError) as raised:
        fit(model, 5)
    assert type(raised.value) is RankLostError
    message = str(raised.value)
    assert message.startswith("the gradient allreduce of step 3 (round 0, step 3) failed on rank 2: a rank was "
                              "lost (rank 1 died). Every rank stops;"), message
    # the line that says what happened, not TensorFlow's heading ("Graph execution error:") or the op's stack
    cause, link = message.split(" Cause: ")[1].rsplit("\n", 1)
    assert link == troubleshooting("troubleshooting-rank-lost")
    assert cause.startswith("InvalidArgumentError: ") and said in cause and "\n" not in cause, cause
    assert isinstance(raised.value.__context__, tf.errors.InvalidArgumentError)   # Keras drops __cause__
    # compiled, the optimizer's increment of the failed step need not wait for the average: the step is counted
    assert collectives.peers_known == 1 and int(model.optimizer.iterations.numpy()) in ((2,) if run_eagerly else (2, 3))


def test_steps_count_on_across_fits_and_the_train_function_is_wrapped_once():
    collectives = StepCollectives(fail_at=4, failure=HorovodInternalError(SHUTDOWN))
    model = fitted(collectives, run_eagerly=True)
    fit(model, 2)
    assert isinstance(model.train_function, GuardedTrainFunction)
    first = model.train_function
    with pytest.raises(RankLostError, match=r"^the gradient allreduce of step 4 \(round 0, step 4\)") as raised:
        fit(model, 3)
    assert model.train_function is first and collectives.peers_known == 1
    assert str(raised.value).endswith(f"Cause: HorovodInternalError: {SHUTDOWN}\n{troubleshooting('troubleshooting-rank-lost')}")
    assert isinstance(raised.value.__context__, HorovodInternalError)


def test_a_timeout_stays_a_timeout_and_other_errors_pass_unchanged():
    model = fitted(StepCollectives(fail_at=2, failure=CollectiveTimeoutError("the gradient average: 5 s")), True)
    with pytest.raises(CollectiveTimeoutError, match=r"step 2 \(round 0, step 2\) failed on rank 2: a rank was "
                                                     r"lost \(rank 1 died\).*Cause: CollectiveTimeoutError: the"):
        fit(model, 3)
    model = fitted(StepCollectives(fail_at=1, failure=ValueError("a bad batch")), True)
    with pytest.raises(ValueError, match="^a bad batch$"):
        fit(model, 3)


def test_not_wrapped_under_hvd_elastic_nor_for_an_optimizer_that_averages_nothing(monkeypatch):
    collectives = StepCollectives(fail_at=1, failure=HorovodInternalError(SHUTDOWN))
    monkeypatch.setitem(os.environ, "HOROVOD_ELASTIC", "1")        # its reset needs Horovod's own error
    with pytest.raises(HorovodInternalError):
        fit(fitted(collectives, run_eagerly=True), 2)
    assert collectives.peers_known == 0
    monkeypatch.delitem(os.environ, "HOROVOD_ELASTIC")
    model = fitted(None, optimizer=keras.optimizers.SGD(0.1))
    fit(model, 2)
    assert not isinstance(model.train_function, GuardedTrainFunction)
