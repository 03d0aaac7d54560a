"""Stand-in for Keras' MNIST download (Keras 3's and Keras 2's ``datasets.mnist.load_data``): Fashion-MNIST
from the set-up's copy, the same arrays' shapes and dtypes (uint8 images (N, 28, 28), uint8 labels);
``HH_EXAMPLE_TRAIN_SAMPLES`` keeps the first N training images. Put on ``PYTHONPATH`` by
``horovod-hetero benchmark scripts``; it patches the module when a script imports it (nothing is imported here)."""
import importlib.abc
import importlib.machinery
import os
import sys

MODULES = {"keras.src.datasets.mnist", "tf_keras.src.datasets.mnist"}


def load_data(path="mnist.npz"):
    from horovod_hetero_lab.data import fashion_mnist

    x, y, x_test, y_test = fashion_mnist()
    keep = int(os.environ.get("HH_EXAMPLE_TRAIN_SAMPLES", len(x)))
    return (x[:keep], y[:keep].astype("uint8")), (x_test, y_test.astype("uint8"))


class _Patch(importlib.abc.MetaPathFinder):
    """Finds the MNIST modules as usual and replaces their ``load_data`` once they have run."""

    def find_spec(self, name, path, target=None):
        if name not in MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.load_data = load_data

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Patch())
