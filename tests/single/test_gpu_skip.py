"""``make test-gpu`` where there is no GPU (CI): one line that says so, and success (issue 29)."""
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: make test-gpu runs for real")
def test_make_test_gpu_skips_in_one_line_without_a_gpu():
    done = subprocess.run(["bash", str(ROOT / "tools" / "test_gpu.sh")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={"PY": sys.executable, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "test-gpu: skipped, no CUDA GPU here (torch.cuda.is_available() is False)\n"
