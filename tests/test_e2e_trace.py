"""Trace replay on llama.cpp: the synthetic prompts reach the server at the trace's lengths, on the trace's clock."""

from __future__ import annotations

import json

import pytest

from kevload.store import read_records
from kevload.targets import running_target
from tests.conftest import load_summary, run_cli, write_scenario
from tests.test_e2e_targets import QUIET

pytestmark = pytest.mark.e2e


def test_llamacpp_replay_prompt_tokens_follow_the_trace(tmp_path):
    # 10 requests over 2 s of trace, replayed in 0.5 s; input lengths 20 … 65, hash ids 0 and 1 shared by all.
    rows = [{"timestamp": 200 * i, "input_length": 20 + 5 * i, "output_length": 4, "hash_ids": [0, 1, 10 + i]}
            for i in range(10)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with running_target("llamacpp", slots=4, **QUIET) as target:
        scenario = write_scenario(tmp_path / "s.toml", target.url, concurrency=[1], samples=2, trace="t.jsonl",
                                  trace_speedup=[4], trace_block_tokens=8,
                                  probes=[{"id": "p1", "prompt": "Name a colour.", "max_tokens": 8}],
                                  target={"model": target.model, "timeout": 120})
        code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code in (0, 1), output
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    companions = sorted((r for r in records if r["role"] == "companion"), key=lambda r: r["t_scheduled"])
    assert [r["status"] for r in companions] == ["ok"] * 10
    # One word a token: the server counts each prompt at its trace length plus one constant, its chat template.
    template = {r["prompt_tokens"] - row["input_length"] for r, row in zip(companions, rows, strict=True)}
    assert len(template) == 1 and 0 <= template.pop() < 64
    assert all(r["completion_tokens"] <= 4 for r in companions)
    start = companions[0]["t_scheduled"]
    assert [r["t_scheduled"] - start for r in companions] == pytest.approx([0.05 * i for i in range(10)], abs=1e-9)
    assert max(r["t_send"] - r["t_scheduled"] for r in companions) < 0.05
    summary = load_summary(tmp_path / "run")
    assert [c["rate"] for c in summary["cells"] if c["role"] == "probe"] == [None, 22.222222]  # 10 over 1.8 s × 4
