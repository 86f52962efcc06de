"""Review of issue 21: false claims found by crafted servers, each a regression test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kevload.records.rundir import RunDir
from tests.conftest import load_summary, write_scenario
from tests.raycluster import ray_cluster

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: object, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kevload", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_a_worker_with_only_companion_slots_keeps_them_past_target_timeout(tmp_path, server):
    """Mixed mode, c = 2, two workers: worker 0 has the probe slot, worker 1 one companion slot and no probe slot.
    Worker 1's drain began at the level's start (no probe of its own to wait for) and cut its companion in flight
    target.timeout seconds later, recorded as a companion "timeout" of the server's ("cut: … after the level's
    probes were done") while the probes still counted and the server answered every request in 0.15 s."""
    server.behaviour.latency = 0.15
    scenario = write_scenario(tmp_path / "s.toml", server.url, mode="mixed", concurrency=[2], samples=8,
                              workers=2, target={"timeout": 0.5})
    done = _run("run", scenario, "--out", tmp_path / "run", "--quiet", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = list(RunDir(tmp_path / "run").record_dicts())
    assert not [r for r in rows if r["status"] != "ok"], [r["error"] for r in rows if r["status"] != "ok"][:3]
    probe = next(c for c in load_summary(tmp_path / "run")["cells"] if c["role"] == "probe")
    assert probe["ok"] == 8 and not probe["samples_never_full"], probe


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("ray")
    with ray_cluster(tmp_path_factory.mktemp("ray"), nodes=1, cpus=2) as address:
        yield address


def test_an_actor_with_only_companion_slots_keeps_them_past_target_timeout(tmp_path, server, cluster):
    """As above on Ray actors: actor 1 holds the companion slot, decides alone and is done from the start; its
    companion must run (uncounted hold or counted) until actor 0's probe slot is done, never be cut as a timeout."""
    server.behaviour.latency = 0.15
    scenario = write_scenario(tmp_path / "s.toml", server.url, mode="mixed", concurrency=[2], samples=8,
                              workers=2, target={"timeout": 0.5})
    done = _run("run", scenario, "--out", tmp_path / "run", "--quiet", "--ray", cluster, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = list(RunDir(tmp_path / "run").record_dicts())
    assert not [r for r in rows if r["status"] != "ok"], [r["error"] for r in rows if r["status"] != "ok"][:3]
    probe = next(c for c in load_summary(tmp_path / "run")["cells"] if c["role"] == "probe")
    assert probe["ok"] == 8 and not probe["samples_never_full"], probe


def test_a_back_off_on_one_actor_flags_the_samples_the_other_counted_meanwhile(tmp_path, server, cluster):
    """Actor 0's first request gets a 429 with Retry-After: 1 and backs off a second; actor 1 decides alone (actor
    0's slot taken as busy) and counts samples meanwhile with one request in flight: the cell must say so."""
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
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[2], samples=10, workers=2, retries=1)
    done = _run("run", scenario, "--out", tmp_path / "run", "--quiet", "--ray", cluster, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = sorted(RunDir(tmp_path / "run").record_dicts(), key=lambda r: r["t_send"])
    retried = next(r for r in rows if r["retries"])
    alone = [r for r in rows if r["counted"] and r["worker"] == 1 and r["t_last_byte"] < retried["t_send"]]
    assert len(alone) >= 3, rows  # counted while actor 0 backed off, each saying one other was in flight
    probe = next(c for c in load_summary(tmp_path / "run")["cells"] if c["role"] == "probe")
    assert probe["samples_never_full"] >= len(alone), probe



@pytest.mark.parametrize("mode", ["needle"])
def test_companion_modes_on_actors_give_the_verdict_of_one_process(tmp_path, server, cluster, mode):
    """The probe slot on actor 0, companions on actors 0 and 1: drift at three in flight is found as in one
    process, and no counted probe sample lacks its batch."""
    server.behaviour.latency = 0.1
    server.behaviour.drift_at = 3
    server.behaviour.batched_variant = True
    scenario = write_scenario(tmp_path / "s.toml", server.url, mode=mode, concurrency=[1, 3], samples=6, workers=2)
    one = _run("run", scenario, "--out", tmp_path / "one", "--quiet", "--workers", "1", timeout=120)
    ray = _run("run", scenario, "--out", tmp_path / "ray", "--quiet", "--ray", cluster, timeout=120)
    assert one.returncode == ray.returncode == 1, (one.stdout + one.stderr, ray.stdout + ray.stderr)
    cells = [{c["concurrency"]: (c["ok"], c["drift"], c.get("samples_never_full")) for c in load_summary(d)["cells"]
              if c["role"] == "probe"} for d in (tmp_path / "one", tmp_path / "ray")]
    assert cells[0] == cells[1], cells
    rows = list(RunDir(tmp_path / "ray").record_dicts())
    assert not [r for r in rows if r["status"] != "ok"]
