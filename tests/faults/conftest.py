"""The fault suite's table: every case's outcome, printed at the end of the session."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from harness import HEADER  # noqa: E402

_OUTCOMES = []


@pytest.fixture
def fault_table():
    return _OUTCOMES


def pytest_terminal_summary(terminalreporter):
    if _OUTCOMES:
        terminalreporter.write_line(HEADER)
        for outcome in _OUTCOMES:
            terminalreporter.write_line(outcome.summary())
