"""The core imports no framework (torch, tensorflow, keras, horovod): every adapter shares it.

The decision layer (rules, strategies) is also free of networking and threads: transports come in
through the strategy's Context.
"""
import ast
import os
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


def import_graph():
    """``{module: {module it imports}}`` over the package, every import statement (inside functions too)."""
    modules = {}
    for file in PACKAGE.rglob("*.py"):
        parts = ("horovod_hetero",) + file.relative_to(PACKAGE).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file

    def known(name):                    # horovod_hetero.x.y.Name -> the module horovod_hetero.x.y
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {m: set() for m in modules}
    for module, file in modules.items():
        for node in ast.walk(ast.parse(file.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            graph[module] |= {known(t) for t in targets if t.startswith("horovod_hetero")} - {module, ""}
    return graph


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, out = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_cycle_between_modules_nor_between_the_cores_packages():
    graph = import_graph()
    assert cycles(graph) == []
    package = lambda m: ".".join(m.split(".")[:2])      # noqa: E731
    packages = {}
    for module, targets in graph.items():
        packages.setdefault(package(module), set()).update(package(t) for t in targets if package(t) != package(module))
    # nor between packages: the Keras adapter is one package (its TensorFlow collectives included), and
    # horovod_hetero.tensorflow only names it under Horovod's module name
    assert cycles(packages) == []
    assert packages["horovod_hetero.tensorflow"] == {"horovod_hetero.keras"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]     # the check finds one


def test_keras_on_the_torch_backend_loads_the_torch_collectives_not_the_torch_optimizer():
    code = ("import sys\n"
            "from horovod_hetero.keras._backend import collectives_class\n"
            "assert collectives_class().__name__ == 'TorchCollectives'\n"
            "print('horovod_hetero.torch.optimizer' in sys.modules)\n"
            "import horovod_hetero.torch as hh\n"
            "print(hh.DistributedOptimizer.__module__, 'DistributedOptimizer' in dir(hh))\n"
            "namespace = {}\n"
            "exec('from horovod_hetero.torch import *', namespace)\n"
            "print(namespace['DistributedOptimizer'] is hh.DistributedOptimizer)\n")
    env = dict(os.environ, KERAS_BACKEND="torch")
    env.pop("TF_USE_LEGACY_KERAS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["False", "horovod_hetero.torch.optimizer", "True", "True"]
