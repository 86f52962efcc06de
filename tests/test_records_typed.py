"""Records read typed, with their ranges: a records file either summarizes or is refused naming its line (exit 2),
and records of an older version still read."""

from __future__ import annotations

import json
import shutil

import orjson
import pytest

from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer


@pytest.fixture(scope="module")
def healthy_run(tmp_path_factory):
    """A small run of a healthy server, summarized: the files a report reads."""
    tmp = tmp_path_factory.mktemp("healthy")
    with FakeServer(Behaviour(latency=0.0)) as server:
        scenario = write_scenario(tmp / "s.toml", server.url, concurrency=[1, 2], samples=3)
        code, output = run_cli("run", scenario, "--out", tmp / "run", "--quiet")
    assert code == 0, output
    return tmp / "run"


@pytest.mark.parametrize("value", ['"12"', "[3]", "-5", "10000000000000000000000000000000", "1e9"])
def test_a_records_file_with_an_impossible_count_is_refused_naming_its_line(tmp_path, healthy_run, value):
    run = shutil.copytree(healthy_run, tmp_path / "run")
    lines = (run / "records.jsonl").read_bytes().splitlines(keepends=True)
    assert b'"completion_tokens":' in lines[1]
    lines[1] = lines[1].replace(b'"completion_tokens":', b'"completion_tokens":' + value.encode() + b',"was":', 1)
    (run / "records.jsonl").write_bytes(b"".join(lines))
    code, output = run_cli("report", run, "--format", "json")
    assert code == 2, output  # before: a TypeError's traceback (string, list) or a negative tokens/s (-5)
    assert f"{run / 'records.jsonl'}:2: not a kevload record" in output and "$.completion_tokens" in output
    assert "Traceback" not in output


def test_a_torn_last_line_is_still_skipped(tmp_path, healthy_run):
    run = shutil.copytree(healthy_run, tmp_path / "run")
    whole = load_summary(run)
    with (run / "records.jsonl").open("ab") as handle:
        handle.write(b'{"run_id":"' + whole["run_id"].encode() + b'","seq":99,"probe":"p1","role":"pro')
    code, output = run_cli("report", run, "--format", "json")
    assert code == 0, output
    assert json.loads(output)["cells"] == whole["cells"]


def test_records_of_an_older_version_still_summarize_alike(tmp_path, healthy_run):
    run = shutil.copytree(healthy_run, tmp_path / "run")
    # A record as written before these fields existed (counted was the default then: every record was counted).
    later = ("counted", "max_in_flight", "reasoning", "tool_calls", "reconnects", "request_id", "worker",
             "logprob_nonfinite", "turn", "turns", "conversation", "history", "history_sha256", "conversation_sha256",
             "cache", "cached_tokens", "cancel_planned", "findings")
    rows = [orjson.loads(line) for line in (run / "records.jsonl").read_bytes().splitlines()]
    rows = [{**{k: v for k, v in row.items() if k not in later}, "a_later_field": [1]} for row in rows
            if row["counted"]]
    (run / "records.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    code, output = run_cli("report", run, "--format", "json")
    assert code == 0, output
    cells = cells_by_level(json.loads(output))
    assert {level: (cell["ok"], cell["distinct"]) for level, cell in cells.items()} == {1: (3, 1), 2: (3, 1)}

