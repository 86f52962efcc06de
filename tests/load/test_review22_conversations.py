"""Review of issue 22's conversations: false claims found with crafted servers, each a regression test."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from aiohttp import web

from kevload.compare import reader
from kevload.compare.reader import reduce_file
from kevload.compare.summarizing import summarize
from kevload.records.store import read_records
from tests.conftest import load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

TURNS = ["Name a colour.", "Why that one?", "Now a number.", "Thanks."]


class DriftsAtTurnOne(FakeServer):
    """Answers as the fake server does, except turn 1 (a request with two user messages): under load (another
    request overlapping it) it gets a random tail. Every other turn, given the same chat, answers the same."""

    def _answer(self, body: dict[str, Any], prompt: str, state: dict[str, Any]) -> str:
        text = super()._answer(body, prompt, state)
        if sum(m.get("role") == "user" for m in body.get("messages", ())) == 2 and state["max_overlap"] >= 2:
            return f"{text} {random.choice(('kilo', 'lima', 'mike'))}{random.random()}"
        return text


def test_turn_tally_leaves_out_conversations_that_are_no_sample(tmp_path):
    """Companion conversations at c=3: those still talking when the probe's level ends send their later turns with
    fewer others in flight, so they end uncounted; their earlier turns were counted when sent and went into the
    companion cell's turn tally, more answers at turn 0 than the cell has conversations."""
    (tmp_path / "chats.jsonl").write_text("".join(
        json.dumps({"id": f"k{i}", "system": "Chat.", "turns": [f"Hello {i}", "More", "Bye"], "max_tokens": 6}) + "\n"
        for i in range(2)))
    probe = {"id": "c1", "turns": TURNS, "max_tokens": 8}
    with FakeServer(Behaviour(words=6, latency=0.03)) as fake:
        scenario = write_scenario(tmp_path / "s.toml", fake.url, probes=[probe], concurrency=[1, 3], samples=3,
                                  logprobs=False, mode="mixed", companions="chats.jsonl")
        code, output = run_cli("run", scenario, "--out", tmp_path / "run")
        assert code == 0, output
    ends = [r for r in read_records(tmp_path / "run" / "records.jsonl") if r["turn"] == r["turns"] - 1]
    assert any(r["role"] == "companion" and not r["counted"] for r in ends)  # the case this test is about
    for cell in load_summary(tmp_path / "run")["cells"]:
        assert all(t["same_history"] <= cell["ok"] for t in cell["turns"]), (cell["probe"], cell["ok"], cell["turns"])


def test_a_drift_in_an_answer_the_file_replaces_shows_in_the_example(tmp_path):
    """``trip``'s shape: turn 1's answer is given, so the history of turn 2 holds the given text, not the answer
    turn 1 received. A server that drifts only at turn 1: the cell rightly drifts (the conversation hashes differ),
    but its example and first divergence were taken from a transcript built of the last turn's history, where turn
    1's answer is not: both examples the same text, "first divergence at char N" where nothing differs."""
    probe = {"id": "trip", "turns": ["a", {"user": "b", "assistant": "Given."}, "c"], "max_tokens": 8}
    with DriftsAtTurnOne(Behaviour(words=6)) as fake:
        scenario = write_scenario(tmp_path / "s.toml", fake.url, probes=[probe], concurrency=[1, 3], samples=3,
                                  logprobs=False)
        code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 1, output
    loaded = next(c for c in load_summary(tmp_path / "run")["cells"] if c["concurrency"] == 3)
    assert loaded["drift"] and loaded["first_divergent_turn"] == 1
    assert loaded["serial_example"] != loaded["divergent_example"]
    serial, divergent = loaded["serial_example"], loaded["divergent_example"]
    at = loaded["first_divergence_chars"] - loaded["example_offset"]
    assert serial[:at] == divergent[:at] and serial[at] != divergent[at]
    # The point is inside turn 1's answer as received: after its user line, before turn 2's.
    assert "user: b\nassistant: " in serial[:at] and "user: c" not in serial[:at]


def test_the_report_of_a_large_conversation_run_read_in_parts_is_the_one_read_whole(tmp_path, monkeypatch):
    """A large records file is read by parallel processes in parts: a conversation's turns may fall in two parts.
    The cells (samples, turns, examples) must be those of the file read in one piece."""
    (tmp_path / "chats.jsonl").write_text("".join(
        json.dumps({"id": f"k{i}", "turns": [f"Hello {i}", "More", "Bye"], "max_tokens": 6}) + "\n"
        for i in range(2)))
    probe = {"id": "trip", "turns": ["a", {"user": "b", "assistant": "Given."}, "c"], "max_tokens": 8}
    with DriftsAtTurnOne(Behaviour(words=6)) as fake:
        scenario = write_scenario(tmp_path / "s.toml", fake.url, probes=[probe], concurrency=[1, 3], samples=4,
                                  logprobs=False, mode="mixed", companions="chats.jsonl")
        run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    records = tmp_path / "run" / "records.jsonl"
    monkeypatch.setattr(reader, "_PARALLEL_BYTES", 0)
    whole = summarize(reduce_file(records, workers=1))
    assert any(c.first_divergent_turn == 1 for c in whole.cells)
    for workers in (3, 7):
        assert summarize(reduce_file(records, workers=workers)) == whole


@pytest.mark.parametrize("role", ["probes[0].dataset", "load.companions"])
def test_a_line_with_turns_and_a_messages_that_is_no_list_is_an_error_not_a_traceback(tmp_path, role):
    (tmp_path / "talks.jsonl").write_text(json.dumps({"id": "x", "turns": ["a"], "messages": 3}) + "\n")
    load: dict[str, Any] = {}
    probes = [{"dataset": "talks.jsonl"}]
    if role == "load.companions":
        load = {"mode": "mixed", "companions": "talks.jsonl"}
        probes = [{"id": "p", "prompt": "hi"}]
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", probes=probes, **load)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and "Traceback" not in output, output
    assert f"{tmp_path / 'talks.jsonl'}:1: {role}: messages: expected" in output



def test_failed_conversations_are_not_called_requests(tmp_path):
    """Two conversations of four turns, each failing at its last turn: 8 requests sent, 2 failed. The verdict read
    "target failed: 2 of 2 probe requests failed" and the companions' line counted conversations as requests too."""
    (tmp_path / "chats.jsonl").write_text("".join(
        json.dumps({"id": f"k{i}", "turns": [f"Hello {i}", "More", "Bye"], "max_tokens": 6}) + "\n" for i in range(2)))
    with FakeServer(Behaviour(words=6, faults=[None, None, None, "http_500"] * 2)) as fake:
        scenario = write_scenario(tmp_path / "s.toml", fake.url, probes=[{"id": "c1", "turns": TURNS}],
                                  concurrency=[1], samples=2, logprobs=False)
        code, output = run_cli("run", scenario, "--out", tmp_path / "run")
        assert len(fake.requests) == 8
    assert code == 3
    assert "target failed: 2 of 2 probe conversations failed (http_500: 2)" in " ".join(output.split()), output
    with FakeServer(Behaviour(words=6)) as fake:
        scenario = write_scenario(tmp_path / "m.toml", fake.url, concurrency=[1, 2], samples=8, logprobs=False,
                                  mode="mixed", companions="chats.jsonl")
        code, output = run_cli("run", scenario, "--out", tmp_path / "mixed")
    assert code == 0, output
    companions = load_summary(tmp_path / "mixed")["companion_requests"]
    assert companions
    assert f"companions: 0 of {companions} conversations failed" in " ".join(output.split()), output


def test_cases_build_leaves_a_conversation_out_saying_why(tmp_path):
    """A case is one request's input, asked again alone: `cases build` wrote a conversation probe's cells as cases
    with input null and the last turn's answers as the outputs (a cell that drifted at turn 1 and agreed at its last
    turn read "unstable" with one output), and `cases rerun` then refused its own file."""
    probe = {"id": "c1", "turns": ["a", "b", "c"], "max_tokens": 8}
    with DriftsAtTurnOne(Behaviour(words=6)) as fake:
        scenario = write_scenario(tmp_path / "s.toml", fake.url, probes=[probe, {"id": "p1", "prompt": "hi"}],
                                  concurrency=[1, 2], samples=3, logprobs=False)
        assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 1
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", tmp_path / "cases.jsonl")
    assert code == 0, output
    cases = [json.loads(line) for line in (tmp_path / "cases.jsonl").read_text().splitlines()]
    assert [c["input"] for c in cases] == ["hi", "hi"]
    assert "2 new, 0 kept, 2 skipped" in output
    assert output.count("a conversation") == 2, output


def test_a_sample_that_loses_full_load_mid_conversation_is_replaced(tmp_path):
    """c=2, one slot's turn answered 429 and retried after 0.3 s: meanwhile the other slot's next turn went alone,
    so its conversation, counted at its first turn, ended uncounted. The level had already counted it as one of its
    samples and sent no other: the cell came out short, "2 of 3 asked ok (no errors: the run was cut short)", an
    inconclusive verdict for a run that was neither cut nor short of answers."""
    with FakeServer(Behaviour(words=6, faults=[None] * 12 + ["http_429"], retry_after="0.3")) as fake:
        scenario = write_scenario(tmp_path / "s.toml", fake.url, probes=[{"id": "c1", "turns": TURNS}],
                                  concurrency=[2], samples=3, logprobs=False, retries=1)
        code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    first_counted = {r["conversation"] for r in records if r["turn"] == 0 and r["counted"]}
    ends = [r for r in records if r["turn"] == r["turns"] - 1 and not r["counted"]]
    # The case this test is about: counted at its first turn, uncounted at its end.
    assert any(r["conversation"] in first_counted for r in ends)
    assert "cut short" not in output
    cell = load_summary(tmp_path / "run")["cells"][0]
    assert code == 0 and cell["ok"] == 3 and not cell["short"], output


def test_a_conversation_cells_throughput_spans_whole_conversations(tmp_path):
    """A cell's duration (and so req/s, tok/s) ran from its first sample's last turn: at c=1, 3 conversations of 4
    turns read as if the first had taken one turn's time, and tok/s counted the last turns' tokens only."""
    with FakeServer(Behaviour(words=6, latency=0.05)) as fake:
        scenario = write_scenario(tmp_path / "s.toml", fake.url, probes=[{"id": "c1", "turns": TURNS}],
                                  concurrency=[1], samples=3, logprobs=False)
        assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    turns = [r for r in read_records(tmp_path / "run" / "records.jsonl") if r["role"] == "probe"]
    cell = load_summary(tmp_path / "run")["cells"][0]
    start, end = min(r["t_send"] for r in turns), max(r["t_last_byte"] for r in turns)
    assert cell["duration_s"] == pytest.approx(end - start, abs=1e-5)
    assert cell["output_tokens"] == sum(r["completion_tokens"] for r in turns) == 3 * len(TURNS) * 6
    assert cell["requests_per_s"] == pytest.approx(3 / (end - start), rel=1e-3)


class CutAtTurnZero(FakeServer):
    """The same text at every turn as the fake server gives, but turn 0 under load ends "length" instead of "stop":
    the conversations differ there (their hashes chain each turn's finish_reason), their texts do not."""

    def _whole(self, body: dict[str, Any], text: str, chat: bool, fault: str | None, *rest: Any) -> Any:
        response = super()._whole(body, text, chat, fault, *rest)
        if sum(m.get("role") == "user" for m in body.get("messages", ())) != 1 or len(self._active) < 1:
            return response
        doc = json.loads(response.body)
        doc["choices"][0]["finish_reason"] = "length"
        return web.json_response(doc)


def test_a_conversation_that_differs_only_in_an_earlier_finish_reason_shows_it(tmp_path):
    """A drifting cell whose conversations differ only in turn 0's finish_reason: its example was two identical
    transcripts and 'first divergence at char N' past where both end, kind token."""
    with CutAtTurnZero(Behaviour(words=6, latency=0.05)) as fake:
        scenario = write_scenario(tmp_path / "s.toml", fake.url, probes=[{"id": "c1", "turns": TURNS[:2]}],
                                  concurrency=[1, 3], samples=3, logprobs=False)
        code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 1, output
    loaded = next(c for c in load_summary(tmp_path / "run")["cells"] if c["concurrency"] == 3)
    assert loaded["drift"] and loaded["first_divergent_turn"] == 0
    assert loaded["serial_example"] != loaded["divergent_example"]
    assert "length" in loaded["divergent_example"] and "length" not in loaded["serial_example"]
