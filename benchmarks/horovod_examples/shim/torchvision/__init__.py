"""A stand-in for torchvision in Horovod's example scripts (``benchmarks/horovod_examples/README.md``)."""
from . import datasets, transforms  # noqa: F401
