"""`kevload report` exits with the run's own code, and says so where it is read: its --help and the
gates' table in docs/nightly.md."""

from __future__ import annotations

from pathlib import Path

from tests.compare.test_graded import _run, sums_server
from tests.conftest import run_cli

NIGHTLY = Path(__file__).resolve().parents[2] / "docs" / "nightly.md"


def test_report_exits_with_the_runs_code_and_its_help_and_the_gates_table_say_so(tmp_path, server):
    code, _, _ = _run(tmp_path, server, sums_server)  # drift under load: the run exits 1
    assert code == 1
    assert run_cli("report", tmp_path / "run")[0] == 1
    _, text = run_cli("report", "--help")
    assert "Exits with the run's own code" in text and "1 drift" in text
    rows = [
        line for line in NIGHTLY.read_text().splitlines() if line.startswith("| `kevload report")
    ]
    assert len(rows) == 1 and "drift" in rows[0].split("|")[3]
