"""The strategy callbacks' state inside Keras checkpoints (``keras/_checkpoint.py``), one process, no Horovod:
the state of every strategy survives the file exactly, a plain Keras load of such a file sees the same model
and optimizer as without it, and the state comes back through ``load_checkpoint_state`` or ``load_weights``."""
import copy
import json
import warnings

import numpy as np
import pytest

from horovod_hetero.strategies.registry import REGISTRY, configured

hh = pytest.importorskip("horovod_hetero.keras")
from horovod_hetero.keras._checkpoint import ATTRIBUTE, carry_state, decode, encode, read_state  # noqa: E402

keras = hh.keras_module()


def counters(name):
    """A controller's ``state_dict()`` for strategy ``name``, its counters moved off their start."""
    strategy = configured(name)
    state = strategy.state_dict()
    planned = {"plan": [3, 1], "plan_left": 2, "plan_done": 1} if "plan" in state else {}   # Auto's: the current's
    inner = dict(state, step=7, **planned)
    return {"strategy": inner, "rounds": {"round": 2, "steps_since_round": 1}}


@pytest.mark.parametrize("name", [n for n in REGISTRY if n != "sync"])
def test_every_strategys_state_survives_the_entry_exactly(name):
    state = counters(name)
    state["aggregation"] = {"start": [np.arange(3.0), np.full((2, 2), 0.5, np.float32)], "momentum": None}
    back = decode(encode(copy.deepcopy(state)))
    assert back["aggregation"]["momentum"] is None
    assert [a.tolist() for a in back["aggregation"]["start"]] == [[0.0, 1.0, 2.0], [[0.5, 0.5], [0.5, 0.5]]]
    assert back["aggregation"]["start"][1].dtype == np.float32
    back.pop("aggregation"), state.pop("aggregation")
    assert back == state
    fresh = configured(name)
    fresh.load_state_dict(back["strategy"])
    assert fresh.state_dict() == state["strategy"]


@pytest.mark.parametrize("count", ["2", 2, 10**12, -1, 1.0, True])
def test_an_entry_that_is_not_a_state_is_refused_by_name(count):
    assert decode({}) is None
    with pytest.raises(ValueError, match="not a horovod-hetero strategy state"):
        decode({"state": np.frombuffer(b"\xff\xfe", np.uint8)})
    with pytest.raises(ValueError, match="not a horovod-hetero strategy state"):
        decode({"state": np.frombuffer(b"[" * 100000, np.uint8)})
    text = '{"aggregation": {"start": %s, "momentum": null}}' % json.dumps(count)
    with pytest.raises(ValueError, match="lacks tensors of 'start'"):
        decode({"state": np.frombuffer(text.encode(), np.uint8), "start.0": np.zeros(1)})


def test_a_state_that_does_not_fit_the_strategy_is_refused_when_loaded_not_at_the_first_batch():
    callback = hh.callbacks.LocalSGDCallback(period=8)
    good = counters("localsgd")
    for bad, match in [({"strategy": good["strategy"]}, "'strategy' and 'rounds'"),
                       (dict(good, rounds={"round": "2", "steps_since_round": 0}), "must be an int"),
                       (dict(good, strategy={"kind": "LocalSGD"}), "not a state of LocalSGD"),
                       (dict(good, strategy=dict(good["strategy"], kind="ESync")),
                        r"^the state of ESync holds arguments it does not take: .*'period'"),
                       (dict(good, strategy=dict(good["strategy"], kind="Mine")), "which the registry does not hold")]:
        with pytest.raises((ValueError, TypeError), match=match):
            callback.load_state_dict(bad)
    assert callback.state_dict() is None


def model_of(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    model.fit(np.ones((8, 4)), np.ones((8, 3)), verbose=0)          # builds the optimizer's variables
    return model


@pytest.fixture(params=["ckpt.weights.h5", "ckpt.keras"])
def saved(request, tmp_path):
    """A model trained by a LocalSGD callback holding ``counters("localsgd")``, saved to a file."""
    model, callback = model_of(), hh.callbacks.LocalSGDCallback(period=8)
    callback.load_state_dict(counters("localsgd"))                  # before fit: the pending state
    carry_state(model, callback)                                    # what fit's on_train_begin does
    path = str(tmp_path / request.param)
    (model.save if path.endswith(".keras") else model.save_weights)(path)
    return model, path


def test_a_plain_keras_load_of_the_file_sees_the_model_and_optimizer_as_without_the_state(saved):
    model, path = saved
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)       # e.g. Keras 3: "Skipping variable loading for optimizer"
        if path.endswith(".keras"):
            plain = keras.models.load_model(path)
        else:
            plain = model_of(seed=1)
            plain.load_weights(path)
    assert ATTRIBUTE not in plain.__dict__ and len(plain.layers) == len(model.layers) == 1
    assert [w.tolist() for w in plain.get_weights()] == [w.tolist() for w in model.get_weights()]
    assert [np.asarray(v).tolist() for v in plain.optimizer.variables] == \
        [np.asarray(v).tolist() for v in model.optimizer.variables]


def test_the_state_comes_back_by_load_checkpoint_state_and_not_by_load_weights(saved):
    _, path = saved
    assert read_state(path) == counters("localsgd")
    resumed = hh.callbacks.LocalSGDCallback(period=8)
    assert resumed.load_checkpoint_state(path) is True and resumed.state_dict() == counters("localsgd")
    carrying, callback = model_of(seed=1), hh.callbacks.LocalSGDCallback(period=8)
    carry_state(carrying, callback)
    carrying.load_weights(path)                 # e.g. rank 0 alone, to evaluate: no counters move
    assert callback.state_dict() is None


def test_another_strategys_state_switches_the_callback_to_that_strategy(saved):
    """A checkpoint taken after ``set_strategy`` holds the strategy then running: loading it brings it back."""
    _, path = saved
    esync = hh.callbacks.ESyncCallback()
    assert esync.load_checkpoint_state(path) is True
    assert type(esync.strategy).__name__ == "LocalSGD" and esync.strategy.config() == {"args": [], "kwargs": {"period": 8}}
    assert esync.state_dict() == counters("localsgd")


def test_another_strategys_state_that_cannot_be_rebuilt_warns_and_is_not_loaded(tmp_path):
    model, callback = model_of(), hh.callbacks.LocalSGDCallback(period=8)
    state = counters("localsgd")
    state["strategy"]["config"] = None                 # a callable schedule is not saved
    callback.load_state_dict(state)
    carry_state(model, callback)
    path = str(tmp_path / "ckpt.weights.h5")
    model.save_weights(path)
    esync = hh.callbacks.ESyncCallback()
    with pytest.warns(UserWarning, match=r"holds the state of LocalSGD, not of ESync, and cannot rebuild it \(the "
                                         r"state of LocalSGD holds no arguments"):
        assert esync.load_checkpoint_state(path) is False
    assert esync.state_dict() is None and type(esync.strategy).__name__ == "ESync"


def test_a_file_without_the_state_loads_as_before_and_a_bad_name_is_refused(tmp_path):
    path = str(tmp_path / "plain.weights.h5")
    model_of().save_weights(path)
    callback = hh.callbacks.LocalSGDCallback(period=8)
    assert read_state(path) is None and callback.load_checkpoint_state(path) is False
    carrying = model_of(seed=1)
    carry_state(carrying, callback)
    carrying.load_weights(path)
    assert callback.state_dict() is None
    with pytest.raises(ValueError, match="filepath must name a Keras checkpoint ending in .keras or .weights.h5"):
        callback.load_checkpoint_state(str(tmp_path / "ckpt.h5"))
    for name in ("text.weights.h5", "text.keras"):
        (tmp_path / name).write_text("not a checkpoint")
        with pytest.raises(ValueError, match="is not a Keras checkpoint"):
            callback.load_checkpoint_state(str(tmp_path / name))
    with pytest.raises(FileNotFoundError):
        callback.load_checkpoint_state(str(tmp_path / "missing.keras"))
