"""Small bundled datasets for examples, the demo and tests (nothing is downloaded)."""
import numpy as np


def digits(rank=0, size=1, test_fraction=0.2, seed=0, shard_sizes=None):
    """Scikit-learn's bundled 8x8 digits, standardised, split, and this rank's training shard.

    Args:
        rank, size: this worker's shard of the training set (strided, so shards are disjoint).
        test_fraction: held-out share, the same on every rank.
        seed: the shuffle seed (must be the same on every rank).
        shard_sizes: optional per-rank number of training samples (to give ranks unequal data).

    Returns:
        ``(x_train, y_train, x_test, y_test)``: float32 features (64), int64 labels (10 classes).

    Example:
        >>> x, y, xt, yt = digits(rank=0, size=4)
        >>> x.shape[1], int(y.max())
        (64, 9)
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    x = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-6)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = order[:n_test], order[n_test:]
    shard = train[rank::size]
    if shard_sizes is not None:
        shard = shard[: shard_sizes[rank]]
    return x[shard], y[shard], x[test], y[test]
