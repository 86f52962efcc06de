"""How bytes move: the ``Transport`` interface, the failure statuses it raises, and its aiohttp
backend.

A transport sends one POST to the endpoint it was built for and hands back the status, the
headers and a body to read whole or as a stream of byte chunks. Each backend maps its own
exceptions to a ``TransportError`` at its boundary (as httpx maps httpcore's), so the client
above never sees aiohttp or socket exception types: ``exc.status`` is the record's status.

Backends: the lean HTTP/1.1 client in ``http1`` (plain http) and ``AiohttpTransport`` here (https).
Neither uses ``HTTP(S)_PROXY``: kevload talks to the target directly.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Protocol

import aiohttp
from yarl import URL

# The most response-head bytes (status line and headers) a transport accepts.
MAX_HEAD_BYTES = 65536


class TransportError(Exception):
    """A request that produced no usable HTTP response; ``status`` is the record status it maps
    to."""

    status = "reset"

    def __init__(self, message: str, *, reconnects: int = 0):
        super().__init__(message)
        # A request resent once on a fresh connection (RFC 9112 §9.3.1) can still fail there.
        self.reconnects = reconnects


class ConnectFailed(TransportError):
    status = "connect"


class ConnectionReset(TransportError):
    status = "reset"


class ReadTimeout(TransportError):
    status = "timeout"


class BadResponse(TransportError):
    status = "malformed"


class TooLarge(TransportError):
    status = "too_large"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where every request of a run goes and what bounds it; ``url`` holds no userinfo."""

    url: str
    headers: Mapping[str, str]
    timeout: float  # seconds without a byte
    max_response_bytes: int  # body bytes past which a response is cut
    limit: int = 0  # connections (0: as many as requests in flight)


class Response(Protocol):
    status: int
    reason: str
    reconnects: int  # 1 when the request was resent on a fresh connection

    @property
    def headers(self) -> Mapping[str, str]:
        """Names in lower case."""

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises ``TransportError`` (``TooLarge`` past the endpoint's
        limit)."""

    async def read(self) -> bytes:
        """The whole body."""

    def close(self) -> None:
        """Done with the response: a connection whose body was read in full is kept, any other is
        closed."""


class Transport(Protocol):
    async def send(self, body: bytes, headers: Mapping[str, str] | None = None) -> Response:
        """POST ``body`` with ``headers`` besides the endpoint's (the same on a resend) and return
        once the response head is in; raises ``TransportError``."""

    async def aclose(self) -> None:
        """Close every connection."""


# aiohttp exception → kevload status, most specific first.
_AIOHTTP_ERRORS: tuple[tuple[type[BaseException], type[TransportError]], ...] = (
    (aiohttp.ServerTimeoutError, ReadTimeout),
    (aiohttp.ClientConnectorError, ConnectFailed),
    (aiohttp.ServerDisconnectedError, ConnectionReset),
    (aiohttp.ClientPayloadError, ConnectionReset),
    (aiohttp.ClientOSError, ConnectionReset),
    (ConnectionResetError, ConnectionReset),
    (aiohttp.ClientResponseError, BadResponse),
    (aiohttp.ClientError, ConnectionReset),
)


@contextlib.contextmanager
def _aiohttp_errors(timeout: float, reconnects: int = 0) -> Iterator[None]:
    try:
        yield
    except TransportError:
        raise
    except Exception as exc:
        target = next(
            (mapped for source, mapped in _AIOHTTP_ERRORS if isinstance(exc, source)), None
        )
        if target is None:
            raise
        if target is ReadTimeout:
            message = f"no byte for {timeout:g} s"
        else:
            message = f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
        if isinstance(exc, aiohttp.ClientPayloadError) and _malformed_payload(exc):
            target = BadResponse
        raise target(message, reconnects=reconnects) from exc


def _malformed_payload(exc: aiohttp.ClientPayloadError) -> bool:
    """A body that breaks its framing (a bad chunk size) is malformed; one that stops short is a
    reset."""
    cause = exc.__cause__ or exc.__context__
    return (
        "chunk" in str(cause or exc).lower() and "not enough data" not in str(cause or exc).lower()
    )


class AiohttpTransport:
    """aiohttp for https targets (or any target with ``KEVLOAD_HTTP=aiohttp``)."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        # encoded=True: the URL goes out byte for byte as the user wrote it (a query such as
        # ?api-version=… included), never re-quoted.
        self._url = URL(endpoint.url, encoded=True)
        self._session = self._new_session(force_close=False)
        self._fresh: aiohttp.ClientSession | None = None

    def _new_session(self, *, force_close: bool) -> aiohttp.ClientSession:
        e = self.endpoint
        trace = aiohttp.TraceConfig()
        trace.on_connection_reuseconn.append(_mark_reused)
        connector = aiohttp.TCPConnector(limit=e.limit, ttl_dns_cache=None, force_close=force_close)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=e.timeout, sock_read=e.timeout)
        # trust_env stays False: proxies from the environment are not used (docs/running.md says
        # so).
        # The head limit both backends share; aiohttp's own default stops at 8190 bytes per header
        # line.
        return aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            headers=dict(e.headers),
            trace_configs=[trace],
            max_line_size=MAX_HEAD_BYTES,
            max_field_size=MAX_HEAD_BYTES,
        )

    async def send(self, body: bytes, headers: Mapping[str, str] | None = None) -> Response:
        seen = SimpleNamespace(reused=False)
        try:
            with _aiohttp_errors(self.endpoint.timeout):
                response = await self._session.post(
                    self._url, data=body, headers=headers, trace_request_ctx=seen
                )
        except ConnectionReset as exc:
            # A reused connection the server had closed: the request never reached it (RFC 9112
            # §9.3.1), so it goes once more on a connection opened for it; a fresh connection's
            # failure stands.
            if not (seen.reused and _nothing_arrived(exc)):
                raise
            if self._fresh is None:
                self._fresh = self._new_session(force_close=True)
            with _aiohttp_errors(self.endpoint.timeout, reconnects=1):
                response = await self._fresh.post(self._url, data=body, headers=headers)
            return _AiohttpResponse(response, self.endpoint, reconnects=1)
        return _AiohttpResponse(response, self.endpoint, reconnects=0)

    async def aclose(self) -> None:
        await self._session.close()
        if self._fresh is not None:
            await self._fresh.close()


def _nothing_arrived(exc: ConnectionReset) -> bool:
    """Whether the connection ended before any byte of the response (aiohttp keeps a started
    head)."""
    cause = exc.__cause__
    if isinstance(cause, aiohttp.ServerDisconnectedError):
        return isinstance(cause.message, str)
    return isinstance(cause, aiohttp.ClientOSError) and cause.errno in (
        errno.ECONNRESET,
        errno.EPIPE,
    )


async def _mark_reused(
    session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object
) -> None:
    if ctx.trace_request_ctx is not None:
        ctx.trace_request_ctx.reused = True


class _AiohttpResponse:
    __slots__ = ("status", "reason", "headers", "reconnects", "_response", "_endpoint", "_complete")

    def __init__(self, response: aiohttp.ClientResponse, endpoint: Endpoint, reconnects: int):
        self.status = response.status
        self.reason = response.reason or ""
        self.headers = {k.lower(): v for k, v in response.headers.items()}
        self.reconnects = reconnects
        self._response = response
        self._endpoint = endpoint
        self._complete = False

    async def chunks(self) -> AsyncIterator[bytes]:
        limit = self._endpoint.max_response_bytes
        seen = 0
        with _aiohttp_errors(self._endpoint.timeout, self.reconnects):
            async for data in self._response.content.iter_any():
                seen += len(data)
                if seen > limit:
                    self._response.close()
                    raise TooLarge(f"response body over {limit} bytes", reconnects=self.reconnects)
                yield data
        self._complete = True

    async def read(self) -> bytes:
        return b"".join([data async for data in self.chunks()])

    def close(self) -> None:
        if self._complete:
            self._response.release()
        else:
            self._response.close()
