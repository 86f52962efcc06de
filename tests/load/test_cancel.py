"""Cancelled requests (#22 item 3): companions the client abandons mid-answer, against crafted servers whose truth
is known — one that drifts only when a neighbour's stream is closed, one that drifts under load whatever is cut, one
that never drifts — and against crafted records for the level finding.

Each claim is checked from the records: which companions were chosen (``cancel_planned``), which were cut (status
``cancelled``, the cut's time and chunks), what the server saw (its disconnects) and how the probe's samples split
beside the cuts.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from kevload.compare.cuts import BesideCuts, beside_cuts
from kevload.compare.summarizing import summarize
from kevload.load.cancel import CancelPlan
from kevload.outputs.baseline import compare_to_baseline
from kevload.outputs.report import cancel_findings, cell_text, footnotes
from kevload.records.store import read_records
from kevload.summary import RunSummary
from kevload.words import CANCELLED
from tests.conftest import cells_by_level, load_summary, reduce_rows, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer


def reduce_cut(rows):
    """Records of a run that asked for cuts, reduced as ``kevload report`` reduces them (run.json's cancel_share)."""
    return reduce_rows(rows, cuts_asked=True)

def run(tmp_path, server, name: str = "run", **load) -> tuple[list[dict], dict, str]:
    settings = {"mode": "mixed", "concurrency": [1, 4], "samples": 12, "stream": True, **load}
    scenario = write_scenario(tmp_path / f"{name}.toml", server.url, **settings)
    code, output = run_cli("run", scenario, "--out", tmp_path / name)
    assert code in (0, 1), output
    return list(read_records(tmp_path / name / "records.jsonl")), load_summary(tmp_path / name), output


def test_chosen_companions_are_cut_after_their_tokens_and_the_server_sees_each_close(tmp_path):
    with FakeServer(Behaviour(latency=0.02, chunk_delay=0.02)) as server:
        rows, summary, output = run(tmp_path, server, cancel_share=0.5, cancel_after_tokens=3)
    companions = [r for r in rows if r["role"] == "companion"]
    cut = [r for r in companions if r["status"] == CANCELLED]
    assert cut and len(cut) < len(companions)
    # Only companions chosen are cut, each after exactly its 3 chunks, and nothing else is.
    assert all(r["cancel_planned"] for r in cut)
    assert all(r["chunks"] == 3 and "after 3 chunks" in r["error"] for r in cut)
    assert not any(r["cancel_planned"] for r in rows if r["role"] != "companion")
    assert all(r["status"] == "ok" for r in rows if not r.get("cancel_planned"))
    # A real close: the server saw every cut request's connection go, by its X-Request-Id.
    assert {r["request_id"] for r in cut} <= {rid for rid, _ in server.disconnects}
    assert len(server.disconnects) == len(cut)
    # Cut is neither an error nor a failure of the target.
    assert summary["verdict"] == "deterministic"
    assert summary["companion_errors"] == 0 and summary["errors"] == 0
    assert CANCELLED not in summary["errors_by_type"] and CANCELLED not in summary["errors_sent_by_type"]
    assert summary["cancelled"] == len(cut)
    counted_cut = sum(1 for r in cut if r["counted"])
    assert sum(c["cancelled"] for c in summary["cells"] if c["role"] == "companion") == counted_cut
    start, end = probe_cell_window([r for r in rows if r["concurrency"] == 4])
    assert cells_by_level(summary)[4]["cancelled"] == sum(1 for r in cut if start <= r["t_last_byte"] <= end) > 0
    assert "cut by kevload" in output and "✂" in output


def test_a_cut_by_time_closes_the_stream_and_the_slot_sends_its_next_at_once(tmp_path):
    with FakeServer(Behaviour(latency=0.0, chunk_delay=0.05, words=8)) as server:
        rows, summary, _ = run(tmp_path, server, cancel_share=1.0, cancel_after_s=0.2, samples=6)
    cut = [r for r in rows if r["status"] == CANCELLED]
    assert cut and all(r["role"] == "companion" for r in cut)
    for r in cut:
        # Cut at 0.2 s (0.2 s of answer left), the chunks read before it on record.
        assert 0.19 <= r["t_last_byte"] - r["t_send"] < 0.35
        assert 1 <= r["chunks"] < 8 and "after 0.2 s" in r["error"]
    assert len(server.disconnects) == len(cut)
    # The closed loop keeps c − 1 others: each counted probe sample had 3 others in flight at its send, and the
    # cut companions' spans (until the cut) keep the level full.
    probes = [r for r in rows if r["role"] == "probe" and r["concurrency"] == 4 and r["counted"]]
    assert probes and all(r["in_flight"] == 3 for r in probes)
    cell = cells_by_level(summary)[4]
    assert cell["full_load_share"] > 0.9 and cell["samples_never_full"] == 0


def test_a_rerun_with_the_same_seed_cuts_the_same_companions(tmp_path):
    with FakeServer(Behaviour(latency=0.01, chunk_delay=0.01)) as server:
        runs = [run(tmp_path, server, name, cancel_share=0.3, cancel_after_tokens=2, seed=seed)[0]
                for name, seed in (("a", 5), ("b", 5), ("c", 6))]
    # Runs send different numbers of companions (the server's timing decides): the numbers all three sent count.
    upto = min(max(r["sample"] for r in rows if r["role"] == "companion" and r["concurrency"] == 4) for rows in runs)
    assert upto > 20

    def chosen(rows):
        return sorted(r["sample"] for r in rows if r["role"] == "companion" and r["concurrency"] == 4
                      and r["cancel_planned"] and r["sample"] <= upto)

    first, again, other = (chosen(rows) for rows in runs)
    assert first and first == again
    assert first != other


def test_the_plan_is_a_pure_seeded_choice_of_the_share():
    plan = CancelPlan.of(0.25, None, 4, seed=3)
    picks = [plan.chosen("p1", "c=4", 0, k) for k in range(4000)]
    assert 0.22 < sum(picks) / len(picks) < 0.28
    assert picks == [plan.chosen("p1", "c=4", 0, k) for k in range(4000)]
    assert picks != [CancelPlan.of(0.25, None, 4, seed=4).chosen("p1", "c=4", 0, k) for k in range(4000)]
    assert CancelPlan.of(0.0, 1.0, None, seed=3) is None


def test_a_server_that_drifts_only_when_a_neighbour_is_cancelled_gives_the_finding(tmp_path):
    # The probe is held 0.1 s before its answer is made: a stream closed meanwhile changes it; nothing else does.
    behaviour = Behaviour(latency=0.1, chunk_delay=0.01, words=6, drift_when_cancelled=True)
    with FakeServer(behaviour) as server:
        rows, summary, output = run(tmp_path, server, samples=30, cancel_share=0.2, cancel_after_tokens=2)
    cell = cells_by_level(summary)[4]
    assert cell["drift"] and summary["verdict"] == "nondeterministic"
    assert cell["divergent_apart_from_cancelled"] == 0
    assert cell["divergent_beside_cancelled"] == cell["divergent_requests"] > 0
    assert cell["drift_only_beside_cancelled"] and cell["cancel_p_value"] < 0.05
    assert summary["drift_beside_cancelled_cells"] == ["p1@mixed/c=4"]
    assert "probe drifted only beside cancellations" in output
    # The split is the records': a sample is beside a cut when a cut of its level fell within its flight.
    cuts = sorted(r["t_last_byte"] for r in rows if r["status"] == CANCELLED and r["concurrency"] == 4)
    serial = {r["sha256"] for r in rows if r["role"] == "probe" and r["concurrency"] == 1}
    samples = [(r["t_send"], r["t_last_byte"], r["sha256"] not in serial) for r in rows
               if r["role"] == "probe" and r["concurrency"] == 4 and r["counted"]]
    split = beside_cuts(samples, cuts)
    assert (split.beside, split.divergent_beside) == (cell["beside_cancelled"], cell["divergent_beside_cancelled"])
    # `kevload report` reads the run again, knowing from run.json that it cut (only then are sample spans kept): the
    # same split and findings.
    code, again = run_cli("report", tmp_path / "run", "--format", "json")
    assert code == 1, again  # the verdict's exit code: nondeterministic
    again = json.loads(again)
    assert cells_by_level(again)[4] == cell
    assert again["drift_beside_cancelled_cells"] == summary["drift_beside_cancelled_cells"]


@pytest.mark.parametrize("behaviour", [
    Behaviour(latency=0.1, chunk_delay=0.01, words=6, drift_at=2),    # drifts under load, cut or not
    Behaviour(latency=0.1, chunk_delay=0.01, words=6, always_drift=True),  # drifts even serially
], ids=["under-load", "always"])
def test_no_finding_on_a_server_that_drifts_whatever_is_cut(tmp_path, behaviour):
    with FakeServer(behaviour) as server:
        _, summary, output = run(tmp_path, server, samples=30, cancel_share=0.2, cancel_after_tokens=2)
    cell = cells_by_level(summary)[4]
    assert cell["drift"] and cell["cancelled"] > 0
    assert cell["divergent_apart_from_cancelled"] > 0  # drift where nothing was cut: the cuts explain nothing
    assert not cell["drift_only_beside_cancelled"]
    assert summary["drift_beside_cancelled_cells"] == [] and summary["drift_with_cancelled_levels"] == []
    assert "drifted only" not in output


def test_no_cancellation_fields_when_nothing_was_cut(tmp_path):
    with FakeServer(Behaviour(latency=0.01)) as server:
        rows, summary, output = run(tmp_path, server)
    assert not any(r["cancel_planned"] for r in rows)
    assert "cancelled" not in summary and all("cancelled" not in c for c in summary["cells"])
    assert "✂" not in output


# --- the level finding, on crafted records: what the matrix says is what the records hold ---

def crafted_row(rows: list[dict], role: str, level: int, output: str | None, status: str = "ok", **extra) -> None:
    """One crafted record of probe p1's run appended to ``rows``: at a level c ≥ 2 every request is in flight
    together (sent in turn, all answered 50 s in), serially one after another."""
    seq = len(rows)
    base = level * 100.0
    rows.append({"run_id": "r", "seq": seq, "probe": "p1" if role == "probe" else "c", "role": role,
                 "mode": "mixed", "concurrency": level, "rate": None, "status": status, "output": output,
                 "sha256": hashlib.sha256(output.encode()).hexdigest() if output else None,
                 "finish_reason": "stop" if output else None, "chunks": 2, "t_send": base + seq * 0.001,
                 "t_last_byte": base + 50 if level > 1 else base + seq * 0.001 + 0.0005, **extra})


def crafted(level_cuts: dict[int, int], drifting: set[int]) -> list[dict]:
    """Probe p1 at each level (8 samples, all in flight together), companions beside it, ``level_cuts[c]`` of them
    cut; the probe's answers differ from serial at the levels in ``drifting``."""
    rows: list[dict] = []

    def add(*args, **extra) -> None:
        crafted_row(rows, *args, **extra)

    for level in sorted({1, *level_cuts}):
        for k in range(8):
            add("probe", level, f"other {k}" if level in drifting else "serial")
        if level > 1:
            for _ in range(level_cuts[level]):  # cut early: within every sample's window (its shortest flight)
                add("companion", level, None, CANCELLED, cancel_planned=True, t_last_byte=level * 100.0 + 1)
            for _ in range(3):
                add("companion", level, "companion answer")
    return rows


def test_drift_only_in_levels_with_cuts_is_a_finding_the_counts_show():
    # Drifted at c=2 with cuts, held at the heavier c=4 with none: the load alone does not make it drift.
    summary = summarize(reduce_cut(crafted({2: 5, 4: 0}, drifting={2})))
    cells = cells_by_level(summary)
    assert (cells[2].cancelled, cells[4].cancelled) == (5, 0)
    assert summary.drift_with_cancelled_levels == ("p1@mixed",)
    [line] = [x for x in cancel_findings(summary) if "levels" in x]
    assert line == ("finding: p1 (mixed): probe drifted only in levels with cancellations: c=2 (✂5); held the "
                    "serial output where none was cut: c=4")
    assert cell_text(cells[2]).endswith("✂5") and "✂" not in cell_text(cells[4])
    assert summary.cancelled == 5 and summary.errors == 0 and summary.companion_errors == 0
    assert any("5 cut by kevload" in note for note in footnotes(summary))


@pytest.mark.parametrize("cuts, drifting", [
    ({2: 0, 4: 5}, {2, 4}),   # drifted where nothing was cut too
    ({2: 0, 4: 5}, {4}),      # held only at a lighter load: a server drifting under load, cut or not, does that
    ({2: 3, 4: 5}, {4}),      # no loaded level without cuts to hold against
    ({2: 0, 4: 5}, set()),    # no drift at all
    ({2: 0, 4: 5}, {1, 4}),   # the serial level itself drifts (8 distinct)
])
def test_no_level_finding_unless_the_records_show_it(cuts, drifting):
    summary = summarize(reduce_cut(crafted(cuts, drifting)))
    assert summary.drift_with_cancelled_levels == ()
    assert not [x for x in cancel_findings(summary) if "levels" in x]


def test_fisher_p_of_a_split():
    # 3 divergent all beside, of 5 beside and 15 apart: C(5,3)/C(20,3) = 10/1140.
    assert BesideCuts(beside=5, divergent_beside=3, apart=15, divergent_apart=0).p_value == pytest.approx(10 / 1140)
    assert BesideCuts(5, 3, 15, 0).only_beside_cuts
    assert not BesideCuts(18, 4, 2, 0).only_beside_cuts  # 4 of 18 beside and 0 of 2 apart: chance (p ≈ 0.63)
    assert not BesideCuts(5, 3, 15, 1).only_beside_cuts
    assert BesideCuts(5, 0, 15, 0).p_value is None


def test_beside_cuts_counts_a_cut_within_a_flight_edges_included():
    samples = [(0.0, 1.0, True), (2.0, 3.0, False), (4.0, 5.0, False)]
    assert beside_cuts(samples, [1.0, 3.5]) == BesideCuts(beside=1, divergent_beside=1, apart=2, divergent_apart=0)


@pytest.mark.parametrize("load, message", [
    ({"cancel_share": 0.5}, "load.cancel_share: expected load.cancel_after_s or load.cancel_after_tokens"),
    ({"cancel_share": 0.5, "cancel_after_tokens": 4, "stream": False}, "load.cancel_after_tokens: expected "
     "load.stream = true"),
    ({"cancel_share": 0.5, "cancel_after_s": 1.0, "mode": "single"}, "load.cancel_share: expected a mode with "
     "companions"),
    ({"cancel_share": 1.5, "cancel_after_s": 1.0}, "load.cancel_share"),
    ({"cancel_share": 0.5, "cancel_after_s": 0}, "load.cancel_after_s"),
    ({"cancel_share": 0.5, "cancel_after_tokens": 0}, "load.cancel_after_tokens"),
])
def test_bad_cancel_keys_are_one_clear_line(tmp_path, load, message):
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1",
                              **{"mode": "mixed", "stream": True, **load})
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2, output
    assert message in output and "Traceback" not in output
    assert len(output.strip().splitlines()) == 1


def test_cancelled_counts_by_status_in_the_records_match_the_summary(tmp_path):
    with FakeServer(Behaviour(latency=0.01, chunk_delay=0.01)) as server:
        rows, summary, _ = run(tmp_path, server, cancel_share=0.4, cancel_after_tokens=1, concurrency=[1, 2, 4])
    for level, cell in cells_by_level(summary).items():
        start, end = probe_cell_window([r for r in rows if r["concurrency"] == level])
        assert cell["cancelled"] == sum(1 for r in rows if r["status"] == CANCELLED and r["concurrency"] == level
                                        and start <= r["t_last_byte"] <= end)
    # Every cut is on record as one, whatever window it fell in.
    assert summary["cancelled"] == sum(1 for r in rows if r["status"] == CANCELLED)


def test_a_probe_cell_counts_the_cuts_of_its_own_level_only():
    # Two probes at c=4, one level after the other (as the engine runs them): p2's level had no cut.
    rows = crafted({4: 5}, drifting=set())
    late = [dict(r, probe="p2", seq=r["seq"] + 1000, t_send=r["t_send"] + 1000, t_last_byte=r["t_last_byte"] + 1000)
            for r in rows if r["role"] == "probe"]
    summary = summarize(reduce_cut(rows + late))
    assert cells_by_level(summary, "p1")[4].cancelled == 5
    assert cells_by_level(summary, "p2")[4].cancelled == 0
    assert summary.cancelled == 5


def test_open_loop_companions_are_cut_too(tmp_path):
    with FakeServer(Behaviour(latency=0.02, chunk_delay=0.02)) as server:
        rows, summary, _ = run(tmp_path, server, rate=[40], concurrency=[1], samples=8, cancel_share=0.5,
                               cancel_after_tokens=2)
    cut = [r for r in rows if r["status"] == CANCELLED]
    assert cut and all(r["role"] == "companion" and r["rate"] == 40 and r["chunks"] == 2 for r in cut)
    assert len(server.disconnects) == len(cut)
    [probe_cell] = [c for c in summary["cells"] if c["role"] == "probe"]
    start, end = probe_cell_window(rows)
    assert probe_cell["cancelled"] == sum(1 for r in cut if start <= r["t_last_byte"] <= end)


def probe_cell_window(rows: list[dict]) -> tuple[float, float]:
    probes = [r for r in rows if r["role"] == "probe" and r["counted"]]
    return min(r["t_send"] for r in probes), max(r["t_last_byte"] for r in probes)


# --- the pair of runs: the same level with and without cancellations (run --baseline) ---

DRIFT_KINDS = ("new_drift", "fixed")


def level_run(cuts: int, drifting: bool) -> RunSummary:
    return summarize(reduce_cut(crafted({4: cuts}, drifting={4} if drifting else set())))


@pytest.mark.parametrize("now, then, kind", [
    (level_run(5, True), level_run(0, False), "new_drift"),   # drifted with cuts; the baseline without held
    (level_run(0, False), level_run(5, True), "fixed"),       # held without cuts; the baseline drifted with them
])
def test_a_baseline_without_cuts_that_held_makes_the_finding(now, then, kind):
    [change] = [c for c in compare_to_baseline(now, then) if c.cell == "p1@mixed/c=4" and c.kind in DRIFT_KINDS]
    assert change.kind == kind
    assert change.detail.endswith("; probe drifted only in levels with cancellations: ✂5 where it drifted, none "
                                  "where it held")


@pytest.mark.parametrize("now, then", [
    (level_run(5, True), level_run(3, False)),   # both had cuts: the cuts are no difference between them
    (level_run(0, True), level_run(0, False)),   # neither had any
])
def test_no_baseline_finding_unless_only_the_drifting_run_had_cuts(now, then):
    [change] = [c for c in compare_to_baseline(now, then) if c.cell == "p1@mixed/c=4" and c.kind in DRIFT_KINDS]
    assert change.kind == "new_drift" and "cancellations" not in change.detail


def test_a_cut_by_time_without_streaming_is_cancelled_with_no_chunk(tmp_path):
    # Each answer is held 1 s; the cut comes at 0.2 s, before a byte of it.
    with FakeServer(Behaviour(latency=1.0)) as server:
        rows, summary, _ = run(tmp_path, server, stream=False, samples=2, cancel_share=1.0, cancel_after_s=0.2)
    cut = [r for r in rows if r["status"] == CANCELLED]
    assert cut and all(r["role"] == "companion" and r["chunks"] == 0 and r["t_first_byte"] is None for r in cut)
    assert all(0.19 <= r["t_last_byte"] - r["t_send"] < 0.5 for r in cut)
    assert summary["errors"] == 0 and summary["cancelled"] == len(cut)


def test_parts_of_a_records_file_merge_to_the_whole_run():
    # The parallel reader reduces parts of a large file apart: cuts, samples and counts must merge.
    rows = crafted({2: 5, 4: 0}, drifting={2})
    whole = summarize(reduce_cut(rows))
    first, second = reduce_cut(rows[::2]), reduce_cut(rows[1::2])
    first.merge(second)
    merged = summarize(first)
    names = ("cancelled", "beside_cancelled", "divergent_beside_cancelled", "divergent_apart_from_cancelled",
             "cancel_p_value", "drift_only_beside_cancelled", "drift", "ok")
    assert [[getattr(c, n) for n in names] for c in merged.cells] == \
        [[getattr(c, n) for n in names] for c in whole.cells]
    assert (merged.cancelled, merged.drift_with_cancelled_levels) == \
        (whole.cancelled, whole.drift_with_cancelled_levels) == (5, ("p1@mixed",))
