"""A stop mid-level: a counted sample kept its c − 1 companions at the server for its whole time
there, in one process and with worker processes (Ray actors: tests/load/test_ray.py). The server's
own log is the proof."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from kevload.load.rayworkers import _cut
from kevload.records.rundir import RunDir
from tests.conftest import write_scenario

ROOT = Path(__file__).resolve().parents[2]
# the request arriving as the stop comes is held this long: the others end long before it
HOLD_S = 1.0
# the longest a counted sample may run with fewer than c − 1 others: a resend's gap, never a stop's
GAP_S = 0.25


def signal_mid_level(
    tmp_path: Path, server, signum: int, *run_args: str, hold: float | None = None
) -> tuple[int, str, str]:
    """Run c=4 in a process group of its own; at the tenth arrival that finds four requests at the
    server (mid-level) send ``signum`` to the group and hold the arriving request ``hold`` seconds.
    Returns the exit code, the output and that request's id."""
    server.behaviour.latency = 0.02
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[4], samples=400)
    started: list[subprocess.Popen] = []
    full: list[int] = []

    def on_arrival(index: int, at_server: int) -> float | None:
        if at_server < 4 or len(full) >= 10:
            return None
        full.append(index)
        if len(full) < 10:
            return None
        os.killpg(started[0].pid, signum)
        return hold

    server.behaviour.on_arrival = on_arrival
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kevload",
            "run",
            str(scenario),
            "--out",
            str(tmp_path / "run"),
            "--quiet",
            *run_args,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    started.append(proc)
    try:
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    server.behaviour.on_arrival = None
    assert len(full) == 10, output
    return proc.returncode, output, server.request_ids[full[-1]]


def stop_mid_level(tmp_path: Path, server, *run_args: str) -> list[dict]:
    """Ctrl-C mid-level (``signal_mid_level``), the arriving request held ``HOLD_S``; returns the
    run's records once every counted one is shown to have kept its batch."""
    code, output, held_id = signal_mid_level(
        tmp_path, server, signal.SIGINT, *run_args, hold=HOLD_S
    )
    assert code == 130, output  # as a terminal's Ctrl-C: the whole process group
    rows = list(RunDir(tmp_path / "run").record_dicts())
    held = next(r for r in rows if r["request_id"] == held_id)
    assert held["in_flight"] == 3, held  # sent at full load, then the stop came
    check_full_batches(server.visits, rows)
    return rows


def check_full_batches(visits: list[list], rows: list[dict]) -> None:
    """Every counted record at level c had c − 1 others at the server for its whole time there (from
    the server's log of arrivals and finishes), but for stretches of at most ``GAP_S``: a slot's gap
    between answer and resend."""
    spans = {visit[0]: (visit[2], visit[3]) for visit in visits}
    assert len(spans) == len(visits)  # one visit per request id: nothing here is retried or resent
    for r in rows:
        if r["counted"] and r["concurrency"] > 1:
            arrived, finished = spans[r["request_id"]]
            others = [span for rid, span in spans.items() if rid != r["request_id"]]
            short = _longest_short(arrived, finished, others, r["concurrency"] - 1)
            assert short <= GAP_S, (
                f"{r['request_id']} (in_flight {r['in_flight']}) ran {short:.3f} s of its "
                f"{finished - arrived:.3f} s with fewer than {r['concurrency'] - 1} others"
            )


def _longest_short(
    arrived: float, finished: float, others: list[tuple[float, float | None]], need: int
) -> float:
    """The longest stretch of [arrived, finished] during which fewer than ``need`` of ``others``
    were at the server."""
    events = []
    for start, end in others:
        lo, hi = max(start, arrived), min(math.inf if end is None else end, finished)
        if lo < hi:
            events += [(lo, 1), (hi, -1)]
    level, longest, short_since = 0, 0.0, arrived
    for at, delta in sorted(events):  # at one instant a finish goes before an arrival
        before, level = level, level + delta
        if before < need <= level:
            longest = max(longest, at - short_since)
        elif level < need <= before:
            short_since = at
    if level < need:
        longest = max(longest, finished - short_since)
    return longest


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stop_mid_level_leaves_no_counted_sample_without_its_batch(tmp_path, server, workers):
    rows = stop_mid_level(tmp_path, server, "--workers", str(workers))
    assert (
        sum(r["counted"] for r in rows if r["concurrency"] == 4) >= 9
    )  # the level counted before the stop


def test_longest_short_stretch():
    assert (
        _longest_short(0.0, 10.0, [(0.0, 10.0), (-1.0, 4.0), (4.0, 10.0)], 2) == 0.0
    )  # a gap of zero
    assert _longest_short(0.0, 10.0, [(0.0, 10.0), (-1.0, 4.0), (5.0, 11.0)], 2) == 1.0
    assert (
        _longest_short(0.0, 10.0, [(0.0, 3.0), (2.0, None)], 2) == 7.0
    )  # short from 3 s to its end
    assert _longest_short(0.0, 10.0, [], 0) == 0.0


def test_the_ray_driver_uncounts_closed_loop_answers_after_its_stop():
    """An actor hears of a stop a message later than the driver stopped the run, each at its own
    moment: the driver applies the rule to what it writes after its stop, by each record's answer
    time."""
    rows = [
        {"run_id": "r", "seq": 0, "counted": True, "rate": None, "t_last_byte": 9.5, "output": "é"},
        {
            "run_id": "r",
            "seq": 1,
            "counted": True,
            "rate": None,
            "t_last_byte": 10.5,
            "output": "b",
        },
        {
            "run_id": "r",
            "seq": 2,
            "counted": True,
            "rate": 5.0,
            "t_last_byte": 10.5,
            "output": "c",
        },  # open loop
        {
            "run_id": "r",
            "seq": 3,
            "counted": False,
            "rate": None,
            "t_last_byte": 11.0,
            "output": "d",
        },
    ]
    lines = b"".join(orjson.dumps(row) + b"\n" for row in rows)
    cut = _cut(lines, 10.0)
    assert cut.count(b"\n") == 4 and cut.startswith(lines.split(b"\n")[0])
    assert [orjson.loads(line) for line in cut.splitlines()] == [
        {**rows[1], "counted": False} if i == 1 else row for i, row in enumerate(rows)
    ]
