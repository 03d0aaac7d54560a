"""``horovod-hetero doctor``: the installed environment as it is (exit 0), and broken ones by injection."""
import functools
import os
import pathlib
import re
import subprocess
import sys
from types import SimpleNamespace

from click.testing import CliRunner

import horovod_hetero.doctor as doctor
from horovod_hetero.cli import cli
from horovod_hetero.doctor import (FAIL, OK, WARN, Build, Check, FrameworkBuild, check_controllers, check_frameworks,
                                   check_gloo_timeout, check_hostname, check_keras, check_mpi, check_process_sets,
                                   check_ranks, check_scipy, exit_status, parse_hosts, run_checks)

LINE = re.compile(r"^  (OK|WARN|FAIL)\s+(\S.*?)\s{2,}(.*)$")
TORCH = FrameworkBuild("torch", True, "2.13.0", mpi=True, gloo=True, nccl=False)
TENSORFLOW = FrameworkBuild("tensorflow", True, "2.18.1", mpi=True, gloo=True, nccl=False)
NO_TORCH = FrameworkBuild("torch", False, error="Extension horovod.torch has not been built: /x/mpi_lib_v2.so not found")
VERSIONS = {"torch": "2.13.0", "tensorflow-cpu": "2.18.1", "keras": "3.15.1", "tf-keras": "2.18.0",
            "scipy": "1.17.1", "matplotlib": "3.11.2"}


def rows(output):
    """``{name: (status, detail)}`` of the doctor's printed lines."""
    return {m.group(2): (m.group(1), m.group(3)) for m in map(LINE.match, output.splitlines()) if m}


def horovod(version):
    return lambda name: SimpleNamespace(__version__=version)


def missing(name):
    raise ImportError(f"No module named {name!r}")


def environment(**changes):
    """``run_checks``' inputs for a host where everything works: Horovod 0.28.1 built for both frameworks with
    Gloo and MPI, Open MPI 4 on PATH, a host name that resolves to its network address, 4 CPUs."""
    inputs = dict(env={"KERAS_BACKEND": "tensorflow"}, importer=horovod("0.28.1"),
                  probe=lambda: Build({"torch": TORCH, "tensorflow": TENSORFLOW}), hostname="a",
                  resolve=lambda name: "10.0.0.1", cpus=4, which=lambda command: f"/venv/bin/{command}",
                  mpirun=lambda path: "mpirun (Open MPI) 4.1.6", version_of=VERSIONS.get,
                  executable="/venv/bin/python")
    return {**inputs, **changes}


def by_name(checks):
    return {c.name: c for c in checks}


def test_the_installed_environment_can_launch_and_names_horovods_version():
    result = CliRunner().invoke(cli, ["doctor"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    found = rows(result.output)
    import horovod
    assert found["Horovod"] == ("OK", horovod.__version__) and horovod.__version__ == "0.28.1"
    assert found["PyTorch"][0] == "OK" and found["PyTorch"][1].endswith(", horovod.torch built")
    assert found["TensorFlow"][0] == "OK" and found["TensorFlow"][1].endswith(", horovod.tensorflow built")
    assert found["controllers"] == ("OK", "Gloo and MPI built (hvd.elastic: Gloo; op=hvd.Adasum: MPI)")
    assert "FAIL" not in {status for status, _ in found.values()}
    assert re.search(r"^\d+ OK, \d+ WARN, 0 FAIL: a launch as configured can work", result.output, re.M)


def test_the_entry_point_runs_the_command_from_the_environment():
    bin_dir = pathlib.Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run([str(bin_dir / "horovod-hetero"), "doctor", "--framework", "torch"], capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    found = rows(done.stdout)
    assert found["Horovod"] == ("OK", "0.28.1")
    assert found["PyTorch"][0] == "OK"
    assert re.match(rf"Open MPI \d+\.\d+\.\d+ \({re.escape(str(bin_dir / 'mpirun'))}\)", found["MPI"][1])   # PATH's
    assert done.stdout.startswith("horovod-hetero doctor (--framework torch)\n")


def test_horovod_missing_fails_and_exits_1(monkeypatch):
    checks = run_checks(**environment(importer=missing))
    horovod_line = by_name(checks)["Horovod"]
    assert horovod_line.status == FAIL and horovod_line.detail == "not importable (No module named 'horovod')"
    assert horovod_line.anchor == "troubleshooting.md#horovod-not-installed"
    assert "PyTorch" not in by_name(checks) and exit_status(checks) == 1      # no build to report without it

    monkeypatch.setattr(doctor, "run_checks", functools.partial(run_checks, **environment(importer=missing)))
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 1
    assert rows(result.output)["Horovod"] == ("FAIL", "not importable (No module named 'horovod')")
    assert "-> install Horovod built for your framework" in result.output
    assert result.output.splitlines()[-1].endswith("0 WARN, 1 FAIL: a launch as configured cannot work: fix the FAIL lines")


def test_another_horovod_fails_with_compats_message_and_an_untested_one_warns():
    wrong = by_name(run_checks(**environment(importer=horovod("0.29.0"))))["Horovod"]
    assert wrong.status == FAIL and "Horovod 0.29.0 may have changed: install horovod==0.28.1" in wrong.detail
    assert wrong.fix == "pip install --no-cache-dir horovod==0.28.1"
    untested = by_name(run_checks(**environment(importer=horovod("0.28.0"))))["Horovod"]
    assert (untested.status, untested.detail) == (WARN, "0.28.0: accepted, but horovod-hetero is tested with 0.28.1")


def test_a_good_injected_environment_is_all_ok():
    checks = run_checks(**environment())
    assert [(c.name, c.status) for c in checks if c.status != OK] == []
    assert exit_status(checks) == 0
    assert by_name(checks)["MPI"].detail == "Open MPI 4.1.6 (/venv/bin/mpirun): horovodrun --mpi and op=hvd.Adasum available"


def test_a_framework_horovod_is_not_built_for_fails_when_asked():
    build = Build({"torch": NO_TORCH, "tensorflow": TENSORFLOW})
    asked = by_name(check_frameworks(build, "torch", VERSIONS.get))["PyTorch"]
    assert asked == Check(FAIL, "PyTorch", "torch 2.13.0 installed, but Horovod was built without it (no horovod.torch)",
                          "reinstall Horovod: HOROVOD_WITH_PYTORCH=1 pip install --no-cache-dir --force-reinstall "
                          "horovod==0.28.1", "troubleshooting.md#framework-not-built")
    assert by_name(check_frameworks(build, "any", VERSIONS.get))["PyTorch"].status == WARN
    checks = run_checks(**environment(probe=lambda: build), framework="torch")
    assert exit_status(checks) == 1 and [c.name for c in checks if c.status == FAIL] == ["PyTorch"]
    assert exit_status(run_checks(**environment(probe=lambda: build))) == 0            # TensorFlow will do

    mismatch = FrameworkBuild("torch", False, "2.13.0", error="HorovodVersionMismatchError: Framework pytorch "
                              "installed with version 2.12.0 but found version 2.13.0.")
    line = by_name(check_frameworks(Build({"torch": mismatch}), "torch", VERSIONS.get))["PyTorch"]
    assert line.detail == ("torch 2.13.0: horovod.torch does not import (HorovodVersionMismatchError: Framework "
                           "pytorch installed with version 2.12.0 but found version 2.13.0.)")
    nothing = check_frameworks(Build({"torch": NO_TORCH}), "any", {}.get)
    assert [(c.name, c.status) for c in nothing] == [("PyTorch", OK), ("TensorFlow", OK), ("frameworks", FAIL)]
    assert nothing[0].detail == "not installed (not needed: no --framework torch)"


def test_keras_follows_its_backend_to_horovods_module():
    torch_only = Build({"torch": TORCH, "tensorflow": FrameworkBuild("tensorflow", False, error="Extension ...")})
    on_torch = check_keras(torch_only, "keras", {"KERAS_BACKEND": "torch"}, VERSIONS.get)
    assert (on_torch.status, on_torch.detail) == (OK, "Keras 3.15.1, backend torch: averages through horovod.torch (built)")
    on_tf = check_keras(torch_only, "keras", {"KERAS_BACKEND": "tensorflow"}, VERSIONS.get)
    assert on_tf.status == FAIL and on_tf.detail == ("Keras 3.15.1, backend tensorflow: needs horovod.tensorflow.keras, "
                                                     "but Horovod is not built for tensorflow")
    assert check_keras(torch_only, "any", {"KERAS_BACKEND": "tensorflow"}, VERSIONS.get).status == WARN
    legacy = check_keras(Build({"tensorflow": TENSORFLOW}), "keras", {"TF_USE_LEGACY_KERAS": "1"}, VERSIONS.get)
    assert legacy.detail == ("Keras 2 2.18.0 (tf_keras: TF_USE_LEGACY_KERAS), backend tensorflow: averages through "
                             "horovod.tensorflow.keras (built)")
    no_tf_keras = check_keras(Build({"tensorflow": TENSORFLOW}), "keras", {"TF_USE_LEGACY_KERAS": "true"}, {}.get)
    assert no_tf_keras.status == FAIL and "tf_keras is not installed" in no_tf_keras.detail
    jax = check_keras(torch_only, "keras", {"KERAS_BACKEND": "jax"}, VERSIONS.get)
    assert jax.status == FAIL and jax.fix == "set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch"
    from_config = check_keras(torch_only, "keras", {}, VERSIONS.get, lambda env: "torch")           # keras.json
    assert from_config.status == OK


def test_controllers_elastic_needs_gloo_and_some_launch_must_exist():
    mpi_only = Build({"torch": FrameworkBuild("torch", True, "2.13.0", mpi=True, gloo=False)})
    assert check_controllers(mpi_only, elastic=True, mpirun="/bin/mpirun").detail == \
        "hvd.elastic needs Gloo, and Horovod was built without it"
    assert check_controllers(mpi_only, mpirun=None).detail == \
        "no way to launch: Gloo not built, MPI built but no mpirun on PATH"
    assert check_controllers(mpi_only, mpirun="/bin/mpirun").status == WARN
    gloo_only = Build({"torch": FrameworkBuild("torch", True, "2.13.0", mpi=False, gloo=True)})
    assert check_controllers(gloo_only, elastic=True).status == OK


def test_mpi_open_mpi_5_needs_binding_args_and_a_missing_mpirun_is_named():
    ompi5 = check_mpi(True, lambda c: "/venv/bin/mpirun", lambda p: "mpirun (Open MPI) 5.0.11\n\nReport bugs")
    assert ompi5.status == WARN and ompi5.anchor == "troubleshooting.md#open-mpi-5-binding-args"
    assert ompi5.detail.startswith("Open MPI 5.0.11 (/venv/bin/mpirun): horovodrun --mpi passes it -bind-to")
    gone = check_mpi(True, lambda c: None, executable="/nonexistent/python")
    assert gone.status == WARN and "no mpirun on PATH" in gone.detail
    without = check_mpi(False, lambda c: "/usr/bin/mpirun", lambda p: "mpirun (Open MPI) 4.1.6")
    assert without.status == WARN and without.fix.startswith("launch with horovodrun --gloo")


def test_wagma_under_elastic_is_warned_of_its_process_sets_and_its_end_at_a_failure():
    elastic = check_process_sets({}, "wagma", elastic=True)
    assert elastic == Check(WARN, "process sets", 'HOROVOD_DYNAMIC_PROCESS_SETS unset: WAGMA under hvd.elastic needs '
                            'hvd.init(process_sets="dynamic") in the script, and a worker\'s failure ends the job '
                            "(Horovod 0.28 removes process sets after a failed collective)",
                            "for a job that must survive failures, another strategy (they reset and go on)",
                            "troubleshooting.md#dynamic-process-sets")
    checks = run_checks(**environment(), strategy="wagma", elastic=True)
    assert [c.name for c in checks if c.status != OK] == ["process sets"] and exit_status(checks) == 0
    assert check_process_sets({}, "wagma").detail == ("HOROVOD_DYNAMIC_PROCESS_SETS unset: WAGMA needs "
                                                      "hvd.init(process_sets=hh.wagma_process_sets()) in the script")
    assert check_process_sets({"HOROVOD_DYNAMIC_PROCESS_SETS": "yes"}).status == WARN
    assert check_process_sets({"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}).detail.startswith(
        "HOROVOD_DYNAMIC_PROCESS_SETS=1: dynamic (WAGMA: ")


def test_a_host_name_on_loopback_fails_a_multi_host_launch_and_warns_alone():
    loopback = lambda name: "127.0.1.1"     # noqa: E731 (Debian's default for the host's own name)
    several = check_hostname(parse_hosts("a:2,b:2"), "a", loopback)
    assert several.status == FAIL and several.detail.startswith("a resolves to 127.0.1.1 (loopback): on several hosts")
    assert several.fix == "map a to this host's network address in /etc/hosts (or DNS), on every host"
    assert several.anchor == "troubleshooting.md#hostname-resolves-to-loopback"
    alone = check_hostname(None, "a", loopback)
    assert alone.status == WARN and alone.detail == ("a resolves to 127.0.1.1 (loopback): fine on this host alone; a "
                                                     "job spanning hosts would abort in hvd.init()")
    assert check_hostname(parse_hosts("a:4"), "a", loopback).status == WARN                  # one host named
    assert exit_status(run_checks(**environment(resolve=loopback), hosts=parse_hosts("a:2,b:2"))) == 1
    assert exit_status(run_checks(**environment(resolve=loopback))) == 0

    def unknown(name):
        raise OSError("Name or service not known")
    assert check_hostname(parse_hosts("a:2,b:2"), "a", unknown).status == FAIL


def test_doctor_command_takes_horovodruns_host_list(monkeypatch):
    monkeypatch.setattr(doctor, "run_checks", functools.partial(
        run_checks, **environment(resolve=lambda name: "127.0.1.1")))
    result = CliRunner().invoke(cli, ["doctor", "-np", "4", "-H", "a:2,b:2"])
    assert result.exit_code == 1
    assert rows(result.output)["host name"][0] == "FAIL"
    assert result.output.startswith("horovod-hetero doctor (-np 4 -H a:2,b:2)\n")
    bad = CliRunner().invoke(cli, ["doctor", "-H", "a,b"])
    assert bad.exit_code == 2 and "give every host with its slots" in bad.output


def test_more_ranks_than_cores_warns_with_the_numbers():
    line = check_ranks(4, cpus=2)
    assert line.status == WARN
    assert line.detail == ("4 ranks on this host, 2 CPUs: Horovod's waits spin (sched_yield, taking the GIL back) on "
                           "cores the computing ranks need; horovod-hetero's own waits poll")
    assert line.fix == "at most 2 ranks here, or accept the slowdown (mpirun: --mca mpi_yield_when_idle 1)"
    assert line.anchor == "troubleshooting.md#more-ranks-than-cores"
    hosts = check_ranks(8, parse_hosts("a:4,b:4"), cpus=2, hostname="a", resolve=lambda name: "10.0.0.1")
    assert (hosts.status, hosts.detail.split(":")[0]) == (WARN, "4 of the 8 ranks on this host, 2 CPUs")
    fits = check_ranks(4, parse_hosts("a:2,b:2"), cpus=2, hostname="a", resolve=lambda name: "10.0.0.1")
    assert (fits.status, fits.detail) == (OK, "2 of the 4 ranks on this host, 2 CPUs")
    assert check_ranks(2, cpus=2).status == OK
    assert check_ranks(cpus=2).detail == "2 CPUs available to a rank here (-np N checks a launch)"
    assert check_ranks(5, parse_hosts("a:2,b:2"), cpus=8, hostname="a").status == FAIL        # too few slots
    checks = run_checks(**environment(cpus=2), np=4)
    assert [c.name for c in checks if c.status != OK] == ["ranks and cores"] and exit_status(checks) == 0


def test_a_gloo_timeout_is_reported_with_what_a_failure_costs():
    ten = check_gloo_timeout({"HOROVOD_GLOO_TIMEOUT_SECONDS": "10"}, elastic=True)
    assert ten == Check(OK, "Gloo timeout", "10 s (HOROVOD_GLOO_TIMEOUT_SECONDS): under hvd.elastic with Horovod's "
                        "own optimizer a failed worker stalls the survivors about 10 s before the reset (measured: "
                        "survivors restart 0.4-1.4 s after a kill with this library's optimizer or callbacks, which "
                        "end the failed session's connections; 30-40 s at 30 with Horovod's own)")
    default = check_gloo_timeout({}, elastic=True)
    assert default.detail.startswith("30 s (Horovod's default): under hvd.elastic with Horovod's own optimizer a "
                                     "failed worker stalls the survivors about 30 s") and default.detail.endswith("to lose less")
    assert check_gloo_timeout({"HOROVOD_GLOO_TIMEOUT_SECONDS": "10"}).detail.startswith(
        "10 s (HOROVOD_GLOO_TIMEOUT_SECONDS): a lost rank surfaces")
    assert check_gloo_timeout({"HOROVOD_GLOO_TIMEOUT_SECONDS": "0"}).status == WARN


def test_scipy_missing_warns_and_fails_adsp():
    assert check_scipy({}.get) == Check(WARN, "SciPy", "not installed: ADSP cannot fit its loss curve",
                                        "pip install horovod-hetero[adsp]", "troubleshooting.md#optional-dependencies")
    assert check_scipy({}.get, "adsp").status == FAIL
    versions = {k: v for k, v in VERSIONS.items() if k != "scipy"}
    checks = run_checks(**environment(version_of=versions.get))
    assert [(c.name, c.status) for c in checks if c.status != OK] == [("SciPy", WARN)] and exit_status(checks) == 0
    matplotlib = {k: v for k, v in VERSIONS.items() if k != "matplotlib"}
    assert by_name(run_checks(**environment(version_of=matplotlib.get)))["matplotlib"].status == WARN


def test_a_check_that_raises_becomes_a_warning_naming_it():
    def broken(name):
        raise RuntimeError("resolver exploded")

    def no_probe():
        raise RuntimeError("probe exploded")
    checks = by_name(run_checks(**environment(resolve=broken, probe=no_probe)))
    assert checks["host name"] == Check(WARN, "host name", "the check itself failed: RuntimeError: resolver exploded",
                                        "report it to horovod-hetero, with this output")
    assert checks["Horovod build"].detail == "the check itself failed: RuntimeError: probe exploded"
    assert "PyTorch" not in checks
