"""Packaging as a Horovod user installs it: declared dependencies, the release files (``python -m build``,
``twine check``, the licence and the changelog), the wheel alone in a fresh environment (the library without
the lab's dependencies, a 2-rank training run), then the lab from the checkout and the demo outside it."""
import ast
import importlib.metadata
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile

import pytest

import horovod_hetero
import horovod_hetero_lab

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: Installed by the user before this package (Horovod is built for their framework and network).
PREREQUISITES = {"horovod", "torch", "tensorflow", "keras"}
#: what the lab's packages must not make the library's install pull in
LAB_ONLY = {"scikit-learn", "rich", "matplotlib"}


def import_time_modules(tree):
    """Top-level module names imported when a module loads (not inside functions)."""
    todo, names = list(tree.body), set()
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
        todo.extend(ast.iter_child_nodes(node))
    return names


def normalise(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(pyproject):
    project = tomllib.loads(pyproject.read_text())["project"]
    return {normalise(re.split(r"[<>=!~ \[;]", d)[0]) for d in project["dependencies"]}


@pytest.mark.parametrize("package, pyproject", [(horovod_hetero, ROOT / "pyproject.toml"),
                                                (horovod_hetero_lab, ROOT / "lab" / "pyproject.toml")],
                         ids=["library", "lab"])
def test_every_import_time_dependency_is_declared(package, pyproject):
    package_dir = pathlib.Path(package.__file__).parent
    dependencies = declared(pyproject)
    distributions = importlib.metadata.packages_distributions()
    missing = {}
    for path in package_dir.rglob("*.py"):
        for name in import_time_modules(ast.parse(path.read_text())):
            if name in sys.stdlib_module_names or name in PREREQUISITES or name == package.__name__:
                continue
            dists = {normalise(d) for d in distributions.get(name, [name])}
            if not dists & dependencies:
                missing.setdefault(name, []).append(path.relative_to(package_dir).as_posix())
    assert missing == {}, f"imported at load time but not in {pyproject}'s dependencies: {missing}"


def test_the_library_imports_nothing_of_the_lab_and_pulls_none_of_its_dependencies():
    package_dir = pathlib.Path(horovod_hetero.__file__).parent
    imported = {name for path in package_dir.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])}
    assert not {name for name in imported if name.split(".")[0] == "horovod_hetero_lab"}
    assert declared(ROOT / "pyproject.toml") & LAB_ONLY == set()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) == {"torch", "tensorflow", "plots", "adsp"}


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The sdist and the wheel as a release builds them (``python -m build``: the wheel from the sdist), with
    the environment's setuptools (no download)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True, text=True)
    wheel, = out.glob("horovod_hetero-*.whl")
    sdist, = out.glob("horovod_hetero-*.tar.gz")
    return wheel, sdist


def test_the_release_files_carry_the_version_the_licence_and_the_changelog(dist):
    wheel, sdist = dist
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version == horovod_hetero.__version__ and wheel.name.startswith(f"horovod_hetero-{version}-py3-none-any")
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
                             capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stdout.count("PASSED") == 2, checked.stdout + checked.stderr
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(f"horovod_hetero-{version}.dist-info/METADATA").decode()
    assert {f"horovod_hetero-{version}.dist-info/licenses/{f}" for f in ("LICENSE", "NOTICE")} <= names
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert not any(n.startswith(("horovod_hetero_lab/", "tests/", "examples/", "horovod_examples/")) for n in names)
    with tarfile.open(sdist) as t:
        top = f"horovod_hetero-{version}/"
        assert {top + f for f in ("LICENSE", "NOTICE", "CHANGELOG.md", "README.md")} <= set(t.getnames())
    assert f"## [{version}]" in (ROOT / "CHANGELOG.md").read_text()
    assert "Apache License" in (ROOT / "LICENSE").read_text()


def test_the_wheel_alone_imports_runs_its_commands_and_trains_then_the_lab_beside_it(dist, tmp_path):
    """A fresh environment that sees this one's packages (Horovod, torch, TensorFlow) but not the
    checkout: the wheel installed, its import and core commands run from elsewhere, a 2-rank torch job
    trains with the installed library alone, the lab's commands are refused with the way to install
    them; then ``pip install -e lab`` and the demo."""
    wheel, _ = dist
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # this environment's packages, not its .pth files (so not the checkout's editable install)
    pathlib.Path(site, "prerequisites.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", str(wheel)],
                   check=True, cwd=tmp_path)
    env = dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("PYTHONPATH", None)
    where = subprocess.run([python, "-c", "import horovod_hetero, horovod_hetero.torch, horovod_hetero.tensorflow.keras;"
                            "print(horovod_hetero.__file__)"], capture_output=True, text=True, check=True,
                           cwd=tmp_path, env=env).stdout.strip()
    assert where.startswith(site), where
    command = env_dir / "bin" / "horovod-hetero"
    helped = subprocess.run([command, "--help"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert helped.returncode == 0 and "simulate" in helped.stdout and "bench" not in helped.stdout, helped.stdout
    simulated = subprocess.run([command, "simulate", "--speeds", "1,1,1,4", "--strategy", "localsgd", "--duration", "30"],
                               capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert simulated.returncode == 0 and "LocalSGD" in simulated.stdout, simulated.stdout + simulated.stderr
    script = tmp_path / "installed_train.py"
    shutil.copy(pathlib.Path(__file__).with_name("installed_train.py"), script)
    trained = subprocess.run([shutil.which("horovodrun", path=env["PATH"]), "-np", "2", "-H", "localhost:2", "--gloo",
                              str(python), str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                             timeout=240)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    line = json.loads(next(l.split("]<stdout>:", 1)[-1] for l in trained.stdout.splitlines() if '"library"' in l))
    assert line["library"].startswith(site) and line["version"] == horovod_hetero.__version__
    assert line["size"] == 2 and line["rounds"]["round"] > 0 and math.isfinite(line["loss"]), line
    refused = subprocess.run([command, "demo"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert refused.returncode == 2 and "pip install -e lab" in refused.stderr, refused.stderr
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-e", str(ROOT / "lab")], check=True, cwd=tmp_path)
    demo = subprocess.run([env_dir / "bin" / "horovod-hetero", "demo", "--np", "2", "--budget", "2",
                           "--strategies", "localsgd"], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=240)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert re.search(r"^LocalSGD\(8\)\s+\d+\s+1\.00x\s+0\.\d+", demo.stdout, re.M), demo.stdout
