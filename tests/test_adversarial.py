"""Adversarial checks: crafted servers and inputs under which kevload once said something false.

Each test names the claim it guards. Those marked xfail(strict=True) show a finding that is not
fixed yet: the test fails today, and the mark keeps the suite green until the fix lands.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from aiohttp import web

from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer
from tests.test_transport import BODY, RawServer, exchange, run


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]


# --- nightly baseline -------------------------------------------------------------------------------

@pytest.mark.xfail(strict=True, reason="baseline.compare_to_baseline counts every output of a cell that already "
                   "drifted in the baseline as 'never seen': an unchanged server with known crosstalk exits 1")
def test_known_drift_against_its_own_baseline_is_no_news(tmp_path):
    """README: 'drift the baseline already had is not news'. The same server, run twice, with crosstalk
    at c=4 both nights: tonight's random c=4 outputs differ from last night's, and kevload calls that
    'REGRESSION unseen_output …: the model or server changed' with exit 1, although nothing changed."""
    with FakeServer(Behaviour(drift_at=3, latency=0.1)) as server:
        scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=8)
        assert run_cli("run", scenario, "--out", tmp_path / "night1", "--quiet")[0] == 1
        code, output = run_cli("run", scenario, "--out", tmp_path / "night2", "--quiet",
                               "--baseline", tmp_path / "night1")
    assert "REGRESSION" not in output, output
    assert code == 0, output


# --- transports: healthy servers reported as failed -------------------------------------------------

def _answer_with(extra_head: bytes, body: bytes):
    async def handler(reader, writer, server):
        while True:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + extra_head
                         + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
    return handler


@pytest.mark.parametrize("backend", ["lean", "aiohttp"])
def test_gzip_answer_to_a_request_without_accept_encoding(backend):
    """RFC 9110 §12.5.3: a request without Accept-Encoding accepts any content coding, so a server (or a
    proxy in front of it) may gzip its answers. The lean client sent no Accept-Encoding, got gzip and
    recorded every answer as 'malformed' (exit 3, target failed); aiohttp decompressed them."""
    async def gzip_unless_refused(reader, writer, server):
        while True:
            head = (await server.read_request(reader)).lower()
            # As a gzip-ing proxy does: every coding is fine unless the client names the ones it takes.
            zipped = b"accept-encoding:" not in head or b"gzip" in head.partition(b"accept-encoding:")[2].split(b"\r\n")[0]
            body = gzip.compress(BODY) if zipped else BODY
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         + (b"Content-Encoding: gzip\r\n" if zipped else b"")
                         + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()

    with RawServer(gzip_unless_refused) as server:
        outcomes = run(exchange(server.url(), backend, count=2))
    assert [(o.status, o.output) for o in outcomes] == [("ok", "hi")] * 2, [o.error for o in outcomes]


@pytest.mark.parametrize("backend", ["lean", "aiohttp"])
def test_a_large_response_header_within_the_head_limit(backend):
    """transport.MAX_HEAD_BYTES (64 KiB) is 'the most response-head bytes a transport accepts'. aiohttp
    stopped at 8190 bytes per header line, so a 12 kB header (a debug or cookie header behind a
    gateway) made every https answer 'malformed' while the lean client took it."""
    with RawServer(_answer_with(b"X-Debug: " + b"a" * 12000 + b"\r\n", BODY)) as server:
        outcomes = run(exchange(server.url(), backend, count=2))
    assert [(o.status, o.output) for o in outcomes] == [("ok", "hi")] * 2, [o.error for o in outcomes]


# --- datasets ---------------------------------------------------------------------------------------

def test_companion_line_with_bad_messages_is_refused_before_anything_is_sent(tmp_path, server):
    """README: 'Every line is checked before anything is sent (a bad one: exit 2 naming file:line)'.
    A companion line whose messages lack `content` passed the check; with api = "completions" the
    companion slot died on it and the probe slot then sent uncounted copies forever (the run hung,
    about 20 requests a second, no record counted)."""
    (tmp_path / "companions.jsonl").write_text('{"prompt": "fine"}\n{"messages": [{"role": "user"}]}\n')
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=2, mode="mixed",
                              companions="companions.jsonl", target={"api": "completions"})
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 2, output
    assert "companions.jsonl:2" in output and "Traceback" not in output
    assert not server.requests
