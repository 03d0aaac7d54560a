"""The strategy's state inside the Keras checkpoints of the model it trains.

A strategy callback hangs a weightless layer (``StrategyState``) on the model it trains, under an
attribute Keras' saving walks (``save_weights``/``save`` to ``.weights.h5`` or ``.keras``: what
``ModelCheckpoint`` and ``BackupAndRestore`` write) but the model does not track: ``model.layers``,
``model.weights`` and the optimizer's variables are what they are without it, so a plain Keras load of
such a file sees what it always did (Keras skips the extra entry), and a file without the entry loads
as before. Only ``load_checkpoint_state`` reads the entry back: a ``load_weights`` restores no
counters. The entry holds the callback's ``state_dict()``: the counters as JSON (never pickle: a
checkpoint may come from anywhere), the aggregation's tensors as arrays.
"""
from __future__ import annotations

import io
import json
import os
import warnings
import zipfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from horovod_hetero.keras._backend import keras_module, to_numpy
from horovod_hetero.strategies.registry import rebuild

if TYPE_CHECKING:
    from horovod_hetero.strategies import Strategy

#: The model's attribute, and the group of the checkpoint's weights file, that hold the state.
ATTRIBUTE = "_horovod_hetero_state"
_PARTS = ("start", "momentum")           # the aggregation's tensor lists (``Aggregator.state_dict``)


class Restorable(Protocol):
    """What a checkpoint's state is loaded into and saved from: a strategy callback (``StrategyCallbackImpl``)."""

    @property
    def strategy(self) -> Strategy: ...

    def state_dict(self) -> dict[str, Any] | None: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _plain(obj: object) -> object:
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} in a strategy's state is not JSON")


def encode(state: Mapping[str, Any]) -> dict[str, npt.NDArray[Any]]:
    """``{key: array}`` for a checkpoint's entry: ``state`` (a ``state_dict()``) without its tensors as
    UTF-8 JSON under ``"state"``, the aggregation's tensors as ``"start.i"`` and ``"momentum.i"``.

    Example:
        >>> entry = encode({"step": 3, "aggregation": {"start": [np.ones(2)], "momentum": None}})
        >>> sorted(entry), decode(entry)["aggregation"]["start"][0].tolist()
        (['start.0', 'state'], [1.0, 1.0])
    """
    arrays: dict[str, npt.NDArray[Any]]
    state, arrays = dict(state), {}
    aggregation = state.get("aggregation")
    if isinstance(aggregation, dict):
        counts: dict[str, int | None] = {}
        for part in _PARTS:
            tensors = aggregation.get(part)
            counts[part] = None if tensors is None else len(tensors)
            for i, tensor in enumerate(tensors or ()):
                arrays[f"{part}.{i}"] = to_numpy(tensor)
        state["aggregation"] = counts
    arrays["state"] = np.frombuffer(json.dumps(state, default=_plain).encode(), dtype=np.uint8)
    return arrays


def decode(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``state_dict()`` an ``encode``d entry holds (``entry``: a mapping with ``keys()``), or
    ``None`` where it holds none (a checkpoint written without a strategy callback)."""
    keys = set(entry.keys())
    if "state" not in keys:
        return None
    try:
        state = json.loads(np.asarray(entry["state"], dtype=np.uint8).tobytes().decode())
    except (UnicodeDecodeError, ValueError, TypeError, RecursionError) as error:
        raise ValueError(f"the checkpoint's {ATTRIBUTE!r} entry is not a horovod-hetero strategy state: {error}") from None
    if not isinstance(state, dict):
        raise ValueError(f"the checkpoint's {ATTRIBUTE!r} entry is not a horovod-hetero strategy state")
    counts = state.get("aggregation")
    if isinstance(counts, dict):
        aggregation: dict[str, list[npt.NDArray[Any]] | None] = {}
        for part in _PARTS:
            n = counts.get(part)
            if n is not None and (type(n) is not int or not 0 <= n <= len(keys)
                                  or not {f"{part}.{i}" for i in range(n)} <= keys):
                raise ValueError(f"the checkpoint's {ATTRIBUTE!r} entry lacks tensors of {part!r}")
            aggregation[part] = None if n is None else [np.asarray(entry[f"{part}.{i}"]) for i in range(n)]
        state["aggregation"] = aggregation
    return state


def _kind(state: Mapping[str, Any]) -> str | None:
    inner = state.get("strategy", state)
    return inner.get("kind") if isinstance(inner, dict) else None


def restore(callback: Restorable, state: dict[str, Any]) -> bool:
    """Load ``state`` into ``callback``; a state of another strategy (saved after ``set_strategy``) switches the
    callback to it where it can be rebuilt (``strategies.registry.rebuild``), else warns (the callback's strategy
    starts afresh, and the weights load as Keras loads them). True if loaded."""
    current = type(callback.strategy).__name__                # what Strategy.state_dict() names "kind"
    if _kind(state) != current:
        inner = state.get("strategy", state)
        try:
            rebuild(inner if isinstance(inner, dict) else {})
        except ValueError as why:
            warnings.warn(f"the checkpoint holds the state of {_kind(state)}, not of {current}, and cannot rebuild "
                          f"it ({why}): {type(callback).__name__} keeps its own (the strategy's schedule starts "
                          f"afresh)", stacklevel=3)
            return False
    callback.load_state_dict(state)
    return True


_holder_classes: dict[str, type] = {}    # Keras module name -> its StrategyState


def _state_class() -> type:
    """``StrategyState``, a subclass of the running Keras' ``Layer`` (made once per Keras: it is chosen at run time)."""
    keras = keras_module()
    if keras.__name__ not in _holder_classes:
        layer: Any = keras.layers.Layer     # the running Keras' (a variable: chosen at run time)

        class StrategyState(layer):
            """No weights: what Keras' saving finds on the model, the strategy callback's state."""

            def __init__(self, callback: Restorable) -> None:
                super().__init__(name="horovod_hetero_state", trainable=False)
                object.__setattr__(self, "callback", callback)      # untracked: not a Keras object

            def save_own_variables(self, store: Any) -> None:
                state = self.callback.state_dict()
                if state is not None:
                    for key, array in encode(state).items():
                        store[key] = array

            def load_own_variables(self, store: Any) -> None:
                """Nothing: a load restores no counters by itself (``load_checkpoint_state`` does, on every
                rank): rank 0 alone loading weights to evaluate must not leave it in another round."""

        _holder_classes[keras.__name__] = StrategyState
    return _holder_classes[keras.__name__]


def carry_state(model: Any, callback: Restorable) -> None:
    """Make ``model``'s Keras checkpoints carry ``callback``'s state (an attribute the model does not
    track: its layers and weights stay as they are)."""
    holder = model.__dict__.get(ATTRIBUTE)
    if holder is None:
        object.__setattr__(model, ATTRIBUTE, _state_class()(callback))
    else:
        object.__setattr__(holder, "callback", callback)


class CheckpointState:
    """What a strategy callback adds for Keras checkpoints (``state_dict``/``load_state_dict`` are its own)."""

    def load_checkpoint_state(self: Restorable, filepath: str | os.PathLike[str]) -> bool:
        """Resume the strategy's schedule from a Keras checkpoint: its counters (step, round, plans)
        and aggregation state, which every ``.weights.h5`` or ``.keras`` file of the model written
        once this callback trained it holds (``ModelCheckpoint``, ``model.save_weights``,
        ``model.save``). Call it on every rank before ``fit``, beside the load of the weights
        (``model.load_weights`` itself restores no counters).

        Args:
            filepath: the checkpoint, a ``.weights.h5`` or ``.keras`` file.

        Returns:
            True if the file held this strategy's state and it was loaded; False if it held none
            (written before any strategy callback trained the model) or another strategy's (a warning).

        Raises:
            ValueError: ``filepath`` is not a ``.keras`` or ``.weights.h5`` file, cannot be read as
                one, or holds a state that is not a valid one of this strategy.

        Example::

            model.load_weights(path)                  # weights and optimizer state, as Keras loads them
            callback.load_checkpoint_state(path)      # the strategy's schedule, from the same file
            model.fit(x, y, initial_epoch=epoch, callbacks=[callback, ...])
        """
        state = read_state(filepath)
        return state is not None and restore(self, state)


def read_state(filepath: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The strategy state a Keras checkpoint holds (``.weights.h5``, or ``.keras``), or ``None``.

    Raises:
        ValueError: ``filepath`` is not a ``.keras`` or ``.weights.h5`` file.
    """
    import h5py

    path = os.fspath(filepath)
    if not path.endswith((".keras", ".weights.h5")):
        raise ValueError(f"filepath must name a Keras checkpoint ending in .keras or .weights.h5 (what "
                         f"model.save and model.save_weights write), got {path!r}")
    try:
        if path.endswith(".keras"):
            with zipfile.ZipFile(path) as archive:
                weights = h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r")
        else:
            weights = h5py.File(path, "r")
    except FileNotFoundError:
        raise
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        raise ValueError(f"filepath {path!r} is not a Keras checkpoint: {error}") from None
    with weights:
        group = weights.get(f"{ATTRIBUTE}/vars")
        return None if group is None else decode({key: group[key][()] for key in group.keys()})
