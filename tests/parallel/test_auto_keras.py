"""``hh.callbacks.AutoCallback`` (Keras): with a persistent straggler it starts as Synchronous through
``hh.DistributedOptimizer`` and leaves it at the sixth batch of the first epoch (every rank at that batch)
for a model-averaging strategy, every rank alike; the batches left in that epoch are shared by speed, and the
weights are identical at every epoch's end; on Keras 2, whose optimizer cannot switch, it is refused by name."""
import numpy as np
import pytest

import keras_helpers
from horovod_hetero.rules.partition import epoch_steps
from horovod_hetero.runtime.straggler import Slowdown
from keras_helpers import hh, keras, make_model

RANK, SIZE = keras_helpers.init()


class Ends(keras.callbacks.Callback):
    """After the strategy callback: the strategy Auto runs and the weights at every epoch's end, and the
    speeds the first epoch's share came from (the ranks' step times at the batch that set it)."""

    def __init__(self, auto):
        super().__init__()
        self.auto, self.running, self.finals, self.shares, self.speeds = auto, [], [], [], None

    def on_train_batch_end(self, batch, logs=None):
        if self.speeds is None and self.auto.epoch_shares is not None:
            self.speeds = self.auto._hh.speeds.step_times.tolist()

    def on_epoch_end(self, epoch, logs=None):
        self.running.append(self.auto.strategy.current_name)
        self.shares.append(self.auto.epoch_shares)
        self.finals.append([w.tolist() for w in keras_helpers.weights(self.model)])


def data(n):
    rng = np.random.default_rng(RANK)
    return rng.normal(size=(n, 6)).astype("float32"), rng.integers(0, 3, size=n)


@pytest.mark.skipif(hh.keras_major() < 3, reason="Keras 3: hh.DistributedOptimizer switches its average")
def test_auto_leaves_synchronous_at_an_epochs_end_with_identical_weights():
    x, y = data(8 * 12)
    model = make_model(RANK, optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(0.05)))
    auto = hh.callbacks.AutoCallback(auto_options={"candidates": ["sync", "esync", "elasticbsp"], "measure_every": 3},
                                     batch_size=8, slowdown=Slowdown(RANK, "1,1,1,4", base_step_s=0.02))
    ends = Ends(auto)
    model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
              callbacks=[hh.callbacks.BroadcastGlobalVariablesCallback(0), auto, ends])
    everyone = keras_helpers.gathered((ends.running, ends.finals, auto.strategy.switches, ends.shares, ends.speeds),
                                      name="test.auto.keras")
    running, finals, switches, shares, speeds = zip(*everyone)
    assert all(r == running[0] for r in running) and all(s == switches[0] for s in switches)
    assert running[0][0] != "sync" and switches[0][0]["from"] == "sync", running[0]
    assert switches[0][0]["step"] == 6, switches[0]                            # within epoch 0's 12 batches
    first = shares[0][0]                         # epoch 0's: the 6 batches after the switch, by speed
    assert all(s[0] == first for s in shares) and first is not None, [s[0] for s in shares]
    # the rule applied to the measured speeds (exact: a 20-ms step under CI load outlasts its pad, so a fixed
    # split would be timing-dependent), and the straggler takes fewer than every fast rank
    assert all(s == speeds[0] for s in speeds) and first == [6 + int(n) for n in epoch_steps(6, speeds[0])], speeds
    assert 6 <= first[3] < min(first[:3]), first
    for epoch in range(3):
        assert all(f[epoch] == finals[0][epoch] for f in finals), epoch


@pytest.mark.skipif(hh.keras_major() >= 3, reason="Keras 2: hh.DistributedOptimizer is Horovod's")
def test_keras_2_refuses_auto_by_name():
    x, y = data(16)
    model = make_model(RANK, optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(0.05)))
    with pytest.raises(TypeError, match=r"^Auto runs strategies of either kind in turn: compile the model with "
                                        r"hh\.DistributedOptimizer\(optimizer\) on Keras 3"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[hh.callbacks.AutoCallback()])
