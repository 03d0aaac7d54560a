"""The two interfaces a framework adapter implements once: ``Collectives`` and ``Model``.

Everything else (the weighted average, the round protocol, group averaging, blending,
transports) is written once in the runtime over these interfaces, with Python's arithmetic
operators on the framework's tensors (``t * w``, ``s / n``, ``g + lr * (w - g)`` work the same on
torch tensors, TensorFlow tensors and NumPy arrays).

- ``Collectives``: Horovod's collectives for one framework (``horovod_hetero.torch.adapter``,
  ``horovod_hetero.keras._tensorflow``; shared Horovod logic in ``horovod_hetero.common``).
- ``Model``: how the user's model is read and written (torch parameters, Keras variables).
"""
from __future__ import annotations

import faulthandler
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from horovod_hetero.errors import CollectiveTimeoutError, RankLostError

#: Seconds a collective may take before it is declared stuck (a dead or diverged rank).
DEFAULT_TIMEOUT_S = 300.0

#: A framework's tensor as the runtime handles it: a ``torch.Tensor``, a TensorFlow tensor or variable,
#: or a NumPy array (the tests'); only Python's arithmetic operators are applied to it here.
Tensor = Any

_T = TypeVar("_T")


class Collectives(ABC):
    """Collectives over the ranks that synchronise.

    Attributes:
        rank, size: this rank within the set, the set's size.
        host: the address other ranks reach this process at (servers bind and advertise it).
        timeout: seconds any collective may take before ``CollectiveTimeoutError``.
        session: appended to the name of every collective of the set after the controller's first
            start, the same on every rank (``named``): a collective that Horovod took just as its loop
            ended after a failure stays queued under its name for ever (Horovod 0.28), and the next
            collective of that name after ``hvd.elastic``'s reset would be refused. Torch's collectives
            name theirs so; TensorFlow's keep the names their functions were traced with.
    """

    rank = 0
    size = 1
    host = "127.0.0.1"
    timeout = DEFAULT_TIMEOUT_S
    session = ""

    def named(self, name: str) -> str:
        """``name`` in this session (``session``)."""
        return name + self.session

    @abstractmethod
    def allreduce_sum(self, tensors: Sequence[Tensor], control: Sequence[float], *,
                      ranks: Sequence[int] | None = None, name: str, what: str, inplace: bool = False,
                      like: Tensor | None = None) -> tuple[list[Tensor], list[float]]:
        """Sum ``tensors`` and the float list ``control`` over the set (or over the process set of
        ``ranks``) in one fused collective; return ``(sums, summed control as floats)``.

        The control vector goes where the framework needs it (torch: on the tensors' device, since
        Horovod's grouped allreduce reads the whole group on its first tensor's device).
        ``inplace=True`` lets the adapter sum into ``tensors`` themselves. ``tensors`` may be empty (a
        round of statistics only): the control vector then goes on ``like``'s device (a model tensor).
        Raises ``CollectiveTimeoutError`` naming ``what`` after ``timeout`` (the adapter's own wait).
        """

    #: ``start_sum`` starts a sum and returns before it is done (torch), so a round of statistics can overlap a step
    overlaps = False

    def start_sum(self, control: Sequence[float], *, name: str, what: str,
                  like: Tensor | None = None) -> Callable[[], list[float]]:
        """Start summing the float list ``control`` over the set and return at once (where ``overlaps``; else sum
        it now); return what waits for the sum (``CollectiveTimeoutError`` naming ``what`` after ``timeout``, as
        ``allreduce_sum``) and returns it as floats. Every rank starts the same sums in the same order, and waits
        for each before it starts the next of the same ``name``."""
        _, summed = self.allreduce_sum([], control, name=name, what=what, like=like)
        return lambda: summed

    @abstractmethod
    def copy(self, tensors: Sequence[Tensor]) -> list[Tensor]:
        """New tensors equal to ``tensors`` (a snapshot)."""

    def broadcast(self, tensors: Sequence[Tensor], root_rank: int, *, name: str, what: str) -> list[Tensor]:
        """``root_rank``'s ``tensors`` on every rank (any dtype), in order; ``CollectiveTimeoutError``
        naming ``what`` after ``timeout``."""
        raise NotImplementedError(f"{type(self).__name__} cannot broadcast tensors")

    def mean(self, tensors: Sequence[Tensor], *, name: str) -> list[Tensor]:
        """The element-wise mean of ``tensors`` over the set, callable inside a traced training step
        (a Keras ``train_step``): gradient averaging. Traced, it cannot be timed out from Python:
        Gloo's own timeout bounds it (``HOROVOD_GLOO_TIMEOUT_SECONDS``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot average tensors")

    def timed_mean(self, tensors: Sequence[Tensor], *, name: str) -> tuple[list[Tensor], float | Tensor]:
        """``(mean(tensors), seconds it took)``, the seconds as a number or a backend scalar, measured
        where the average runs (inside a compiled step too): the wait for the other ranks, which a
        step's own compute excludes."""
        raise NotImplementedError(f"{type(self).__name__} cannot average tensors")

    @abstractmethod
    def broadcast_object(self, obj: Any, *, what: str, root: int | None = None) -> Any:
        """``obj`` of the set's first rank (or of global rank ``root``), on every rank."""

    @abstractmethod
    def allgather_object(self, obj: Any, *, what: str) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""

    def know_peers(self) -> None:
        """Note where the set's ranks run (a collective, at the first start) for ``lost_ranks``."""

    def lost_ranks(self) -> dict[int, str]:
        """``{rank: "died" or "stopped"}`` for the ranks of the set this host sees lost (its own
        processes only: a rank on another host is never named); empty when nothing is known."""
        return {}

    def require_groups(self, rank_lists: Sequence[Sequence[int]], init_call: str) -> None:
        """Make sure every group in ``rank_lists`` can be averaged over (its process set is
        registered), else a ``ValueError`` naming ``init_call``."""


class Model(ABC):
    """The model's floating-point tensors, in the same order on every rank."""

    @abstractmethod
    def tensors(self) -> list[Tensor]:
        """The live tensors (summing ``inplace`` into them changes the model)."""

    @abstractmethod
    def assign(self, values: Sequence[Tensor], divisor: float = 1.0, add_current: bool = False) -> None:
        """Set the model to ``(values [+ model]) / divisor``, tensor by tensor."""

    @abstractmethod
    def place(self, values: Sequence[Any]) -> list[Tensor]:
        """New tensors holding ``values`` (arrays or tensors, e.g. from a checkpoint) with the model's
        tensors' shapes, dtypes and devices; a ``ValueError`` if they do not fit."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes of the tensors (telemetry's traffic estimate)."""


def scaled(tensors: Sequence[Tensor], weight: float) -> Sequence[Tensor]:
    """``weight * tensors`` (the tensors themselves for weight 1, so they can be summed in place)."""
    return tensors if weight == 1.0 else [t * weight for t in tensors]


def call_with_timeout(fn: Callable[[], _T], timeout_s: float, what: str) -> _T:
    """Run a blocking call ``fn()`` with a time limit; raise ``CollectiveTimeoutError`` naming ``what``.

    For collectives that cannot be polled (TensorFlow eager ops, object collectives): the call
    runs in a helper thread; on timeout the caller gets an error instead of hanging forever.

    Example:
        >>> call_with_timeout(lambda: 42, 1.0, "the answer")
        42
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller
            box["error"] = e

    thread = threading.Thread(target=target, name="horovod_hetero-collective", daemon=True)
    thread.start()
    started = time.monotonic()
    deadline = started + timeout_s
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(min(0.05, max(0.0, deadline - time.monotonic())))
        check_background(what, time.monotonic() - started)
    if thread.is_alive():
        raise timeout_error(what, timeout_s)
    if "error" in box:
        raise box["error"]
    return box["value"]


class FailureEvent(threading.Event):
    """A ``threading.Event`` that also holds why it was set (``reason``)."""

    reason: str | None


#: Set (with what happened) when the collectives' own background thread failed for good (Horovod's,
#: ``common.failures.catch_background_abort``): every wait then ends at once with a ``RankLostError``.
background_failure = FailureEvent()
background_failure.reason = None
#: Set once this process has seen a collective fail (a ``RankLostError`` or a timeout of ours, or
#: ``background_failure``): from then on ``common.failures.guard_gil`` watches that Python code still runs.
failure_seen = threading.Event()
#: Set when a collective of this process failed (``Membership.reraise``): Horovod may keep, across
#: ``hvd.elastic``'s reset, requests this process enqueued as its background loop ended. The next
#: session's first collective tells every rank (``HorovodCollectives.know_peers``), which clears it.
requests_left = threading.Event()
#: Set while Horovod's session holds process sets besides the global one (WAGMA's, or the user's; read from
#: Horovod's table while the session is healthy: ``HorovodCollectives``): Horovod 0.28 cannot reset such a
#: session after a failed collective, so under ``hvd.elastic`` a failure then ends the worker at once.
process_sets_held = threading.Event()


def forget_failure() -> None:
    """The failure this process saw is over (``hvd.elastic`` started Horovod again): clear ``failure_seen``
    and end the GIL watchdog's countdown, which ``common.failures.guard_gil`` re-armed every second while
    the failure stood (left running, it would end a healthy process that then waits 45 s in Horovod)."""
    failure_seen.clear()
    _probe["ask"] = None                    # its answer was about the library before the restart
    faulthandler.cancel_dump_traceback_later()


#: Seconds a wait lasts before it asks ``library_down`` whether the collectives' library stopped, and
#: between two asks (a collective usually ends sooner)
PROBE_AFTER_S = 1.0
#: Seconds a wait gives a fresh ask to answer before it goes on waiting (an ask usually takes microseconds)
PROBE_ANSWER_S = 0.05
#: ``() -> str | None``: why the collectives' library can complete no collective any more (Horovod's
#: background loop ended after a failed collective), or None; an adapter sets it (``common.horovod_collectives``)
library_down: list[Callable[[], str | None]] = []


class _Ask(threading.Thread):
    """One ask of ``library_down``, on a thread of its own: the library may hold the lock the ask takes
    (Horovod's process-set table, held through a Gloo timeout by a background thread that failed while
    it removed the job's process sets), and a wait must go on watching ``background_failure`` meanwhile."""

    def __init__(self, ask: Callable[[], str | None], at: float) -> None:
        super().__init__(name="horovod_hetero-probe", daemon=True)
        self.ask, self.at = ask, at
        self.reason: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.reason = self.ask()
        except BaseException as e:  # re-raised in the wait that reads it
            self.error = e


#: the last ask (None before the first): a wait starts the next one PROBE_AFTER_S after it, once it answered
_probe: dict[str, _Ask | None] = {"ask": None}


def _library_stopped(now: float) -> str | None:
    """Why the library stopped, from the last ask once it answered (a reason stands until
    ``forget_failure``); a new ask when the last answered None PROBE_AFTER_S ago."""
    ask = _probe["ask"]
    answered_none = ask is not None and not ask.is_alive() and ask.reason is None and ask.error is None
    if ask is None or (answered_none and now - ask.at >= PROBE_AFTER_S):
        ask = _probe["ask"] = _Ask(library_down[0], now)
        ask.start()
        ask.join(PROBE_ANSWER_S)
    if ask.is_alive():                      # no answer yet: the library holds its lock; the wait goes on
        return None
    if ask.error is not None:
        raise ask.error
    return ask.reason


def check_background(what: str, waited_s: float = 0.0) -> None:
    """Raise ``RankLostError`` naming ``what`` if the collectives' background thread failed or, in a
    wait that has lasted ``waited_s`` >= ``PROBE_AFTER_S`` seconds, their library stopped
    (``library_down``, asked on a thread of its own, never blocking the wait): a collective it took
    after its last one failed is never completed, and the wait would last until its timeout."""
    if background_failure.is_set():
        failure_seen.set()
        raise RankLostError(f"{what} cannot complete: {background_failure.reason}")
    if library_down and waited_s >= PROBE_AFTER_S:
        reason = _library_stopped(time.monotonic())
        if reason is not None:
            failure_seen.set()
            raise RankLostError(f"{what} cannot complete: {reason}")


#: Seconds between two looks at ``background_failure`` while ``library_answers`` waits for an ask
ANSWER_POLL_S = 0.005


def library_answers(what: str, timeout_s: float, give_up_s: float | None = None) -> bool:
    """True once the collectives' library answers a fresh ask of ``library_down`` that it still runs; raise
    ``RankLostError`` naming ``what`` where it answers it stopped, or where its background thread fails
    (``background_failure``) meanwhile; ``CollectiveTimeoutError`` after ``timeout_s``; False after
    ``give_up_s`` without an answer, if given (the ask goes on, on its own thread).

    The ask runs on a thread of its own and waits for the library's lock without holding the GIL: a caller
    about to enqueue into Horovod while its failed background thread holds the process-set table's lock
    waits here instead of inside the enqueue (which holds the GIL, so that the terminate handler that
    reports the failure could never run). In a healthy job the ask answers in some 0.1 ms."""
    if not library_down:
        return True
    ask = _Ask(library_down[0], time.monotonic())
    ask.start()
    deadline = time.monotonic() + timeout_s
    give_up = time.monotonic() + give_up_s if give_up_s is not None else None
    while True:
        ask.join(ANSWER_POLL_S)
        check_background(what)
        if not ask.is_alive():
            break
        if give_up is not None and time.monotonic() > give_up:
            return False
        if time.monotonic() > deadline:
            raise timeout_error(what, timeout_s)
    if ask.error is not None:
        raise ask.error
    if ask.reason is not None:
        failure_seen.set()
        raise RankLostError(f"{what} cannot complete: {ask.reason}")
    return True


def timeout_error(what: str, timeout_s: float) -> CollectiveTimeoutError:
    """The error every stuck collective raises, torch and Keras alike."""
    failure_seen.set()
    return CollectiveTimeoutError(
        f"{what} did not complete in {timeout_s:g} s: a rank may have died, or ranks stopped entering the "
        f"same rounds (every rank must end with sync_model(), which Keras calls in on_train_end), or a rank "
        f"is in a collective of its own (a metric hvd.allreduce, MetricAverageCallback, hvd.elastic's "
        f"state.commit()) while others are in a round: call sync_model() before it (Keras: epoch_sync=True). "
        f"Raise the limit with timeout=...")
