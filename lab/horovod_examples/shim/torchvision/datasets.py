"""``datasets.MNIST`` of the stand-in: Fashion-MNIST from the set-up's copy, as standardised float tensors
(1, 28, 28) and int64 labels; ``HH_EXAMPLE_TRAIN_SAMPLES`` keeps the first N training images."""
import os

import torch

from horovod_hetero_lab.data import _standardise, fashion_mnist


class MNIST(torch.utils.data.TensorDataset):
    def __init__(self, root, train=True, download=False, transform=None):
        x, y, x_test, y_test = fashion_mnist()
        if train:
            keep = int(os.environ.get("HH_EXAMPLE_TRAIN_SAMPLES", len(x)))
            x, y = x[:keep], y[:keep]
        else:
            x, y = x_test, y_test
        super().__init__(torch.from_numpy(_standardise(x)), torch.from_numpy(y))
