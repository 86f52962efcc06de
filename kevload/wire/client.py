"""One OpenAI-compatible exchange (chat or completions, streaming or not) into an ``Outcome``."""

from __future__ import annotations

import asyncio
import json
import math
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

import msgspec
import orjson

from kevload.errors import TargetError
from kevload.inputs.probe import Probe
from kevload.inputs.scenario import REQUEST_ID_HEADER, Scenario, Target
from kevload.inputs.wordsets import CANCELLED, shortened
from kevload.records.store import (
    TOKEN_COUNT_MAX,
    TokenCount,
    ToolCall,
    url_secrets,
    url_userinfo,
)
from kevload.wire.http1 import LeanTransport
from kevload.wire.models import REFUSAL_STATUSES, refusal_message, served_models
from kevload.wire.sse import SSEError, SSEParser
from kevload.wire.transport import AiohttpTransport, Endpoint, Response, Transport, TransportError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CancelAt:
    """When one request is cut: after ``after_s`` seconds from its send, or once ``after_chunks`` streamed chunks
    carried a piece of the answer, whichever comes first (None: not by that measure)."""

    after_s: float | None = None
    after_chunks: int | None = None

    def since(self, elapsed: float) -> CancelAt:
        """The cut of a conversation's later turn, ``elapsed`` seconds after its first send: a conversation's
        seconds count from there, as a user closing the tab ends the chat at a moment, whatever turn it is in."""
        return (
            self
            if self.after_s is None
            else replace(self, after_s=max(self.after_s - elapsed, 0.0))
        )


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
    logprob_nonfinite: int = (
        0  # logprobs that were -Infinity, Infinity or NaN (Python servers write them)
    )
    # Prompt tokens the server says it served from its prefix cache:
    # usage.prompt_tokens_details.cached_tokens (vLLM
    # with --enable-prompt-tokens-details, OpenAI), or llama.cpp's timings.cache_n; None where it
    # says nothing.
    cached_tokens: int | None = None
    # What the server sent that does not fit its field (a count that is no non-negative integer, a
    # logprob above 0,
    # …): "field: what was wrong and what came". The value is dropped (None), the answer itself
    # keeps its status.
    findings: list[str] | None = None


def build_body(
    target: Target, item: Probe, params: dict[str, Any], *, stream: bool, nonce: str | None
) -> dict[str, Any]:
    """The JSON body for one request: the user's params verbatim, plus model, input and stream flags."""
    body: dict[str, Any] = {"model": target.model}
    if target.api == "chat":
        body["messages"] = (
            list(item.messages) if item.messages else [{"role": "user", "content": item.prompt}]
        )
    else:
        body["prompt"] = (
            item.prompt
            if item.prompt is not None
            else "\n".join(m["content"] for m in item.messages or ())
        )
    body["max_tokens"] = item.max_tokens
    body.update(params)
    body["stream"] = stream
    if stream and "stream_options" not in params:
        body["stream_options"] = {"include_usage": True}
    if nonce is not None:
        # The OpenAI "user" field changes the request bytes without touching the prompt, so result
        # caches keyed on the body miss, and servers that don't use it ignore it.
        body.setdefault("user", nonce)
    return body


# The ``user`` field of the one request that checks whether a server returns logprobs, so logs (and
# the
# test server) can tell it from the run's own requests.
LOGPROBS_CHECK_USER = "kevload-logprobs-check"
# An ok answer without logprobs may still come from a server that returns them: llama.cpp sends a
# token that ends
# inside a UTF-8 character as text ("\ufffd") with no logprob entry, and a sampler may pick the end
# token first.
# So the check is sent again, this many times in all, before it says the server returns none.
LOGPROBS_CHECK_TRIES = 3


def logprob_fields(api: str) -> dict[str, Any]:
    """The request fields that ask for the chosen token's logprob at every position.

    Chat also gets ``top_logprobs: 1``: without it llama.cpp's server sends 20 alternatives per token
    (and none with 0), bytes that kevload would parse and drop.
    """
    return {"logprobs": True, "top_logprobs": 1} if api == "chat" else {"logprobs": 1}


async def ask_for_logprobs(
    scenario: Scenario,
    api_key: str | None,
    warn: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> tuple[Scenario, dict[str, Any]]:
    """Decide once per run whether its requests ask for logprobs (``load.logprobs``).

    Returns the scenario to run (its params with the logprob fields when they are asked for) and what
    ``run.json`` records under ``logprobs``: ``asked`` (the setting), ``available`` (what the one check
    request found; None when nothing was checked) and ``why``. ``auto`` sends that check — a two-token
    request on a prompt of its own, so no cache is warmed for a probe — and when the answer carries no
    logprobs (transformers serve ignores the field) or the check fails, says so once through ``warn``
    (stderr by default) and leaves the run to compare text only. A ``[params]`` that sets
    ``logprobs`` or ``top_logprobs`` itself is sent as written, unchecked. A ``stop`` cuts the check at once
    (its answer would decide nothing the stopped run still sends): nothing checked, and ``why`` says so.
    A check refused with http 400/404 by a server whose ``/models`` lists other models than the
    scenario's raises ``TargetError`` naming both, before the run sends anything.
    """
    asked = scenario.load.logprobs
    info: dict[str, Any] = {"asked": asked, "available": None, "why": None}
    if "logprobs" in scenario.params or "top_logprobs" in scenario.params:
        info["why"] = "[params] sets logprobs itself; sent as written"
        return scenario, info
    if asked is False:
        info["why"] = "load.logprobs = false"
        return scenario, info
    with_logprobs = replace(
        scenario, params={**scenario.params, **logprob_fields(scenario.target.api)}
    )
    if asked is True:
        info["why"] = "load.logprobs = true: asked for without a check"
        return with_logprobs, info
    check = Probe(id="logprobs-check", prompt="Say hi.", max_tokens=2)
    body = build_body(
        scenario.target,
        check,
        with_logprobs.params,
        stream=scenario.load.stream,
        nonce=LOGPROBS_CHECK_USER,
    )
    async with Client(scenario.target, api_key) as client:
        answers: list[Outcome] = []
        for _ in range(LOGPROBS_CHECK_TRIES):
            outcome = await unless_stopped(client.send(body), stop)
            if outcome is None or outcome.status != "ok" or _has_logprobs(outcome):
                break
            answers.append(outcome)
    if outcome is None:
        info["why"] = "the run was stopped before the check answered"
        return scenario, info
    if outcome.status == "ok" and _has_logprobs(outcome):
        info["available"] = True
        return with_logprobs, info
    if outcome.status == "ok" and not any(a.output or a.completion_tokens for a in answers):
        # No answer held a token, so none said whether logprobs come: ask for them; the cells say
        # where samples
        # came without (logprobs_missing).
        info["why"] = (
            f"the check's {LOGPROBS_CHECK_TRIES} answers held no token: asked for without proof"
        )
        return with_logprobs, info
    if outcome.status in REFUSAL_STATUSES:
        # Every request of the run would be refused alike: say which model, and which it serves.
        served = await served_models(scenario.target, api_key)
        if served and scenario.target.model not in served:
            raise TargetError(
                refusal_message(scenario.target.model, outcome.status, outcome.error, served)
            )
    why = (
        "the server returned no per-token logprobs"
        if outcome.status == "ok"
        else f"the check request failed ({outcome.status}: {outcome.error})"
    )
    info.update(available=False, why=why)
    message = f"kevload: logprobs: {why}; comparing output text only"
    if warn is not None:
        warn(message)
    elif (scenario.target.base_url, message) not in _SAID:
        # A command that runs several steps against one server (demo, diagnose, sweep, cases rerun)
        # checks before each: the same words six times said nothing new. run.json still has them.
        _SAID.add((scenario.target.base_url, message))
        _to_stderr(message)
    return scenario, info


def _has_logprobs(outcome: Outcome) -> bool:
    return any(x is not None for x in outcome.logprobs or ())


async def unless_stopped(awaitable: Awaitable[T], stop: asyncio.Event | None) -> T | None:
    """``awaitable``'s result, or None when ``stop`` is set first: then it is cancelled (a request's connection
    closed) before this returns."""
    task = asyncio.ensure_future(awaitable)
    if stop is None:
        return await task
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return None if task.cancelled() else task.result()


# What ask_for_logprobs said on stderr in this process, by server: said once per server.
_SAID: set[tuple[str, str]] = set()


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr)


class Client:
    """One connection pool shared by every request of a run, on a ``Transport``.

    The backend is the constructor's choice: ``transport="lean"`` (kevload's HTTP/1.1 client,
    plain http only), ``"aiohttp"``, or a ready ``Transport``. Left out, plain-http targets use the
    lean client and https targets aiohttp; a user can force aiohttp with ``KEVLOAD_HTTP=aiohttp``.
    Transports raise only ``TransportError``s, whose ``status`` goes into the record as it is.
    """

    def __init__(
        self,
        target: Target,
        api_key: str | None,
        *,
        limit: int = 0,
        transport: Literal["lean", "aiohttp"] | Transport | None = None,
    ):
        self.target = target
        base, basic = url_userinfo(target.base_url)
        parts = urlsplit(base)
        path = parts.path.rstrip("/") + (
            "/chat/completions" if target.api == "chat" else "/completions"
        )
        # The query stays after the path (Azure's ?api-version=…).
        self.url = urlunsplit(parts._replace(path=path))
        # Error texts can echo request headers back (some gateways do). No header name tells which
        # values are
        # credentials (Ocp-Apim-Subscription-Key, X-Auth, …), so every header value is scrubbed,
        # with the key.
        self._secrets = [
            s for s in [api_key, *target.headers.values(), *url_secrets(target.base_url)] if s
        ]
        headers = {"Content-Type": "application/json", **target.headers}
        if basic:
            headers["Authorization"] = f"Basic {basic}"
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._endpoint = Endpoint(
            url=self.url,
            headers=headers,
            timeout=target.timeout,
            max_response_bytes=target.max_response_bytes,
            limit=limit,
        )
        self._max_seconds = target.max_seconds or None
        if transport is None:
            forced = os.environ.get("KEVLOAD_HTTP") == "aiohttp"
            transport = "lean" if parts.scheme == "http" and not forced else "aiohttp"
        if transport == "lean" and parts.scheme != "http":
            raise ValueError(f"the lean transport speaks plain http only, not {parts.scheme}")
        self._choice = transport
        self._transport: Transport | None = None

    async def __aenter__(self) -> Client:
        if self._choice == "lean":
            self._transport = LeanTransport(self._endpoint)
        elif isinstance(self._choice, str):  # "aiohttp"
            self._transport = AiohttpTransport(self._endpoint)
        else:
            self._transport = self._choice
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._transport is not None:
            await self._transport.aclose()
            self._transport = None

    async def send(
        self, body: dict[str, Any], *, request_id: str | None = None, cancel: CancelAt | None = None
    ) -> Outcome:
        """One exchange, sent with ``X-Request-Id: request_id`` (a random id when None): the id a
        server's logs and traces show for it. A resend on a fresh connection carries the same id.

        ``cancel``: the client abandons the request then (``kevload.load.cancel``), closing its connection as a user
        closing a tab does; the outcome is ``cancelled``, with the time of the cut and the chunks read before it."""
        assert self._transport is not None, "use Client as an async context manager"
        payload = orjson.dumps(body)
        stream = bool(body.get("stream"))
        token_limit = _token_limit(body)
        headers = {REQUEST_ID_HEADER: request_id or secrets.token_hex(8)}
        t_send = time.perf_counter()
        cut_s = cancel.after_s if cancel is not None else None
        after_chunks = cancel.after_chunks if cancel is not None else None
        # Streamed chunks read so far, followed only where a cut by time may need to report them.
        chunks = [0] if cut_s is not None else None
        if self._max_seconds is None and cut_s is None:
            return await self._exchange(
                payload, headers, stream, t_send, [], after_chunks, chunks, token_limit=token_limit
            )
        deadline = asyncio.timeout(self._max_seconds)
        cut = asyncio.timeout(cut_s)
        reconnects: list[int] = []
        # An answer whose end was read is whole: the cut's clock stops there (what follows is [DONE]
        # or the close).
        ended = (lambda: cut.reschedule(None)) if cut_s is not None else None
        try:
            async with deadline, cut:  # the cut inside: its own expiry is told apart below
                return await self._exchange(
                    payload,
                    headers,
                    stream,
                    t_send,
                    reconnects,
                    after_chunks,
                    chunks,
                    ended,
                    token_limit,
                )
        except TimeoutError:
            if cut.expired():
                assert chunks is not None  # a cut's clock ran: cut_s was given
                return replace(
                    self._failed(
                        CANCELLED,
                        t_send,
                        f"cut by kevload after {cut_s:g} s (load.cancel_after_s)",
                        sum(reconnects),
                    ),
                    chunks=chunks[0],
                )
            if not deadline.expired():
                raise
            return self._failed(
                "timeout",
                t_send,
                f"no complete answer within target.max_seconds = {self._max_seconds:g} s",
                sum(reconnects),
            )

    async def _exchange(
        self,
        payload: bytes,
        headers: dict[str, str],
        stream: bool,
        t_send: float,
        reconnects: list[int],
        after_chunks: int | None = None,
        chunks: list[int] | None = None,
        ended: Callable[[], None] | None = None,
        token_limit: int | None = None,
    ) -> Outcome:
        transport = self._transport
        assert transport is not None  # send's own check: one test of an attribute per attempt
        try:
            response = await transport.send(payload, headers)
            reconnects.append(response.reconnects)
            try:
                outcome = await self._answer(
                    response, stream, t_send, after_chunks, chunks, ended, token_limit
                )
            finally:
                # Also on a cancel or the max_seconds cut: closing tells the server to stop.
                response.close()
        except TransportError as exc:
            return self._failed(exc.status, t_send, str(exc), exc.reconnects)
        return replace(outcome, reconnects=response.reconnects) if response.reconnects else outcome

    async def _answer(
        self,
        response: Response,
        stream: bool,
        t_send: float,
        after_chunks: int | None = None,
        chunks: list[int] | None = None,
        ended: Callable[[], None] | None = None,
        token_limit: int | None = None,
    ) -> Outcome:
        t_first_byte = time.perf_counter()
        status, headers = response.status, response.headers
        if status != 200:
            text = (await response.read())[:400].decode("utf-8", "replace")
            return Outcome(
                status=f"http_{status}",
                t_send=t_send,
                t_first_byte=t_first_byte,
                t_last_byte=time.perf_counter(),
                http_status=status,
                retry_after=_retry_after(headers.get("retry-after")),
                error=self._scrub(text.strip()) or response.reason,
            )
        content_type = headers.get("content-type", "")
        if stream:
            return await _read_stream(
                response.chunks(),
                response.read,
                content_type,
                self.target.api,
                t_send,
                t_first_byte,
                after_chunks,
                chunks,
                ended,
                token_limit=token_limit,
            )
        return await _read_whole(
            await response.read(),
            content_type,
            self.target.api,
            t_send,
            t_first_byte,
            token_limit=token_limit,
        )

    def _failed(self, status: str, t_send: float, error: str, reconnects: int) -> Outcome:
        return Outcome(
            status=status,
            t_send=t_send,
            t_last_byte=time.perf_counter(),
            error=self._scrub(error),
            reconnects=reconnects,
        )

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


# finish_reason values by which the server says it gave up on the answer: failures, never compared.
# Every other value (stop, length, tool_calls, eos_token, content_filter, …) ends a real answer.
_FAILED_FINISH = {
    "abort": "aborted",
    "aborted": "aborted",
    "cancelled": "aborted",
    "canceled": "aborted",
    "error": "server_error",
}


class _Malformed(ValueError):
    """The response is not a readable OpenAI-style answer."""


# --- the answer as the server sends it, typed (msgspec) ---
#
# Every answer is decoded once into these structs. The strict decoder is the fast path: a
# well-formed answer is
# typed and range-checked in C (measured on a vLLM-like chat body of 128 tokens with logprobs: 50 µs
# against 90 µs
# for orjson and dicts; 1.0 against 2.2 µs without logprobs; a stream chunk 0.5 against 0.9 µs).
# Only an answer the
# strict decoder refuses is read again field by field (``_lenient``): what is wrong in the text or
# its finish_reason
# makes it malformed, a wrong count, token id or logprob is a finding and the value is dropped.

# A count or token id is a record's ``TokenCount``: no served model has 2**31 tokens of context, and
# 10**30 would make
# an absurd tokens/s. One range, so an answer the boundary let through is always a record the reader
# takes back.
COUNT_CAP = TOKEN_COUNT_MAX + 1
Count = TokenCount
# A logprob is the log of a probability, so ≤ 0. Servers compute it in float32 (vLLM, SGLang:
# log_softmax of the
# logits; llama.cpp: log of a normalised softmax), whose rounding can put the top token a few 1e-7
# above 0; 1e-3
# is far above any such rounding and far below a value that means something. The spelled non-finite
# values
# (-Infinity, Infinity, NaN, read by ``_nonfinite_json``) are kept as they are: they are compared as
# what they mean.
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


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: Any = None  # a string, or a JSON object some servers send instead (``_arguments``)


class _Call(msgspec.Struct):
    index: Any = None
    function: _Function | None = None


class _Message(msgspec.Struct):
    """A whole answer's message or one stream delta."""

    content: str | None = None
    # vLLM and SGLang call it reasoning_content; newer vLLM, Ollama and OpenRouter call it
    # reasoning.
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_Call] | None = None


class _Choice(msgspec.Struct):
    index: Any = 0
    text: str | None | msgspec.UnsetType = (
        msgspec.UNSET
    )  # completions; its presence says which kind of answer
    message: _Message | None = None
    delta: _Message | None = None
    finish_reason: str | None = None
    logprobs: _Logprobs | None = None
    token_ids: list[Count] | None = None  # vLLM's return_token_ids


def _answers_in_text(choice: _Choice, api: str) -> bool:
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


class _Usage(msgspec.Struct):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    prompt_tokens_details: _Details | None = None


class _Timings(msgspec.Struct):
    cache_n: Count | None = None  # llama.cpp: the prompt tokens it reused from its cache


class _Answer(msgspec.Struct):
    """A whole answer or one stream event's JSON."""

    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    timings: _Timings | None = None
    system_fingerprint: str | None = None
    tokens: list[Count] | None = None  # llama.cpp's token ids
    # An error object in place of an answer: {"error": …} (OpenAI, SGLang) or {"object": "error",
    # "message"} (vLLM).
    error: Any = msgspec.UNSET
    object: Any = None
    message: Any = msgspec.UNSET


_STRICT = msgspec.json.Decoder(_Answer)


def _decode(raw: bytes | str, findings: list[str]) -> tuple[_Answer | None, bool, str | None]:
    """One answer or event decoded: (the typed answer, whether it held a spelled non-finite number, why it is no
    answer). Findings go to ``findings``; nothing raises."""
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
            return None, False, f"not JSON: {exc}: {_shown(raw)}"
        nonfinite = True
    if not isinstance(doc, dict):
        return None, nonfinite, f"not a JSON object: {_shown(raw)}"
    try:
        return _lenient(doc, findings), nonfinite, None
    except _Malformed as exc:
        return None, nonfinite, str(exc)


def _lenient(doc: dict[str, Any], findings: list[str]) -> _Answer:
    """An answer the strict decoder refused, read field by field: each count, token id, logprob and fingerprint
    that does not fit is a finding and dropped; the rest must fit its type, or ``_Malformed`` says where not."""
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
            _Answer,
        )
    except msgspec.ValidationError as exc:
        raise _Malformed(str(exc)) from None
    answer.usage = _usage(doc.get("usage"), findings)
    answer.timings = _timings(doc.get("timings"), findings)
    fingerprint = doc.get("system_fingerprint")
    if fingerprint is not None and not isinstance(fingerprint, str):
        findings.append(f"system_fingerprint: expected a string, got {_shown(fingerprint)}")
        fingerprint = None
    answer.system_fingerprint = fingerprint
    answer.tokens = _token_ids(doc.get("tokens"), "tokens", findings)
    for choice, given in zip(answer.choices or (), choices or (), strict=True):
        choice.logprobs = _logprobs(given.get("logprobs"), findings)
        choice.token_ids = _token_ids(given.get("token_ids"), "choices[].token_ids", findings)
    return answer


def _shown(value: Any) -> str:
    """A wrong value as its finding shows it: repr, at most ``_SHOWN`` characters."""
    return shortened(repr(value), _SHOWN)


def _count(value: Any, where: str, findings: list[str]) -> int | None:
    if value is None or (type(value) is int and 0 <= value < COUNT_CAP):
        return value
    findings.append(f"{where}: expected an integer from 0 to {COUNT_CAP - 1}, got {_shown(value)}")
    return None


def _object(value: Any, where: str, findings: list[str]) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    findings.append(f"{where}: expected an object, got {_shown(value)}")
    return None


def _usage(value: Any, findings: list[str]) -> _Usage | None:
    usage = _object(value, "usage", findings)
    if usage is None:
        return None
    details = _object(usage.get("prompt_tokens_details"), "usage.prompt_tokens_details", findings)
    return _Usage(
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


def _timings(value: Any, findings: list[str]) -> _Timings | None:
    timings = _object(value, "timings", findings)
    return (
        None
        if timings is None
        else _Timings(_count(timings.get("cache_n"), "timings.cache_n", findings))
    )


def _token_ids(value: Any, where: str, findings: list[str]) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, list) and all(type(t) is int and 0 <= t < COUNT_CAP for t in value):
        return value
    findings.append(
        f"{where}: expected a list of token ids (integers from 0 to {COUNT_CAP - 1}), got "
        f"{_shown(value)}"
    )
    return None


def _logprob(value: Any, bad: list[Any]) -> float | None:
    """A logprob, None where none was given; a value that is none (a string, a bool, above ``LOGPROB_SLACK``) goes
    to ``bad`` and is None too."""
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
                f"{_shown(next(e for e in content if not isinstance(e, dict)))}"
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
            findings.append(f"logprobs.token_logprobs: expected a list, got {_shown(values)}")
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
            f"{_shown(bad[0])}"
        )
    return parsed


def _token_text(token: Any) -> str | None:
    return token if token is None or isinstance(token, str) else str(token)


def _token_limit(body: dict[str, Any]) -> int | None:
    """The most completion tokens the request allows, or None where it sets no limit.

    vLLM stops a sequence once it holds max_tokens output tokens (reasoning included) and counts exactly those in
    usage.completion_tokens; llama.cpp stops once n_decoded reaches n_predict (its max_tokens), transformers serve
    passes max_tokens as generate's max_new_tokens. So a completion_tokens above the request's limit is impossible.
    OpenAI's newer max_completion_tokens, where a scenario's params set it too, is the other name of the limit: the
    larger one bounds the count."""
    limits = [
        v
        for v in (body.get("max_tokens"), body.get("max_completion_tokens"))
        if type(v) is int and v > 0
    ]
    return max(limits) if limits else None


async def _read_whole(
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
    answer, acc.nonfinite, why = _decode(raw, acc.findings)
    if answer is None:
        return failed("malformed", f"body is {why}")
    if _is_error(answer):
        return failed("server_error", f"error object: {_error_text(answer)}")
    choice = _first_choice(answer)
    if choice is None:
        return failed("malformed", "no choices in the response")
    try:
        acc.take_message(choice, api)
    except _Malformed as exc:
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


async def _read_stream(
    body: AsyncIterator[bytes],
    read: Callable[[], Awaitable[bytes]],
    content_type: str,
    api: str,
    t_send: float,
    t_first_byte: float,
    after_chunks: int | None = None,
    seen: list[int] | None = None,
    ended: Callable[[], None] | None = None,
    *,
    token_limit: int | None = None,
) -> Outcome:
    """``after_chunks``: return ``cancelled`` once that many chunks carried a piece of the answer and no end of it was
    read (the caller then closes the connection); ``seen[0]`` follows the chunks read, for a cut by time to report;
    ``ended`` is called once the answer's end is read (a cut by time no longer applies)."""
    if "text/event-stream" not in content_type:
        await read()
        return Outcome(
            status="malformed",
            t_send=t_send,
            t_first_byte=t_first_byte,
            t_last_byte=time.perf_counter(),
            error=f"content type {content_type!r}, expected text/event-stream",
        )
    parser = SSEParser()
    acc = _Accumulator(token_limit)
    finish_reason = None
    done = False
    t_first_token: float | None = None
    t_prev = 0.0  # read only once a first token set it
    max_gap = 0.0
    chunks = 0

    def failed(status: str, why: str, now: float) -> Outcome:
        return Outcome(
            status=status, t_send=t_send, t_first_byte=t_first_byte, t_last_byte=now, error=why
        )

    try:
        async for raw in body:
            now = time.perf_counter()
            for event, data in parser.feed(raw):
                if event == "error":
                    # However the server words it (with an "error" key or not), this event ends the
                    # answer.
                    return failed("server_error", f"error event: {data[:200]!r}", now)
                if not data:
                    continue  # an event without data (a named keep-alive) carries nothing
                if data == "[DONE]":
                    done = True
                    continue
                answer, nonfinite, why = _decode(data, acc.findings)
                if answer is None:
                    return failed("malformed", f"event is {why}", now)
                acc.nonfinite = acc.nonfinite or nonfinite
                if _is_error(answer):
                    return failed("server_error", f"error event: {_error_text(answer)}", now)
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
                    if seen is not None:
                        seen[0] = chunks
                finish_reason = choice.finish_reason or finish_reason
            # Cut once the events of this read are taken: an answer whose end came with its cut-off
            # chunk (vLLM's
            # last token carries its finish_reason) or in the same read is whole, not cancelled.
            if ended is not None and (finish_reason is not None or done):
                ended()
                ended = None
            if (
                after_chunks is not None
                and chunks >= after_chunks
                and finish_reason is None
                and not done
            ):
                return Outcome(
                    status=CANCELLED,
                    t_send=t_send,
                    t_first_byte=t_first_byte,
                    t_first_token=t_first_token,
                    t_last_byte=now,
                    chunks=chunks,
                    error=f"cut by kevload after {chunks} chunks (load.cancel_after_tokens)",
                )
    except (SSEError, _Malformed) as exc:
        return failed("malformed", str(exc), time.perf_counter())
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


def _nonfinite_json(raw: bytes | str) -> Any:
    """A body orjson refused, read again where the refusal was a non-finite number; None otherwise.

    Python servers write a float that is not finite as ``NaN``, ``Infinity`` or ``-Infinity``
    (``json.dumps``' default: aiohttp, Flask, FastAPI), which orjson refuses, as it refuses a number
    too large for a double. The standard library reads both. Its reading is kept only when it found
    such a number and holds nothing else orjson refuses (lone surrogates); integers beyond 64 bits
    become floats, as orjson reads them. Called only after orjson failed: the usual body pays nothing.
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


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is rare from inference servers and is ignored)."""
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None


def _is_error(answer: _Answer) -> bool:
    """An error object in place of an answer: ``{"error": …}`` (OpenAI, SGLang) or ``{"object": "error"}`` (vLLM)."""
    return (answer.error is not msgspec.UNSET or answer.object == "error") and not answer.choices


def _error_text(answer: _Answer) -> str:
    error = answer.error if answer.error is not msgspec.UNSET else answer.message
    if isinstance(error, dict) and "message" in error:
        error = error["message"]
    return str(None if error is msgspec.UNSET else error)[:200]


def _first_choice(answer: _Answer) -> _Choice | None:
    """Choice 0: a server that sends other choices too (``n`` is refused at load) cannot mix them into it."""
    for choice in answer.choices or ():
        if choice.index == 0:
            return choice
    return None


def _reasoning(message: _Message) -> str | None:
    # A server that fills both fields fills them with the same text, so one of them is the
    # reasoning.
    return message.reasoning_content or message.reasoning


def _arguments(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        # Arguments sent as a JSON object rather than a string: compared in one canonical spelling.
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    raise _Malformed(f"tool call arguments are not a string: {_shown(value)}")


def _tool_call_parts(calls: list[_Call] | None) -> list[tuple[int | None, str | None, str | None]]:
    """(index, name, arguments) of each tool call or tool-call delta; the call ``id`` is left out
    because servers make it up afresh for every request."""
    parts = []
    for call in calls or ():
        function = call.function or _Function()
        parts.append(
            (
                call.index if type(call.index) is int else None,
                function.name,
                _arguments(function.arguments),
            )
        )
    return parts


class _Accumulator:
    """Collects the whole answer (content, reasoning, tool calls) from one message or many stream deltas,
    and what servers return besides it: usage, fingerprint, token ids, logprobs, and the findings on them."""

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
        self.usage: _Usage | None = None
        self.fingerprint: str | None = None
        self.token_ids: list[int] | None = None
        self.logprobs: list[float | None] | None = None
        self.tokens: list[str] | None = None
        # Token ids beside the logprobs (llama.cpp's "id"); None once a piece came without them.
        self.logprob_ids: list[int] | None = []
        # A piece was read with non-finite numbers (``_nonfinite_json``): only then can a logprob be
        # -inf, inf or NaN.
        self.nonfinite = False
        self.timings: _Timings | None = (
            None  # llama.cpp's: its cache_n is the prompt tokens it reused
        )
        self.findings: list[str] = []
        self.token_limit = (
            token_limit  # the request's max_tokens: no completion_tokens count can be above it
        )

    def take_message(self, choice: _Choice, api: str) -> None:
        """A whole (non-streamed) choice."""
        if _answers_in_text(choice, api):
            self.content.append(choice.text or "")
            return
        message = choice.message
        if message is None:
            raise _Malformed("the choice has no message object")
        self.content.append(message.content or "")
        self.reasoning.append(_reasoning(message) or "")
        for position, (_, name, arguments) in enumerate(_tool_call_parts(message.tool_calls)):
            self.calls[position] = [name or "", [arguments or ""]]

    def take_delta(self, choice: _Choice, api: str) -> bool:
        """One stream chunk's choice; True when it carried a piece of the answer."""
        if _answers_in_text(choice, api):
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
            # Without
            # an index, a delta naming a function starts the next call and any other continues the
            # last.
            if index is None:
                index = (max(self.calls) + bool(name)) if self.calls else 0
            call = self.calls.setdefault(index, ["", []])
            if name and not call[0]:
                call[0] = name
            if arguments:
                call[1].append(arguments)
            carried = carried or bool(name or arguments)
        return carried

    def take_extras(self, answer: _Answer, choice: _Choice | None) -> None:
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
        if finish_reason in _FAILED_FINISH:
            status, error = _FAILED_FINISH[finish_reason], f"finish_reason {finish_reason!r}"
        elif finish_reason is None and not complete:
            status, error = "truncated", "stream ended without a finish_reason or [DONE]"
        elif finish_reason is None and not (output or reasoning or tool_calls):
            # An empty answer is a real answer only when the server says how it ended.
            status, error = "malformed", "no content, reasoning or tool calls, and no finish_reason"
        else:
            status, error = "ok", None
        usage = self.usage or _Usage()
        completion_tokens = usage.completion_tokens
        if (
            completion_tokens is not None
            and self.token_limit is not None
            and completion_tokens > self.token_limit
        ):
            self.findings.append(
                f"usage.completion_tokens: expected at most the request's max_tokens "
                f"({self.token_limit}), got {completion_tokens}"
            )
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


def _cached_tokens(usage: _Usage, timings: _Timings | None) -> int | None:
    """Prompt tokens the server says it reused from its cache, from whichever of the two it sends."""
    details = usage.prompt_tokens_details
    if details is not None and details.cached_tokens is not None:
        return details.cached_tokens
    return timings.cache_n if timings is not None else None
