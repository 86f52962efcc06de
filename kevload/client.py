"""One OpenAI-compatible exchange (chat or completions, streaming or not) into an ``Outcome``."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from kevload.http1 import LeanTransport
from kevload.scenario import Probe, Target
from kevload.sse import SSEError, SSEParser
from kevload.store import secret_header_values, url_secrets, url_userinfo
from kevload.transport import AiohttpTransport, Endpoint, Response, Transport, TransportError


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
    logprobs: list[float] | None = None
    tokens: list[str] | None = None
    system_fingerprint: str | None = None
    chunks: int = 0
    max_gap: float | None = None
    http_status: int | None = None
    retry_after: float | None = None
    error: str | None = None
    reconnects: int = 0             # 1: resent on a fresh connection after a reused one had closed


def build_body(target: Target, item: Probe, params: dict[str, Any], *, stream: bool,
               nonce: str | None) -> dict[str, Any]:
    """The JSON body for one request: the user's params verbatim, plus model, input and stream flags."""
    body: dict[str, Any] = {"model": target.model}
    if target.api == "chat":
        body["messages"] = list(item.messages) if item.messages else [{"role": "user", "content": item.prompt}]
    else:
        body["prompt"] = item.prompt if item.prompt is not None else "\n".join(m["content"] for m in item.messages)
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


class Client:
    """One connection pool shared by every request of a run, on a ``Transport``.

    The backend is the constructor's choice: ``transport="lean"`` (kevload's HTTP/1.1 client,
    plain http only), ``"aiohttp"``, or a ready ``Transport``. Left out, plain-http targets use the
    lean client and https targets aiohttp; a user can force aiohttp with ``KEVLOAD_HTTP=aiohttp``.
    Transports raise only ``TransportError``s, whose ``status`` goes into the record as it is.
    """

    def __init__(self, target: Target, api_key: str | None, *, limit: int = 0,
                 transport: str | Transport | None = None):
        self.target = target
        base, basic = url_userinfo(target.base_url)
        parts = urlsplit(base)
        path = parts.path.rstrip("/") + ("/chat/completions" if target.api == "chat" else "/completions")
        # The query stays after the path (Azure's ?api-version=…).
        self.url = urlunsplit(parts._replace(path=path))
        # Error texts can echo request headers back (some gateways do): scrub every credential.
        self._secrets = [s for s in [api_key, *secret_header_values(target.headers), *url_secrets(target.base_url)]
                         if s]
        headers = {"Content-Type": "application/json", **target.headers}
        if basic:
            headers["Authorization"] = f"Basic {basic}"
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._endpoint = Endpoint(url=self.url, headers=headers, timeout=target.timeout,
                                  max_response_bytes=target.max_response_bytes, limit=limit)
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
        elif self._choice == "aiohttp":
            self._transport = AiohttpTransport(self._endpoint)
        else:
            self._transport = self._choice
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._transport is not None:
            await self._transport.aclose()
            self._transport = None

    async def send(self, body: dict[str, Any]) -> Outcome:
        assert self._transport is not None, "use Client as an async context manager"
        payload = orjson.dumps(body)
        stream = bool(body.get("stream"))
        t_send = time.perf_counter()
        if self._max_seconds is None:
            return await self._exchange(payload, stream, t_send, [])
        deadline = asyncio.timeout(self._max_seconds)
        reconnects: list[int] = []
        try:
            async with deadline:
                return await self._exchange(payload, stream, t_send, reconnects)
        except TimeoutError:
            if not deadline.expired():
                raise
            return self._failed("timeout", t_send, f"no complete answer within target.max_seconds = "
                                f"{self._max_seconds:g} s", sum(reconnects))

    async def _exchange(self, payload: bytes, stream: bool, t_send: float, reconnects: list[int]) -> Outcome:
        try:
            response = await self._transport.send(payload)
            reconnects.append(response.reconnects)
            try:
                outcome = await self._answer(response, stream, t_send)
            finally:
                # Also on a cancel or the max_seconds cut: closing tells the server to stop.
                response.close()
        except TransportError as exc:
            return self._failed(exc.status, t_send, str(exc), exc.reconnects)
        return replace(outcome, reconnects=response.reconnects) if response.reconnects else outcome

    async def _answer(self, response: Response, stream: bool, t_send: float) -> Outcome:
        t_first_byte = time.perf_counter()
        status, headers = response.status, response.headers
        if status != 200:
            text = (await response.read())[:400].decode("utf-8", "replace")
            return Outcome(status=f"http_{status}", t_send=t_send, t_first_byte=t_first_byte,
                           t_last_byte=time.perf_counter(), http_status=status,
                           retry_after=_retry_after(headers.get("retry-after")),
                           error=self._scrub(text.strip()) or response.reason)
        content_type = headers.get("content-type", "")
        if stream:
            return await _read_stream(response.chunks(), response.read, content_type, self.target.api, t_send,
                                      t_first_byte)
        return await _read_whole(await response.read(), content_type, self.target.api, t_send, t_first_byte)

    def _failed(self, status: str, t_send: float, error: str, reconnects: int) -> Outcome:
        return Outcome(status=status, t_send=t_send, t_last_byte=time.perf_counter(), error=self._scrub(error),
                       reconnects=reconnects)

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


async def _read_whole(raw: bytes, content_type: str, api: str, t_send: float, t_first_byte: float) -> Outcome:
    t_last = time.perf_counter()

    def bad(why: str) -> Outcome:
        return Outcome(status="malformed", t_send=t_send, t_first_byte=t_first_byte, t_last_byte=t_last, error=why)

    if "json" not in content_type:
        return bad(f"content type {content_type!r}, expected application/json")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return bad(f"body is not JSON: {exc}")
    choice = _first_choice(doc)
    if choice is None:
        return bad("no choices in the response")
    text = _choice_text(choice, api, delta=False)
    if text is None:
        return bad("the choice has no text")
    acc = _Accumulator()
    acc.take_extras(doc, choice)
    return acc.outcome(status="ok", output=text, finish_reason=choice.get("finish_reason"), t_send=t_send,
                       t_first_byte=t_first_byte, t_first_token=t_last, t_last_byte=t_last)


async def _read_stream(body: AsyncIterator[bytes], read: Callable[[], Awaitable[bytes]], content_type: str,
                       api: str, t_send: float, t_first_byte: float) -> Outcome:
    if "text/event-stream" not in content_type:
        await read()
        return Outcome(status="malformed", t_send=t_send, t_first_byte=t_first_byte, t_last_byte=time.perf_counter(),
                       error=f"content type {content_type!r}, expected text/event-stream")
    parser = SSEParser()
    acc = _Accumulator()
    parts: list[str] = []
    finish_reason = None
    done = False
    t_first_token = t_prev = None
    max_gap = 0.0
    chunks = 0
    try:
        async for raw in body:
            now = time.perf_counter()
            for data in parser.feed(raw):
                if data == "[DONE]":
                    done = True
                    continue
                try:
                    doc = orjson.loads(data)
                except orjson.JSONDecodeError as exc:
                    return Outcome(status="malformed", t_send=t_send, t_first_byte=t_first_byte, t_last_byte=now,
                                   error=f"event is not JSON: {exc}: {data[:80]!r}")
                if not isinstance(doc, dict):
                    return Outcome(status="malformed", t_send=t_send, t_first_byte=t_first_byte, t_last_byte=now,
                                   error=f"event is not a JSON object: {data[:80]!r}")
                if "error" in doc and not doc.get("choices"):
                    return Outcome(status="malformed", t_send=t_send, t_first_byte=t_first_byte, t_last_byte=now,
                                   error=f"error event: {str(doc['error'])[:200]}")
                choice = _first_choice(doc)
                acc.take_extras(doc, choice)
                if choice is None:
                    continue
                piece = _choice_text(choice, api, delta=True)
                if piece:
                    parts.append(piece)
                    chunks += 1
                    if t_first_token is None:
                        t_first_token = now
                    else:
                        max_gap = max(max_gap, now - t_prev)
                    t_prev = now
                if choice.get("finish_reason"):
                    finish_reason = choice["finish_reason"]
    except SSEError as exc:
        return Outcome(status="malformed", t_send=t_send, t_first_byte=t_first_byte, t_last_byte=time.perf_counter(),
                       error=str(exc))
    t_last = time.perf_counter()
    parser.close()
    # Either end marker proves the stream finished: some servers (transformers serve) never send [DONE].
    if finish_reason is None and not done:
        return Outcome(status="truncated", t_send=t_send, t_first_byte=t_first_byte, t_first_token=t_first_token,
                       t_last_byte=t_last, output="".join(parts), chunks=chunks,
                       error="stream ended without a finish_reason or [DONE]")
    return acc.outcome(status="ok", output="".join(parts), finish_reason=finish_reason, t_send=t_send,
                       t_first_byte=t_first_byte, t_first_token=t_first_token or t_last, t_last_byte=t_last,
                       chunks=chunks, max_gap=max_gap if chunks > 1 else None)


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is rare from inference servers and is ignored)."""
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None


def _first_choice(doc: Any) -> dict[str, Any] | None:
    if not isinstance(doc, dict):
        return None
    choices = doc.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def _choice_text(choice: dict[str, Any], api: str, *, delta: bool) -> str | None:
    if api == "completions" or "text" in choice:
        text = choice.get("text")
    else:
        message = choice.get("delta" if delta else "message") or {}
        text = message.get("content") if isinstance(message, dict) else None
        if text is None and delta:
            return ""
    return text if isinstance(text, str) else None


class _Accumulator:
    """Collects what servers return besides the text: usage, fingerprint, token ids, logprobs."""

    __slots__ = ("usage", "fingerprint", "token_ids", "logprobs", "tokens")

    def __init__(self) -> None:
        self.usage: dict[str, Any] | None = None
        self.fingerprint: str | None = None
        self.token_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        self.tokens: list[str] | None = None

    def take_extras(self, doc: dict[str, Any], choice: dict[str, Any] | None) -> None:
        if isinstance(doc.get("usage"), dict):
            self.usage = doc["usage"]
        if doc.get("system_fingerprint"):
            self.fingerprint = str(doc["system_fingerprint"])
        if choice is None:
            return
        ids = choice.get("token_ids")
        if ids is None:
            ids = doc.get("tokens")
        if isinstance(ids, list) and all(isinstance(t, int) for t in ids):
            self.token_ids = (self.token_ids or []) + ids
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            if isinstance(logprobs.get("content"), list):
                entries = [e for e in logprobs["content"] if isinstance(e, dict)]
                self._extend([e.get("token") for e in entries], [e.get("logprob") for e in entries])
            elif isinstance(logprobs.get("tokens"), list):
                self._extend(logprobs["tokens"], logprobs.get("token_logprobs") or [])

    def _extend(self, tokens: list[Any], logprobs: list[Any]) -> None:
        self.tokens = (self.tokens or []) + [str(t) for t in tokens]
        self.logprobs = (self.logprobs or []) + [float(x) if isinstance(x, (int, float)) else None for x in logprobs]

    def outcome(self, **fields: Any) -> Outcome:
        usage = self.usage or {}
        return Outcome(prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
                       token_ids=self.token_ids, logprobs=self.logprobs, tokens=self.tokens,
                       system_fingerprint=self.fingerprint, **fields)
