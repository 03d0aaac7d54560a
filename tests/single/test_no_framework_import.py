"""The core must not import torch, tensorflow or horovod: it is shared by every adapter."""
import ast
import pathlib
import subprocess
import sys

import horovod_hetero.common as common

FORBIDDEN = {"torch", "tensorflow", "keras", "horovod"}


def test_no_framework_import_statement_in_common():
    offenders = []
    for path in pathlib.Path(common.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_importing_common_loads_no_framework():
    code = ("import sys, pkgutil, importlib, horovod_hetero.common as c\n"
            "for m in pkgutil.iter_modules(c.__path__): importlib.import_module('horovod_hetero.common.' + m.name)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in %r))" % FORBIDDEN)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
