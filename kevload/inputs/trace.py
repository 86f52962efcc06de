"""Trace replay (``load.trace``): a recorded day of traffic sent again on its own clock, the probe
at fixed points.

A trace is a file of arrivals with input and output lengths, in one of the two shapes vLLM's bench
and AIPerf read: Mooncake JSONL (``{"timestamp": ms, "input_length": N, "output_length": M,
"hash_ids": [...]}``) or BurstGPT CSV (``Timestamp,Model,Request tokens,Response tokens,Total
tokens,Log Type``, seconds). It is read and every line checked with the scenario, hashed like a
dataset (run.json), and replayed by ``kevload.load.replay``: each arrival at its offset ÷ the
level's speed-up, as a companion with a synthetic prompt of its input length and its output length
as max_tokens, and ``load.samples`` probes spread evenly over the replay.

Prompts are made of words, not tokens (no tokenizer is needed, nothing is downloaded): one word of
``VOCABULARY`` is one token of the built-in targets' model after a space (workloads.md: Trace
replay, measured; 11 are two opening a prompt), and the chat template adds its own. Given the
model's tokenizer.json (``load.trace_tokenizer``), only the words it makes one token each are used
(``kevload.inputs.tokenwords``). A Mooncake ``hash_ids`` entry is a block of
``load.trace_block_tokens`` words whose text depends only on the hash id and the seed, so two
requests that share a hash id share that prefix, as the production requests did.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kevload.errors import ScenarioError
from kevload.inputs.datasets import Dataset
from kevload.inputs.fieldrules import shown
from kevload.inputs.probe import MAX_TOKENS, Probe, parse_jsonl
from kevload.inputs.tokenwords import words_for

MAX_TRACE_TOKENS = 1_000_000  # input tokens of one request: beyond any model's context
MAX_SPEEDUP = 1_000_000  # load.trace_speedup: a week of trace replayed in under a second
MAX_TRACE_SECONDS = 10 * 365 * 86_400  # load.trace_window_s: BurstGPT's own traces span 121 days
# The columns of BurstGPT's CSV that a replay reads (the others, Model, Total tokens and Log Type,
# are not needed).
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")

# Common English words, each one token after a space in SmolLM2's BPE vocabulary (11 are two opening
# a prompt), as checked with its tokenizer.json and by llama.cpp's prompt_tokens (docs/workloads.md:
# Trace replay); other BPE vocabularies hold most.
VOCABULARY = tuple(
    """
time year people way day man thing woman life child world school state family student group country
problem hand part place case week company system program question work government number night point
home water room mother area money story fact month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law car city community
name president team minute idea kid body information back parent face others level office door
health person art war history party result change morning reason research girl guy moment air
teacher force education food market music river garden window table paper letter picture road train
bird horse field summer winter spring autumn light color green blue red black white stone glass
bread milk apple orange tree flower grass sun moon star sky rain snow wind fire earth sea lake
island bridge tower castle village farm shop bank church hospital station street corner wall floor
chair bed kitchen box bag shirt coat hat shoe ring key clock phone camera computer screen card list
plan note message song film show dance sport ball
""".split()
)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One arrival of the trace: seconds after the trace's first, the tokens it sent and asked for,
    its blocks."""

    offset: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    line: int = 0


@dataclass(frozen=True)
class TraceDataset(Dataset):
    """The trace as run.json records it (a dataset of companions: its hash, lines, the requests
    replayed), and the requests themselves. ``format`` is the shape read (``mooncake`` or
    ``burstgpt``); ``prompts`` how the input lengths were made (``words``: one vocabulary word a
    token, see the module's docstring; ``tokenizer``: one of the words a model's tokenizer makes one
    token each, ``tokenizer`` then saying which file and what it found)."""

    format: str = "mooncake"
    block_tokens: int = 512
    prompts: str = "words"
    failed: int = 0  # BurstGPT's failed requests (0 response tokens): lines not replayed
    # the part of the trace replayed, in seconds after its first line
    window_s: tuple[float, float] | None = None
    tokenizer: dict[str, Any] | None = None
    requests: tuple[TraceRequest, ...] = field(default=(), repr=False, compare=False)
    # What the prompts are drawn from; travels with the trace to worker processes and Ray hosts (no
    # tokenizer there).
    words: tuple[str, ...] = field(default=VOCABULARY, repr=False, compare=False)

    @property
    def span(self) -> float:
        """Seconds from the first arrival to the last, at speed-up 1."""
        return self.requests[-1].offset

    def rate(self, speedup: float) -> float:
        """The replay's mean arrival rate at ``speedup``: the level's ``rate`` in records and
        cells."""
        return replay_rate(self.count, self.span, speedup)

    def to_json(self) -> dict[str, Any]:
        window = {"window_s": list(self.window_s)} if self.window_s is not None else {}
        tokenizer = {"tokenizer": self.tokenizer} if self.tokenizer is not None else {}
        return {
            **super().to_json(),
            "format": self.format,
            "block_tokens": self.block_tokens,
            "prompts": self.prompts,
            "span_s": self.span,
            "failed": self.failed,
            **window,
            **tokenizer,
        }

    def probe_for(self, index: int) -> Probe:
        """The companion sent for the ``index``-th request: a synthetic prompt of its length, its
        output length as max_tokens. Made when sent, not kept: a long trace's prompts would not fit
        in memory."""
        request = self.requests[index]
        return Probe(
            id=f"trace:{request.line}",
            prompt=prompt_text(request, self.seed, self.block_tokens, self.words),
            max_tokens=request.output_tokens,
        )


def replay_rate(requests: int, span: float, speedup: float) -> float:
    """Requests per second of a replay of ``requests`` over ``span`` trace seconds at ``speedup``,
    rounded as rate levels are: what labels a trace level (``r=…/s``) and keys its cells."""
    return round(requests * speedup / span, 6)


def trace_rates(datasets: list[dict[str, Any]], speedups: list[float]) -> list[float]:
    """The trace levels' rates from run.json (its datasets as ``to_json`` wrote them and
    load.trace_speedup)."""
    trace = next((d for d in datasets if "span_s" in d), None)
    return (
        [] if trace is None else [replay_rate(trace["count"], trace["span_s"], s) for s in speedups]
    )


def prompt_text(
    request: TraceRequest, seed: int, block_tokens: int, vocabulary: tuple[str, ...] = VOCABULARY
) -> str:
    """``request.input_tokens`` words: its hash ids' blocks in order (the same id, the same words),
    then words of its own (seeded by its line) where the blocks run out. The words are counted, so a
    cut block is a prefix."""
    words: list[str] = []
    for hash_id in request.hash_ids:
        if len(words) >= request.input_tokens:
            break
        words.extend(_words(f"{seed}:block:{hash_id}", block_tokens, vocabulary))
    if len(words) < request.input_tokens:
        words.extend(
            _words(f"{seed}:line:{request.line}", request.input_tokens - len(words), vocabulary)
        )
    return " ".join(words[: request.input_tokens])


def _words(key: str, count: int, vocabulary: tuple[str, ...]) -> list[str]:
    """``count`` words chosen by ``key``'s SHAKE-256 stream, two bytes a word: the same words on any
    machine and Python version (as ``datasets.sample``'s choice), in one hash call however long the
    prompt."""
    stream = hashlib.shake_256(key.encode()).digest(2 * count)
    return [
        vocabulary[int.from_bytes(stream[i : i + 2], "big") % len(vocabulary)]
        for i in range(0, 2 * count, 2)
    ]


def read_trace(
    path: Path,
    *,
    what: str,
    trace_format: str,
    seed: int,
    max_requests: int,
    block_tokens: int,
    window: tuple[float, float] | None = None,
    tokenizer: Path | None = None,
    tokenizer_what: str = "",
) -> TraceDataset:
    """Read and check every line of the trace at ``path`` (format ``auto``: by its first character,
    ``{`` for Mooncake JSONL), keep the requests inside ``window`` (seconds after the trace's first
    line, from included, to not), then the first ``max_requests`` of them (0: all). ``what`` names
    the scenario key in errors; ``tokenizer``: the model's tokenizer.json the prompts' words are
    fitted to, named ``tokenizer_what``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(f"{path}: {what}: cannot read: {exc.strerror}") from None
    if trace_format == "auto":
        trace_format = (
            "mooncake" if data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{") else "burstgpt"
        )
    rows = (
        _mooncake(data, path, what) if trace_format == "mooncake" else _burstgpt(data, path, what)
    )
    read = _replayed(rows, path, what, window)
    requests = read.requests[:max_requests] if max_requests else read.requests
    if len(requests) < 2 or requests[-1].offset <= 0:
        inside = f" in load.trace_window_s {list(window)}" if window is not None else ""
        raise ScenarioError(
            f"{path}: {what}: expected at least two requests at different times (a replay's rate "
            f"is its requests over its span), got {len(requests)} over "
            f"{requests[-1].offset if requests else 0:g} s{inside}"
        )
    trace = TraceDataset(
        role="companion",
        path=str(path),
        sha256=hashlib.sha256(data).hexdigest(),
        lines=read.lines,
        seed=seed,
        count=len(requests),
        format=trace_format,
        block_tokens=block_tokens,
        failed=read.failed,
        window_s=window,
        requests=requests,
    )
    return trace if tokenizer is None else _fitted(trace, tokenizer, tokenizer_what)


@dataclass(frozen=True)
class _Replayed:
    """What a trace's lines give a replay: the requests inside the window, offsets from the first of
    them; the lines read and the failed ones among them (run.json)."""

    requests: tuple[TraceRequest, ...]
    lines: int
    failed: int


def _replayed(
    rows: Iterator[TraceRequest], path: Path, what: str, window: tuple[float, float] | None
) -> _Replayed:
    """Every line checked in time order; the failed ones counted, not replayed; those inside
    ``window`` kept."""
    requests: list[TraceRequest] = []
    origin: float | None = None  # the trace's first line's time: what a window's seconds count from
    previous: TraceRequest | None = None
    start: float | None = None
    lines = failed = 0
    for row in rows:
        lines += 1
        if origin is None:
            origin = row.offset
        # A failed line too: the first line's time is the window's origin, whether it failed or not.
        if previous is not None and row.offset < previous.offset:
            raise ScenarioError(
                f"{path}:{row.line}: {what}: expected arrivals in time order, this one is earlier "
                f"than line {previous.line}'s"
            )
        previous = row
        if not row.output_tokens:  # a failed request (BurstGPT's): it has no length to ask for
            failed += 1
            continue
        # To the microsecond: timestamps are milliseconds or seconds, and their difference in floats
        # is not exact
        # (16.4 − 5.3 is 11.099999999999998: the request 11.1 s after the first line would miss
        # [11.1, …)).
        if window is None or window[0] <= round(row.offset - origin, 6) < window[1]:
            if start is None:  # offsets count from the first request replayed
                start = row.offset
            requests.append(
                TraceRequest(
                    row.offset - start, row.input_tokens, row.output_tokens, row.hash_ids, row.line
                )
            )
    return _Replayed(tuple(requests), lines, failed)


def _fitted(trace: TraceDataset, path: Path, what: str) -> TraceDataset:
    """``trace`` with its prompts drawn from the words the tokenizer at ``path`` makes one token
    each, and run.json's account of it: the file, the words kept and dropped, and how the first
    prompts encode."""
    fitted = words_for(path, VOCABULARY, what=what)
    trace = replace(trace, prompts="tokenizer", words=fitted.words)
    # Lazily, in replay order: the check stops at its token budget, long before a long trace's end.
    prompts = (
        (trace.probe_for(i).prompt or "", r.input_tokens) for i, r in enumerate(trace.requests)
    )
    return replace(trace, tokenizer={**fitted.to_json(), "checked": fitted.check(prompts)})


def _mooncake(data: bytes, path: Path, what: str) -> Iterator[TraceRequest]:
    for number, doc in parse_jsonl(data.splitlines(), path, what):
        where = f"{path}:{number}: {what}"
        if not isinstance(doc, dict):
            raise ScenarioError(
                f"{where}: expected an object with timestamp, input_length and output_length"
            )
        timestamp = _number(
            doc.get("timestamp"), f"{where}: timestamp", "milliseconds >= 0 (Mooncake's)"
        )
        hash_ids = doc.get("hash_ids", [])
        if not isinstance(hash_ids, list) or not all(_whole(h) for h in hash_ids):
            raise ScenarioError(
                f"{where}: hash_ids: expected a list of integers, got {shown(hash_ids)}"
            )
        yield TraceRequest(
            timestamp / 1000,
            _tokens(doc.get("input_length"), f"{where}: input_length", MAX_TRACE_TOKENS),
            _tokens(doc.get("output_length"), f"{where}: output_length", MAX_TOKENS),
            tuple(hash_ids),
            number,
        )


def _burstgpt(data: bytes, path: Path, what: str) -> Iterator[TraceRequest]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ScenarioError(
            f"{path}: {what}: expected a UTF-8 CSV file (BurstGPT) or JSON lines (Mooncake)"
        ) from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, [])
    columns = {name.strip(): i for i, name in enumerate(header)}
    missing = [name for name in BURSTGPT_COLUMNS if name not in columns]
    if missing:
        raise ScenarioError(
            f"{path}:1: {what}: expected a BurstGPT header with {', '.join(BURSTGPT_COLUMNS)} "
            f"(or Mooncake JSON lines), missing {', '.join(missing)}"
        )
    at, asked, answered = (columns[name] for name in BURSTGPT_COLUMNS)
    for row in reader:
        number = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        where = f"{path}:{number}: {what}"
        if len(row) < len(header):
            raise ScenarioError(
                f"{where}: expected {len(header)} columns as in the header, got {len(row)}"
            )
        at_s = _number(_csv_number(row[at]), f"{where}: Timestamp", "seconds >= 0 (BurstGPT's)")
        if _csv_number(row[answered]) == 0:
            # BurstGPT's files with failures (BurstGPT_1.csv, _2.csv) give a failed request 0
            # response tokens.
            yield TraceRequest(at_s, 0, 0, (), number)
            continue
        yield TraceRequest(
            at_s,
            _tokens(_csv_number(row[asked]), f"{where}: Request tokens", MAX_TRACE_TOKENS),
            _tokens(_csv_number(row[answered]), f"{where}: Response tokens", MAX_TOKENS),
            (),
            number,
        )


def _csv_number(cell: str) -> Any:
    """A CSV cell as the number it spells (an integer when it is one), or the text itself for the
    error."""
    for kind in (int, float):
        try:
            return kind(cell.strip())
        except ValueError:
            pass
    return cell


def _number(value: Any, where: str, expected: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value < float("inf")
    ):
        raise ScenarioError(f"{where}: expected {expected}, got {shown(value)}")
    return float(value)


def _tokens(value: Any, where: str, most: int) -> int:
    if not _whole(value) or not 1 <= value <= most:
        raise ScenarioError(
            f"{where}: expected an integer from 1 to {most:,} (tokens), got {shown(value)}"
        )
    return int(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def trace_of(datasets: tuple[Dataset, ...]) -> TraceDataset | None:
    """The scenario's trace among its datasets, if it replays one."""
    return next((d for d in datasets if isinstance(d, TraceDataset)), None)
