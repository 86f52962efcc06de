"""kevload's own HTTP/1.1 client against raw servers that answer in every framing the spec
allows."""

from __future__ import annotations

import asyncio

import pytest

from kevload.wire import transport
from kevload.wire.http1 import LeanTransport

BODY = b'{"choices": [{"message": {"content": "hi"}}]}'


async def serve(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"


async def read_request(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = int(
        next(line.split(b":")[1] for line in lines if line.lower().startswith(b"content-length"))
    )
    return head, await reader.readexactly(length)


def run(coro):
    return asyncio.run(coro)


def lean(url, timeout):
    return LeanTransport(
        transport.Endpoint(url=url, headers={}, timeout=timeout, max_response_bytes=2**20)
    )


@pytest.mark.parametrize("framing", ["length", "chunked", "close", "split"])
def test_framings(framing):
    async def handler(reader, writer):
        while True:
            try:
                await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            if framing == "length":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
            elif framing == "chunked":
                writer.write(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + b"5;ext=1\r\n"
                    + BODY[:5]
                    + b"\r\n"
                    + b"%x\r\n" % (len(BODY) - 5)
                    + BODY[5:]
                    + b"\r\n0\r\nX-Trailer: 1\r\n\r\n"
                )
            elif framing == "close":
                writer.write(b"HTTP/1.0 200 OK\r\n\r\n" + BODY)
                await writer.drain()
                writer.close()
                return
            else:  # every byte in its own write: the parser must resume anywhere
                raw = (
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % len(BODY)
                    + BODY
                    + b"\r\n0\r\n\r\n"
                )
                for i in range(len(raw)):
                    writer.write(raw[i : i + 1])
                    await writer.drain()
            await writer.drain()

    async def main():
        server, url = await serve(handler)
        pool = lean(url, timeout=5)
        bodies = []
        for _ in range(3):
            response = await pool.send(b"{}")
            bodies.append((response.status, await response.read()))
        await pool.aclose()
        server.close()
        return bodies

    assert run(main()) == [(200, BODY)] * 3


def test_keep_alive_reuses_one_connection():
    connections = []

    async def handler(reader, writer):
        connections.append(writer)
        while True:
            try:
                await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)

    async def main():
        server, url = await serve(handler)
        pool = lean(url, timeout=5)
        for _ in range(5):
            await (await pool.send(b"{}")).read()
        await pool.aclose()
        server.close()

    run(main())
    assert len(connections) == 1


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", transport.ConnectionReset),
        (b"", transport.ConnectionReset),
        (b"NOT HTTP\r\n\r\n", transport.BadResponse),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", transport.BadResponse),
        (None, transport.ReadTimeout),
    ],
)
def test_failures_are_typed(reply, error):
    async def handler(reader, writer):
        await read_request(reader)
        if reply is None:
            await asyncio.sleep(3)
        else:
            writer.write(reply)
            await writer.drain()
        writer.close()

    async def main():
        server, url = await serve(handler)
        pool = lean(url, timeout=0.3)
        try:
            with pytest.raises(error):
                await (await pool.send(b"{}")).read()
        finally:
            await pool.aclose()
            server.close()

    run(main())


def test_connect_refused():
    from kevload.servers.processes import free_port

    async def main():
        pool = lean(f"http://127.0.0.1:{free_port()}/v1", timeout=1)
        with pytest.raises(transport.ConnectFailed):
            await pool.send(b"{}")

    run(main())
