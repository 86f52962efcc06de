"""Worker processes on one host: a level's promise holds across the whole set of workers."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kevload.inputs.scenario import load_scenario
from kevload.load.runs import run_scenario
from kevload.load.schedule import COMPANION, PROBE, ClosedLoop
from kevload.load.workers import cap_of, slots_of
from kevload.records.rundir import RunDir
from tests.bounded import processes
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario

ROOT = Path(__file__).resolve().parents[2]
TWO_PROBES = [
    {"id": "p1", "prompt": "Say something.", "max_tokens": 16},
    {"id": "p2", "prompt": "Tell me more.", "max_tokens": 16},
]


def _rows(run_dir: Path) -> list[dict]:
    return list(RunDir(run_dir).record_dicts())


def run_child(*args: object, timeout: float) -> subprocess.CompletedProcess:
    """``kevload`` as a child process of its own (its workers or actors its own children), bounded
    in time."""
    return subprocess.run(
        [sys.executable, "-m", "kevload", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _children() -> list[str]:
    """Processes whose parent is this one (the workers a run spawned), as ``pid: cmdline``."""
    me = os.getpid()
    return [
        f"{pid}: {cmdline[:100]}"
        for pid, ppid, _, cmdline in processes()
        if ppid == me and "spawn_main" in cmdline
    ]


def _check_levels(rows: list[dict], workers: int, levels: int) -> None:
    """Every counted probe saw c − 1 others across all workers, and no level overlapped the next
    (wall clock).

    Consecutive levels differ in concurrency in these tests, so sorted by send time each level is
    one run of records of one concurrency, and ``levels`` such runs show that none began before the
    one before it ended.
    """
    assert {r["worker"] for r in rows} == set(range(workers))
    assert len({r["seq"] for r in rows}) == len(rows)  # one number per send, across workers
    for r in rows:
        if r["role"] == "probe" and r["counted"]:
            assert r["in_flight"] == r["concurrency"] - 1, r
    spans = [
        list(group)
        for _, group in itertools.groupby(
            sorted(rows, key=lambda r: r["t_send"]), key=lambda r: r["concurrency"]
        )
    ]
    assert len(spans) == levels
    for earlier, later in itertools.pairwise(spans):
        assert min(r["t_send"] for r in later) >= max(r["t_last_byte"] for r in earlier)


def test_slots_are_dealt_so_the_probe_slot_sits_on_worker_0():
    mixed = ClosedLoop(5, 8, companions=True).slots
    assert [slots_of(mixed, w, 2) for w in range(2)] == [
        (COMPANION, COMPANION, PROBE),
        (COMPANION, COMPANION),
    ]
    single = ClosedLoop(5, 8, companions=False).slots
    assert [len(slots_of(single, w, 3)) for w in range(3)] == [2, 2, 1]
    assert slots_of((PROBE,), 1, 2) == ()  # c=1: a worker without a slot only keeps the barrier
    assert [cap_of(7, w, 3) for w in range(3)] == [3, 2, 2] and cap_of(0, 1, 3) == 0


@pytest.mark.parametrize("mode", ["single", "mixed"])
def test_workers_keep_c_in_flight_across_processes(tmp_path, server, mode):
    run_dir, rows = check_c_in_flight(tmp_path, server, mode)
    run_meta = json.loads((run_dir / "run.json").read_text())
    assert (
        run_meta["clock"]["records"] == "unix"
        and abs(rows[0]["t_send"] - run_meta["clock"]["unix"]) < 600
    )
    assert not _children()


def test_stable_server_passes_with_workers_as_with_one(tmp_path, server):
    server.behaviour.latency = 0.05
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, mode="mixed", concurrency=[1, 2, 3], samples=5
    )
    one, output_one = run_cli("run", scenario, "--out", tmp_path / "one", "--quiet")
    two, output_two = run_cli(
        "run", scenario, "--out", tmp_path / "two", "--quiet", "--workers", "2"
    )
    assert one == two == 0, (output_one, output_two)
    cells = [
        {
            (c["probe"], c["role"], c["concurrency"]): (c["ok"], c["distinct"])
            for c in load_summary(d)["cells"]
            if c["role"] == "probe"
        }
        for d in (tmp_path / "one", tmp_path / "two")
    ]
    assert cells[0] == cells[1]
    # report, cases and --resume read every records file of the run
    code, text = run_cli("report", tmp_path / "two", "--format", "json")
    assert code == 0 and json.loads(text)["requests"] == sum(
        r["counted"] for r in _rows(tmp_path / "two")
    )
    code, text = run_cli("cases", "build", tmp_path / "two", "-o", tmp_path / "cases.jsonl")
    assert code == 0 and len((tmp_path / "cases.jsonl").read_text().splitlines()) == 3


def test_open_loop_splits_one_schedule(tmp_path, server):
    """Worker w takes arrivals w, w+N, …; every arrival keeps its absolute time on one shared
    start."""
    server.behaviour.latency = 0.02
    scenario = write_scenario(tmp_path / "s.toml", server.url, rate=[20], samples=12, workers=2)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    rows = sorted(_rows(tmp_path / "run"), key=lambda r: r["t_scheduled"])
    assert len(rows) == 12 and [r["sample"] for r in rows] == list(range(12))
    assert [r["worker"] for r in rows] == [0, 1] * 6
    gaps = [b["t_scheduled"] - a["t_scheduled"] for a, b in itertools.pairwise(rows)]
    assert all(abs(gap - 0.05) < 1e-6 for gap in gaps), gaps


def test_stop_ends_every_worker_and_resume_finishes_the_run(tmp_path, server):
    server.behaviour.latency = 0.2
    path = write_scenario(
        tmp_path / "s.toml", server.url, probes=TWO_PROBES, concurrency=[1, 2], samples=6, workers=2
    )
    scenario = load_scenario(path)

    async def interrupted():
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(3.0, stop.set)
        return await run_scenario(scenario, tmp_path / "run", stop=stop)

    result = asyncio.run(interrupted())
    assert result.state == "interrupted"
    assert not _children()
    before = len(_rows(tmp_path / "run"))
    assert 0 < before == result.records
    code, output = run_cli("run", "--resume", tmp_path / "run", "--quiet")
    assert code == 0, output
    summary = load_summary(tmp_path / "run")
    assert all(c["ok"] == 6 for c in summary["cells"] if c["role"] == "probe")
    _check_levels(_rows(tmp_path / "run"), 2, levels=4)


def test_a_worker_with_only_companion_slots_keeps_them_past_target_timeout(tmp_path, server):
    """Mixed mode, c = 2, two workers: worker 0 has the probe slot, worker 1 one companion slot and
    no probe slot. Worker 1's drain began at the level's start (no probe of its own to wait for) and
    cut its companion in flight target.timeout seconds later, recorded as a companion "timeout" of
    the server's ("cut: … after the level's probes were done") while the probes still counted and
    the server answered every request in 0.15 s."""
    server.behaviour.latency = 0.15
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        mode="mixed",
        concurrency=[2],
        samples=8,
        workers=2,
        target={"timeout": 0.5},
    )
    done = run_child("run", scenario, "--out", tmp_path / "run", "--quiet", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = list(RunDir(tmp_path / "run").record_dicts())
    assert not [r for r in rows if r["status"] != "ok"], [
        r["error"] for r in rows if r["status"] != "ok"
    ][:3]
    probe = next(c for c in load_summary(tmp_path / "run")["cells"] if c["role"] == "probe")
    assert probe["ok"] == 8 and not probe["samples_never_full"], probe


@pytest.mark.parametrize(
    ("load", "message"),
    [
        ("workers = 0", "load.workers: expected an integer from 1 to 1,024"),
        (
            "workers = 3\nmax_in_flight = 2\nrate = [5]",
            "load.max_in_flight: expected 0 or at least load.workers (3)",
        ),
    ],
)
def test_bad_worker_settings_are_refused(tmp_path, load, message):
    path = tmp_path / "s.toml"
    path.write_text(
        '[target]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n[[probes]]\nid = "p"\n'
        f'prompt = "x"\n[load]\n{load}\n'
    )
    code, output = run_cli("run", path)
    assert code == 2 and message in output and len(output.strip().splitlines()) == 1


def check_c_in_flight(tmp_path: Path, server, mode: str, *run_args: str) -> tuple[Path, list[dict]]:
    """The server sees c at once (drift_at=c) only if the level's c is really in flight across both
    workers (processes, or Ray actors with ``run_args``); returns the run directory and its
    records."""
    server.behaviour.latency = 0.3
    server.behaviour.drift_at = 4
    server.behaviour.batched_variant = True
    server.behaviour.drift_when_mixed = False
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        probes=TWO_PROBES,
        mode=mode,
        concurrency=[1, 4],
        samples=4,
        workers=2,
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet", *run_args)
    assert code == 1, output  # drift at c=4: four requests at once reached the server
    run_dir = tmp_path / "run"
    assert [p.name for p in RunDir(run_dir).record_files()] == [
        "records-0.jsonl",
        "records-1.jsonl",
    ]
    rows = _rows(run_dir)
    assert len(rows) == len(server.requests)  # every request sent has its record
    _check_levels(rows, 2, levels=4)  # c − 1 others across workers, levels one after another
    summary = load_summary(run_dir)
    for probe in ("p1", "p2"):
        cells = cells_by_level(summary, probe=probe)
        assert cells[1]["ok"] == cells[4]["ok"] == 4 and cells[1]["distinct"] == 1
        assert cells[4]["drift"], cells[4]
    if mode == "mixed":  # one probe among companions, the probe slot on worker 0
        assert {r["worker"] for r in rows if r["role"] == "probe"} == {0}
    return run_dir, rows
