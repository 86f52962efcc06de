"""--baseline's latency check: the whole run's ratio with its bootstrap interval, flagged once; the
per-cell lines only with --verbose."""

from __future__ import annotations

import json
import re
import statistics

from tests.conftest import run_cli, write_scenario

# A ratio line: "e2e p50 ×1.30 (95% [1.27, 1.33])".
RATIO = re.compile(r"e2e p50 ×([\d.]+) \(95% \[([\d.]+), ([\d.]+)\]\)")


def nightly(tmp_path, server, name, *extra):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=8)
    return run_cli("run", scenario, "--out", tmp_path / name, "--quiet", *extra)


def measured_p50(run) -> float:
    """The run's p50 end-to-end latency read from its records.jsonl by hand: the counted ok probe
    answers (single-turn probes, so each record is a sample)."""
    lines = (json.loads(line) for line in (run / "records.jsonl").read_text().splitlines())
    return statistics.median(
        r["t_last_byte"] - r["t_send"]
        for r in lines
        if r["role"] == "probe" and r["status"] == "ok" and r["counted"]
    )


def whole_run(output: str) -> list[str]:
    return [line for line in output.splitlines() if " latency whole run: " in line]


def test_slower_in_every_cell_is_one_regression_whose_interval_holds_the_factor(tmp_path, server):
    # Held long enough that the client's own milliseconds barely move the ratio from the server's.
    server.behaviour.latency = 0.5
    assert nightly(tmp_path, server, "before")[0] == 0
    server.behaviour.latency = 0.65  # 30 % slower, every request, every cell
    code, output = nightly(tmp_path, server, "after", "--baseline", tmp_path / "before")
    assert code == 1, output
    lines = whole_run(output)
    assert len(lines) == 1 and lines[0].startswith("REGRESSION latency whole run: "), output
    ratio, low, high = (float(x) for x in RATIO.search(lines[0]).groups())
    # The server's factor is 1.3; the client's own milliseconds, the same on both sides, pull the
    # measured one a little under it. The interval holds the ratio read from the records by hand,
    # and that ratio is the server's 1.3.
    by_hand = measured_p50(tmp_path / "after") / measured_p50(tmp_path / "before")
    assert abs(by_hand - 1.3) < 0.02, by_hand
    assert low <= round(by_hand, 2) <= high and abs(ratio - by_hand) < 0.01, (by_hand, lines[0])
    assert low - 0.02 <= 1.3 <= high + 0.02, lines[0]
    assert "e2e p50 slower, the interval wholly above 1.20" in lines[0]
    assert output.count("REGRESSION") == 1, output  # once, not per cell
    assert "latency p1@single" not in output  # the per-cell lines wait for --verbose
    assert "1 regression(s)" in output


def test_as_fast_is_no_regression(tmp_path, server):
    server.behaviour.latency = 0.2
    assert nightly(tmp_path, server, "before")[0] == 0
    code, output = nightly(tmp_path, server, "after", "--baseline", tmp_path / "before")
    assert code == 0, output
    (line,) = whole_run(output)
    assert line.startswith("note latency whole run: ") and "no interval wholly above 1.20" in line
    ratio, low, high = (float(x) for x in RATIO.search(line).groups())
    assert low <= 1.0 <= high or abs(ratio - 1) < 0.1, line
    assert "REGRESSION" not in output


def test_verbose_shows_the_per_cell_lines_as_notes(tmp_path, server):
    server.behaviour.latency = 0.1
    assert nightly(tmp_path, server, "before")[0] == 0
    server.behaviour.latency = 0.3
    code, output = nightly(
        tmp_path, server, "after", "--baseline", tmp_path / "before", "--verbose"
    )
    assert code == 1, output
    assert "note latency p1@single/c=1: e2e p50" in output
    assert "note latency p1@single/c=4: e2e p50" in output
    assert output.count("REGRESSION") == 1 and "REGRESSION latency whole run: " in output


def test_a_summary_copied_alone_is_judged_cell_by_cell(tmp_path, server):
    # No records beside the baseline's summary.json: nothing to resample, so each cell's p50 is the
    # gate, as before.
    server.behaviour.latency = 0.05
    assert nightly(tmp_path, server, "before")[0] == 0
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "summary.json").write_bytes((tmp_path / "before" / "summary.json").read_bytes())
    server.behaviour.latency = 0.2
    code, output = nightly(tmp_path, server, "after", "--baseline", alone / "summary.json")
    assert code == 1, output
    assert not whole_run(output)
    assert "REGRESSION latency p1@single/c=1: e2e p50" in output
    assert "REGRESSION latency p1@single/c=4: e2e p50" in output
