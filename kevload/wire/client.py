"""One OpenAI-compatible exchange (chat or completions, streaming or not) into an ``Outcome``: the
request's body, its cut, its connection pool; ``kevload.wire.answer`` reads the response."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import orjson

from kevload.inputs.probe import Probe
from kevload.inputs.scenariokeys import REQUEST_ID_HEADER, Target
from kevload.inputs.wordsets import CANCELLED
from kevload.records.store import url_secrets, url_userinfo
from kevload.wire.answer import Outcome, StreamCut, read_stream, read_whole
from kevload.wire.http1 import LeanTransport
from kevload.wire.transport import AiohttpTransport, Endpoint, Response, Transport, TransportError


@dataclass(frozen=True, slots=True)
class CancelAt:
    """When one request is cut: after ``after_s`` seconds from its send, or once ``after_chunks``
    streamed chunks carried a piece of the answer, whichever comes first (None: not by that
    measure)."""

    after_s: float | None = None
    after_chunks: int | None = None

    def since(self, elapsed: float) -> CancelAt:
        """The cut of a conversation's later turn, ``elapsed`` seconds after its first send: a
        conversation's seconds count from there, as a user closing the tab ends the chat at a
        moment, whatever turn it is in."""
        return (
            self
            if self.after_s is None
            else replace(self, after_s=max(self.after_s - elapsed, 0.0))
        )


def build_body(
    target: Target, item: Probe, params: dict[str, Any], *, stream: bool, nonce: str | None
) -> dict[str, Any]:
    """The JSON body for one request: the user's params verbatim, plus model, input and stream
    flags."""
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
        # values are credentials (Ocp-Apim-Subscription-Key, X-Auth, …), so every header value is
        # scrubbed, with the key.
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

        ``cancel``: the client abandons the request then (``kevload.load.cancel``), closing its
        connection as a user closing a tab does; the outcome is ``cancelled``, with the time of the
        cut and the chunks read before it."""
        assert self._transport is not None, "use Client as an async context manager"
        payload = orjson.dumps(body)
        stream = bool(body.get("stream"))
        token_limit = _token_limit(body)
        headers = {REQUEST_ID_HEADER: request_id or secrets.token_hex(8)}
        t_send = time.perf_counter()
        cut_s = cancel.after_s if cancel is not None else None
        after_chunks = cancel.after_chunks if cancel is not None else None
        if self._max_seconds is None and cut_s is None:
            cut = StreamCut(after_chunks) if after_chunks is not None else None
            return await self._exchange(payload, headers, stream, t_send, [], cut, token_limit)
        deadline = asyncio.timeout(self._max_seconds)
        clock = asyncio.timeout(cut_s)
        reconnects: list[int] = []
        # An answer whose end was read is whole: the cut's clock stops there (what follows is [DONE]
        # or the close).
        ended = (lambda: clock.reschedule(None)) if cut_s is not None else None
        cut = StreamCut(after_chunks, ended) if cancel is not None else None
        try:
            async with deadline, clock:  # the cut inside: its own expiry is told apart below
                return await self._exchange(
                    payload, headers, stream, t_send, reconnects, cut, token_limit
                )
        except TimeoutError:
            if clock.expired():
                assert cut is not None  # a cut's clock ran: cancel gave it
                why = f"cut by kevload after {cut_s:g} s (load.cancel_after_s)"
                failed = self._failed(CANCELLED, t_send, why, sum(reconnects))
                return replace(failed, chunks=cut.chunks)
            if not deadline.expired():
                raise
            why = f"no complete answer within target.max_seconds = {self._max_seconds:g} s"
            return self._failed("timeout", t_send, why, sum(reconnects))

    async def _exchange(
        self,
        payload: bytes,
        headers: dict[str, str],
        stream: bool,
        t_send: float,
        reconnects: list[int],
        cut: StreamCut | None = None,
        token_limit: int | None = None,
    ) -> Outcome:
        transport = self._transport
        assert transport is not None  # send's own check: one test of an attribute per attempt
        try:
            response = await transport.send(payload, headers)
            reconnects.append(response.reconnects)
            try:
                outcome = await self._answer(response, stream, t_send, cut, token_limit)
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
        cut: StreamCut | None = None,
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
            return await read_stream(
                response.chunks(),
                response.read,
                content_type,
                self.target.api,
                t_send,
                t_first_byte,
                cut,
                token_limit=token_limit,
            )
        return await read_whole(
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


def _token_limit(body: dict[str, Any]) -> int | None:
    """The most completion tokens the request allows, or None where it sets no limit.

    vLLM stops a sequence once it holds max_tokens output tokens (reasoning included) and counts
    exactly those in usage.completion_tokens; llama.cpp stops once n_decoded reaches n_predict (its
    max_tokens), transformers serve passes max_tokens as generate's max_new_tokens. So a
    completion_tokens above the request's limit is impossible. OpenAI's newer max_completion_tokens,
    where a scenario's params set it too, is the other name of the limit: the larger one bounds the
    count."""
    limits = [
        v
        for v in (body.get("max_tokens"), body.get("max_completion_tokens"))
        if type(v) is int and v > 0
    ]
    return max(limits) if limits else None


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is rare from inference servers and is ignored)."""
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None
