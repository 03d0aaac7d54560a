"""One seam to Horovod's private API (common/compat.py): the only module that uses it, behind a version check."""
import pathlib
import re
import subprocess
import sys

import pytest

from horovod_hetero.common import compat

PACKAGE = pathlib.Path(compat.__file__).resolve().parents[1]
#: What Horovod and Keras do not publish, as it appears in source that uses it.
PRIVATE = re.compile(r"\._basics\b|\bprocess_set_id\s*=|\b_DistributedOptimizer\b|\b_DistributedAdasumOptimizer\b|"
                     r"\b_allreduce_grads\b|\.__class__\s*=[^=]|\.train_function\s*=[^=]")


def test_only_the_compat_module_uses_private_api():
    users = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                   if PRIVATE.search(p.read_text()) and p != pathlib.Path(compat.__file__).resolve())
    assert users == ["torch/optimizer.py"], users
    # the torch optimizer names the classes compat hands it, and only as such
    text = (PACKAGE / "torch" / "optimizer.py").read_text()
    assert "from horovod.torch.optimizer import" not in text
    assert "_DistributedOptimizer, _DistributedAdasumOptimizer = torch_optimizer_bases()" in text


def test_another_horovod_fails_at_import_saying_what_to_install(monkeypatch):
    compat.check_horovod_version("0.28.0")
    with pytest.raises(compat.HorovodVersionError, match=r"Horovod 0\.29\.0 may have changed: install "
                                                         r"horovod==0\.28\.1 \(or set HOROVOD_HETERO_ANY_HOROVOD=1"):
        compat.check_horovod_version("0.29.0")
    monkeypatch.setenv(compat.ENV_ANY_HOROVOD, "1")
    compat.check_horovod_version("0.29.0")
    code = "import horovod; horovod.__version__ = '0.27.0'\nimport horovod_hetero.torch"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in __import__("os").environ.items() if k != compat.ENV_ANY_HOROVOD})
    assert done.returncode == 1 and "HorovodVersionError" in done.stderr and "Horovod 0.27.0" in done.stderr, done.stderr


def test_a_changed_private_api_is_named():
    class Hvd:          # a Horovod whose mpi_ops lacks _basics
        class mpi_ops:
            pass
    with pytest.raises(compat.HorovodVersionError, match=r"lacks mpi_ops\._basics\._get_process_set_ids_and_ranks"):
        compat.registered_process_sets(Hvd)


def test_a_registered_process_set_is_bound_to_its_id():
    ps = compat.registered_process_set((1, 3), 7)
    assert ps.ranks == [1, 3] and ps.process_set_id == 7


def test_an_instance_gets_a_subclass_in_place_that_keeps_its_name_and_state():
    class Optimizer:
        """doc"""

        def apply(self):
            return "plain"

    opt = Optimizer()
    opt.state = 5
    same = compat.subclass_in_place(opt, {"apply": lambda self: "averaged", "_hh": True})
    assert same is opt and opt.apply() == "averaged" and opt.state == 5 and isinstance(opt, Optimizer)
    assert type(opt) is not Optimizer and (type(opt).__name__, type(opt).__qualname__, type(opt).__doc__,
                                           type(opt).__module__) == (Optimizer.__name__, Optimizer.__qualname__,
                                                                     "doc", Optimizer.__module__)
