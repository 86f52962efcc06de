"""scenarios/prefix_cache.toml as it stands, on the built-in real servers: each finds its own way to
make a sample cold (llama.cpp's cache_prompt, vLLM's reset), and kevload's comparison of cold and
warm says what the raw answers say (read apart from kevload, through a RecordingProxy): which
samples the server said came from its cache, which rounds it confirmed or contradicted, which
answers were equal. vLLM's test is in tests/load/test_e2e_cancel.py, on that file's vLLM (one start
less)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kevload.records.rundir import RunDir
from kevload.servers.processes import pid_alive
from kevload.servers.targets import running_target
from tests.conftest import run_cli
from tests.recording_proxy import RecordingProxy

pytestmark = pytest.mark.e2e

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "prefix_cache.toml"
QUIET = {"log": lambda message: None}


def run_prefix_cache(tmp_path: Path, target) -> tuple[int, dict, list, dict]:
    with RecordingProxy(target.url.removesuffix("/v1")) as proxy:
        code, output = run_cli(
            "run",
            SCENARIO,
            "--set",
            f'target.base_url="{proxy.url}"',
            "--set",
            f'target.model="{target.model}"',
            "--set",
            "load.samples=4",
            "--out",
            tmp_path / "run",
            "--quiet",
        )
        # The run's requests (the nonce in "user"), not the resets between rounds.
        raw = {
            body["user"]: json.loads(answer)
            for body, answer in proxy.exchanges
            if str(body.get("user", "")).startswith("kevload-")
        }
    assert code in (0, 1), output
    run = RunDir(tmp_path / "run")
    return code, run.summary().prefix_cache, [r for r in run.records() if r.role == "probe"], raw


def _cached(answer: dict) -> int | None:
    """The prompt tokens the server says it reused: vLLM's usage details, llama.cpp's timings."""
    details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        return details["cached_tokens"]
    return (answer.get("timings") or {}).get("cache_n")


def holds(code: int, cache: dict, records: list, raw: dict, method: str) -> dict:
    assert cache["method"] == method
    (c,) = cache["probes"]
    assert [r.cache for r in records] == ["cold", "warm", "cold", "warm"]
    # What the server said of each sample and answered, read from its raw bodies.
    said = [raw[f"kevload-{r.run_id}-{r.seq}"] for r in records]
    cached = [_cached(a) for a in said]
    texts = [a["choices"][0]["message"]["content"] for a in said]
    assert [r.cached_tokens for r in records] == cached and [r.output for r in records] == texts
    # Round by round (cold, warm): a warm sample said to reuse no more than its cold one is no warm
    # one (left out); confirmed where the server said both; equal where the answers are.
    rounds = [(0, 1), (2, 3)]
    kept = [(i, j) for i, j in rounds if cached[j] is None or cached[j] > (cached[i] or 0)]
    confirmed = sum(cached[i] is not None and cached[j] is not None for i, j in kept)
    equal = sum(texts[i] == texts[j] for i, j in kept)
    assert (c["rounds"], c["contradicted"], c["confirmed"]) == (
        len(kept),
        len(rounds) - len(kept),
        confirmed,
    ), (c, cached)
    assert c["equal_rounds"] == equal, (c, texts)
    warm = [cached[j] for _, j in kept if cached[j] is not None]
    cold = [cached[i] for i, _ in kept if cached[i] is not None]
    assert (c["cached_tokens_cold"], c["cached_tokens_warm"]) == (
        max(cold, default=None),
        min(warm, default=None),
    ), (c, cached)
    # Same input, other output is drift whatever its cause: the verdict and the comparison agree.
    assert code == (1 if c["equal_rounds"] < c["rounds"] or c["cold"]["distinct"] > 1 else 0)
    return c


def test_llamacpp_makes_cold_with_cache_prompt_false(tmp_path):
    with running_target("llamacpp", slots=1, **QUIET) as target:
        code, cache, records, raw = run_prefix_cache(tmp_path, target)
    assert not pid_alive(target.pid)
    holds(code, cache, records, raw, "cache_prompt")
    assert [r.params["cache_prompt"] for r in records] == [False, True, False, True]
