"""End to end on the built-in real servers (llama.cpp, transformers serve): kevload's cells agree
with an independent parse of the same requests (tests/rawclient.py), whatever the servers do on this
CPU."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from kevload.records.store import read_records
from kevload.servers.processes import pid_alive
from kevload.servers.targets import running_target
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario
from tests.rawclient import Seen, answer_of, assert_cells_agree, seen_in
from tests.recording_proxy import RecordingProxy

pytestmark = pytest.mark.e2e

PROBE = [
    {"id": "p1", "prompt": "Write a short story about a robot learning to paint.", "max_tokens": 32}
]
QUIET = {"log": lambda message: None}


@pytest.fixture(scope="module")
def llamacpp():
    with running_target("llamacpp", slots=4, **QUIET) as target:
        yield target
    assert not pid_alive(target.pid)


@pytest.fixture(scope="module")
def transformers():
    with running_target("transformers", **QUIET) as target:
        yield target
    assert not pid_alive(target.pid)


def _run(
    tmp_path: Path, target, name: str, *, params: dict, fail_on: str = "drift", **load
) -> tuple[int, dict, Seen, list[tuple[dict, bytes]]]:
    """A run of the probe on ``target`` through a RecordingProxy: its exit code, its cells by level,
    and what the independent parse of the same requests saw, checked to agree with the cells."""
    with RecordingProxy(target.url.removesuffix("/v1")) as proxy:
        scenario = write_scenario(
            tmp_path / f"{name}.toml",
            proxy.url,
            probes=PROBE,
            params=params,
            target={"model": target.model, "timeout": 120},
            **load,
        )
        code, output = run_cli(
            "run", scenario, "--out", tmp_path / name, "--quiet", "--fail-on", fail_on
        )
        exchanges = list(proxy.exchanges)
    assert code in (0, 1), output
    cells = cells_by_level(load_summary(tmp_path / name))
    seen = seen_in(exchanges, tmp_path / name)
    assert_cells_agree(cells, seen)
    assert code == (1 if seen.drift or (fail_on == "latent" and seen.latent) else 0), output
    return code, cells, seen, exchanges


# What the servers do (sampling varies or not, batching moves the answers or not) is this CPU's and
# this build's to say: each test asserts that kevload says what the answers it got say (_run), never
# what the engine ought to do. tests/servers/test_independent_check.py runs the same check on
# crafted servers that hold and that drift.


def test_llamacpp_unseeded_sampling_is_counted_as_its_answers_say(tmp_path, llamacpp):
    _, cells, seen, _ = _run(
        tmp_path, llamacpp, "t08", params={"temperature": 0.8}, concurrency=[1], samples=8
    )
    assert cells[1]["distinct"] == seen.of(1).distinct >= 1


@pytest.mark.parametrize(
    "params", [{"temperature": 0.8, "seed": 42}, {"temperature": 0}], ids=["seed", "greedy"]
)
def test_llamacpp_fixed_randomness_is_counted_as_its_answers_say(tmp_path, llamacpp, params):
    _, cells, seen, _ = _run(tmp_path, llamacpp, "fixed", params=params, concurrency=[1], samples=4)
    assert cells[1]["ok"] == 4


@pytest.mark.parametrize("mode", ["single", "mixed"])
def test_llamacpp_batched_cells_and_logprobs_agree_with_its_answers(tmp_path, llamacpp, mode):
    # --fail-on latent: the logprobs count too, bitwise, at every level (docs/real-servers.md).
    _, cells, seen, _ = _run(
        tmp_path,
        llamacpp,
        mode,
        params={"temperature": 0, "seed": 1},
        fail_on="latent",
        mode=mode,
        concurrency=[1, 2, 4],
        samples=4,
    )
    assert all(cells[c]["ok"] == 4 for c in (1, 2, 4))
    # llama.cpp sends logprobs (asked for by kevload's one check): the numbers were compared too.
    assert all(a.logprobs for c in (1, 2, 4) for a in seen.of(c).answers)
    # And the load was what the cell says: every counted sample sent with c - 1 others in flight.
    counted = [
        r
        for r in read_records(tmp_path / mode / "records.jsonl")
        if r["role"] == "probe" and r["counted"]
    ]
    assert {(r["concurrency"], r["in_flight"]) for r in counted} == {(1, 0), (2, 1), (4, 3)}


def test_llamacpp_streamed_answers_are_read_as_sent(tmp_path, llamacpp):
    # Each streamed answer kevload recorded is the one the server's raw event stream holds.
    _, _, _, exchanges = _run(
        tmp_path,
        llamacpp,
        "stream",
        params={"temperature": 0},
        stream=True,
        concurrency=[1, 2],
        samples=2,
    )
    by_nonce = {body.get("user"): answer_of(raw) for body, raw in exchanges}
    records = [
        r for r in read_records(tmp_path / "stream" / "records.jsonl") if r["status"] == "ok"
    ]
    assert len(records) >= 4 and all(r["chunks"] > 1 for r in records)
    for r in records:
        answer = by_nonce[f"kevload-{r['run_id']}-{r['seq']}"]
        assert (r["output"], tuple(r["logprobs"] or ()) or None) == (answer.text, answer.logprobs)


def test_transformers_batched_cells_agree_with_its_answers(tmp_path, transformers):
    # transformers serve sends no logprobs: compared on text, where each divergent answer leaves
    # the serial one checked too (_run).
    _, cells, seen, _ = _run(
        tmp_path,
        transformers,
        "tf",
        params={"temperature": 0, "seed": 1},
        mode="mixed",
        concurrency=[1, 4],
        samples=8,
    )
    assert not any(a.logprobs for a in seen.of(1).answers) and not cells[4].get("logprob_samples")
    print(f"transformers mixed c=4: drift {seen.of(4).drift}, {seen.of(4).distinct} distinct")


def test_target_is_stopped_when_the_block_fails():
    with (
        pytest.raises(RuntimeError, match="boom"),
        running_target("llamacpp", slots=1, **QUIET) as target,
    ):
        assert pid_alive(target.pid)
        raise RuntimeError("boom")
    assert not pid_alive(target.pid)


def test_target_cli_start_status_stop(tmp_path):
    import subprocess
    import sys

    started = subprocess.run(
        [sys.executable, "-m", "kevload", "target", "start", "llamacpp", "--slots", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip().splitlines()[-1]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    try:
        status = run_cli("target", "status", "llamacpp")
        assert status[0] == 0 and url in status[1] and "slots=2" in status[1]
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=10) as response:
            assert response.status == 200
        # A run sent to it by URL (another process than the one that started it) names it.
        probes = [{"id": "p", "prompt": "Say hi.", "max_tokens": 4}]
        path = write_scenario(
            tmp_path / "s.toml", url, probes=probes, concurrency=[1], samples=1,
            target={"timeout": 120},
        )  # fmt: skip
        assert run_cli("run", path, "--out", tmp_path / "r", "--quiet")[0] == 0
        server = json.loads((tmp_path / "r" / "run.json").read_text())["server"]
        assert server["target"] == "llamacpp" and server["settings"] == {"slots": 2}
    finally:
        stopped = run_cli("target", "stop", "llamacpp")
    assert stopped[0] == 0 and "stopped" in stopped[1]
    assert run_cli("target", "status", "llamacpp")[0] == 3
