"""A response body read into an ``Outcome``: a whole JSON answer or a Server-Sent Events stream, its
pieces gathered (content, reasoning, tool calls, usage, logprobs), and how it ended judged."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import msgspec
import orjson

from kevload.inputs.wordsets import CANCELLED
from kevload.records.store import ToolCall
from kevload.wire.decoding import (
    MAX_FINDINGS,
    Answer,
    Call,
    Choice,
    Function,
    Malformed,
    Message,
    Timings,
    Usage,
    answers_in_text,
    decode,
    shown,
)
from kevload.wire.sse import SSEError, SSEParser


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request produced. ``status`` is ``ok`` or an error type; only ``ok`` is compared."""

    status: str
    t_send: float
    t_last_byte: float
    t_first_byte: float | None = None
    t_first_token: float | None = None
    output: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    token_ids: list[int] | None = None
    logprobs: list[float | None] | None = None
    tokens: list[str] | None = None
    system_fingerprint: str | None = None
    chunks: int = 0
    max_gap: float | None = None
    http_status: int | None = None
    retry_after: float | None = None
    error: str | None = None
    # The rest of the answer besides ``output`` (the content); ``store.answer_text`` joins them for
    # comparison.
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None
    reconnects: int = 0  # 1: resent on a fresh connection after a reused one had closed
    # logprobs that were -Infinity, Infinity or NaN (Python servers write them)
    logprob_nonfinite: int = 0
    # Prompt tokens the server says it served from its prefix cache:
    # usage.prompt_tokens_details.cached_tokens (vLLM with --enable-prompt-tokens-details, OpenAI),
    # or llama.cpp's timings.cache_n; None where it says nothing.
    cached_tokens: int | None = None
    # What the server sent that does not fit its field (a count that is no non-negative integer, a
    # logprob above 0,
    # …): "field: what was wrong and what came". The value is dropped (None), the answer itself
    # keeps its status.
    findings: list[str] | None = None


# finish_reason values by which the server says it gave up on the answer: failures, never compared.
# Every other value (stop, length, tool_calls, eos_token, content_filter, …) ends a real answer.
_FAILED_FINISH = {
    "abort": "aborted",
    "aborted": "aborted",
    "cancelled": "aborted",
    "canceled": "aborted",
    "error": "server_error",
}


async def read_whole(
    raw: bytes,
    content_type: str,
    api: str,
    t_send: float,
    t_first_byte: float,
    *,
    token_limit: int | None = None,
) -> Outcome:
    t_last = time.perf_counter()

    def failed(status: str, why: str) -> Outcome:
        return Outcome(
            status=status, t_send=t_send, t_first_byte=t_first_byte, t_last_byte=t_last, error=why
        )

    if "json" not in content_type:
        return failed("malformed", f"content type {content_type!r}, expected application/json")
    acc = _Accumulator(token_limit)
    answer, acc.nonfinite, why = decode(raw, acc.findings)
    if answer is None:
        return failed("malformed", f"body is {why}")
    if _is_error(answer):
        return failed("server_error", f"error object: {_error_text(answer)}")
    choice = _first_choice(answer)
    if choice is None:
        return failed("malformed", "no choices in the response")
    try:
        acc.take_message(choice, api)
    except Malformed as exc:
        return failed("malformed", str(exc))
    acc.take_extras(answer, choice)
    return acc.finish(
        choice.finish_reason or None,
        complete=True,
        t_send=t_send,
        t_first_byte=t_first_byte,
        t_first_token=t_last,
        t_last_byte=t_last,
    )


@dataclass(slots=True)
class StreamCut:
    """How a streamed answer may be cut (``kevload.load.cancel``): once ``after_chunks`` chunks
    carried a piece of the answer and no end of it was read (the caller then closes the connection),
    or by time, on the caller's clock: ``chunks`` follows the chunks read, for that cut to report,
    and ``ended`` is called once the answer's end is read (a cut by time no longer applies)."""

    after_chunks: int | None = None
    ended: Callable[[], None] | None = None
    chunks: int = 0

    def after_read(self, chunks: int, ended: bool) -> bool:
        """Called once the events of one read are taken; True when the stream is cut here. An answer
        whose end came with its cut-off chunk (vLLM's last token carries its finish_reason) or in
        the same read is whole, not cancelled."""
        self.chunks = chunks
        if ended and self.ended is not None:
            self.ended()
            self.ended = None
        return self.after_chunks is not None and chunks >= self.after_chunks and not ended


async def read_stream(
    body: AsyncIterator[bytes],
    read: Callable[[], Awaitable[bytes]],
    content_type: str,
    api: str,
    t_send: float,
    t_first_byte: float,
    cut: StreamCut | None = None,
    *,
    token_limit: int | None = None,
) -> Outcome:
    """A Server-Sent Events answer into its outcome; ``cut``: how it may be cut."""
    if "text/event-stream" not in content_type:
        await read()
        wrong = f"content type {content_type!r}, expected text/event-stream"
        return _failed("malformed", wrong, t_send, t_first_byte, time.perf_counter())
    try:
        return await _take_events(body, _Accumulator(token_limit), api, t_send, t_first_byte, cut)
    except (SSEError, Malformed) as exc:
        return _failed("malformed", str(exc), t_send, t_first_byte, time.perf_counter())


async def _take_events(
    body: AsyncIterator[bytes],
    acc: _Accumulator,
    api: str,
    t_send: float,
    t_first_byte: float,
    cut: StreamCut | None,
) -> Outcome:
    """The stream's events into ``acc`` until its end, an early end or the cut (``SSEError``,
    ``Malformed``: no answer). Hot path: common steps inline, in locals; rare ends in helpers."""
    parser = SSEParser()
    finish_reason: str | None = None
    t_first_token: float | None = None
    done, chunks, t_prev, max_gap = False, 0, 0.0, 0.0  # t_prev: read once a first token set it
    async for raw in body:
        now = time.perf_counter()
        for event, data in parser.feed(raw):
            if event == "error":
                # However the server words it (an "error" key or not), this event ends the answer.
                said = f"error event: {data[:200]!r}"
                return _failed("server_error", said, t_send, t_first_byte, now)
            if not data:
                continue  # an event without data (a named keep-alive) carries nothing
            if data == "[DONE]":
                done = True
                continue
            answer, nonfinite, why = decode(data, acc.findings)
            if answer is None or _is_error(answer):
                return _event_failed(answer, why, t_send, t_first_byte, now)
            acc.nonfinite = acc.nonfinite or nonfinite
            choice = _first_choice(answer)
            acc.take_extras(answer, choice)
            if choice is None:
                continue
            if acc.take_delta(choice, api):
                chunks += 1
                if t_first_token is None:
                    t_first_token = now
                else:
                    max_gap = max(max_gap, now - t_prev)
                t_prev = now
            finish_reason = choice.finish_reason or finish_reason
        if cut is not None and cut.after_read(chunks, finish_reason is not None or done):
            return _cancelled(chunks, t_send, t_first_byte, t_first_token, now)
    t_last = time.perf_counter()
    return acc.finish(
        finish_reason,
        complete=done,
        t_send=t_send,
        t_first_byte=t_first_byte,
        t_first_token=t_first_token or t_last,
        t_last_byte=t_last,
        chunks=chunks,
        max_gap=max_gap if chunks > 1 else None,
    )


def _failed(status: str, why: str, t_send: float, t_first_byte: float, now: float) -> Outcome:
    """A response that is no answer: ``status`` and why, at ``now``."""
    return Outcome(
        status=status, t_send=t_send, t_first_byte=t_first_byte, t_last_byte=now, error=why
    )


def _event_failed(
    answer: Answer | None, why: str | None, t_send: float, t_first_byte: float, now: float
) -> Outcome:
    """A stream event that ends the answer: one that is no answer (``why``), or an error object."""
    if answer is None:
        return _failed("malformed", f"event is {why}", t_send, t_first_byte, now)
    return _failed("server_error", f"error event: {_error_text(answer)}", t_send, t_first_byte, now)


def _cancelled(
    chunks: int, t_send: float, t_first_byte: float, t_first_token: float | None, now: float
) -> Outcome:
    """A stream kevload cut after ``chunks`` chunks (``StreamCut.after_chunks``)."""
    return Outcome(
        status=CANCELLED,
        t_send=t_send,
        t_first_byte=t_first_byte,
        t_first_token=t_first_token,
        t_last_byte=now,
        chunks=chunks,
        error=f"cut by kevload after {chunks} chunks (load.cancel_after_tokens)",
    )


def _is_error(answer: Answer) -> bool:
    """An error object in place of an answer: ``{"error": …}`` (OpenAI, SGLang) or
    ``{"object": "error"}`` (vLLM)."""
    return (answer.error is not msgspec.UNSET or answer.object == "error") and not answer.choices


def _error_text(answer: Answer) -> str:
    error = answer.error if answer.error is not msgspec.UNSET else answer.message
    if isinstance(error, dict) and "message" in error:
        error = error["message"]
    return str(None if error is msgspec.UNSET else error)[:200]


def _first_choice(answer: Answer) -> Choice | None:
    """Choice 0: a server that sends other choices too (``n`` is refused at load) cannot mix them
    into it."""
    for choice in answer.choices or ():
        if choice.index == 0:
            return choice
    return None


def _reasoning(message: Message) -> str | None:
    # A server that fills both fields fills them with the same text, so one of them is the
    # reasoning.
    return message.reasoning_content or message.reasoning


def _arguments(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        # Arguments sent as a JSON object rather than a string: compared in one canonical spelling.
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    raise Malformed(f"tool call arguments are not a string: {shown(value)}")


def _tool_call_parts(calls: list[Call] | None) -> list[tuple[int | None, str | None, str | None]]:
    """(index, name, arguments) of each tool call or tool-call delta; the call ``id`` is left out
    because servers make it up afresh for every request."""
    parts = []
    for call in calls or ():
        function = call.function or Function()
        parts.append(
            (
                call.index if type(call.index) is int else None,
                function.name,
                _arguments(function.arguments),
            )
        )
    return parts


class _Accumulator:
    """Collects the whole answer (content, reasoning, tool calls) from one message or many stream
    deltas, and what servers return besides it: usage, fingerprint, token ids, logprobs, and the
    findings on them."""

    __slots__ = (
        "content",
        "reasoning",
        "calls",
        "usage",
        "fingerprint",
        "token_ids",
        "logprobs",
        "tokens",
        "logprob_ids",
        "nonfinite",
        "timings",
        "findings",
        "token_limit",
    )

    def __init__(self, token_limit: int | None = None) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, list[Any]] = {}  # index -> [name, argument pieces]
        self.usage: Usage | None = None
        self.fingerprint: str | None = None
        self.token_ids: list[int] | None = None
        self.logprobs: list[float | None] | None = None
        self.tokens: list[str] | None = None
        # Token ids beside the logprobs (llama.cpp's "id"); None once a piece came without them.
        self.logprob_ids: list[int] | None = []
        # A piece was read with non-finite numbers (``decoding._nonfinite_json``): only then can a
        # logprob be -inf, inf or NaN.
        self.nonfinite = False
        # llama.cpp's: its cache_n is the prompt tokens it reused
        self.timings: Timings | None = None
        self.findings: list[str] = []
        # the request's max_tokens: no completion_tokens count can be above it
        self.token_limit = token_limit

    def take_message(self, choice: Choice, api: str) -> None:
        """A whole (non-streamed) choice."""
        if answers_in_text(choice, api):
            self.content.append(choice.text or "")
            return
        message = choice.message
        if message is None:
            raise Malformed("the choice has no message object")
        self.content.append(message.content or "")
        self.reasoning.append(_reasoning(message) or "")
        for position, (_, name, arguments) in enumerate(_tool_call_parts(message.tool_calls)):
            self.calls[position] = [name or "", [arguments or ""]]

    def take_delta(self, choice: Choice, api: str) -> bool:
        """One stream chunk's choice; True when it carried a piece of the answer."""
        if answers_in_text(choice, api):
            piece = choice.text
            if piece:
                self.content.append(piece)
                return True
            return False
        delta = choice.delta
        if delta is None:
            return False
        # The stream's hot path: most deltas carry only content, so the rest is looked up only when
        # present.
        carried = False
        content = delta.content
        if content:
            self.content.append(content)
            carried = True
        reasoning = _reasoning(delta)
        if reasoning:
            self.reasoning.append(reasoning)
            carried = True
        if delta.tool_calls is None:
            return carried
        for index, name, arguments in _tool_call_parts(delta.tool_calls):
            # Deltas of one call share its index: the name comes once, the arguments in pieces.
            # Without an index, a delta naming a function starts the next call and any other
            # continues the last.
            if index is None:
                index = (max(self.calls) + bool(name)) if self.calls else 0
            call = self.calls.setdefault(index, ["", []])
            if name and not call[0]:
                call[0] = name
            if arguments:
                call[1].append(arguments)
            carried = carried or bool(name or arguments)
        return carried

    def take_extras(self, answer: Answer, choice: Choice | None) -> None:
        if answer.usage is not None:
            self.usage = answer.usage
        if answer.timings is not None:
            self.timings = answer.timings
        if answer.system_fingerprint:
            self.fingerprint = answer.system_fingerprint
        if choice is None:
            return
        ids = choice.token_ids if choice.token_ids is not None else answer.tokens
        if ids:
            self.token_ids = (self.token_ids or []) + ids
        logprobs = choice.logprobs
        if logprobs is None:
            return
        if logprobs.content is not None:
            entries = logprobs.content
            self._extend(
                [e.token for e in entries], [e.logprob for e in entries], [e.id for e in entries]
            )
        elif logprobs.tokens is not None:
            tokens = logprobs.tokens
            self._extend(tokens, logprobs.token_logprobs or [], [None] * len(tokens))

    def _extend(
        self, tokens: list[str | None], logprobs: list[float | None], ids: list[int | None]
    ) -> None:
        # One logprob per token, position for position: a missing one is null, never a shifted
        # neighbour.
        values = logprobs[: len(tokens)]
        self.tokens = (self.tokens or []) + ["" if t is None else t for t in tokens]
        self.logprobs = (self.logprobs or []) + values + [None] * (len(tokens) - len(values))
        if self.logprob_ids is not None:
            # Every id given: the check proves ``ids`` a list[int].
            self.logprob_ids = self.logprob_ids + cast(list[int], ids) if None not in ids else None

    def finish(self, finish_reason: str | None, *, complete: bool, **fields: Any) -> Outcome:
        """The outcome once the response ended: ``ok`` only for a finished, successful answer.

        ``complete``: the body was read whole, or a stream sent ``[DONE]``.
        """
        output = "".join(self.content)
        reasoning = "".join(self.reasoning) or None
        tool_calls: list[ToolCall] | None = [
            {"name": name, "arguments": "".join(pieces)}
            for _, (name, pieces) in sorted(self.calls.items())
        ] or None
        # The per-request path: a named finish that is no failure is ok, asked without a call.
        if finish_reason is not None and finish_reason not in _FAILED_FINISH:
            status, error = "ok", None
        else:
            answered = bool(output or reasoning or tool_calls)
            status, error = _status(finish_reason, complete=complete, answered=answered)
        usage = self.usage or Usage()
        completion_tokens = usage.completion_tokens
        limit = self.token_limit
        if completion_tokens is not None and limit is not None and completion_tokens > limit:
            self._over_limit(completion_tokens, limit)
            completion_tokens = None
        nonfinite = (
            sum(1 for x in self.logprobs if x is not None and not math.isfinite(x))
            if self.nonfinite and self.logprobs
            else 0
        )
        # A finding that every stream chunk repeats is said once.
        findings = list(dict.fromkeys(self.findings))[:MAX_FINDINGS] or None
        return Outcome(
            status=status,
            error=error,
            output=output,
            reasoning=reasoning,
            tool_calls=tool_calls,
            finish_reason=finish_reason,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=completion_tokens,
            # Token ids compare more surely than token texts (llama.cpp names a partial UTF-8 token
            # "").
            token_ids=self.token_ids or self.logprob_ids or None,
            logprobs=self.logprobs,
            tokens=self.tokens,
            system_fingerprint=self.fingerprint,
            logprob_nonfinite=nonfinite,
            cached_tokens=_cached_tokens(usage, self.timings),
            findings=findings,
            **fields,
        )

    def _over_limit(self, count: int, limit: int) -> None:
        """A count of the answer's tokens above the request's limit: a finding, and no count."""
        self.findings.append(
            f"usage.completion_tokens: expected at most the request's max_tokens ({limit}), "
            f"got {count}"
        )


def _status(finish_reason: str | None, *, complete: bool, answered: bool) -> tuple[str, str | None]:
    """How the answer ended: ``ok``, or the failure and why. ``answered``: it holds content,
    reasoning or a tool call."""
    if finish_reason in _FAILED_FINISH:
        return _FAILED_FINISH[finish_reason], f"finish_reason {finish_reason!r}"
    if finish_reason is None and not complete:
        return "truncated", "stream ended without a finish_reason or [DONE]"
    if finish_reason is None and not answered:
        # An empty answer is a real answer only when the server says how it ended.
        return "malformed", "no content, reasoning or tool calls, and no finish_reason"
    return "ok", None


def _cached_tokens(usage: Usage, timings: Timings | None) -> int | None:
    """Prompt tokens the server says it reused from its cache, from whichever of the two it sent."""
    details = usage.prompt_tokens_details
    if details is not None and details.cached_tokens is not None:
        return details.cached_tokens
    return timings.cache_n if timings is not None else None
