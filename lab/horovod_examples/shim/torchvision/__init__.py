"""A stand-in for torchvision in Horovod's example scripts (``lab/horovod_examples/README.md``)."""
from . import datasets, transforms  # noqa: F401
