"""The workloads of #22 side by side: combinations whose claims would not hold are refused before anything is sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kevload.store import read_records
from tests.conftest import run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

_TRACE = ('{"timestamp": 0, "input_length": 4, "output_length": 2}\n'
          '{"timestamp": 500, "input_length": 4, "output_length": 2}\n')


@pytest.mark.parametrize(("probe", "load", "message"), [
    # A replay sends its probes open loop; a conversation sample holds a closed-loop slot for all its turns.
    ({"id": "c", "turns": ["a", "b"]}, {"trace": "t.jsonl"}, "load.trace: expected no trace with conversation probes"),
    # A conversation's later turns are warm by its own earlier ones: cold has no meaning past turn 0.
    ({"id": "c", "turns": ["a", "b"]}, {"prefix_cache": "cold_warm", "samples": 2, "concurrency": [1]},
     'load.prefix_cache: expected "off" with conversation probes'),
    # Cold and warm are compared serially; a replay is load.
    ({"id": "p", "prompt": "a"}, {"prefix_cache": "cold_warm", "samples": 2, "concurrency": [1], "trace": "t.jsonl"},
     'load.trace: expected none with load.prefix_cache = "cold_warm"'),
])
def test_combinations_without_a_true_claim_exit_2(tmp_path, probe, load, message):
    (tmp_path / "t.jsonl").write_text(_TRACE)
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", probes=[probe], **load)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and message in output and "Traceback" not in output, output
    assert not (tmp_path / "run" / "records.jsonl").exists()


def test_a_cancelled_companion_conversation_ends_at_the_turn_the_cut_reached(tmp_path):
    """A companion conversation chosen to be cut is abandoned in its first turn, as a user closing the tab ends
    the chat: that turn is cancelled and no later turn of it is sent; conversations not chosen run every turn."""
    (tmp_path / "talks.jsonl").write_text('{"id": "t", "turns": ["one", "two", "three"], "max_tokens": 8}\n')
    scenario = write_scenario(tmp_path / "s.toml", "", mode="mixed", concurrency=[1, 3], samples=6, stream=True,
                              companions="talks.jsonl", cancel_share=0.5, cancel_after_tokens=2)
    with FakeServer(Behaviour(latency=0.02, chunk_delay=0.01)) as server:
        code, output = run_cli("run", scenario, "--out", tmp_path / "run",
                               "--set", f'target.base_url="{server.url}"')
    assert code == 0, output
    companions = [r for r in read_records(tmp_path / "run" / "records.jsonl") if r["role"] == "companion"]
    by_talk: dict[str, list[dict]] = {}
    for r in companions:
        by_talk.setdefault(r["conversation"], []).append(r)
    cut = [turns for turns in by_talk.values() if turns[0]["cancel_planned"]]
    whole = [turns for turns in by_talk.values() if not turns[0]["cancel_planned"]]
    assert cut and whole
    for turns in cut:
        # Cut in turn 0 after its 2 chunks (unless the level's end cut it first): nothing sent after.
        assert [r["turn"] for r in turns] == [0] and turns[0]["status"] in ("cancelled", "timeout"), turns
    assert all([r["turn"] for r in turns] == [0, 1, 2] for turns in whole if turns[-1]["status"] == "ok")
    assert len(server.disconnects) == sum(1 for turns in cut if turns[0]["status"] == "cancelled")


def test_a_case_from_a_cancelled_run_is_rerun_with_its_cuts(tmp_path):
    """A case keeps the load it was found in: a probe that drifted only beside cancelled companions, rerun among
    the same companions but none of them cut, would be called fixed (unstable→stable) by a load it never had."""
    scenario = write_scenario(tmp_path / "s.toml", "", mode="mixed", concurrency=[1, 3], samples=4, stream=True,
                              cancel_share=0.5, cancel_after_tokens=2, cancel_after_s=9.0)
    with FakeServer(Behaviour(latency=0.02, chunk_delay=0.01)) as server:
        code, output = run_cli("run", scenario, "--out", tmp_path / "run",
                               "--set", f'target.base_url="{server.url}"')
    assert code == 0, output
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", tmp_path / "cases.jsonl")
    assert code == 0, output
    loads = [case["load"] for case in read_records(tmp_path / "cases.jsonl")]
    assert loads and all(load["cancel_share"] == 0.5 and load["cancel_after_tokens"] == 2
                         and load["cancel_after_s"] == 9.0 for load in loads if load["concurrency"] > 1), loads
    with FakeServer(Behaviour(latency=0.02, chunk_delay=0.01)) as server:
        code, output = run_cli("cases", "rerun", tmp_path / "cases.jsonl", "--url", server.url, "--model", "fake",
                               "--times", "4", "-o", tmp_path / "after.jsonl", "--out", tmp_path / "reruns")
    assert code in (0, 1), output
    rerun = next(c for c in read_records(tmp_path / "after.jsonl") if c["load"]["concurrency"] > 1)
    records = read_records(Path(rerun["rerun_dir"]) / "records.jsonl")
    assert any(r["status"] == "cancelled" for r in records), records


def test_a_conversation_is_within_the_slo_only_if_every_turn_was(tmp_path):
    """A conversation cell's latency is its last turn's, but the SLO's attainment counts requests within every bound:
    a conversation whose first turn took 400 ms was counted within `e2e_ms = 200` (100%, 'met') on its quick last
    turn. Each bound an earlier turn missed counts against its conversation, once."""
    scenario = write_scenario(tmp_path / "s.toml", "", probes=[{"id": "c", "turns": ["a", "b"], "max_tokens": 8}],
                              concurrency=[1], samples=2, slo={"e2e_ms": 200}, min_slo_attainment=1.0)
    # Serially the requests arrive turn 0, turn 1, turn 0, turn 1: every first turn is slow.
    with FakeServer(Behaviour(latency=0.01, on_arrival=lambda i, _: 0.4 if i % 2 == 0 else None)) as server:
        code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--set",
                               f'target.base_url="{server.url}"')
    assert code == 1 and "MISSED" in output, output
    code, output = run_cli("report", tmp_path / "run", "--format", "json")
    for summary in (json.loads(output), json.loads((tmp_path / "run" / "summary.json").read_text())):
        cell = summary["cells"][0]
        assert (cell["slo_met"], cell["slo_attainment"], cell["slo_misses"]) == (0, 0.0, {"e2e": 2}), cell
