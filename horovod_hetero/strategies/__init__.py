"""Synchronisation strategies, one module each, on one contract (``base``).

| module | strategy | paper |
| --- | --- | --- |
| ``synchronous`` | ``Synchronous``: gradients averaged every step (``hvd.DistributedOptimizer``) | baseline |
| ``local_sgd`` | ``LocalSGD``: model averaged every ``period`` steps | Lin et al. |
| ``esync`` | ``ESync``: local steps sized by a state server, delta averaging | ESync |
| ``wagma`` | ``WAGMA``: wait-avoiding butterfly group averaging, global every tau | WAGMA-SGD |
| ``elastic_bsp`` | ``ElasticBSP``: ZipLine plans each round's local steps (least waiting) | ElasticBSP |
| ``dssp`` | ``DSSP``: local steps within a staleness bound picked each round | DSSP |
| ``adsp`` | ``ADSP``: every rank commits at one searched rate, fast ranks step more in between | ADSP |
| ``balanced`` | ``Balanced``: synchronous SGD, each rank's batch sized to its speed | LB-BSP, Cannikin |

``registry`` is the one list of them the tools derive theirs from (name -> class, the arguments the
tools build it with); this package exports every class it holds by name, a class registered after this
package was imported included (``registry.register``). ``aggregation`` holds how global rounds combine the models, given beside
any model-averaging strategy (``aggregate=Normalized(outer=OuterSGD(...))``). Every strategy is one of two kinds (``base``):
``ModelAveraging`` (all but two) or ``GradientAveraging`` (``Synchronous``; ``Balanced`` is a ``GradientWeighting``). ``periodic`` holds ``Periodic``, the schedule of LocalSGD's rounds and WAGMA's global averages. ``planned`` holds ``RoundPlanned``, the base of the strategies that plan every round from the
speeds the previous round carried.

Adding one: see docs/architecture.md ("Adding a strategy").
"""
from typing import TYPE_CHECKING, Any

from horovod_hetero.strategies.base import (  # noqa: F401
    AVERAGE, CONTINUE, MEASURE, MEASURE_OVERLAPPED, Context, Decision, GradientAveraging, GradientWeighting, GroupAverage, ModelAveraging,
    Plan, RoundResult, RoundStats, StepReport, Strategy, check_decision)
from horovod_hetero.strategies.adsp import Steps  # noqa: F401
from horovod_hetero.strategies.aggregation import AGGREGATES, Aggregation, Mean, Normalized, OuterSGD  # noqa: F401
from horovod_hetero.strategies.planned import RoundPlanned  # noqa: F401
from horovod_hetero.strategies.registry import REGISTRY, check_strategy, classes

if TYPE_CHECKING:   # for type checkers; at run time every registered class comes from the registry (below)
    from horovod_hetero.strategies.adsp import ADSP  # noqa: F401
    from horovod_hetero.strategies.balanced import Balanced  # noqa: F401
    from horovod_hetero.strategies.dssp import DSSP  # noqa: F401
    from horovod_hetero.strategies.elastic_bsp import ElasticBSP  # noqa: F401
    from horovod_hetero.strategies.esync import ESync  # noqa: F401
    from horovod_hetero.strategies.local_sgd import LocalSGD  # noqa: F401
    from horovod_hetero.strategies.synchronous import Synchronous  # noqa: F401
    from horovod_hetero.strategies.wagma import WAGMA  # noqa: F401


def __getattr__(name: str) -> Any:
    """Every registered strategy class by its name (``registry.classes``), looked up when it is read (PEP 562)."""
    try:
        return classes()[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(classes()))
