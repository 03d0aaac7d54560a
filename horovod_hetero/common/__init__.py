"""Framework-free core of horovod-hetero: strategies, schedules, the round protocol, telemetry.

Nothing here imports torch or tensorflow; collectives come in as arguments.
"""
from horovod_hetero.common.strategy import ESync, LocalSGD, Strategy, Synchronous, check_strategy  # noqa: F401
