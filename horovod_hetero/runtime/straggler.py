"""Straggler simulation: make rank i's steps take factor_i times as long.

``HOROVOD_HETERO_SLOWDOWN="1,1,1,4"`` slows rank 3 to a quarter of the others' pace, so a
heterogeneous cluster can be reproduced on one machine. Speeds can change during the run:
``"1,1,1,1;15:1,1,1,4;30:2,1,1,4"`` makes rank 3 four times slower from 15 s after the rank's
first step and rank 0 twice as slow from 30 s (``SECONDS:FACTORS`` segments, times increasing). By default the extra time is a sleep
of ``(factor - 1) * measured step time``; with ``HOROVOD_HETERO_BASE_STEP_S=0.02`` each step
is instead padded to ``factor * 0.02`` seconds, which is steadier when processes share cores.

``HOROVOD_HETERO_RANDOM_DELAY="2:0.05"`` adds transient stragglers, as in the WAGMA paper's
ResNet experiment: at each step index, 2 ranks drawn at random (the same draw on every rank)
sleep 0.05 s more.
"""
import math
import operator
import os
import time

import numpy as np

from horovod_hetero.validation import check_float, check_int

ENV_FACTORS = "HOROVOD_HETERO_SLOWDOWN"
ENV_BASE = "HOROVOD_HETERO_BASE_STEP_S"
ENV_RANDOM = "HOROVOD_HETERO_RANDOM_DELAY"


def parse_random_delay(text, name=ENV_RANDOM):
    """Parse ``"2:0.05"`` (ranks delayed per step : seconds) into ``(2, 0.05)``."""
    try:
        count, seconds = str(text).split(":")
        count, seconds = int(count), float(seconds)
    except ValueError:
        raise ValueError(f"{name} must be COUNT:SECONDS, e.g. 2:0.05 (2 random ranks sleep 0.05 s more "
                         f"each step), got {text!r}") from None
    return check_int(f"{name} count", count, 0), check_float(f"{name} seconds", seconds, 0.0)


def delayed_ranks(size, count, step, seed=0):
    """The ``count`` ranks of ``size`` delayed at ``step``: the same on every rank.

    Example:
        >>> sorted(delayed_ranks(4, 2, step=7)) == sorted(delayed_ranks(4, 2, step=7))
        True
    """
    return np.random.default_rng([seed, step]).choice(size, size=min(count, size), replace=False).tolist()


def parse_factors(text, name=ENV_FACTORS):
    """Parse ``"1,1,1,4"`` into ``[1.0, 1.0, 1.0, 4.0]``; every factor must be finite and > 0."""
    try:
        factors = [float(part) for part in str(text).split(",")]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers > 0 (one per rank), got {text!r}") from None
    return [_finite_factor(name, f) for f in factors]


def _finite_factor(name, value):
    return check_float(name, value, 0.0, min_exclusive=True)


def parse_slowdown(text, name=ENV_FACTORS):
    """Parse factors, or factors that change over time, into ``[(from_seconds, factors), ...]``.

    Example:
        >>> parse_slowdown("1,1,1,4")
        [(0.0, [1.0, 1.0, 1.0, 4.0])]
        >>> parse_slowdown("1,1,1,1;15:1,1,1,4;30:2,1,1,4")[1:]
        [(15.0, [1.0, 1.0, 1.0, 4.0]), (30.0, [2.0, 1.0, 1.0, 4.0])]
    """
    schedule = []
    for segment in str(text).split(";"):
        start, colon, factors = segment.rpartition(":")
        try:
            start = float(start) if colon else 0.0
        except ValueError:
            start = math.nan
        schedule.append((start, parse_factors(factors, name)))
    return _checked(schedule, name, text)


def _checked(schedule, name, given):
    times = [start for start, _ in schedule]
    if times[0] != 0.0 or not all(map(operator.lt, times, times[1:])) or not math.isfinite(times[-1]):
        raise ValueError(f"{name} must be FACTORS or FACTORS;SECONDS:FACTORS;... with times increasing from 0, "
                         f"e.g. 1,1,1,1;15:1,1,1,4 (rank 3 four times slower from 15 s), got {given!r}")
    if len({len(factors) for _, factors in schedule}) > 1:
        raise ValueError(f"{name}: every segment needs the same number of factors (one per rank), got {given!r}")
    return schedule


def _schedule(factors):
    """``factors`` (a string, per-rank numbers, or ``(seconds, factors)`` pairs) as a checked schedule."""
    if isinstance(factors, str):
        return parse_slowdown(factors, "slowdown")
    form = (f"slowdown must be a string like '1,1,1,4', a list of per-rank factors or of (seconds, factors) "
            f"pairs, got {factors!r}")
    try:
        items = list(factors)
    except TypeError:
        raise TypeError(form) from None
    if not items:
        raise TypeError(form)
    if not all(isinstance(item, (tuple, list)) for item in items):
        return [(0.0, [_finite_factor("slowdown factor", f) for f in items])]
    try:
        pairs = [(t, list(fs)) for t, fs in items]
    except (TypeError, ValueError):                 # not pairs, or factors that are not a list
        raise TypeError(form) from None
    return _checked([(check_float("slowdown time", t, 0.0), [_finite_factor("slowdown factor", f) for f in fs])
                     for t, fs in pairs], "slowdown", factors)


class Slowdown:
    """Pads this rank's steps to simulate a slower worker.

    Args:
        rank: this rank.
        factors: per-rank factors (a list, or a string ``"1,1,1,4"``), factors that change over time
            (``"1,1,1,1;15:1,1,1,4"`` or ``[(0, [1, 1, 1, 1]), (15, [1, 1, 1, 4])]``: seconds
            since this rank's first step), or ``None`` to read ``HOROVOD_HETERO_SLOWDOWN`` (unset:
            no slowdown).
        base_step_s: fixed base step time in seconds; ``None`` reads
            ``HOROVOD_HETERO_BASE_STEP_S`` (unset: proportional to the measured step time).
        size: number of ranks (needed with ``random_delay``).
        random_delay: ``(count, seconds)`` or ``"count:seconds"``: at each step ``count`` random
            ranks sleep ``seconds`` more; ``None`` reads ``HOROVOD_HETERO_RANDOM_DELAY``.
        sleep, clock: injected for tests.

    Example:
        >>> Slowdown(rank=1, factors="1,3", sleep=lambda s: None).pad(0.01)
        0.02
    """

    def __init__(self, rank, factors=None, base_step_s=None, sleep=time.sleep, size=None, random_delay=None,
                 clock=time.monotonic):
        if factors is None and os.environ.get(ENV_FACTORS):
            factors = parse_slowdown(os.environ[ENV_FACTORS])
        if base_step_s is None and os.environ.get(ENV_BASE):
            text = os.environ[ENV_BASE]
            try:
                base_step_s = check_float(ENV_BASE, float(text), 0.0)
            except (TypeError, ValueError):
                raise ValueError(f"{ENV_BASE} must be finite seconds >= 0, e.g. 0.1, got {text!r}") from None
        self.schedule = [(0.0, 1.0)]            # (from seconds, this rank's factor)
        if factors is not None:
            schedule = _schedule(factors)
            count = len(schedule[0][1])
            if rank >= count:
                raise ValueError(f"{ENV_FACTORS} has {count} factors but rank {rank} needs one: "
                                 f"give one factor per rank, e.g. {','.join(['1'] * (rank + 1))}")
            self.schedule = [(start, fs[rank]) for start, fs in schedule]
        self._clock, self._t0 = clock, None
        self.base_step_s = None if base_step_s is None else check_float("base_step_s", base_step_s, 0.0)
        if random_delay is None:
            random_delay = os.environ.get(ENV_RANDOM) or None
        if isinstance(random_delay, str):
            random_delay = parse_random_delay(random_delay)
        if random_delay is not None and size is None:
            raise ValueError("random_delay needs size= (the number of ranks)")
        self.random_delay, self.rank, self.size = random_delay, rank, size
        self._sleep = sleep

    @property
    def factor(self):
        """This rank's factor now (the schedule's clock starts at this rank's first step)."""
        elapsed = 0.0 if self._t0 is None else self._clock() - self._t0
        return [f for start, f in self.schedule if start <= elapsed][-1]

    @property
    def active(self):
        return (any(f != 1.0 for _, f in self.schedule) or self.base_step_s is not None
                or bool(self.random_delay))

    def pad(self, measured_s, step=0):
        """Sleep so that a step that took ``measured_s`` appears ``factor`` times slower (plus the
        random delay if this rank is drawn at ``step``); return the sleep."""
        if self._t0 is None:
            self._t0 = self._clock()
        factor = self.factor
        if self.base_step_s is not None:
            extra = factor * self.base_step_s - measured_s
        else:
            extra = (factor - 1.0) * measured_s
        extra = max(0.0, extra)
        if self.random_delay and self.rank in delayed_ranks(self.size, self.random_delay[0], step):
            extra += self.random_delay[1]
        if extra > 0:
            self._sleep(extra)
        return extra
