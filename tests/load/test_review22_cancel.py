"""Review of #22's cancelled requests: what kevload said that the records or the server's truth did not hold.

- An answer whose end arrived with (or before) its cut-off chunk is whole, not cancelled: vLLM sends the last token
  and its finish_reason in one chunk, and a fast server's last chunks come in one read.
- "drifted only in levels with cancellations" is no finding when the level that held without cuts was a lighter
  load than the one that drifted: a server that drifts under load, cut or not, would say the same.
- The level finding names as "held" only levels that had answers.
- "drifted only beside cancellations" is no finding on a server that drifts on its slow (queued) answers, cut or
  not: a longer flight meets more cuts, so every sample is given the same time to meet one.
- Nor is "drifted only in levels with cancellations" where the drifting level drifted apart from its cuts too.
- The html report's timeline counts no cut as an error; the companions' line gives the run's cuts even when every
  companion was cut; a cut by time that comes after the answer's end was read leaves the answer whole.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

from aiohttp import web

from kevload.compare.summarizing import summarize
from kevload.load.cancel import CancelPlan
from kevload.outputs.report import cancel_findings
from kevload.words import CANCELLED
from tests.conftest import cells_by_level, reduce_rows, run_cli
from tests.fakeserver import WORDS, Behaviour, FakeServer
from tests.load.test_cancel import crafted_row
from tests.load.test_cancel import run as cancel_run


class WholeAnswerServer(FakeServer):
    """Streams as vLLM does, the finish_reason on the chunk of the last token (``together``: the whole stream in
    one write, as a fast server's last chunks reach the client in one read)."""

    def __init__(self, behaviour: Behaviour, *, together: bool = False):
        super().__init__(behaviour)
        self.together = together

    async def _stream(self, request, body, text, chat, fault, logprobs=None, cached=0, written=None):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        pieces = text.split(" ")
        events = []
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            choice = {"index": 0, "delta": {"content": piece if i == 0 else " " + piece},
                      "finish_reason": "length" if last else None}
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


def run(tmp_path, server, name: str = "run", **load) -> tuple[list[dict], dict, str]:
    """test_cancel's run, smaller: c=1 and 2, 4 samples."""
    return cancel_run(tmp_path, server, name, **{"concurrency": [1, 2], "samples": 4, **load})


def test_an_answer_that_ended_on_its_cut_off_chunk_is_ok_not_cancelled(tmp_path):
    # 6 words, cut after 6 chunks: the 6th chunk carries the finish_reason, the answer is whole.
    with WholeAnswerServer(Behaviour(latency=0.01, words=6)) as server:
        rows, summary, output = run(tmp_path, server, cancel_share=1.0, cancel_after_tokens=6)
    planned = [r for r in rows if r.get("cancel_planned")]
    assert planned and not server.disconnects
    assert all(r["status"] == "ok" and r["finish_reason"] == "length" and r["chunks"] == 6 for r in planned), \
        {r["status"] for r in planned}
    assert summary["cancelled"] == 0


def test_an_answer_whose_end_came_in_the_same_read_as_its_cut_off_chunk_is_ok(tmp_path):
    # The whole stream in one write: kevload holds the finished answer when it counts the 2nd chunk.
    with WholeAnswerServer(Behaviour(latency=0.01, words=6), together=True) as server:
        rows, summary, _ = run(tmp_path, server, cancel_share=1.0, cancel_after_tokens=2)
    planned = [r for r in rows if r.get("cancel_planned")]
    assert planned and all(r["status"] == "ok" and r["chunks"] == 6 for r in planned)
    assert summary["cancelled"] == 0


def quiet_seed(share: float, quiet: str, busy: str, quiet_n: int, busy_n: int) -> int:
    """A seed whose plan chooses none of the first ``quiet_n`` companions at level ``quiet`` and one of the first
    ``busy_n`` at ``busy``."""
    for seed in range(10_000):
        plan = CancelPlan.of(share, None, 1, seed)
        if not any(plan.chosen("p1", quiet, 0, k) for k in range(quiet_n)) and \
                any(plan.chosen("p1", busy, 0, k) for k in range(busy_n)):
            return seed
    raise AssertionError("no seed")


def test_no_level_finding_when_the_level_that_held_was_a_lighter_load(tmp_path):
    # The server drifts once 3 requests overlap, whatever is cut: c=2 holds, c=4 drifts, cuts or none. The seed
    # cuts nothing at c=2 and something at c=4, so "drifted only in levels with cancellations" would be said.
    seed = quiet_seed(0.05, "c=2", "c=4", 40, 10)
    behaviour = Behaviour(latency=0.02, chunk_delay=0.005, words=6, drift_at=3)
    with FakeServer(behaviour) as server:
        _, summary, output = run(tmp_path, server, "cut", concurrency=[1, 2, 4], samples=8, seed=seed,
                                 cancel_share=0.05, cancel_after_tokens=1)
        _, uncut, _ = run(tmp_path, server, "uncut", concurrency=[1, 2, 4], samples=8, seed=seed)
    cells = cells_by_level(summary)
    assert cells[2]["cancelled"] == 0 and not cells[2]["drift"]
    assert cells[4]["cancelled"] > 0 and cells[4]["drift"]
    # The truth: without any cut, c=4 drifts all the same.
    assert cells_by_level(uncut)[4]["drift"]
    assert summary["drift_with_cancelled_levels"] == []
    assert "drifted only in levels with cancellations" not in output


def crafted(levels: dict[int, tuple[int, str]]) -> list[dict]:
    """Probe p1 at each level (8 samples in flight together) and companions, ``levels[c]``: (cuts, "serial",
    "drift" or "failed")."""
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
            add("companion", level, None, CANCELLED, cancel_planned=True, t_last_byte=level * 100.0 + 1)
        if level > 1:
            add("companion", level, "companion answer")
    return rows


def test_the_level_finding_names_as_held_only_levels_with_answers():
    # c=4 held with none cut; c=2 drifted with cuts; c=8 had no answer at all (every probe failed), nor any cut.
    rows = crafted({1: (0, "serial"), 2: (4, "drift"), 4: (0, "serial"), 8: (0, "failed")})
    summary = summarize(reduce_rows(rows, cuts_asked=True))
    assert summary.drift_with_cancelled_levels == ("p1@mixed",)
    [line] = cancel_findings(summary)
    assert line.endswith("held the serial output where none was cut: c=4"), line


def test_the_html_report_counts_no_cut_as_an_error(tmp_path):
    with FakeServer(Behaviour(latency=0.01, chunk_delay=0.01)) as server:
        rows, summary, _ = run(tmp_path, server, cancel_share=0.5, cancel_after_tokens=2)
    assert summary["cancelled"] > 0 and summary["errors"] == 0
    code, output = run_cli("report", tmp_path / "run", "--format", "html", "-o", tmp_path / "r.html")
    assert code == 0, output
    page = (tmp_path / "r.html").read_text()
    assert " 0 errors in " in page, page[page.index("Errors over time"):][:600]


def test_the_runs_total_of_cuts_is_printed_when_every_companion_was_cut(tmp_path):
    with FakeServer(Behaviour(latency=0.01, chunk_delay=0.01)) as server:
        rows, summary, output = run(tmp_path, server, cancel_share=1.0, cancel_after_tokens=1)
    cut = sum(1 for r in rows if r["status"] == CANCELLED)
    assert cut and summary["cancelled"] == cut and summary["companion_requests"] == 0
    assert f"{cut} cut by kevload" in output, output


class SlowAnswersDrift(FakeServer):
    """Under load, some requests are held long (queued: 0.6 s against 0.01 s); those answer otherwise, whatever is
    cut. A slow probe sample's flight meets most of the cuts of its level, a fast one's few."""

    def __init__(self):
        rng = random.Random(7)
        super().__init__(Behaviour(latency=0.01, chunk_delay=0.005, words=6,
                                   on_arrival=lambda _, active: 0.6 if active > 1 and rng.random() < 0.3 else None))

    def _answer(self, body, prompt, state):
        text = super()._answer(body, prompt, state)
        if time.monotonic() - state["arrived"] > 0.3:
            words = text.split(" ")
            words[3:] = [random.choice(WORDS) for _ in words[3:]]
            text = " ".join(words)
        return text


def test_no_beside_finding_on_a_server_that_drifts_on_its_slow_answers_cut_or_not(tmp_path):
    with SlowAnswersDrift() as server:
        _, summary, output = run(tmp_path, server, "cut", concurrency=[1, 4], samples=30, cancel_share=0.8,
                                 cancel_after_tokens=2)
        _, uncut, _ = run(tmp_path, server, "uncut", concurrency=[1, 4], samples=30)
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
    # c=2 drifts on every sample, its few cuts or none; c=4 holds. The seed cuts at c=2 and not at c=4.
    seed = quiet_seed(0.05, "c=4", "c=2", 60, 8)
    with DriftsInPairs(Behaviour(latency=0.1, chunk_delay=0.001, words=6)) as server:
        _, summary, output = run(tmp_path, server, "cut", concurrency=[1, 2, 4], samples=8, seed=seed,
                                 cancel_share=0.05, cancel_after_tokens=1)
        _, uncut, _ = run(tmp_path, server, "uncut", concurrency=[1, 2, 4], samples=8, seed=seed)
    cells = cells_by_level(summary)
    assert cells[2]["cancelled"] > 0 and cells[2]["drift"]
    assert cells[4]["cancelled"] == 0 and not cells[4]["drift"]
    assert cells_by_level(uncut)[2]["drift"]  # the truth: c=2 drifts without a cut
    assert summary["drift_with_cancelled_levels"] == []
    assert "drifted only in levels with cancellations" not in output


class SlowDone(FakeServer):
    """Sends the whole answer and its finish_reason at once, then waits 0.5 s before [DONE] (a gateway's pace)."""

    async def _stream(self, request, body, text, chat, fault, logprobs=None, cached=0, written=None):
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
        rows, summary, _ = run(tmp_path, server, samples=2, cancel_share=1.0, cancel_after_s=0.2)
    planned = [r for r in rows if r.get("cancel_planned")]
    assert planned and all(r["status"] == "ok" and r["finish_reason"] == "stop" for r in planned), \
        [r["status"] for r in planned]
    assert summary["cancelled"] == 0 and not server.disconnects
