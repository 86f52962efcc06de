"""Level c really was level c: the share of each counted sample's life with c − 1 others in flight
and the samples that never had them, from the records' send and last-byte times alone (after a kill,
the others it left unrecorded unknown, not missing)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from kevload.compare.overlap import FullLoad, Occupancy, unrecorded_windows
from kevload.compare.reader import reduce_file
from kevload.compare.summarizing import summarize
from kevload.records.rundir import RunDir
from kevload.wire.logprobcheck import LOGPROBS_CHECK_USER
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

ROOT = Path(__file__).resolve().parents[2]
PROBE_PROMPT = "Say something."


def _full_load(level: list[tuple[float, float]], samples: list[int], concurrency: int) -> FullLoad:
    """``samples``: indices into ``level``, which holds every request of the level."""
    spans = np.array(level, dtype=np.float64).reshape(-1, 2)
    return Occupancy.of(spans, concurrency).full_load(spans[samples])


@pytest.mark.parametrize(
    ("level", "samples", "c", "expected"),
    [
        # Half overlapping at c=2: each had its one other for half its life.
        ([(0, 10), (5, 15)], [0], 2, FullLoad(1, 0.5, 0)),
        ([(0, 10), (5, 15)], [0, 1], 2, FullLoad(2, 0.5, 0)),
        # Sent and answered at the same instants: together all along.
        ([(0, 10), (0, 10)], [0, 1], 2, FullLoad(2, 1.0, 0)),
        # Sent the instant the other was answered: never together.
        ([(0, 10), (10, 20)], [0, 1], 2, FullLoad(2, 0.0, 2)),
        # c=3: A had both others only while C ran; C had A and B all its life.
        ([(0, 10), (2, 8), (4, 6)], [0], 3, FullLoad(1, 0.2, 0)),
        ([(0, 10), (2, 8), (4, 6)], [1], 3, FullLoad(1, 2 / 6, 0)),
        ([(0, 10), (2, 8), (4, 6)], [2], 3, FullLoad(1, 1.0, 0)),
        # A probe that outlives the others: full until they stop.
        ([(0, 10), (0, 4), (0, 4)], [0], 3, FullLoad(1, 0.4, 0)),
        # One other in flight at every moment, but never two at once: c=3 is never reached.
        ([(0, 10), (0, 5), (5, 10)], [0], 3, FullLoad(1, 0.0, 1)),
        # Time-weighted: 5 of 10 s and 2 of 2 s make 7 of 12, not the mean of 0.5 and 1.0.
        ([(0, 10), (20, 22), (5, 23)], [0, 1], 2, FullLoad(2, 7 / 12, 0)),
        # More than c in flight is full load too.
        ([(0, 10), (0, 10), (0, 10)], [0], 2, FullLoad(1, 1.0, 0)),
        # A resend gap: the other slot's answer at 5, its next send at 5.5.
        ([(0, 10), (0, 5), (5.5, 12)], [0], 2, FullLoad(1, 0.95, 0)),
    ],
)
def test_full_load_of_hand_built_spans(level, samples, c, expected):
    assert _full_load(level, samples, c) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("level", "c", "ever_full"),
    [
        (
            [(5, 5), (0, 10)],
            2,
            True,
        ),  # sent and answered inside another's life: that other was in flight
        ([(10, 10), (0, 10)], 2, False),  # at the instant the other was answered: it was not
        ([(0, 0), (0, 10)], 2, True),  # at the instant the other was sent: it was
        ([(5, 5), (5, 5)], 2, False),  # two of no length: neither is in flight at any moment
        ([(5, 5), (0, 10), (4, 6)], 3, True),
    ],
)
def test_a_sample_of_no_length_is_full_when_others_were_in_flight_at_its_instant(
    level, c, ever_full
):
    full = _full_load(level, [0], c)
    assert full == FullLoad(1, None, 0 if ever_full else 1)  # no time to weigh: no share


def test_a_request_of_no_length_is_no_other_and_weighs_nothing():
    # B (no length) in A's life is in flight at no moment: A never had an other.
    assert _full_load([(0, 10), (5, 5)], [0], 2) == FullLoad(1, 0.0, 1)
    # Beside a sample with time, one of no length adds to the count and nothing to the share.
    assert _full_load([(0, 10), (5, 15), (7, 7)], [0, 2], 2) == FullLoad(2, 0.5, 0)


def test_a_last_byte_before_its_send_is_a_request_of_no_length():
    # Two hosts' clocks can disagree by more than a short request takes.
    assert _full_load([(3, 2), (0, 10)], [0], 2) == FullLoad(1, None, 0)


def _sends(part: int, worker: int, seqs: list[int]) -> list[tuple[int, int, int, float, float]]:
    """Records of one worker of a part: seq n sent at n s, answered half a second later."""
    return [(part, worker, seq, float(seq), seq + 0.5) for seq in seqs]


@pytest.mark.parametrize(
    ("sends", "parts", "expected"),
    [
        # Seq 3 has no record: it left after seq 2's send, and may have run until the part's last
        # recorded moment.
        (_sends(0, 0, [0, 1, 2, 4, 5]), {0: (0, 1)}, [(2.0, 5.5)]),
        # Nothing missing in between: what was lost was sent after the last recorded send (in flight
        # at the kill).
        (_sends(0, 0, [0, 1, 2]), {0: (0, 1)}, [(2.0, 2.5)]),
        # The part's first send has no record: it may have run from the part's start.
        (_sends(0, 0, [1, 2]), {0: (0, 1)}, [(-np.inf, 2.5)]),
        # A resumed part numbers on from 7; two workers number in turn (7, 9, … and 8, 10, …):
        # worker 1 lost 10.
        (_sends(1, 0, [7, 9, 11]) + _sends(1, 1, [8, 12]), {1: (7, 2)}, [(8.0, 12.5)]),
        # A worker with no record at all may have lost one from the start.
        (_sends(0, 0, [0, 2, 4]), {0: (0, 2)}, [(-np.inf, 4.5)]),
    ],
)
def test_unrecorded_windows_start_at_the_last_send_before_a_lost_one(sends, parts, expected):
    assert unrecorded_windows(sends, parts) == expected


def test_samples_in_an_unrecorded_window_are_unknown_and_the_others_still_checked():
    # c=2: A (0–10) ran beside B; C (20–30) and D (40–50) ran alone; a window (35, 60) of lost
    # requests covers D.
    spans = np.array([(0, 10), (0, 10), (20, 30), (40, 50)], dtype=np.float64)
    occupancy = Occupancy.of(spans, 2)
    assert occupancy.full_load(spans[[0, 2, 3]]) == FullLoad(3, 10 / 30, 2)
    # D's others cannot be counted; C, before the window, never had one all the same.
    assert occupancy.full_load(spans[[0, 2, 3]], [(35.0, 60.0)]) == FullLoad(2, 0.5, 1, unknown=1)
    assert occupancy.full_load(spans[[0, 2, 3]], []) == FullLoad(3, 10 / 30, 2, unknown=0)


def test_unix_times_keep_microseconds():
    """Worker records carry Unix seconds (~1.7e9): a 5 ms request with a 20 µs gap is still
    measured."""
    t = 1.7e9
    level = [(t, t + 0.005), (t - 0.001, t + 0.002), (t + 0.00202, t + 0.01)]
    full = _full_load(level, [0], 2)
    assert full.never_full == 0 and full.share == pytest.approx((0.005 - 0.00002) / 0.005, abs=1e-4)


def test_sweep_matches_counting_every_moment():
    """Against a brute-force count on a grid: random integer spans, so ties and requests of no
    length abound."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        send = rng.integers(0, 20, n)
        level = [(float(s), float(s + rng.integers(0, 6))) for s in send]
        c = int(rng.integers(2, 5))
        samples = sorted(set(rng.integers(0, n, int(rng.integers(1, n + 1))).tolist()))
        full_seconds, seconds, never = 0.0, 0.0, 0
        for i in samples:
            s, e = level[i]
            moments = [t + 0.5 for t in range(int(s), int(e))] or [
                s
            ]  # each unit of its life, or its instant
            at_full = [
                sum(1 for j, (s2, e2) in enumerate(level) if j != i and s2 <= t < e2) >= c - 1
                for t in moments
            ]
            full_seconds += sum(at_full) if e > s else 0
            seconds += e - s
            never += not any(at_full)
        expected = FullLoad(len(samples), full_seconds / seconds if seconds else None, never)
        assert _full_load(level, samples, c) == pytest.approx(expected), (level, samples, c)


class _RefusesCompanionsAtEachProbe(FakeServer):
    """A server that never runs the probe beside a companion, while kevload sees one in flight at
    every send.

    A companion's first attempt is held until the next probe arrives, and then refused (429,
    Retry-After 0.75 s); its retry is answered at once. So every probe is sent with the companion in
    flight — counted, ``in_flight: 1`` — and runs alone: the companion's record is its retry, 0.75 s
    later, after the probe's 0.3 s.
    """

    def __init__(self) -> None:
        super().__init__()
        self.held: list[asyncio.Future] = []
        self.seen: set[str | None] = set()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("user") != LOGPROBS_CHECK_USER:
            if body["messages"][-1]["content"] == PROBE_PROMPT:
                for waiter in self.held:
                    if not waiter.done():
                        waiter.set_result(True)
                self.held.clear()
                await asyncio.sleep(0.3)
            elif (request_id := request.headers.get("X-Request-Id")) not in self.seen:
                self.seen.add(request_id)
                waiter = asyncio.get_running_loop().create_future()
                self.held.append(waiter)
                try:
                    await asyncio.wait_for(
                        waiter, 1.0
                    )  # the level's last companion: no probe comes
                except TimeoutError:
                    return await super()._handle(request)
                return web.json_response(
                    {"error": "busy"}, status=429, headers={"Retry-After": "0.75"}
                )
        return await super()._handle(request)


def test_counted_probes_the_server_ran_alone_are_flagged(tmp_path):
    with _RefusesCompanionsAtEachProbe() as fake:
        fake.behaviour.latency = 0.0
        scenario = write_scenario(
            tmp_path / "s.toml", fake.url, mode="mixed", concurrency=[1, 2], samples=3, retries=1
        )
        code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, (
        output
    )  # the outputs agree: the verdict stands, the matrix says what it rests on
    run_dir = tmp_path / "run"
    counted = [
        r
        for r in RunDir(run_dir).record_dicts()
        if r["role"] == "probe" and r["counted"] and r["concurrency"] == 2
    ]
    assert len(counted) == 3 and {r["in_flight"] for r in counted} == {
        1
    }  # kevload's own count said full
    (run_dir / "summary.json").unlink()
    code, text = run_cli("report", run_dir, "--format", "json")  # recomputed from the records alone
    cells = cells_by_level(json.loads(text))
    assert (cells[2]["samples_never_full"], cells[2]["full_load_share"]) == (3, 0.0)
    assert (
        not {"samples_never_full", "full_load_share"} & cells[1].keys()
    )  # serial: nothing to reach
    assert json.loads(text)["matrix"]["samples_never_full"] == [[None, 3]]
    # Every request it sent is on record: nothing is left out of the check as unknown.
    assert json.loads((run_dir / "run.json").read_text())["parts"][0]["unrecorded"] == 0
    assert "overlap_unknown" not in cells[2]
    note = (
        "p1 (mixed) c=2: † 3 of 3 counted samples never had 1 other in flight; "
        "1 other for 0.0% of their time"
    )
    code, table = run_cli("report", run_dir)
    assert (
        note in " ".join(table.split()) and "1 †" in table
    )  # a note wraps at the terminal's width
    code, md = run_cli("report", run_dir, "--format", "markdown")
    assert f"- {note}" in md and "| p1 (mixed) | 1 | 1 † | 3 |" in md
    code, page = run_cli("report", run_dir, "--format", "html")
    assert ">1 †</td>" in page and note in page and "<td>0.0% †</td>" in page


def test_a_healthy_run_is_at_full_load(tmp_path, server):
    server.behaviour.latency = 0.2
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=8)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    summary = load_summary(tmp_path / "run")
    cells = cells_by_level(summary)
    # Only the slots' resend gaps (microseconds to a few ms against 200 ms answers) are below full
    # load.
    assert cells[4]["samples_never_full"] == 0 and 0.9 < cells[4]["full_load_share"] <= 1.0
    assert not {"samples_never_full", "full_load_share"} & cells[1].keys()
    code, table = run_cli("report", tmp_path / "run")
    assert "†" not in table
    assert (
        f"full load: at every level c ≥ 2, counted samples had c − 1 others in flight for at least "
        f"{cells[4]['full_load_share']:.1%} of their time (lowest: p1 (single) c=4)"
    ) in " ".join(table.split())


def test_a_part_that_never_finished_leaves_its_last_samples_unknown(tmp_path, server):
    """A run killed at its end: run.json's part has no end, and the records of the requests in
    flight are gone. report leaves the samples that may have run beside them out of the check and
    says so."""
    server.behaviour.latency = 0.05
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=6)
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    run_dir = tmp_path / "run"
    meta = json.loads((run_dir / "run.json").read_text())
    meta["parts"][0] = {
        k: v for k, v in meta["parts"][0].items() if k not in ("state", "unrecorded")
    }
    (run_dir / "run.json").write_text(json.dumps(meta))
    lines = (run_dir / "records.jsonl").read_text().splitlines(keepends=True)
    last = max(lines, key=lambda line: json.loads(line)["seq"])
    (run_dir / "records.jsonl").write_text("".join(line for line in lines if line is not last))
    code, text = run_cli("report", run_dir, "--format", "json")
    cell = cells_by_level(json.loads(text))[2]
    assert cell["overlap_unknown"] > 0 and cell["samples_never_full"] == 0
    code, table = run_cli("report", run_dir)
    assert (
        f"p1 (single) c=2: overlap unknown for {cell['overlap_unknown']} of {cell['ok']} counted "
        f"samples" in " ".join(table.split())
    )


def test_open_loop_levels_have_no_full_load(tmp_path, server):
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, rate=[40], samples=4, max_in_flight=2
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    (cell,) = load_summary(tmp_path / "run")["cells"]
    assert not {"samples_never_full", "full_load_share"} & cell.keys()
    assert "full load:" not in run_cli("report", tmp_path / "run")[1]


def test_workers_full_load_is_computed_over_every_workers_records(tmp_path, server):
    """Mixed c=3 on two workers: the probe and one companion slot on worker 0, the other companion
    on worker 1."""
    server.behaviour.latency = 0.2
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, mode="mixed", concurrency=[1, 3], samples=4, workers=2
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    cell = cells_by_level(load_summary(tmp_path / "run"))[3]
    assert cell["samples_never_full"] == 0 and cell["full_load_share"] > 0.9
    # Worker 0's file alone holds one of the two others: from it, no probe ever had both.
    first, second = RunDir(tmp_path / "run").record_files()
    assert {
        r["worker"] for r in RunDir(tmp_path / "run").record_dicts() if r["role"] == "companion"
    } == {0, 1}
    alone = cells_by_level(summarize(reduce_file(first)))[3]
    assert alone.samples_never_full == alone.requests == 4 and alone.full_load_share == 0.0
    assert second.name == "records-1.jsonl"


def _never_full_at_server(visits: list[list], rows: list[dict]) -> int:
    """Counted records of a level c ≥ 2 that had c − 1 others at the server at no moment of their
    time there."""
    spans = {visit[0]: (visit[2], visit[3]) for visit in visits}
    never = 0
    for r in rows:
        if not (r["counted"] and r["concurrency"] > 1):
            continue
        arrived, finished = spans[r["request_id"]]
        # The most others at once: count them at each arrival within its span (and at its own
        # arrival).
        moments = [arrived] + [
            a for rid, (a, _) in spans.items() if arrived < a < finished and rid != r["request_id"]
        ]
        most = max(
            sum(
                1
                for rid, (a, f) in spans.items()
                if rid != r["request_id"] and a <= t and (f is None or f > t)
            )
            for t in moments
        )
        never += most < r["concurrency"] - 1
    return never


def test_samples_whose_others_a_kill_left_unrecorded_are_not_called_never_full(tmp_path):
    """kill -9 mid-level while one slot's request is held 3 s at the server: the samples sent beside
    it had 3 others (the held one among them) but the held one's record was never written. After
    --resume the cell must not say they "never had 3 others in flight"."""
    with FakeServer(Behaviour(latency=0.02)) as server:
        scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[4], samples=300)
        started: list[subprocess.Popen] = []
        held: list[float] = []

        def on_arrival(index, at_server):
            if at_server >= 4 and not held:
                held.append(time.monotonic())
                return 3.0
            if len(held) == 1 and time.monotonic() - held[0] > 1.0:
                held.append(time.monotonic())
                os.killpg(started[0].pid, signal.SIGKILL)
            return None

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
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        started.append(proc)
        try:
            output = proc.communicate(timeout=60)[0]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        server.behaviour.on_arrival = None
        assert proc.returncode == -signal.SIGKILL and len(held) == 2, output
        code, output = run_cli("run", "--resume", tmp_path / "run", "--quiet")
        assert code == 0, output
        time.sleep(3.5)  # the held request's visit ends at the server
        visits = [list(v) for v in server.visits]
    rows = list(RunDir(tmp_path / "run").record_dicts())
    assert len(visits) > len(
        rows
    )  # the killed part sent requests it never recorded (the held one among them)
    truth = _never_full_at_server(visits, rows)
    cell = cells_by_level(load_summary(tmp_path / "run"))[4]
    assert cell["samples_never_full"] == truth, (
        cell["samples_never_full"],
        truth,
        cell["full_load_share"],
    )
    assert json.loads((tmp_path / "run" / "run.json").read_text())["state"] == "complete"
