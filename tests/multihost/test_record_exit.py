"""``record_exit.py``: the multi-host test reads every rank's exit status from it (no root needed here)."""
import os
import signal
import subprocess
import sys
import time

import pytest

RECORD_EXIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "record_exit.py")


def start(tmp_path, code):
    return subprocess.Popen([sys.executable, RECORD_EXIT, str(tmp_path), sys.executable, "-c", code],
                            env=dict(os.environ, HOROVOD_RANK="3"))


@pytest.mark.parametrize("code, status", [("raise SystemExit(3)", 3), ("pass", 0),
                                          ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9)])
def test_the_status_is_the_childs(tmp_path, code, status):
    proc = start(tmp_path, code)
    assert proc.wait(timeout=30) == (status if status >= 0 else 128 - status)
    assert (tmp_path / "status.rank3").read_text() == str(status)
    assert not (tmp_path / "sigterm.rank3").exists()


def test_sigterm_is_passed_on_and_noted(tmp_path):
    handler = ("import os, signal, sys, time\n"
               "signal.signal(signal.SIGTERM, lambda *a: os._exit(143))\n"
               "open(sys.argv[1] if len(sys.argv) > 1 else 'ready', 'w').close()\n"
               "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, RECORD_EXIT, str(tmp_path), sys.executable, "-c", handler,
                             str(tmp_path / "ready")], env=dict(os.environ, HOROVOD_RANK="0"))
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert (tmp_path / "status.rank0").read_text() == "143"
    assert (tmp_path / "sigterm.rank0").exists()
