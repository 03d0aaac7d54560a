"""A lost rank named (``RankLostError``) when synchronous training's gradient average fails inside
Keras' compiled step, and what every hh callback does when training begins."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from horovod_hetero.common import compat
from horovod_hetero.common.ranks import collective_failed, under_elastic
from horovod_hetero.keras._backend import value
from horovod_hetero.keras._optimizer import check_optimizer, step_collectives
from horovod_hetero.runtime.controller import rank_lost_error
from horovod_hetero.runtime.seams import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from horovod_hetero.common.horovod_collectives import HorovodCollectives


class GuardedTrainFunction:
    """``model.train_function`` whose failed gradient average raises ``RankLostError``.

    The average runs inside the step Keras compiles (TensorFlow) or traces (torch), past every
    callback: a lost rank comes out of ``fit`` as TensorFlow's ``UnknownError`` naming Horovod's
    shutdown, or torch's ``HorovodInternalError``. Whatever ``collective_failed`` recognises becomes
    the ``RankLostError`` the strategies' callbacks raise (``CollectiveTimeoutError`` stays one),
    naming the gradient allreduce, the step (the optimizer's ``iterations`` + 1; with
    ``steps_per_execution`` > 1 the first step of the failed execution) and the lost rank
    (``collectives.lost_ranks``); round 0, as for torch's ``Synchronous``: no model-averaging round
    runs. Other errors pass unchanged; attributes are the wrapped function's (TensorBoard reads them).
    Keras' ``fit`` re-raises it ``from None``: the original error is its ``__context__``.
    """

    def __init__(self, function: Callable[..., Any], model: Any, collectives: HorovodCollectives) -> None:
        self.__wrapped__, self._model, self._collectives = function, model, collectives
        self.restart()

    def restart(self) -> None:
        """Take the step count from the optimizer (a ``fit`` begins: it may have loaded a checkpoint)."""
        self._done = self._iterations()
        per_call: Any = getattr(self._model, "_steps_per_execution", None)  # Keras 2: a variable
        if per_call is None:
            per_call = getattr(self._model, "steps_per_execution", 1)
        self._single = int(value(per_call) if hasattr(per_call, "value") else per_call) == 1

    def _iterations(self) -> int:
        return int(value(self._model.optimizer.iterations))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            logs = self.__wrapped__(*args, **kwargs)
        except Exception as error:
            if not collective_failed(error):
                raise
            # the steps done before this call: in a compiled step the optimizer's iterations may
            # already count the failed one (its increment does not wait for the average)
            step = self._done + 1
            raise rank_lost_error(error, f"the gradient allreduce of step {step}", 0, step, self._collectives.rank,
                                  self._collectives.lost_ranks()) from error
        # one step per call: counted here, no read of a variable (a device sync) per step
        self._done = self._done + 1 if self._single else self._iterations()
        return logs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)


def guard_train_function(model: Any, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Wrap ``model.train_function`` in a ``GuardedTrainFunction`` if its optimizer averages inside
    the step (``step_collectives``), once per train function (later fits only ``restart`` it); first
    note where every rank runs (``know_peers``: an object allgather, so on every rank at the same
    point: ``on_train_begin``, which Keras 2 and 3 call after ``make_train_function``). Not under
    ``hvd.elastic`` (``HOROVOD_ELASTIC=1``), whose reset needs Horovod's error."""
    function = getattr(model, "train_function", None)
    if isinstance(function, GuardedTrainFunction):
        function.restart()
        return
    if function is None or under_elastic():
        return
    collectives = step_collectives(getattr(model, "optimizer", None), timeout)
    if collectives is not None:
        collectives.know_peers()
        compat.replace_train_function(model, GuardedTrainFunction(function, model, collectives))


def begin_training(model: Any, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """What every hh callback does when training begins: ``check_optimizer``, then
    ``guard_train_function`` (the first callback wraps, on every rank alike)."""
    check_optimizer(model)
    guard_train_function(model, timeout)

