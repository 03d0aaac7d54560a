"""The lab's benchmarks beside ``horovod-hetero bench``: one module each, run with
``horovod-hetero benchmark NAME [ARGS...]`` (``--list`` lists them; ``benchmark NAME --help`` gives a
benchmark's options). Each module has a ``main(argv=None)`` that parses its own options (argparse) and
can run alone too: ``python -m horovod_hetero_lab.benchmarks.NAME``. The ones that run on several ranks
are launched under ``horovodrun`` (``horovodrun -np 2 -H localhost:2 --gloo python -m horovod_hetero.cli
benchmark averaging_cost``, as the Makefile does).

>>> "zipline" in names() and summary("zipline").startswith("ZipLine solver timings")
True
"""
import ast
import importlib
import pathlib
import pkgutil
import re
from typing import Callable, Optional, Sequence

HERE = pathlib.Path(__file__).resolve().parent


def names() -> list:
    """The benchmarks' names (their modules'), sorted."""
    return sorted(m.name for m in pkgutil.iter_modules([str(HERE)]) if not m.name.startswith("_"))


def summary(name: str) -> str:
    """The first paragraph of benchmark ``name``'s docstring on one line, read from its source (importing a
    benchmark imports torch or Horovod)."""
    doc = ast.get_docstring(ast.parse((HERE / f"{name}.py").read_text())) or ""
    return re.sub(r"\s+", " ", doc.split("\n\n")[0]).replace("``", "`").strip()


def entry(name: str) -> Callable[[Optional[Sequence[str]]], object]:
    """Benchmark ``name``'s ``main(argv=None)``; ValueError naming the choices for an unknown name."""
    if name not in names():
        raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(names())}")
    return importlib.import_module(f"{__name__}.{name}").main
