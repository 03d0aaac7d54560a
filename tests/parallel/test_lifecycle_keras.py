"""What a strategy opens, the library closes: nothing outlives fit() (Keras, on_train_end)."""
import pytest

import keras_helpers
from keras_helpers import hh, keras, make_model, rank_data
from lifecycle import opened, settled

RANK, SIZE = keras_helpers.init()
pytestmark = pytest.mark.skipif(SIZE != 4, reason="written for 4 ranks (WAGMA S=2)")


class Probe(keras.callbacks.Callback):
    """What is open in the middle of training."""

    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            self.during = opened()


def test_esync_and_wagma_callbacks_close_what_they_opened_at_the_end_of_fit():
    model = make_model(RANK)
    x, y = rank_data(RANK, 48)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[hh.callbacks.LocalSGDCallback(period=2)])
    keras_helpers.gathered(0, name="lifecycle.barrier")
    before = settled(opened())
    seen = {}
    for name, callback in [("esync", hh.callbacks.ESyncCallback()),
                           ("wagma", hh.callbacks.WAGMACallback(group_size=2, sync_period=3))]:
        probe = Probe()
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback, probe])
        seen[name], seen[name + " closed"] = probe.during, settled(before)
        keras_helpers.gathered(0, name=f"lifecycle.barrier.{name}")
    assert seen["esync closed"] == before and seen["wagma closed"] == before
    if RANK == 0:
        assert len(seen["esync"]["listening"]) > len(before["listening"])
    assert "horovod_hetero-group-responder" in seen["wagma"]["threads"]
