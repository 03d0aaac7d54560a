"""The Keras callbacks under Horovod's module name (``horovod_hetero.keras.callbacks``)."""
from horovod_hetero.keras.callbacks import (  # noqa: F401
    ADSPCallback, BroadcastGlobalVariablesCallback, DSSPCallback, ElasticBSPCallback, ESyncCallback, HeteroSyncCallback, LearningRateWarmupCallback, LocalSGDCallback,
    MetricAverageCallback, WAGMACallback)
