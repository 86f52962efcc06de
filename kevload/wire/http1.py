"""A lean HTTP/1.1 transport for plain-http targets: keep-alive connections on asyncio protocols.

The profile of kevload against a zero-cost endpoint put most of the client's time in aiohttp's
per-request machinery; a load generator must not be the bottleneck it measures, so plain-http
requests go through this small client (https goes through aiohttp). Responses are parsed by
httptools (llhttp, the parser uvicorn and aiohttp use); this module keeps only the connection
rules: a pool of keep-alive connections, one idle timer per wait ("no byte for T seconds"), reuse
only after a clean, complete response, and one resend on a fresh connection when a reused one
turns out to be closed.

Requests are written in bursts (``LeanTransport.write``): the first made in an event-loop turn goes
at once, those made after it in the same turn together, ``BURST`` at a time or when the turn is
over. Written one by one, each write woke the idle server, which on shared cores preempted the
client in the middle of its turn: a write took 15 µs of wall time for 7 µs of CPU, against 4.5 µs
for 4.3 in bursts (nginx, c=64).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

import httptools

from kevload.wire.transport import (
    MAX_HEAD_BYTES,
    BadResponse,
    ConnectFailed,
    ConnectionReset,
    Endpoint,
    ReadTimeout,
    TooLarge,
    TransportError,
)

# Requests written together at most: enough that the server is woken once for many, few enough that
# a request waits for no more than BURST - 1 others to be made. Measured in-run at nginx, c=64,
# alternated with one write each: 8 ran 1.30×, a request waiting 0.11 ms at the median and 0.74 ms
# at the 99th percentile between being made and written; a whole turn (about 32) ran 1.34× for waits
# of 0.95 and 2.3 ms. The first request of a turn goes at once: one alone in its turn (c=1) would
# otherwise wait for the turn's end, and ran 30 % slower so.
BURST = 8


class LeanTransport:
    """Keep-alive connections to one host:port; a connection is reused only after a clean, full
    response."""

    def __init__(self, endpoint: Endpoint):
        parts = urlsplit(endpoint.url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.timeout = endpoint.timeout
        self.max_body = endpoint.max_response_bytes
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.rpartition("@")[2]  # userinfo never goes into Host
        headers = "".join(f"{k}: {v}\r\n" for k, v in endpoint.headers.items())
        if not any(k.lower() == "accept-encoding" for k in endpoint.headers):
            # Without this header any content coding is acceptable (RFC 9110 §12.5.3), and a gzipped
            # answer, which this client does not decode, would be recorded as malformed.
            headers += "Accept-Encoding: identity\r\n"
        self._head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{headers}".encode("latin-1")
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._outgoing: list[tuple[_Connection, bytes]] = []  # requests made, not written yet
        self._flush_queued = False

    async def send(self, body: bytes, headers: Mapping[str, str] | None = None) -> _Response:
        """Send one request on an idle connection, or a new one.

        A reused connection that closes before any byte of the response arrived had been closed by
        the server while idle (uvicorn's keep-alive timeout, proxies, servers that close after each
        answer without saying so): the request is resent once on a fresh connection and counted in
        ``reconnects`` (RFC 9112 §9.3.1). A fresh connection's failure is never retried: that would
        hide a server that drops requests.
        """
        extra = (
            "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
            if headers
            else b""
        )
        # Built once: a resend on a fresh connection below carries the same bytes, request id
        # included.
        payload = self._head + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body
        reconnects = 0
        while self._idle:
            conn = self._idle.pop()
            if not conn.usable():
                self.discard(conn)
                continue
            try:
                return await conn.request(payload, self, 0)
            except ConnectionReset:
                if conn.bytes_in:
                    raise
                reconnects = 1
                break
        conn = await self._connect(reconnects)
        return await conn.request(payload, self, reconnects)

    def write(self, conn: _Connection, payload: bytes) -> None:
        """``payload`` goes out on ``conn``: at once if it is the first of this loop turn, else with
        the requests made after that one, once ``BURST`` are waiting or when the turn is over."""
        if not self._flush_queued:
            self._flush_queued = True
            conn.loop.call_soon(self._turn_over)
            transport = conn.transport
            assert transport is not None  # taken open (new, or usable()), with no await since
            transport.write(payload)
            return
        outgoing = self._outgoing
        outgoing.append((conn, payload))
        if len(outgoing) >= BURST:
            self._flush()

    def _turn_over(self) -> None:
        self._flush_queued = False
        self._flush()

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        for conn, payload in outgoing:
            # A request cut or failed meanwhile (its connection closed, or the server's close
            # already seen) is not sent: its caller has the error, and a reused connection's request
            # goes again on a fresh one.
            transport = conn.transport
            if transport is not None and conn.error is None and not transport.is_closing():
                transport.write(payload)

    def release(self, conn: _Connection) -> None:
        if conn.usable():
            self._idle.append(conn)
        else:
            self.discard(conn)

    def discard(self, conn: _Connection) -> None:
        conn.close()
        self._all.discard(conn)

    async def aclose(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()

    async def _connect(self, reconnects: int) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(loop, self.timeout, self.max_body), self.host, self.port
                ),
                self.timeout,
            )
        except TimeoutError:
            raise ConnectFailed(
                f"connect to {self.host}:{self.port} timed out after {self.timeout:g} s",
                reconnects=reconnects,
            ) from None
        except OSError as exc:
            raise ConnectFailed(
                f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}",
                reconnects=reconnects,
            ) from None
        self._all.add(conn)
        return conn


class _Response:
    """Status and headers, then the body, read as it arrives (``chunks``) or whole (``read``)."""

    __slots__ = ("status", "reason", "headers", "reconnects", "_conn", "_pool", "_done")

    def __init__(self, conn: _Connection, pool: LeanTransport, reconnects: int):
        self.status = conn.status
        self.reason = conn.reason.decode("latin-1")
        self.headers = conn.headers
        self.reconnects = reconnects
        self._conn = conn
        self._pool = pool
        self._done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        try:
            while True:
                data = await conn.next_body()
                if data is None:
                    break
                yield data
        except BaseException:
            self._finish(reuse=False)
            raise
        self._finish(reuse=True)

    async def read(self) -> bytes:
        # The loop of ``chunks`` without an async generator: a whole body is read once per
        # non-streamed request.
        conn, parts = self._conn, []
        try:
            while (data := await conn.next_body()) is not None:
                parts.append(data)
        except BaseException:
            # The error is kept on the connection with its traceback, and so with this frame: let
            # the bytes go.
            parts.clear()
            self._finish(reuse=False)
            raise
        self._finish(reuse=True)
        return b"".join(parts)

    def close(self) -> None:
        """Abandon the body (a connection with unread bytes is never reused)."""
        if not self._done:
            self._finish(reuse=False)

    def _finish(self, reuse: bool) -> None:
        if self._done:
            return
        self._done = True
        if reuse:
            self._pool.release(self._conn)
        else:
            self._pool.discard(self._conn)


class _State(enum.Enum):
    """Where a connection is in its request/response cycle (httpcore's ``HTTPConnectionState``)."""

    # open, no response outstanding: reused if the last response kept the connection alive
    IDLE = "idle"
    HEAD = "head"  # a request sent, its response's head not complete yet
    BODY = "body"  # the head in, the body arriving
    # ended with no response outstanding (a close-delimited body ends so): never reused
    CLOSED = "closed"


class _Stop(Exception):
    """Raised in a parser callback to stop parsing; the reason is already in
    ``_Connection.error``."""


class _Connection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float, max_body: int):
        self.loop = loop
        self.timeout = timeout
        self.max_body = max_body
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        # Bare LF line ends in the status line and headers: some small servers send them.
        self.parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True)
        self.reconnects = 0
        self.status = 0
        self.reason = b""
        self.headers: dict[str, str] = {}
        self.head_size = 0  # this head's bytes, as the callbacks saw them
        self.head_fed = 0  # bytes fed while the head was still open
        self.state = _State.IDLE
        self.until_close = False  # body delimited by the end of the connection
        self.body: list[bytes] = []
        self.body_size = 0
        self.bytes_in = 0  # bytes received since the request went out
        # A failure of the response in progress; an end of the connection in the middle of one is
        # one too.
        self.error: TransportError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.keep_alive = True  # the connection may take another request once this response is in
        self.last_data = 0.0
        self.timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_connection's transport, a Transport; asyncio.Protocol's signature says
        # BaseTransport.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_data = self.loop.time()
        if self.state is not _State.HEAD and self.state is not _State.BODY:
            # Bytes nobody asked for: the connection is out of step, never reuse it.
            self.keep_alive = False
            return
        self.bytes_in += len(data)
        if self.state is _State.HEAD:
            self.head_fed += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            # Bytes after a complete response only spoil the connection, not the response.
            self.keep_alive = False
            # feed_data's callbacks move the state on: mypy keeps the narrowing from above.
            idle = self.state is _State.IDLE  # type: ignore[comparison-overlap]
            if self.error is None and not idle:
                self.error = BadResponse(f"bad response: {exc}", reconnects=self.reconnects)
        # httptools holds an unfinished header line itself: count the bytes fed while the head is
        # open.
        if self.state is _State.HEAD and self.head_fed > MAX_HEAD_BYTES and self.error is None:
            self.error = BadResponse(
                f"response headers larger than {MAX_HEAD_BYTES} bytes", reconnects=self.reconnects
            )
        if self.error is not None:
            # Nothing more is read from a connection that broke its framing or ran past the limit.
            self.close()
        self._wake()

    def eof_received(self) -> bool:
        self._ended()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended()
        self.transport = None

    # --- httptools callbacks ---

    def on_message_begin(self) -> None:
        if self.state is not _State.HEAD:
            # A second response after the one asked for: out of step.
            self.keep_alive = False
            raise _Stop
        self.reason = b""
        self.headers = {}
        self.head_size = 0

    def on_status(self, reason: bytes) -> None:
        self.reason += reason
        self.head_size += len(reason)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        # The limit holds for a head that arrived complete in one read too.
        if self.head_size > MAX_HEAD_BYTES:
            self.error = BadResponse(
                f"response headers larger than {MAX_HEAD_BYTES} bytes", reconnects=self.reconnects
            )
            raise _Stop
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            return  # 100 Continue, 103 Early Hints: interim, the real response follows
        self.status = status
        self.state = _State.BODY
        self.keep_alive = self.parser.should_keep_alive()
        headers = self.headers
        self.until_close = (
            "content-length" not in headers
            and status not in (204, 304)
            and "chunked" not in headers.get("transfer-encoding", "").lower()
        )

    def on_body(self, data: bytes) -> None:
        self.body_size += len(data)
        if self.body_size > self.max_body:
            self.error = TooLarge(
                f"response body over {self.max_body} bytes", reconnects=self.reconnects
            )
            raise _Stop
        self.body.append(data)

    def on_message_complete(self) -> None:
        if self.state is _State.BODY:  # not an interim response's end
            self.state = _State.IDLE

    # --- requests ---

    def usable(self) -> bool:
        return (
            self.state is _State.IDLE
            and self.transport is not None
            and self.keep_alive
            and self.error is None
        )

    async def request(self, payload: bytes, pool: LeanTransport, reconnects: int) -> _Response:
        self.reconnects = reconnects
        self.state = _State.HEAD
        self.body, self.body_size, self.bytes_in, self.head_fed = [], 0, 0, 0
        pool.write(self, payload)
        try:
            while self.state is _State.HEAD:
                if self.error is not None:
                    raise self.error
                await self._wait()
        except BaseException:
            # A failure, a timeout or a cancel: close the connection, so the server sees the abort.
            pool.discard(self)
            raise
        return _Response(self, pool, reconnects)

    async def next_body(self) -> bytes | None:
        while True:
            if self.body:
                data = b"".join(self.body)
                self.body.clear()
                return data
            if self.error is not None:
                raise self.error
            if self.state is not _State.BODY:
                return None
            await self._wait()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self.keep_alive = False

    # --- internals ---

    def _ended(self) -> None:
        """The peer closed, or the connection was lost: a response in progress is cut, unless the
        close is what ends its body."""
        self.keep_alive = False
        if self.state is _State.BODY and self.until_close and self.error is None:
            self.state = _State.CLOSED
        elif self.state is _State.HEAD and self.error is None:
            self.error = ConnectionReset(
                "connection closed before the response headers", reconnects=self.reconnects
            )
        elif self.state is _State.BODY and self.error is None:
            self.error = ConnectionReset(
                "connection closed in the middle of the response body", reconnects=self.reconnects
            )
        elif self.state is _State.IDLE:
            self.state = _State.CLOSED
        self._wake()

    async def _wait(self) -> None:
        self.waiter = self.loop.create_future()
        self.last_data = self.loop.time()
        self.timer = self.loop.call_at(self.last_data + self.timeout, self._check_timeout)
        try:
            await self.waiter
        finally:
            self.timer.cancel()
            self.waiter = None

    def _check_timeout(self) -> None:
        # One timer per wait, pushed back by data instead of re-armed on every read.
        idle = self.loop.time() - self.last_data
        if idle >= self.timeout:
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_exception(
                    ReadTimeout(f"no byte for {self.timeout:g} s", reconnects=self.reconnects)
                )
        else:
            self.timer = self.loop.call_at(self.last_data + self.timeout, self._check_timeout)

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)
