"""An answer's JSON typed once at the boundary: the msgspec structs a strict decoder fills in C, and
the field-by-field reading of what it refuses, where each value that does not fit its field is a
finding."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import msgspec
import orjson

from kevload.inputs.wordsets import shortened
from kevload.records.store import TOKEN_COUNT_MAX, TokenCount


class Malformed(ValueError):
    """The response is not a readable OpenAI-style answer."""


# --- the answer as the server sends it, typed (msgspec) ---
#
# Every answer is decoded once into these structs. The strict decoder is the fast path: a
# well-formed answer is typed and range-checked in C (measured on a vLLM-like chat body of 128
# tokens with logprobs: 50 µs against 90 µs for orjson and dicts; 1.0 against 2.2 µs without
# logprobs; a stream chunk 0.5 against 0.9 µs). Only an answer the strict decoder refuses is read
# again field by field (``_lenient``): what is wrong in the text or its finish_reason makes it
# malformed, a wrong count, token id or logprob is a finding and the value is dropped.

# A count or token id is a record's ``TokenCount``: no served model has 2**31 tokens of context, and
# 10**30 would make an absurd tokens/s. One range, so an answer the boundary let through is always a
# record the reader takes back.
COUNT_CAP = TOKEN_COUNT_MAX + 1
Count = TokenCount
# A logprob is the log of a probability, so ≤ 0. Servers compute it in float32 (vLLM, SGLang:
# log_softmax of the logits; llama.cpp: log of a normalised softmax), whose rounding can put the top
# token a few 1e-7 above 0; 1e-3 is far above any such rounding and far below a value that means
# something. The spelled non-finite values (-Infinity, Infinity, NaN, read by ``_nonfinite_json``)
# are kept as they are: they are compared as what they mean.
LOGPROB_SLACK = 1e-3
Logprob = Annotated[float, msgspec.Meta(le=LOGPROB_SLACK)]
# Findings kept on one answer: a server that gets every chunk wrong says so in the first few.
MAX_FINDINGS = 8
_SHOWN = 80  # characters of a wrong value shown in its finding


class _Entry(msgspec.Struct):
    token: str | None = None
    logprob: Logprob | None = None
    id: Count | None = None  # llama.cpp's token id


class _Logprobs(msgspec.Struct):
    # Chat (and llama.cpp's completions): {"content": [{"token", "logprob", "id"?}, …]};
    # OpenAI-style completions: {"tokens": […], "token_logprobs": […]}. Streamed, one piece per
    # chunk.
    content: list[_Entry] | None = None
    tokens: list[str | None] | None = None
    token_logprobs: list[Logprob | None] | None = None


class Function(msgspec.Struct):
    name: str | None = None
    arguments: Any = None  # a string, or a JSON object some servers send instead (``_arguments``)


class Call(msgspec.Struct):
    index: Any = None
    function: Function | None = None


class Message(msgspec.Struct):
    """A whole answer's message or one stream delta."""

    content: str | None = None
    # vLLM and SGLang call it reasoning_content; newer vLLM, Ollama and OpenRouter call it
    # reasoning.
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Call] | None = None


class Choice(msgspec.Struct):
    index: Any = 0
    text: str | None | msgspec.UnsetType = (
        msgspec.UNSET
    )  # completions; its presence says which kind of answer
    message: Message | None = None
    delta: Message | None = None
    finish_reason: str | None = None
    logprobs: _Logprobs | None = None
    token_ids: list[Count] | None = None  # vLLM's return_token_ids


def answers_in_text(choice: Choice, api: str) -> bool:
    """Which field of a choice is the answer, the one place that decides it (and so what is hashed
    and graded): completions' ``text`` under the completions API; under chat the ``message`` (or
    stream ``delta``), as that API defines, ``text`` only where a choice has neither (a server
    answering chat in completions' shape). A chat choice carrying both is read by its message:
    before, its ``text`` won."""
    if api == "completions":
        return True
    return choice.text is not msgspec.UNSET and choice.message is None and choice.delta is None


class _Details(msgspec.Struct):
    cached_tokens: Count | None = None


class Usage(msgspec.Struct):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    prompt_tokens_details: _Details | None = None


class Timings(msgspec.Struct):
    cache_n: Count | None = None  # llama.cpp: the prompt tokens it reused from its cache


class Answer(msgspec.Struct):
    """A whole answer or one stream event's JSON."""

    choices: list[Choice] | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    system_fingerprint: str | None = None
    tokens: list[Count] | None = None  # llama.cpp's token ids
    # An error object in place of an answer: {"error": …} (OpenAI, SGLang) or {"object": "error",
    # "message"} (vLLM).
    error: Any = msgspec.UNSET
    object: Any = None
    message: Any = msgspec.UNSET


_STRICT = msgspec.json.Decoder(Answer)


def decode(raw: bytes | str, findings: list[str]) -> tuple[Answer | None, bool, str | None]:
    """One answer or event decoded: (the typed answer, whether it held a spelled non-finite number,
    why it is no answer). Findings go to ``findings``; nothing raises."""
    try:
        return _STRICT.decode(raw), False, None
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    nonfinite = False
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        doc = _nonfinite_json(raw)
        if doc is None:
            return None, False, f"not JSON: {exc}: {shown(raw)}"
        nonfinite = True
    if not isinstance(doc, dict):
        return None, nonfinite, f"not a JSON object: {shown(raw)}"
    try:
        return _lenient(doc, findings), nonfinite, None
    except Malformed as exc:
        return None, nonfinite, str(exc)


def _lenient(doc: dict[str, Any], findings: list[str]) -> Answer:
    """An answer the strict decoder refused, read field by field: each count, token id, logprob and
    fingerprint that does not fit is a finding and dropped; the rest must fit its type, or
    ``Malformed`` says where not."""
    choices = doc.get("choices")
    kept = (
        [
            {k: v for k, v in c.items() if k not in ("logprobs", "token_ids")}
            if isinstance(c, dict)
            else c
            for c in choices
        ]
        if isinstance(choices, list)
        else choices
    )
    try:
        answer = msgspec.convert(
            {
                **doc,
                "choices": kept,
                "usage": None,
                "timings": None,
                "system_fingerprint": None,
                "tokens": None,
            },
            Answer,
        )
    except msgspec.ValidationError as exc:
        raise Malformed(str(exc)) from None
    answer.usage = _usage(doc.get("usage"), findings)
    answer.timings = _timings(doc.get("timings"), findings)
    fingerprint = doc.get("system_fingerprint")
    if fingerprint is not None and not isinstance(fingerprint, str):
        findings.append(f"system_fingerprint: expected a string, got {shown(fingerprint)}")
        fingerprint = None
    answer.system_fingerprint = fingerprint
    answer.tokens = _token_ids(doc.get("tokens"), "tokens", findings)
    for choice, given in zip(answer.choices or (), choices or (), strict=True):
        choice.logprobs = _logprobs(given.get("logprobs"), findings)
        choice.token_ids = _token_ids(given.get("token_ids"), "choices[].token_ids", findings)
    return answer


def shown(value: Any) -> str:
    """A wrong value as its finding shows it: repr, at most ``_SHOWN`` characters."""
    return shortened(repr(value), _SHOWN)


def _count(value: Any, where: str, findings: list[str]) -> int | None:
    if value is None or (type(value) is int and 0 <= value < COUNT_CAP):
        return value
    findings.append(f"{where}: expected an integer from 0 to {COUNT_CAP - 1}, got {shown(value)}")
    return None


def _object(value: Any, where: str, findings: list[str]) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    findings.append(f"{where}: expected an object, got {shown(value)}")
    return None


def _usage(value: Any, findings: list[str]) -> Usage | None:
    usage = _object(value, "usage", findings)
    if usage is None:
        return None
    details = _object(usage.get("prompt_tokens_details"), "usage.prompt_tokens_details", findings)
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens"), "usage.prompt_tokens", findings),
        completion_tokens=_count(
            usage.get("completion_tokens"), "usage.completion_tokens", findings
        ),
        prompt_tokens_details=None
        if details is None
        else _Details(
            _count(
                details.get("cached_tokens"), "usage.prompt_tokens_details.cached_tokens", findings
            )
        ),
    )


def _timings(value: Any, findings: list[str]) -> Timings | None:
    timings = _object(value, "timings", findings)
    return (
        None
        if timings is None
        else Timings(_count(timings.get("cache_n"), "timings.cache_n", findings))
    )


def _token_ids(value: Any, where: str, findings: list[str]) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, list) and all(type(t) is int and 0 <= t < COUNT_CAP for t in value):
        return value
    findings.append(
        f"{where}: expected a list of token ids (integers from 0 to {COUNT_CAP - 1}), got "
        f"{shown(value)}"
    )
    return None


def _logprob(value: Any, bad: list[Any]) -> float | None:
    """A logprob, None where none was given; a value that is none (a string, a bool, above
    ``LOGPROB_SLACK``) goes to ``bad`` and is None too."""
    if value is None:
        return None
    if type(value) is float or type(value) is int:
        number = float(value)
        if number <= LOGPROB_SLACK or not math.isfinite(number):
            return number
    bad.append(value)
    return None


def _logprobs(value: Any, findings: list[str]) -> _Logprobs | None:
    logprobs = _object(value, "logprobs", findings)
    if logprobs is None:
        return None
    bad: list[Any] = []
    content, tokens = logprobs.get("content"), logprobs.get("tokens")
    if isinstance(content, list):
        entries = [e for e in content if isinstance(e, dict)]
        if len(entries) < len(content):
            findings.append(
                f"logprobs.content: {len(content) - len(entries)} entries are no objects, the "
                f"first "
                f"{shown(next(e for e in content if not isinstance(e, dict)))}"
            )
        ids = [e.get("id") for e in entries]
        if (
            any(i is not None for i in ids)
            and _token_ids(ids, "logprobs.content[].id", findings) is None
        ):
            ids = [None] * len(entries)
        parsed = _Logprobs(
            content=[
                _Entry(
                    token=_token_text(e.get("token")), logprob=_logprob(e.get("logprob"), bad), id=i
                )
                for e, i in zip(entries, ids, strict=True)
            ]
        )
    elif isinstance(tokens, list):
        values = logprobs.get("token_logprobs")
        if values is not None and not isinstance(values, list):
            findings.append(f"logprobs.token_logprobs: expected a list, got {shown(values)}")
            values = None
        parsed = _Logprobs(
            tokens=[_token_text(t) for t in tokens],
            token_logprobs=[_logprob(x, bad) for x in values or ()],
        )
    else:
        return None
    if bad:
        findings.append(
            f"logprobs: {len(bad)} values are no logprob (a number ≤ {LOGPROB_SLACK:g}), the first "
            f"{shown(bad[0])}"
        )
    return parsed


def _token_text(token: Any) -> str | None:
    return token if token is None or isinstance(token, str) else str(token)


def _nonfinite_json(raw: bytes | str) -> Any:
    """A body orjson refused, read again where the refusal was a non-finite number; None otherwise.

    Python servers write a float that is not finite as ``NaN``, ``Infinity`` or ``-Infinity``
    (``json.dumps``' default: aiohttp, Flask, FastAPI), which orjson refuses, as it refuses a number
    too large for a double. The standard library reads both. Its reading is kept only when it found
    such a number and holds nothing else orjson refuses (lone surrogates); integers beyond 64 bits
    become floats, as orjson reads them. Called only after orjson failed: the usual body pays
    nothing.
    """
    seen: list[float] = []

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            seen.append(value)
        return value

    def integer(text: str) -> int | float:
        value = int(text)
        return value if -(1 << 63) <= value < 1 << 64 else float(value)

    try:
        doc = json.loads(raw, parse_constant=number, parse_float=number, parse_int=integer)
        orjson.dumps(doc)
    except (ValueError, RecursionError, orjson.JSONEncodeError):
        return None
    return doc if seen else None
