"""``model_changed``: the event a rank's controller emits whenever the model its next step starts from changes,
or its part in training does (it joined, or steps again). A wait-avoiding group exchange subscribes to it
(``runtime.group_exchange.GroupExchange.model_changed``): its responder serves that model to peers that average
with this rank while it computes. The controller emits without knowing who listens."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from horovod_hetero.runtime.seams import Tensor


@dataclass(frozen=True)
class ModelChanged:
    """What changed, as the controller sees it.

    Attributes:
        snapshot: ``snapshot()`` copies the model as it is now (taken between steps: a lazy read later
            could see a model halfway through its update).
        left: this rank stopped stepping (it joined the others' rounds: ``sync_model()``).
        all_joined: every rank has joined since this rank left (what it serves from now on is collected
            by its next step).
    """

    snapshot: Callable[[], list[Tensor]]
    left: bool
    all_joined: bool


class ModelEvents:
    """The subscribers of ``model_changed`` and the one call that tells them all.

    Example:
        >>> events, seen = ModelEvents(), []
        >>> unsubscribe = events.subscribe(lambda change: seen.append(change.left))
        >>> events.emit(ModelChanged(list, left=True, all_joined=False)); unsubscribe()
        >>> events.emit(ModelChanged(list, left=False, all_joined=True)); seen
        [True]
    """

    def __init__(self) -> None:
        self._subscribers: list[Callable[[ModelChanged], None]] = []

    def subscribe(self, subscriber: Callable[[ModelChanged], None]) -> Callable[[], None]:
        """Call ``subscriber(change)`` at every change; returns the call that unsubscribes it."""
        self._subscribers.append(subscriber)
        return lambda: self._subscribers.remove(subscriber) if subscriber in self._subscribers else None

    def emit(self, change: ModelChanged) -> None:
        for subscriber in list(self._subscribers):
            subscriber(change)
