"""Small bundled datasets for examples, the demo, tests and the bench's tasks (``TASKS``; nothing is downloaded)."""
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Task:
    """A benchmark task: its data, model family, loss and quality measure.

    Args:
        name: the ``--task`` name.
        description: one line for tables.
        model: ``"mlp"``, ``"cnn"`` (8x8 images) or ``"linear"`` (one output, no bias).
        loss: ``"cross_entropy"`` (10 classes) or ``"mse"``.
        metric: the quality's name (``"accuracy"`` or ``"distance"``).
        higher_is_better: True for accuracy, False for a distance.
        target: the default quality to reach (``horovod-hetero bench --target``).
        noniid: True if each worker's shard holds mostly a few classes (``skew``).
    """

    name: str
    description: str
    model: str
    loss: str
    metric: str
    higher_is_better: bool
    target: float
    noniid: bool = False

    def reached(self, value, target=None):
        """True if quality ``value`` reaches ``target`` (default: this task's).

        Example:
            >>> TASKS["synthetic"].reached(0.01), TASKS["digits"].reached(0.5)
            (True, False)
        """
        target = self.target if target is None else target
        return value >= target if self.higher_is_better else value <= target


TASKS = {t.name: t for t in [
    Task("digits", "digits MLP, iid shards", "mlp", "cross_entropy", "accuracy", True, 0.95),
    Task("digits-noniid", "digits MLP, non-iid shards", "mlp", "cross_entropy", "accuracy", True, 0.95, noniid=True),
    Task("cnn", "digits small CNN, iid shards", "cnn", "cross_entropy", "accuracy", True, 0.95),
    Task("synthetic", "least squares, distance to the known optimum", "linear", "mse", "distance", False, 0.05),
]}


def check_task(name, arg="task"):
    """The ``Task`` called ``name``; a ``ValueError`` naming ``arg`` and the choices otherwise."""
    if name not in TASKS:
        raise ValueError(f"{arg} must be one of {', '.join(TASKS)}, got {name!r}")
    return TASKS[name]


def noniid_shard(labels, rank, size, skew=0.8, seed=0):
    """Indices of this rank's non-iid share of ``labels``: a sample of class c goes to rank
    ``c % size`` with probability ``skew``, otherwise to a rank drawn uniformly (the same draw on
    every rank, so shards are disjoint and cover every sample). As the ESync paper's non-iid
    experiment, each worker sees mostly a few classes: ``ceil(C/size)`` or ``floor(C/size)`` of the
    C classes (with 10 classes and 4 workers, 3,3,2,2; with 8 workers, 2,2,1,...). More workers
    than classes: a ``ValueError``.

    Example:
        >>> labels = np.arange(1000) % 10
        >>> shard = noniid_shard(labels, rank=1, size=4, skew=0.8)
        >>> sorted(set(labels[shard].tolist()) & {1, 5, 9}), round(float(np.isin(labels[shard], [1, 5, 9]).mean()), 1)
        ([1, 5, 9], 0.9)
    """
    classes = len(np.unique(labels))
    if size > classes:
        raise ValueError(f"the non-iid split needs at most one worker per class ({classes} classes), got {size} "
                         f"workers: a worker past the last class would get only the scattered {1 - skew:.0%}")
    rng = np.random.default_rng(seed + 1)
    home = np.asarray(labels) % size
    anywhere = rng.integers(0, size, len(home))
    owner = np.where(rng.random(len(home)) < skew, home, anywhere)
    return np.flatnonzero(owner == rank)


def least_squares(rank=0, size=1, seed=0, features=16, n_train=2048, n_test=512, noise=0.1):
    """A least-squares problem with a known optimum: this rank's strided training shard, and the test
    inputs with the optimum's outputs (``w*`` solves the full training set's least squares exactly).

    Example:
        >>> x, y, xt, yt = least_squares(0, 2)
        >>> x.shape, xt.shape, yt.dtype.name
        ((1024, 16), (512, 16), 'float32')
    """
    rng = np.random.default_rng(seed + 7)
    w_true = rng.standard_normal(features)
    x = rng.standard_normal((n_train, features))
    y = x @ w_true + noise * rng.standard_normal(n_train)
    w_opt = np.linalg.lstsq(x, y, rcond=None)[0]
    xt = rng.standard_normal((n_test, features))
    f32 = np.float32
    return x[rank::size].astype(f32), y[rank::size].astype(f32), xt.astype(f32), (xt @ w_opt).astype(f32)


def task_data(task, rank=0, size=1, seed=0, skew=0.8):
    """``(x_train, y_train, x_test, y_test)`` of ``task`` (a name or ``Task``) for this rank.

    Example:
        >>> x, y, xt, yt = task_data("digits-noniid", rank=0, size=4)
        >>> x.shape[1], len(yt)
        (64, 359)
    """
    task = check_task(task) if isinstance(task, str) else task
    if task.model == "linear":
        return least_squares(rank, size, seed)
    if not task.noniid:
        return digits(rank, size, seed=seed)
    x, y, xt, yt = digits(0, 1, seed=seed)
    shard = noniid_shard(y, rank, size, skew, seed)
    return x[shard], y[shard], xt, yt


def score(task, outputs, y_test):
    """The quality of ``outputs`` (model outputs on the test inputs, an array) for ``task``: test
    accuracy (argmax), or the relative distance ``|f - f*| / |f*|`` to the optimum's test outputs
    (for a linear model on isotropic inputs, about ``|w - w*| / |w*|``).

    Example:
        >>> score(TASKS["digits"], np.eye(10)[[1, 2, 3]], np.array([1, 2, 0]))
        0.6666666666666666
    """
    outputs = np.asarray(outputs)
    if task.metric == "accuracy":
        return float((outputs.argmax(axis=1) == np.asarray(y_test)).mean())
    y_test = np.asarray(y_test, dtype=float)
    return float(np.linalg.norm(outputs.reshape(-1) - y_test) / np.linalg.norm(y_test))
