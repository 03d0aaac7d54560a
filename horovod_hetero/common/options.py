"""The check of an adapter's run options when the user builds it, before ``hvd.init()`` is needed."""
from __future__ import annotations

from horovod_hetero.common.failures import ends_gloo_waits
from horovod_hetero.runtime.straggler import (ENV_SAMPLE, Slowdown, check_base_step, check_per_sample,
                                              check_random_delay, check_slowdown)
from horovod_hetero.runtime.telemetry import Telemetry, telemetry_directory
from horovod_hetero.transports.addresses import server_host_setting


def check_run_options(telemetry: object, slowdown: object) -> None:
    """Check an adapter's ``telemetry`` and ``slowdown``, the variables that fill in for them
    (``HOROVOD_HETERO_*``) and ``HOROVOD_HETERO_END_GLOO_WAITS`` when the adapter is built, before
    ``hvd.init()`` is needed; the ``Telemetry`` and ``Slowdown`` themselves are built later (they need the
    rank), with the same errors."""
    if not isinstance(telemetry, Telemetry):
        telemetry_directory(telemetry)
    if not isinstance(slowdown, Slowdown):
        check_slowdown(slowdown)
        check_base_step(None)
        check_per_sample(None)
        check_random_delay(None)
    server_host_setting()
    ends_gloo_waits()


def check_samples_known(slowdown: object, batch_size: int | None) -> None:
    """A ``ValueError`` naming ``batch_size`` where a step is padded by its samples (``per_sample_s`` of a
    ``Slowdown``, or ``HOROVOD_HETERO_SAMPLE_S``) and an adapter that cannot count them is given none."""
    padded_by_samples = (slowdown.per_sample_s if isinstance(slowdown, Slowdown) else check_per_sample(None)) is not None
    if padded_by_samples and batch_size is None:
        raise ValueError(f"{ENV_SAMPLE} (per_sample_s) pads each batch by its samples: give batch_size= (this "
                         f"rank's batch, an int >= 1), or unset it")
