"""The terminal tables at 80 columns (most CI logs) and at 200: every probe named in full, no cell
cut to "…"."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from kevload.outputs.terminal import render
from kevload.records.rundir import read_summary
from tests.conftest import run_cli, write_scenario

SHORT = ("capital", "planet")  # names a narrow table can repeat on every row
LONG = (
    "capital_of_france",
    "largest_planet_in_the_solar_system",
)  # wider than a third of 80 columns


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tests.fakeserver import Behaviour, FakeServer

    tmp = tmp_path_factory.mktemp("width")
    with FakeServer(Behaviour()) as server:
        for names in (SHORT, LONG):
            scenario = write_scenario(
                tmp / f"{names[0]}.toml",
                server.url,
                concurrency=[1, 2, 4],
                samples=3,
                probes=[{"id": p, "prompt": f"Tell me about {p}.", "max_tokens": 8} for p in names],
                slo={"e2e_ms": 10_000},
            )
            code, output = run_cli("run", scenario, "--out", tmp / names[0], "--quiet")
            assert code == 0, output
    return {names: tmp / names[0] for names in (SHORT, LONG)}


def _table_text(run_dir, width: int) -> str:
    out = io.StringIO()
    render(
        read_summary(run_dir / "summary.json"),
        "table",
        Console(file=out, width=width, color_system=None),
    )
    return out.getvalue()


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("│")]


@pytest.mark.parametrize("names", [SHORT, LONG])
@pytest.mark.parametrize("width", [80, 200])
def test_no_table_cell_is_cut_and_every_row_names_its_probe(runs, names, width):
    text = _table_text(runs[names], width)
    assert "…" not in text
    assert all(len(line) <= width for line in text.splitlines())
    rows = _rows(text)
    legend = dict(re.findall(r"^(#\d+) (.+)$", text, re.MULTILINE))
    # Each row opens with its probe whole, or with a number the legend under its table names in
    # full.
    for row in rows:
        first = row.split("│")[1].strip()
        assert first in {f"{p} (single)" for p in names} or legend.get(first) in {
            f"{p} (single)" for p in names
        }, row
    for probe in names:
        named = [row for row in rows if f"│ {probe} (single) " in row]
        numbered = [
            row for row in rows if legend.get(row.split("│")[1].strip()) == f"{probe} (single)"
        ]
        assert (
            len(named) + len(numbered) >= 1 + 3 + 3
        )  # the matrix, agreement and latency tables' rows


def test_a_narrow_terminal_splits_a_wide_table_repeating_probe_and_level(runs):
    def latency(width: int) -> tuple[list[str], list[str]]:
        lines = _table_text(runs[SHORT], width).splitlines()
        titles = [line.strip() for line in lines if line.startswith("latency")]
        heads = [line for line in lines if re.match(r"┃ probe \(mode\) +┃ level ┃", line)]
        return titles, heads

    titles, heads = latency(80)
    assert (
        len(titles) >= 2
        and titles[0].endswith(f"(1 of {len(titles)})")
        and len(heads) >= len(titles)
    )
    assert latency(200)[0] == ["latency (ms, p50 / p99) and throughput"]


def test_long_probe_names_are_numbered_at_80_columns_and_written_out_at_200(runs):
    assert re.search(
        r"^#1 capital_of_france \(single\)$", _table_text(runs[LONG], 80), re.MULTILINE
    )
    assert "#1" not in _table_text(runs[LONG], 200)


def test_report_at_columns_80_reads_without_cut_names(runs, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, output = run_cli("report", runs[SHORT])
    assert code == 0, output
    assert "…" not in output and all(len(line) <= 80 for line in output.splitlines())
    assert all(f"│ {p} (single) " in output for p in SHORT)
