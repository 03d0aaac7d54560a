"""horovod-hetero: heterogeneity-aware synchronisation strategies for Horovod.

``import horovod_hetero.torch as hh`` (PyTorch) or ``import horovod_hetero.tensorflow.keras as hh``
(Keras) reads like the Horovod module it extends.
"""
__version__ = "0.2.0"
