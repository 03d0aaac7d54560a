"""Two toy strategies, one of each kind, each added to the library with one ``register`` line and nothing
else (docs/architecture.md, "Adding a strategy"): ``test_toy_strategies.py`` and
``test_toy_strategies_keras.py`` train them with the unchanged library, by name (``configured``)."""
from horovod_hetero.strategies import AVERAGE, CONTINUE, MEASURE, GradientAveraging, ModelAveraging
from horovod_hetero.strategies.registry import Registered, register


class EveryThird(ModelAveraging):
    """Local SGD at its simplest: every rank steps with its own gradients, and every third local step a
    round averages the models (one fused allreduce of the model and the round's statistics).

    Example:
        >>> s = EveryThird()
        >>> [s.after_step() for _ in range(3)]
        [CONTINUE, CONTINUE, AVERAGE]
    """

    def decide(self, report):
        return AVERAGE if self.step % 3 == 0 else CONTINUE


class MeasureEveryFourth(GradientAveraging):
    """Synchronous SGD (Horovod averages the gradients every step) whose every fourth step a round measures
    every rank's step time (the statistics alone travel; the models are identical anyway).

    Example:
        >>> s = MeasureEveryFourth()
        >>> [s.after_step() for _ in range(4)]
        [CONTINUE, CONTINUE, CONTINUE, MEASURE]
    """

    def decide(self, report):
        return MEASURE if self.step % 4 == 0 else CONTINUE


register(Registered("everythird", EveryThird))
register(Registered("measureeveryfourth", MeasureEveryFourth))
