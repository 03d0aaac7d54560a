"""Wait-avoiding group averaging: one rank's side, with a responder thread (WAGMA-SGD, Algorithm 2).

Horovod has no one-sided activation: a collective completes only when every member of its
process set has enqueued it. So each rank runs a *responder*. The first member of a group to
start a group average (the activator) sends an activation (``activations``) to its peers and
enqueues the group allreduce with its fresh model; a peer whose own step is still running has its
responder enqueue the same allreduce at once with the model it last published (stale: Algorithm 2's
send buffer). The activator waits for activation + Horovod's negotiation, not for the straggler.
When the straggler reaches that group average itself it finds its part done (``GroupResult.stale``)
and the runtime takes 1/(S+1) (W_sum + W') (line 13).

Nothing here knows a strategy: the runtime asks for ``average(tag, group, model)`` when a strategy
answers ``GroupAverage(group, tag)``, and publishes the model the next step starts from.

Whatever the responder serves for a tag this rank's main thread may still reach is recorded, and the
main thread takes that result instead of running the tag again (its peers finished it: a second
allreduce of the same tag would wait for them forever). That includes weight 0: after a join that
every rank reached (``sync_model()``) a rank serves weight 0 until it steps again
(``publish(model, 0.0, collects=True)``), and a peer that steps first gets its group average served
from it. Only a rank that left is never recorded (``publish(model, 0.0)``: it waits in a join that
not every rank has reached, takes no step before all have, and the strategy's tags then continue
above every tag used meanwhile).

Bounds: the responder serves at most ``MAX_SERVING`` group averages at once, and only for a group
this rank belongs to (``groups``) and a tag it has not reached. Any other activation is dropped and
counted (``dropped``); that is safe, because a tag nobody served is run fresh by this rank's main
thread when it gets there (its activator waits for it meanwhile; a rank waiting in a join serves
at once, so its serves never pile up to the bound). An error while handling one activation is
logged and counted, and the responder goes on.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING

from horovod_hetero.runtime.events import ModelChanged

from horovod_hetero.errors import RoundMismatchError
from horovod_hetero.runtime.seams import Tensor, timeout_error
from horovod_hetero.runtime.rounds import tag as exact_tag

if TYPE_CHECKING:
    from horovod_hetero.transports.activations import Activations

#: Seconds close() waits for group averages the responder is still serving (daemon threads after that).
CLOSE_WAIT_S = 5.0
#: Group averages the responder serves at once (one thread each); activations beyond are dropped.
MAX_SERVING = 16
#: Collective names a group average cycles through (``tag % NAME_SLOTS``): a framework that compiles
#: one collective per name (TensorFlow's eager ops carry none) compiles a bounded number. The control
#: sum carries the exact tag; two members can only meet on one name with different tags if the
#: protocol broke, and then ``RoundMismatchError`` names it.
NAME_SLOTS = 4 * MAX_SERVING

log = logging.getLogger("horovod_hetero")

#: ``allreduce(model, weight, control, group, name) -> (summed, summed_control)`` (``GroupExchange``).
GroupAllreduce = Callable[[Sequence[Tensor], float, list[float], tuple[int, ...], str],
                          tuple[list[Tensor], list[float]]]


@dataclass(frozen=True)
class GroupResult:
    """One group average as one rank sees it."""

    tag: int
    group: tuple[int, ...]
    summed: list[Tensor]   # sum of the members' weighted models (framework tensors)
    total_weight: float
    stale: bool            # this rank's fresh model was not in it (served from its published one,
                           # with the weight published: 0 after a join until it steps again)


class GroupExchange:
    """One rank's side of (wait-avoiding) group averaging.

    Args:
        rank: this rank.
        allreduce: ``allreduce(model, weight, control, group, name) -> (summed, summed_control)``,
            a blocking sum over the group's process set of ``weight * model`` and ``control``,
            callable from any thread.
        activations: an ``Activations``, or ``None`` for plain (waiting) group allreduces.
        patience: seconds the responder waits for this rank's own step before it contributes
            the stale model (0: at once, as the paper).
        timeout: seconds to wait for a group result.
        groups: the groups activations may name (rank lists; ``None``: any group with this rank).

    Attributes:
        served_stale: group averages served from the published model.
        dropped: activations dropped (over ``MAX_SERVING``, a group not in ``groups``, a failure).

    The main thread calls ``publish(model)`` after every group average and round (the model the
    next step starts from; weight 0 once the rank stopped stepping) and ``average(tag, group, fresh)``
    for every group average.
    """

    def __init__(self, rank: int, allreduce: GroupAllreduce, activations: Activations | None = None,
                 patience: float = 0.0, timeout: float = 300.0,
                 groups: Iterable[Sequence[int]] | None = None) -> None:
        self.rank = rank
        self._groups = None if groups is None else {tuple(g) for g in groups if rank in g}
        self._allreduce = allreduce
        self._activations = activations
        self.patience = patience
        self.timeout = timeout
        self._lock = threading.Condition()
        # (model, weight, collects) that the responder contributes
        self._snapshot: tuple[Sequence[Tensor], float, bool] | None = None
        self._main_tag = 0             # last tag the main thread reached
        # tag -> Future of the allreduce the responder ran
        self._served: dict[int, Future[tuple[list[Tensor], float]]] = {}
        self.served_stale = 0
        self.dropped = 0
        self._failures = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._serving: list[threading.Thread] = []     # responder threads that enqueued a group allreduce
        if activations is not None:
            self._thread = threading.Thread(target=self._respond, name="horovod_hetero-group-responder", daemon=True)
            self._thread.start()

    @property
    def serves(self) -> bool:
        """True if a responder contributes published models (wait-avoiding)."""
        return self._activations is not None

    def _run(self, tag: int, group: tuple[int, ...], model: Sequence[Tensor],
             weight: float) -> tuple[list[Tensor], float]:
        control = [weight, 1.0, float(exact_tag(tag, len(group)))]
        summed, ctl = self._allreduce(model, weight, control, group, f"horovod_hetero.group.{tag % NAME_SLOTS}")
        if round(ctl[1]) != len(group) or ctl[2] != control[2] * len(group):
            raise RoundMismatchError(f"group average {tag}: the members of {group} entered different "
                                     f"group averages (control sums {ctl}); every rank must step with the "
                                     f"same strategy")
        return summed, float(ctl[0])

    def publish(self, model: Sequence[Tensor], weight: float = 1.0, collects: bool | None = None) -> None:
        """The model this rank's responder contributes while its next step runs (weight 0: left).

        ``collects``: this rank's main thread may still reach the group averages served from it (and
        takes their results then); default ``weight > 0``. False: served at once and never recorded
        (a rank that waits in a join not every rank has reached); weight 0 and True: a rank between a
        join every rank reached and its next step."""
        with self._lock:
            self._snapshot = (model, weight, weight > 0 if collects is None else collects)
            self._lock.notify_all()

    def model_changed(self, change: ModelChanged) -> None:
        """The controller's ``model_changed`` event (a subscriber while this exchange serves): publish the model
        the next step starts from, with weight 1 while this rank steps and 0 once it left (a join); what it
        serves is collected by this rank's next group average unless it left and not every rank has joined
        yet (``publish``)."""
        if self.serves:
            self.publish(change.snapshot(), 0.0 if change.left else 1.0, collects=not change.left or change.all_joined)

    def average(self, tag: int, group: tuple[int, ...], fresh: Sequence[Tensor]) -> GroupResult:
        """Average ``fresh`` (this rank's model) within ``group``; a ``GroupResult``."""
        with self._lock:
            future = self._served.pop(tag, None)
            # tags only grow: what was served for an earlier tag is never collected (served just
            # before this rank joined, or skipped by the strategy after a join)
            for old in [t for t in self._served if t < tag]:
                del self._served[old]
            self._main_tag = tag
            self._lock.notify_all()
        if future is not None:
            try:
                summed, total = future.result(self.timeout)
            except FutureTimeout:       # the responder's allreduce is stuck (its own timeout may not have fired yet)
                raise timeout_error(f"group average {tag} over ranks {list(group)} (served from this rank's "
                                    f"published model)", self.timeout) from None
            return GroupResult(tag, group, summed, total, stale=True)
        if self._activations is not None:
            for peer in group:
                if peer != self.rank:
                    self._activations.send(peer, tag, group)
        summed, total = self._run(tag, group, fresh, 1.0)
        return GroupResult(tag, group, summed, total, stale=False)

    def _respond(self) -> None:
        assert self._activations is not None            # the responder runs only with activations
        while not self._closed:
            try:
                activation = self._activations.receive(0.1)
                if activation is not None:
                    self._start_serving(*activation)
            except Exception:                           # noqa: BLE001 - one bad activation never ends the responder
                self.dropped += 1
                self._failures += 1
                if self._failures == 1:                 # once: a flood must not flood the log
                    log.exception("group responder: an activation could not be handled; dropped (and "
                                  "any later ones, counted in GroupExchange.dropped)")

    def _start_serving(self, tag: int, group: tuple[int, ...]) -> None:
        """Serve ``tag`` in a thread of its own (a blocking allreduce never delays the next
        activation), unless it is not this rank's to serve or ``MAX_SERVING`` are running."""
        if self.rank not in group or (self._groups is not None and group not in self._groups):
            self.dropped += 1
            return
        with self._lock:
            if self._main_tag >= tag or tag in self._served:
                return                                  # run fresh by this rank, or served already
        self._serving = [t for t in self._serving if t.is_alive()]
        if len(self._serving) >= MAX_SERVING:
            self.dropped += 1
            return
        thread = threading.Thread(target=self._serve, args=(tag, group), name="horovod_hetero-group-serve",
                                  daemon=True)
        thread.start()
        self._serving.append(thread)

    def _serve(self, tag: int, group: tuple[int, ...]) -> None:
        with self._lock:
            begun = time.monotonic()
            while not (self._closed or self._main_tag >= tag or tag in self._served):
                if self._snapshot is None:      # nothing published yet: wait for this rank's step or join
                    limit = self.timeout
                elif self._snapshot[2]:         # its own step may come: wait ``patience`` for it
                    limit = self.patience
                else:                           # it waits in a join: it will not reach this tag
                    break
                remaining = limit - (time.monotonic() - begun)
                if remaining <= 0:
                    break
                self._lock.wait(remaining)
            if self._closed or self._main_tag >= tag or tag in self._served or self._snapshot is None:
                return          # the main thread does (or did) it fresh, or it is served already
            model, weight, collects = self._snapshot
            future: Future[tuple[list[Tensor], float]] = Future()
            if collects:        # weight 0 too: the main thread must not run this tag again (module doc)
                self._served[tag] = future
                self.served_stale += 1
        try:
            future.set_result(self._run(tag, group, model, weight))
        except BaseException as e:      # handed to the main thread when it collects this tag
            future.set_exception(e)

    def close(self) -> None:
        """Stop the responder; wait (bounded) for the group averages it is serving to finish.

        The sockets are closed once the responder has stopped polling them (a socket closed under a
        poll may be reused by the next one opened); a responder that does not stop within
        ``CLOSE_WAIT_S`` leaves them to exit."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()     # responders waiting for a snapshot or this rank's step
        if self._thread is not None:
            deadline = time.monotonic() + min(self.timeout, CLOSE_WAIT_S)
            for thread in [self._thread] + self._serving:
                thread.join(max(0.0, deadline - time.monotonic()))
            if not self._thread.is_alive():
                assert self._activations is not None    # the responder runs only with activations
                self._activations.close()
