"""The bench's data: splits (iid, class-skewed, Dirichlet, plays), the fetched datasets and their set-up."""
import importlib.util
import pathlib
import subprocess

import numpy as np
import pytest

from horovod_hetero_lab import data
from horovod_hetero_lab.data import (
    TASKS, available, check_split, class_shares, dirichlet_shard, plays_of, split_indices, task_data)

ROOT = pathlib.Path(__file__).resolve().parents[2]
FASHION = pytest.mark.skipif(available("fashion-cnn") is not None, reason=str(available("fashion-cnn")))
SHAKESPEARE = pytest.mark.skipif(available("shakespeare-char") is not None, reason=str(available("shakespeare-char")))


@pytest.mark.parametrize("split", ["iid", "skew", "dirichlet:0.1", "dirichlet:0.5"])
def test_every_split_covers_every_sample_once(split):
    labels = np.arange(5000) % 10
    shards = [split_indices(split, labels, r, 4, seed=3) for r in range(4)]
    assert sorted(np.concatenate(shards).tolist()) == list(range(5000))
    assert [split_indices(split, labels, r, 4, seed=3).tolist() for r in range(4)] == [s.tolist() for s in shards]


def test_dirichlet_small_alpha_concentrates_classes_and_large_alpha_mixes_them():
    labels = np.arange(20000) % 10

    def top_share(alpha):          # the share of each class its largest holder has, averaged
        counts = np.array([np.bincount(labels[dirichlet_shard(labels, r, 4, alpha)], minlength=10) for r in range(4)])
        return float((counts.max(axis=0) / counts.sum(axis=0)).mean())

    assert top_share(0.1) > 0.8 and top_share(100.0) < 0.35


def test_class_shares_name_the_skewed_classes_of_each_rank():
    shares = class_shares("digits-noniid", 4)
    np.testing.assert_allclose(shares.sum(axis=0), 1.0)
    assert [np.flatnonzero(shares[r] >= 0.5).tolist() for r in range(4)] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    assert not (class_shares("digits", 4, split="iid") >= 0.5).any()
    assert class_shares("synthetic", 4) is None


def test_plays_are_dealt_largest_first_to_the_lightest_worker():
    sizes = [("a", 9), ("b", 7), ("c", 5), ("d", 4), ("e", 2)]
    assert [plays_of(r, 2, sizes) for r in range(2)] == [["a", "d"], ["b", "c", "e"]]
    assert sorted(sum((plays_of(r, 3, sizes) for r in range(3)), [])) == ["a", "b", "c", "d", "e"]


@pytest.mark.parametrize("split, task, message", [
    ("median", "fashion-cnn", "--split must be one of iid, skew, dirichlet:ALPHA, plays"),
    ("dirichlet:-1", "fashion-cnn", "dirichlet:ALPHA needs ALPHA > 0"),
    ("dirichlet:x", "fashion-cnn", "dirichlet:ALPHA needs ALPHA > 0"),
    ("dirichlet:inf", "fashion-cnn", "dirichlet:ALPHA needs ALPHA > 0"),
    ("skew", "shakespeare-char", "shakespeare-char is text: use iid or plays"),
    ("plays", "digits", "plays is the text task's"),
    ("skew", "synthetic", "no classes to split by"),
])
def test_bad_splits_are_named(split, task, message):
    with pytest.raises(ValueError, match=message):
        check_split(split, task)


def test_a_task_whose_data_are_missing_is_named_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HOROVOD_HETERO_DATA", str(tmp_path))
    assert "task fashion-cnn needs fashion-mnist in" in available("fashion-cnn")
    assert available("digits") is None
    with pytest.raises(ValueError, match=r"--task: task shakespeare-char needs shakespeare in .*tools/fetch_data.py"):
        data.check_available("shakespeare-char")


@FASHION
def test_fashion_mnist_shards_and_test_set():
    x, y, xt, yt = task_data("fashion-cnn", 3, 4, split="skew")
    assert x.shape[1:] == (1, 28, 28) and x.dtype == np.float32 and xt.shape == (10000, 1, 28, 28)
    assert abs(float(x.mean())) < 0.2 and np.isin(y, [3, 7]).mean() > 0.8
    total = sum(len(task_data("fashion-cnn", r, 4, split="dirichlet:0.1")[1]) for r in range(4))
    assert total == 60000 and np.bincount(yt).tolist() == [1000] * 10


@SHAKESPEARE
def test_shakespeare_windows_plays_and_held_out_ends():
    texts, alphabet = data.shakespeare()
    assert len(texts) == 42 and 70 < len(alphabet) < 100
    x, y, xv, yv = task_data("shakespeare-char", 0, 4, split="plays")
    assert x.shape[1] == data.TEXT_WINDOW and (x[:, 1:] == y[:, :-1]).all() and xv.shape == (data.TEXT_VALIDATION, 32)
    shares = [len(task_data("shakespeare-char", r, 4, split=s)[0]) for s in ("plays", "iid") for r in range(4)]
    assert max(shares[:4]) / min(shares[:4]) < 1.1 and max(shares[4:]) - min(shares[4:]) <= 1


# -- tools/fetch_data.py (no network: the fetches are made to fail) --

def fetch_tool():
    spec = importlib.util.spec_from_file_location("fetch_data", ROOT / "tools" / "fetch_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_set_up_says_in_one_line_what_it_could_not_fetch(tmp_path, monkeypatch, capsys):
    tool = fetch_tool()
    monkeypatch.setenv("HOROVOD_HETERO_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(tool.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 100, "", "E: no network"))

    def offline(*args, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(tool.urllib.request, "urlopen", offline)
    assert tool.main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["[data] Fashion-MNIST: not fetched (E: no network); the fashion-cnn tasks are skipped",
                     "[data] Shakespeare: not fetched (OSError: network unreachable); the shakespeare-char tasks are skipped"]
    assert not (tmp_path / "data" / "fashion-mnist").exists()


@FASHION
@SHAKESPEARE
def test_datasets_in_place_are_checked_and_not_fetched_again(monkeypatch, capsys):
    tool = fetch_tool()
    monkeypatch.setenv("HOROVOD_HETERO_DATA", str(data.data_dir()))
    monkeypatch.setattr(tool.subprocess, "run", None)               # any fetch would fail loudly
    monkeypatch.setattr(tool.urllib.request, "urlopen", None)
    assert tool.main() == 0
    assert [line.split(" (")[0] for line in capsys.readouterr().out.splitlines()] == [
        "[data] Fashion-MNIST: in place", "[data] Shakespeare: in place"]


def test_tasks_name_their_dataset_and_defaults():
    assert {t.dataset for t in TASKS.values()} == {"digits", "synthetic", "fashion-mnist", "shakespeare"}
    assert TASKS["fashion-cnn"].target is None and TASKS["shakespeare-char"].optimizer == "adam"
    assert TASKS["digits-noniid"].split == "skew" and TASKS["fashion-cnn"].classes == 10
