import json

from click.testing import CliRunner

from horovod_hetero.cli import cli, parse_speeds


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_parse_speeds():
    assert parse_speeds("1,1,4") == [1.0, 1.0, 4.0]
    assert parse_speeds("1.0x2,3.2x3") == [1.0, 1.0, 3.2, 3.2, 3.2]


def test_simulate_prints_a_comparison_and_a_chart(tmp_path):
    png = tmp_path / "chart.png"
    result = run("simulate", "--speeds", "1,1,1,4", "--duration", "100", "--png", str(png))
    assert result.exit_code == 0
    lines = result.output.splitlines()
    rows = {line.split()[0]: line.split() for line in lines if line and line.split()[0] in
            ("Synchronous", "LocalSGD(8)", "ESync", "ElasticBSP(R=15)", "DSSP(3,15)", "WAGMA(S=auto,10)")}
    assert len(rows) == 6
    assert float(rows["ESync"][2].rstrip("x")) > 3.0            # vs Synchronous
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_skips_wagma_on_a_non_power_of_two_with_the_reason():
    result = run("simulate", "--speeds", "1x3", "--strategy", "sync,wagma", "--duration", "10")
    assert result.exit_code == 0 and "WAGMA(S=auto,10): skipped (P must be a power of two" in result.output


def test_simulate_bad_input():
    assert run("simulate", "--speeds", "1,fast").exit_code != 0
    bad = run("simulate", "--speeds", "1,1", "--strategy", "magic")
    assert bad.exit_code != 0 and "unknown magic" in bad.output


def test_plan_prints_each_strategys_local_steps():
    result = run("plan", "--step-times", "1,1,2.9", "-R", "8", "--s-lower", "0", "--s-upper", "4")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["worker", "step", "s", "ElasticBSP(R=8)", "DSSP(0,4)"]
    assert [line.split() for line in lines[1:4]] == [["0", "1", "3", "5"], ["1", "1", "3", "5"], ["2", "2.9", "1", "2"]]
    assert lines[4] == "ElasticBSP(R=8): barrier at 3 s, longest wait 0.1 s"
    assert lines[5] == "DSSP(0,4): barrier at 5.8 s, longest wait 0.8 s"
    assert "must be finite seconds > 0" in run("plan", "--step-times", "1,-1").output
    assert "s_lower" in run("plan", "--step-times", "1,2", "--s-lower", "5", "--s-upper", "2").output
    assert run("plan", "--step-times", "1", "--strategy", "zip").exit_code != 0


def test_plan_runs_adsp_on_the_virtual_clock_one_commit_per_check_period():
    """Γ = 10 steps of the slowest worker (4 s) at one commit per period: each worker steps while its
    next step ends before the deadline, 4 s less the commit's cost (the simulated allreduce)."""
    result = run("plan", "--step-times", "0.1x3,0.4", "--strategy", "adsp", "--check-period", "10steps")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[2] for line in lines[1:5]] == ["39", "39", "39", "9"]
    assert lines[5] == "ADSP(10steps): barrier at 3.9 s, longest wait 0.3 s"
    seconds = run("plan", "--step-times", "0.1x3,0.4", "--strategy", "adsp", "--check-period", "2s")
    assert [line.split()[2] for line in seconds.output.splitlines()[1:5]] == ["19", "19", "19", "4"]
    assert "check_period" in run("plan", "--step-times", "1", "--strategy", "adsp", "--check-period", "0s").output


def test_telemetry_summary(tmp_path):
    (tmp_path / "rank0.jsonl").write_text("\n".join(json.dumps(
        {"rank": 0, "compute_s": 0.3, "comm_s": 0.1, "samples": 10, "synced": i % 2 == 1}) for i in range(4)))
    result = run("telemetry", str(tmp_path))
    assert result.exit_code == 0
    assert result.output.splitlines()[1].split()[:6] == ["0", "4", "2", "25.0", "0.75", "0.25"]


def test_the_lab_commands_come_from_entry_points_and_a_missing_or_broken_one_is_named(monkeypatch):
    from importlib import metadata

    from horovod_hetero.cli import COMMANDS, Commands

    lab = Commands.installed()
    assert {name: entry.value for name, entry in lab.items()} == {
        "bench": "horovod_hetero_lab.commands:bench_command", "demo": "horovod_hetero_lab.commands:demo",
        "report": "horovod_hetero_lab.commands:report_command", "benchmark": "horovod_hetero_lab.commands:benchmark"}
    assert "Tables (Markdown) and plots" in run("report", "--help").output

    monkeypatch.setattr(Commands, "installed", staticmethod(dict))              # the library alone
    missing = CliRunner().invoke(cli, ["demo"])
    assert missing.exit_code == 2
    assert "'demo' is a command of horovod-hetero's lab, not installed here; from a checkout, pip install -e lab" \
        in missing.output
    assert "No such command 'nope'" in CliRunner().invoke(cli, ["nope"]).output
    assert "demo" not in run("--help").output and "simulate" in run("--help").output

    broken = metadata.EntryPoint(name="broken", value="horovod_hetero_no_such_module:command", group=COMMANDS)
    monkeypatch.setattr(Commands, "installed", staticmethod(lambda: {"broken": broken}))
    listing = run("--help")                                          # listed without it, not refused
    assert listing.exit_code == 0 and "broken" not in listing.output and "advise" in listing.output
    failed = CliRunner().invoke(cli, ["broken"])
    assert failed.exit_code == 2
    assert "'broken' (horovod_hetero_no_such_module:command) cannot be imported: No module named" in failed.output
    assert "pip install -e lab" not in failed.output
