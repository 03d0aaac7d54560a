"""Every public constructor and callback checks every argument, and every environment variable that
fills in for one, when it is built: valid values are accepted; an invalid one (a wrong type, a bool
where a number is meant, a string where a bool is meant, a non-finite or out-of-range number, a
malformed form) raises a ``TypeError``/``ValueError`` whose message names the argument or variable.

Hypothesis draws, per constructor, either a full set of valid arguments, or the defaults with one
argument replaced by an invalid value. Horovod is never initialised: on Keras 3,
``hh.DistributedOptimizer`` with valid arguments gets as far as "call hvd.init()".
"""
import atexit
import functools
import math
import os
import pathlib
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horovod.common.process_sets import ProcessSet, global_process_set

from horovod_hetero.runtime.straggler import Slowdown
from horovod_hetero.runtime.telemetry import Telemetry
from horovod_hetero.strategies import (
    ADSP, DSSP, Balanced, ESync, ElasticBSP, LocalSGD, Mean, Normalized, OuterSGD, Steps, Synchronous, WAGMA)

VALID = settings(max_examples=25, deadline=None, derandomize=True, database=None)
INVALID = settings(max_examples=60, deadline=None, derandomize=True, database=None)

ENV_VARS = ("HOROVOD_HETERO_SLOWDOWN", "HOROVOD_HETERO_BASE_STEP_S", "HOROVOD_HETERO_SAMPLE_S", "HOROVOD_HETERO_RANDOM_DELAY",
            "HOROVOD_HETERO_TELEMETRY", "HOROVOD_HETERO_STATE_SERVER_HOST")

# a scratch tree: directories telemetry may use, and a file it may not use as one
SCRATCH = pathlib.Path(tempfile.mkdtemp(prefix="hh-constructors-"))
atexit.register(shutil.rmtree, SCRATCH, True)
A_FILE = SCRATCH / "a-file"
A_FILE.write_text("not a directory")


@pytest.fixture(autouse=True)
def _no_hetero_environment(monkeypatch):
    """The developer's own HOROVOD_HETERO_* settings must not change what is valid here."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


# --- values ----------------------------------------------------------------------------------------

class Arg:
    """One argument: what it accepts, what it refuses, and what the refusal must name.

    ``invalid`` draws values, or ``Named(value, name)`` where a part of the argument (a key of an
    options dict) is to be named instead.
    """

    def __init__(self, name, valid, invalid, expect=None):
        self.name, self.valid, self.expect = name, valid, expect or name
        self.invalid = invalid.map(lambda v: v if isinstance(v, Named) else Named(v, self.expect))


class Named(tuple):
    """An invalid value and the name its error must hold."""

    def __new__(cls, value, name):
        return super().__new__(cls, (value, name))


OBJECTS = st.builds(object)
TEXT = st.text(max_size=6)
LISTS = st.lists(st.integers(-3, 3), max_size=3)
DICTS = st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
NOT_FINITE = st.sampled_from([math.inf, -math.inf, math.nan])
BOOL_WORDS = st.sampled_from(["no", "yes", "True", "False", "true", "0", "1", "", "off"])
#: what no number, bool, path or form accepts
WRONG = st.one_of(TEXT, LISTS, DICTS, OBJECTS, st.just(b"1"), st.just(1j))


def ints(minimum=0, maximum=10_000):
    """Valid: ints in range (numpy ints too)."""
    plain = st.integers(minimum, maximum)
    return st.one_of(plain, plain.map(np.int64))


def bad_ints(minimum=0, maximum=None, optional=False):
    """Invalid: out of range, floats (even whole ones), bools, None where required, other types."""
    out = [st.integers(max_value=minimum - 1), st.floats(allow_nan=True), st.booleans(), WRONG]
    if maximum is not None:
        out.append(st.integers(min_value=maximum + 1))
    if not optional:
        out.append(st.none())
    return st.one_of(out)


def floats(minimum=0.0, maximum=1e6, exclusive=False):
    """Valid: finite numbers in range (ints too)."""
    real = st.floats(minimum, maximum, exclude_min=exclusive, allow_nan=False, allow_infinity=False)
    whole = st.integers(math.ceil(minimum) + (1 if exclusive and minimum == math.ceil(minimum) else 0), int(maximum))
    return st.one_of(real, whole)


def bad_floats(minimum=0.0, maximum=None, exclusive=False, optional=False):
    """Invalid: non-finite, below (or at, if exclusive) the minimum, above the maximum, bools, strings."""
    out = [NOT_FINITE, st.floats(max_value=minimum, exclude_max=not exclusive, allow_nan=False),
           st.booleans(), st.sampled_from(["1.0", "inf", "0.5"]), WRONG]
    if maximum is not None:
        out.append(st.floats(min_value=maximum, exclude_min=True, allow_nan=False))
    if not optional:
        out.append(st.none())
    return st.one_of(out)


BOOLS = st.booleans()
BAD_BOOLS = st.one_of(BOOL_WORDS, st.integers(0, 1), st.floats(0, 1), st.none(), LISTS, OBJECTS)

SCHEDULE = st.one_of(ints(1, 1000), st.just(lambda step: 2), st.just(lambda step: 1 + step % 3))
BAD_SCHEDULE = bad_ints(1)

POSITIVE_FACTORS = st.lists(st.floats(0.01, 100.0), min_size=4, max_size=8)


def _text(factors):
    return ",".join(repr(f) for f in factors)


SLOWDOWN = st.one_of(
    POSITIVE_FACTORS, POSITIVE_FACTORS.map(tuple), POSITIVE_FACTORS.map(_text),
    st.just("1,1,1,1;15:1,1,1,4;30:2,1,1,4"), st.just([(0, [1, 1, 1, 1]), (15.5, [1, 1, 1, 4])]))
BAD_SLOWDOWN = st.one_of(
    st.integers(), st.booleans(), st.just({}), st.just(b"1,2"), st.just([]), st.just({1.0, 2.0}), OBJECTS,
    st.sampled_from(["x", "1,x", "1,0", "1,-2", "1,inf", "1,nan", "5:1,1", "1,1;5:1", "1,1;inf:1,2", ";", "1,,2",
                     "1,1;5:1,1;3:1,1", "1,1e300", "1,1001"]),
    POSITIVE_FACTORS.flatmap(lambda fs: st.sampled_from([fs + [0.0], fs + [-1.0], fs + [math.inf], fs + [math.nan],
                                                         fs + ["2"], fs + [True], fs + [None]])),
    st.just([(5, [1, 1])]), st.just([(0, [1, 1]), (10, [1])]), st.just([(0, [1, 1]), (0, [1, 2])]),
    st.just([(0, "1,1")]), st.just([(0, [])]), st.just([(math.inf, [1])]), st.just([(0, [1]), 1]))

RANDOM_DELAY = st.one_of(
    st.none(), st.tuples(ints(0, 8), floats(0.0, 10.0)), st.tuples(ints(0, 8), floats(0.0, 10.0)).map(list),
    st.tuples(st.integers(0, 8), st.floats(0.0, 10.0)).map(lambda p: f"{p[0]}:{p[1]!r}"))
BAD_RANDOM_DELAY = st.one_of(
    st.integers(), st.booleans(), st.just({}), st.just((1,)), st.just((1, 2, 3)), OBJECTS, st.just(b"1:0.1"),
    st.tuples(st.integers(max_value=-1), floats(0.0, 1.0)), st.tuples(ints(0, 8), st.floats(max_value=-1e-9)),
    st.tuples(ints(0, 8), NOT_FINITE), st.tuples(st.floats(0.5, 1.5), floats(0.0, 1.0)),
    st.tuples(st.booleans(), floats(0.0, 1.0)), st.tuples(ints(0, 8), st.sampled_from(["0.1", None])),
    st.sampled_from(["x", "2", "1:inf", "1:nan", "-1:0.1", "1:-0.1", "1.5:0.1", "1:2:3", ":", "a:b", "1:1e300"]))


def scratch_dirs():
    """Valid telemetry directories (existing or not), as str and as Path."""
    return st.tuples(st.sampled_from(["t", "t/deeper", "other"]), st.booleans()).map(
        lambda p: (SCRATCH / p[0]) if p[1] else str(SCRATCH / p[0]))


TELEMETRY_DIRS = st.one_of(st.none(), st.just(""), scratch_dirs())
BAD_TELEMETRY_DIRS = st.one_of(
    st.integers(), st.booleans(), st.floats(), LISTS, DICTS, OBJECTS, st.just(b"/tmp"),
    st.sampled_from([str(A_FILE), A_FILE, str(A_FILE / "below"), A_FILE / "below" / "deeper"]))

PROCESS_SETS = st.sampled_from([None, global_process_set, ProcessSet([0, 1])])
BAD_PROCESS_SETS = st.one_of(st.integers(), st.booleans(), TEXT, st.just([0, 1]), st.just((0, 1)), OBJECTS)

ADDRESSES = st.one_of(st.none(), st.tuples(st.sampled_from(["127.0.0.1", "node-1", "::1", "10.1.2.3"]),
                                           st.integers(0, 65535), st.booleans()).map(
    lambda p: f"{'tcp://' if p[2] else ''}{p[0]}:{p[1]}"))
BAD_ADDRESSES = st.one_of(
    st.integers(), st.booleans(), st.floats(), LISTS, OBJECTS, st.just(b"tcp://h:1"),
    st.sampled_from(["", "nohost", "tcp://:5555", "tcp://h:", "tcp://h:x", "h:99999", " h:1", "h :1", "tcp://h:-1",
                     "tcp://h:1.5", "h:\u0661"]))

POWERS_OF_TWO = st.integers(0, 10).map(lambda k: 2 ** k)
BAD_GROUP_SIZES = st.one_of(st.integers(-4, 0), st.sampled_from([3, 5, 6, 7, 12, 100]), st.floats(),
                            st.booleans(), TEXT, LISTS, OBJECTS)

STALENESS = st.tuples(st.integers(0, 50), st.integers(0, 50)).flatmap(
    lambda p: st.sampled_from([tuple(sorted(p)), list(sorted(p)), np.array(sorted(p))]))
BAD_STALENESS = st.one_of(
    st.tuples(st.integers(0, 50), st.integers(1, 50)).map(lambda p: (p[0] + p[1], p[0])),   # s_lower > s_upper
    st.tuples(st.integers(max_value=-1), st.integers(0, 5)), st.tuples(st.integers(0, 5), st.integers(max_value=-1)),
    st.tuples(st.floats(0, 5), st.integers(0, 5)), st.tuples(st.integers(0, 5), st.booleans()),
    st.tuples(st.integers(0, 5), st.none()), st.just((1,)), st.just((1, 2, 3)), st.just({0: 1, 1: 2}),
    st.just({1, 2}), st.just("12"), st.integers(), st.none(), OBJECTS)

TIMEOUT = (floats(0.0, 1e6, exclusive=True), bad_floats(0.0, exclusive=True))
CALLABLES = st.sampled_from([lambda *a: None, print, float])
PERIODS = st.one_of(floats(0.0, 1e4, exclusive=True), st.integers(1, 500).map(lambda n: f"{n}steps"),
                    st.sampled_from(["4s", "0.5 s", " 8 steps", "1step"]), st.integers(1, 50).map(Steps))
BAD_PERIODS = st.one_of(NOT_FINITE, st.floats(max_value=0.0, allow_nan=False), st.integers(max_value=0), st.booleans(),
                        st.none(), st.sampled_from(["1.0", "inf", "0steps", "-1s", "0s", "steps", "s", "1 sec", "x"]),
                        LISTS, DICTS, OBJECTS, st.just(b"1"), st.just(1j))
BAD_CALLABLES = st.one_of(st.integers(), TEXT, st.none(), st.booleans(), OBJECTS)


# --- constructors ----------------------------------------------------------------------------------

class Constructor:
    """``make(**kwargs)`` with defaults ``base``; ``accepts(make, kwargs)`` builds it with valid values."""

    def __init__(self, make, args, base=None, accepts=None):
        self.make, self.args, self.base = make, args, dict(base or {})
        self.accepts = accepts or _built

    def valid_kwargs(self):
        return st.fixed_dictionaries({a.name: a.valid for a in self.args}).map(lambda kw: {**self.base, **kw})

    def one_invalid(self):
        return st.sampled_from(self.args).flatmap(
            lambda a: a.invalid.map(lambda bad: (a.name, bad[0], bad[1])))


def _built(make, kwargs):
    made = make(**kwargs)
    close = getattr(made, "close", None)
    if callable(close):
        close()
    return made


OUTER_SGD = st.builds(OuterSGD, floats(0.0, 10.0, exclusive=True), st.floats(0.0, 0.99), st.just(False)) | \
    st.builds(OuterSGD, floats(0.0, 10.0, exclusive=True), st.floats(0.01, 0.99), st.just(True))
BAD_OUTER = st.one_of(TEXT, st.integers(), st.floats(), st.booleans(), LISTS, DICTS, OBJECTS,
                      st.just((0.7, 0.9, True)), st.just(OuterSGD))
OUTER = Arg("outer", st.one_of(st.none(), OUTER_SGD), BAD_OUTER)
#: given beside a model-averaging strategy (the adapters' ``aggregate=``)
AGGREGATE = Arg("aggregate", st.one_of(st.none(), st.builds(Mean, st.one_of(st.none(), OUTER_SGD)),
                                       st.builds(Normalized, st.one_of(st.none(), OUTER_SGD))),
                st.one_of(st.sampled_from(["mean", "normalized", "Mean", "fednova"]), TEXT, st.integers(), LISTS,
                          OBJECTS, OUTER_SGD, st.sampled_from([Mean, Normalized])))


def strategy_args(include_period=True):
    return {
        "LocalSGD": [Arg("period", SCHEDULE, BAD_SCHEDULE), Arg("warmup_steps", ints(0), bad_ints(0))],
        "ESync": [Arg("mode", st.sampled_from(ESync.MODES),
                                                  st.one_of(TEXT.filter(lambda m: m not in ESync.MODES),
                                                            st.sampled_from(["Blocking", " blocking"]),
                                                            st.none(), st.integers(), LISTS, st.just(("blocking",))))],
        "WAGMA": [Arg("group_size", st.one_of(st.none(), POWERS_OF_TWO), BAD_GROUP_SIZES),
                  Arg("sync_period", SCHEDULE, BAD_SCHEDULE)],
        "ElasticBSP": [Arg("lookahead", ints(1), bad_ints(1))],
        "DSSP": [Arg("staleness", STALENESS, BAD_STALENESS), Arg("tolerance", floats(0.0, 0.5), bad_floats(0.0, 0.5))],
        "ADSP": [Arg("check_period", PERIODS, BAD_PERIODS)],
    }


ESYNC_MORE = [Arg("epsilon", floats(0.0), bad_floats(0.0)), Arg("overshoot", floats(0.0, 1.0), bad_floats(0.0, 1.0)),
              Arg("timeout", *TIMEOUT), Arg("fallback_period", ints(1), bad_ints(1)),
              Arg("server_address", ADDRESSES, BAD_ADDRESSES), Arg("warmup_step", BOOLS, BAD_BOOLS)]
ADSP_MORE = [Arg("fit_points", ints(3), bad_ints(3)), Arg("window", ints(1), bad_ints(1))]
WAGMA_MORE = [Arg("wait_avoiding", BOOLS, BAD_BOOLS), Arg("patience", floats(0.0), bad_floats(0.0)),
              Arg("timeout", *TIMEOUT)]

SLOWDOWN_ARGS = [
    Arg("rank", ints(0, 3), bad_ints(0)),
    Arg("factors", st.one_of(st.none(), SLOWDOWN), BAD_SLOWDOWN, expect="slowdown"),
    Arg("base_step_s", st.one_of(st.none(), floats(0.0, 3600.0)), bad_floats(0.0, 3600.0, optional=True)),
    Arg("size", ints(4, 64), st.one_of(bad_ints(1, optional=True), st.just(0))),
    Arg("random_delay", RANDOM_DELAY, BAD_RANDOM_DELAY),
    Arg("sleep", CALLABLES, BAD_CALLABLES), Arg("clock", CALLABLES, BAD_CALLABLES)]

CORE = {
    "Synchronous": Constructor(Synchronous, []),
    "LocalSGD": Constructor(LocalSGD, strategy_args()["LocalSGD"], base={"period": 2}),
    "ESync": Constructor(ESync, strategy_args()["ESync"] + ESYNC_MORE),
    "WAGMA": Constructor(WAGMA, strategy_args()["WAGMA"] + WAGMA_MORE),
    "ElasticBSP": Constructor(ElasticBSP, strategy_args()["ElasticBSP"]),
    "DSSP": Constructor(DSSP, strategy_args()["DSSP"]),
    "ADSP": Constructor(ADSP, strategy_args()["ADSP"] + ADSP_MORE),
    "Telemetry": Constructor(Telemetry, [
        Arg("rank", ints(0), bad_ints(0)),
        Arg("directory", TELEMETRY_DIRS, BAD_TELEMETRY_DIRS, expect="telemetry"),
        Arg("keep", ints(0), bad_ints(0))], base={"rank": 0}),
    "Slowdown": Constructor(Slowdown, SLOWDOWN_ARGS, base={"rank": 0, "size": 4}),
    "Balanced": Constructor(Balanced, [Arg("global_batch", st.one_of(st.none(), ints(1)), bad_ints(1, optional=True)),
                                       Arg("rebalance_every", ints(1), bad_ints(1)),
                                       Arg("max_batch", st.one_of(st.none(), ints(1)), bad_ints(1, optional=True)),
                                       # valid: within any max_batch drawn (a larger one is refused beside it)
                                       Arg("min_batch", st.one_of(st.none(), st.just(1)), bad_ints(1, optional=True))]),
    "OuterSGD": Constructor(OuterSGD, [Arg("lr", *TIMEOUT, expect="OuterSGD lr"),
                                       Arg("momentum", st.floats(0.0, 0.99), st.one_of(
                                           st.floats(1.0, 5.0), st.floats(max_value=-1e-9), NOT_FINITE, TEXT, st.none()),
                                           expect="OuterSGD momentum")]),
    "Mean": Constructor(Mean, [OUTER]),
    "Normalized": Constructor(Normalized, [OUTER]),
}


@functools.lru_cache(maxsize=None)
def keras_constructors():
    keras_hh = pytest.importorskip("horovod_hetero.tensorflow.keras")
    cb = keras_hh.callbacks
    options = [
        Arg("process_set", PROCESS_SETS, BAD_PROCESS_SETS),
        Arg("telemetry", st.one_of(TELEMETRY_DIRS, st.builds(Telemetry, st.just(0))), BAD_TELEMETRY_DIRS),
        Arg("slowdown", st.one_of(st.none(), SLOWDOWN, st.builds(Slowdown, st.just(0), POSITIVE_FACTORS)),
            BAD_SLOWDOWN),
        Arg("batch_size", st.one_of(st.none(), ints(1)), bad_ints(1, optional=True)),
        Arg("timeout", *TIMEOUT),
        Arg("epoch_sync", BOOLS, BAD_BOOLS), AGGREGATE]
    strategies = st.sampled_from([LocalSGD(2), ESync(), WAGMA(), ElasticBSP(), DSSP(), ADSP()])
    bad_strategies = st.one_of(st.sampled_from([LocalSGD, "localsgd", None, 5, True]), OBJECTS)
    own = strategy_args()

    def options_arg(name, accepted, own_args):
        valid = st.one_of(st.none(), st.fixed_dictionaries({}, optional={a.name: a.valid for a in accepted}))
        invalid = st.one_of(
            st.one_of(st.integers(), TEXT, LISTS, st.booleans(), OBJECTS, st.just([("timeout", 1.0)])),
            st.just({"no_such_option": 1}), st.sampled_from([{k: None} for k in own_args]),
            st.sampled_from(accepted).flatmap(lambda a: a.invalid.map(lambda bad: Named({a.name: bad[0]}, bad[1]))))
        return Arg(name, valid, invalid)

    def keras_optimizer(**kwargs):
        try:
            keras_hh.DistributedOptimizer(**kwargs)     # Keras 2: Horovod's own, built before hvd.init
        except RuntimeError as e:                       # Keras 3: valid arguments get as far as hvd.init
            assert "hvd.init()" in str(e)

    sgd = st.builds(lambda lr: keras_hh.keras_module().optimizers.SGD(lr), st.sampled_from([0.1, 0.01]))
    return {
        "HeteroSyncCallback": Constructor(cb.HeteroSyncCallback,
                                          [Arg("strategy", strategies, bad_strategies)] + options,
                                          base={"strategy": LocalSGD(2)}),
        "LocalSGDCallback": Constructor(cb.LocalSGDCallback, own["LocalSGD"] + options, base={"period": 2}),
        "ESyncCallback": Constructor(cb.ESyncCallback, own["ESync"] + [
            options_arg("esync_options", ESYNC_MORE, ("mode",))] + options),
        "WAGMACallback": Constructor(cb.WAGMACallback, own["WAGMA"] + [
            options_arg("wagma_options", WAGMA_MORE, ("group_size", "sync_period"))] + options),
        "ElasticBSPCallback": Constructor(cb.ElasticBSPCallback, own["ElasticBSP"] + options),
        "DSSPCallback": Constructor(cb.DSSPCallback, own["DSSP"] + options),
        "ADSPCallback": Constructor(cb.ADSPCallback, own["ADSP"] + [
            options_arg("adsp_options", ADSP_MORE, ("check_period", "search_every"))] + options),
        "BalancedCallback": Constructor(cb.BalancedCallback, [
            Arg("batch_size", ints(1), bad_ints(1)), Arg("global_batch", st.one_of(st.none(), ints(1)), bad_ints(1, optional=True)),
            Arg("max_batch", st.one_of(st.none(), ints(1)), bad_ints(1, optional=True)),
            Arg("min_batch", st.one_of(st.none(), st.just(1)), bad_ints(1, optional=True))]
            + [a for a in options if a.name not in ("batch_size", "epoch_sync", "aggregate")],
            base={"batch_size": 32}),
        "BroadcastGlobalVariablesCallback": Constructor(cb.BroadcastGlobalVariablesCallback, [
            Arg("root_rank", ints(0), bad_ints(0)), Arg("process_set", PROCESS_SETS, BAD_PROCESS_SETS),
            Arg("timeout", *TIMEOUT)]),
        "MetricAverageCallback": Constructor(cb.MetricAverageCallback, [Arg("timeout", *TIMEOUT)]),
        "LearningRateWarmupCallback": Constructor(cb.LearningRateWarmupCallback, [
            Arg("initial_lr", *TIMEOUT), Arg("warmup_epochs", ints(1), bad_ints(1)),
            Arg("momentum_correction", BOOLS, BAD_BOOLS),
            Arg("steps_per_epoch", st.one_of(st.none(), ints(1)), bad_ints(1, optional=True)),
            Arg("verbose", ints(0, 2), bad_ints(0))], base={"initial_lr": 0.1}),
        "DistributedOptimizer": Constructor(keras_hh.DistributedOptimizer, [
            Arg("optimizer", sgd, st.one_of(st.integers(), TEXT, st.none(), OBJECTS, st.just(LocalSGD(2)))),
            Arg("process_set", PROCESS_SETS, BAD_PROCESS_SETS), Arg("timeout", *TIMEOUT)],
            base={"optimizer": keras_hh.keras_module().optimizers.SGD(0.1)},
            accepts=lambda make, kwargs: keras_optimizer(**kwargs)),
    }


KERAS = ["HeteroSyncCallback", "LocalSGDCallback", "ESyncCallback", "WAGMACallback", "ElasticBSPCallback",
         "DSSPCallback", "ADSPCallback", "BalancedCallback", "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
         "DistributedOptimizer"]


def constructor(name):
    return CORE[name] if name in CORE else keras_constructors()[name]


def with_one(ctor, name, bad):
    """The defaults with one argument replaced."""
    return {**ctor.base, name: bad}


# --- the properties --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CORE) + KERAS)
@VALID
@given(data=st.data())
def test_valid_arguments_are_accepted(name, data):
    ctor = constructor(name)
    kwargs = data.draw(ctor.valid_kwargs(), label="kwargs")
    ctor.accepts(ctor.make, kwargs)


@pytest.mark.parametrize("name", [n for n in list(CORE) + KERAS if n != "Synchronous"])
@INVALID
@given(data=st.data())
def test_an_invalid_argument_is_refused_by_name(name, data):
    ctor = constructor(name)
    arg, bad, expect = data.draw(ctor.one_invalid(), label="argument, value, name")
    with pytest.raises((TypeError, ValueError)) as error:
        _built(ctor.make, with_one(ctor, arg, bad))
    assert expect in str(error.value), f"{name}({arg}={bad!r}): {error.value!r} does not name {expect}"


# --- environment variables -------------------------------------------------------------------------

ENV = {
    "HOROVOD_HETERO_SLOWDOWN": (
        st.one_of(POSITIVE_FACTORS.map(_text), st.just("1,1,1,1;15:1,1,1,4"), st.just("")),
        st.one_of(st.text(st.characters(min_codepoint=ord("a"), max_codepoint=ord("z")), min_size=1, max_size=8),
                  st.sampled_from(["1,x", "1,0", "1,-2", "1,inf", "1,nan", "5:1,1", "1,1;5:1", ";", "1,,2",
                                   "1,1;x:1,1"]))),
    "HOROVOD_HETERO_BASE_STEP_S": (
        st.one_of(st.floats(0.0, 10.0).map(repr), st.just("0"), st.just("")),
        st.one_of(st.floats(max_value=-1e-9).map(repr),
                  st.sampled_from(["inf", "-inf", "nan", "fast", "0.1s", "1,2"]))),
    "HOROVOD_HETERO_SAMPLE_S": (
        st.one_of(st.floats(0.0, 1.0).map(repr), st.just("0"), st.just("")),
        st.one_of(st.floats(max_value=-1e-9).map(repr),
                  st.sampled_from(["inf", "-inf", "nan", "slow", "1ms", "1e300"]))),
    "HOROVOD_HETERO_RANDOM_DELAY": (
        st.tuples(st.integers(0, 8), st.floats(0.0, 10.0)).map(lambda p: f"{p[0]}:{p[1]!r}"),
        st.sampled_from(["x", "2", "1:inf", "1:nan", "-1:0.1", "1:-0.1", "1.5:0.1", "1:2:3", ":", "a:b"])),
    "HOROVOD_HETERO_TELEMETRY": (
        st.sampled_from([str(SCRATCH / "env"), str(SCRATCH / "env" / "deeper"), ""]),
        st.sampled_from([str(A_FILE), str(A_FILE / "below")])),
    "HOROVOD_HETERO_STATE_SERVER_HOST": (
        st.sampled_from(["10.0.0.1", "node-1.cluster", "::1", "localhost", "worker_3", ""]),
        st.sampled_from(["tcp://10.0.0.1", "10.0.0.1:5555", "a b", "-x", "x-", "/x", "h\tx", "node/1"])),
}


def env_readers(variable):
    """What reads ``variable`` when built: the runtime's object, and a Keras callback (only the form)."""
    readers = []
    if variable == "HOROVOD_HETERO_TELEMETRY":
        readers.append(lambda: Telemetry(0))
    elif variable != "HOROVOD_HETERO_STATE_SERVER_HOST":
        readers.append(lambda: Slowdown(0, size=4))
    else:
        from horovod_hetero.transports.addresses import server_host_setting
        readers.append(server_host_setting)
    try:
        import horovod_hetero.tensorflow.keras as keras_hh
    except ImportError:                    # no Keras: the runtime's readers only
        return readers
    # batch_size: where steps are padded by their samples (HOROVOD_HETERO_SAMPLE_S) a callback must know them
    return readers + [lambda: keras_hh.callbacks.LocalSGDCallback(2, batch_size=32)]


@pytest.mark.parametrize("variable", list(ENV))
@VALID
@given(data=st.data())
def test_valid_environment_variables_are_accepted(variable, data):
    text = data.draw(ENV[variable][0], label=variable)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(variable, text)
        for read in env_readers(variable):
            _built(lambda: read(), {})


@pytest.mark.parametrize("variable", list(ENV))
@INVALID
@given(data=st.data())
def test_an_invalid_environment_variable_is_refused_by_name_when_built(variable, data):
    text = data.draw(ENV[variable][1], label=variable)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(variable, text)
        for read in env_readers(variable):
            with pytest.raises((TypeError, ValueError), match=variable):
                _built(lambda: read(), {})


# --- a few exact messages --------------------------------------------------------------------------

@pytest.mark.parametrize("make,error,match", [
    (lambda: ESync(server_address=123), TypeError, "server_address must be a string like tcp://host:port"),
    (lambda: WAGMA(wait_avoiding="no"), TypeError, "wait_avoiding must be True or False, got 'no'"),
    (lambda: ESync(warmup_step=1), TypeError, "warmup_step must be True or False"),
    (lambda: Slowdown(0, 5), TypeError, "slowdown must be a string like '1,1,1,4'"),
    (lambda: Slowdown(0, size=2, random_delay=5), TypeError, r"random_delay must be \(count, seconds\)"),
    (lambda: Slowdown(2, [1, 1], size=4), ValueError, "slowdown has 2 factors but rank 2 needs one"),
    (lambda: Slowdown(2, size=2), ValueError, r"size must be an int > rank \(2\)"),
    (lambda: Telemetry(0, A_FILE), ValueError, "telemetry must be a directory that can be created and written to"),
    (lambda: LocalSGD(period=None), TypeError, "period must be an int >= 1 or a step -> int callable"),
    (lambda: ESync(timeout=-1.0), ValueError, "timeout must be > 0.0"),
    (lambda: ESync(epsilon=-1.0), ValueError, "epsilon must be a number >= 0.0"),
])
def test_messages_name_the_argument_and_its_form(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_keras_options_dicts_name_themselves():
    keras_hh = pytest.importorskip("horovod_hetero.tensorflow.keras")
    with pytest.raises(TypeError, match=r"esync_options must be a dict of keyword arguments \(epsilon, "):
        keras_hh.callbacks.ESyncCallback(esync_options=5)
    with pytest.raises(TypeError, match="wagma_options holds 'group_size', an argument of the callback itself"):
        keras_hh.callbacks.WAGMACallback(wagma_options={"group_size": 2})
    with pytest.raises(TypeError, match="wait_avoiding must be True or False, got 'no'"):
        keras_hh.callbacks.WAGMACallback(wagma_options={"wait_avoiding": "no"})


def test_telemetry_that_cannot_be_written_is_a_value_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("HOROVOD_HETERO_TELEMETRY", str(A_FILE / "below"))
    with pytest.raises(ValueError, match="HOROVOD_HETERO_TELEMETRY must be a directory"):
        Telemetry(0)
    assert not os.path.exists(A_FILE / "below")
