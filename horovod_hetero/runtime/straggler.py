"""Straggler simulation: make rank i's steps take factor_i times as long.

``HOROVOD_HETERO_SLOWDOWN="1,1,1,4"`` slows rank 3 to a quarter of the others' pace, so a
heterogeneous cluster can be reproduced on one machine. By default the extra time is a sleep
of ``(factor - 1) * measured step time``; with ``HOROVOD_HETERO_BASE_STEP_S=0.02`` each step
is instead padded to ``factor * 0.02`` seconds, which is steadier when processes share cores.

``HOROVOD_HETERO_RANDOM_DELAY="2:0.05"`` adds transient stragglers, as in the WAGMA paper's
ResNet experiment: at each step index, 2 ranks drawn at random (the same draw on every rank)
sleep 0.05 s more.
"""
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
    """Parse ``"1,1,1,4"`` into ``[1.0, 1.0, 1.0, 4.0]``; every factor must be > 0."""
    try:
        factors = [float(part) for part in str(text).split(",")]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers > 0 (one per rank), got {text!r}") from None
    for f in factors:
        check_float(name, f, 0.0, min_exclusive=True)
    return factors


class Slowdown:
    """Pads this rank's steps to simulate a slower worker.

    Args:
        rank: this rank.
        factors: list of per-rank factors, a string ``"1,1,1,4"``, or ``None`` to read
            ``HOROVOD_HETERO_SLOWDOWN`` (unset: no slowdown).
        base_step_s: fixed base step time in seconds; ``None`` reads
            ``HOROVOD_HETERO_BASE_STEP_S`` (unset: proportional to the measured step time).
        size: number of ranks (needed with ``random_delay``).
        random_delay: ``(count, seconds)`` or ``"count:seconds"``: at each step ``count`` random
            ranks sleep ``seconds`` more; ``None`` reads ``HOROVOD_HETERO_RANDOM_DELAY``.
        sleep: injected for tests.

    Example:
        >>> Slowdown(rank=1, factors="1,3", sleep=lambda s: None).pad(0.01)
        0.02
    """

    def __init__(self, rank, factors=None, base_step_s=None, sleep=time.sleep, size=None, random_delay=None):
        if factors is None:
            factors = os.environ.get(ENV_FACTORS) or None
        if base_step_s is None and os.environ.get(ENV_BASE):
            base_step_s = float(os.environ[ENV_BASE])
        if isinstance(factors, str):
            factors = parse_factors(factors)
        self.factor = 1.0
        if factors is not None:
            factors = [check_float("slowdown factor", f, 0.0, min_exclusive=True) for f in factors]
            if rank >= len(factors):
                raise ValueError(f"{ENV_FACTORS} has {len(factors)} factors but rank {rank} needs one: "
                                 f"give one factor per rank, e.g. {','.join(['1'] * (rank + 1))}")
            self.factor = factors[rank]
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
    def active(self):
        return self.factor != 1.0 or self.base_step_s is not None or bool(self.random_delay)

    def pad(self, measured_s, step=0):
        """Sleep so that a step that took ``measured_s`` appears ``factor`` times slower (plus the
        random delay if this rank is drawn at ``step``); return the sleep."""
        if self.base_step_s is not None:
            extra = self.factor * self.base_step_s - measured_s
        else:
            extra = (self.factor - 1.0) * measured_s
        extra = max(0.0, extra)
        if self.random_delay and self.rank in delayed_ranks(self.size, self.random_delay[0], step):
            extra += self.random_delay[1]
        if extra > 0:
            self._sleep(extra)
        return extra
