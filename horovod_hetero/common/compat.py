"""The one place this package uses what Horovod and Keras do not publish, behind a version check.

Horovod's public API has no way to name a process set registered at ``hvd.init`` by its ranks, to
subclass its torch optimizer wrapper, or to recognise its Keras 2 optimizer; Keras has none to
average gradients inside a compiled step of a user's optimizer or to catch a failed step's error
before ``fit`` re-raises it. What this package needs of them is here, and nowhere else:

- ``hvd.mpi_ops._basics._get_process_set_ids_and_ranks``: the registered process sets by their ranks
  (WAGMA's groups);
- ``ProcessSet.process_set_id``, assigned: a ``ProcessSet`` object for a set registered at ``hvd.init``;
- ``horovod.torch.optimizer._DistributedOptimizer`` and ``_DistributedAdasumOptimizer``: the torch
  ``hh.DistributedOptimizer`` subclasses them, so Horovod's hooks, ``synchronize`` and helpers hold;
- Horovod's Keras 2 optimizer, recognised by its ``_allreduce_grads``, to name its failures;
- an optimizer's ``__class__``, assigned (Keras 3): the Keras ``hh.DistributedOptimizer`` keeps the
  user's instance;
- ``model.train_function``, replaced (Keras): a failed gradient average raises ``RankLostError``;
- ``horovod.torch.mpi_ops.mpi_lib.horovod_torch_join`` and ``_handle_map``: ``hvd.join`` as a handle to
  poll (``torch_join_async``), as Horovod's own ``join`` makes it before its busy wait.

Importing this module checks Horovod's version (``check_horovod_version``): the adapters
(``horovod_hetero.torch``, ``horovod_hetero.keras``) import it, so another Horovod fails at import
with a message that says what to do, rather than later inside a step.
"""
from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import horovod
from horovod_hetero.errors import troubleshooting

if TYPE_CHECKING:
    from horovod.common.process_sets import ProcessSet

_T = TypeVar("_T")

#: The Horovod releases (major.minor) whose private API this module was written against.
HOROVOD_VERSIONS = ("0.28",)
#: The release it is tested with.
HOROVOD_TESTED = "0.28.1"
#: Set to 1 to import with another Horovod anyway (at your own risk: the private API may have changed).
ENV_ANY_HOROVOD = "HOROVOD_HETERO_ANY_HOROVOD"


class HorovodVersionError(ImportError):
    """Horovod's version is not one ``HOROVOD_VERSIONS`` names, or its private API changed."""


def check_horovod_version(version: str | None = None) -> None:
    """Raise ``HorovodVersionError`` unless ``version`` (default: the installed Horovod's) is one of
    ``HOROVOD_VERSIONS`` or ``$HOROVOD_HETERO_ANY_HOROVOD`` is 1.

    Example:
        >>> check_horovod_version("0.28.1")
        >>> check_horovod_version("0.29.0")        # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        horovod_hetero.common.compat.HorovodVersionError: ... Horovod 0.29.0 may have changed: install horovod==0.28.1 ...
    """
    version = horovod.__version__ if version is None else version
    if ".".join(str(version).split(".")[:2]) in HOROVOD_VERSIONS or os.environ.get(ENV_ANY_HOROVOD) == "1":
        return
    raise HorovodVersionError(
        f"horovod_hetero uses private parts of Horovod {', '.join(HOROVOD_VERSIONS)}, which Horovod {version} may "
        f"have changed: install horovod=={HOROVOD_TESTED} (or set {ENV_ANY_HOROVOD}=1 to try anyway)\n"
        f"{troubleshooting('troubleshooting-horovod-version')}")


def _missing(what: str, error: BaseException) -> HorovodVersionError:
    return HorovodVersionError(f"Horovod {horovod.__version__} lacks {what}, which horovod_hetero uses "
                               f"(written for Horovod {', '.join(HOROVOD_VERSIONS)}): {error}\n"
                               f"{troubleshooting('troubleshooting-horovod-version')}")


check_horovod_version()


def registered_process_sets(hvd: Any) -> dict[int, list[int]]:
    """``{process_set_id: ranks}`` of every process set Horovod holds (``hvd``: ``horovod.torch`` or
    ``horovod.tensorflow``, initialised)."""
    try:
        table = hvd.mpi_ops._basics._get_process_set_ids_and_ranks
    except AttributeError as error:
        raise _missing("mpi_ops._basics._get_process_set_ids_and_ranks", error) from None
    return table()


def horovod_stopped(hvd: Any) -> bool:
    """True once Horovod's background loop has ended (a collective failed: Horovod shut itself down)
    while ``hvd.shutdown()`` has not run yet: the global process set is finalized, so Horovod reports
    it uninitialised though ``hvd.is_initialized()`` holds. A collective enqueued just as the loop
    ended is then never completed (Horovod 0.28 checks ``shut_down`` before it takes the tensor queue,
    which the loop has already emptied)."""
    try:
        lib = hvd.mpi_ops._basics.MPI_LIB_CTYPES
        error = hvd.mpi_ops._basics.HOROVOD_PROCESS_SET_ERROR_INIT
        ranks = lib.horovod_process_set_ranks
    except AttributeError as e:
        raise _missing("mpi_ops._basics.MPI_LIB_CTYPES.horovod_process_set_ranks", e) from None
    if not hvd.is_initialized():
        return False
    buffer = (ctypes.c_int * max(1, hvd.size()))()
    return int(ranks(ctypes.c_int(0), buffer)) == error


def registered_process_set(ranks: Iterable[int], set_id: int) -> ProcessSet:
    """A ``ProcessSet`` of ``ranks`` bound to the set Horovod registered as ``set_id`` (as ``hvd.init``
    binds the objects it is given; one built after init is otherwise never bound)."""
    from horovod.common.process_sets import ProcessSet
    process_set = ProcessSet(list(ranks))
    process_set.process_set_id = set_id
    return process_set


def torch_join_async(device: int = -1) -> int:
    """``hvd.join(device)`` of ``horovod.torch`` as a handle for ``hvd.poll``/``hvd.synchronize`` (which
    returns the last rank to join, a one-element int tensor), made as Horovod's ``join`` makes it.

    Horovod's ``join`` then waits in ``synchronize``, a loop of ``sched_yield`` calls that takes the
    GIL back each turn: a rank waiting there for long (the first to join) keeps its core busy."""
    import torch
    from horovod.common.exceptions import HorovodInternalError
    try:
        from horovod.torch.mpi_ops import _handle_map, mpi_lib
        enqueue = mpi_lib.horovod_torch_join
    except (ImportError, AttributeError) as error:
        raise _missing("horovod.torch.mpi_ops.mpi_lib.horovod_torch_join", error) from None
    output = torch.tensor(-1, dtype=torch.int)
    try:
        handle: int = enqueue(output, device)
    except RuntimeError as error:
        raise HorovodInternalError(error) from error
    _handle_map[handle] = (None, output)
    return handle


def torch_optimizer_bases() -> tuple[type, type]:
    """``(_DistributedOptimizer, _DistributedAdasumOptimizer)``: Horovod's torch optimizer wrappers,
    which ``hh.DistributedOptimizer`` subclasses (the hooks, ``synchronize``, ``skip_synchronize``)."""
    try:
        from horovod.torch.optimizer import _DistributedAdasumOptimizer, _DistributedOptimizer
    except ImportError as error:
        raise _missing("horovod.torch.optimizer._DistributedOptimizer", error) from None
    return _DistributedOptimizer, _DistributedAdasumOptimizer


def horovod_optimizer_module() -> str:
    """The module ``hvd.broadcast_optimizer_state`` takes for one of Horovod's own optimizer wrappers (it then
    makes missing state with ``super(type(opt), opt).step()``, the wrapped optimizer's own step, instead of
    ``opt.step()``, which would be a collective and a counted step)."""
    try:
        from horovod.torch.optimizer import DistributedOptimizer
    except ImportError as error:
        raise _missing("horovod.torch.optimizer.DistributedOptimizer", error) from None
    return DistributedOptimizer.__module__


def is_horovod_keras2_optimizer(optimizer: object) -> bool:
    """True for an optimizer Horovod's Keras 2 ``hvd.DistributedOptimizer`` built (it averages in
    ``_allreduce_grads``, over ``optimizer.process_set``)."""
    return getattr(optimizer, "_allreduce_grads", None) is not None


def subclass_in_place(instance: _T, namespace: Mapping[str, Any]) -> _T:
    """Make ``instance`` an instance of a new subclass of its class holding ``namespace`` (its name,
    module, qualified name and docstring are the class's own, so ``isinstance`` holds and a saved
    Keras model reloads with the plain class); the instance's state is kept. Returns it."""
    base = type(instance)
    instance.__class__ = type(base.__name__, (base,), {
        **namespace, "__module__": base.__module__, "__qualname__": base.__qualname__, "__doc__": base.__doc__})
    return instance


def replace_train_function(model: Any, function: Callable[..., Any]) -> None:
    """Set ``model.train_function`` (the step ``fit`` calls; Keras 2 and 3 make it before
    ``on_train_begin`` and keep it while the model is unchanged) to ``function``."""
    model.train_function = function
