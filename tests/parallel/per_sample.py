"""A simulated worker whose step grows with its batch, for Balanced's tests: ``pad`` sleeps
``seconds_per_sample * batch * factor`` minus what the step took (these tests' models take microseconds a
sample, so their own compute is noise that no line fits; the sleep is a step time that Balanced can
equalise, the slow rank ``factor`` times slower per sample)."""
from horovod_hetero.runtime.straggler import Slowdown


class PerSampleSlowdown(Slowdown):
    """``Slowdown`` whose step takes ``seconds_per_sample`` a sample times this rank's factor; set
    ``batch`` before each step (torch) or fit (Keras)."""

    def __init__(self, rank, factors, seconds_per_sample=0.002):
        super().__init__(rank, factors)
        self.seconds_per_sample, self.batch = seconds_per_sample, 1

    def pad(self, measured_s, step=0):
        extra = max(0.0, self.factor * self.seconds_per_sample * self.batch - measured_s)
        self._sleep(extra)
        return extra
