"""The core imports no framework (torch, tensorflow, keras, horovod): every adapter shares it.

The decision layer (rules, strategies) is also free of networking and threads: transports come in
through the strategy's Context.
"""
import ast
import pathlib
import subprocess
import sys

import horovod_hetero

PACKAGE = pathlib.Path(horovod_hetero.__file__).parent
FORBIDDEN = {"torch", "tensorflow", "keras", "horovod"}
CORE = ["rules", "strategies", "runtime", "transports", "simulate.py", "validation.py", "errors.py"]
NETWORKING = {"socket", "socketserver", "select", "selectors", "threading", "concurrent", "zmq", "asyncio"}
DECISIONS = ["rules", "strategies"]


def imported_names(parts):
    """(file name, imported top-level module) for every import statement under ``parts``."""
    for part in parts:
        path = PACKAGE / part
        for file in ([path] if path.suffix == ".py" else sorted(path.rglob("*.py"))):
            for node in ast.walk(ast.parse(file.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                for n in names:
                    yield file.name, n.split(".")[0]


def test_no_framework_import_statement_in_common():
    offenders = [f"{f}: {n}" for f, n in imported_names(CORE) if n in FORBIDDEN]
    assert offenders == []


def test_decision_rules_and_strategies_use_no_sockets_or_threads():
    offenders = [f"{f}: {n}" for f, n in imported_names(DECISIONS) if n in NETWORKING]
    assert offenders == []


def test_importing_common_loads_no_framework():
    modules = [f"horovod_hetero.{p.removesuffix('.py')}" for p in CORE]
    code = ("import sys, pkgutil, importlib\n"
            f"for name in {modules!r}:\n"
            "    m = importlib.import_module(name)\n"
            "    for sub in pkgutil.iter_modules(getattr(m, '__path__', [])): importlib.import_module(name + '.' + sub.name)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in %r))" % FORBIDDEN)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
