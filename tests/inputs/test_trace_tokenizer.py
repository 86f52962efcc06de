"""load.trace_tokenizer: a replay's prompts fitted to the model's own tokenizer.json. The words it splits are
dropped, the prompts then encode to the trace's input lengths exactly (and run.json says what the check found),
worker processes send the same words, and a bad tokenizer is refused (exit 2, file and key)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from kevload.inputs.tokenwords import TokenizerWords
from kevload.inputs.trace import VOCABULARY, read_trace
from kevload.records.store import read_records
from tests.conftest import run_cli, write_scenario
from tests.inputs.test_trace import mooncake

# Long words a crafted vocabulary splits in two: about one word in five of a prompt.
SPLIT = tuple(w for w in VOCABULARY if len(w) >= 7)


def wordpiece(path: Path, split: tuple[str, ...] = SPLIT, *, whole: bool = True) -> Path:
    """A tokenizer.json that makes every vocabulary word one token except ``split`` (two pieces each); with
    ``whole`` false, every word is spelled letter by letter."""
    vocab = {"[UNK]": 0}
    for word in VOCABULARY:
        if not whole:
            pieces = [word[0], *(f"##{c}" for c in word[1:])]
        else:
            pieces = [word[:3], f"##{word[3:]}"] if word in split else [word]
        for piece in pieces:
            vocab.setdefault(piece, len(vocab))
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path


def tokens(path: Path, text: str) -> int:
    return len(Tokenizer.from_file(str(path)).encode(text, add_special_tokens=False).ids)


ROWS = [(100 * i, 30 + 7 * i, 4, [0, 1, 20 + i] if i % 2 else []) for i in range(12)]


def test_split_words_dropped_and_prompts_encode_to_the_trace_lengths(tmp_path):
    assert len(SPLIT) > 20
    tok = wordpiece(tmp_path / "tokenizer.json")
    trace_path = mooncake(tmp_path / "t.jsonl", ROWS)
    fitted = read_trace(trace_path, what="load.trace", trace_format="auto", seed=0, max_requests=0, block_tokens=8,
                        tokenizer=tok, tokenizer_what="load.trace_tokenizer")
    assert fitted.prompts == "tokenizer" and set(fitted.words) == set(VOCABULARY) - set(SPLIT)
    assert fitted.tokenizer["dropped"] == list(SPLIT) and fitted.tokenizer["words"] == len(VOCABULARY) - len(SPLIT)
    assert fitted.tokenizer["checked"] == {"lines": 12, "exact": 12, "max_off": 0}
    lengths = [tokens(tok, fitted.probe_for(i).prompt) for i in range(len(ROWS))]
    assert lengths == [i for _, i, _, _ in ROWS]
    # Without it, the built-in words: the same tokenizer counts the prompts longer (what the fit is for).
    plain = read_trace(trace_path, what="load.trace", trace_format="auto", seed=0, max_requests=0, block_tokens=8)
    assert plain.prompts == "words" and plain.tokenizer is None and "tokenizer" not in plain.to_json()
    assert all(tokens(tok, plain.probe_for(n).prompt) > length for n, (_, length, _, _) in enumerate(ROWS))
    # Shared hash ids still open prompts with the same words (the prefix the server may reuse).
    odd = [fitted.probe_for(i).prompt.split() for i in (1, 3)]
    assert odd[0][:16] == odd[1][:16] and odd[0][16:24] != odd[1][16:24]


def test_check_counts_lines_off_and_stops_at_its_budget(monkeypatch):
    monkeypatch.setattr("kevload.inputs.tokenwords.CHECK_TOKENS", 100)
    words = TokenizerWords(path="t", sha256="", words=(), dropped=(), encode=lambda text: len(text.split()))
    assert words.check([("a b c", 3), ("a b", 3), ("a b c d e", 3)]) == {"lines": 3, "exact": 1, "max_off": 2}
    assert words.check([("a b", 3), ("a b c d e", 3)]) == {"lines": 2, "exact": 0, "max_off": 2}
    # The budget: the first prompt is checked however long, the next only while the total stays within it.
    assert words.check([("a " * 150, 150), ("a", 1)]) == {"lines": 1, "exact": 1, "max_off": 0}
    assert words.check([("a " * 60, 60), ("a " * 50, 50), ("a", 1)]) == {"lines": 1, "exact": 1, "max_off": 0}
    assert words.check([("a " * 60, 60), ("a " * 40, 40), ("a", 1)]) == {"lines": 2, "exact": 2, "max_off": 0}


def test_run_json_names_the_tokenizer_and_workers_send_its_words(tmp_path, server):
    tok = wordpiece(tmp_path / "tokenizer.json")
    trace = mooncake(tmp_path / "t.jsonl", ROWS)
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2, workers=2,
                              trace=str(trace), trace_speedup=[4], trace_block_tokens=8,
                              trace_tokenizer="tokenizer.json")
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    records = [r for f in ("records-0.jsonl", "records-1.jsonl") for r in read_records(tmp_path / "run" / f)]
    companions = [r for r in records if r["role"] == "companion"]
    assert {r["worker"] for r in companions} == {0, 1} and len(companions) == len(ROWS)
    # What the server was sent: each trace prompt at its input length in the tokenizer, none with a split word.
    sent = [b["messages"][-1]["content"] for b in server.requests]
    traced = [p for p in sent if p.split()[0] in VOCABULARY]
    assert sorted(tokens(tok, p) for p in traced) == sorted(i for _, i, _, _ in ROWS)
    assert not {w for p in traced for w in p.split()} & set(SPLIT)
    (dataset,) = json.loads((tmp_path / "run" / "run.json").read_text())["datasets"]
    assert dataset["prompts"] == "tokenizer"
    assert dataset["tokenizer"]["path"].endswith("tokenizer.json") and len(dataset["tokenizer"]["sha256"]) == 64
    assert dataset["tokenizer"]["checked"] == {"lines": 12, "exact": 12, "max_off": 0}


@pytest.mark.parametrize("make, load, error", [
    (None, {}, "nothing.json: load.trace_tokenizer: cannot read"),
    (lambda p: p.write_text("{not json"), {}, "tok.json: load.trace_tokenizer: expected a Hugging Face tokenizer.json"),
    (lambda p: wordpiece(p, whole=False), {},
     "tok.json: load.trace_tokenizer: expected a tokenizer that makes common English words one token each (at least "
     "32 of kevload's 188), got 0"),
    (lambda p: wordpiece(p), {"trace": ""}, "load.trace_tokenizer: expected load.trace beside it"),
])
def test_bad_tokenizer_exits_2_naming_file_and_key(tmp_path, make, load, error):
    mooncake(tmp_path / "t.jsonl", ROWS)
    if make is not None:
        make(tmp_path / "tok.json")
    name = "tok.json" if make is not None else "nothing.json"
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1],
                              **{"trace": "t.jsonl", "trace_tokenizer": name, **load})
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and error in output and "Traceback" not in output, output


def test_resume_refuses_a_changed_tokenizer(tmp_path, server):
    wordpiece(tmp_path / "tokenizer.json")
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2,
                              trace=str(mooncake(tmp_path / "t.jsonl", ROWS)), trace_speedup=[4],
                              trace_tokenizer="tokenizer.json")
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    # The same trace, other words: the prompts a resumed part sent would not be the first part's.
    wordpiece(tmp_path / "tokenizer.json", split=SPLIT[:5])
    code, output = run_cli("run", "--resume", tmp_path / "run")
    assert code == 2 and "datasets: expected the inputs the run started with" in output, output
    assert "words of tokenizer sha256" in output and "Traceback" not in output


def test_the_words_travel_with_the_trace_not_the_tokenizer(tmp_path):
    """What a worker process or a Ray host gets is the pickled trace: it makes the driver's prompts without the
    tokenizer file and without the tokenizers package."""
    tok = wordpiece(tmp_path / "tokenizer.json")
    fitted = read_trace(mooncake(tmp_path / "t.jsonl", ROWS), what="load.trace", trace_format="auto", seed=0,
                        max_requests=0, block_tokens=8, tokenizer=tok, tokenizer_what="load.trace_tokenizer")
    (tmp_path / "trace.pickle").write_bytes(pickle.dumps(fitted))
    tok.unlink()
    elsewhere = ("import pickle, sys\n"
                 "sys.modules['tokenizers'] = None\n"  # any import of it fails
                 "trace = pickle.loads(open(sys.argv[1], 'rb').read())\n"
                 "print('\\n'.join(trace.probe_for(i).prompt for i in range(trace.count)))\n")
    done = subprocess.run([sys.executable, "-c", elsewhere, str(tmp_path / "trace.pickle")], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [fitted.probe_for(i).prompt for i in range(len(ROWS))]
    assert not {w for line in done.stdout.splitlines() for w in line.split()} & set(SPLIT)
