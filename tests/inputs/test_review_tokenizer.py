"""Review of load.trace_tokenizer: what kevload said about a tokenizer-fitted replay that was not true, each against
a crafted tokenizer.json whose truth is known."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

from kevload.inputs.trace import VOCABULARY, read_trace
from tests.conftest import run_cli, write_scenario
from tests.inputs.test_trace import mooncake
from tests.inputs.test_trace_tokenizer import ROWS, SPLIT, tokens, wordpiece
from tests.load.test_review22_trace import read, traced_run


def fitted(tmp_path: Path, tokenizer: Path):
    return read_trace(mooncake(tmp_path / "t.jsonl", ROWS), what="load.trace", trace_format="auto", seed=0,
                      max_requests=0, block_tokens=8, tokenizer=tokenizer, tokenizer_what="load.trace_tokenizer")


def word_level(path: Path, vocab: dict[str, int]) -> Path:
    """A tokenizer.json of whole words, ``[UNK]`` for the others (an error where ``vocab`` lacks it)."""
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path


def run_with(tmp_path: Path, tokenizer: str) -> tuple[int, str]:
    """``kevload run`` of a trace with ``load.trace_tokenizer = tokenizer`` (a file in ``tmp_path``)."""
    mooncake(tmp_path / "t.jsonl", ROWS)
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], trace="t.jsonl",
                              trace_tokenizer=tokenizer)
    return run_cli("run", scenario, "--out", tmp_path / "run")


def test_a_tokenizer_whose_encode_raises_exits_2(tmp_path):
    """A WordLevel tokenizer without its unknown token raises on any word it lacks: kevload ended in a traceback
    (exit 1), not the refusal naming the file and the key."""
    word_level(tmp_path / "tok.json", {w: i for i, w in enumerate(VOCABULARY[:100])})
    code, output = run_with(tmp_path, "tok.json")
    assert code == 2 and "tok.json: load.trace_tokenizer: expected a Hugging Face tokenizer.json" in output, output
    assert "Missing [UNK] token" in output


def test_the_files_truncation_and_padding_are_not_the_servers(tmp_path):
    """A tokenizer.json saved with truncation (max_length 40) made `checked` say 10 of the 12 prompts were off by
    up to -67 tokens, all of which encode at their lengths exactly; one saved with fixed padding had every word
    refused as not one token. A server counts a prompt whole and unpadded."""
    whole = wordpiece(tmp_path / "whole.json")
    truncating = wordpiece(tmp_path / "trunc.json")
    doc = json.loads(truncating.read_text())
    doc["truncation"] = {"direction": "Right", "max_length": 40, "strategy": "LongestFirst", "stride": 0}
    truncating.write_text(json.dumps(doc))
    trace = fitted(tmp_path, truncating)
    assert [tokens(whole, trace.probe_for(i).prompt) for i in range(len(ROWS))] == [i for _, i, _, _ in ROWS]
    assert trace.tokenizer["checked"] == {"lines": 12, "exact": 12, "max_off": 0}

    padding = Tokenizer.from_file(str(wordpiece(tmp_path / "pad.json")))
    padding.enable_padding(length=16, pad_id=0, pad_token="[UNK]")
    padding.save(str(tmp_path / "pad.json"))
    trace = fitted(tmp_path, tmp_path / "pad.json")
    assert trace.tokenizer["dropped"] == list(SPLIT) and trace.tokenizer["checked"]["exact"] == 12


def test_a_file_too_large_for_a_tokenizer_is_refused_unread(tmp_path):
    """A model's weights named by mistake (a .gguf, GBs) were read whole into memory: a MemoryError's traceback
    where memory is bounded, the host's memory otherwise. A sparse file: nothing of it is on disk."""
    with (tmp_path / "model.gguf").open("wb") as handle:
        handle.truncate(4 << 30)
    code, output = run_with(tmp_path, "model.gguf")
    assert code == 2 and "model.gguf: load.trace_tokenizer: expected a Hugging Face tokenizer.json" in output, output
    assert "4,096 MiB" in output


def test_words_the_tokenizer_does_not_know_are_not_kept(tmp_path):
    """A tokenizer that knows none of the words makes each its one unknown token: kevload kept all 188 (`words`
    188, nothing dropped) of a file that is no tokenizer for English text, and every prompt it sent was the same
    tokens, so a server's prefix cache reused what the trace never shared."""
    word_level(tmp_path / "tok.json", {"[UNK]": 0})
    code, output = run_with(tmp_path, "tok.json")
    assert code == 2 and "at least 32 of kevload's 188), got 0" in output, output
    # Half the words unknown: those are dropped, the known ones kept.
    known = VOCABULARY[::2]
    half = word_level(tmp_path / "half.json", {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(known)}})
    trace = fitted(tmp_path, half)
    assert trace.words == known and trace.tokenizer["dropped"] == list(VOCABULARY[1::2])


def test_a_trace_cells_case_reruns_with_the_runs_tokenizer(tmp_path, server):
    """`cases build` of a tokenizer-fitted trace level kept the trace but not load.trace_tokenizer: `cases rerun`
    replayed the built-in words, prompts the run never sent (a split word's line one token longer)."""
    wordpiece(tmp_path / "tokenizer.json")
    traced_run(tmp_path, server.url, samples=2, trace_speedup=[2], trace_tokenizer="tokenizer.json")
    cases_path = tmp_path / "cases.jsonl"
    assert run_cli("cases", "build", tmp_path / "run", "-o", cases_path)[0] == 0
    case = next(c for c in read(cases_path) if c["params"]["concurrency"] == 0)
    assert Path(case["load"]["trace_tokenizer"]) == (tmp_path / "tokenizer.json").resolve()
    # A trace level without a tokenizer: its case is the one it was before the key existed.
    plain = tmp_path / "plain"
    plain.mkdir()
    traced_run(plain, server.url, samples=2, trace_speedup=[2])
    assert run_cli("cases", "build", plain / "run", "-o", plain / "cases.jsonl")[0] == 0
    assert all("trace_tokenizer" not in c["load"] for c in read(plain / "cases.jsonl"))

    server.requests.clear()
    code, output = run_cli("cases", "rerun", cases_path, "--url", server.url, "--model", "fake", "--times", "2",
                           "-o", tmp_path / "after.jsonl", "--out", tmp_path / "reruns")
    assert code in (0, 1), output
    sent = [b["messages"][-1]["content"] for b in server.requests]
    traced = [p for p in sent if p.split()[0] in VOCABULARY]
    assert traced and not {w for p in traced for w in p.split()} & set(SPLIT)


def test_resume_refuses_other_words_from_the_same_tokenizer_file(tmp_path, server):
    """--resume compared the tokenizer file's hash alone: a first part whose kevload (or tokenizers) kept other
    words from the same file (run.json's dropped) was resumed with prompts it never sent."""
    wordpiece(tmp_path / "tokenizer.json")
    run = traced_run(tmp_path, server.url, samples=2, trace_speedup=[4], trace_tokenizer="tokenizer.json")
    meta = json.loads((run / "run.json").read_text())
    meta["datasets"][0]["tokenizer"]["dropped"] = list(SPLIT[:5])  # as a kevload that split fewer words wrote it
    (run / "run.json").write_text(json.dumps(meta))
    code, output = run_cli("run", "--resume", run)
    assert code == 2 and "datasets: expected the inputs the run started with" in output, output
    assert "(5 dropped)" in output and f"({len(SPLIT)} dropped)" in output and "Traceback" not in output
