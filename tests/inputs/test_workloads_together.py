"""Conversations, cancellations, trace replay and the prefix cache side by side: combinations whose
claims would not hold are refused before anything is sent."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kevload.compare.summarizing import summarize
from kevload.records.store import read_records
from tests.conftest import reduce_rows, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

_TRACE = (
    '{"timestamp": 0, "input_length": 4, "output_length": 2}\n'
    '{"timestamp": 500, "input_length": 4, "output_length": 2}\n'
)


@pytest.mark.parametrize(
    ("probe", "load", "message"),
    [
        # A replay sends its probes open loop; a conversation sample holds a closed-loop slot for
        # all its turns.
        (
            {"id": "c", "turns": ["a", "b"]},
            {"trace": "t.jsonl"},
            "load.trace: expected no trace with conversation probes",
        ),
        # A conversation's later turns are warm by its own earlier ones: cold has no meaning past
        # turn 0.
        (
            {"id": "c", "turns": ["a", "b"]},
            {"prefix_cache": "cold_warm", "samples": 2, "concurrency": [1]},
            'load.prefix_cache: expected "off" with conversation probes',
        ),
        # Cold and warm are compared serially; a replay is load.
        (
            {"id": "p", "prompt": "a"},
            {"prefix_cache": "cold_warm", "samples": 2, "concurrency": [1], "trace": "t.jsonl"},
            'load.trace: expected none with load.prefix_cache = "cold_warm"',
        ),
        # A stepped ramp's every_s is its levels' duration: the error names the key the file has,
        # not only load.duration.
        (
            {"id": "p", "prompt": "a"},
            {
                "trace": "t.jsonl",
                "concurrency": [1, 2],
                "ramp": {"of": "concurrency", "from": 1, "to": 2, "step": 1, "every_s": 2},
            },
            "load.duration: expected 0 with load.trace, nor load.ramp.every_s",
        ),
        (
            {"id": "p", "prompt": "a"},
            {
                "prefix_cache": "cold_warm",
                "samples": 2,
                "concurrency": [1],
                "ramp": {"of": "concurrency", "from": 1, "to": 1, "step": 1, "every_s": 2},
            },
            'load.duration: expected 0 with load.prefix_cache = "cold_warm", nor load.ramp.every_s',
        ),
    ],
)
def test_combinations_without_a_true_claim_exit_2(tmp_path, probe, load, message):
    (tmp_path / "t.jsonl").write_text(_TRACE)
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", probes=[probe], **load)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and message in output and "Traceback" not in output, output
    assert not (tmp_path / "run" / "records.jsonl").exists()


def test_a_cancelled_companion_conversation_ends_at_the_turn_the_cut_reached(tmp_path):
    """A companion conversation chosen to be cut is abandoned in its first turn, as a user closing
    the tab ends the chat: that turn is cancelled and no later turn of it is sent; conversations not
    chosen run every turn."""
    (tmp_path / "talks.jsonl").write_text(
        '{"id": "t", "turns": ["one", "two", "three"], "max_tokens": 8}\n'
    )
    server, companions, by_talk = _talks_cut(
        tmp_path,
        Behaviour(latency=0.02, chunk_delay=0.01),
        concurrency=[1, 3],
        samples=6,
        stream=True,
        cancel_share=0.5,
        cancel_after_tokens=2,
    )
    cut = [turns for turns in by_talk.values() if turns[0]["cancel_planned"]]
    whole = [turns for turns in by_talk.values() if not turns[0]["cancel_planned"]]
    assert cut and whole
    for turns in cut:
        # Cut in turn 0 after its 2 chunks (unless the level's end cut it first): nothing sent
        # after.
        assert [r["turn"] for r in turns] == [0] and turns[0]["status"] in (
            "cancelled",
            "timeout",
        ), turns
    assert all(
        [r["turn"] for r in turns] == [0, 1, 2] for turns in whole if turns[-1]["status"] == "ok"
    )
    assert len(server.disconnects) == sum(1 for turns in cut if turns[0]["status"] == "cancelled")


def test_a_case_from_a_cancelled_run_is_rerun_with_its_cuts(tmp_path):
    """A case keeps the load it was found in: a probe that drifted only beside cancelled companions,
    rerun among the same companions but none of them cut, would be called fixed (unstable→stable) by
    a load it never had."""
    scenario = write_scenario(
        tmp_path / "s.toml",
        "",
        mode="mixed",
        concurrency=[1, 3],
        samples=4,
        stream=True,
        cancel_share=0.5,
        cancel_after_tokens=2,
        cancel_after_s=9.0,
    )
    with FakeServer(Behaviour(latency=0.02, chunk_delay=0.01)) as server:
        code, output = run_cli(
            "run", scenario, "--out", tmp_path / "run", "--set", f'target.base_url="{server.url}"'
        )
    assert code == 0, output
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", tmp_path / "cases.jsonl")
    assert code == 0, output
    loads = [case["load"] for case in read_records(tmp_path / "cases.jsonl")]
    assert loads and all(
        load["cancel_share"] == 0.5
        and load["cancel_after_tokens"] == 2
        and load["cancel_after_s"] == 9.0
        for load in loads
        if load["concurrency"] > 1
    ), loads
    with FakeServer(Behaviour(latency=0.02, chunk_delay=0.01)) as server:
        code, output = run_cli(
            "cases",
            "rerun",
            tmp_path / "cases.jsonl",
            "--url",
            server.url,
            "--model",
            "fake",
            "--times",
            "4",
            "-o",
            tmp_path / "after.jsonl",
            "--out",
            tmp_path / "reruns",
        )
    assert code in (0, 1), output
    rerun = next(c for c in read_records(tmp_path / "after.jsonl") if c["load"]["concurrency"] > 1)
    # What it printed and wrote that it sent says so.
    assert (rerun["rerun"]["cancel_share"], rerun["rerun"]["cancel_after_tokens"]) == (0.5, 2), (
        rerun["rerun"]
    )
    records = read_records(Path(rerun["rerun_dir"]) / "records.jsonl")
    assert any(r["status"] == "cancelled" for r in records), records


def test_a_conversation_is_within_the_slo_only_if_every_turn_was(tmp_path):
    """A conversation cell's latency is its last turn's, but the SLO's attainment counts requests
    within every bound: a conversation whose first turn took 400 ms was counted within `e2e_ms =
    200` (100%, 'met') on its quick last turn. Each bound an earlier turn missed counts against its
    conversation, once."""
    scenario = write_scenario(
        tmp_path / "s.toml",
        "",
        probes=[{"id": "c", "turns": ["a", "b"], "max_tokens": 8}],
        concurrency=[1],
        samples=2,
        slo={"e2e_ms": 200},
        min_slo_attainment=1.0,
    )
    # Serially the requests arrive turn 0, turn 1, turn 0, turn 1: every first turn is slow.
    with FakeServer(
        Behaviour(latency=0.01, on_arrival=lambda i, _: 0.4 if i % 2 == 0 else None)
    ) as server:
        code, output = run_cli(
            "run", scenario, "--out", tmp_path / "run", "--set", f'target.base_url="{server.url}"'
        )
    assert code == 1 and "MISSED" in output, output
    code, output = run_cli("report", tmp_path / "run", "--format", "json")
    for summary in (
        json.loads(output),
        json.loads((tmp_path / "run" / "summary.json").read_text()),
    ):
        cell = summary["cells"][0]
        assert (cell["slo_met"], cell["slo_attainment"], cell["slo_misses"]) == (
            0,
            0.0,
            {"e2e": 2},
        ), cell


def _talks(
    samples: list[tuple[int, list[tuple[float, float]], str]], cuts: list[float]
) -> list[dict]:
    """Crafted records of conversation probe c: each sample (level, its turns' (send, last byte),
    its answers' tag) two turns long; companions of c=2 cut at ``cuts``."""
    rows: list[dict] = []

    def add(**fields) -> None:
        rows.append(
            {
                "run_id": "r",
                "seq": len(rows),
                "mode": "mixed",
                "rate": None,
                "counted": True,
                "finish_reason": "stop",
                "chunks": 2,
                "params": {},
                **fields,
            }
        )

    for n, (level, spans, tag) in enumerate(samples):
        chained, history = None, [{"role": "user", "content": "a"}]
        for turn, (t_send, t_last) in enumerate(spans):
            output = f"{tag}{turn}"
            sha = hashlib.sha256(output.encode()).hexdigest()
            chained = hashlib.sha256(f"{chained}{sha}".encode()).hexdigest()
            add(
                probe="c",
                role="probe",
                concurrency=level,
                status="ok",
                output=output,
                sha256=sha,
                turn=turn,
                turns=len(spans),
                conversation=f"talk{n}",
                history=list(history),
                history_sha256=hashlib.sha256(json.dumps(history).encode()).hexdigest(),
                conversation_sha256=chained,
                t_send=t_send,
                t_last_byte=t_last,
            )
            history += [{"role": "assistant", "content": output}, {"role": "user", "content": "b"}]
    for t in cuts:
        add(
            probe="x",
            role="companion",
            concurrency=2,
            status="cancelled",
            output=None,
            sha256=None,
            finish_reason=None,
            cancel_planned=True,
            t_send=t - 0.1,
            t_last_byte=t,
        )
    return rows


def test_a_conversation_sample_is_beside_a_cut_by_its_whole_flight_from_its_first_send():
    """A conversation sample's output is the whole conversation: whether a cut came beside it is
    measured from its first turn's send over the cell's shortest conversation, as its span. Measured
    on its last turn alone, four conversations that diverged in a long first turn with no cut near
    (a cut only in their last turn, 5 s after they began) were 'beside' those cuts, and kevload
    found that the probe 'drifted only beside cancellations'."""
    serial = [
        (1, [(10.0 * k, 10.0 * k + 0.2), (10.0 * k + 0.2, 10.0 * k + 0.4)], "s") for k in range(4)
    ]
    long_divergent = [
        (2, [(200.0 + 10 * k, 205.0 + 10 * k), (205.0 + 10 * k, 205.5 + 10 * k)], "d")
        for k in range(4)
    ]
    short_serial = [
        (2, [(300.0 + 10 * k, 300.5 + 10 * k), (300.5 + 10 * k, 301.0 + 10 * k)], "s")
        for k in range(4)
    ]
    summary = summarize(
        reduce_rows(
            _talks(serial + long_divergent + short_serial, cuts=[205.2 + 10 * k for k in range(4)]),
            cuts_asked=True,
        )
    )
    [cell] = [c for c in summary.probe_cells() if c.concurrency == 2]
    assert cell.drift and cell.cancelled == 4
    assert (cell.beside_cancelled, cell.divergent_apart_from_cancelled, cell.beside_window_s) == (
        0,
        4,
        1.0,
    ), cell
    assert summary.drift_beside_cancelled_cells == ()


def test_a_companion_conversation_is_cut_by_time_from_its_first_send(tmp_path):
    """load.cancel_after_s cuts a chosen companion so many seconds after its send; a conversation's
    send is its first turn's, as a user who closes the tab 0.25 s into the chat. Each turn once had
    a clock of its own: turns of 0.15 s never reached 0.25 s, and no chosen conversation was ever
    cut."""
    (tmp_path / "talks.jsonl").write_text(
        '{"id": "t", "turns": ["one", "two", "three"], "max_tokens": 8}\n'
    )
    server, companions, by_talk = _talks_cut(
        tmp_path,
        Behaviour(latency=0.15),
        concurrency=[1, 2],
        samples=2,
        cancel_share=1.0,
        cancel_after_s=0.25,
    )
    assert by_talk and all(r["cancel_planned"] for r in companions)
    for turns in by_talk.values():
        # Turn 0 answered at 0.15 s, turn 1 cut at 0.25 s (unless the level's end cut it first):
        # turn 2 never sent.
        assert [r["turn"] for r in turns] in ([0], [0, 1]) and turns[-1]["status"] == "cancelled", (
            turns
        )
        assert turns[-1]["t_last_byte"] - turns[0]["t_send"] < 0.3, turns


def _talks_cut(
    tmp_path, behaviour: Behaviour, **load
) -> tuple[FakeServer, list[dict], dict[str, list[dict]]]:
    """A mixed run among the companion conversations of talks.jsonl (written by the test) with
    ``load``'s cuts: the server, the companion records, and those records by conversation."""
    scenario = write_scenario(
        tmp_path / "s.toml", "", mode="mixed", companions="talks.jsonl", **load
    )
    with FakeServer(behaviour) as server:
        code, output = run_cli(
            "run", scenario, "--out", tmp_path / "run", "--set", f'target.base_url="{server.url}"'
        )
    assert code == 0, output
    companions = [
        r for r in read_records(tmp_path / "run" / "records.jsonl") if r["role"] == "companion"
    ]
    by_talk: dict[str, list[dict]] = {}
    for r in companions:
        by_talk.setdefault(r["conversation"], []).append(r)
    return server, companions, by_talk
