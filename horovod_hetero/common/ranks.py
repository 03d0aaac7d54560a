"""Which ranks train: the ``Membership`` an adapter follows across ``hvd.elastic``'s resets, which
errors are Horovod's report of a failed collective, and whether a rank of this host is gone."""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Union

from horovod.common.exceptions import HorovodInternalError

from horovod_hetero.common.failures import end_gloo_waits, ends_gloo_waits
from horovod_hetero.errors import CollectiveTimeoutError, ElasticResetError, RankLostError
from horovod_hetero.runtime.seams import background_failure, process_sets_held
from horovod_hetero.runtime.membership import Membership

if TYPE_CHECKING:
    import psutil
    from horovod.common.process_sets import ProcessSet

    from horovod_hetero.runtime.controller import HeteroController, OutsideController
    from horovod_hetero.runtime.telemetry import Telemetry

    # the controller an adapter reaches through its ``Membership``
    Controller = Union[HeteroController, OutsideController]

log = logging.getLogger("horovod_hetero")

class ElasticRankLostError(RankLostError, HorovodInternalError):
    """A rank lost under ``hvd.elastic.run`` (``HOROVOD_ELASTIC=1``), which this library saw before
    Horovod did: a dead rank of this host, a transport that closed (a collective of ours that timed out
    stays a ``CollectiveTimeoutError``: it may be the user's own collective between rounds, which a
    reset would repeat).
    Both a ``RankLostError`` (it names the collective, the round and the rank) and Horovod's
    ``HorovodInternalError``, which ``hvd.elastic.run`` takes as a failed worker: it restores the last
    commit and resets, instead of ending this healthy worker."""


#: What Horovod 0.28 allows under ``hvd.elastic`` with process sets (warned once when training starts)
ELASTIC_WITH_PROCESS_SETS = (
    "under hvd.elastic a worker that dies ends the job while process sets besides the global one are "
    "registered (WAGMA's): Horovod 0.28 removes them over the broken connections, its background thread "
    "fails, and Horovod cannot be initialised again in the process (horovod/horovod#3501, #4021); hosts "
    "added or removed through the discovery script reset as usual")
#: Why a worker under ``hvd.elastic`` ends instead of resetting once Horovod's background thread failed
#: (``runtime.seams.background_failure``: only while process sets besides the global one exist)
NO_RESET_WITH_PROCESS_SETS = f"Every rank stops: hvd.elastic cannot start this worker again, {ELASTIC_WITH_PROCESS_SETS}"


class StaleRequestsReset(HorovodInternalError):
    """Raised on every rank by the first collective of a session under ``hvd.elastic.run`` when a rank's
    last session ended in a failed collective: ``hvd.elastic.run`` restores the last commit and resets
    once more (about 0.1 s), and that reset clears what the failed one left in Horovod.

    Horovod 0.28 keeps its request queue across a reset: a collective that a rank enqueued while its
    background loop ended is never completed and stays there. In the new session it waits in the
    coordinator's table, and the first ``hvd.join`` (``sync_model()``) completes it with one rank: the
    others, which never enqueued it, crash in Horovod (a segmentation fault). A reset in which no
    collective fails clears the queue (every rank's loop ends at the same shutdown)."""

    #: the reset it asks for clears Horovod's queue: not a failure (``Membership.reraise``)
    clears_requests = True


def follow_ranks(hvd: Any, process_set: ProcessSet | None, telemetry: Telemetry | str | os.PathLike[str] | None,
                 build: Callable[[Telemetry | str | os.PathLike[str] | None], Controller]) -> Membership[Controller]:
    """The ``Membership`` an adapter reaches its controller through: rebuilt when Horovod's ranks
    change (``hvd.elastic``'s reset) or a collective raised ``HorovodInternalError``.

    Args:
        hvd: ``horovod.torch`` or ``horovod.tensorflow``.
        process_set: the adapter's ``process_set`` (a non-global one does not survive a reset:
            ``ElasticResetError``).
        telemetry: the adapter's ``telemetry`` argument; after a reset the previous controller's
            ``Telemetry`` goes on if this rank kept its number (else a new one: another rank's file).
        build: ``build(telemetry) -> controller`` for the current ranks.
    """
    def rebuild(previous: Controller | None) -> Controller:
        if previous is None:
            return build(telemetry)
        if process_set not in (None, hvd.global_process_set):
            raise ElasticResetError(
                f"Horovod was initialised again (an elastic reset) and process_set={process_set!r} did not "
                f"survive it: with hvd.elastic, train over the global process set (the default)")
        kept = getattr(previous.telemetry, "rank", None) == hvd.rank()
        return build(previous.telemetry if kept else telemetry)

    ended: dict[str, Controller | None] = {"session": None}

    def end_session(controller: Controller) -> None:
        """End the failed session's Gloo connections (``end_gloo_waits``), once a session."""
        if ended["session"] is controller:
            return
        ended["session"] = controller
        try:
            if ends_gloo_waits():           # HOROVOD_HETERO_END_GLOO_WAITS=0: left to Gloo's timeout
                end_gloo_waits()
        except Exception:                   # never in the way of the error: Gloo's timeout then ends the wait
            log.debug("ending the failed session's Gloo connections failed", exc_info=True)

    def lost(controller: Controller, error: BaseException) -> BaseException | None:
        if not collective_failed(error):
            return None                     # not a failed collective: the error as it is
        if not under_elastic():
            return controller.rank_lost(error)
        # Horovod cannot start again in this process (its thread failed removing the process sets), or will
        # not (the session holds process sets besides the global one): no reset, which would wait for that thread
        if background_failure.is_set() or process_sets_held.is_set():
            # the failed session's Gloo connections ended too: another survivor's Horovod thread, removing the
            # process sets over them (every enqueue of that survivor waiting), fails then, not at Gloo's timeout
            if not isinstance(error, CollectiveTimeoutError):
                end_session(controller)
            return controller.rank_lost(error, NO_RESET_WITH_PROCESS_SETS)
        # A timeout of ours: as it is (it may be a collective of the user's between rounds, which a reset would
        # only repeat, endlessly); Horovod's session may be healthy
        if isinstance(error, CollectiveTimeoutError):
            return None
        # The session failed, and hvd.elastic.run resets Horovod: end the session's Gloo connections, or a
        # survivor waiting on this process in the failed collective waits for Gloo's timeout before its reset
        # (once a session; not for the reset that only clears Horovod's queue, whose session is healthy)
        if not getattr(error, "clears_requests", False):
            end_session(controller)
        if isinstance(error, HorovodInternalError):
            return None                     # Horovod's own error: hvd.elastic.run resets on it
        return ElasticRankLostError(*error.args)   # ours (a dead rank seen first): the same reset

    return Membership(rebuild, lambda: (hvd.rank(), hvd.size()), HorovodInternalError, lost)

def under_elastic() -> bool:
    """Whether this process runs under ``hvd.elastic.run`` (``horovodrun`` sets ``HOROVOD_ELASTIC=1``)."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"

def collective_failed(error: BaseException) -> bool:
    """True if ``error`` is Horovod's report of a failed collective: ``HorovodInternalError``
    (torch, object collectives), TensorFlow's ``OpError`` from a Horovod op, or a timeout of ours.
    (In a compiled function the op that was running when Horovod failed reports Gloo's error under
    its node's name, ``horovod_hetero.*``; ops after it, "Horovod has been shut down".)"""
    if isinstance(error, (HorovodInternalError, RankLostError)):
        return True
    op_error = any(c.__name__ == "OpError" for c in type(error).__mro__)    # no TensorFlow import here
    return op_error and ("Horovod" in str(error) or _OUR_NODE.search(str(error)) is not None)


#: a node of ours in a TensorFlow error: ``{{node horovod_hetero.gradients/...}}``, also inside a branch
#: (``{{node cond/horovod_hetero.gradients/...}}``: hh.DistributedOptimizer's average is a ``cond``)
_OUR_NODE = re.compile(r"\{\{node (?:[^\s{}/]+/)*horovod_hetero\.")

def process_state(process: int | psutil.Process) -> str | None:
    """``"died"`` or ``"stopped"`` for a process of this host (a pid or a ``psutil.Process``) that
    cannot take part any more, else None."""
    import psutil
    try:
        status = (process if isinstance(process, psutil.Process) else psutil.Process(process)).status()
    except psutil.NoSuchProcess:
        return "died"
    return {psutil.STATUS_ZOMBIE: "died", psutil.STATUS_DEAD: "died", psutil.STATUS_STOPPED: "stopped"}.get(status)
