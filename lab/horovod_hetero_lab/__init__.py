"""The lab beside horovod-hetero: ``horovod-hetero bench``, ``report``, ``demo`` and ``benchmark``, the bench's
datasets (``data``), what the checkout's example scripts share (``harness``) and the other benchmarks
(``benchmarks``, run with ``horovod-hetero benchmark NAME``).

The library (``horovod_hetero``) imports nothing from here. This package is installed from a checkout
(``pip install -e lab``; ``make`` does it), where it finds the example scripts it runs
(``examples/`` at the checkout's top level), and adds its commands to ``horovod-hetero`` through the
``horovod_hetero.commands`` entry point group.
"""
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
#: the checkout's example scripts, which ``bench`` and ``demo`` launch under ``horovodrun``
EXAMPLES = HERE.parents[1] / "examples"
#: where Horovod's own example scripts and their shim may be, first found first: inside the package (a
#: wheel of the lab carries them there) and beside it (``lab/horovod_examples/`` of a checkout)
HOROVOD_EXAMPLES = (HERE / "horovod_examples", HERE.parent / "horovod_examples")


def example(name: str) -> pathlib.Path:
    """The path of the checkout's ``examples/<name>.py``; FileNotFoundError, saying how to install, without one."""
    path = EXAMPLES / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: bench and demo run the example scripts of a horovod-hetero "
                                f"checkout; install this package from one (pip install -e lab, as make does)")
    return path


def horovod_example(name: str) -> pathlib.Path:
    """The path of ``name`` among Horovod's own example scripts, kept unchanged as data files of the lab
    (``pytorch_mnist.py``, ``tensorflow2_keras_mnist.py``; ``shim``, the folder that stands in for torchvision
    and Keras' MNIST download; ``README.md``), which ``horovod-hetero benchmark scripts`` changes as the README
    says and runs; FileNotFoundError, saying how to install, without it.

    >>> horovod_example("pytorch_mnist.py").parent.name
    'horovod_examples'
    """
    for folder in HOROVOD_EXAMPLES:
        if (folder / name).exists():
            return folder / name
    raise FileNotFoundError(f"{name} is not in {' or '.join(map(str, HOROVOD_EXAMPLES))}: Horovod's example scripts "
                            f"are data files of horovod-hetero's lab (lab/horovod_examples/ of a checkout); "
                            f"install the lab from one (pip install -e lab, as make does)")
