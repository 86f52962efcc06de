"""Interruptions, retries, resume and secrets: the moments a harness must not break or lie."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kevload.records.store import read_records
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario

SECRET = "sk-kevload-test-7f3a9c1e55d24b"
HEADER_SECRET = "hdr-kevload-test-91ab77c0"


def test_counts_equal_what_the_server_injected(tmp_path, server):
    faults = ["http_500", None, "http_429", "reset_before", None, "malformed", "empty_choices", None, "http_503"]
    server.behaviour.faults = faults
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=len(faults),
                              max_error_share=1.0)
    run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    cell = cells_by_level(load_summary(tmp_path / "run"))[1]
    as_status = {"http_500": "http_500", "http_429": "http_429", "http_503": "http_503", "reset_before": "reset",
                 "malformed": "malformed", "empty_choices": "malformed"}
    expected: dict[str, int] = {}
    for fault, n in server.injected.items():
        expected[as_status[fault]] = expected.get(as_status[fault], 0) + n
    assert cell["errors"] == dict(sorted(expected.items()))
    assert cell["ok"] == faults.count(None) and cell["distinct"] == 1


def test_no_retries_by_default_and_retries_marked(tmp_path, server):
    server.behaviour.faults = ["http_429", "http_503", None, None]
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=3, max_error_share=1.0)
    run_cli("run", scenario, "--out", tmp_path / "plain", "--quiet")
    assert cells_by_level(load_summary(tmp_path / "plain"))[1]["errors"] == {"http_429": 1, "http_503": 1}

    server.behaviour.faults = ["http_429", None, "http_503", "http_503", None, None]
    server.requests.clear()
    code, output = run_cli("run", scenario, "--out", tmp_path / "retried", "--quiet", "--retries", "2")
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


def _start_run(tmp_path, server, samples=200):
    server.behaviour.latency = 0.05
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=samples)
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "kevload", "run", str(scenario), "--out", str(out), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    records = out / "records.jsonl"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (not records.exists() or records.read_bytes().count(b"\n") < 5):
        time.sleep(0.05)
    return proc, out


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_cleanly_and_resume_finishes(tmp_path, server, signum, code):
    proc, out = _start_run(tmp_path, server, samples=60)
    os.kill(proc.pid, signum)
    stdout, stderr = proc.communicate(timeout=20)
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["state"] == "interrupted"
    summary = load_summary(out)
    first = summary["requests"]
    assert 0 < first < 120 and first == sum(r["counted"] for r in read_records(out / "records.jsonl"))

    code, output = run_cli("run", "--resume", out, "--quiet")
    assert code == 0, output
    summary = load_summary(out)
    cells = cells_by_level(summary)
    assert cells[1]["ok"] == 60 and cells[2]["ok"] == 60  # both parts counted, nothing sent twice
    rows = list(read_records(out / "records.jsonl"))
    assert len({r["seq"] for r in rows}) == len(rows)
    # 120 counted samples; the ramp-up sends of each level start are on record too, not counted.
    assert sum(r["counted"] for r in rows) == 120
    assert len({r["run_id"] for r in rows}) == 1
    assert json.loads((out / "run.json").read_text())["state"] == "complete"


def test_secret_never_lands_anywhere(tmp_path, server, monkeypatch):
    monkeypatch.setenv("KEVLOAD_SECRET_KEY", SECRET)
    server.behaviour.faults = ["echo_auth", None, None]
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=3, max_error_share=1.0,
                              target={"api_key_env": "KEVLOAD_SECRET_KEY", "headers": {"X-Api-Key": HEADER_SECRET}})
    out = tmp_path / "run"
    printed = [run_cli("run", scenario, "--out", out)[1]]
    assert server.requests and f"Bearer {SECRET}" not in json.dumps(server.requests)  # key goes in a header only
    for fmt in ("table", "json", "markdown"):
        printed.append(run_cli("report", out, "--format", fmt)[1])
    run_cli("report", out, "--format", "html", "-o", out / "report.html")
    run_cli("run", scenario, "--out", tmp_path / "junit-run", "--junit", out / "junit.xml", "--quiet")
    errors = [r["error"] for r in read_records(out / "records.jsonl") if r["error"]]
    assert errors and "***" in errors[0]  # the echoed key was scrubbed, the evidence kept
    for path in [*out.rglob("*"), *(tmp_path / "junit-run").rglob("*")]:
        if path.is_file():
            text = path.read_text(errors="replace")
            assert SECRET not in text and HEADER_SECRET not in text, path
    for text in printed:
        assert SECRET not in text and HEADER_SECRET not in text
