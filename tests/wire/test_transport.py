"""Both transports (lean HTTP/1.1 and aiohttp) against raw servers built to break HTTP clients.

Each server here shows one way a healthy or hostile server behaves that once gave a wrong record:
keep-alive connections closed without notice, interim responses, bare LF, negative lengths, huge
heads, runaway bodies, credentials and queries in the base URL, cancelled requests.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import resource
import threading

import pytest

from kevload.inputs.scenariokeys import Target
from kevload.records.store import read_records
from kevload.wire.client import Client
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario

BACKENDS = ["lean", "aiohttp"]
BODY = b'{"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}'
OK = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY)
    + BODY
)
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": False}


class RawServer:
    """An asyncio TCP server on 127.0.0.1 in its own thread, so both a test's event loop and the CLI
    can use it.

    ``handler(reader, writer, server)`` serves one connection; ``connections`` and ``requests``
    count what arrived, ``heads`` keeps each request head.
    """

    def __init__(self, handler):
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.aborted = threading.Event()  # a client closed its connection while the handler waited
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._tasks: set[asyncio.Task] = set()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.server = self.loop.run_until_complete(
                asyncio.start_server(self._serve, "127.0.0.1", 0)
            )
            self.port = self.server.sockets[0].getsockname()[1]
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def url(self, tail: str = "/v1") -> str:
        return f"http://127.0.0.1:{self.port}{tail}"

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        self._tasks.add(asyncio.current_task())
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(asyncio.current_task())
            writer.close()

    async def read_request(self, reader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        self.heads.append(head)
        return head

    def stop(self) -> None:
        async def shutdown() -> None:
            self.server.close()
            for task in list(self._tasks):
                task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def target(url: str, **extra) -> Target:
    return Target(base_url=url, model="m", timeout=extra.pop("timeout", 5.0), **extra)


async def exchange(url: str, backend: str, count: int = 1, **extra):
    async with Client(target(url, **extra), None, transport=backend) as client:
        return [await client.send(REQUEST) for _ in range(count)]


def run(coro):
    return asyncio.run(coro)


# --- healthy servers must not be reported as failed
# ------------------------------------------------


async def answer_once_then_drop(reader, writer, server):
    """Answers the first request of a connection without ``Connection: close``, then closes the
    connection on the next one without a byte: what a client meets when its request crosses the
    server's keep-alive timeout (uvicorn, proxies) or a server that closes after every answer."""
    await server.read_request(reader)
    writer.write(OK)
    await writer.drain()
    await server.read_request(reader)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reused_connection_closed_by_the_server_is_resent_once(backend):
    with RawServer(answer_once_then_drop) as server:
        outcomes = run(exchange(server.url(), backend, count=6))
    assert [o.status for o in outcomes] == ["ok"] * 6, [o.error for o in outcomes]
    reconnects = [o.reconnects for o in outcomes]
    # Every reuse met a closed connection; aiohttp keeps no resend connection, so its next request
    # starts fresh.
    assert reconnects == ([0, 1, 1, 1, 1, 1] if backend == "lean" else [0, 1, 0, 1, 0, 1])
    assert len(server.heads) == 6 + sum(reconnects) and server.connections == 6


@pytest.mark.parametrize("backend", BACKENDS)
def test_fresh_connection_failure_stays_an_error(backend):
    async def drop(reader, writer, server):
        await server.read_request(reader)

    with RawServer(drop) as server:
        outcomes = run(exchange(server.url(), backend, count=3))
    assert [o.status for o in outcomes] == ["reset"] * 3
    assert [o.reconnects for o in outcomes] == [0, 0, 0]
    assert len(server.heads) == 3, "a request on a fresh connection must never be sent twice"


@pytest.mark.parametrize("backend", BACKENDS)
def test_reconnects_are_counted_per_cell(tmp_path, backend, monkeypatch):
    monkeypatch.setenv("KEVLOAD_HTTP", backend)
    with RawServer(answer_once_then_drop) as server:
        scenario = write_scenario(
            tmp_path / "s.toml", server.url(), concurrency=[1], samples=5, nonce=False
        )
        code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    assert [r["status"] for r in records] == ["ok"] * 5
    reconnects = 4 if backend == "lean" else 2  # see the test above
    assert sum(r["reconnects"] for r in records) == reconnects
    cell = cells_by_level(load_summary(tmp_path / "run"))[1]
    assert cell["reconnects"] == reconnects and cell["errors"] == {}


def replying(raw: bytes):
    async def handler(reader, writer, server):
        await server.read_request(reader)
        writer.write(raw)
        await writer.drain()
        await reader.read()  # hold the connection until the client is done with it

    return handler


@pytest.mark.parametrize("backend", BACKENDS)
def test_interim_responses_are_skipped(backend):
    raw = (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n" + OK
    )
    with RawServer(replying(raw)) as server:
        [outcome] = run(exchange(server.url(), backend))
    assert (outcome.status, outcome.output) == ("ok", "hi"), outcome.error


@pytest.mark.parametrize("backend", BACKENDS)
def test_bare_lf_response_parses(backend):
    raw = OK.replace(b"\r\n", b"\n")
    with RawServer(replying(raw)) as server:
        [outcome] = run(exchange(server.url(), backend))
    assert (outcome.status, outcome.output) == ("ok", "hi"), outcome.error


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "raw",
    [
        # Read as "all but the last 5 bytes", this once made a short success of BODY.
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: -5\r\n\r\n"
        + BODY
        + b"extra",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: "
        b"chunked\r\n\r\n-5\r\n" + BODY + b"\r\n0\r\n\r\n",
    ],
    ids=["content-length", "chunk-size"],
)
def test_negative_length_is_malformed(backend, raw):
    with RawServer(replying(raw)) as server:
        [outcome] = run(exchange(server.url(), backend))
    assert outcome.status == "malformed", (outcome.status, outcome.error)


@pytest.mark.parametrize("backend", BACKENDS)
def test_head_size_limit_holds_for_a_complete_head(backend):
    headers = b"".join(
        b"X-Filler-%d: %s\r\n" % (i, b"v" * 400) for i in range(200)
    )  # 80 KB, sent whole
    raw = OK.replace(b"\r\n\r\n", b"\r\n" + headers + b"\r\n", 1)
    with RawServer(replying(raw)) as server:
        [outcome] = run(exchange(server.url(), backend))
    assert outcome.status == "malformed", (outcome.status, outcome.error)


def _answer_with(extra_head: bytes, body: bytes):
    async def handler(reader, writer, server):
        while True:
            await server.read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + extra_head
                + b"Content-Length: %d\r\n\r\n" % len(body)
                + body
            )
            await writer.drain()

    return handler


@pytest.mark.parametrize("backend", ["lean", "aiohttp"])
def test_gzip_answer_to_a_request_without_accept_encoding(backend):
    """RFC 9110 §12.5.3: a request without Accept-Encoding accepts any content coding, so a server
    (or a proxy in front of it) may gzip its answers. The lean client sent no Accept-Encoding, got
    gzip and recorded every answer as 'malformed' (exit 3, target failed); aiohttp decompressed
    them."""

    async def gzip_unless_refused(reader, writer, server):
        while True:
            head = (await server.read_request(reader)).lower()
            # As a gzip-ing proxy does: every coding is fine unless the client names the ones it
            # takes.
            asked = head.partition(b"accept-encoding:")[2].split(b"\r\n")[0]
            zipped = b"accept-encoding:" not in head or b"gzip" in asked
            body = gzip.compress(BODY) if zipped else BODY
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + (b"Content-Encoding: gzip\r\n" if zipped else b"")
                + b"Content-Length: %d\r\n\r\n" % len(body)
                + body
            )
            await writer.drain()

    with RawServer(gzip_unless_refused) as server:
        outcomes = run(exchange(server.url(), backend, count=2))
    assert [(o.status, o.output) for o in outcomes] == [("ok", "hi")] * 2, [
        o.error for o in outcomes
    ]


@pytest.mark.parametrize("backend", ["lean", "aiohttp"])
def test_a_large_response_header_within_the_head_limit(backend):
    """transport.MAX_HEAD_BYTES (64 KiB) is 'the most response-head bytes a transport accepts'.
    aiohttp stopped at 8190 bytes per header line, so a 12 kB header (a debug or cookie header
    behind a gateway) made every https answer 'malformed' while the lean client took it."""
    with RawServer(_answer_with(b"X-Debug: " + b"a" * 12000 + b"\r\n", BODY)) as server:
        outcomes = run(exchange(server.url(), backend, count=2))
    assert [(o.status, o.output) for o in outcomes] == [("ok", "hi")] * 2, [
        o.error for o in outcomes
    ]


# --- a cancelled request closes its connection ----------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("phase", ["head", "body"])
def test_cancel_closes_the_connection(backend, phase):
    arrived = threading.Event()

    async def slow(reader, writer, server):
        await server.read_request(reader)
        if phase == "body":
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: "
                b"chunked\r\n\r\n"
                b'2\r\n{"\r\n'
            )
            await writer.drain()
        arrived.set()
        # The client's close is an EOF here; a client that keeps the socket open leaves this
        # waiting.
        if await asyncio.wait_for(reader.read(), 20) == b"":
            server.aborted.set()

    async def main(server):
        async with Client(target(server.url(), timeout=30), None, transport=backend) as client:
            task = asyncio.create_task(client.send(REQUEST))
            while not arrived.is_set():
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The client is still open: only the cancel may have closed the connection.
            return await asyncio.to_thread(server.aborted.wait, 10)

    with RawServer(slow) as server:
        assert run(main(server)), "the server never saw the cancelled request's connection close"


# --- credentials and queries in base_url ---------------------------------------------------------


def echo_head(status: bytes = b"200 OK"):
    async def handler(reader, writer, server):
        while True:
            head = await server.read_request(reader)
            text = json.dumps(head.decode("latin-1"))
            body = (
                b'{"choices": [{"message": {"content": %s}, "finish_reason": "stop"}]}'
                % text.encode()
            )
            writer.write(
                b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % (status, len(body))
                + body
            )
            await writer.drain()

    return handler


@pytest.mark.parametrize("backend", BACKENDS)
def test_query_in_base_url_follows_the_path(backend):
    with RawServer(echo_head()) as server:
        [outcome] = run(exchange(server.url("/openai/v1?api-version=2024-02-01"), backend))
    assert outcome.status == "ok", outcome.error
    assert server.heads[0].startswith(
        b"POST /openai/v1/chat/completions?api-version=2024-02-01 HTTP/1.1\r\n"
    )


PASSWORD = "s3cr%40t-pw"  # percent-encoded "s3cr@t-pw"


@pytest.mark.parametrize("backend", BACKENDS)
def test_userinfo_is_sent_as_basic_auth_never_in_host(backend):
    with RawServer(echo_head(b"401 Unauthorized")) as server:
        [outcome] = run(exchange(f"http://alice:{PASSWORD}@127.0.0.1:{server.port}/v1", backend))
    head = server.heads[0].decode("latin-1")
    token = base64.b64encode(b"alice:s3cr@t-pw").decode()
    assert f"\r\nHost: 127.0.0.1:{server.port}\r\n" in head
    assert f"Authorization: Basic {token}" in head
    # The server echoed the request head in its error: the credential is scrubbed from the record.
    assert outcome.status == "http_401"
    assert token not in outcome.error and "s3cr" not in outcome.error and "***" in outcome.error


def test_userinfo_never_lands_in_the_run_directory(tmp_path):
    async def ok_forever(reader, writer, server):
        while True:
            await server.read_request(reader)
            writer.write(OK)
            await writer.drain()

    with RawServer(ok_forever) as server:
        url = f"http://alice:{PASSWORD}@127.0.0.1:{server.port}/v1"
        scenario = write_scenario(tmp_path / "s.toml", url, concurrency=[1], samples=2)
        code, printed = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 0, printed
    token = base64.b64encode(b"alice:s3cr@t-pw").decode()
    assert all(f"Authorization: Basic {token}".encode() in head for head in server.heads)
    for secret in (PASSWORD, "s3cr@t", token):
        assert secret not in printed
        for path in (tmp_path / "run").rglob("*"):
            assert secret not in path.read_text(errors="replace"), (path.name, secret)
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["target"]["base_url"] == f"http://***@127.0.0.1:{server.port}/v1"


def test_bad_base_url_error_hides_the_password(tmp_path):
    scenario = write_scenario(tmp_path / "s.toml", f"ftp://alice:{PASSWORD}@example.com/v1")
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and "target.base_url" in output and "s3cr" not in output


# --- a runaway server: max_response_bytes and max_seconds
# -------------------------------------------

FIFTY_MB = 50 * 2**20


async def fifty_megabytes(reader, writer, server):
    while True:
        await server.read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % FIFTY_MB
        )
        block = b"x" * 65536
        for _ in range(FIFTY_MB // len(block)):
            writer.write(block)
            await writer.drain()


@pytest.mark.parametrize("backend", BACKENDS)
def test_runaway_answers_are_cut_and_stay_small(tmp_path, backend, monkeypatch):
    monkeypatch.setenv("KEVLOAD_HTTP", backend)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with RawServer(fifty_megabytes) as server:
        scenario = write_scenario(
            tmp_path / "s.toml", server.url(), concurrency=[1, 4], samples=4, max_error_share=1.0
        )
        run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    assert len(records) >= 8 and {r["status"] for r in records} == {"too_large"}
    assert (tmp_path / "run" / "records.jsonl").stat().st_size < 100_000
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss_before
    assert grown < 100, f"peak RSS grew by {grown:.0f} MB"
    assert server.connections >= len(records), "a cut response's connection must not be reused"


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_response_bytes_is_the_cut(backend):
    with RawServer(replying(OK)) as server:
        [small] = run(exchange(server.url(), backend, max_response_bytes=len(BODY)))
        [cut] = run(exchange(server.url(), backend, max_response_bytes=len(BODY) - 1))
    assert small.status == "ok" and cut.status == "too_large"


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_seconds_ends_a_never_ending_stream(backend):
    async def endless(reader, writer, server):
        await server.read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
            b"chunked\r\n\r\n"
        )
        event = b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'
        while True:  # a token every 50 ms, never a finish: the idle timeout never fires
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.05)

    async def main(server):
        async with Client(
            target(server.url(), timeout=5, max_seconds=0.5), None, transport=backend
        ) as client:
            return await asyncio.wait_for(client.send({**REQUEST, "stream": True}), 20)

    with RawServer(endless) as server:
        outcome = run(main(server))
    assert outcome.status == "timeout" and "max_seconds" in outcome.error
    assert outcome.t_last_byte - outcome.t_send < 5


def test_limits_are_validated(tmp_path):
    for key, value in (("max_response_bytes", 0), ("max_seconds", -1)):
        scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", target={key: value})
        code, output = run_cli("run", scenario)
        assert code == 2 and f"target.{key}" in output, output


def test_lean_refuses_https():
    with pytest.raises(ValueError, match="plain http"):
        Client(target("https://127.0.0.1:1/v1"), None, transport="lean")
