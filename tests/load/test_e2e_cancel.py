"""End to end on real vLLM (its CPU build): a companion kevload cuts is aborted by the server, which
names it by kevload's X-Request-Id in its log and stops decoding it. The same vLLM (one start less
in CI) then serves scenarios/prefix_cache.toml, whose cold samples it makes with its own reset
(tests/load/test_prefix_cache_e2e.py has the llama.cpp half and the checks)."""

from __future__ import annotations

import re
import time

import pytest

from kevload.records.store import read_records
from kevload.servers.processes import pid_alive
from kevload.servers.targets import running_target
from tests.conftest import load_summary, run_cli, write_scenario
from tests.load.test_prefix_cache_e2e import holds, run_prefix_cache

pytestmark = pytest.mark.e2e

PROBE = [
    {"id": "p1", "prompt": "Write a short story about a robot learning to paint.", "max_tokens": 16}
]
# Companions long enough that a cut after 2 tokens is always mid-answer, even where a loaded machine
# delays the client's reading of the 2nd token by seconds (an answer the server has finished is not
# aborted).
COMPANIONS = "\n".join(
    f'{{"prompt": "Tell a long story about the number {n}.", "max_tokens": 256}}' for n in range(4)
)


@pytest.fixture(scope="module")
def vllm_eager():
    """Four sequences, eager, logging each request (the cut ones are named as aborted there)."""
    with running_target(
        "vllm",
        max_num_seqs=4,
        enforce_eager=True,
        extra_args=("--enable-log-requests",),
        log=lambda message: None,
    ) as target:
        yield target
    assert not pid_alive(target.pid)


def test_vllm_aborts_each_request_kevload_cuts(tmp_path, vllm_eager):
    (tmp_path / "companions.jsonl").write_text(COMPANIONS + "\n")
    target = vllm_eager
    scenario = write_scenario(
        tmp_path / "s.toml",
        target.url,
        probes=PROBE,
        target={"model": target.model, "timeout": 120},
        mode="mixed",
        companions=str(tmp_path / "companions.jsonl"),
        concurrency=[1, 4],
        samples=4,
        stream=True,
        cancel_share=1.0,
        cancel_after_tokens=2,
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    cut = [
        r for r in read_records(tmp_path / "run" / "records.jsonl") if r["status"] == "cancelled"
    ]
    missing = _not_yet_aborted(target.log_path, cut)
    assert code in (0, 1), (
        output
    )  # 1: the probe drifted, which cuts may well cause; this test is about the cuts
    # At least 2: chunks that came in the same read as the 2nd are read too (a cut answer's end
    # might be among them).
    assert cut and all(r["role"] == "companion" and r["chunks"] >= 2 for r in cut)
    assert not missing, missing
    summary = load_summary(tmp_path / "run")
    assert (
        summary["cancelled"] == len(cut)
        and summary["errors"] == 0
        and summary["verdict"] != "target_failed"
    )


def _not_yet_aborted(log_path, cut, wait_s=30.0):
    """For each of ``cut`` the server's log has not named as aborted within ``wait_s``: its request
    id, the chunks kevload read and what the log says of it (so that a failure tells a late abort
    from none).

    The server learns of a cut when it sees the connection close, which may be after kevload has
    finished the run (the last cut of a run races the run's end), so the log is read until every cut
    is named or the wait is over.
    """
    deadline = time.monotonic() + wait_s
    while True:
        log = log_path.read_text(errors="replace")
        aborted = {
            rid
            for line in re.findall(r"Aborted request\(s\) (\S+?)\.?$", log, re.M)
            for rid in line.split(",")
        }
        # vLLM names a request chatcmpl-<X-Request-Id>-<suffix of its own>.
        missing = [r for r in cut if not any(f"chatcmpl-{r['request_id']}-" in a for a in aborted)]
        if not missing or time.monotonic() > deadline:
            return [
                (
                    r["request_id"],
                    r["chunks"],
                    [
                        line[:160]
                        for line in log.splitlines()
                        if f"chatcmpl-{r['request_id']}" in line
                    ],
                )
                for r in missing
            ]
        time.sleep(0.5)


def test_vllm_makes_cold_with_its_own_reset(tmp_path, vllm_eager):
    code, cache, records, raw = run_prefix_cache(tmp_path, vllm_eager)
    holds(code, cache, records, raw, "reset_prefix_cache")
