"""Straggler simulation: make rank i's steps take factor_i times as long.

``HOROVOD_HETERO_SLOWDOWN="1,1,1,4"`` slows rank 3 to a quarter of the others' pace, so a
heterogeneous cluster can be reproduced on one machine. By default the extra time is a sleep
of ``(factor - 1) * measured step time``; with ``HOROVOD_HETERO_BASE_STEP_S=0.02`` each step
is instead padded to ``factor * 0.02`` seconds, which is steadier when processes share cores.
"""
import os
import time

from horovod_hetero.common.validation import check_float

ENV_FACTORS = "HOROVOD_HETERO_SLOWDOWN"
ENV_BASE = "HOROVOD_HETERO_BASE_STEP_S"


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
        sleep: injected for tests.

    Example:
        >>> Slowdown(rank=1, factors="1,3", sleep=lambda s: None).pad(0.01)
        0.02
    """

    def __init__(self, rank, factors=None, base_step_s=None, sleep=time.sleep):
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
        self._sleep = sleep

    @property
    def active(self):
        return self.factor != 1.0 or self.base_step_s is not None

    def pad(self, measured_s):
        """Sleep so that a step that took ``measured_s`` appears ``factor`` times slower; return the sleep."""
        if self.base_step_s is not None:
            extra = self.factor * self.base_step_s - measured_s
        else:
            extra = (self.factor - 1.0) * measured_s
        extra = max(0.0, extra)
        if extra > 0:
            self._sleep(extra)
        return extra
