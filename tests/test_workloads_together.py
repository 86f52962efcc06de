"""The workloads of #22 side by side: combinations whose claims would not hold are refused before anything is sent."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli, write_scenario

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
