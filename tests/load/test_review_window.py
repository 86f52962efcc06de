"""Review of load.trace_window_s: the edges where the window replayed other requests than its [from, to) or a
refusal did not say what changed."""

from __future__ import annotations

import pytest

from kevload.errors import ScenarioError
from kevload.inputs.trace import read_trace
from kevload.records.store import read_records
from tests.conftest import run_cli, write_scenario
from tests.inputs.test_trace import mooncake
from tests.inputs.test_trace_window import ROWS


def burstgpt(path, rows):
    """A BurstGPT CSV trace: (Timestamp s, Request tokens, Response tokens) a line."""
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" +
                    "".join(f"{t},ChatGPT,{i},{o},{i + o},Conversation log\n" for t, i, o in rows))
    return path


def read(path, window):
    return read_trace(path, what="load.trace", trace_format="auto", seed=0, max_requests=0, block_tokens=8,
                      window=window)


def test_a_request_exactly_at_from_or_to_is_in_or_out_with_float_timestamps(tmp_path):
    """16.4 − 5.3 is 11.099999999999998 in floats: the request 11.1 s after the first line was left out of a window
    from 11.1 s, and kept in one to 11.1 s."""
    path = burstgpt(tmp_path / "t.csv", [(5.3, 8, 4), (6, 8, 4), (16.4, 8, 4), (17, 8, 4), (18, 8, 4)])
    assert [r.line for r in read(path, (11.1, 13.0)).requests] == [4, 5, 6]
    assert [r.line for r in read(path, (0.0, 11.1)).requests] == [2, 3]
    # Mooncake's milliseconds: 14,400 ms is 11.1 s after 3,300 ms, read as 14.4 − 3.3 = 11.099999999999998.
    path = mooncake(tmp_path / "t.jsonl", [(3_300, 8, 4, []), (14_400, 8, 4, []), (15_000, 8, 4, [])])
    assert [r.line for r in read(path, (11.1, 12.0)).requests] == [2, 3]


def test_a_failed_first_line_out_of_time_order_is_refused(tmp_path):
    """The trace's first line is the window's origin even when it is a failed request (BurstGPT's Response tokens
    0), and such lines were never checked for time order: a failed first line at 50 s before lines at 0 s moved
    every window 50 s, silently (no window: the lines replayed as if in order)."""
    path = burstgpt(tmp_path / "t.csv", [(50, 8, 0), (0, 8, 4), (5, 8, 4), (10, 8, 4)])
    for window in (None, (0.0, 20.0)):
        with pytest.raises(ScenarioError, match=r"t.csv:3: load.trace: expected arrivals in time order, this one "
                                                r"is earlier than line 2's"):
            read(path, window)
    # In order, failed lines stay skipped and counted.
    trace = read(burstgpt(tmp_path / "ok.csv", [(0, 8, 0), (10, 8, 4), (11, 8, 0), (12, 8, 4)]), (10.0, 13.0))
    assert [r.line for r in trace.requests] == [3, 5] and trace.failed == 2 and trace.lines == 4


def test_resume_refusal_says_what_changed(tmp_path, server):
    """A --resume with another window (or block_tokens) was refused as "expected (A), got A": the same file, seed
    and count on both sides, nothing saying which input differs."""
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2, trace_speedup=[2],
                              trace=str(mooncake(tmp_path / "t.jsonl", ROWS)), trace_window_s=[11, 13],
                              trace_block_tokens=16)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    code, output = run_cli("run", "--resume", tmp_path / "run", "--set", "load.trace_window_s=[12, 14]")
    assert code == 2 and "window_s [11.0, 13.0])" in output and "window_s [12.0, 14.0];" in output, output
    code, output = run_cli("run", "--resume", tmp_path / "run", "--set", "load.trace_block_tokens=8")
    assert code == 2 and "block_tokens 16 window_s" in output and "block_tokens 8 window_s" in output, output


def test_workers_send_the_window_alone(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2, workers=2,
                              trace=str(mooncake(tmp_path / "t.jsonl", ROWS)), trace_speedup=[2],
                              trace_window_s=[11, 13])
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    records = [r for f in ("records-0.jsonl", "records-1.jsonl") for r in read_records(tmp_path / "run" / f)]
    companions = sorted((r for r in records if r["role"] == "companion"), key=lambda r: r["t_scheduled"])
    assert [r["probe"] for r in companions] == ["trace:4", "trace:5", "trace:6", "trace:7"]
