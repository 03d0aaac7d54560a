"""The lab beside horovod-hetero: ``horovod-hetero bench``, ``report`` and ``demo``, the bench's datasets
(``data``) and what the checkout's example scripts share (``harness``).

The library (``horovod_hetero``) imports nothing from here. This package is installed from a checkout
(``pip install -e lab``; ``make`` does it), where it finds the example scripts it runs
(``examples/`` at the checkout's top level), and adds its commands to ``horovod-hetero`` through the
``horovod_hetero.commands`` entry point group.
"""
import pathlib

#: the checkout's example scripts, which ``bench`` and ``demo`` launch under ``horovodrun``
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> pathlib.Path:
    """The path of the checkout's ``examples/<name>.py``; FileNotFoundError, saying how to install, without one."""
    path = EXAMPLES / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: bench and demo run the example scripts of a horovod-hetero "
                                f"checkout; install this package from one (pip install -e lab, as make does)")
    return path
