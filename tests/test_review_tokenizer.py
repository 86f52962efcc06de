"""Review of load.trace_tokenizer: what kevload said about a tokenizer-fitted replay that was not true, each against
a crafted tokenizer.json whose truth is known."""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers

from kevload.trace import VOCABULARY
from tests.conftest import run_cli, write_scenario
from tests.test_trace import mooncake
from tests.test_trace_tokenizer import ROWS


def test_a_tokenizer_whose_encode_raises_exits_2(tmp_path):
    """A WordLevel tokenizer without its unknown token raises on any word it lacks: kevload ended in a traceback
    (exit 1), not the refusal naming the file and the key."""
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCABULARY[:100])}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tok.json"))
    mooncake(tmp_path / "t.jsonl", ROWS)
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], trace="t.jsonl",
                              trace_tokenizer="tok.json")
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and "tok.json: load.trace_tokenizer: expected a Hugging Face tokenizer.json" in output, output
    assert "Missing [UNK] token" in output
