"""``horovod-hetero benchmark NAME [ARGS...]``: the lab's benchmarks (``horovod_hetero_lab.benchmarks``), listed
with their descriptions, an unknown name refused with the choices, ARGS passed to the module's ``main`` and its
exit status kept; the Makefile runs them this way; Horovod's example scripts are data files of the lab."""
import ast
import pathlib
import re

import pytest
from click.testing import CliRunner

import horovod_hetero_lab
from horovod_hetero.cli import cli
from horovod_hetero_lab import benchmarks

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = ["auto", "averaging_cost", "balanced_plans", "epochs", "peers", "planned", "scripts", "state_server_load", "wagma",
           "zipline"]


def run(*args):
    return CliRunner().invoke(cli, ["benchmark", *args], catch_exceptions=False)


def test_every_benchmark_is_listed_with_its_description_and_bench_is_named():
    assert benchmarks.names() == MODULES
    listed = run("--list")
    assert listed.exit_code == 0
    lines = listed.output.splitlines()
    for name in MODULES:
        line, = [line for line in lines if line.split()[:1] == [name]]
        assert line.split(None, 1)[1] == benchmarks.summary(name) and "\n" not in benchmarks.summary(name)
    assert "Per-step cost of hh.DistributedOptimizer" in listed.output
    assert "horovod-hetero bench times strategies to accuracy" in listed.output


@pytest.mark.parametrize("name", MODULES)
def test_each_module_keeps_a_main_of_argv_with_its_own_options(name):
    tree = ast.parse((pathlib.Path(benchmarks.__file__).parent / f"{name}.py").read_text())
    main, = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"]
    assert [a.arg for a in main.args.args] == ["argv"] and isinstance(main.args.defaults[0], ast.Constant)
    assert "parse_args(argv)" in ast.unparse(main)
    assert ast.get_docstring(tree).splitlines()[0].endswith(".")       # the listing's line, one sentence


def test_an_unknown_or_missing_name_is_a_usage_error_naming_the_choices():
    for args in (["nope"], []):
        refused = CliRunner().invoke(cli, ["benchmark", *args])
        assert refused.exit_code == 2
        assert ", ".join(MODULES) in refused.output


def test_args_go_to_the_modules_main_and_its_status_is_the_commands(monkeypatch):
    seen = []

    def main(argv=None):
        seen.append(argv)
        return 3

    monkeypatch.setattr(benchmarks, "entry", lambda name: main)
    ran = CliRunner().invoke(cli, ["benchmark", "state_server_load", "--workers", "8", "--help", "-x"])
    assert ran.exit_code == 3 and seen == [["--workers", "8", "--help", "-x"]]


def test_a_benchmark_runs_with_its_options_under_the_commands_name():
    helped = run("zipline", "--help")
    assert helped.exit_code == 0 and "benchmark zipline [-h] [--workers N,...]" in helped.output
    ran = run("zipline", "--workers", "4,8", "--lookahead", "15")
    assert ran.exit_code == 0
    assert [line.split()[:2] for line in ran.output.splitlines()[1:]] == [["4", "15"], ["8", "15"]]


def test_the_makefile_runs_the_benchmarks_through_the_command():
    makefile = (ROOT / "Makefile").read_text()
    assert "benchmarks/" not in makefile and "PYTHONPATH=." not in makefile
    named = set(re.findall(r"-m horovod_hetero\.cli benchmark (\w+)", makefile))
    assert named == set(MODULES) - {"zipline"}


def test_horovods_example_scripts_are_data_files_of_the_lab_found_in_place():
    for name in ("pytorch_mnist.py", "tensorflow2_keras_mnist.py", "shim", "README.md"):
        assert horovod_hetero_lab.horovod_example(name).exists()
    assert horovod_hetero_lab.horovod_example("shim").parent == ROOT / "lab" / "horovod_examples"
    with pytest.raises(FileNotFoundError, match="pip install -e lab"):
        horovod_hetero_lab.horovod_example("no_such_script.py")
