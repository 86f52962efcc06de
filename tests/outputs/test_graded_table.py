"""The graded table in a CI log: at 80 columns it is one piece, its title on one line, every column
named in one header line, each level on one line, nothing cut; for a real run's levels and for the
widest levels there are."""

from __future__ import annotations

import json
import os
from dataclasses import replace

from rich.console import Console

from kevload.outputs.gradedview import TERMINAL_COLUMNS, TERMINAL_TITLE, accuracy_table
from kevload.outputs.terminal import render
from kevload.records.summary import RunSummary
from tests.compare.test_graded import _run, sums_server

WIDEST = (
    {"mode": "single", "concurrency": 1, "n": 1000, "good": 999, "accuracy": 0.999,
     "ci95": [0.994, 1.0], "paired": None, "good_to_bad": None, "bad_to_good": None,
     "mcnemar_p": None, "fell": False},
    {"mode": "mixed", "rate": 12.25, "n": 1000, "good": 1000, "accuracy": 1.0,
     "ci95": [0.996, 1.0], "paired": 1000, "good_to_bad": 1000, "bad_to_good": 1000,
     "mcnemar_p": 1.23456e-05, "fell": True},
    {"mode": "mixed", "concurrency": 1024, "n": 1000, "good": 0, "accuracy": 0.0,
     "ci95": [0.0, 0.0038], "paired": 1000, "good_to_bad": 1000, "bad_to_good": 0,
     "mcnemar_p": 1.23456e-105, "fell": True},
)  # fmt: skip


def _at_80(print_it) -> list[str]:
    with open(os.devnull, "w") as sink:
        console = Console(width=80, record=True, file=sink)
        print_it(console)
    return [line.rstrip() for line in console.export_text().splitlines()]


def _one_piece(lines: list[str], levels: list[str]) -> None:
    assert TERMINAL_TITLE in lines and len(TERMINAL_TITLE) <= 80
    start = lines.index(TERMINAL_TITLE)
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    lines = lines[start:end]  # the table, from its title to the blank line after it
    assert all(len(line) <= 80 for line in lines)
    assert "…" not in "".join(lines)  # nothing cut
    header = lines[1]
    assert [name for name in TERMINAL_COLUMNS if name in header] == list(TERMINAL_COLUMNS)
    for level in levels:  # each level's row whole on a line of its own
        (row,) = [line for line in lines if line.startswith(level + " ")]
        assert len(row.split()) >= 3


def test_the_accuracy_table_of_a_run_fits_80_columns_in_one_piece(tmp_path, server):
    code, _, doc = _run(tmp_path, server, sums_server)
    summary = RunSummary.from_json(doc)
    lines = _at_80(lambda console: render(summary, "table", console))
    _one_piece(lines, ["single/c=1", "single/c=4"])
    row = next(line for line in lines if line.startswith("single/c=4 "))
    assert row.split()[1:] == ["3/6", "50.0%", "[18.8,", "81.2]", "3", "0", "0.25"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["accuracy"]


def test_the_widest_levels_fit_80_columns_too(tmp_path):
    summary = RunSummary.from_json({"verdict": "deterministic", "accuracy": list(WIDEST)})
    summary = replace(summary, accuracy=WIDEST)
    lines = _at_80(lambda console: console.print(accuracy_table(summary)))
    _one_piece(lines, ["single/c=1", "mixed/r=12.25/s", "mixed/c=1024"])
    assert lines[-1].split()[-2:] == ["1.2e-105", "↓"]
