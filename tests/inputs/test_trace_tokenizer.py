"""load.trace_tokenizer: a replay's prompts fitted to the model's own tokenizer.json. The words it
splits are dropped, the prompts then encode to the trace's input lengths exactly (and run.json says
what the check found), worker processes send the same words, and a bad tokenizer is refused (exit 2,
file and key)."""

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
from tests.inputs.test_trace import mooncake, read_jsonl, traced_run

# Long words a crafted vocabulary splits in two: about one word in five of a prompt.
SPLIT = tuple(w for w in VOCABULARY if len(w) >= 7)


def wordpiece(path: Path, split: tuple[str, ...] = SPLIT, *, whole: bool = True) -> Path:
    """A tokenizer.json that makes every vocabulary word one token except ``split`` (two pieces
    each); with ``whole`` false, every word is spelled letter by letter."""
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
    fitted = read_trace(
        trace_path,
        what="load.trace",
        trace_format="auto",
        seed=0,
        max_requests=0,
        block_tokens=8,
        tokenizer=tok,
        tokenizer_what="load.trace_tokenizer",
    )
    assert fitted.prompts == "tokenizer" and set(fitted.words) == set(VOCABULARY) - set(SPLIT)
    assert fitted.tokenizer["dropped"] == list(SPLIT) and fitted.tokenizer["words"] == len(
        VOCABULARY
    ) - len(SPLIT)
    assert fitted.tokenizer["checked"] == {"lines": 12, "exact": 12, "max_off": 0}
    lengths = [tokens(tok, fitted.probe_for(i).prompt) for i in range(len(ROWS))]
    assert lengths == [i for _, i, _, _ in ROWS]
    # Without it, the built-in words: the same tokenizer counts the prompts longer (what the fit is
    # for).
    plain = read_trace(
        trace_path, what="load.trace", trace_format="auto", seed=0, max_requests=0, block_tokens=8
    )
    assert (
        plain.prompts == "words" and plain.tokenizer is None and "tokenizer" not in plain.to_json()
    )
    assert all(
        tokens(tok, plain.probe_for(n).prompt) > length for n, (_, length, _, _) in enumerate(ROWS)
    )
    # Shared hash ids still open prompts with the same words (the prefix the server may reuse).
    odd = [fitted.probe_for(i).prompt.split() for i in (1, 3)]
    assert odd[0][:16] == odd[1][:16] and odd[0][16:24] != odd[1][16:24]


def test_check_counts_lines_off_and_stops_at_its_budget(monkeypatch):
    monkeypatch.setattr("kevload.inputs.tokenwords.CHECK_TOKENS", 100)
    words = TokenizerWords(
        path="t", sha256="", words=(), dropped=(), encode=lambda text: len(text.split())
    )
    assert words.check([("a b c", 3), ("a b", 3), ("a b c d e", 3)]) == {
        "lines": 3,
        "exact": 1,
        "max_off": 2,
    }
    assert words.check([("a b", 3), ("a b c d e", 3)]) == {"lines": 2, "exact": 0, "max_off": 2}
    # The budget: the first prompt is checked however long, the next only while the total stays
    # within it.
    assert words.check([("a " * 150, 150), ("a", 1)]) == {"lines": 1, "exact": 1, "max_off": 0}
    assert words.check([("a " * 60, 60), ("a " * 50, 50), ("a", 1)]) == {
        "lines": 1,
        "exact": 1,
        "max_off": 0,
    }
    assert words.check([("a " * 60, 60), ("a " * 40, 40), ("a", 1)]) == {
        "lines": 2,
        "exact": 2,
        "max_off": 0,
    }


def test_run_json_names_the_tokenizer_and_workers_send_its_words(tmp_path, server):
    tok = wordpiece(tmp_path / "tokenizer.json")
    trace = mooncake(tmp_path / "t.jsonl", ROWS)
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=2,
        workers=2,
        trace=str(trace),
        trace_speedup=[4],
        trace_block_tokens=8,
        trace_tokenizer="tokenizer.json",
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    records = [
        r
        for f in ("records-0.jsonl", "records-1.jsonl")
        for r in read_records(tmp_path / "run" / f)
    ]
    companions = [r for r in records if r["role"] == "companion"]
    assert {r["worker"] for r in companions} == {0, 1} and len(companions) == len(ROWS)
    # What the server was sent: each trace prompt at its input length in the tokenizer, none with a
    # split word.
    sent = [b["messages"][-1]["content"] for b in server.requests]
    traced = [p for p in sent if p.split()[0] in VOCABULARY]
    assert sorted(tokens(tok, p) for p in traced) == sorted(i for _, i, _, _ in ROWS)
    assert not {w for p in traced for w in p.split()} & set(SPLIT)
    (dataset,) = json.loads((tmp_path / "run" / "run.json").read_text())["datasets"]
    assert dataset["prompts"] == "tokenizer"
    assert (
        dataset["tokenizer"]["path"].endswith("tokenizer.json")
        and len(dataset["tokenizer"]["sha256"]) == 64
    )
    assert dataset["tokenizer"]["checked"] == {"lines": 12, "exact": 12, "max_off": 0}


@pytest.mark.parametrize(
    "make, load, error",
    [
        (None, {}, "nothing.json: load.trace_tokenizer: cannot read"),
        (
            lambda p: p.write_text("{not json"),
            {},
            "tok.json: load.trace_tokenizer: expected a Hugging Face tokenizer.json",
        ),
        (
            lambda p: wordpiece(p, whole=False),
            {},
            "tok.json: load.trace_tokenizer: expected a tokenizer that makes common English words "
            "one token each (at least "
            "32 of kevload's 188), got 0",
        ),
        (
            lambda p: wordpiece(p),
            {"trace": ""},
            "load.trace_tokenizer: expected load.trace beside it",
        ),
    ],
)
def test_bad_tokenizer_exits_2_naming_file_and_key(tmp_path, make, load, error):
    mooncake(tmp_path / "t.jsonl", ROWS)
    if make is not None:
        make(tmp_path / "tok.json")
    name = "tok.json" if make is not None else "nothing.json"
    scenario = write_scenario(
        tmp_path / "s.toml",
        "http://127.0.0.1:9/v1",
        concurrency=[1],
        **{"trace": "t.jsonl", "trace_tokenizer": name, **load},
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and error in output and "Traceback" not in output, output


def test_resume_refuses_a_changed_tokenizer(tmp_path, server):
    wordpiece(tmp_path / "tokenizer.json")
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=2,
        trace=str(mooncake(tmp_path / "t.jsonl", ROWS)),
        trace_speedup=[4],
        trace_tokenizer="tokenizer.json",
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    # The same trace, other words: the prompts a resumed part sent would not be the first part's.
    wordpiece(tmp_path / "tokenizer.json", split=SPLIT[:5])
    code, output = run_cli("run", "--resume", tmp_path / "run")
    assert code == 2 and "datasets: expected the inputs the run started with" in output, output
    assert "words of tokenizer sha256" in output and "Traceback" not in output


def test_the_words_travel_with_the_trace_not_the_tokenizer(tmp_path):
    """What a worker process or a Ray host gets is the pickled trace: it makes the driver's prompts
    without the tokenizer file and without the tokenizers package."""
    tok = wordpiece(tmp_path / "tokenizer.json")
    fitted = read_trace(
        mooncake(tmp_path / "t.jsonl", ROWS),
        what="load.trace",
        trace_format="auto",
        seed=0,
        max_requests=0,
        block_tokens=8,
        tokenizer=tok,
        tokenizer_what="load.trace_tokenizer",
    )
    (tmp_path / "trace.pickle").write_bytes(pickle.dumps(fitted))
    tok.unlink()
    elsewhere = (
        "import pickle, sys\n"
        "sys.modules['tokenizers'] = None\n"  # any import of it fails
        "trace = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "print('\\n'.join(trace.probe_for(i).prompt for i in range(trace.count)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", elsewhere, str(tmp_path / "trace.pickle")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [fitted.probe_for(i).prompt for i in range(len(ROWS))]
    assert not {w for line in done.stdout.splitlines() for w in line.split()} & set(SPLIT)


def fitted(tmp_path: Path, tokenizer: Path):
    """``ROWS`` as a Mooncake trace, read with its prompts fitted to ``tokenizer``."""
    return read_trace(
        mooncake(tmp_path / "t.jsonl", ROWS),
        what="load.trace",
        trace_format="auto",
        seed=0,
        max_requests=0,
        block_tokens=8,
        tokenizer=tokenizer,
        tokenizer_what="load.trace_tokenizer",
    )


def word_level(path: Path, vocab: dict[str, int]) -> Path:
    """A tokenizer.json of whole words, ``[UNK]`` for the others (an error where ``vocab`` lacks
    it)."""
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path


def run_with(tmp_path: Path, tokenizer: str) -> tuple[int, str]:
    """``kevload run`` of a trace with ``load.trace_tokenizer = tokenizer`` (a file in
    ``tmp_path``)."""
    mooncake(tmp_path / "t.jsonl", ROWS)
    scenario = write_scenario(
        tmp_path / "s.toml",
        "http://127.0.0.1:9/v1",
        concurrency=[1],
        trace="t.jsonl",
        trace_tokenizer=tokenizer,
    )
    return run_cli("run", scenario, "--out", tmp_path / "run")


def test_a_tokenizer_whose_encode_raises_exits_2(tmp_path):
    """A WordLevel tokenizer without its unknown token raises on any word it lacks: kevload ended in
    a traceback (exit 1), not the refusal naming the file and the key."""
    word_level(tmp_path / "tok.json", {w: i for i, w in enumerate(VOCABULARY[:100])})
    code, output = run_with(tmp_path, "tok.json")
    assert (
        code == 2
        and "tok.json: load.trace_tokenizer: expected a Hugging Face tokenizer.json" in output
    ), output
    assert "Missing [UNK] token" in output


def test_the_files_truncation_and_padding_are_not_the_servers(tmp_path):
    """A tokenizer.json saved with truncation (max_length 40) made `checked` say 10 of the 12
    prompts were off by up to -67 tokens, all of which encode at their lengths exactly; one saved
    with fixed padding had every word refused as not one token. A server counts a prompt whole and
    unpadded."""
    whole = wordpiece(tmp_path / "whole.json")
    truncating = wordpiece(tmp_path / "trunc.json")
    doc = json.loads(truncating.read_text())
    doc["truncation"] = {
        "direction": "Right",
        "max_length": 40,
        "strategy": "LongestFirst",
        "stride": 0,
    }
    truncating.write_text(json.dumps(doc))
    trace = fitted(tmp_path, truncating)
    assert [tokens(whole, trace.probe_for(i).prompt) for i in range(len(ROWS))] == [
        i for _, i, _, _ in ROWS
    ]
    assert trace.tokenizer["checked"] == {"lines": 12, "exact": 12, "max_off": 0}

    padding = Tokenizer.from_file(str(wordpiece(tmp_path / "pad.json")))
    padding.enable_padding(length=16, pad_id=0, pad_token="[UNK]")
    padding.save(str(tmp_path / "pad.json"))
    trace = fitted(tmp_path, tmp_path / "pad.json")
    assert trace.tokenizer["dropped"] == list(SPLIT) and trace.tokenizer["checked"]["exact"] == 12


def test_a_file_too_large_for_a_tokenizer_is_refused_unread(tmp_path):
    """A model's weights named by mistake (a .gguf, GBs) were read whole into memory: a
    MemoryError's traceback where memory is bounded, the host's memory otherwise. A sparse file:
    nothing of it is on disk."""
    with (tmp_path / "model.gguf").open("wb") as handle:
        handle.truncate(4 << 30)
    code, output = run_with(tmp_path, "model.gguf")
    assert (
        code == 2
        and "model.gguf: load.trace_tokenizer: expected a Hugging Face tokenizer.json" in output
    ), output
    assert "4,096 MiB" in output


def test_words_the_tokenizer_does_not_know_are_not_kept(tmp_path):
    """A tokenizer that knows none of the words makes each its one unknown token: kevload kept all
    188 (`words` 188, nothing dropped) of a file that is no tokenizer for English text, and every
    prompt it sent was the same tokens, so a server's prefix cache reused what the trace never
    shared."""
    word_level(tmp_path / "tok.json", {"[UNK]": 0})
    code, output = run_with(tmp_path, "tok.json")
    assert code == 2 and "at least 32 of kevload's 188), got 0" in output, output
    # Half the words unknown: those are dropped, the known ones kept.
    known = VOCABULARY[::2]
    half = word_level(
        tmp_path / "half.json", {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(known)}}
    )
    trace = fitted(tmp_path, half)
    assert trace.words == known and trace.tokenizer["dropped"] == list(VOCABULARY[1::2])


def test_a_trace_cells_case_reruns_with_the_runs_tokenizer(tmp_path, server):
    """`cases build` of a tokenizer-fitted trace level kept the trace but not load.trace_tokenizer:
    `cases rerun` replayed the built-in words, prompts the run never sent (a split word's line one
    token longer)."""
    wordpiece(tmp_path / "tokenizer.json")
    traced_run(tmp_path, server.url, samples=2, trace_speedup=[2], trace_tokenizer="tokenizer.json")
    cases_path = tmp_path / "cases.jsonl"
    assert run_cli("cases", "build", tmp_path / "run", "-o", cases_path)[0] == 0
    case = next(c for c in read_jsonl(cases_path) if c["params"]["concurrency"] == 0)
    assert Path(case["load"]["trace_tokenizer"]) == (tmp_path / "tokenizer.json").resolve()
    # A trace level without a tokenizer: its case is the one it was before the key existed.
    plain = tmp_path / "plain"
    plain.mkdir()
    traced_run(plain, server.url, samples=2, trace_speedup=[2])
    assert run_cli("cases", "build", plain / "run", "-o", plain / "cases.jsonl")[0] == 0
    assert all("trace_tokenizer" not in c["load"] for c in read_jsonl(plain / "cases.jsonl"))

    server.requests.clear()
    code, output = run_cli(
        "cases",
        "rerun",
        cases_path,
        "--url",
        server.url,
        "--model",
        "fake",
        "--times",
        "2",
        "-o",
        tmp_path / "after.jsonl",
        "--out",
        tmp_path / "reruns",
    )
    assert code in (0, 1), output
    sent = [b["messages"][-1]["content"] for b in server.requests]
    traced = [p for p in sent if p.split()[0] in VOCABULARY]
    assert traced and not {w for p in traced for w in p.split()} & set(SPLIT)


def test_resume_refuses_other_words_from_the_same_tokenizer_file(tmp_path, server):
    """--resume compared the tokenizer file's hash alone: a first part whose kevload (or tokenizers)
    kept other words from the same file (run.json's dropped) was resumed with prompts it never
    sent."""
    wordpiece(tmp_path / "tokenizer.json")
    run = traced_run(
        tmp_path, server.url, samples=2, trace_speedup=[4], trace_tokenizer="tokenizer.json"
    )
    meta = json.loads((run / "run.json").read_text())
    meta["datasets"][0]["tokenizer"]["dropped"] = list(
        SPLIT[:5]
    )  # as a kevload that split fewer words wrote it
    (run / "run.json").write_text(json.dumps(meta))
    code, output = run_cli("run", "--resume", run)
    assert code == 2 and "datasets: expected the inputs the run started with" in output, output
    assert (
        "(5 dropped)" in output
        and f"({len(SPLIT)} dropped)" in output
        and "Traceback" not in output
    )
