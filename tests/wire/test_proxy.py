"""kevload talks to targets directly: proxies from the environment are never used (docs/running.md
says so)."""

from __future__ import annotations

import sys

import pytest

from kevload.servers.processes import free_port, start_server, wait_ready
from tests.wire.test_transport import BACKENDS, OK, RawServer, exchange, replying, run


def test_readiness_check_never_uses_http_proxy(tmp_path, monkeypatch):
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("http_proxy", dead)
    monkeypatch.setenv("no_proxy", "")
    port = free_port()
    server = start_server(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        tmp_path / "server.log",
    )
    try:
        wait_ready(server, f"http://127.0.0.1:{port}/", timeout=20)
    finally:
        server.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_targets_are_reached_directly_whatever_the_proxy_settings(backend, monkeypatch):
    dead = f"http://127.0.0.1:{free_port()}"
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, dead)
    with RawServer(replying(OK)) as server:
        [outcome] = run(exchange(server.url(), backend))
    assert outcome.status == "ok", outcome.error
