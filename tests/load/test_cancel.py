"""Cancelled requests: companions the client abandons mid-answer, against crafted servers whose
truth is known — one that drifts only when a neighbour's stream is closed, one that drifts under
load whatever is cut, one that never drifts, one that drifts on its slow (queued) answers or only in
batches of two — and against crafted records for the level finding.

Each claim is checked from the records: which companions were chosen (``cancel_planned``), which
were cut (status ``cancelled``, the cut's time and chunks), what the server saw (its disconnects)
and how the probe's samples split beside the cuts. An answer whose end arrived with (or before) its
cut-off chunk, or before a cut by time, is whole, not cancelled: vLLM sends the last token and its
finish_reason in one chunk, and a fast server's last chunks come in one read. A cut is never an
error, in the summary or in the HTML report's timeline.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time

import pytest
from aiohttp import web

from kevload.compare.cuts import BesideCuts, beside_cuts
from kevload.compare.summarizing import summarize
from kevload.inputs.wordsets import CANCELLED
from kevload.load.cancel import CancelPlan
from kevload.outputs.baseline import compare_to_baseline
from kevload.outputs.celltext import cell_text
from kevload.outputs.footnotes import cancel_findings, footnotes
from kevload.records.store import read_records
from kevload.records.summary import RunSummary
from tests.conftest import cells_by_level, load_summary, reduce_rows, run_cli, write_scenario
from tests.fakeserver import WORDS, Behaviour, FakeServer


def reduce_cut(rows):
    """Records of a run that asked for cuts, reduced as ``kevload report`` reduces them (run.json's
    cancel_share)."""
    return reduce_rows(rows, cuts_asked=True)


def run(tmp_path, server, name: str = "run", **load) -> tuple[list[dict], dict, str]:
    settings = {"mode": "mixed", "concurrency": [1, 4], "samples": 12, "stream": True, **load}
    scenario = write_scenario(tmp_path / f"{name}.toml", server.url, **settings)
    code, output = run_cli("run", scenario, "--out", tmp_path / name)
    assert code in (0, 1), output
    return (
        list(read_records(tmp_path / name / "records.jsonl")),
        load_summary(tmp_path / name),
        output,
    )


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
    assert (
        CANCELLED not in summary["errors_by_type"]
        and CANCELLED not in summary["errors_sent_by_type"]
    )
    assert summary["cancelled"] == len(cut)
    counted_cut = sum(1 for r in cut if r["counted"])
    assert sum(c["cancelled"] for c in summary["cells"] if c["role"] == "companion") == counted_cut
    start, end = probe_cell_window([r for r in rows if r["concurrency"] == 4])
    assert (
        cells_by_level(summary)[4]["cancelled"]
        == sum(1 for r in cut if start <= r["t_last_byte"] <= end)
        > 0
    )
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
    # The closed loop keeps c − 1 others: each counted probe sample had 3 others in flight at its
    # send, and the cut companions' spans (until the cut) keep the level full.
    probes = [r for r in rows if r["role"] == "probe" and r["concurrency"] == 4 and r["counted"]]
    assert probes and all(r["in_flight"] == 3 for r in probes)
    cell = cells_by_level(summary)[4]
    assert cell["full_load_share"] > 0.9 and cell["samples_never_full"] == 0


def test_a_rerun_with_the_same_seed_cuts_the_same_companions(tmp_path):
    with FakeServer(Behaviour(latency=0.01, chunk_delay=0.01)) as server:
        runs = [
            run(tmp_path, server, name, cancel_share=0.3, cancel_after_tokens=2, seed=seed)[0]
            for name, seed in (("a", 5), ("b", 5), ("c", 6))
        ]
    # Runs send different numbers of companions (the server's timing decides): the numbers all three
    # sent count.
    upto = min(
        max(r["sample"] for r in rows if r["role"] == "companion" and r["concurrency"] == 4)
        for rows in runs
    )
    assert upto > 20

    def chosen(rows):
        return sorted(
            r["sample"]
            for r in rows
            if r["role"] == "companion"
            and r["concurrency"] == 4
            and r["cancel_planned"]
            and r["sample"] <= upto
        )

    first, again, other = (chosen(rows) for rows in runs)
    assert first and first == again
    assert first != other


def test_the_plan_is_a_pure_seeded_choice_of_the_share():
    plan = CancelPlan.of(0.25, None, 4, seed=3)
    picks = [plan.chosen("p1", "c=4", 0, k) for k in range(4000)]
    assert 0.22 < sum(picks) / len(picks) < 0.28
    assert picks == [plan.chosen("p1", "c=4", 0, k) for k in range(4000)]
    assert picks != [
        CancelPlan.of(0.25, None, 4, seed=4).chosen("p1", "c=4", 0, k) for k in range(4000)
    ]
    assert CancelPlan.of(0.0, 1.0, None, seed=3) is None


def test_a_server_that_drifts_only_when_a_neighbour_is_cancelled_gives_the_finding(tmp_path):
    # The probe is held 0.1 s before its answer is made: a stream closed meanwhile changes it;
    # nothing else does.
    behaviour = Behaviour(latency=0.1, chunk_delay=0.01, words=6, drift_when_cancelled=True)
    with FakeServer(behaviour) as server:
        rows, summary, output = run(
            tmp_path, server, samples=30, cancel_share=0.2, cancel_after_tokens=2
        )
    cell = cells_by_level(summary)[4]
    assert cell["drift"] and summary["verdict"] == "nondeterministic"
    assert cell["divergent_apart_from_cancelled"] == 0
    assert cell["divergent_beside_cancelled"] == cell["divergent_requests"] > 0
    assert cell["drift_only_beside_cancelled"] and cell["cancel_p_value"] < 0.05
    assert summary["drift_beside_cancelled_cells"] == ["p1@mixed/c=4"]
    assert "probe drifted only beside cancellations" in output
    # The split is the records': a sample is beside a cut when a cut of its level fell within its
    # flight.
    cuts = sorted(
        r["t_last_byte"] for r in rows if r["status"] == CANCELLED and r["concurrency"] == 4
    )
    serial = {r["sha256"] for r in rows if r["role"] == "probe" and r["concurrency"] == 1}
    samples = [
        (r["t_send"], r["t_last_byte"], r["sha256"] not in serial)
        for r in rows
        if r["role"] == "probe" and r["concurrency"] == 4 and r["counted"]
    ]
    split = beside_cuts(samples, cuts)
    assert (split.beside, split.divergent_beside) == (
        cell["beside_cancelled"],
        cell["divergent_beside_cancelled"],
    )
    # `kevload report` reads the run again, knowing from run.json that it cut (only then are sample
    # spans kept): the same split and findings.
    code, again = run_cli("report", tmp_path / "run", "--format", "json")
    assert code == 1, again  # the verdict's exit code: nondeterministic
    again = json.loads(again)
    assert cells_by_level(again)[4] == cell
    assert again["drift_beside_cancelled_cells"] == summary["drift_beside_cancelled_cells"]


@pytest.mark.parametrize(
    "behaviour",
    [
        Behaviour(
            latency=0.1, chunk_delay=0.01, words=6, drift_at=2
        ),  # drifts under load, cut or not
        Behaviour(
            latency=0.1, chunk_delay=0.01, words=6, always_drift=True
        ),  # drifts even serially
    ],
    ids=["under-load", "always"],
)
def test_no_finding_on_a_server_that_drifts_whatever_is_cut(tmp_path, behaviour):
    with FakeServer(behaviour) as server:
        _, summary, output = run(
            tmp_path, server, samples=30, cancel_share=0.2, cancel_after_tokens=2
        )
    cell = cells_by_level(summary)[4]
    assert cell["drift"] and cell["cancelled"] > 0
    assert (
        cell["divergent_apart_from_cancelled"] > 0
    )  # drift where nothing was cut: the cuts explain nothing
    assert not cell["drift_only_beside_cancelled"]
    assert (
        summary["drift_beside_cancelled_cells"] == []
        and summary["drift_with_cancelled_levels"] == []
    )
    assert "drifted only" not in output


def test_no_cancellation_fields_when_nothing_was_cut(tmp_path):
    with FakeServer(Behaviour(latency=0.01)) as server:
        rows, summary, output = run(tmp_path, server)
    assert not any(r["cancel_planned"] for r in rows)
    assert "cancelled" not in summary and all("cancelled" not in c for c in summary["cells"])
    assert "✂" not in output


# --- the level finding, on crafted records: what the matrix says is what the records hold ---


def crafted_row(
    rows: list[dict], role: str, level: int, output: str | None, status: str = "ok", **extra
) -> None:
    """One crafted record of probe p1's run appended to ``rows``: at a level c ≥ 2 every request is
    in flight together (sent in turn, all answered 50 s in), serially one after another."""
    seq = len(rows)
    base = level * 100.0
    rows.append(
        {
            "run_id": "r",
            "seq": seq,
            "probe": "p1" if role == "probe" else "c",
            "role": role,
            "mode": "mixed",
            "concurrency": level,
            "rate": None,
            "status": status,
            "output": output,
            "sha256": hashlib.sha256(output.encode()).hexdigest() if output else None,
            "finish_reason": "stop" if output else None,
            "chunks": 2,
            "t_send": base + seq * 0.001,
            "t_last_byte": base + 50 if level > 1 else base + seq * 0.001 + 0.0005,
            **extra,
        }
    )


def crafted(level_cuts: dict[int, int], drifting: set[int]) -> list[dict]:
    """Probe p1 at each level (8 samples, all in flight together), companions beside it,
    ``level_cuts[c]`` of them cut; the probe's answers differ from serial at the levels in
    ``drifting``."""
    rows: list[dict] = []

    def add(*args, **extra) -> None:
        crafted_row(rows, *args, **extra)

    for level in sorted({1, *level_cuts}):
        for k in range(8):
            add("probe", level, f"other {k}" if level in drifting else "serial")
        if level > 1:
            for _ in range(
                level_cuts[level]
            ):  # cut early: within every sample's window (its shortest flight)
                add(
                    "companion",
                    level,
                    None,
                    CANCELLED,
                    cancel_planned=True,
                    t_last_byte=level * 100.0 + 1,
                )
            for _ in range(3):
                add("companion", level, "companion answer")
    return rows


def test_drift_only_in_levels_with_cuts_is_a_finding_the_counts_show():
    # Drifted at c=2 with cuts, held at the heavier c=4 with none: the load alone does not make it
    # drift.
    summary = summarize(reduce_cut(crafted({2: 5, 4: 0}, drifting={2})))
    cells = cells_by_level(summary)
    assert (cells[2].cancelled, cells[4].cancelled) == (5, 0)
    assert summary.drift_with_cancelled_levels == ("p1@mixed",)
    [line] = [x for x in cancel_findings(summary) if "levels" in x]
    assert line == (
        "finding: p1 (mixed): probe drifted only in levels with cancellations: c=2 (✂5); held the "
        "serial output where none was cut: c=4"
    )
    assert cell_text(cells[2]).endswith("✂5") and "✂" not in cell_text(cells[4])
    assert summary.cancelled == 5 and summary.errors == 0 and summary.companion_errors == 0
    assert any("5 cut by kevload" in note for note in footnotes(summary))


@pytest.mark.parametrize(
    "cuts, drifting",
    [
        ({2: 0, 4: 5}, {2, 4}),  # drifted where nothing was cut too
        (
            {2: 0, 4: 5},
            {4},
        ),  # held only at a lighter load: a server drifting under load, cut or not, does that
        ({2: 3, 4: 5}, {4}),  # no loaded level without cuts to hold against
        ({2: 0, 4: 5}, set()),  # no drift at all
        ({2: 0, 4: 5}, {1, 4}),  # the serial level itself drifts (8 distinct)
    ],
)
def test_no_level_finding_unless_the_records_show_it(cuts, drifting):
    summary = summarize(reduce_cut(crafted(cuts, drifting)))
    assert summary.drift_with_cancelled_levels == ()
    assert not [x for x in cancel_findings(summary) if "levels" in x]


def test_fisher_p_of_a_split():
    # 3 divergent all beside, of 5 beside and 15 apart: C(5,3)/C(20,3) = 10/1140.
    assert BesideCuts(
        beside=5, divergent_beside=3, apart=15, divergent_apart=0
    ).p_value == pytest.approx(10 / 1140)
    assert BesideCuts(5, 3, 15, 0).only_beside_cuts
    assert not BesideCuts(
        18, 4, 2, 0
    ).only_beside_cuts  # 4 of 18 beside and 0 of 2 apart: chance (p ≈ 0.63)
    assert not BesideCuts(5, 3, 15, 1).only_beside_cuts
    assert BesideCuts(5, 0, 15, 0).p_value is None


def test_beside_cuts_counts_a_cut_within_a_flight_edges_included():
    samples = [(0.0, 1.0, True), (2.0, 3.0, False), (4.0, 5.0, False)]
    assert beside_cuts(samples, [1.0, 3.5]) == BesideCuts(
        beside=1, divergent_beside=1, apart=2, divergent_apart=0
    )


@pytest.mark.parametrize(
    "load, message",
    [
        (
            {"cancel_share": 0.5},
            "load.cancel_share: expected load.cancel_after_s or load.cancel_after_tokens",
        ),
        (
            {"cancel_share": 0.5, "cancel_after_tokens": 4, "stream": False},
            "load.cancel_after_tokens: expected load.stream = true",
        ),
        (
            {"cancel_share": 0.5, "cancel_after_s": 1.0, "mode": "single"},
            "load.cancel_share: expected a mode with companions",
        ),
        ({"cancel_share": 1.5, "cancel_after_s": 1.0}, "load.cancel_share"),
        ({"cancel_share": 0.5, "cancel_after_s": 0}, "load.cancel_after_s"),
        ({"cancel_share": 0.5, "cancel_after_tokens": 0}, "load.cancel_after_tokens"),
    ],
)
def test_bad_cancel_keys_are_one_clear_line(tmp_path, load, message):
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", **{"mode": "mixed", "stream": True, **load}
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2, output
    assert message in output and "Traceback" not in output
    assert len(output.strip().splitlines()) == 1


def test_cancelled_counts_by_status_in_the_records_match_the_summary(tmp_path):
    with FakeServer(Behaviour(latency=0.01, chunk_delay=0.01)) as server:
        rows, summary, _ = run(
            tmp_path, server, cancel_share=0.4, cancel_after_tokens=1, concurrency=[1, 2, 4]
        )
    for level, cell in cells_by_level(summary).items():
        start, end = probe_cell_window([r for r in rows if r["concurrency"] == level])
        assert cell["cancelled"] == sum(
            1
            for r in rows
            if r["status"] == CANCELLED
            and r["concurrency"] == level
            and start <= r["t_last_byte"] <= end
        )
    # Every cut is on record as one, whatever window it fell in.
    assert summary["cancelled"] == sum(1 for r in rows if r["status"] == CANCELLED)


def test_a_probe_cell_counts_the_cuts_of_its_own_level_only():
    # Two probes at c=4, one level after the other (as the engine runs them): p2's level had no cut.
    rows = crafted({4: 5}, drifting=set())
    late = [
        dict(
            r,
            probe="p2",
            seq=r["seq"] + 1000,
            t_send=r["t_send"] + 1000,
            t_last_byte=r["t_last_byte"] + 1000,
        )
        for r in rows
        if r["role"] == "probe"
    ]
    summary = summarize(reduce_cut(rows + late))
    assert cells_by_level(summary, "p1")[4].cancelled == 5
    assert cells_by_level(summary, "p2")[4].cancelled == 0
    assert summary.cancelled == 5


def test_open_loop_companions_are_cut_too(tmp_path):
    with FakeServer(Behaviour(latency=0.02, chunk_delay=0.02)) as server:
        rows, summary, _ = run(
            tmp_path,
            server,
            rate=[40],
            concurrency=[1],
            samples=8,
            cancel_share=0.5,
            cancel_after_tokens=2,
        )
    cut = [r for r in rows if r["status"] == CANCELLED]
    assert cut and all(
        r["role"] == "companion" and r["rate"] == 40 and r["chunks"] == 2 for r in cut
    )
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


@pytest.mark.parametrize(
    "now, then, kind",
    [
        (
            level_run(5, True),
            level_run(0, False),
            "new_drift",
        ),  # drifted with cuts; the baseline without held
        (
            level_run(0, False),
            level_run(5, True),
            "fixed",
        ),  # held without cuts; the baseline drifted with them
    ],
)
def test_a_baseline_without_cuts_that_held_makes_the_finding(now, then, kind):
    [change] = [
        c
        for c in compare_to_baseline(now, then)
        if c.cell == "p1@mixed/c=4" and c.kind in DRIFT_KINDS
    ]
    assert change.kind == kind
    assert change.detail.endswith(
        "; probe drifted only in levels with cancellations: ✂5 where it drifted, none where it held"
    )


@pytest.mark.parametrize(
    "now, then",
    [
        (
            level_run(5, True),
            level_run(3, False),
        ),  # both had cuts: the cuts are no difference between them
        (level_run(0, True), level_run(0, False)),  # neither had any
    ],
)
def test_no_baseline_finding_unless_only_the_drifting_run_had_cuts(now, then):
    [change] = [
        c
        for c in compare_to_baseline(now, then)
        if c.cell == "p1@mixed/c=4" and c.kind in DRIFT_KINDS
    ]
    assert change.kind == "new_drift" and "cancellations" not in change.detail


def test_a_cut_by_time_without_streaming_is_cancelled_with_no_chunk(tmp_path):
    # Each answer is held 1 s; the cut comes at 0.2 s, before a byte of it.
    with FakeServer(Behaviour(latency=1.0)) as server:
        rows, summary, _ = run(
            tmp_path, server, stream=False, samples=2, cancel_share=1.0, cancel_after_s=0.2
        )
    cut = [r for r in rows if r["status"] == CANCELLED]
    assert cut and all(
        r["role"] == "companion" and r["chunks"] == 0 and r["t_first_byte"] is None for r in cut
    )
    assert all(0.19 <= r["t_last_byte"] - r["t_send"] < 0.5 for r in cut)
    assert summary["errors"] == 0 and summary["cancelled"] == len(cut)


def test_parts_of_a_records_file_merge_to_the_whole_run():
    # The parallel reader reduces parts of a large file apart: cuts, samples and counts must merge.
    rows = crafted({2: 5, 4: 0}, drifting={2})
    whole = summarize(reduce_cut(rows))
    first, second = reduce_cut(rows[::2]), reduce_cut(rows[1::2])
    first.merge(second)
    merged = summarize(first)
    names = (
        "cancelled",
        "beside_cancelled",
        "divergent_beside_cancelled",
        "divergent_apart_from_cancelled",
        "cancel_p_value",
        "drift_only_beside_cancelled",
        "drift",
        "ok",
    )
    assert [[getattr(c, n) for n in names] for c in merged.cells] == [
        [getattr(c, n) for n in names] for c in whole.cells
    ]
    assert (
        (merged.cancelled, merged.drift_with_cancelled_levels)
        == (whole.cancelled, whole.drift_with_cancelled_levels)
        == (5, ("p1@mixed",))
    )


class WholeAnswerServer(FakeServer):
    """Streams as vLLM does, the finish_reason on the chunk of the last token (``together``: the
    whole stream in one write, as a fast server's last chunks reach the client in one read)."""

    def __init__(self, behaviour: Behaviour, *, together: bool = False):
        super().__init__(behaviour)
        self.together = together

    async def _stream(
        self, request, body, text, chat, fault, logprobs=None, cached=0, written=None
    ):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        pieces = text.split(" ")
        events = []
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            choice = {
                "index": 0,
                "delta": {"content": piece if i == 0 else " " + piece},
                "finish_reason": "length" if last else None,
            }
            events.append(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        events.append(b"data: [DONE]\n\n")
        try:
            if self.together:
                await response.write(b"".join(events))
            else:
                for event in events:
                    await response.write(event)
                    await asyncio.sleep(0.01)
            await response.write_eof()
        except ConnectionError:
            self.disconnects.append((request.headers.get("X-Request-Id"), 0.0))
        return response


def small_run(tmp_path, server, name: str = "run", **load) -> tuple[list[dict], dict, str]:
    """``run``, smaller: c=1 and 2, 4 samples."""
    return run(tmp_path, server, name, **{"concurrency": [1, 2], "samples": 4, **load})


def test_an_answer_that_ended_on_its_cut_off_chunk_is_ok_not_cancelled(tmp_path):
    # 6 words, cut after 6 chunks: the 6th chunk carries the finish_reason, the answer is whole.
    with WholeAnswerServer(Behaviour(latency=0.01, words=6)) as server:
        rows, summary, output = small_run(tmp_path, server, cancel_share=1.0, cancel_after_tokens=6)
    planned = [r for r in rows if r.get("cancel_planned")]
    assert planned and not server.disconnects
    assert all(
        r["status"] == "ok" and r["finish_reason"] == "length" and r["chunks"] == 6 for r in planned
    ), {r["status"] for r in planned}
    assert summary["cancelled"] == 0


def test_an_answer_whose_end_came_in_the_same_read_as_its_cut_off_chunk_is_ok(tmp_path):
    # The whole stream in one write: kevload holds the finished answer when it counts the 2nd chunk.
    with WholeAnswerServer(Behaviour(latency=0.01, words=6), together=True) as server:
        rows, summary, _ = small_run(tmp_path, server, cancel_share=1.0, cancel_after_tokens=2)
    planned = [r for r in rows if r.get("cancel_planned")]
    assert planned and all(r["status"] == "ok" and r["chunks"] == 6 for r in planned)
    assert summary["cancelled"] == 0


def quiet_seed(share: float, quiet: str, busy: str, quiet_n: int, busy_n: int) -> int:
    """A seed whose plan chooses none of the first ``quiet_n`` companions at level ``quiet`` and one
    of the first ``busy_n`` at ``busy``."""
    for seed in range(10_000):
        plan = CancelPlan.of(share, None, 1, seed)
        if not any(plan.chosen("p1", quiet, 0, k) for k in range(quiet_n)) and any(
            plan.chosen("p1", busy, 0, k) for k in range(busy_n)
        ):
            return seed
    raise AssertionError("no seed")


def test_no_level_finding_when_the_level_that_held_was_a_lighter_load(tmp_path):
    # The server drifts once 3 requests overlap, whatever is cut: c=2 holds, c=4 drifts, cuts or
    # none. The seed cuts nothing at c=2 and something at c=4, so "drifted only in levels with
    # cancellations" would be said.
    seed = quiet_seed(0.05, "c=2", "c=4", 40, 10)
    behaviour = Behaviour(latency=0.02, chunk_delay=0.005, words=6, drift_at=3)
    with FakeServer(behaviour) as server:
        _, summary, output = small_run(
            tmp_path,
            server,
            "cut",
            concurrency=[1, 2, 4],
            samples=8,
            seed=seed,
            cancel_share=0.05,
            cancel_after_tokens=1,
        )
        _, uncut, _ = small_run(
            tmp_path, server, "uncut", concurrency=[1, 2, 4], samples=8, seed=seed
        )
    cells = cells_by_level(summary)
    assert cells[2]["cancelled"] == 0 and not cells[2]["drift"]
    assert cells[4]["cancelled"] > 0 and cells[4]["drift"]
    # The truth: without any cut, c=4 drifts all the same.
    assert cells_by_level(uncut)[4]["drift"]
    assert summary["drift_with_cancelled_levels"] == []
    assert "drifted only in levels with cancellations" not in output


def crafted_levels(levels: dict[int, tuple[int, str]]) -> list[dict]:
    """Probe p1 at each level (8 samples in flight together) and companions, ``levels[c]``: (cuts,
    "serial", "drift" or "failed")."""
    rows: list[dict] = []

    def add(*args, **extra) -> None:
        crafted_row(rows, *args, **extra)

    for level, (cuts, kind) in sorted(levels.items()):
        for k in range(8):
            if kind == "failed":
                add("probe", level, None, "http_500")
            else:
                add("probe", level, f"other {k}" if kind == "drift" else "serial")
        for _ in range(cuts):  # cut early: within every sample's window (its shortest flight)
            add(
                "companion",
                level,
                None,
                CANCELLED,
                cancel_planned=True,
                t_last_byte=level * 100.0 + 1,
            )
        if level > 1:
            add("companion", level, "companion answer")
    return rows


def test_the_level_finding_names_as_held_only_levels_with_answers():
    # c=4 held with none cut; c=2 drifted with cuts; c=8 had no answer at all (every probe failed),
    # nor any cut.
    rows = crafted_levels({1: (0, "serial"), 2: (4, "drift"), 4: (0, "serial"), 8: (0, "failed")})
    summary = summarize(reduce_rows(rows, cuts_asked=True))
    assert summary.drift_with_cancelled_levels == ("p1@mixed",)
    [line] = cancel_findings(summary)
    assert line.endswith("held the serial output where none was cut: c=4"), line


def test_the_html_report_counts_no_cut_as_an_error(tmp_path):
    with FakeServer(Behaviour(latency=0.01, chunk_delay=0.01)) as server:
        rows, summary, _ = small_run(tmp_path, server, cancel_share=0.5, cancel_after_tokens=2)
    assert summary["cancelled"] > 0 and summary["errors"] == 0
    code, output = run_cli(
        "report", tmp_path / "run", "--format", "html", "-o", tmp_path / "r.html"
    )
    assert code == 0, output
    page = (tmp_path / "r.html").read_text()
    assert " 0 errors in " in page, page[page.index("Requests finished per second") :][:600]


def test_the_runs_total_of_cuts_is_printed_when_every_companion_was_cut(tmp_path):
    with FakeServer(Behaviour(latency=0.01, chunk_delay=0.01)) as server:
        rows, summary, output = small_run(tmp_path, server, cancel_share=1.0, cancel_after_tokens=1)
    cut = sum(1 for r in rows if r["status"] == CANCELLED)
    assert cut and summary["cancelled"] == cut and summary["companion_requests"] == 0
    assert f"{cut} cut by kevload" in output, output


class SlowAnswersDrift(FakeServer):
    """Under load, some requests are held long (queued: 0.6 s against 0.01 s); those answer
    otherwise, whatever is cut. A slow probe sample's flight meets most of the cuts of its level, a
    fast one's few."""

    def __init__(self):
        rng = random.Random(7)
        super().__init__(
            Behaviour(
                latency=0.01,
                chunk_delay=0.005,
                words=6,
                on_arrival=lambda _, active: 0.6 if active > 1 and rng.random() < 0.3 else None,
            )
        )

    def _answer(self, body, prompt, state):
        text = super()._answer(body, prompt, state)
        if time.monotonic() - state["arrived"] > 0.3:
            words = text.split(" ")
            words[3:] = [random.choice(WORDS) for _ in words[3:]]
            text = " ".join(words)
        return text


def test_no_beside_finding_on_a_server_that_drifts_on_its_slow_answers_cut_or_not(tmp_path):
    with SlowAnswersDrift() as server:
        _, summary, output = small_run(
            tmp_path,
            server,
            "cut",
            concurrency=[1, 4],
            samples=30,
            cancel_share=0.8,
            cancel_after_tokens=2,
        )
        _, uncut, _ = small_run(tmp_path, server, "uncut", concurrency=[1, 4], samples=30)
    cell = cells_by_level(summary)[4]
    assert cell["drift"] and cell["cancelled"] > 0
    # The truth: without a cut it drifts all the same.
    assert cells_by_level(uncut)[4]["drift"]
    assert not cell["drift_only_beside_cancelled"], cell
    assert "drifted only beside cancellations" not in output


class DriftsInPairs(FakeServer):
    """Drifts only in a batch of exactly two (a kernel of its own for that shape), cut or not."""

    def _answer(self, body, prompt, state):
        text = super()._answer(body, prompt, state)
        if state["max_overlap"] == 2:
            words = text.split(" ")
            words[3:] = [random.choice(WORDS) for _ in words[3:]]
            text = " ".join(words)
        return text


def test_no_level_finding_when_the_drifting_level_drifted_apart_from_its_cuts(tmp_path):
    # c=2 drifts on every sample, its few cuts or none; c=4 holds. The seed cuts at c=2 and not at
    # c=4.
    seed = quiet_seed(0.05, "c=4", "c=2", 60, 8)
    with DriftsInPairs(Behaviour(latency=0.1, chunk_delay=0.001, words=6)) as server:
        _, summary, output = small_run(
            tmp_path,
            server,
            "cut",
            concurrency=[1, 2, 4],
            samples=8,
            seed=seed,
            cancel_share=0.05,
            cancel_after_tokens=1,
        )
        _, uncut, _ = small_run(
            tmp_path, server, "uncut", concurrency=[1, 2, 4], samples=8, seed=seed
        )
    cells = cells_by_level(summary)
    assert cells[2]["cancelled"] > 0 and cells[2]["drift"]
    assert cells[4]["cancelled"] == 0 and not cells[4]["drift"]
    assert cells_by_level(uncut)[2]["drift"]  # the truth: c=2 drifts without a cut
    assert summary["drift_with_cancelled_levels"] == []
    assert "drifted only in levels with cancellations" not in output


class SlowDone(FakeServer):
    """Sends the whole answer and its finish_reason at once, then waits 0.5 s before [DONE] (a
    gateway's pace)."""

    async def _stream(
        self, request, body, text, chat, fault, logprobs=None, cached=0, written=None
    ):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": "stop"}
        await response.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        try:
            await asyncio.sleep(0.5)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            self.disconnects.append((request.headers.get("X-Request-Id"), 0.0))
        return response


def test_a_cut_by_time_after_the_answer_ended_leaves_it_whole(tmp_path):
    with SlowDone(Behaviour(latency=0.01, words=4)) as server:
        rows, summary, _ = small_run(
            tmp_path, server, samples=2, cancel_share=1.0, cancel_after_s=0.2
        )
    planned = [r for r in rows if r.get("cancel_planned")]
    assert planned and all(r["status"] == "ok" and r["finish_reason"] == "stop" for r in planned), [
        r["status"] for r in planned
    ]
    assert summary["cancelled"] == 0 and not server.disconnects
