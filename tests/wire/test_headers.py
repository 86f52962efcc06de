"""Header values and the API key are never stored: run.json keeps the names, error texts are
scrubbed, resume asks for them again."""

from __future__ import annotations

import json

import pytest
from aiohttp import web

from kevload.outputs.html import run_report
from kevload.records.store import read_records
from kevload.records.summary import RunSummary
from tests.conftest import load_summary, run_cli, write_scenario
from tests.fakeserver import FakeServer

# Names no "sensitive header" pattern catches, each with a value that must not leak.
HEADERS = {
    "Ocp-Apim-Subscription-Key": "ocp-val-5e81c0d2aa",
    "X-Auth": "xauth-val-77b3f1e9",
    "X-Access-Key": "xaccess-val-c4d21a06",
    "X-Custom": "xcustom-val-9f0e3b58",
}

SECRET = "sk-kevload-test-7f3a9c1e55d24b"  # an API key, read from the environment
HEADER_SECRET = "hdr-kevload-test-91ab77c0"


class EchoHeaders(FakeServer):
    """Answers its first request with a 401 that echoes every request header, as some gateways
    do."""

    def __init__(self):
        super().__init__()
        self.seen_headers: list[dict[str, str]] = []

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.seen_headers.append(dict(request.headers))
        if len(self.seen_headers) == 1:
            return web.json_response({"error": f"denied: {dict(request.headers)}"}, status=401)
        return await super()._handle(request)


@pytest.fixture
def echo_server():
    with EchoHeaders() as fake:
        yield fake


def _leaks(text: str) -> list[str]:
    return [name for name, value in HEADERS.items() if value in text]


def test_no_header_value_lands_anywhere(tmp_path, echo_server):
    scenario = write_scenario(
        tmp_path / "s.toml",
        echo_server.url,
        concurrency=[1],
        samples=3,
        max_error_share=1.0,
        logprobs=False,
        target={"headers": HEADERS},
    )
    out = tmp_path / "run"
    printed = [run_cli("run", scenario, "--out", out)[1]]
    assert all(
        seen.get(name) == value
        for seen in echo_server.seen_headers
        for name, value in HEADERS.items()
    )
    for fmt in ("table", "json", "markdown", "html"):
        printed.append(run_cli("report", out, "--format", fmt)[1])
    run_cli("report", out, "--format", "html", "-o", out / "report.html")
    printed.append(run_cli("run", "--resume", out)[1])
    errors = [r["error"] for r in read_records(out / "records.jsonl") if r["error"]]
    assert (
        errors and "X-Custom" in errors[0] and "***" in errors[0]
    )  # the echo was kept, its values scrubbed
    meta = json.loads((out / "run.json").read_text())
    assert meta["scenario"]["target"]["headers"] == dict.fromkeys(
        HEADERS, "***"
    )  # the names stay on record
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"run.json", "records.jsonl", "summary.json", "report.html"}
    for path in files:
        assert not _leaks(path.read_text(errors="replace")), path
    for text in printed:
        assert not _leaks(text), text


def test_resume_asks_for_the_header_values_again(tmp_path, echo_server):
    echo_server.seen_headers.append({})  # no 401 this time
    scenario = write_scenario(
        tmp_path / "s.toml",
        echo_server.url,
        concurrency=[1],
        samples=2,
        logprobs=False,
        target={"headers": HEADERS},
    )
    out = tmp_path / "run"
    assert run_cli("run", scenario, "--out", out, "--quiet")[0] == 0
    code, output = run_cli("run", "--resume", out, "--set", "load.samples=4")
    assert code == 2 and "Traceback" not in output
    assert output.count("\n") == 1 and "X-Auth" in output and "rerun the scenario file" in output
    assert """--set 'target.headers.Ocp-Apim-Subscription-Key="…"'""" in output

    sent_before = len(echo_server.seen_headers)
    again = [
        arg
        for name, value in HEADERS.items()
        for arg in ("--set", f'target.headers.{name}="{value}"')
    ]
    code, output = run_cli("run", "--resume", out, "--set", "load.samples=4", *again, "--quiet")
    assert code == 0, output
    resumed = echo_server.seen_headers[sent_before:]
    assert len(resumed) == 2 and all(
        seen.get("X-Custom") == HEADERS["X-Custom"] for seen in resumed
    )
    assert load_summary(out)["requests"] == 4
    for path in out.rglob("*"):
        assert not _leaks(path.read_text(errors="replace")), path


def test_a_prompt_that_contains_a_header_value_is_kept_whole(tmp_path, server):
    # Values are masked by name, not replaced as substrings: run.json's prompts feed resume and
    # `cases build`.
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=1,
        target={"headers": {"X-Env": "prod"}},
        probes=[{"id": "p1", "prompt": "Describe the product.", "max_tokens": 8}],
    )
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["scenario"]["probes"][0]["prompt"] == "Describe the product."
    assert meta["scenario"]["target"]["headers"] == {"X-Env": "***"}


def test_html_masks_header_values_of_an_older_run_json():
    # run.json files written before values stopped being stored may hold them; the report must not
    # show them.
    meta = {"run_id": "r", "scenario": {"target": {"headers": dict(HEADERS)}}}
    summary = RunSummary(verdict="deterministic")
    page = run_report(summary, meta, [])
    assert not _leaks(page) and "X-Access-Key" in page


def test_secret_never_lands_anywhere(tmp_path, server, monkeypatch):
    monkeypatch.setenv("KEVLOAD_SECRET_KEY", SECRET)
    server.behaviour.faults = ["echo_auth", None, None]
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=3,
        max_error_share=1.0,
        target={"api_key_env": "KEVLOAD_SECRET_KEY", "headers": {"X-Api-Key": HEADER_SECRET}},
    )
    out = tmp_path / "run"
    printed = [run_cli("run", scenario, "--out", out)[1]]
    assert server.requests and f"Bearer {SECRET}" not in json.dumps(
        server.requests
    )  # key goes in a header only
    for fmt in ("table", "json", "markdown"):
        printed.append(run_cli("report", out, "--format", fmt)[1])
    run_cli("report", out, "--format", "html", "-o", out / "report.html")
    run_cli(
        "run", scenario, "--out", tmp_path / "junit-run", "--junit", out / "junit.xml", "--quiet"
    )
    errors = [r["error"] for r in read_records(out / "records.jsonl") if r["error"]]
    assert errors and "***" in errors[0]  # the echoed key was scrubbed, the evidence kept
    for path in [*out.rglob("*"), *(tmp_path / "junit-run").rglob("*")]:
        if path.is_file():
            text = path.read_text(errors="replace")
            assert SECRET not in text and HEADER_SECRET not in text, path
    for text in printed:
        assert SECRET not in text and HEADER_SECRET not in text
