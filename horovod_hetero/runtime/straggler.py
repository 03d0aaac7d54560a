"""Straggler simulation: make rank i's steps take factor_i times as long.

``HOROVOD_HETERO_SLOWDOWN="1,1,1,4"`` slows rank 3 to a quarter of the others' pace, so a
heterogeneous cluster can be reproduced on one machine. Speeds can change during the run:
``"1,1,1,1;15:1,1,1,4;30:2,1,1,4"`` makes rank 3 four times slower from 15 s after the rank's
first step and rank 0 twice as slow from 30 s (``SECONDS:FACTORS`` segments, times increasing). By default the extra time is a sleep
of ``(factor - 1) * measured step time``; with ``HOROVOD_HETERO_BASE_STEP_S=0.02`` each step
is instead padded to ``factor * 0.02`` seconds, which is steadier when processes share cores. With
``HOROVOD_HETERO_SAMPLE_S=0.001`` too, a step of b samples is padded to ``factor * (0.02 + 0.001 b)``
seconds (without a base step, ``factor * 0.001 b``): its time grows with its batch, as a GPU's past
saturation, whatever this machine's cores.

``HOROVOD_HETERO_RANDOM_DELAY="2:0.05"`` adds transient stragglers, as in the WAGMA paper's
ResNet experiment: at each step index, 2 ranks drawn at random (the same draw on every rank)
sleep 0.05 s more.
"""
from __future__ import annotations

import math
import operator
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Union, cast

import numpy as np

from horovod_hetero.validation import check_float, check_int

ENV_FACTORS = "HOROVOD_HETERO_SLOWDOWN"
ENV_BASE = "HOROVOD_HETERO_BASE_STEP_S"
ENV_RANDOM = "HOROVOD_HETERO_RANDOM_DELAY"
ENV_SAMPLE = "HOROVOD_HETERO_SAMPLE_S"
#: the largest slowdown factor, and the most seconds a padded step or a random delay may add: past them a
#: simulated cluster is a typo (``"1e300"``), which would otherwise end in an ``OverflowError`` mid-training
MAX_FACTOR = 1000.0
MAX_SECONDS = 3600.0

#: A checked slowdown schedule: ``[(from_seconds, per-rank factors), ...]``, from 0 s, times increasing.
Schedule = list[tuple[float, list[float]]]
#: Slowdown factors as ``Slowdown`` takes them: ``"1,1,1,4"`` or ``"1,1,1,1;15:1,1,1,4"``, per-rank numbers,
#: or ``(seconds, per-rank numbers)`` pairs.
SlowdownFactors = Union[str, Sequence[float], Sequence[tuple[float, Sequence[float]]]]


def parse_random_delay(text: object, name: str = ENV_RANDOM) -> tuple[int, float]:
    """Parse ``"2:0.05"`` (ranks delayed per step : seconds) into ``(2, 0.05)``."""
    try:
        count_text, seconds_text = str(text).split(":")
        count, seconds = int(count_text), float(seconds_text)
    except ValueError:
        raise ValueError(f"{name} must be COUNT:SECONDS, e.g. 2:0.05 (2 random ranks sleep 0.05 s more "
                         f"each step), got {text!r}") from None
    return check_int(f"{name} count", count, 0), check_float(f"{name} seconds", seconds, 0.0, MAX_SECONDS)


def check_random_delay(value: object, name: str = "random_delay") -> tuple[int, float] | None:
    """``(count, seconds)`` from a pair or a ``"count:seconds"`` string; ``None`` reads
    ``HOROVOD_HETERO_RANDOM_DELAY`` (``None`` if unset). Errors name ``name`` or the variable.

    Example:
        >>> check_random_delay((2, 0.05)), check_random_delay("1:0.5")
        ((2, 0.05), (1, 0.5))
    """
    if value is None:
        text = os.environ.get(ENV_RANDOM) or None
        return None if text is None else parse_random_delay(text, ENV_RANDOM)
    if isinstance(value, str):
        return parse_random_delay(value, name)
    if isinstance(value, (bytes, dict)) or not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be (count, seconds), e.g. (2, 0.05), a string like '2:0.05', or None, "
                        f"got {value!r} ({type(value).__name__})")
    return check_int(f"{name} count", value[0], 0), check_float(f"{name} seconds", value[1], 0.0, MAX_SECONDS)


def check_base_step(value: object, name: str = "base_step_s") -> float | None:
    """Finite seconds >= 0 per padded step, or ``None``; ``None`` reads ``HOROVOD_HETERO_BASE_STEP_S``.

    Example:
        >>> check_base_step(0.02)
        0.02
    """
    return _seconds(value, name, ENV_BASE, "seconds", "0.1")


def check_per_sample(value: object, name: str = "per_sample_s") -> float | None:
    """Finite seconds >= 0 a padded step takes per sample, or ``None``; ``None`` reads
    ``HOROVOD_HETERO_SAMPLE_S``.

    Example:
        >>> check_per_sample(0.001)
        0.001
    """
    return _seconds(value, name, ENV_SAMPLE, "seconds per sample", "0.001")


def _seconds(value: object, name: str, variable: str, unit: str, example: str) -> float | None:
    """``value`` as finite seconds from 0 to ``MAX_SECONDS`` (errors name ``name``), or if ``None`` the
    variable's (errors name ``variable``; unset or empty: ``None``)."""
    if value is not None:
        return check_float(name, value, 0.0, MAX_SECONDS)
    text = os.environ.get(variable)
    if not text:
        return None
    try:
        return check_float(variable, float(text), 0.0, MAX_SECONDS)
    except (TypeError, ValueError):
        raise ValueError(f"{variable} must be finite {unit} from 0 to {MAX_SECONDS:g}, e.g. {example}, "
                         f"got {text!r}") from None


def check_slowdown(factors: object = None, name: str = "slowdown") -> tuple[Schedule | None, str]:
    """``factors`` (see ``Slowdown``) as a checked ``[(from_seconds, factors), ...]`` schedule and the
    name errors use; ``None`` reads ``HOROVOD_HETERO_SLOWDOWN`` (``(None, ENV)`` if unset). Only the
    form is checked (the number of factors against the ranks is checked by ``Slowdown``).

    Example:
        >>> check_slowdown([1, 2])
        ([(0.0, [1.0, 2.0])], 'slowdown')
    """
    if factors is None:
        text = os.environ.get(ENV_FACTORS)
        return (parse_slowdown(text, ENV_FACTORS) if text else None), ENV_FACTORS
    return _schedule(factors, name), name


def delayed_ranks(size: int, count: int, step: int, seed: int = 0) -> list[int]:
    """The ``count`` ranks of ``size`` delayed at ``step``: the same on every rank.

    Example:
        >>> sorted(delayed_ranks(4, 2, step=7)) == sorted(delayed_ranks(4, 2, step=7))
        True
    """
    return np.random.default_rng([seed, step]).choice(size, size=min(count, size), replace=False).tolist()


def parse_factors(text: object, name: str = ENV_FACTORS) -> list[float]:
    """Parse ``"1,1,1,4"`` into ``[1.0, 1.0, 1.0, 4.0]``; every factor must be > 0 and at most ``MAX_FACTOR``."""
    try:
        factors = [float(part) for part in str(text).split(",")]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers > 0 (one per rank), got {text!r}") from None
    return [_finite_factor(name, f) for f in factors]


def _finite_factor(name: str, value: object) -> float:
    return check_float(name, value, 0.0, MAX_FACTOR, min_exclusive=True)


def parse_slowdown(text: object, name: str = ENV_FACTORS) -> Schedule:
    """Parse factors, or factors that change over time, into ``[(from_seconds, factors), ...]``.

    Example:
        >>> parse_slowdown("1,1,1,4")
        [(0.0, [1.0, 1.0, 1.0, 4.0])]
        >>> parse_slowdown("1,1,1,1;15:1,1,1,4;30:2,1,1,4")[1:]
        [(15.0, [1.0, 1.0, 1.0, 4.0]), (30.0, [2.0, 1.0, 1.0, 4.0])]
    """
    schedule: Schedule = []
    for segment in str(text).split(";"):
        start_text, colon, factors = segment.rpartition(":")
        try:
            start = float(start_text) if colon else 0.0
        except ValueError:
            start = math.nan
        schedule.append((start, parse_factors(factors, name)))
    return _checked(schedule, name, text)


def _checked(schedule: Schedule, name: str, given: object) -> Schedule:
    times = [start for start, _ in schedule]
    if times[0] != 0.0 or not all(map(operator.lt, times, times[1:])) or not math.isfinite(times[-1]):
        raise ValueError(f"{name} must be FACTORS or FACTORS;SECONDS:FACTORS;... with times increasing from 0, "
                         f"e.g. 1,1,1,1;15:1,1,1,4 (rank 3 four times slower from 15 s), got {given!r}")
    if len({len(factors) for _, factors in schedule}) > 1:
        raise ValueError(f"{name}: every segment needs the same number of factors (one per rank), got {given!r}")
    return schedule


def _schedule(factors: Any, name: str = "slowdown") -> Schedule:
    """``factors`` (a string, per-rank numbers, or ``(seconds, factors)`` pairs) as a checked schedule."""
    # factors: what the user gave, of any type; its form is checked here by use (TypeError: refused)
    if isinstance(factors, str):
        return parse_slowdown(factors, name)
    form = (f"{name} must be a string like '1,1,1,4', a list of per-rank factors or of (seconds, factors) "
            f"pairs, got {factors!r} ({type(factors).__name__})")
    if isinstance(factors, (bytes, bytearray, dict, set, frozenset)):
        raise TypeError(form)
    try:
        items = list(factors)
    except TypeError:
        raise TypeError(form) from None
    if not items:
        raise TypeError(form)
    if not all(isinstance(item, (tuple, list)) for item in items):
        return [(0.0, [_finite_factor(f"{name} factor", f) for f in items])]
    try:
        pairs = [(t, list(fs)) for t, fs in items if not isinstance(fs, (str, bytes, dict))]
    except (TypeError, ValueError):                 # not pairs, or factors that are not a list
        raise TypeError(form) from None
    if len(pairs) != len(items) or not all(fs for _, fs in pairs):
        raise TypeError(form)
    return _checked([(check_float(f"{name} time", t, 0.0), [_finite_factor(f"{name} factor", f) for f in fs])
                     for t, fs in pairs], name, factors)


class Slowdown:
    """Pads this rank's steps to simulate a slower worker.

    Args:
        rank: this rank, an int >= 0.
        factors: per-rank factors (a list, or a string ``"1,1,1,4"``), factors that change over time
            (``"1,1,1,1;15:1,1,1,4"`` or ``[(0, [1, 1, 1, 1]), (15, [1, 1, 1, 4])]``: seconds
            since this rank's first step), or ``None`` to read ``HOROVOD_HETERO_SLOWDOWN`` (unset:
            no slowdown). Factors are numbers > 0 and at most ``MAX_FACTOR`` (1000), at least one per rank.
        base_step_s: fixed base step time in seconds (finite, >= 0); ``None`` reads
            ``HOROVOD_HETERO_BASE_STEP_S`` (unset: proportional to the measured step time).
        per_sample_s: seconds a padded step takes per sample (finite, >= 0): a step of ``b`` samples is
            padded to ``factor * (base_step_s + per_sample_s * b)`` (``base_step_s`` unset: 0), so its
            time grows with its batch; ``None`` reads ``HOROVOD_HETERO_SAMPLE_S``. Each step's samples
            must then be known (``pad(..., samples=b)``; ``hh.DistributedOptimizer`` takes them from
            ``opt.telemetry.annotate(samples=...)``, the Keras callbacks from their ``batch_size=``).
        size: number of ranks, an int > ``rank`` (needed with ``random_delay``).
        random_delay: ``(count, seconds)`` or ``"count:seconds"``: at each step ``count`` random
            ranks sleep ``seconds`` more; ``None`` reads ``HOROVOD_HETERO_RANDOM_DELAY``.
        sleep, clock: injected for tests (callables).

    Every argument and variable is checked here; errors name the argument or the variable.

    Example:
        >>> s = Slowdown(rank=1, factors="1,3", sleep=lambda s: None)
        >>> s.pad(2.5), s.pad(0.01)                   # the first step holds the start-up: not slowed
        (0.0, 0.02)
        >>> linear = Slowdown(rank=1, factors="1,3", base_step_s=0.0, per_sample_s=0.001, sleep=lambda s: None)
        >>> round(linear.pad(0.01, samples=10), 6)    # padded to 3 x 0.001 x 10 s
        0.02
    """

    _t0: float | None

    def __init__(self, rank: int, factors: SlowdownFactors | None = None, base_step_s: float | None = None,
                 sleep: Callable[[float], object] = time.sleep, size: int | None = None,
                 random_delay: tuple[int, float] | str | None = None,
                 clock: Callable[[], float] = time.monotonic, per_sample_s: float | None = None) -> None:
        rank = check_int("rank", rank, 0)
        if size is not None and check_int("size", size, 1) <= rank:
            raise ValueError(f"size must be an int > rank ({rank}), got {size!r}")
        for name, fn in (("sleep", sleep), ("clock", clock)):
            if not callable(fn):
                raise TypeError(f"{name} must be a callable, got {fn!r} ({type(fn).__name__})")
        schedule, name = check_slowdown(factors)
        self.schedule: list[tuple[float, float]] = [(0.0, 1.0)]     # (from seconds, this rank's factor)
        if schedule is not None:
            count = len(schedule[0][1])
            if rank >= count:
                raise ValueError(f"{name} has {count} factors but rank {rank} needs one: "
                                 f"give one factor per rank, e.g. {','.join(['1'] * (rank + 1))}")
            self.schedule = [(start, fs[rank]) for start, fs in schedule]
        self._clock, self._t0 = clock, None
        self.base_step_s = check_base_step(base_step_s)
        self.per_sample_s = check_per_sample(per_sample_s)
        if self.per_sample_s is not None and self.base_step_s is None:
            self.base_step_s = 0.0
        random_delay = check_random_delay(random_delay)
        if random_delay is not None and size is None:
            raise ValueError("random_delay needs size= (the number of ranks)")
        self.random_delay, self.rank, self.size = random_delay, rank, size
        self._sleep = sleep

    @property
    def factor(self) -> float:
        """This rank's factor now (the schedule's clock starts at this rank's first step)."""
        elapsed = 0.0 if self._t0 is None else self._clock() - self._t0
        return [f for start, f in self.schedule if start <= elapsed][-1]

    @property
    def active(self) -> bool:
        return (any(f != 1.0 for _, f in self.schedule) or self.base_step_s is not None
                or bool(self.random_delay))

    def pad(self, measured_s: float, step: int = 0, samples: int | None = None) -> float:
        """Sleep so that a step that took ``measured_s`` appears ``factor`` times slower (plus the
        random delay if this rank is drawn at ``step``); return the sleep. Without a base step (time
        proportional to the measured compute) the first step is not slowed: it holds the start-up
        (imports, tracing, the first allocation), which a slower device does not multiply.
        ``samples``: the step's batch, needed with ``per_sample_s`` (a ``ValueError`` without it)."""
        first = self._t0 is None
        if first:
            self._t0 = self._clock()
        factor = self.factor
        if self.base_step_s is not None:
            target = self.base_step_s
            if self.per_sample_s is not None:
                if samples is None:
                    raise ValueError(f"per_sample_s ({ENV_SAMPLE}) pads a step by its samples, but this step's "
                                     "are not known: report them (opt.telemetry.annotate(samples=len(batch)) "
                                     "with hh.DistributedOptimizer, batch_size= of the Keras callbacks and of "
                                     "hh.slow_down) or unset it")
                target += self.per_sample_s * check_int("samples", samples, 0)
            extra = factor * target - measured_s
        else:
            extra = 0.0 if first else (factor - 1.0) * measured_s
        extra = max(0.0, extra)
        # size is set whenever random_delay is (``__init__`` checks it)
        if self.random_delay and self.rank in delayed_ranks(cast(int, self.size), self.random_delay[0], step):
            extra += self.random_delay[1]
        if extra > 0:
            self._sleep(extra)
        return extra


class Pacer:
    """Applies a ``Slowdown`` to a training loop horovod-hetero does not drive (plain
    ``hvd.DistributedOptimizer``), so Synchronous baselines run under the same simulated speeds.

    ``stop()`` marks the end of a step's own work (before it waits for other ranks; optional),
    ``pad()`` comes after the step: it sleeps as ``Slowdown.pad`` says for the time since the previous
    ``pad()`` (or ``start()``) up to ``stop()`` (or now), before the next step enqueues its collectives.

    Args:
        slowdown: a ``Slowdown``.
        clock: seconds, monotonic (injected for tests).

    Example:
        >>> t = [0.0]
        >>> pacer = Pacer(Slowdown(0, "3", sleep=lambda s: None), clock=lambda: t[0])
        >>> t[0] = 0.1; pacer.stop(); t[0] = 0.5; round(pacer.pad(), 6)     # the first step: start-up
        0.0
        >>> t[0] = 0.6; pacer.stop(); round(pacer.pad(), 6)     # 0.1 s of work: 0.2 s more
        0.2
    """

    _start: float
    _stop: float | None
    #: the handles of framework hooks that drive it, if any (``hh.slow_down``'s torch hooks: ``.remove()`` them)
    hooks: tuple[Any, ...] = ()

    def __init__(self, slowdown: Slowdown, clock: Callable[[], float] = time.perf_counter) -> None:
        if not isinstance(slowdown, Slowdown):
            raise TypeError(f"slowdown must be a Slowdown, got {type(slowdown).__name__}")
        self.slowdown, self._clock = slowdown, clock
        self.steps = 0
        self.start()

    def start(self) -> None:
        """A step begins its own work now."""
        self._start, self._stop = self._clock(), None

    def stop(self) -> None:
        """The step's own work ends now (what follows is waiting for others)."""
        self._stop = self._clock()

    def pad(self, samples: int | None = None) -> float:
        """After a step (of ``samples``, needed with ``per_sample_s``): sleep the simulated extra time;
        return it."""
        end = self._stop if self._stop is not None else self._clock()
        self.steps += 1
        slept = self.slowdown.pad(max(0.0, end - self._start), step=self.steps, samples=samples)
        self.start()
        return slept
