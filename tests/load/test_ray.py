"""Workers as Ray actors: the local workers' promises hold across actors, and kevload without Ray
never imports it. The cluster tests share one Ray cluster on this host (``tests/raycluster.py``);
the two-node one is e2e."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kevload.records.rundir import RunDir
from tests.bounded import Kevload
from tests.conftest import load_summary, run_cli, write_scenario
from tests.load.test_stop_batches import stop_mid_level
from tests.load.test_workers import TWO_PROBES, _check_levels, check_c_in_flight, run_child
from tests.raycluster import ray_cluster
from tests.wire.test_request_ids import kill_and_resume

ROOT = Path(__file__).resolve().parents[2]

# `import ray` fails in the child: kevload must run without it, and say how to get it when --ray
# asks for it.
_NO_RAY = """
import sys
class NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray' (blocked by the test)")
sys.meta_path.insert(0, NoRay())
from kevload.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    print("ray imported:", "ray" in sys.modules)
    raise
"""


def _rows(run_dir: Path) -> list[dict]:
    return list(RunDir(run_dir).record_dicts())


def _kevload(*args: object, code: str | None = None, **kwargs) -> subprocess.Popen:
    start = ["-c", code] if code else ["-m", "kevload"]
    command = [sys.executable, *start, *map(str, args)]
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("ray")
    with ray_cluster(tmp_path_factory.mktemp("ray"), nodes=1, cpus=2) as address:
        yield address


def test_kevload_runs_without_ray_and_says_how_to_get_it(tmp_path, server):
    server.behaviour.latency = 0.01
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=3)
    done = _kevload("run", scenario, "--out", tmp_path / "run", "--quiet", code=_NO_RAY)
    output = done.communicate(timeout=120)[0]
    assert done.returncode == 0 and "ray imported: False" in output, output
    assert len(_rows(tmp_path / "run")) == len(server.requests) > 0
    refused = _kevload("run", scenario, "--out", tmp_path / "ray", "--ray", "auto", code=_NO_RAY)
    output = refused.communicate(timeout=120)[0]
    assert refused.returncode == 2, output
    assert "--ray needs Ray, which is not installed: pip install 'kevload[ray]'" in output
    assert "Traceback" not in output and not (tmp_path / "ray").exists()


def test_ray_refuses_until_bound_before_connecting(tmp_path):
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", until_bound=0.05)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--ray", "127.0.0.1:9")
    assert code == 2 and "--ray: load.until_bound samples in one process" in output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("mode", ["single", "mixed"])
def test_actors_keep_c_in_flight_across_the_cluster(tmp_path, server, cluster, mode):
    run_dir, rows = check_c_in_flight(
        tmp_path, server, mode, "--ray", cluster
    )  # every record back at the driver
    meta = json.loads((run_dir / "run.json").read_text())
    assert (
        meta["clock"]["records"] == "unix" and abs(rows[0]["t_send"] - meta["clock"]["unix"]) < 600
    )
    assert meta["ray"][0]["address"] == cluster and len(meta["ray"][0]["nodes"]) == 2


def test_stable_server_passes_on_actors_as_in_one_process(tmp_path, server, cluster):
    server.behaviour.latency = 0.05
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, mode="mixed", concurrency=[1, 3], samples=5
    )
    one, output_one = run_cli("run", scenario, "--out", tmp_path / "one", "--quiet")
    ray, output_ray = run_cli(
        "run", scenario, "--out", tmp_path / "ray", "--quiet", "--workers", "2", "--ray", cluster
    )
    assert one == ray == 0, (output_one, output_ray)
    cells = [
        {
            (c["probe"], c["concurrency"]): (c["ok"], c["distinct"])
            for c in load_summary(d)["cells"]
            if c["role"] == "probe"
        }
        for d in (tmp_path / "one", tmp_path / "ray")
    ]
    assert cells[0] == cells[1]
    code, text = run_cli("report", tmp_path / "ray", "--format", "json")
    assert code == 0 and json.loads(text)["requests"] == sum(
        r["counted"] for r in _rows(tmp_path / "ray")
    )


def test_open_loop_splits_one_schedule_across_actors(tmp_path, server, cluster):
    server.behaviour.latency = 0.02
    scenario = write_scenario(tmp_path / "s.toml", server.url, rate=[20], samples=12, workers=2)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet", "--ray", cluster)
    assert code == 0, output
    rows = sorted(_rows(tmp_path / "run"), key=lambda r: r["t_scheduled"])
    assert len(rows) == len(server.requests) == 12 and [r["sample"] for r in rows] == list(
        range(12)
    )
    assert [r["worker"] for r in rows] == [0, 1] * 6
    gaps = [b["t_scheduled"] - a["t_scheduled"] for a, b in zip(rows, rows[1:], strict=False)]
    assert all(abs(gap - 0.05) < 1e-3 for gap in gaps), (
        gaps
    )  # one Unix start, each host's own clock


def _wait_for_records(run_dir: Path, count: int, proc: subprocess.Popen, limit: float = 90) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        if sum(len(p.read_bytes().splitlines()) for p in RunDir(run_dir).record_files()) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(
        f"no {count} records in {limit} s: {proc.communicate(timeout=30)[0] if proc.poll() else ''}"
    )


def test_ctrl_c_keeps_every_finished_record_and_resume_finishes(tmp_path, server, cluster):
    server.behaviour.latency = 0.2
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, probes=TWO_PROBES, concurrency=[1, 2], samples=6, workers=2
    )
    run_dir = tmp_path / "run"
    proc = _kevload(
        "run", scenario, "--out", run_dir, "--quiet", "--ray", cluster, start_new_session=True
    )
    _wait_for_records(run_dir, 4, proc)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, output
    assert "Traceback" not in output
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"
    assert len(_rows(run_dir)) == len(
        server.requests
    )  # nothing the server answered was lost on the way back
    code, output = run_cli("run", "--resume", run_dir, "--quiet", "--ray", cluster)
    assert code == 0, output
    assert all(c["ok"] == 6 for c in load_summary(run_dir)["cells"] if c["role"] == "probe")
    rows = _rows(run_dir)
    assert len(rows) == len(server.requests)
    _check_levels(rows, 2, levels=4)


def test_a_stop_mid_level_leaves_no_counted_sample_without_its_batch(tmp_path, server, cluster):
    rows = stop_mid_level(tmp_path, server, "--workers", "2", "--ray", cluster)
    assert sum(r["counted"] for r in rows) >= 9  # the level counted before the stop


def test_ids_and_nonces_stay_unique_across_a_killed_driver_and_a_resume(tmp_path, server, cluster):
    kill_and_resume(tmp_path, server, ["--workers", "2", "--ray", cluster], ["--ray", cluster])


def test_sigterm_stops_a_ray_run_as_ctrl_c_does(tmp_path, server, cluster):
    # ray.init puts in a SIGTERM handler that exits at once: kevload's own stop must stay (exit 143,
    # records kept).
    server.behaviour.latency = 0.2
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=6, workers=2
    )
    run_dir = tmp_path / "run"
    with Kevload(
        "run", scenario, "--out", run_dir, "--quiet", "--ray", cluster, cwd=ROOT
    ) as kevload:
        kevload.wait_for(lambda: len(server.requests) >= 4, timeout=90)
        kevload.signal(signal.SIGTERM)
        ended = kevload.end(timeout=120)
    assert ended.code == 143, ended.stderr
    assert "Traceback" not in ended.stderr and ended.left == []
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"
    assert len(_rows(run_dir)) == len(server.requests)


def _actor_pids(name: str) -> list[int]:
    """Live processes whose title Ray set to ``ray::<name>`` (an actor of that class)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if title.startswith(f"ray::{name}"):
                found.append(int(entry.name))
    return found


def test_a_dead_actor_ends_the_run_with_a_kevload_error(tmp_path, server, cluster):
    server.behaviour.latency = 0.2
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, probes=TWO_PROBES, concurrency=[1, 2], samples=8, workers=2
    )
    run_dir = tmp_path / "run"
    # Actors of an earlier test (or another run on this machine) may still be on their way out:
    # this run's workers are the ones that were not there before it.
    earlier = set(_actor_pids("KevloadWorker"))
    proc = _kevload(
        "run", scenario, "--out", run_dir, "--quiet", "--ray", cluster, start_new_session=True
    )
    _wait_for_records(run_dir, 3, proc)
    actors = [pid for pid in _actor_pids("KevloadWorker") if pid not in earlier]
    assert len(actors) == 2, actors
    os.kill(actors[-1], signal.SIGKILL)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 3, output
    assert "kevload: error: --ray: worker" in output and " lost on node " in output, output
    assert "Traceback" not in output
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"
    assert 3 <= len(_rows(run_dir)) <= len(server.requests)


def test_an_actor_with_only_companion_slots_keeps_them_past_target_timeout(
    tmp_path, server, cluster
):
    """Mixed mode, c = 2, on two Ray actors (test_workers has it on worker processes): actor 1 holds
    the companion slot, decides alone and is done from the start; its companion must run (uncounted
    hold or counted) until actor 0's probe slot is done, never be cut as a timeout."""
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
    done = run_child(
        "run", scenario, "--out", tmp_path / "run", "--quiet", "--ray", cluster, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = list(RunDir(tmp_path / "run").record_dicts())
    assert not [r for r in rows if r["status"] != "ok"], [
        r["error"] for r in rows if r["status"] != "ok"
    ][:3]
    probe = next(c for c in load_summary(tmp_path / "run")["cells"] if c["role"] == "probe")
    assert probe["ok"] == 8 and not probe["samples_never_full"], probe


def test_a_back_off_on_one_actor_flags_the_samples_the_other_counted_meanwhile(
    tmp_path, server, cluster
):
    """Actor 0's first request gets a 429 with Retry-After: 1 and backs off a second; actor 1
    decides alone (actor 0's slot taken as busy) and counts samples meanwhile with one request in
    flight: the cell must say so."""
    first = []

    def fault_for(request_id):
        seq = int(request_id.rsplit("-", 1)[1])
        if seq % 2 == 0 and not first:
            first.append(seq)
            return "http_429"
        return None

    server.behaviour.latency = 0.1
    server.behaviour.retry_after = "1"
    server.behaviour.fault_for = fault_for
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[2], samples=10, workers=2, retries=1
    )
    done = run_child(
        "run", scenario, "--out", tmp_path / "run", "--quiet", "--ray", cluster, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = sorted(RunDir(tmp_path / "run").record_dicts(), key=lambda r: r["t_send"])
    retried = next(r for r in rows if r["retries"])
    alone = [
        r
        for r in rows
        if r["counted"] and r["worker"] == 1 and r["t_last_byte"] < retried["t_send"]
    ]
    assert len(alone) >= 3, (
        rows
    )  # counted while actor 0 backed off, each saying one other was in flight
    probe = next(c for c in load_summary(tmp_path / "run")["cells"] if c["role"] == "probe")
    assert probe["samples_never_full"] >= len(alone), probe


@pytest.mark.parametrize("mode", ["needle"])
def test_companion_modes_on_actors_give_the_verdict_of_one_process(tmp_path, server, cluster, mode):
    """The probe slot on actor 0, companions on actors 0 and 1: drift at three in flight is found as
    in one process, and no counted probe sample lacks its batch."""
    server.behaviour.latency = 0.1
    server.behaviour.drift_at = 3
    server.behaviour.batched_variant = True
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, mode=mode, concurrency=[1, 3], samples=6, workers=2
    )
    one = run_child(
        "run", scenario, "--out", tmp_path / "one", "--quiet", "--workers", "1", timeout=120
    )
    ray = run_child(
        "run", scenario, "--out", tmp_path / "ray", "--quiet", "--ray", cluster, timeout=120
    )
    assert one.returncode == ray.returncode == 1, (one.stdout + one.stderr, ray.stdout + ray.stderr)
    cells = [
        {
            c["concurrency"]: (c["ok"], c["drift"], c.get("samples_never_full"))
            for c in load_summary(d)["cells"]
            if c["role"] == "probe"
        }
        for d in (tmp_path / "one", tmp_path / "ray")
    ]
    assert cells[0] == cells[1], cells
    rows = list(RunDir(tmp_path / "ray").record_dicts())
    assert not [r for r in rows if r["status"] != "ok"]


@pytest.mark.e2e
def test_two_nodes_give_the_verdicts_of_one_process(tmp_path, tmp_path_factory, server):
    """Workers on both nodes of a two-node cluster (separate Ray temp dirs on this host); no Ray
    process left."""
    pytest.importorskip("ray")
    server.behaviour.latency = 0.3
    server.behaviour.drift_at = 4
    server.behaviour.batched_variant = True
    stable = write_scenario(
        tmp_path / "stable.toml",
        server.url,
        probes=TWO_PROBES,
        concurrency=[1, 3],
        samples=4,
        workers=2,
    )
    drift = write_scenario(
        tmp_path / "drift.toml",
        server.url,
        probes=TWO_PROBES,
        concurrency=[1, 4],
        samples=4,
        workers=2,
    )
    # A short temp dir: Ray's socket paths under it must fit the 107 bytes of a Unix socket name.
    with ray_cluster(tmp_path_factory.mktemp("ray2"), nodes=2, cpus=1) as address:
        for scenario, expected in ((stable, 0), (drift, 1)):
            local, output_local = run_cli(
                "run", scenario, "--out", tmp_path / f"{scenario.stem}-one", "--quiet"
            )
            before = len(server.requests)
            run_dir = tmp_path / f"{scenario.stem}-ray"
            code, output = run_cli("run", scenario, "--out", run_dir, "--quiet", "--ray", address)
            assert local == code == expected, (output_local, output)
            rows = _rows(run_dir)
            assert len(rows) == len(server.requests) - before
            _check_levels(rows, 2, levels=4)
            nodes = json.loads((run_dir / "run.json").read_text())["ray"][0]["nodes"]
            assert len(set(nodes)) == 2, nodes  # one worker actor on each node
