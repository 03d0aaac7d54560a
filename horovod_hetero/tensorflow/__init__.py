"""Horovod's module name for the Keras adapter: ``horovod_hetero.tensorflow.keras`` is ``horovod_hetero.keras``."""
