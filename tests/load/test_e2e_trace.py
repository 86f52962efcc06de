"""Trace replay on llama.cpp: the synthetic prompts reach the server at the trace's lengths
(exactly, with the model's own tokenizer), on the trace's clock."""

from __future__ import annotations

import json

import pytest

from kevload.inputs.tokenwords import words_for
from kevload.inputs.trace import VOCABULARY, read_trace
from kevload.records.store import read_records
from kevload.servers.targets import running_target
from kevload.servers.targets.transformers_serve import model_dir
from tests.conftest import load_summary, run_cli, write_scenario
from tests.servers.test_e2e_targets import QUIET

pytestmark = pytest.mark.e2e


def test_llamacpp_replay_prompt_tokens_follow_the_trace(tmp_path):
    # 10 requests over 2 s of trace, replayed in 0.5 s; input lengths 20 … 65, hash ids 0 and 1
    # shared by all.
    rows = [
        {
            "timestamp": 200 * i,
            "input_length": 20 + 5 * i,
            "output_length": 4,
            "hash_ids": [0, 1, 10 + i],
        }
        for i in range(10)
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with running_target("llamacpp", slots=4, **QUIET) as target:
        scenario = write_scenario(
            tmp_path / "s.toml",
            target.url,
            concurrency=[1],
            samples=2,
            trace="t.jsonl",
            trace_speedup=[4],
            trace_block_tokens=8,
            probes=[{"id": "p1", "prompt": "Name a colour.", "max_tokens": 8}],
            target={"model": target.model, "timeout": 120},
        )
        code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code in (0, 1), output
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    companions = sorted(
        (r for r in records if r["role"] == "companion"), key=lambda r: r["t_scheduled"]
    )
    assert [r["status"] for r in companions] == ["ok"] * 10
    # One word a token: the server counts each prompt at its trace length plus one constant, its
    # chat template.
    template = {
        r["prompt_tokens"] - row["input_length"] for r, row in zip(companions, rows, strict=True)
    }
    assert len(template) == 1 and 0 <= template.pop() < 64
    assert all(r["completion_tokens"] <= 4 for r in companions)
    start = companions[0]["t_scheduled"]
    assert [r["t_scheduled"] - start for r in companions] == pytest.approx(
        [0.05 * i for i in range(10)], abs=1e-9
    )
    assert max(r["t_send"] - r["t_scheduled"] for r in companions) < 0.05
    summary = load_summary(tmp_path / "run")
    assert [c["rate"] for c in summary["cells"] if c["role"] == "probe"] == [
        None,
        22.222222,
    ]  # 10 over 1.8 s × 4


def test_llamacpp_counts_every_prompt_at_its_length_with_the_models_tokenizer(tmp_path):
    # SmolLM2's own tokenizer.json (the transformers target's conversion of the bundled model).
    tokenizer = model_dir(log=QUIET["log"]) / "tokenizer.json"
    dropped = set(words_for(tokenizer, VOCABULARY, what="load.trace_tokenizer").dropped)
    # The words it makes two tokens opening a prompt, as docs/workloads.md (Trace replay) lists
    # them.
    assert dropped == set(
        "morning guy garden autumn island village corner kitchen shoe dance sport".split()
    )
    # BurstGPT lines have no hash ids: each prompt opens with words of its own. A seed under which
    # the built-in words open some of them with a split word, and not all (found, not assumed: the
    # same on any machine).
    trace = tmp_path / "t.csv"
    trace.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        + "".join(f"{i / 4},m,{12 + i},4,{16 + i},x\n" for i in range(8))
    )

    def opens_split(seed: int) -> list[bool]:
        plain = read_trace(
            trace, what="load.trace", trace_format="auto", seed=seed, max_requests=0, block_tokens=8
        )
        return [plain.probe_for(i).prompt.split()[0] in dropped for i in range(plain.count)]

    seed = next(s for s in range(1000) if 0 < sum(opens_split(s)) < 8)
    extra = {}
    with running_target("llamacpp", slots=4, **QUIET) as target:
        for name, load in (("plain", {}), ("fitted", {"trace_tokenizer": str(tokenizer)})):
            scenario = write_scenario(
                tmp_path / f"{name}.toml",
                target.url,
                concurrency=[1],
                samples=2,
                trace="t.csv",
                trace_speedup=[4],
                dataset_seed=seed,
                probes=[{"id": "p1", "prompt": "Name a colour.", "max_tokens": 8}],
                target={"model": target.model, "timeout": 120},
                **load,
            )
            code, output = run_cli("run", scenario, "--out", tmp_path / name, "--quiet")
            assert code in (0, 1), output
            companions = sorted(
                (
                    r
                    for r in read_records(tmp_path / name / "records.jsonl")
                    if r["role"] == "companion"
                ),
                key=lambda r: r["t_scheduled"],
            )
            assert [r["status"] for r in companions] == ["ok"] * 8
            extra[name] = [r["prompt_tokens"] - (12 + i) for i, r in enumerate(companions)]
    # The built-in words: one token more where a split word opens the prompt. Fitted: every line at
    # its length plus the one constant (the chat template).
    template = min(extra["plain"])
    assert extra["plain"] == [template + split for split in opens_split(seed)]
    assert extra["fitted"] == [template] * 8
