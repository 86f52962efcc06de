"""What a cell and a run say is true and checkable from the records (probe errors counted as probe
errors, divergence kinds, word positions, the divergence example, "1 distinct, all ≠ serial",
reconnects).

The comparator tests build record lists directly: no server, exact expected numbers. One end-to-end
run through the CLI shows probe errors counted apart with a server whose probe requests time out
while companions succeed.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import re
from dataclasses import replace

from rich.console import Console

from kevload.compare.divergence import divergence_kind, first_divergence_word
from kevload.compare.summarizing import summarize
from kevload.outputs.celltext import cell_text
from kevload.outputs.html import run_report
from kevload.outputs.junit import junit_xml
from kevload.outputs.markdown import markdown
from kevload.outputs.sweepview import sweep_cell_text
from kevload.outputs.terminal import render
from kevload.outputs.verdict import verdict_line
from kevload.records.summary import CellSummary, RunSummary
from tests.conftest import (
    cells_by_level,
    crafted_times,
    load_summary,
    reduce_rows,
    run_cli,
    write_scenario,
)
from tests.fakeserver import Behaviour, FakeServer

SERIAL = "alpha bravo charlie delta"


class Records:
    """Builds records as the engine writes them, one ``seq`` after another."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(
        self,
        output: str | None,
        *,
        n: int = 1,
        level: int = 1,
        role: str = "probe",
        probe: str = "p1",
        mode: str = "mixed",
        status: str = "ok",
        finish: str | None = "stop",
        **extra,
    ) -> Records:
        for _ in range(n):
            seq = len(self.rows)
            ok = status == "ok"
            self.rows.append(
                {
                    "run_id": "r",
                    "seq": seq,
                    "probe": probe,
                    "role": role,
                    "mode": mode,
                    "concurrency": level,
                    "rate": None,
                    "status": status,
                    "output": output if ok else None,
                    "sha256": hashlib.sha256(output.encode()).hexdigest() if ok else None,
                    "finish_reason": finish if ok else None,
                    "completion_tokens": 4 if ok else None,
                    "chunks": 0,
                    **crafted_times(seq, level),
                    **extra,
                }
            )
        return self

    def summary(self, **options) -> RunSummary:
        return summarize(reduce_rows(self.rows), **options)


def table_text(summary: RunSummary) -> str:
    out = io.StringIO()
    render(summary, "table", Console(file=out, width=200, color_system=None))
    return out.getvalue()


# --- probe errors are counted as probe errors; a short cell is never "deterministic" ---


def probe_timeouts_among_companions() -> Records:
    """c=4 has 6 of 8 probe requests timing out while 40 companions succeed."""
    records = Records().add(SERIAL, n=8, level=1)
    records.add(None, n=6, level=4, status="timeout").add(SERIAL, n=2, level=4)
    records.add("a companion answer", n=40, level=4, role="companion", probe="short-fact")
    return records.add(None, n=3, level=4, role="companion", probe="short-fact", status="http_500")


def test_probe_error_share_counts_probe_requests_only():
    summary = probe_timeouts_among_companions().summary(max_error_share=0.2, samples_asked=8)
    # Counted over every request the share would be 9/59 < 20 %: companions diluting the probe's
    # failures.
    assert summary.probe_requests == 16 and summary.probe_errors == 6
    assert summary.probe_error_share == 0.375
    assert summary.probe_errors_by_type == {"timeout": 6}
    assert (summary.companion_requests, summary.companion_errors) == (43, 3)
    assert summary.companion_errors_by_type == {"http_500": 3}
    assert summary.verdict == "target_failed"
    line = verdict_line(summary)
    assert line.startswith(
        "target failed: 6 of 16 probe requests failed (timeout: 6); limit is 20%"
    )
    assert "companions (not counted): 3 of 43 failed (http_500: 3)" in line


def test_short_cell_makes_the_run_inconclusive_never_deterministic():
    summary = probe_timeouts_among_companions().summary(max_error_share=1.0, samples_asked=8)
    cells = cells_by_level(summary)
    assert summary.verdict == "inconclusive"
    assert summary.short_cells == ("p1@mixed/c=4",) and summary.samples_asked == 8
    assert (cells[4].ok, cells[4].asked, cells[4].short) == (2, 8, True)
    assert (cells[1].ok, cells[1].short) == (8, False)
    assert summary.matrix["short"] == [[False, True]] and summary.matrix["ok"] == [[8, 2]]
    assert cell_text(cells[4]) == "1 (2/8)" and cell_text(cells[1]) == "1"
    assert verdict_line(summary).startswith(
        "inconclusive: fewer ok probe samples than asked, so no claim of determinism; "
        "p1 (mixed) c=4: 2 of 8 asked ok (timeout: 6)"
    )
    assert "| p1 (mixed) | 1 | 1 (2/8) | 2 |" in markdown(summary)
    assert "1 (2/8)" in table_text(summary)
    xml = junit_xml(summary)
    assert (
        'failures="1"' in xml
        and 'type="inconclusive"' in xml
        and "short of samples: 2 of 8 ok" in xml
    )


def test_short_cell_without_errors_says_the_run_was_cut_short():
    summary = Records().add(SERIAL, n=8, level=1).add(SERIAL, n=3, level=4).summary(samples_asked=8)
    assert summary.verdict == "inconclusive"
    assert "p1 (mixed) c=4: 3 of 8 asked ok (no errors: the run was cut short)" in verdict_line(
        summary
    )


def test_drift_in_a_short_cell_is_still_drift():
    records = (
        Records().add(SERIAL, n=8, level=1).add(SERIAL, n=2, level=4).add(SERIAL + " echo", level=4)
    )
    summary = records.summary(samples_asked=8)
    assert summary.verdict == "nondeterministic"
    # Three requests at c=4 never had three others in flight: the records say so (†).
    assert cell_text(cells_by_level(summary)[4]) == "2 DRIFT † (3/8)"


ASKED = [("p1", "mixed", 1, None), ("p1", "mixed", 4, None)]


def test_a_level_asked_for_without_a_counted_sample_is_missing_and_short():
    records = Records().add(SERIAL, n=8, level=1)
    summary = replace(records.summary(samples_asked=8, asked_cells=ASKED), state="interrupted")
    assert summary.verdict == "inconclusive" and summary.missing_cells == ("p1@mixed/c=4",)
    assert {c.concurrency for c in summary.cells} == {1}  # no cell is made up for it
    missing = "p1 (mixed) c=4: no counted sample (the run was stopped before one was answered)"
    assert verdict_line(summary) == (
        "inconclusive: a probe cell asked for has no counted sample, so no claim of "
        f"determinism; {missing}"
    )
    assert f"- {missing}" in markdown(summary)
    xml = junit_xml(summary)
    assert 'tests="2" failures="1"' in xml and 'name="c=4"' in xml and missing in xml
    # Every level in: nothing missing, the run is what its cells say.
    whole = records.add(SERIAL, n=8, level=4).summary(samples_asked=8, asked_cells=ASKED)
    assert (whole.verdict, whole.missing_cells) == ("deterministic", ())
    # Drift elsewhere is still drift; the missing level is counted among the short ones.
    drift = Records().add(SERIAL, n=8, level=1).add(SERIAL + " echo", n=8, level=1)
    assert "(and 1 cell(s) short of samples)" in verdict_line(
        drift.summary(samples_asked=8, asked_cells=ASKED)
    )


def test_no_probe_request_at_all_is_inconclusive_never_a_target_failure():
    summary = Records().summary(samples_asked=8)
    assert (summary.verdict, summary.probe_requests, summary.probe_error_share) == (
        "inconclusive",
        0,
        0.0,
    )
    assert (
        verdict_line(summary)
        == "inconclusive: no probe sample was counted, so no claim of determinism"
    )


def test_a_duration_too_short_to_send_anything_says_so(tmp_path, server):
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=4, duration=0.000001
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 3 and "target failed" not in output, (
        output
    )  # before: "target failed: 0 of 0 … failed (none)"
    assert (
        "p1 (single) c=1: no counted sample (none was sent and answered within load.duration); "
        "p1 (single) c=2: no counted sample"
    ) in output
    assert load_summary(tmp_path / "run")["missing_cells"] == ["p1@single/c=1", "p1@single/c=2"]


def test_without_samples_asked_no_cell_is_short():
    summary = Records().add(SERIAL, n=8, level=1).add(SERIAL, n=3, level=4).summary()
    assert summary.verdict == "deterministic"
    assert not any(c.short for c in summary.cells)


class ProbeStallServer(FakeServer):
    """Stalls the probe's requests at the second level (probe copies 9–14) past the client timeout;
    companions, and every other probe request, are answered."""

    def __init__(self, probe_prompt: str, stalled: range):
        super().__init__(Behaviour(latency=0.05, stall=3.0))
        self.probe_prompt = probe_prompt
        self.stalled = stalled
        self.probe_arrivals = 0

    async def _handle(self, request):
        body = await request.json()
        if body["messages"][-1]["content"] == self.probe_prompt:
            self.probe_arrivals += 1
            if self.probe_arrivals in self.stalled:
                await asyncio.sleep(self.behaviour.stall)
        return await super()._handle(request)


def test_probe_timeouts_among_succeeding_companions_end_to_end(tmp_path):
    with ProbeStallServer("Say something.", range(9, 15)) as server:
        scenario = write_scenario(
            tmp_path / "s.toml",
            server.url,
            mode="mixed",
            concurrency=[1, 4],
            samples=8,
            max_error_share=1.0,
            target={"timeout": 0.8},
        )
        code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    summary = RunSummary.from_json(load_summary(tmp_path / "run"))
    cell = cells_by_level(summary)[4]
    assert cell.errors == {"timeout": 6} and cell.ok == 2
    assert cell.short and cell.asked == 8
    # The companions really succeeded around the failing probe: the dilution the old rule fell for.
    assert summary.companion_errors == 0 and summary.companion_requests > 20
    assert summary.verdict == "inconclusive" and code == 3, output
    assert "1 (2/8)" in output and "inconclusive: fewer ok probe samples than asked" in output


# --- divergence kinds against the serial reference ---


def test_divergence_kind_pure():
    assert divergence_kind(SERIAL, "alpha bravo chXrlie delta") == "token"
    assert divergence_kind(SERIAL, "alpha bravo") == "length"
    assert divergence_kind(SERIAL, SERIAL + " echo foxtrot") == "length"
    assert divergence_kind(SERIAL, SERIAL, "stop", "length") == "finish"


def kinds_run() -> dict:
    records = Records().add(SERIAL, n=4, level=1)
    records.add(SERIAL, level=4)
    records.add(
        "alpha bravo chXrlie delta", n=2, level=4
    )  # token: differs inside the common length
    records.add("alpha bravo", level=4, finish="length")  # length: a prefix, cut early
    records.add(SERIAL, level=4, finish="length")  # finish: same text, another finish_reason
    return records.summary(samples_asked=4)


def test_divergence_kinds_are_counted_per_cell():
    summary = kinds_run()
    cell = cells_by_level(summary)[4]
    assert cell.divergence_kinds == {"token": 2, "length": 1, "finish": 1}
    assert sum(cell.divergence_kinds.values()) == cell.divergent_requests == 4
    # Same text with another finish_reason is another output: 4 distinct, not 3.
    assert cell.distinct == 4 and cell.drift
    assert cells_by_level(summary)[1].divergence_kinds == {"token": 0, "length": 0, "finish": 0}


def test_divergence_kinds_in_every_output():
    summary = kinds_run()
    assert (
        "- p1 (mixed) c=4: 4 distinct in 5, 4 ≠ serial; kinds: 2× token, 1× length, 1× finish"
        in markdown(summary)
    )
    assert (
        "p1 (mixed) c=4: 4 distinct in 5, 4 ≠ serial; kinds: 2× token, 1× length, 1× finish"
        in table_text(summary)
    )
    assert "(kinds: 2× token, 1× length, 1× finish)" in verdict_line(summary)
    assert "(kinds: 2× token, 1× length, 1× finish)" in junit_xml(summary)
    page = run_report(summary, {}, [])
    assert "(kinds: 2× token, 1× length, 1× finish)</h3>" in page


def test_same_text_other_finish_reason_is_a_finish_divergence():
    summary = (
        Records()
        .add(SERIAL, n=8, level=1)
        .add(SERIAL, n=8, level=4, finish="length")
        .summary(samples_asked=8)
    )
    cell = cells_by_level(summary)[4]
    assert cell.drift and cell.distinct == 1 and cell.divergence_kinds["finish"] == 8
    assert (cell.modal_finish_reason, cell.divergent_finish_reason) == ("length", "length")
    assert summary.verdict == "nondeterministic"
    assert "same text; finish_reason stop (serial) vs length" in run_report(summary, {}, [])


# --- first_divergence_words ---


def test_first_divergence_word_exact_positions():
    # Inside a word: words 0 and 1 agree, word 2 ("charlie" / "chXrlie") is the first to differ.
    assert first_divergence_word(SERIAL, "alpha bravo chXrlie delta", 14) == 2
    # At a word start.
    assert first_divergence_word(SERIAL, "alpha bravo delta", 12) == 2
    # Where one text ends a word and the other goes on: "bravo" against "bravoX".
    assert first_divergence_word(SERIAL, "alpha bravoX charlie", 11) == 1
    # One text is a prefix of the other at a word end: two words agree.
    assert first_divergence_word(SERIAL, "alpha bravo", 11) == 2
    assert first_divergence_word(SERIAL, "xalpha", 0) == 0
    assert first_divergence_word(SERIAL, "alphX", 4) == 0


def test_first_divergence_words_in_the_summary():
    summary = (
        Records().add(SERIAL, n=4, level=1).add("alpha bravo chXrlie delta", n=4, level=4).summary()
    )
    cell = cells_by_level(summary)[4]
    assert (cell.first_divergence_chars, cell.first_divergence_words) == (14, 2)


# --- the divergence example, and 1 distinct that is not the serial answer ---


def test_example_is_the_output_whose_divergence_the_heading_states():
    late = SERIAL + " echo foxtrot golf hotel XXXX"  # seen first, leaves serial at char 38
    early = "zulu " + SERIAL  # seen second, leaves serial at char 0
    serial = SERIAL + " echo foxtrot golf hotel india"
    records = (
        Records()
        .add(serial, n=4, level=1)
        .add(late, level=4)
        .add(early, level=4)
        .add(serial, level=4)
    )
    summary = records.summary()
    cell = cells_by_level(summary)[4]
    assert (cell.first_divergence_chars, cell.last_divergence_chars) == (0, 50)
    assert cell.divergent_example == early and cell.example_offset == 0
    page = run_report(summary, {}, [])
    assert "first divergence at char 0" in page
    assert f"divergent: <mark>{early}</mark>" in page


def test_example_shows_a_divergence_far_into_the_text():
    serial = "x" * 1000 + "serial tail"
    other = "x" * 1000 + "other tail"
    summary = Records().add(serial, n=2, level=1).add(other, n=2, level=4).summary()
    cell = cells_by_level(summary)[4]
    assert cell.first_divergence_chars == 1000 and cell.example_offset == 850
    page = run_report(summary, {}, [])
    assert re.search(r"serial: +…x{150}<mark>serial tail</mark>", page)
    assert re.search(r"divergent: …x{150}<mark>other tail</mark>", page)


def test_one_distinct_all_different_from_serial_reads_as_that_everywhere():
    summary = (
        Records()
        .add(SERIAL, n=8, level=1)
        .add("zulu " + SERIAL, n=8, level=4)
        .summary(samples_asked=8)
    )
    cell = cells_by_level(summary)[4]
    assert (cell.distinct, cell.drift, cell.divergent_requests) == (1, True, 8)
    assert cell_text(cell) == "1 all≠serial"
    assert "| p1 (mixed) | 1 | 1 all≠serial | 8 |" in markdown(summary)
    assert "1 all≠serial" in table_text(summary)
    assert (
        "p1 (mixed) c=4: 1 distinct in 8, all ≠ serial, first divergence at char 0"
        in verdict_line(summary)
    )
    xml = junit_xml(summary)
    assert 'message="1 distinct in 8, all ≠ serial"' in xml
    assert "1 distinct outputs in 8 samples, all ≠ serial; first divergence at char 0" in xml
    page = run_report(summary, {}, [])
    assert (
        ">1 all≠serial</td>" in page
        and "c=4: 1 distinct in 8, all ≠ serial, first divergence at char 0" in page
    )


# --- reconnects, when the records carry them ---


def test_reconnects_are_summed_and_shown_beside_errors():
    records = (
        Records().add(SERIAL, n=3, level=1, reconnects=0).add(SERIAL, n=2, level=1, reconnects=1)
    )
    records.add(None, level=1, status="reset", reconnects=1)
    summary = records.summary()
    cell = cells_by_level(summary)[1]
    assert (cell.reconnects, cell.errors) == (3, {"reset": 1})
    assert "1 (+3 reconnects)" in table_text(summary)
    assert "<td>1 (+3 reconnects)</td>" in run_report(summary, {}, [])
    # Records without the field (older runs) read as no reconnects.
    plain = Records().add(SERIAL, n=2).summary()
    assert plain.cells[0].reconnects == 0 and "reconnects" not in table_text(plain)


def test_sweep_markdown_reads_one_distinct_off_serial_as_that():
    cell = CellSummary(probe="p1", role="probe", mode="single", concurrency=4, ok=8, drift=True)
    assert sweep_cell_text(replace(cell, distinct=1)) == "1 all≠serial"
    assert sweep_cell_text(replace(cell, distinct=3)) == "3 DRIFT"
