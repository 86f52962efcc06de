"""A lean HTTP/1.1 client for plain-http targets: keep-alive connections on asyncio protocols.

The profile of kevload against a zero-cost endpoint put most of the client's time in aiohttp's
per-request machinery; a load generator must not be the bottleneck it measures, so plain-http
requests go through this small client (https still goes through aiohttp). It speaks exactly what
an OpenAI-compatible exchange needs: one POST, a Content-Length, chunked or close-delimited
response body, read incrementally, with a "no byte for T seconds" timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class HTTPError(Exception):
    """Base of this module's transport errors."""


class ConnectFailed(HTTPError):
    pass


class ConnectionReset(HTTPError):
    pass


class ReadTimeout(HTTPError):
    pass


class BadResponse(HTTPError):
    pass


class Pool:
    """Keep-alive connections to one host:port; a connection is reused only after a clean, full response."""

    def __init__(self, url: str, timeout: float):
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.host_header = parts.netloc.encode()
        self.timeout = timeout
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()

    async def post(self, path: str, headers: bytes, body: bytes) -> Response:
        """Send one request on an idle connection, or a new one.

        A reset before any response byte is reported, never retried, even on a reused connection:
        a silent retry would hide a server that drops requests. Connections the server closed while
        idle are noticed (EOF) and dropped before reuse.
        """
        head = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + self.host_header + b"\r\n" + headers + \
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return await conn.request(head + body, self)
            self.discard(conn)
        conn = await self._connect()
        return await conn.request(head + body, self)

    def release(self, conn: _Connection) -> None:
        if conn.usable():
            self._idle.append(conn)
        else:
            self.discard(conn)

    def discard(self, conn: _Connection) -> None:
        conn.close()
        self._all.discard(conn)

    def close(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop, self.timeout), self.host, self.port),
                self.timeout)
        except TimeoutError:
            raise ConnectFailed(f"connect to {self.host}:{self.port} timed out after {self.timeout:g} s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from None
        self._all.add(conn)
        return conn


class Response:
    """Status and headers, then the body, read as it arrives (``chunks``) or whole (``read``)."""

    __slots__ = ("status", "reason", "headers", "_conn", "_pool", "_done")

    def __init__(self, status: int, reason: str, headers: dict[str, str], conn: _Connection, pool: Pool):
        self.status = status
        self.reason = reason
        self.headers = headers
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
        parts = [data async for data in self.chunks()]
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


class _Connection(asyncio.Protocol):
    # Parser states
    _HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float):
        self.loop = loop
        self.timeout = timeout
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.state = self._DONE
        self.remaining = 0
        self.body: list[bytes] = []
        self.eof = False
        self.error: Exception | None = None
        self.waiter: asyncio.Future | None = None
        self.head: tuple[int, str, dict[str, str]] | None = None
        self.keep_alive = True
        self.last_data = 0.0
        self.timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_data = self.loop.time()
        self.buffer += data
        try:
            self._parse()
        except BadResponse as exc:
            self.error = exc
            self.keep_alive = False
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self.keep_alive = False
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.keep_alive = False
        self.transport = None
        self._wake()

    # --- requests ---

    def usable(self) -> bool:
        return self.transport is not None and not self.eof and self.keep_alive and self.state == self._DONE

    async def request(self, payload: bytes, pool: Pool) -> Response:
        self.state, self.head, self.body = self._HEAD, None, []
        self.buffer.clear()
        self.transport.write(payload)
        while self.head is None:
            if self.error is not None:
                pool.discard(self)
                raise self.error
            if self.eof:
                pool.discard(self)
                raise ConnectionReset("connection closed before the response headers")
            try:
                await self._wait()
            except ReadTimeout:
                pool.discard(self)
                raise
        status, reason, headers = self.head
        return Response(status, reason, headers, self, pool)

    async def next_body(self) -> bytes | None:
        while True:
            if self.body:
                data = b"".join(self.body)
                self.body.clear()
                return data
            if self.error is not None:
                raise self.error
            if self.state == self._DONE:
                return None
            if self.eof:
                if self.state == self._UNTIL_CLOSE:
                    self.state = self._DONE
                    return None
                raise ConnectionReset("connection closed in the middle of the response body")
            await self._wait()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self.keep_alive = False

    # --- internals ---

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
                self.waiter.set_exception(ReadTimeout(f"no byte for {self.timeout:g} s"))
        else:
            self.timer = self.loop.call_at(self.last_data + self.timeout, self._check_timeout)

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _parse(self) -> None:
        buf = self.buffer
        while buf:
            state = self.state
            if state == self._HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > 65536:
                        raise BadResponse("response headers larger than 64 KiB")
                    return
                self._head(bytes(buf[:end]))
                del buf[:end + 4]
            elif state == self._LENGTH:
                self._take_body(self._DONE)
            elif state == self._CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                size_text = bytes(buf[:end]).split(b";", 1)[0].strip()
                try:
                    self.remaining = int(size_text, 16)
                except ValueError:
                    raise BadResponse(f"bad chunk size {size_text[:20]!r}") from None
                del buf[:end + 2]
                self.state = self._CHUNK_DATA if self.remaining else self._TRAILER
            elif state == self._CHUNK_DATA:
                self._take_body(self._CHUNK_END)
            elif state == self._CHUNK_END:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise BadResponse("chunk not followed by CRLF")
                del buf[:2]
                self.state = self._CHUNK_SIZE
            elif state == self._TRAILER:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                del buf[:end + 2]
                if end == 0:
                    self.state = self._DONE
            elif state == self._UNTIL_CLOSE:
                self.body.append(bytes(buf))
                buf.clear()
            else:
                # Bytes after a complete response: the connection is out of step, never reuse it.
                self.keep_alive = False
                buf.clear()

    def _take_body(self, then: int) -> None:
        """Move up to ``remaining`` body bytes from the buffer to the body; switch to ``then`` when done."""
        buf = self.buffer
        take = min(self.remaining, len(buf))
        self.body.append(bytes(buf[:take]))
        del buf[:take]
        self.remaining -= take
        if self.remaining == 0:
            self.state = then

    def _head(self, raw: bytes) -> None:
        lines = raw.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise BadResponse(f"not an HTTP/1.x response: {lines[0][:60]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise BadResponse(f"bad status line {lines[0][:60]!r}") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if sep:
                headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        if parts[0] == b"HTTP/1.0" or headers.get("connection", "").lower() == "close":
            self.keep_alive = False
        self.head = (status, parts[2].decode("latin-1") if len(parts) > 2 else "", headers)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = self._CHUNK_SIZE
        elif "content-length" in headers:
            try:
                self.remaining = int(headers["content-length"])
            except ValueError:
                raise BadResponse(f"bad Content-Length {headers['content-length'][:20]!r}") from None
            self.state = self._LENGTH if self.remaining else self._DONE
        elif status in (204, 304) or 100 <= status < 200:
            self.state = self._DONE
        else:
            self.state = self._UNTIL_CLOSE
            self.keep_alive = False
