"""``horovod-hetero doctor``: what will and will not work in this environment, and why.

As ``horovodrun --check-build`` does for Horovod, without initialising it: Horovod's version and
build (frameworks, controllers, tensor operations), the frameworks and Keras, WAGMA's process sets,
Gloo's timeout, this host's name, ranks against cores, the optional packages and MPI. Each check is
a function of what it reads, passed as arguments whose defaults read this environment (so a test
hands it an environment dict, a resolver, a core count, an importer or a version lookup), and
returns ``Check`` lines; ``run_checks`` runs them all, each guarded: a check that raises becomes a
``WARN`` naming it. ``horovod-hetero doctor`` (``cli.py``) prints them and exits 1 when a line is
``FAIL`` (a launch as configured cannot work).

Example:
    >>> checks = [check_gloo_timeout({}), check_hostname(hostname="a", resolve=lambda name: "127.0.1.1")]
    >>> [c.status for c in checks], exit_status(checks)
    (['OK', 'WARN'], 0)
"""
from __future__ import annotations

import ast
import importlib
import importlib.metadata
import ipaddress
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import horovod_hetero

Status = Literal["OK", "WARN", "FAIL"]
OK: Status = "OK"
WARN: Status = "WARN"
FAIL: Status = "FAIL"

#: the page the fixes point to (``troubleshooting.md#<slug>``, beside this package's other docs)
PAGE = "troubleshooting.md"
#: Horovod's framework extensions this library uses: ``horovod.torch``, ``horovod.tensorflow``
FRAMEWORKS = ("torch", "tensorflow")
LABELS = {"torch": "PyTorch", "tensorflow": "TensorFlow"}
#: the variable that builds Horovod with each framework
BUILD_VARIABLES = {"torch": "HOROVOD_WITH_PYTORCH", "tensorflow": "HOROVOD_WITH_TENSORFLOW"}
#: Horovod's extension of each framework, as its ``mpi_ops`` checks it (``check_extension``)
EXTENSIONS = {"torch": "mpi_lib_v2", "tensorflow": "mpi_lib"}
#: the distributions that may install each module (``tensorflow-cpu`` installs ``tensorflow``)
DISTRIBUTIONS = {"torch": ("torch",),
                 "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos",
                                "tensorflow-intel", "intel-tensorflow")}
#: ``--framework`` choices
FRAMEWORK_CHOICES = ("any", "torch", "tensorflow", "keras")
#: Gloo's timeout when ``HOROVOD_GLOO_TIMEOUT_SECONDS`` is unset (Horovod 0.28.1)
GLOO_TIMEOUT_DEFAULT = 30
#: what ``HOROVOD_GLOO_TIMEOUT_SECONDS`` measured under ``hvd.elastic`` (docs/elastic.md: the kill test)
ELASTIC_MEASURED = ("measured: survivors restart 0.4-1.4 s after a kill with this library's optimizer or "
                    "callbacks, which end the failed session's connections; 30-40 s at 30 with Horovod's own")
#: seconds a framework probe (a child process importing ``horovod.<framework>``) may take
PROBE_TIMEOUT_S = 300.0
#: the line a probe prints its result on
PROBE_MARK = "HOROVOD_HETERO_DOCTOR "
#: the probe's code: import the framework, then Horovod's extension for it, and ask the extension what
#: Horovod was built with (``mpi_built``, ``gloo_built``, ``nccl_built``: no ``hvd.init``)
PROBE = r"""
import json, sys, traceback
framework = sys.argv[1]
out = {"framework": framework, "built": False}
def error(e):
    return (type(e).__name__ + ": " + str(e)).strip().splitlines()[0][:300]
try:
    module = __import__(framework)
    out["version"] = str(module.__version__)
except Exception as e:
    out["error"] = "import " + framework + ": " + error(e)
else:
    try:
        import importlib
        hvd = importlib.import_module("horovod." + framework)
        out.update(built=True, mpi=bool(hvd.mpi_built()), gloo=bool(hvd.gloo_built()), nccl=bool(hvd.nccl_built()))
    except Exception as e:
        out["error"] = error(e)
    try:
        if framework == "torch":
            out["gpu"] = bool(module.cuda.is_available())
        else:
            out["gpu"] = bool(module.config.list_physical_devices("GPU"))
    except Exception:
        pass
print(""" + repr(PROBE_MARK) + """ + json.dumps(out), flush=True)
"""


def anchor(slug: str) -> str:
    """The link of a fix on the troubleshooting page.

    Example:
        >>> anchor("gloo-timeout")
        'troubleshooting.md#gloo-timeout'
    """
    return f"{PAGE}#{slug}"


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report.

    Attributes:
        status: ``OK``, ``WARN`` (works, with a cost or a limit) or ``FAIL`` (a launch as configured
            cannot work).
        name: the thing checked.
        detail: what was found and why it matters.
        fix: what to do, in a few words (``""``: nothing).
        anchor: ``troubleshooting.md#<slug>`` (``""``: none).
    """

    status: Status
    name: str
    detail: str
    fix: str = ""
    anchor: str = ""


@dataclass(frozen=True)
class FrameworkBuild:
    """What a framework's probe found: whether Horovod's extension for it imports, and what that
    extension was built with.

    Attributes:
        framework: ``torch`` or ``tensorflow``.
        built: ``horovod.<framework>`` imports (the extension is built and loads with this framework).
        version: the framework's version, where it imported.
        error: why it is not built or does not import (``""``: it does).
        mpi, gloo, nccl: the extension's ``mpi_built()``, ``gloo_built()``, ``nccl_built()`` (``None``:
            not known).
        gpu: the framework sees a GPU.
    """

    framework: str
    built: bool
    version: str | None = None
    error: str = ""
    mpi: bool | None = None
    gloo: bool | None = None
    nccl: bool | None = None
    gpu: bool = False


@dataclass(frozen=True)
class Build:
    """Horovod's build as ``horovodrun --check-build`` reports it: per framework, and the controllers
    and tensor operations of the first built extension (Horovod asks its extensions in turn too).

    Example:
        >>> build = Build({"torch": FrameworkBuild("torch", True, "2.13.0", mpi=False, gloo=True, nccl=False)})
        >>> build.built(), build.gloo, build.mpi
        (['torch'], True, False)
    """

    frameworks: dict[str, FrameworkBuild] = field(default_factory=dict)

    def built(self) -> list[str]:
        """The frameworks whose Horovod extension imports."""
        return [name for name, f in self.frameworks.items() if f.built]

    def _flag(self, name: str) -> bool | None:
        for f in self.frameworks.values():
            value = getattr(f, name)
            if f.built and value is not None:
                return bool(value)
        return None

    @property
    def mpi(self) -> bool | None:
        """Horovod built with MPI (``None``: no extension told)."""
        return self._flag("mpi")

    @property
    def gloo(self) -> bool | None:
        """Horovod built with Gloo (``None``: no extension told)."""
        return self._flag("gloo")

    @property
    def nccl(self) -> bool | None:
        """Horovod built with NCCL (``None``: no extension told)."""
        return self._flag("nccl")

    @property
    def gpu(self) -> bool:
        """A built framework sees a GPU."""
        return any(f.gpu for f in self.frameworks.values() if f.built)


# ---------------------------------------------------------------------------------------------------
# what the checks read, from this environment


def distribution_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or ``None`` (read from its metadata: nothing
    is imported).

    Example:
        >>> distribution_version("click") is not None, distribution_version("no-such-distribution-x")
        (True, None)
    """
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def first_version(names: Sequence[str], version_of: Callable[[str], str | None] = distribution_version
                  ) -> str | None:
    """The version of the first of ``names`` installed (``None``: none is).

    Example:
        >>> first_version(["tensorflow", "tensorflow-cpu"], {"tensorflow-cpu": "2.18.1"}.get)
        '2.18.1'
    """
    for name in names:
        version = version_of(name)
        if version:
            return version
    return None


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity where the system has one, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    try:
        import psutil
        return len(psutil.Process().cpu_affinity())
    except (ImportError, AttributeError, OSError):
        return os.cpu_count() or 1


def tested_release() -> str:
    """The Horovod release horovod-hetero is tested with: ``common.compat.HOROVOD_TESTED``, read from
    compat's source (importing compat needs a Horovod it accepts, which the fixes may be for).

    Example:
        >>> tested_release()
        '0.28.1'
    """
    with open(os.path.join(os.path.dirname(horovod_hetero.__file__), "common", "compat.py")) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "HOROVOD_TESTED" for t in node.targets):
            return str(ast.literal_eval(node.value))
    raise LookupError("common/compat.py names no HOROVOD_TESTED")


def horovod_verdict(version: str) -> tuple[str | None, str]:
    """``(why, tested)``: why horovod-hetero refuses Horovod ``version`` (``None``: it accepts it), as
    ``common.compat.check_horovod_version`` decides, and the release it is tested with.

    Importing ``compat`` checks the installed Horovod itself: its error is the verdict then.

    Example:
        >>> horovod_verdict("0.28.1")
        (None, '0.28.1')
        >>> horovod_verdict("0.29.0")[0]                   # doctest: +ELLIPSIS
        '... Horovod 0.29.0 may have changed: install horovod==0.28.1 (or set HOROVOD_HETERO_ANY_HOROVOD=1 ...'
    """
    try:
        from horovod_hetero.common.compat import HOROVOD_TESTED, check_horovod_version
    except ImportError as error:
        return str(error), ""
    try:
        check_horovod_version(version)
    except ImportError as error:
        return str(error), HOROVOD_TESTED
    return None, HOROVOD_TESTED


def _probe_result(framework: str, stdout: str, stderr: str, code: int | None) -> FrameworkBuild:
    for line in reversed(stdout.splitlines()):
        if line.startswith(PROBE_MARK):
            out = json.loads(line[len(PROBE_MARK):])
            return FrameworkBuild(framework, bool(out.get("built")), out.get("version"), out.get("error", ""),
                                  out.get("mpi"), out.get("gloo"), out.get("nccl"), bool(out.get("gpu")))
    last = (stderr.strip().splitlines() or ["no output"])[-1][:300]
    return FrameworkBuild(framework, False, error=f"the probe importing horovod.{framework} exited {code}: {last}")


def probe_build(frameworks: Sequence[str] = FRAMEWORKS, timeout_s: float = PROBE_TIMEOUT_S) -> Build:
    """Horovod's build, as ``horovodrun --check-build`` finds it (``horovod.common.util``): each
    framework's extension is looked for on disk (``check_extension``, as its ``mpi_ops`` does) and,
    where it is there, imported in a child process that asks it what Horovod was built with. The
    children run at once; this process imports no framework and Horovod is not initialised.
    """
    from horovod.common.util import check_extension
    import horovod

    results: dict[str, FrameworkBuild] = {}
    children: dict[str, subprocess.Popen[str]] = {}
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    for name in frameworks:
        try:
            check_extension(f"horovod.{name}", BUILD_VARIABLES[name],
                            os.path.join(os.path.dirname(horovod.__file__), name, "__init__.py"), EXTENSIONS[name])
        except ImportError as error:
            results[name] = FrameworkBuild(name, False, error=str(error).splitlines()[0])
            continue
        children[name] = subprocess.Popen([sys.executable, "-c", PROBE, name], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                          encoding="utf-8", errors="replace", env=env)
    for name, child in children.items():
        try:
            stdout, stderr = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            results[name] = FrameworkBuild(name, False, error=f"importing horovod.{name} took over {timeout_s:g} s")
            continue
        results[name] = _probe_result(name, stdout, stderr, child.returncode)
    return Build({name: results[name] for name in frameworks})


def mpirun_version(path: str) -> str:
    """What ``path --version`` prints, or ``failed: <why>``."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"failed: {error}"
    return (done.stdout or done.stderr).strip()


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """``H1:2,H2:2`` (horovodrun's ``-H``: every host with its slots) as ``[(host, slots), ...]``.

    Example:
        >>> parse_hosts("a:2, b.lan:4")
        [('a', 2), ('b.lan', 4)]
        >>> parse_hosts("a")
        Traceback (most recent call last):
        ...
        ValueError: 'a': give every host with its slots, as horovodrun's -H: host1:2,host2:2
    """
    hosts = []
    for part in text.split(","):
        match = re.fullmatch(r"([\w.-]+):([0-9]+)", part.strip())
        if not match or int(match.group(2)) < 1:
            raise ValueError(f"{part.strip()!r}: give every host with its slots, as horovodrun's -H: host1:2,host2:2")
        hosts.append((match.group(1), int(match.group(2))))
    return hosts


def assign_ranks(hosts: Sequence[tuple[str, int]], np: int) -> list[tuple[str, int]]:
    """How many of ``np`` ranks each host gets: its slots in order, as horovodrun assigns them.

    Example:
        >>> assign_ranks([("a", 2), ("b", 2)], 3)
        [('a', 2), ('b', 1)]
    """
    out, left = [], np
    for host, slots in hosts:
        out.append((host, min(slots, left)))
        left -= out[-1][1]
    return out


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------------
# the checks


def check_python(version: str | None = None, executable: str = sys.executable) -> Check:
    """Python's version and interpreter.

    Example:
        >>> check_python("3.11.7", "/venv/bin/python")
        Check(status='OK', name='Python', detail='3.11.7 (/venv/bin/python)', fix='', anchor='')
    """
    version = platform.python_version() if version is None else version
    if tuple(int(v) for v in re.findall(r"\d+", version)[:2]) < (3, 9):
        return Check(FAIL, "Python", f"{version} ({executable}): horovod-hetero needs 3.9 or newer",
                     "use Python 3.9 or newer")
    return Check(OK, "Python", f"{version} ({executable})")


def check_package(version: str = horovod_hetero.__version__, location: str | None = None) -> Check:
    """horovod-hetero's version and where it is imported from.

    Example:
        >>> check_package("0.1.0", "/src/horovod_hetero").detail
        '0.1.0 (/src/horovod_hetero)'
    """
    location = os.path.dirname(horovod_hetero.__file__) if location is None else location
    return Check(OK, "horovod-hetero", f"{version} ({location})")


def check_horovod(importer: Callable[[str], Any] = importlib.import_module,
                  verdict: Callable[[str], tuple[str | None, str]] = horovod_verdict) -> Check:
    """Horovod importable, and a version horovod-hetero accepts (``common.compat``'s check).

    Args:
        importer: imports a module by name (raises ``ImportError`` where it cannot).
        verdict: ``(why it is refused or None, the tested release)`` of a version.

    Example:
        >>> def missing(name):
        ...     raise ImportError(f"No module named {name!r}")
        >>> check_horovod(missing).status
        'FAIL'
        >>> from types import SimpleNamespace
        >>> check_horovod(lambda name: SimpleNamespace(__version__="0.28.1"), lambda v: (None, "0.28.1")).detail
        '0.28.1'
    """
    try:
        horovod = importer("horovod")
    except ImportError as error:
        return Check(FAIL, "Horovod", f"not importable ({error})",
                     "install Horovod built for your framework: HOROVOD_WITH_PYTORCH=1 (or _TENSORFLOW=1) "
                     f"HOROVOD_WITH_GLOO=1 pip install --no-cache-dir horovod=={tested_release()}",
                     anchor("horovod-not-installed"))
    version = str(getattr(horovod, "__version__", "unknown"))
    why, tested = verdict(version)
    if why:
        return Check(FAIL, "Horovod", f"{version}: {why}",
                     f"pip install --no-cache-dir horovod=={tested or tested_release()}", anchor("horovod-version"))
    if tested and version != tested:
        return Check(WARN, "Horovod", f"{version}: accepted, but horovod-hetero is tested with {tested}",
                     f"pip install --no-cache-dir horovod=={tested}", anchor("horovod-version"))
    return Check(OK, "Horovod", version)


def check_frameworks(build: Build, framework: str = "any",
                     version_of: Callable[[str], str | None] = distribution_version,
               executable: str = sys.executable) -> list[Check]:
    """One line per framework: installed, and Horovod's extension for it built (``horovod.torch``,
    ``horovod.tensorflow``); a ``FAIL`` for the framework asked (``--framework``) when it is not, and
    when Horovod is built for none.

    Example:
        >>> build = Build({"torch": FrameworkBuild("torch", True, "2.13.0"),
        ...                "tensorflow": FrameworkBuild("tensorflow", False, error="not built")})
        >>> [(c.status, c.detail) for c in check_frameworks(build, "any", {}.get)]
        [('OK', 'torch 2.13.0, horovod.torch built'), ('OK', 'not installed (not needed: no --framework tensorflow)')]
        >>> [c.status for c in check_frameworks(build, "tensorflow", {"tensorflow": "2.18.1"}.get)]
        ['OK', 'FAIL']
    """
    checks = []
    for name in FRAMEWORKS:
        found = build.frameworks.get(name, FrameworkBuild(name, False, error="not probed"))
        label = LABELS[name]
        if found.built:
            checks.append(Check(OK, label, f"{name} {found.version}, horovod.{name} built"))
            continue
        installed = found.version or first_version(DISTRIBUTIONS[name], version_of)
        asked = framework == name
        if not installed:
            checks.append(Check(FAIL if asked else OK, label,
                                "not installed" + ("" if asked else f" (not needed: no --framework {name})"),
                                f"pip install {name}, then reinstall Horovod with {BUILD_VARIABLES[name]}=1"
                                if asked else "", anchor("framework-not-built") if asked else ""))
            continue
        if found.error.startswith("Extension ") or found.error == "not probed":
            why = f"{name} {installed} installed, but Horovod was built without it (no horovod.{name})"
            fix = (f"reinstall Horovod: {BUILD_VARIABLES[name]}=1 pip install --no-cache-dir --force-reinstall "
                   f"horovod=={tested_release()}")
        else:
            why = f"{name} {installed}: horovod.{name} does not import ({found.error})"
            fix = (f"reinstall Horovod against this {name}: pip install --no-cache-dir --force-reinstall "
                   f"horovod=={tested_release()}")
        checks.append(Check(FAIL if asked else WARN, label, why, fix, anchor("framework-not-built")))
    if not build.built():
        checks.append(Check(FAIL, "frameworks", "Horovod is built for no framework this library uses (torch, "
                            "tensorflow)", "reinstall Horovod with HOROVOD_WITH_PYTORCH=1 or HOROVOD_WITH_TENSORFLOW=1",
                            anchor("framework-not-built")))
    return checks


def keras_config_backend(env: Mapping[str, str] | None = None) -> str | None:
    """The backend Keras 3's ``keras.json`` names (where Keras 3 looks for it: ``$KERAS_HOME``, else
    ``~/.keras``, else ``/tmp/.keras`` where the home is read-only), or ``None``.

    Example:
        >>> keras_config_backend({"KERAS_HOME": "/nonexistent"}) is None
        True
    """
    env = os.environ if env is None else env
    if env.get("KERAS_HOME"):
        directory = env["KERAS_HOME"]
    else:
        home = os.path.expanduser("~")
        directory = os.path.join(home if os.access(home, os.W_OK) else "/tmp", ".keras")
    try:
        with open(os.path.join(os.path.expanduser(directory), "keras.json")) as f:
            backend = json.load(f).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
    return str(backend) if backend else None


def check_keras(build: Build | None, framework: str = "any", env: Mapping[str, str] | None = None,
                version_of: Callable[[str], str | None] = distribution_version,
                config_backend: Callable[[Mapping[str, str]], str | None] = keras_config_backend) -> Check:
    """Which Keras a script runs and on which backend, as ``keras._backend.keras_module`` decides it
    (Keras 2 from ``tf_keras`` under ``TF_USE_LEGACY_KERAS=1``, else the ``keras`` package; Keras 3's
    backend from ``KERAS_BACKEND``, else ``keras.json``, else TensorFlow), and whether Horovod has the
    module it averages through (``horovod.tensorflow.keras``, or ``horovod.torch`` on the torch backend).
    Nothing is imported. ``FAIL`` only with ``--framework keras``.

    Example:
        >>> build = Build({"torch": FrameworkBuild("torch", True, "2.13.0")})
        >>> check_keras(build, "keras", {"KERAS_BACKEND": "torch"}, {"keras": "3.15.1"}.get).detail
        'Keras 3.15.1, backend torch: averages through horovod.torch (built)'
        >>> check_keras(build, "keras", {"KERAS_BACKEND": "tensorflow"}, {"keras": "3.15.1"}.get).status
        'FAIL'
    """
    env = os.environ if env is None else env
    asked = framework == "keras"
    failed: Status = FAIL if asked else WARN
    legacy = env.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")
    if legacy:
        version = version_of("tf-keras")
        if not version:
            return Check(failed, "Keras", "TF_USE_LEGACY_KERAS selects Keras 2, but tf_keras is not installed",
                         "pip install tf-keras of your TensorFlow's release (e.g. tf-keras~=2.18.0), or unset "
                         "TF_USE_LEGACY_KERAS", anchor("keras-backend"))
        detail, backend = f"Keras 2 {version} (tf_keras: TF_USE_LEGACY_KERAS)", "tensorflow"
    else:
        version = version_of("keras")
        if not version:
            return Check(failed if asked else OK, "Keras", "not installed" + ("" if asked else " (not needed: no "
                         "--framework keras)"), "pip install keras" if asked else "",
                         anchor("keras-backend") if asked else "")
        detail = f"Keras {version}"
        backend = ("tensorflow" if version.split(".")[0] == "2"          # Keras 2: TensorFlow's own
                   else env.get("KERAS_BACKEND") or config_backend(env) or "tensorflow")
    module = {"tensorflow": "horovod.tensorflow.keras", "torch": "horovod.torch"}.get(backend)
    if module is None:
        return Check(failed, "Keras", f"{detail}, backend {backend}: horovod-hetero averages through Horovod's "
                     "TensorFlow or PyTorch ops", "set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch",
                     anchor("keras-backend"))
    framework_of = "torch" if backend == "torch" else "tensorflow"
    if build is None or framework_of not in build.built():
        return Check(failed, "Keras", f"{detail}, backend {backend}: needs {module}, but Horovod is not built for "
                     f"{framework_of}", f"reinstall Horovod with {BUILD_VARIABLES[framework_of]}=1, or set "
                     f"KERAS_BACKEND={'tensorflow' if backend == 'torch' else 'torch'}", anchor("keras-backend"))
    return Check(OK, "Keras", f"{detail}, backend {backend}: averages through {module} (built)")


def check_controllers(build: Build, elastic: bool = False, mpirun: str | None = None) -> Check:
    """Horovod's controllers (Gloo, MPI) as built: some launch must exist, and ``hvd.elastic`` needs
    Gloo.

    Args:
        build: Horovod's build.
        elastic: the job runs under ``hvd.elastic`` (``horovodrun`` with elastic options).
        mpirun: the ``mpirun`` on ``PATH`` (``None``: none).

    Example:
        >>> build = Build({"torch": FrameworkBuild("torch", True, "2.13.0", mpi=True, gloo=False)})
        >>> check_controllers(build, mpirun=None).status, check_controllers(build, mpirun="/bin/mpirun").status
        ('FAIL', 'WARN')
    """
    gloo, mpi = build.gloo, build.mpi
    if gloo is None and mpi is None:
        return Check(WARN, "controllers", "not known: no framework extension of Horovod imports")
    if elastic and not gloo:
        return Check(FAIL, "controllers", "hvd.elastic needs Gloo, and Horovod was built without it",
                     "reinstall Horovod with HOROVOD_WITH_GLOO=1", anchor("elastic-needs-gloo"))
    if not gloo and not (mpi and mpirun):
        why = "MPI not built" if not mpi else "MPI built but no mpirun on PATH"
        return Check(FAIL, "controllers", f"no way to launch: Gloo not built, {why}",
                     "reinstall Horovod with HOROVOD_WITH_GLOO=1 (or put the MPI it was built with on PATH)",
                     anchor("no-controller"))
    if not gloo:
        return Check(WARN, "controllers", "MPI only (Gloo not built): mpirun or horovodrun --mpi; no hvd.elastic",
                     "reinstall Horovod with HOROVOD_WITH_GLOO=1 for horovodrun --gloo and hvd.elastic",
                     anchor("no-controller"))
    if mpi:
        return Check(OK, "controllers", "Gloo and MPI built (hvd.elastic: Gloo; op=hvd.Adasum: MPI)")
    return Check(OK, "controllers", "Gloo built (horovodrun --gloo, hvd.elastic); MPI not built: no op=hvd.Adasum")


def check_tensor_operations(build: Build) -> Check:
    """NCCL built (GPU collectives), and whether a GPU is seen without it.

    Example:
        >>> check_tensor_operations(Build({"torch": FrameworkBuild("torch", True, nccl=False, gpu=True)})).status
        'WARN'
    """
    nccl = build.nccl
    if nccl:
        return Check(OK, "tensor operations", "NCCL built (GPU collectives)")
    if build.gpu:
        return Check(WARN, "tensor operations", "a GPU is visible, but Horovod has no NCCL: GPU tensors are not "
                     "averaged on the GPU", "reinstall Horovod with HOROVOD_GPU_OPERATIONS=NCCL",
                     anchor("gpu-without-nccl"))
    return Check(OK, "tensor operations", f"{'NCCL not built' if nccl is False else 'NCCL not known'}: CPU "
                 "collectives through Gloo or MPI (no GPU seen)")


def parse_mpirun_version(text: str) -> tuple[str, str | None]:
    """``(implementation, version)`` from ``mpirun --version``'s output.

    Example:
        >>> parse_mpirun_version("mpirun (Open MPI) 5.0.11\\n\\nReport bugs to ...")
        ('Open MPI', '5.0.11')
        >>> parse_mpirun_version("HYDRA build details:\\n    Version:  4.1.2")
        ('MPICH', '4.1.2')
    """
    if "Open MPI" in text or "OpenRTE" in text:
        implementation = "Open MPI"
    elif "HYDRA" in text or "MPICH" in text:
        implementation = "MPICH"
    elif "Intel" in text:
        implementation = "Intel MPI"
    else:
        implementation = (text.splitlines() or ["unknown MPI"])[0][:60]
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
    return implementation, match.group(1) if match else None


def check_mpi(mpi_built: bool | None, which: Callable[[str], str | None] = shutil.which,
              version: Callable[[str], str] = mpirun_version, executable: str = sys.executable) -> Check:
    """``mpirun`` on ``PATH`` and its version against Horovod's MPI: ``op=hvd.Adasum`` and
    ``horovodrun --mpi`` need both (horovodrun runs the ``mpirun`` on ``PATH``); Open MPI 5 needs
    ``--binding-args`` with horovodrun.

    Args:
        mpi_built: Horovod built with MPI (``None``: not known).
        which: finds a command on ``PATH``.
        version: what ``mpirun --version`` prints.
        executable: this Python, beside which an environment's own ``mpirun`` lies.

    Example:
        >>> check_mpi(True, lambda c: "/venv/bin/mpirun", lambda p: "mpirun (Open MPI) 5.0.11").fix
        'horovodrun --mpi --binding-args="--bind-to none --map-by slot" (mpirun: --bind-to none --map-by slot)'
        >>> check_mpi(False, lambda c: None, executable="/nonexistent/python").status
        'OK'
    """
    path = which("mpirun")
    if path is None:
        beside = os.path.join(os.path.dirname(executable), "mpirun")
        if mpi_built is not False and os.access(beside, os.X_OK):
            return Check(WARN, "MPI", f"no mpirun on PATH, but {beside} is there: horovodrun --mpi runs PATH's",
                         f"activate the environment (PATH={os.path.dirname(beside)}:$PATH)", anchor("mpi-not-found"))
        if mpi_built:
            return Check(WARN, "MPI", "Horovod is built with MPI, but no mpirun on PATH: no horovodrun --mpi, "
                         "no op=hvd.Adasum", "put the MPI Horovod was built with on PATH (activate its environment)",
                         anchor("mpi-not-found"))
        return Check(OK, "MPI", f"no mpirun on PATH{', Horovod without MPI' if mpi_built is False else ''}: launch "
                     "with horovodrun --gloo (op=hvd.Adasum needs MPI)")
    text = version(path)
    implementation, number = parse_mpirun_version(text)
    found = f"{implementation} {number or '(version unknown)'} ({path})"
    if text.startswith("failed:"):
        return Check(WARN, "MPI", f"{path} --version {text}", "check the MPI installation", anchor("mpi-not-found"))
    if mpi_built is False:
        return Check(WARN, "MPI", f"{found}, but Horovod was built without MPI: mpirun and horovodrun --mpi "
                     "cannot start it, no op=hvd.Adasum", "launch with horovodrun --gloo, or reinstall Horovod "
                     "with HOROVOD_WITH_MPI=1", anchor("mpi-not-found"))
    if implementation == "Open MPI" and number and int(number.split(".")[0]) >= 5:
        return Check(WARN, "MPI", f"{found}: horovodrun --mpi passes it -bind-to, which Open MPI 5 refuses "
                     "(op=hvd.Adasum available)",
                     'horovodrun --mpi --binding-args="--bind-to none --map-by slot" '
                     "(mpirun: --bind-to none --map-by slot)", anchor("open-mpi-5-binding-args"))
    return Check(OK, "MPI", f"{found}: horovodrun --mpi and op=hvd.Adasum available")


def check_process_sets(env: Mapping[str, str] | None = None, strategy: str | None = None,
                       elastic: bool = False) -> Check:
    """Process sets as the launch sets them (``HOROVOD_DYNAMIC_PROCESS_SETS``; ``hvd.init(process_sets="dynamic")``
    sets it to 1 in the script itself) and what WAGMA needs: ``hvd.init(process_sets=hh.wagma_process_sets())``,
    or ``"dynamic"`` under ``hvd.elastic`` (process sets given to ``hvd.init`` are gone after a reset), where a
    worker's failure ends a WAGMA job (Horovod 0.28 removes its process sets after a failed collective).

    Example:
        >>> check_process_sets({}, "wagma", elastic=True).status
        'WARN'
        >>> check_process_sets({}, "wagma").detail
        'HOROVOD_DYNAMIC_PROCESS_SETS unset: WAGMA needs hvd.init(process_sets=hh.wagma_process_sets()) in the script'
    """
    env = os.environ if env is None else env
    raw = env.get("HOROVOD_DYNAMIC_PROCESS_SETS")
    shown = f"HOROVOD_DYNAMIC_PROCESS_SETS={raw}" if raw is not None else "HOROVOD_DYNAMIC_PROCESS_SETS unset"
    if raw not in (None, "", "0", "1"):
        return Check(WARN, "process sets", f"{shown}: Horovod takes only 1 as dynamic",
                     "set HOROVOD_DYNAMIC_PROCESS_SETS=1 (or unset it)", anchor("dynamic-process-sets"))
    if strategy == "wagma" and elastic:
        return Check(WARN, "process sets", f"{shown}: WAGMA under hvd.elastic needs hvd.init(process_sets=\"dynamic\") "
                     "in the script, and a worker's failure ends the job (Horovod 0.28 removes process sets after a "
                     "failed collective)", "for a job that must survive failures, another strategy (they reset and "
                     "go on)", anchor("dynamic-process-sets"))
    if strategy == "wagma":
        return Check(OK, "process sets", f"{shown}: WAGMA needs hvd.init(process_sets=hh.wagma_process_sets()) in "
                     "the script")
    kind = "dynamic" if raw == "1" else "static unless the script asks for dynamic ones"
    return Check(OK, "process sets", f"{shown}: {kind} (WAGMA: hvd.init(process_sets=hh.wagma_process_sets()); "
                 'under hvd.elastic: process_sets="dynamic")')


def check_gloo_timeout(env: Mapping[str, str] | None = None, elastic: bool = False) -> Check:
    """``HOROVOD_GLOO_TIMEOUT_SECONDS`` (Horovod's default: 30 s) and what a failure costs with it: where
    Horovod's own optimizer runs, the survivors wait about that long before ``hvd.elastic`` resets; with this
    library's, under a second (docs/elastic.md).

    Example:
        >>> check_gloo_timeout({"HOROVOD_GLOO_TIMEOUT_SECONDS": "10"}, elastic=True).detail   # doctest: +ELLIPSIS
        "10 s (HOROVOD_GLOO_TIMEOUT_SECONDS): under hvd.elastic with Horovod's own optimizer a failed worker stalls..."
        >>> check_gloo_timeout({"HOROVOD_GLOO_TIMEOUT_SECONDS": "soon"}).status
        'WARN'
    """
    env = os.environ if env is None else env
    raw = (env.get("HOROVOD_GLOO_TIMEOUT_SECONDS") or "").strip()
    source = "HOROVOD_GLOO_TIMEOUT_SECONDS" if raw else "Horovod's default"
    try:
        seconds = int(raw) if raw else GLOO_TIMEOUT_DEFAULT
    except ValueError:
        seconds = 0
    if seconds <= 0:
        return Check(WARN, "Gloo timeout", f"HOROVOD_GLOO_TIMEOUT_SECONDS={raw!r} is not a whole number of seconds > 0",
                     "set it to seconds, e.g. 10, above the longest wait a collective has", anchor("gloo-timeout"))
    if elastic:
        detail = (f"{seconds} s ({source}): under hvd.elastic with Horovod's own optimizer a failed worker stalls "
                  f"the survivors about {seconds} s before the reset ({ELASTIC_MEASURED})")
        if seconds > 10:
            detail += "; there, lower it (above your longest collective wait) to lose less"
    else:
        detail = (f"{seconds} s ({source}): a lost rank surfaces after about that under Gloo (twice with process sets "
                  "registered)")
    return Check(OK, "Gloo timeout", detail)


def check_hostname(hosts: Sequence[tuple[str, int]] | None = None, hostname: str | None = None,
                   resolve: Callable[[str], str] = socket.gethostbyname) -> Check:
    """This host's name and the address it resolves to: Horovod 0.28.1 builds its Gloo contexts from it
    on several hosts (docs/hosts.md), so loopback (``127.0.1.1``, Debian's default) there aborts
    ``hvd.init()``: a warning on one host, a failure when ``hosts`` names more than one.

    Example:
        >>> check_hostname([("a", 2), ("b", 2)], "a", lambda name: "127.0.1.1").status
        'FAIL'
        >>> check_hostname(None, "a", lambda name: "10.0.0.5").detail
        'a resolves to 10.0.0.5'
    """
    hostname = socket.gethostname() if hostname is None else hostname
    multi = hosts is not None and len({h for h, _ in hosts}) > 1
    fix = f"map {hostname} to this host's network address in /etc/hosts (or DNS)"
    try:
        address = resolve(hostname)
    except OSError as error:
        return Check(FAIL if multi else WARN, "host name", f"{hostname} does not resolve ({error})"
                     + (": other hosts' ranks cannot reach this one" if multi else ""), fix,
                     anchor("hostname-resolves-to-loopback"))
    if _is_loopback(address):
        if multi:
            return Check(FAIL, "host name", f"{hostname} resolves to {address} (loopback): on several hosts Gloo "
                         "binds it and hvd.init() aborts (gloo::IoException, connection refused)", fix + ", on every host",
                         anchor("hostname-resolves-to-loopback"))
        return Check(WARN, "host name", f"{hostname} resolves to {address} (loopback): fine on this host alone; a job "
                     "spanning hosts would abort in hvd.init()", fix + " before launching on several hosts",
                     anchor("hostname-resolves-to-loopback"))
    return Check(OK, "host name", f"{hostname} resolves to {address}" + (" (check each host likewise)" if multi else ""))


def _local_names(hostname: str, resolve: Callable[[str], str]) -> set[str]:
    names = {hostname, hostname.split(".")[0], "localhost", "127.0.0.1"}
    try:
        names.add(resolve(hostname))
    except OSError:
        pass
    return names


def check_ranks(np: int | None = None, hosts: Sequence[tuple[str, int]] | None = None,
                cpus: int | None = None, hostname: str | None = None,
                resolve: Callable[[str], str] = socket.gethostbyname) -> Check:
    """The ranks a launch puts on this host against the CPUs this process may use: with more ranks than
    cores, Horovod's waits spin (a ``sched_yield`` loop that takes the GIL back each turn) on cores the
    computing ranks need (docs/strategies/synchronous.md; the library polls its own waits).

    Args:
        np: the number of ranks (``-np``; ``None``: with ``hosts``, all their slots, else only the cores).
        hosts: ``-H``'s hosts and slots (``None``: every rank on this host).
        cpus: the CPUs available (``None``: this process's affinity).
        hostname: this host's name (to find its slots in ``hosts``).

    Example:
        >>> print(check_ranks(4, cpus=2).detail)        # doctest: +ELLIPSIS
        4 ranks on this host, 2 CPUs: Horovod's waits spin ...
        >>> check_ranks(8, [("a", 2), ("b", 2)], cpus=4, hostname="a").status
        'FAIL'
    """
    cpus = available_cpus() if cpus is None else cpus
    if np is None and not hosts:
        return Check(OK, "ranks and cores", f"{cpus} CPUs available to a rank here (-np N checks a launch)")
    if hosts:
        slots = sum(s for _, s in hosts)
        if np is not None and np > slots:
            return Check(FAIL, "ranks and cores", f"-np {np} but -H has {slots} slots: horovodrun refuses it",
                         f"-np {slots} or fewer, or more slots in -H", anchor("not-enough-slots"))
        here = _local_names(socket.gethostname() if hostname is None else hostname, resolve)
        local = sum(n for host, n in assign_ranks(hosts, slots if np is None else np) if host in here)
        where = f"{local} of the {slots if np is None else np} ranks on this host"
    else:
        assert np is not None
        local = np
        where = f"{local} ranks on this host"
    if local > cpus:
        return Check(WARN, "ranks and cores", f"{where}, {cpus} CPUs: Horovod's waits spin (sched_yield, taking the "
                     "GIL back) on cores the computing ranks need; horovod-hetero's own waits poll",
                     f"at most {cpus} ranks here, or accept the slowdown (mpirun: --mca mpi_yield_when_idle 1)",
                     anchor("more-ranks-than-cores"))
    return Check(OK, "ranks and cores", f"{where}, {cpus} CPUs")


def check_scipy(version_of: Callable[[str], str | None] = distribution_version, strategy: str | None = None
                ) -> Check:
    """SciPy, which ADSP's loss-curve fit needs (``pip install horovod-hetero[adsp]``).

    Example:
        >>> check_scipy({}.get).status, check_scipy({}.get, "adsp").status, check_scipy({"scipy": "1.17.1"}.get).status
        ('WARN', 'FAIL', 'OK')
    """
    version = version_of("scipy")
    if version:
        return Check(OK, "SciPy", f"{version} (ADSP's loss-curve fit)")
    return Check(FAIL if strategy == "adsp" else WARN, "SciPy", "not installed: ADSP cannot fit its loss curve",
                 "pip install horovod-hetero[adsp]", anchor("optional-dependencies"))


def check_matplotlib(version_of: Callable[[str], str | None] = distribution_version) -> Check:
    """matplotlib, which ``horovod-hetero simulate --png`` needs (``pip install horovod-hetero[plots]``).

    Example:
        >>> check_matplotlib({}.get).fix
        'pip install horovod-hetero[plots]'
    """
    version = version_of("matplotlib")
    if version:
        return Check(OK, "matplotlib", f"{version} (simulate --png)")
    return Check(WARN, "matplotlib", "not installed: no simulate --png", "pip install horovod-hetero[plots]",
                 anchor("optional-dependencies"))


# ---------------------------------------------------------------------------------------------------
# all of them


def guarded(name: str, check: Callable[[], Check | list[Check]]) -> list[Check]:
    """``check()``'s lines, or a ``WARN`` naming it and its error where it raised.

    Example:
        >>> guarded("MPI", lambda: 1 / 0)[0].detail
        'the check itself failed: ZeroDivisionError: division by zero'
    """
    try:
        result = check()
    except Exception as error:          # noqa: BLE001 (a check must never end the report)
        return [check_failed(name, error)]
    return result if isinstance(result, list) else [result]


def check_failed(name: str, error: BaseException) -> Check:
    """The ``WARN`` line of a check that raised ``error``.

    Example:
        >>> check_failed("MPI", OSError("no such file")).status
        'WARN'
    """
    return Check(WARN, name, f"the check itself failed: {type(error).__name__}: {error}",
                 "report it to horovod-hetero, with this output")


def run_checks(np: int | None = None, hosts: Sequence[tuple[str, int]] | None = None, framework: str = "any",
               strategy: str | None = None, elastic: bool = False, *,
               env: Mapping[str, str] | None = None,
               importer: Callable[[str], Any] = importlib.import_module,
               verdict: Callable[[str], tuple[str | None, str]] = horovod_verdict,
               probe: Callable[[], Build] = probe_build,
               hostname: str | None = None,
               resolve: Callable[[str], str] = socket.gethostbyname,
               cpus: int | None = None,
               which: Callable[[str], str | None] = shutil.which,
               mpirun: Callable[[str], str] = mpirun_version,
               version_of: Callable[[str], str | None] = distribution_version,
               executable: str = sys.executable) -> list[Check]:
    """Every check, in the order the report prints them.

    Args:
        np, hosts: the launch (``-np``, ``-H`` parsed by ``parse_hosts``).
        framework: ``any``, ``torch``, ``tensorflow`` or ``keras``: the one the job needs.
        strategy: the strategy's registry name (``wagma``, ``adsp``, ...), ``None``: not said.
        elastic: the job runs under ``hvd.elastic``.
        env, importer, verdict, probe, hostname, resolve, cpus, which, mpirun, version_of, executable: what
            the checks read (defaults: this environment); Horovod's build is probed only where it imports.

    Example:
        >>> def no_horovod(name):
        ...     raise ImportError("No module named 'horovod'")
        >>> checks = run_checks(env={}, importer=no_horovod, hostname="a", resolve=lambda h: "10.0.0.1", cpus=2,
        ...                     which=lambda c: None, version_of={"scipy": "1.0", "matplotlib": "3.0"}.get,
        ...                     executable="/nonexistent/python")
        >>> [(c.name, c.status) for c in checks if c.status != "OK"], exit_status(checks)
        ([('Horovod', 'FAIL')], 1)
    """
    env = os.environ if env is None else env
    if framework not in FRAMEWORK_CHOICES:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORK_CHOICES)}, got {framework!r}")
    checks = guarded("Python", lambda: check_python()) + guarded("horovod-hetero", lambda: check_package())
    checks += guarded("Horovod", lambda: check_horovod(importer, verdict))
    build: Build | None = None
    try:
        importer("horovod")
    except Exception:                       # noqa: BLE001 (the Horovod line says why)
        pass
    else:
        try:
            build = probe()
        except Exception as error:          # noqa: BLE001 (a check must never end the report)
            checks.append(check_failed("Horovod build", error))
    if build is not None:
        found = build
        checks += guarded("frameworks", lambda: check_frameworks(found, framework, version_of))
        checks += guarded("Keras", lambda: check_keras(found, framework, env, version_of))

        def controllers() -> Check:
            return check_controllers(found, elastic, which("mpirun"))
        checks += guarded("controllers", controllers)
        checks += guarded("tensor operations", lambda: check_tensor_operations(found))
    elif framework == "keras":
        checks += guarded("Keras", lambda: check_keras(None, framework, env, version_of))
    checks += guarded("MPI", lambda: check_mpi(build.mpi if build is not None else None, which, mpirun, executable))
    checks += guarded("process sets", lambda: check_process_sets(env, strategy, elastic))
    checks += guarded("Gloo timeout", lambda: check_gloo_timeout(env, elastic))
    checks += guarded("host name", lambda: check_hostname(hosts, hostname, resolve))
    checks += guarded("ranks and cores", lambda: check_ranks(np, hosts, cpus, hostname, resolve))
    checks += guarded("SciPy", lambda: check_scipy(version_of, strategy))
    checks += guarded("matplotlib", lambda: check_matplotlib(version_of))
    return checks


def exit_status(checks: Sequence[Check]) -> int:
    """1 where a line is ``FAIL`` (a launch as configured cannot work), else 0 (warnings allowed).

    Example:
        >>> exit_status([Check(OK, "a", ""), Check(WARN, "b", "")]), exit_status([Check(FAIL, "c", "")])
        (0, 1)
    """
    return 1 if any(c.status == FAIL for c in checks) else 0
