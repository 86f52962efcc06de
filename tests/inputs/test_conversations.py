"""Conversations against a crafted server whose truth is known: answers that depend on the whole
chat and drift under load only from a chosen turn on. The matrix must name exactly that turn, the
serial cell must stay bitwise, each turn's record must carry the history it was asked with, and the
counted rule must hold per sample. A cell's example, turn tally and throughput are those of whole
conversations; a failed conversation is called a conversation, not a request; `cases build` leaves
conversations out, saying why."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kevload.compare import reader
from kevload.compare.reader import reduce_file
from kevload.compare.summarizing import summarize
from kevload.inputs.conversation import MAX_TURNS, conversation_sha256, history_sha256
from kevload.inputs.scenario import load_scenario
from kevload.load import engine
from kevload.records.store import Record, read_records
from kevload.wire.client import Client
from tests.conftest import load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

TURNS = ["Name a colour.", "Why that one?", "Now a number.", "Thanks."]


def _run(
    tmp_path: Path, behaviour: Behaviour, *, probe: dict | None = None, **load
) -> tuple[int, str, Path]:
    probe = probe or {"id": "c1", "system": "Answer briefly.", "turns": TURNS, "max_tokens": 8}
    with FakeServer(behaviour) as fake:
        scenario = write_scenario(
            tmp_path / "s.toml",
            fake.url,
            probes=[probe],
            **{"concurrency": [1, 3], "samples": 4, "logprobs": False, **load},
        )
        code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    return code, output, tmp_path / "run"


def _records(run: Path) -> list[dict]:
    return list(read_records(run / "records.jsonl"))


@pytest.mark.parametrize("turn", [1, 2])
def test_matrix_names_the_first_turn_that_drifts(tmp_path, turn):
    code, output, run = _run(tmp_path, Behaviour(drift_from_turn=turn, words=8, diverge_at_word=2))
    assert code == 1, output
    summary = load_summary(run)
    assert summary["matrix"]["first_divergent_turn"] == [[None, turn]]
    serial, loaded = (next(c for c in summary["cells"] if c["concurrency"] == n) for n in (1, 3))
    # Serially every conversation is the same, bitwise, at every turn.
    assert serial["distinct"] == 1 and not serial["drift"] and serial["ok"] == 4
    assert all(t["differ"] == 0 and t["same_history"] == 4 for t in serial["turns"])
    # Under load the turns before the drifting one agree given the serial history; that turn does
    # not.
    by_turn = {t["turn"]: t for t in loaded["turns"]}
    assert all(by_turn[k]["differ"] == 0 and by_turn[k]["same_history"] == 4 for k in range(turn))
    assert by_turn[turn]["differ"] == 4
    # After it no sample has the serial history any more: nothing is compared there.
    assert all(by_turn[k]["same_history"] == 0 for k in range(turn + 1, len(TURNS)))
    assert loaded["drift"] and loaded["ok"] == 4
    assert f"leaves the serial conversation at turn {turn} (0-based)" in output
    assert f"DRIFT t{turn}" in output


def test_deterministic_conversation_and_each_turn_asked_with_the_answers_received(tmp_path):
    probe = {
        "id": "c1",
        "turns": [TURNS[0], {"user": TURNS[1], "assistant": "Given answer."}, TURNS[2]],
        "max_tokens": 8,
    }
    code, output, run = _run(tmp_path, Behaviour(words=6), probe=probe)
    assert code == 0, output
    summary = load_summary(run)
    assert summary["matrix"]["first_divergent_turn"] == [[None, None]]
    assert "t0 " not in output and "leaves the serial" not in output
    records = _records(run)
    by_conversation: dict[str, list[dict]] = {}
    for r in records:
        by_conversation.setdefault(r["conversation"], []).append(r)
    for turns in by_conversation.values():
        turns.sort(key=lambda r: r["turn"])
        assert [r["turn"] for r in turns] == [0, 1, 2] and {r["turns"] for r in turns} == {3}
        assert turns[0]["request_id"] == turns[0]["conversation"]
        # Turn 1 is asked with turn 0's answer as received; turn 2 with the given answer, not turn
        # 1's own.
        assert turns[1]["history"] == [
            {"role": "user", "content": TURNS[0]},
            {"role": "assistant", "content": turns[0]["output"]},
            {"role": "user", "content": TURNS[1]},
        ]
        assert turns[2]["history"][3] == {"role": "assistant", "content": "Given answer."}
        assert turns[2]["history"][3]["content"] != turns[1]["output"]
        chained = None
        for r in turns:
            assert r["history_sha256"] == history_sha256(r["history"])
            chained = conversation_sha256(chained, r["sha256"], r["finish_reason"])
            assert r["conversation_sha256"] == chained


def test_counted_rule_holds_per_conversation_sample(tmp_path):
    code, output, run = _run(tmp_path, Behaviour(words=6, latency=0.03))
    assert code == 0, output
    records = [r for r in _records(run) if r["concurrency"] == 3]
    ends = [r for r in records if r["turn"] == r["turns"] - 1]
    counted = [r for r in ends if r["counted"]]
    assert len(counted) == 4  # load.samples conversations, each counted by its last turn
    turns_of = {}
    for r in records:
        turns_of.setdefault(r["conversation"], []).append(r)
    for r in counted:
        # A counted conversation: every one of its turns went with exactly c - 1 others in flight,
        # and counted.
        assert all(t["counted"] and t["in_flight"] == 2 for t in turns_of[r["conversation"]])
    # The ramp-up's conversations (sent while the slots filled) are on record and never counted.
    assert any(not r["counted"] for r in ends)
    summary = load_summary(run)
    loaded = next(c for c in summary["cells"] if c["concurrency"] == 3)
    assert loaded["ok"] == 4 and loaded["samples_never_full"] == 0


def test_report_recomputes_the_conversation_cells_from_records(tmp_path):
    code, _, run = _run(tmp_path, Behaviour(drift_from_turn=2, words=8, diverge_at_word=2))
    assert code == 1
    before = load_summary(run)
    code, output = run_cli("report", run, "--format", "json")
    after = json.loads(output)
    assert (
        after["matrix"]["first_divergent_turn"]
        == before["matrix"]["first_divergent_turn"]
        == [[None, 2]]
    )
    assert [c["turns"] for c in after["cells"]] == [c["turns"] for c in before["cells"]]


def test_failed_turn_ends_its_conversation_and_is_the_samples_error(tmp_path):
    # The second request is turn 1 of the first serial conversation: it fails, so turns 2 and 3 are
    # never sent.
    code, output, run = _run(
        tmp_path, Behaviour(words=6, faults=[None, "http_500"]), concurrency=[1]
    )
    records = _records(run)
    first = [r for r in records if r["sample"] == 0]
    assert [(r["turn"], r["status"]) for r in first] == [(0, "ok"), (1, "http_500")]
    cell = load_summary(run)["cells"][0]
    assert cell["errors"] == {"http_500": 1} and cell["ok"] == 3


def test_companion_conversations_grow_around_the_probe(tmp_path):
    (tmp_path / "chats.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "id": f"k{i}",
                    "system": "Chat.",
                    "turns": [f"Hello {i}", "More", "Bye"],
                    "max_tokens": 6,
                }
            )
            + "\n"
            for i in range(3)
        )
    )
    code, output, run = _run(
        tmp_path,
        Behaviour(words=6),
        probe={"id": "p1", "prompt": "Hi", "max_tokens": 6},
        mode="mixed",
        companions="chats.jsonl",
    )
    assert code == 0, output
    companions = [r for r in _records(run) if r["role"] == "companion"]
    assert companions and all(r["turns"] == 3 for r in companions)
    later = [r for r in companions if r["turn"] == 2 and r["status"] == "ok"]
    assert later and all(
        len(r["history"]) == 6 and r["history"][0]["role"] == "system" for r in later
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"id": "x", "turns": "hello"}, "turns: expected a list of 1 to 64 user messages"),
        ({"id": "x", "turns": []}, "turns: expected a list of 1 to 64"),
        ({"id": "x", "turns": ["a"] * (MAX_TURNS + 1)}, "turns: expected a list of 1 to 64"),
        ({"id": "x", "turns": ["a", {"user": 3}]}, "turns[1].user: expected a string, got 3"),
        (
            {"id": "x", "turns": ["a", {"user": "b", "assistant": 4}]},
            "turns[1].assistant: expected a string",
        ),
        (
            {"id": "x", "turns": ["a", {"user": "b", "asistant": "c"}]},
            "turns[1]: expected a string or a table",
        ),
        (
            {"id": "x", "prompt": "p", "turns": ["a"]},
            "expected exactly one of prompt, messages or turns",
        ),
        ({"id": "x", "prompt": "p", "system": "s"}, "system: expected a string beside turns"),
    ],
)
def test_bad_conversation_lines_name_file_and_line(tmp_path, line, message):
    (tmp_path / "talks.jsonl").write_text(
        json.dumps({"id": "ok", "turns": ["fine"]}) + "\n" + json.dumps(line) + "\n"
    )
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", probes=[{"dataset": "talks.jsonl"}]
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2
    assert f"{tmp_path / 'talks.jsonl'}:2: probes[0].dataset: {message}" in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("probe", "load", "message"),
    [
        (
            {"id": "c", "turns": ["a", {"user": 1}]},
            {},
            "probes[0].turns[1].user: expected a string, got 1",
        ),
        (
            {"id": "c", "prompt": "a", "system": "s"},
            {},
            "probes[0].system: expected turns beside it",
        ),
        (
            {"id": "c", "prompt": "a", "turns": ["b"]},
            {},
            "probes[0]: expected exactly one of prompt, messages or turns",
        ),
        (
            {"id": "c", "turns": ["a"]},
            {"workers": 2},
            "load.workers: expected 1 with conversations",
        ),
        (
            {"id": "c", "turns": ["a"]},
            {"rate": [2.0]},
            "load.rate: expected no rate with conversation probes",
        ),
        (
            {"id": "c", "turns": ["a"]},
            {"until_bound": 0.1},
            "load.until_bound: expected no bound with conversation",
        ),
    ],
)
def test_bad_conversation_tables_exit_2_naming_the_key(tmp_path, probe, load, message):
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", probes=[probe], **load)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and message in output and "Traceback" not in output, output


def test_nothing_is_sent_after_a_stop_mid_conversation(tmp_path):
    """A stop while turn 1 is in flight: its answer is recorded uncounted, and turns 2 and 3 are
    never sent."""
    stop = asyncio.Event()

    async def collect(fake: FakeServer) -> list[Record]:
        loop = asyncio.get_running_loop()

        def stop_at_turn_1(index: int, _: int) -> None:
            if index == 1:
                loop.call_soon_threadsafe(stop.set)

        fake.behaviour.on_arrival = stop_at_turn_1
        scenario = load_scenario(
            write_scenario(
                tmp_path / "s.toml",
                fake.url,
                concurrency=[1],
                samples=2,
                logprobs=False,
                probes=[{"id": "c1", "turns": TURNS}],
            )
        )
        async with Client(scenario.target, None) as client:
            return [record async for record in engine.run(scenario, client, run_id="r", stop=stop)]

    with FakeServer(Behaviour(words=6)) as fake:
        records = asyncio.run(collect(fake))
        assert len(fake.requests) == 2
    assert [(r.turn, r.status, r.counted) for r in records] == [(0, "ok", True), (1, "ok", False)]
    assert not any(r.is_sample for r in records)


def test_resume_sends_the_conversations_a_run_lacks(tmp_path):
    """A run cut after one turn of its third serial conversation: --resume counts the two whole ones
    it has (not their turns) and sends the rest, whole conversations again."""
    probe = {"id": "c1", "turns": TURNS, "max_tokens": 8}
    with FakeServer(Behaviour(words=6)) as fake:
        scenario = write_scenario(
            tmp_path / "s.toml",
            fake.url,
            probes=[probe],
            concurrency=[1, 2],
            samples=3,
            logprobs=False,
        )
        run = tmp_path / "run"
        assert run_cli("run", scenario, "--out", run, "--quiet")[0] == 0
        lines = (run / "records.jsonl").read_text().splitlines(keepends=True)
        (run / "records.jsonl").write_text(
            "".join(lines[: 2 * len(TURNS) + 1])
        )  # two conversations and one turn
        meta = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**meta, "state": "interrupted"}))
        sent = len(fake.requests)
        code, output = run_cli("run", "--resume", run, "--quiet")
        assert code == 0, output
        # The third serial conversation whole, then the c=2 level: nothing of the two kept ones
        # again.
        assert fake.requests[sent]["messages"] == [{"role": "user", "content": TURNS[0]}]
    records = _records(run)
    serial_ends = [
        r for r in records if r["concurrency"] == 1 and r["counted"] and r["turn"] == r["turns"] - 1
    ]
    assert sorted(r["sample"] for r in serial_ends) == [0, 1, 2]
    assert sum(r["concurrency"] == 1 for r in records) == 3 * len(TURNS) + 1
    assert [c["ok"] for c in load_summary(run)["cells"]] == [3, 3]
    # The cut conversation's first turn stays on disk, counted when sent, but it never ended: no
    # sample, so the per-turn tally leaves it out (it once counted 4 answers at turn 0 in a cell of
    # 3).
    for cell in load_summary(run)["cells"]:
        assert [t["same_history"] for t in cell["turns"]] == [3] * len(TURNS), cell["turns"]


class DriftsAtTurnOne(FakeServer):
    """Answers as the fake server does, except turn 1 (a request with two user messages): under load
    (another request overlapping it) it gets a random tail. Every other turn, given the same chat,
    answers the same."""

    def _answer(self, body: dict[str, Any], prompt: str, state: dict[str, Any]) -> str:
        text = super()._answer(body, prompt, state)
        if (
            sum(m.get("role") == "user" for m in body.get("messages", ())) == 2
            and state["max_overlap"] >= 2
        ):
            return f"{text} {random.choice(('kilo', 'lima', 'mike'))}{random.random()}"
        return text


def test_turn_tally_leaves_out_conversations_that_are_no_sample(tmp_path):
    """Companion conversations at c=3: those still talking when the probe's level ends send their
    later turns with fewer others in flight, so they end uncounted; their earlier turns were counted
    when sent and went into the companion cell's turn tally, more answers at turn 0 than the cell
    has conversations."""
    (tmp_path / "chats.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "id": f"k{i}",
                    "system": "Chat.",
                    "turns": [f"Hello {i}", "More", "Bye"],
                    "max_tokens": 6,
                }
            )
            + "\n"
            for i in range(2)
        )
    )
    probe = {"id": "c1", "turns": TURNS, "max_tokens": 8}
    with FakeServer(Behaviour(words=6, latency=0.03)) as fake:
        scenario = write_scenario(
            tmp_path / "s.toml",
            fake.url,
            probes=[probe],
            concurrency=[1, 3],
            samples=3,
            logprobs=False,
            mode="mixed",
            companions="chats.jsonl",
        )
        code, output = run_cli("run", scenario, "--out", tmp_path / "run")
        assert code == 0, output
    ends = [
        r for r in read_records(tmp_path / "run" / "records.jsonl") if r["turn"] == r["turns"] - 1
    ]
    assert any(
        r["role"] == "companion" and not r["counted"] for r in ends
    )  # the case this test is about
    for cell in load_summary(tmp_path / "run")["cells"]:
        assert all(t["same_history"] <= cell["ok"] for t in cell["turns"]), (
            cell["probe"],
            cell["ok"],
            cell["turns"],
        )


def test_a_drift_in_an_answer_the_file_replaces_shows_in_the_example(tmp_path):
    """``trip``'s shape: turn 1's answer is given, so the history of turn 2 holds the given text,
    not the answer turn 1 received. A server that drifts only at turn 1: the cell rightly drifts
    (the conversation hashes differ), but its example and first divergence were taken from a
    transcript built of the last turn's history, where turn 1's answer is not: both examples the
    same text, "first divergence at char N" where nothing differs."""
    probe = {
        "id": "trip",
        "turns": ["a", {"user": "b", "assistant": "Given."}, "c"],
        "max_tokens": 8,
    }
    with DriftsAtTurnOne(Behaviour(words=6)) as fake:
        scenario = write_scenario(
            tmp_path / "s.toml",
            fake.url,
            probes=[probe],
            concurrency=[1, 3],
            samples=3,
            logprobs=False,
        )
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


def test_the_report_of_a_large_conversation_run_read_in_parts_is_the_one_read_whole(
    tmp_path, monkeypatch
):
    """A large records file is read by parallel processes in parts: a conversation's turns may fall
    in two parts. The cells (samples, turns, examples) must be those of the file read in one
    piece."""
    (tmp_path / "chats.jsonl").write_text(
        "".join(
            json.dumps({"id": f"k{i}", "turns": [f"Hello {i}", "More", "Bye"], "max_tokens": 6})
            + "\n"
            for i in range(2)
        )
    )
    probe = {
        "id": "trip",
        "turns": ["a", {"user": "b", "assistant": "Given."}, "c"],
        "max_tokens": 8,
    }
    with DriftsAtTurnOne(Behaviour(words=6)) as fake:
        scenario = write_scenario(
            tmp_path / "s.toml",
            fake.url,
            probes=[probe],
            concurrency=[1, 3],
            samples=4,
            logprobs=False,
            mode="mixed",
            companions="chats.jsonl",
        )
        run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    records = tmp_path / "run" / "records.jsonl"
    monkeypatch.setattr(reader, "_PARALLEL_BYTES", 0)
    whole = summarize(reduce_file(records, workers=1))
    assert any(c.first_divergent_turn == 1 for c in whole.cells)
    for workers in (3, 7):
        assert summarize(reduce_file(records, workers=workers)) == whole


@pytest.mark.parametrize("role", ["probes[0].dataset", "load.companions"])
def test_a_line_with_turns_and_a_messages_that_is_no_list_is_an_error_not_a_traceback(
    tmp_path, role
):
    (tmp_path / "talks.jsonl").write_text(
        json.dumps({"id": "x", "turns": ["a"], "messages": 3}) + "\n"
    )
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
    """Two conversations of four turns, each failing at its last turn: 8 requests sent, 2 failed.
    The verdict read "target failed: 2 of 2 probe requests failed" and the companions' line counted
    conversations as requests too."""
    (tmp_path / "chats.jsonl").write_text(
        "".join(
            json.dumps({"id": f"k{i}", "turns": [f"Hello {i}", "More", "Bye"], "max_tokens": 6})
            + "\n"
            for i in range(2)
        )
    )
    with FakeServer(Behaviour(words=6, faults=[None, None, None, "http_500"] * 2)) as fake:
        scenario = write_scenario(
            tmp_path / "s.toml",
            fake.url,
            probes=[{"id": "c1", "turns": TURNS}],
            concurrency=[1],
            samples=2,
            logprobs=False,
        )
        code, output = run_cli("run", scenario, "--out", tmp_path / "run")
        assert len(fake.requests) == 8
    assert code == 3
    assert "target failed: 2 of 2 probe conversations failed (http_500: 2)" in " ".join(
        output.split()
    ), output
    with FakeServer(Behaviour(words=6)) as fake:
        scenario = write_scenario(
            tmp_path / "m.toml",
            fake.url,
            concurrency=[1, 2],
            samples=8,
            logprobs=False,
            mode="mixed",
            companions="chats.jsonl",
        )
        code, output = run_cli("run", scenario, "--out", tmp_path / "mixed")
    assert code == 0, output
    companions = load_summary(tmp_path / "mixed")["companion_requests"]
    assert companions
    assert f"companions: 0 of {companions} conversations failed" in " ".join(output.split()), output


def test_cases_build_leaves_a_conversation_out_saying_why(tmp_path):
    """A case is one request's input, asked again alone: `cases build` wrote a conversation probe's
    cells as cases with input null and the last turn's answers as the outputs (a cell that drifted
    at turn 1 and agreed at its last turn read "unstable" with one output), and `cases rerun` then
    refused its own file."""
    probe = {"id": "c1", "turns": ["a", "b", "c"], "max_tokens": 8}
    with DriftsAtTurnOne(Behaviour(words=6)) as fake:
        scenario = write_scenario(
            tmp_path / "s.toml",
            fake.url,
            probes=[probe, {"id": "p1", "prompt": "hi"}],
            concurrency=[1, 2],
            samples=3,
            logprobs=False,
        )
        assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 1
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", tmp_path / "cases.jsonl")
    assert code == 0, output
    cases = [json.loads(line) for line in (tmp_path / "cases.jsonl").read_text().splitlines()]
    assert [c["input"] for c in cases] == ["hi", "hi"]
    assert "2 new, 0 kept, 2 skipped" in output
    assert output.count("a conversation") == 2, output


def test_a_sample_that_loses_full_load_mid_conversation_is_replaced(tmp_path):
    """c=2, one slot's turn answered 429 and retried after 0.3 s: meanwhile the other slot's next
    turn went alone, so its conversation, counted at its first turn, ended uncounted. The level had
    already counted it as one of its samples and sent no other: the cell came out short, "2 of 3
    asked ok (no errors: the run was cut short)", an inconclusive verdict for a run that was neither
    cut nor short of answers."""
    with FakeServer(
        Behaviour(words=6, faults=[None] * 12 + ["http_429"], retry_after="0.3")
    ) as fake:
        scenario = write_scenario(
            tmp_path / "s.toml",
            fake.url,
            probes=[{"id": "c1", "turns": TURNS}],
            concurrency=[2],
            samples=3,
            logprobs=False,
            retries=1,
        )
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
    """A cell's duration (and so req/s, tok/s) ran from its first sample's last turn: at c=1, 3
    conversations of 4 turns read as if the first had taken one turn's time, and tok/s counted the
    last turns' tokens only."""
    with FakeServer(Behaviour(words=6, latency=0.05)) as fake:
        scenario = write_scenario(
            tmp_path / "s.toml",
            fake.url,
            probes=[{"id": "c1", "turns": TURNS}],
            concurrency=[1],
            samples=3,
            logprobs=False,
        )
        assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    turns = [r for r in read_records(tmp_path / "run" / "records.jsonl") if r["role"] == "probe"]
    cell = load_summary(tmp_path / "run")["cells"][0]
    start, end = min(r["t_send"] for r in turns), max(r["t_last_byte"] for r in turns)
    assert cell["duration_s"] == pytest.approx(end - start, abs=1e-5)
    assert cell["output_tokens"] == sum(r["completion_tokens"] for r in turns) == 3 * len(TURNS) * 6
    assert cell["requests_per_s"] == pytest.approx(3 / (end - start), rel=1e-3)


class CutAtTurnZero(FakeServer):
    """The same text at every turn as the fake server gives, but turn 0 under load ends "length"
    instead of "stop": the conversations differ there (their hashes chain each turn's
    finish_reason), their texts do not."""

    def _whole(
        self, body: dict[str, Any], text: str, chat: bool, fault: str | None, *rest: Any
    ) -> Any:
        response = super()._whole(body, text, chat, fault, *rest)
        if (
            sum(m.get("role") == "user" for m in body.get("messages", ())) != 1
            or len(self._active) < 1
        ):
            return response
        doc = json.loads(response.body)
        doc["choices"][0]["finish_reason"] = "length"
        return web.json_response(doc)


def test_a_conversation_that_differs_only_in_an_earlier_finish_reason_shows_it(tmp_path):
    """A drifting cell whose conversations differ only in turn 0's finish_reason: its example was
    two identical transcripts and 'first divergence at char N' past where both end, kind token."""
    with CutAtTurnZero(Behaviour(words=6, latency=0.05)) as fake:
        scenario = write_scenario(
            tmp_path / "s.toml",
            fake.url,
            probes=[{"id": "c1", "turns": TURNS[:2]}],
            concurrency=[1, 3],
            samples=3,
            logprobs=False,
        )
        code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 1, output
    loaded = next(c for c in load_summary(tmp_path / "run")["cells"] if c["concurrency"] == 3)
    assert loaded["drift"] and loaded["first_divergent_turn"] == 0
    assert loaded["serial_example"] != loaded["divergent_example"]
    assert "length" in loaded["divergent_example"] and "length" not in loaded["serial_example"]
