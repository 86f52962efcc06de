"""Records and the files of a run: ``Record`` (one flushed line per request, read back typed by
``read_typed``), the tolerant reader, JSON written atomically, run-dir names, secrets redacted
(``rundir.RunDir`` reads a run)."""

from __future__ import annotations

import base64
import math
import os
import secrets as _secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict
from urllib.parse import unquote, urlsplit, urlunsplit

import msgspec
import orjson

from kevload.errors import RunDirError
from kevload.inputs.conversation import ends_sample
from kevload.inputs.gradeanswers import REASONING_TAG, with_reasoning
from kevload.inputs.wordsets import OK, Role

RECORDS = "records.jsonl"
RUN = "run.json"
SUMMARY = "summary.json"
RESULTS = Path("results")


# The ranges a record's values keep, checked where a records file is read (``RECORD_DECODER``): what
# is out of them is no record kevload wrote, and no number the comparator may add.
Count = Annotated[int, msgspec.Meta(ge=0)]
# A clock reading (``time.perf_counter``, or Unix time in a run with workers): within ±10¹² s
# (31,000 years), so that any difference of two is a finite number of seconds; a larger one is no
# clock kevload read.
Time = Annotated[float, msgspec.Meta(ge=-1e12, le=1e12)]
# A token count a server reported (usage): at most 2³¹ − 1, far beyond any context window; a larger
# one is impossible, and used as a number it would give tokens/s that are nonsense.
TOKEN_COUNT_MAX = 2**31 - 1
TokenCount = Annotated[int, msgspec.Meta(ge=0, le=TOKEN_COUNT_MAX)]
# How a logprob a JSON number cannot hold is spelled on disk (``spell_logprobs``).
Spelled = Literal["-Infinity", "Infinity", "NaN"]


class ToolCall(TypedDict):
    """A tool call of an answer, as hashed into it (``answer_text``)."""

    name: str
    arguments: str


class Message(TypedDict):
    """A message of a conversation turn's history, as sent."""

    role: str
    content: str


class Record(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One finished request, as written to ``records.jsonl``. Times are ``time.perf_counter``
    seconds.

    A msgspec struct: built once per request, written straight to its line (``record_line``) and
    read back typed, with the ranges above, by ``RECORD_DECODER``. Keyword-only, so fields added
    later keep their place in the line with a default (what a record of an older version, which
    lacks them, meant); a key this version does not know is ignored. Not tracked by the garbage
    collector: a record holds plain values and never a cycle."""

    run_id: str
    seq: Count
    probe: str
    role: Role
    mode: str
    concurrency: Count  # 0 at an open-loop level
    rate: Annotated[float, msgspec.Meta(gt=0)] | None
    sample: Annotated[int, msgspec.Meta(ge=-1)]  # from 0; -1: a warm-up of an open-loop level
    in_flight: Count  # other requests in flight when this one was sent
    # Sent at full load (closed loop: exactly concurrency - 1 others in flight); only these are
    # compared. Records from before it were all counted.
    counted: bool = True
    # Cap on requests in flight: c (closed loop), load.max_in_flight or None (open loop).
    max_in_flight: Count | None = None
    # ``ok``, a transport failure (``timeout``, ``connect``, ``reset``, …) or ``http_<code>``
    status: str
    output: str | None
    sha256: str | None
    finish_reason: str | None
    prompt_tokens: TokenCount | None
    completion_tokens: TokenCount | None
    token_ids: list[Count] | None
    tokens: list[str] | None
    # Non-finite ones are floats in memory and spelled on disk (``spell_logprobs``); read back, the
    # comparator takes them spelled, ``RunDir.records`` as floats again.
    logprobs: list[float | Spelled | None] | None
    system_fingerprint: str | None
    t_scheduled: Time | None
    t_send: Time
    t_first_byte: Time | None
    t_first_token: Time | None
    t_last_byte: Time
    chunks: Count
    max_gap: Annotated[float, msgspec.Meta(ge=0)] | None
    error: str | None
    retries: Count
    params: dict[str, Any]
    # Defaulted, so records written before these fields existed still read.
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None
    reconnects: Count = 0
    # sent as X-Request-Id (``<run_id>[-r<resume>]-<seq>``): joins it with server logs
    request_id: str | None = None
    # which worker process sent it (runs with load.workers > 1; None: one process)
    worker: Count | None = None
    # Logprobs that are -inf, inf or NaN; ``logprobs`` then spells them as JSON cannot
    # (``spell_logprobs``).
    logprob_nonfinite: Count = 0
    # A turn of a conversation sample (``kevload.inputs.conversation``); None on every request that
    # is no turn of one.
    turn: Count | None = None  # its index, from 0
    turns: Annotated[int, msgspec.Meta(ge=1)] | None = None  # the conversation's turns
    # the request_id of the sample's first turn: what ties its turns together
    conversation: str | None = None
    # the messages sent: every earlier turn as answered, then this one
    history: list[Message] | None = None
    history_sha256: str | None = None  # of ``history``: turns with one hash were asked the same
    # every answer and finish_reason through this turn, chained
    conversation_sha256: str | None = None
    # load.prefix_cache = "cold_warm" (kevload.load.prefixcache): whether kevload made this probe
    # sample cold or warm, and how many prompt tokens the server said it served from its cache
    # (None: it did not say).
    cache: str | None = None
    cached_tokens: TokenCount | None = None
    # A companion load.cancel_share chose to cut (kevload.load.cancel): ``cancelled`` if the cut
    # came before its answer.
    cancel_planned: bool = False
    # What the server sent that did not fit its field (``"<field>: <what was wrong and what
    # came>"``): kept here, never used as a number. None: everything fitted.
    findings: list[str] | None = None

    def __post_init__(self) -> None:
        # A conversation's turn is read by what only turns record (its index, its conversation, the
        # messages sent):
        # one that lacks them is no record a run writes, and is refused where it is read
        # (``read_typed``).
        if self.turns is not None and (
            self.turn is None
            or self.turn >= self.turns
            or self.conversation is None
            or self.history is None
        ):
            raise ValueError(
                f"a turn of a conversation of {self.turns} turns needs turn "
                f"(0 to {self.turns - 1}), "
                f"conversation and history; got turn {self.turn}, conversation "
                f"{self.conversation!r}, "
                f"history {'null' if self.history is None else 'given'}"
            )

    def floats(self) -> Record:
        """This record with spelled non-finite logprobs as floats again (as it was before it was
        written)."""
        if not self.logprob_nonfinite or not self.logprobs:
            return self
        return msgspec.structs.replace(
            self, logprobs=[float(x) if isinstance(x, str) else x for x in self.logprobs]
        )

    @property
    def answer(self) -> str:
        """The compared text (``answer_text``)."""
        return answer_text(self.output, self.reasoning, self.tool_calls)

    @property
    def is_sample(self) -> bool:
        """Whether a cell counts it as a sample (``counts_in_cell``): a conversation's by the record
        that ends it, its earlier turns are none."""
        return counts_in_cell(self.role, self.counted) and ends_sample(
            self.turn, self.turns, self.status
        )

    @property
    def is_evidence(self) -> bool:
        """A counted ok probe answer: what a cell's determinism claim rests on (a probe that is a
        sample, ok)."""
        return self.role == "probe" and self.status == OK and self.is_sample


def counts_in_cell(role: str, counted: bool) -> bool:
    """The one rule of what a cell counts, probe or companion, ok or failed: a request sent at full
    load that is no warm-up. Warm-ups and sends below full load (a level's ramp-up, its tail) are on
    record, and only that."""
    return counted and role != "warmup"


# One of each for every record of a process: msgspec builds its plan for a type once, on the first
# use.
RECORD_DECODER = msgspec.json.Decoder(Record)
_ENCODER = msgspec.json.Encoder()


def answer_text(
    output: str | None, reasoning: str | None = None, tool_calls: list[ToolCall] | None = None
) -> str:
    """The one text that is compared (hashed into ``sha256``, shown at divergence points): the whole
    answer.

    Exactly the content when there is no reasoning and no tool call, so plain answers hash as they
    always did (short of a content that begins like a reasoning block itself). Otherwise the
    reasoning comes first in ``<reasoning>`` tags, then the content, then each tool call as
    ``<tool_call name="…">arguments</tool_call>``: a divergence inside the content keeps its
    position after the reasoning block. The block is ``gradeanswers.with_reasoning``'s, which the
    graders read back: the reasoning and the rest are always told apart, even where a model writes
    these tag lines itself (the reasoning's length is then in the opening tag).
    """
    if not reasoning and not tool_calls and not (output and output.startswith(REASONING_TAG)):
        return output or ""
    rest = [output or ""]
    for call in tool_calls or ():
        rest.append(f'\n<tool_call name="{call["name"]}">\n{call["arguments"]}\n</tool_call>')
    return with_reasoning(reasoning, "".join(rest))


def spell_logprobs(values: list[float | Spelled | None]) -> list[float | Spelled | None]:
    """Logprobs as a record keeps them: a non-finite one as the string ``"-Infinity"``,
    ``"Infinity"`` or ``"NaN"`` (JSON has no such numbers, and orjson would write null, a missing
    logprob), every other value as it is. ``float()`` of the string gives the value back; the
    comparator keeps NaN apart from null."""
    return [
        x if x is None or isinstance(x, str) or math.isfinite(x) else _spelling(x) for x in values
    ]


def request_part(request_id: str | None, run_id: str) -> int:
    """Which invocation of a run sent a request: 0 for ``<run_id>-<seq>``, k for the k-th
    ``--resume``'s ``<run_id>-r<k>-<seq>``."""
    rest = (request_id or "")[len(run_id) + 1 :]
    return int(rest[1 : rest.index("-")]) if rest.startswith("r") else 0


def new_run_id(kind: str = "") -> str:
    """``<time>-<random>`` (``<kind>-<time>-<random>``): unique even for two runs started in the
    same second."""
    name = time.strftime("%Y%m%d-%H%M%S") + "-" + _secrets.token_hex(3)
    return f"{kind}-{name}" if kind else name


def now_iso() -> str:
    """Local time as run.json and case files stamp it: ``2026-12-04T18:30:00+0000``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def default_run_dir(kind: str = "", *, run_id: str | None = None) -> Path:
    """Where a run (``results/<run-id>``) or a command's set of runs
    (``results/<kind>-<time>-<random>``) goes."""
    return RESULTS / (run_id or new_run_id(kind))


def record_line(record: Record) -> bytes:
    """One line of a records file, newline included; non-finite logprobs spelled
    (``spell_logprobs``), since msgspec, as JSON must, would write them as null, a missing
    logprob."""
    if record.logprob_nonfinite and record.logprobs:
        record = msgspec.structs.replace(record, logprobs=spell_logprobs(record.logprobs))
    return _ENCODER.encode(record) + b"\n"


class RecordWriter:
    """Appends one JSON line per record with a single unbuffered write, so a killed process leaves
    every finished record on disk and at most one torn line at the end. A batch of lines already
    made (a Ray actor's, collected by the driver) goes the same way, one write for the batch."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.count = 0

    def write(self, record: Record) -> None:
        self.write_lines(record_line(record))

    def write_lines(self, lines: bytes) -> None:
        """Whole lines of ``record_line``; nothing to do for none."""
        if lines:
            os.write(self._fd, lines)
            self.count += lines.count(b"\n")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: Path, start: int = 0, end: int | None = None) -> Iterator[dict[str, Any]]:
    """Stream a JSON-lines file back as its objects, unchecked (a records file and
    ``server-metrics.jsonl`` are read typed, by ``read_typed``): every line, or those that begin in
    bytes [``start``, ``end``). A line that is not JSON is an error, except the file's last line
    (what a process killed mid-write leaves torn), which is skipped."""
    return _lines(path, start, end, orjson.loads, orjson.JSONDecodeError)


def read_typed(
    path: Path,
    start: int = 0,
    end: int | None = None,
    *,
    decoder: msgspec.json.Decoder[Any] = RECORD_DECODER,
) -> Iterator[Any]:
    """Stream a records file back as ``Record`` values, spelled logprobs kept spelled
    (``Record.floats``): every line, or those that begin in bytes [``start``, ``end``) (a part
    read in parallel; ``start`` at a line's beginning). A line that is no record (a value of the
    wrong type or out of its range, a field every version writes missing) is a ``RunDirError``
    naming the line and the field; a line that is not JSON too, except the file's last line (what
    a run killed mid-write leaves torn), which is skipped; a part that ends before the file does
    has no last line to excuse. Another JSON-lines file of a run is read typed the same way by
    its own ``decoder``."""
    return _lines(path, start, end, decoder.decode, msgspec.DecodeError)


def _lines(
    path: Path,
    start: int,
    end: int | None,
    decode: Callable[[bytes], Any],
    not_json: type[Exception],
) -> Iterator[Any]:
    with path.open("rb") as handle:
        handle.seek(start)
        position, torn = start, None
        for number, line in enumerate(handle, 1):
            if torn is not None:
                raise RunDirError(f"{torn}: not a JSON record")
            try:
                yield decode(line)
            except (
                msgspec.ValidationError
            ) as exc:  # JSON, but no record (a DecodeError too: caught first)
                where = f"{path}:{number}" if start == 0 else f"{path}: the line at byte {position}"
                raise RunDirError(f"{where}: not a kevload record: {exc}") from None
            except not_json:
                torn = f"{path}:{number}" if start == 0 else f"{path}: byte {position}"
            position += len(line)
            if end is not None and position >= end:
                break
        if torn is not None and handle.read(1):
            raise RunDirError(f"{torn}: not a JSON record")


def cut_torn_tail(path: Path) -> int:
    """Cut a torn last line (a run killed mid-write) so appending starts on a line of its own;
    returns bytes cut."""
    with path.open("r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        # A record line is far smaller than the whole file; read back from the end until a newline
        # shows up.
        keep, step = 0, 1 << 16
        while True:
            start = max(size - step, 0)
            handle.seek(start)
            chunk = handle.read(size - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            if start == 0:
                break
            step *= 2
        if keep < size:
            handle.truncate(keep)
        return size - keep


def write_json(path: Path, doc: Any) -> None:
    """Write atomically: a reader sees the old file or the new one, never half of it."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(json_bytes(doc, indent=True, sort=True) + b"\n")
    os.replace(tmp, path)


def json_bytes(doc: Any, *, indent: bool = False, sort: bool = False) -> bytes:
    """``doc`` as JSON (``indent``: two spaces a level; ``sort``: keys sorted). Integers of any
    size are written as the integers they are, as a number grader's ``expected`` may be one
    (123456789012345678901234567890): orjson writes only 64 bits, so such a document is written by
    msgspec."""
    option = (orjson.OPT_INDENT_2 if indent else 0) | (orjson.OPT_SORT_KEYS if sort else 0)
    try:
        return orjson.dumps(doc, option=option)
    except TypeError:
        # msgspec raises what orjson did where the cause is no integer's size.
        written = (_SORTED if sort else _IN_ORDER).encode(doc)
        return msgspec.json.format(written, indent=2) if indent else written


_SORTED, _IN_ORDER = msgspec.json.Encoder(order="sorted"), msgspec.json.Encoder()


def read_json(path: Path) -> Any:
    """A JSON file read back exactly: an integer of any size as that integer (orjson would read one
    beyond 64 bits as the float nearest it)."""
    try:
        return msgspec.json.decode(path.read_bytes())
    except FileNotFoundError:
        raise RunDirError(f"{path}: not found") from None
    except (msgspec.DecodeError, RecursionError) as exc:  # msgspec's depth limit: RecursionError
        raise RunDirError(f"{path}: not valid JSON: {exc}") from None


def url_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without its ``user:password@``, and the Basic credential it stands for (None without
    one)."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url, None
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    return urlunsplit(parts._replace(netloc=host)), token


def url_secrets(url: str) -> list[str]:
    """A ``user:password@`` in ``url`` in every form it might be written in: scrubbed like the API
    key."""
    userinfo, at, _ = urlsplit(url).netloc.rpartition("@")
    if not at:
        return []
    password = userinfo.partition(":")[2]
    return [s for s in (userinfo, password, unquote(password), url_userinfo(url)[1]) if s]


def redact(value: Any, secrets: list[str]) -> Any:
    """A copy with every header value masked (names kept) and every known secret string replaced by
    ***."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "headers" and isinstance(item, dict):
                out[key] = dict.fromkeys(item, "***")
            else:
                out[key] = redact(item, secrets)
        return out
    if isinstance(value, list):
        return [redact(item, secrets) for item in value]
    if isinstance(value, str):
        for secret in secrets:
            if secret:
                value = value.replace(secret, "***")
    return value


def _spelling(value: float) -> Spelled:
    return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
