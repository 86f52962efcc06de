"""A plain HTTP proxy that keeps every raw response body: the tests' independent view of a real
server."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.error
import urllib.request


class RecordingProxy:
    """Forwards POSTs to ``upstream`` (an http://host:port root) and stores (request body, response
    body); GETs (/metrics, /health) are forwarded and not stored."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[tuple[dict, bytes]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = urllib.request.Request(
                    proxy.upstream + self.path,
                    data=body,
                    headers={"Content-Type": "application/json"},
                )
                try:
                    with urllib.request.urlopen(request, timeout=300) as response:
                        status, payload = response.status, response.read()
                        kind = response.headers.get("Content-Type", "application/json")
                except urllib.error.HTTPError as exc:
                    status, payload, kind = exc.code, exc.read(), "application/json"
                with proxy._lock:
                    # A POST without a JSON body (vLLM's /reset_prefix_cache) is kept as {}.
                    proxy.exchanges.append((json.loads(body) if body.strip() else {}, payload))
                self.send_response(status)
                # A stream stays one (text/event-stream), read whole here and sent on at once.
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                try:
                    with urllib.request.urlopen(proxy.upstream + self.path, timeout=30) as response:
                        status, payload = response.status, response.read()
                        kind = response.headers.get("Content-Type", "text/plain")
                except urllib.error.HTTPError as exc:
                    status, payload, kind = exc.code, exc.read(), "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
