"""Failures get their type, are counted as the server sent them, and never enter the comparison;
retries only when asked, marked on the record, after the server's Retry-After."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kevload.records.store import read_records
from kevload.servers.processes import free_port
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario

FAULT_STATUS = {
    "http_500": "http_500",
    "http_503": "http_503",
    "reset_before": "reset",
    "stall_first_byte": "timeout",
    "malformed": "malformed",
    "wrong_content_type": "malformed",
    "empty_choices": "malformed",
}
STREAM_FAULT_STATUS = {
    "reset_mid_stream": "reset",
    "stall_mid_stream": "timeout",
    "truncated": "truncated",
    "malformed": "malformed",
    "wrong_content_type": "malformed",
}


@pytest.fixture(params=["lean", "aiohttp"])
def backend(request, monkeypatch):
    """Both HTTP clients: kevload's own for http://, aiohttp for https:// (forced here on http)."""
    monkeypatch.setenv("KEVLOAD_HTTP", request.param)
    return request.param


@pytest.mark.parametrize("stream", [False, True])
def test_each_fault_is_typed_and_counted(tmp_path, server, stream, backend):
    table = STREAM_FAULT_STATUS if stream else FAULT_STATUS
    faults = [None, *table, "trickle", None]
    server.behaviour.faults = faults
    server.behaviour.stall = 3.0
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=len(faults),
        stream=stream,
        max_error_share=1.0,
        target={"timeout": 0.6},
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    summary = load_summary(tmp_path / "run")
    expected: dict[str, int] = {}
    for fault in table:
        expected[table[fault]] = expected.get(table[fault], 0) + 1
    cell = cells_by_level(summary)[1]
    assert cell["errors"] == dict(sorted(expected.items()))
    assert cell["ok"] == 3  # two clean requests and the trickled one
    assert cell["distinct"] == 1, "a failure must never count as an output"
    assert code == 3 and cell["short"], (
        output
    )  # 3 ok of the samples asked: inconclusive, never "deterministic"
    statuses = [r["status"] for r in read_records(tmp_path / "run" / "records.jsonl")]
    assert statuses[0] == "ok" and statuses[-2:] == ["ok", "ok"]


def test_unreachable_target_exits_3(tmp_path, backend):
    url = f"http://127.0.0.1:{free_port()}/v1"
    scenario = write_scenario(tmp_path / "s.toml", url, concurrency=[1], samples=3)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 3
    assert "target failed" in output
    assert load_summary(tmp_path / "run")["errors_by_type"] == {"connect": 3}


def test_error_share_over_limit_exits_3(tmp_path, server):
    server.behaviour.faults = ["http_500"] * 3
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1], samples=6, max_error_share=0.2
    )
    code, _ = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 3


def test_killed_run_keeps_finished_records(tmp_path, server):
    server.behaviour.latency = 0.05
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=400)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kevload", "run", str(scenario), "--out", str(out), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    records = out / "records.jsonl"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (
            not records.exists() or records.read_bytes().count(b"\n") < 5
        ):
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    # Simulate the torn line a kill in the middle of a write leaves.
    with records.open("ab") as handle:
        handle.write(b'{"run_id": "torn')
    rows = list(read_records(records))
    assert len(rows) >= 5
    assert all(r["status"] == "ok" for r in rows)
    code, output = run_cli("report", out, "--format", "json")
    assert code == 3, output  # cut short: fewer samples than asked is inconclusive
    assert '"ok": ' in output


def test_counts_equal_what_the_server_injected(tmp_path, server):
    faults = [
        "http_500",
        None,
        "http_429",
        "reset_before",
        None,
        "malformed",
        "empty_choices",
        None,
        "http_503",
    ]
    server.behaviour.faults = faults
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1], samples=len(faults), max_error_share=1.0
    )
    run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    cell = cells_by_level(load_summary(tmp_path / "run"))[1]
    as_status = {
        "http_500": "http_500",
        "http_429": "http_429",
        "http_503": "http_503",
        "reset_before": "reset",
        "malformed": "malformed",
        "empty_choices": "malformed",
    }
    expected: dict[str, int] = {}
    for fault, n in server.injected.items():
        expected[as_status[fault]] = expected.get(as_status[fault], 0) + n
    assert cell["errors"] == dict(sorted(expected.items()))
    assert cell["ok"] == faults.count(None) and cell["distinct"] == 1


def test_no_retries_by_default_and_retries_marked(tmp_path, server):
    server.behaviour.faults = ["http_429", "http_503", None, None]
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1], samples=3, max_error_share=1.0
    )
    run_cli("run", scenario, "--out", tmp_path / "plain", "--quiet")
    assert cells_by_level(load_summary(tmp_path / "plain"))[1]["errors"] == {
        "http_429": 1,
        "http_503": 1,
    }

    server.behaviour.faults = ["http_429", None, "http_503", "http_503", None, None]
    server.requests.clear()
    code, output = run_cli(
        "run", scenario, "--out", tmp_path / "retried", "--quiet", "--retries", "2"
    )
    assert code == 0, output
    rows = list(read_records(tmp_path / "retried" / "records.jsonl"))
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]
    assert [r["retries"] for r in rows] == [1, 2, 0]


def test_retry_after_is_honoured(tmp_path, server):
    server.behaviour.faults = ["http_429", None]
    server.behaviour.retry_after = "0.6"
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=1)
    code, _ = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet", "--retries", "1")
    assert code == 0
    assert server.arrivals[1] - server.arrivals[0] >= 0.6
