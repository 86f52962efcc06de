"""load.trace_window_s: a part of a long trace replayed, its seconds counted from the trace's first
line. The window's requests and no others are sent, on a clock that starts at the first of them;
run.json, --resume and `cases build` keep the window; a window that is not [from, to] is refused
(exit 2)."""

from __future__ import annotations

import json

import pytest

from kevload.errors import ScenarioError
from kevload.inputs.scenario import load_scenario
from kevload.inputs.trace import read_trace
from kevload.records.store import read_records
from tests.conftest import run_cli, write_scenario
from tests.inputs.test_trace import mooncake

# A request every 0.5 s of trace, from 10 s after the first line (line 1 at 0 s, line 2 at 10 s, …).
ROWS = [(0, 8, 4, [])] + [(10_000 + 500 * i, 8 + i, 4, []) for i in range(12)]


def read(path, **options):
    return read_trace(
        path,
        what="load.trace",
        trace_format="auto",
        seed=0,
        block_tokens=8,
        **{"max_requests": 0, **options},
    )


def test_window_keeps_its_requests_and_counts_from_the_first_of_them(tmp_path):
    path = mooncake(tmp_path / "t.jsonl", ROWS)
    trace = read(path, window=(11.0, 13.0))  # 11 s included, 13 s not: lines 4 to 7
    assert [r.line for r in trace.requests] == [4, 5, 6, 7]
    assert [r.offset for r in trace.requests] == [0, 0.5, 1.0, 1.5] and trace.span == 1.5
    assert trace.count == 4 and trace.lines == 13
    assert trace.to_json()["window_s"] == [11.0, 13.0] and "window_s" not in read(path).to_json()
    # load.trace_max_requests: the first N of the window.
    assert [r.line for r in read(path, window=(11.0, 13.0), max_requests=2).requests] == [4, 5]
    # Lines outside the window are still read and checked: one out of time order is refused wherever
    # it is.
    disordered = mooncake(tmp_path / "d.jsonl", [*ROWS, (9_000, 8, 4, [])])
    with pytest.raises(
        ScenarioError, match=r"d.jsonl:14: load.trace: expected arrivals in time order"
    ):
        read(disordered, window=(11.0, 13.0))
    with pytest.raises(
        ScenarioError, match=r"got 1 over 0 s in load.trace_window_s \[12.0, 12.4\]"
    ):
        read(path, window=(12.0, 12.4))


def test_run_replays_the_window_alone_on_its_own_clock(tmp_path, server):
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=2,
        trace_speedup=[2],
        trace=str(mooncake(tmp_path / "t.jsonl", ROWS)),
        trace_window_s=[11, 13],
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    companions = sorted(
        (r for r in records if r["role"] == "companion"), key=lambda r: r["t_scheduled"]
    )
    assert [r["probe"] for r in companions] == ["trace:4", "trace:5", "trace:6", "trace:7"]
    start = companions[0]["t_scheduled"]
    assert [r["t_scheduled"] - start for r in companions] == pytest.approx(
        [0, 0.25, 0.5, 0.75], abs=1e-9
    )
    (dataset,) = json.loads((tmp_path / "run" / "run.json").read_text())["datasets"]
    assert dataset["window_s"] == [11, 13] and dataset["count"] == 4 and dataset["span_s"] == 1.5
    # The level's rate is the window's: 4 requests over 1.5 s × 2.
    assert {r["rate"] for r in records if r["rate"] is not None} == {round(4 * 2 / 1.5, 6)}

    # --resume with another window of as many requests: other requests, refused.
    code, output = run_cli(
        "run", "--resume", tmp_path / "run", "--set", "load.trace_window_s=[12, 14]"
    )
    assert code == 2 and "datasets: expected the inputs the run started with" in output, output
    # `cases build`: a trace level's case replays the same window.
    assert run_cli("cases", "build", tmp_path / "run", "-o", tmp_path / "cases.jsonl")[0] == 0
    cases = [json.loads(line) for line in (tmp_path / "cases.jsonl").read_text().splitlines()]
    assert [c["load"]["trace_window_s"] for c in cases if c["params"]["concurrency"] == 0] == [
        [11, 13]
    ]
    assert all("trace_window_s" not in c["load"] for c in cases if c["params"]["concurrency"] != 0)


@pytest.mark.parametrize(
    "load, error",
    [
        (
            {"trace_window_s": [5]},
            "load.trace_window_s: expected [from, to], two numbers of seconds after the trace's "
            "first line, from < to, got [5.0]",
        ),
        ({"trace_window_s": [5, 3]}, "load.trace_window_s: expected [from, to]"),
        (
            {"trace_window_s": [-1, 3]},
            "load.trace_window_s: expected [from, to], seconds after the trace's first line",
        ),
        (
            {"trace_window_s": [1, 3], "trace": ""},
            "load.trace_window_s: expected load.trace beside it",
        ),
    ],
)
def test_bad_window_exits_2(tmp_path, load, error):
    mooncake(tmp_path / "t.jsonl", ROWS)
    scenario = write_scenario(
        tmp_path / "s.toml",
        "http://127.0.0.1:9/v1",
        concurrency=[1],
        **{"trace": "t.jsonl", **load},
    )
    with pytest.raises(ScenarioError) as failed:
        load_scenario(scenario)
    assert error in str(failed.value)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and error in output and "Traceback" not in output, output


def burstgpt(path, rows):
    """A BurstGPT CSV trace: (Timestamp s, Request tokens, Response tokens) a line."""
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        + "".join(f"{t},ChatGPT,{i},{o},{i + o},Conversation log\n" for t, i, o in rows)
    )
    return path


def test_a_request_exactly_at_from_or_to_is_in_or_out_with_float_timestamps(tmp_path):
    """16.4 − 5.3 is 11.099999999999998 in floats: the request 11.1 s after the first line was left
    out of a window from 11.1 s, and kept in one to 11.1 s."""
    path = burstgpt(
        tmp_path / "t.csv", [(5.3, 8, 4), (6, 8, 4), (16.4, 8, 4), (17, 8, 4), (18, 8, 4)]
    )
    assert [r.line for r in read(path, window=(11.1, 13.0)).requests] == [4, 5, 6]
    assert [r.line for r in read(path, window=(0.0, 11.1)).requests] == [2, 3]
    # Mooncake's milliseconds: 14,400 ms is 11.1 s after 3,300 ms, read as 14.4 − 3.3 =
    # 11.099999999999998.
    path = mooncake(
        tmp_path / "t.jsonl", [(3_300, 8, 4, []), (14_400, 8, 4, []), (15_000, 8, 4, [])]
    )
    assert [r.line for r in read(path, window=(11.1, 12.0)).requests] == [2, 3]


def test_a_failed_first_line_out_of_time_order_is_refused(tmp_path):
    """The trace's first line is the window's origin even when it is a failed request (BurstGPT's
    Response tokens 0), and such lines were never checked for time order: a failed first line at 50
    s before lines at 0 s moved every window 50 s, silently (no window: the lines replayed as if in
    order)."""
    path = burstgpt(tmp_path / "t.csv", [(50, 8, 0), (0, 8, 4), (5, 8, 4), (10, 8, 4)])
    for window in (None, (0.0, 20.0)):
        with pytest.raises(
            ScenarioError,
            match=r"t.csv:3: load.trace: expected arrivals in time order, this one "
            r"is earlier than line 2's",
        ):
            read(path, window=window)
    # In order, failed lines stay skipped and counted.
    trace = read(
        burstgpt(tmp_path / "ok.csv", [(0, 8, 0), (10, 8, 4), (11, 8, 0), (12, 8, 4)]),
        window=(10.0, 13.0),
    )
    assert [r.line for r in trace.requests] == [3, 5] and trace.failed == 2 and trace.lines == 4


def test_resume_refusal_says_what_changed(tmp_path, server):
    """A --resume with another window (or block_tokens) was refused as "expected (A), got A": the
    same file, seed and count on both sides, nothing saying which input differs."""
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=2,
        trace_speedup=[2],
        trace=str(mooncake(tmp_path / "t.jsonl", ROWS)),
        trace_window_s=[11, 13],
        trace_block_tokens=16,
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    code, output = run_cli(
        "run", "--resume", tmp_path / "run", "--set", "load.trace_window_s=[12, 14]"
    )
    assert (
        code == 2 and "window_s [11.0, 13.0])" in output and "window_s [12.0, 14.0];" in output
    ), output
    code, output = run_cli(
        "run", "--resume", tmp_path / "run", "--set", "load.trace_block_tokens=8"
    )
    assert (
        code == 2 and "block_tokens 16 window_s" in output and "block_tokens 8 window_s" in output
    ), output


def test_workers_send_the_window_alone(tmp_path, server):
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=2,
        workers=2,
        trace=str(mooncake(tmp_path / "t.jsonl", ROWS)),
        trace_speedup=[2],
        trace_window_s=[11, 13],
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    records = [
        r
        for f in ("records-0.jsonl", "records-1.jsonl")
        for r in read_records(tmp_path / "run" / f)
    ]
    companions = sorted(
        (r for r in records if r["role"] == "companion"), key=lambda r: r["t_scheduled"]
    )
    assert [r["probe"] for r in companions] == ["trace:4", "trace:5", "trace:6", "trace:7"]
