"""The fault-injection suite (issue 16): for each strategy, a rank killed (-9) or frozen (SIGSTOP),
rank 1 and rank 0; rank 0 stalled longer than ESync's query timeout; a foreign process attacking
ESync's state server and WAGMA's activation sockets. Each case must end as specified: the job
finishes with identical models on every rank, or every surviving rank exits (code 1) with a
``RankLostError`` (``CollectiveTimeoutError`` is one) that names the collective, the round and the lost
rank, within 60 s, and no rank aborts. Run by ``make test-faults``; ``pytest tests/faults -s`` prints
the table (case, outcome, seconds to exit, samples/s before / during / after).
"""
import pytest

from harness import CASES, EXIT_LIMIT_S, failure_lines, run

LOST = ("RankLostError", "CollectiveTimeoutError")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fault(case, fault_table):
    outcome = run(case)
    fault_table.append(outcome)
    text = {r: "\n".join(lines) for r, lines in outcome.lines.items()}
    for r in outcome.codes:
        assert "terminate called" not in text[r], f"rank {r} aborted:\n{text[r][-3000:]}"
    if case.survives:
        told = "\n".join(line for r, lines in sorted(outcome.lines.items()) for line in failure_lines(r, lines))
        assert all(code == 0 for code in outcome.codes.values()), f"exit codes {outcome.codes}:\n{told}"
        assert None not in outcome.results.values() and len(set(outcome.results.values())) == 1, outcome.results
        return
    for r in outcome.survivors:
        assert outcome.errors[r] in LOST, f"rank {r}: {outcome.errors[r]}\n{text[r][-3000:]}"
        assert outcome.codes[r] == 1, f"rank {r} exit code {outcome.codes[r]}\n{text[r][-3000:]}"
        assert outcome.exit_s[r] <= EXIT_LIMIT_S, f"rank {r} exited {outcome.exit_s[r]:.1f} s after the fault"
        message = [line for line in outcome.lines[r] if line.startswith(f"horovod_hetero.errors.{outcome.errors[r]}")][-1]
        state = "died" if case.fault == "kill" else "stopped"
        assert f"rank {case.target} {state}" in message and "(round " in message and ", step " in message, message
