"""``make bench-scripts`` runs Horovod's own example with the README's change and nothing else: the
change applies to the vendored script, and the changed script differs from Horovod's in those lines."""
import difflib
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import scripts  # noqa: E402


def test_the_readme_change_is_the_whole_diff():
    original = open(scripts.EXAMPLE).read()
    changed = scripts.readme_change(original, "hh.ESync()")
    compile(changed, "pytorch_mnist.py", "exec")
    diff = [line for line in difflib.unified_diff(original.splitlines(), changed.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert diff == [
        "+import horovod_hetero.torch as hh",
        "+        optimizer.sync_model()",
        "+        optimizer.sync_model()",
        "-    train_sampler = torch.utils.data.distributed.DistributedSampler(",
        "+    train_sampler = hh.DistributedSampler(",
        "-    optimizer = hvd.DistributedOptimizer(optimizer,",
        "+    optimizer = hh.DistributedOptimizer(optimizer,",
        "+                                         named_buffers=model.named_buffers(), strategy=hh.ESync(),",
    ]


def test_an_example_that_moved_on_is_named():
    with pytest.raises(ValueError, match="the example no longer has exactly one 'import horovod.torch as hvd'"):
        scripts.readme_change("import torch\n", "hh.ESync()")
