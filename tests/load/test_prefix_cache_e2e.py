"""scenarios/prefix_cache.toml as it stands, on the built-in real servers: each finds its own way to make a sample
cold (llama.cpp's cache_prompt, vLLM's reset), and the server's own account says the warm ones were warm."""

from __future__ import annotations

from pathlib import Path

import pytest

from kevload.records.rundir import RunDir
from kevload.servers.processes import pid_alive
from kevload.servers.targets import running_target
from tests.conftest import run_cli

pytestmark = pytest.mark.e2e

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "prefix_cache.toml"
QUIET = {"log": lambda message: None}


def _run(tmp_path: Path, target) -> tuple[int, dict, list]:
    code, output = run_cli(
        "run",
        SCENARIO,
        "--set",
        f'target.base_url="{target.url}"',
        "--set",
        f'target.model="{target.model}"',
        "--set",
        "load.samples=4",
        "--out",
        tmp_path / "run",
        "--quiet",
    )
    assert code in (0, 1), output
    run = RunDir(tmp_path / "run")
    return code, run.summary().prefix_cache, [r for r in run.records() if r.role == "probe"]


def _holds(code: int, cache: dict, records: list, method: str) -> dict:
    assert cache["method"] == method
    (c,) = cache["probes"]
    assert [r.cache for r in records] == ["cold", "warm", "cold", "warm"]
    # The server itself says every cold sample came without its cache and every warm one with it.
    assert [r.cached_tokens == 0 for r in records] == [True, False, True, False]
    assert (c["rounds"], c["confirmed"], c["contradicted"]) == (2, 2, 0)
    # Same input, other output is drift whatever its cause: the verdict and the comparison agree.
    assert code == (1 if c["equal_rounds"] < c["rounds"] or c["cold"]["distinct"] > 1 else 0)
    return c


def test_llamacpp_makes_cold_with_cache_prompt_false(tmp_path):
    with running_target("llamacpp", slots=1, **QUIET) as target:
        code, cache, records = _run(tmp_path, target)
    assert not pid_alive(target.pid)
    _holds(code, cache, records, "cache_prompt")
    assert [r.params["cache_prompt"] for r in records] == [False, True, False, True]


def test_vllm_makes_cold_with_its_own_reset(tmp_path):
    with running_target("vllm", enforce_eager=True, **QUIET) as target:
        code, cache, records = _run(tmp_path, target)
    assert not pid_alive(target.pid)
    c = _holds(code, cache, records, "reset_prefix_cache")
    assert c["cached_tokens_warm"] >= 16  # whole blocks of the long system message
