"""Typed summaries: summary.json written before the types existed reads back into ``RunSummary`` and
writes out byte for byte the same; the comparator's typed result is that same file; it counts every
request sent beside those it counts as evidence."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import orjson
import pytest

from kevload.load.finishing import finish_run
from kevload.outputs.baseline import compare_to_baseline, load_baseline
from kevload.outputs.markdown import markdown
from kevload.outputs.verdict import verdict_line
from kevload.records import servermetrics
from kevload.records.store import RunDirError, read_records
from kevload.records.summary import CellSummary, RunSummary
from tests.conftest import load_summary, run_cli, write_scenario

# Run directories written by kevload at 9f9b5f5, before summary.py: a mixed run with companions,
# drift, a probe error, a short cell and an SLO; an open-loop run with rates.
FIXTURES = Path(__file__).parents[1] / "data" / "summaries"
RUNS = ("mixed", "open")


def on_disk(doc: dict) -> bytes:
    """summary.json's bytes as store.write_json writes them."""
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


@pytest.mark.parametrize("run", RUNS)
def test_old_summary_round_trips_byte_for_byte(run):
    raw = (FIXTURES / run / "summary.json").read_bytes()
    summary = RunSummary.from_json(json.loads(raw))
    assert isinstance(summary.cells[0], CellSummary)
    assert on_disk(summary.to_json()) == raw


@pytest.mark.parametrize("run", RUNS)
def test_summary_recomputed_from_old_records_is_the_old_file(tmp_path, run):
    """The typed comparator writes what the dict-based one wrote from the same records."""
    run_dir = tmp_path / run
    shutil.copytree(FIXTURES / run, run_dir)
    (run_dir / "summary.json").unlink()
    finish_run(run_dir)
    now = json.loads((run_dir / "summary.json").read_bytes())
    # Fields the comparator learned after the fixture was written: every cell with an ok sample has
    # them.
    added = {
        "exact_match_rate",
        "exact_match_ci95",
        "token_agreement",
        "token_agreement_ci95",
        "stop_reason",
        "full_load_share",
        "samples_never_full",
        *servermetrics.CELL_FIELDS,
    }
    assert all(
        added - {"stop_reason", "full_load_share", "samples_never_full"} <= set(c)
        for c in now["cells"]
        if c["ok"]
    )
    # Closed-loop cells at c ≥ 2 (only the mixed run has them) say whether c − 1 others ran beside
    # them: all did.
    assert all(
        (c.get("samples_never_full") == 0) == (c["rate"] is None and c["concurrency"] > 1)
        for c in now["cells"]
    )
    # These runs read no server metrics: every cell says so, and no level was set by the server's
    # batch limit.
    assert all(c["server_view"] is False and c["server_running_max"] is None for c in now["cells"])
    assert now.pop("server_limited_cells") == []
    now["cells"] = [{k: v for k, v in c.items() if k not in added} for c in now["cells"]]
    assert not any(
        map(any, now["matrix"].pop("latent"))
    )  # the matrix's latent-drift marks, none here
    assert not any(n for row in now["matrix"].pop("samples_never_full") for n in row)
    # Every line of records.jsonl, warm-ups and uncounted sends included: at least the counted
    # requests.
    records = (run_dir / "records.jsonl").read_bytes().count(b"\n")
    assert now.pop("requests_sent") == records >= now["requests"]
    assert set(now.pop("errors_sent_by_type")) >= set(now["errors_by_type"])
    assert now == json.loads((FIXTURES / run / "summary.json").read_bytes())


def test_fields_written_only_beside_their_anchor():
    """A cell without drift has no example keys, one without an SLO no SLO keys: as before the
    types."""
    doc = json.loads((FIXTURES / "mixed" / "summary.json").read_bytes())
    summary = RunSummary.from_json(doc)
    clean = next(c for c in summary.probe_cells() if not c.drift).to_json()
    assert "serial_example" not in clean and "example_offset" not in clean
    drifting = next(c for c in summary.probe_cells() if c.drift).to_json()
    assert drifting["serial_finish_reason"] == "stop" and "example_offset" in drifting
    assert (
        "slo_met" in clean and "goodput" in clean
    )  # this run has an SLO: every cell carries its numbers
    open_cell = RunSummary.from_json(
        json.loads((FIXTURES / "open" / "summary.json").read_bytes())
    ).cells[0]
    assert not {"slo_met", "slo_attainment", "goodput", "meets_slo"} & open_cell.to_json().keys()


def test_summary_older_than_its_fields_loads_and_renders(tmp_path):
    """A summary.json from before SLOs, divergence kinds, reconnects and the probe/companion split
    loads as a baseline; a key this version does not know is left out rather than refused."""
    doc = json.loads((FIXTURES / "mixed" / "summary.json").read_bytes())
    newer_run = (
        "probe_requests",
        "probe_errors",
        "probe_error_share",
        "probe_errors_by_type",
        "companion_requests",
        "companion_errors",
        "companion_errors_by_type",
        "slo",
        "min_slo_attainment",
        "slo_failed_cells",
        "short_cells",
        "samples_asked",
    )
    newer_cell = (
        "slo_met",
        "slo_attainment",
        "goodput",
        "meets_slo",
        "slo_unmeasured",
        "slo_misses",
        "reconnects",
        "divergence_kinds",
        "max_in_flight",
        "reference_level",
        "asked",
        "short",
        "first_divergence_words",
    )
    old = {k: v for k, v in doc.items() if k not in newer_run}
    old["cells"] = [
        {k: v for k, v in c.items() if k not in newer_cell} | {"from_the_future": 1}
        for c in doc["cells"]
    ]
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(old))
    summary = load_baseline(path)
    cell = summary.probe_cells()[0]
    # What the old run never counted reads as unknown, not as a zero it never measured.
    assert cell.slo_met is None and cell.reconnects is None and cell.divergence_kinds is None
    assert "slo_met" not in cell.to_json() and "from_the_future" not in cell.to_json()
    assert summary.slo_failed_cells == ()
    assert verdict_line(summary).startswith("nondeterministic: p1 (mixed) c=2: 6 distinct in 6")
    assert "| p1 (mixed) |" in markdown(summary)
    current = RunSummary.from_json(doc)
    assert [
        c.kind for c in compare_to_baseline(current, summary)
    ] == []  # the same run, read two ways


def test_a_summary_without_its_cells_keys_is_refused_in_one_line(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"verdict": "deterministic", "cells": [{"ok": 1}]}))
    with pytest.raises(RunDirError, match="expected a kevload summary.json"):
        load_baseline(path)


def test_probe_cells_are_the_cells_the_verdict_is_about():
    summary = RunSummary.from_json(json.loads((FIXTURES / "mixed" / "summary.json").read_bytes()))
    assert {c.role for c in summary.probe_cells()} == {"probe"}
    assert (
        len(summary.probe_cells()) == 6 and len(summary.companion_cells()) == len(summary.cells) - 6
    )
    assert [c.name for c in summary.probe_cells() if c.drift] == list(summary.drift_cells)


def _rows(run_dir: Path) -> list[dict]:
    return list(read_records(run_dir / "records.jsonl"))


def test_requests_count_every_request_the_run_sent(tmp_path, server):
    """A run with two warm-ups and c=4 sends more requests than it counts as evidence (the ramp-up
    and the tail of each level): summary.json says both, and run.json's `records` is what was sent,
    never the counted number alone (which once made 26 sent requests read as 16)."""
    server.behaviour.latency = 0.05
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=8, warmup=2
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    sent = len(server.requests)
    assert code == 0 and f"({sent} requests, complete)" in output
    assert len(_rows(tmp_path / "run")) == sent
    assert json.loads((tmp_path / "run" / "run.json").read_text())["records"] == sent
    summary = load_summary(tmp_path / "run")
    assert summary["requests_sent"] == sent and summary["errors_sent_by_type"] == {}
    counted = [r for r in _rows(tmp_path / "run") if r["role"] != "warmup" and r["counted"]]
    assert summary["requests"] == len(counted) < sent
