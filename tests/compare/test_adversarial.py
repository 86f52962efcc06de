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
from tests.wire.test_transport import BODY, RawServer, exchange, run


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]


# --- nightly baseline -------------------------------------------------------------------------------

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
            asked = head.partition(b"accept-encoding:")[2].split(b"\r\n")[0]
            zipped = b"accept-encoding:" not in head or b"gzip" in asked
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


# --- cases: a case unstable against the serial answer ---------------------------------------------

def test_case_unstable_against_serial_stays_unstable_on_an_unchanged_server(tmp_path):
    """A server that gives one other answer whenever two requests overlap: the run's c=2 cell reads
    `1 all≠serial` (DRIFT, exit 1) and `cases build` records that case as unstable. `cases rerun` against
    the very same server sends the case at c=2 only, sees one distinct answer (the same batched one it
    recorded: `matches recorded`) and reported `unstable→stable`, exit 0: a fix that never happened. The
    rerun now sends the serial level too and judges the c=2 cell against it, as the run did."""
    with FakeServer(Behaviour(latency=0.1, drift_at=2, batched_variant=True)) as server:
        scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=4)
        assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 1
        c2 = cells_by_level(load_summary(tmp_path / "run"))[2]
        assert c2["drift"] and c2["distinct"] == 1 and not c2["agrees_with_serial"]
        cases = tmp_path / "cases.jsonl"
        assert run_cli("cases", "build", tmp_path / "run", "-o", cases)[0] == 0
        code, output = run_cli("cases", "rerun", cases, "--url", server.url, "--model", "fake", "--times", "4",
                               "-o", tmp_path / "after.jsonl", "--out", tmp_path / "reruns")
    after = {json.loads(line)["params"]["concurrency"]: json.loads(line)
             for line in (tmp_path / "after.jsonl").read_text().splitlines()}
    assert after[2]["verdict"] == "unstable"
    assert after[2]["transition"] == "unchanged", output


# --- closed loop: what "in flight" means under retries -----------------------------------------------

class _Overlap(FakeServer):
    """Notes, per request nonce, the most requests the server worked on at once while answering it."""

    def __init__(self, behaviour):
        super().__init__(behaviour)
        self.overlap: dict[str, int] = {}

    def _answer(self, body, prompt, state):
        self.overlap[body.get("user")] = state["max_overlap"]
        return super()._answer(body, prompt, state)


def test_counted_sample_is_never_alone_at_the_server_while_another_slot_backs_off(tmp_path):
    """README: 'every counted probe sample is sent with exactly c−1 other requests in flight', and
    '"In flight" means sent by kevload and not yet answered'. With --retries, a 429 is answered, yet the
    slot that got it sits out Retry-After (1 s) still counted in flight: the other slot's samples in that
    second are recorded as counted at c=2 (in_flight 1) while the server works on them alone."""
    faults = [None] * 9 + ["http_429"]
    with _Overlap(Behaviour(latency=0.3, faults=faults, retry_after="1")) as server:
        scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=6, nonce=True)
        run_cli("run", scenario, "--out", tmp_path / "run", "--quiet", "--retries", "1")
        overlap = server.overlap
    counted = [r for r in _rows(tmp_path / "run") if r["concurrency"] == 2 and r["counted"]]
    assert len(counted) == 6 and {r["in_flight"] for r in counted} == {1}
    # Overlap over the whole answer, not at arrival: a partner sent in the same instant may arrive later.
    alone = [r["seq"] for r in counted if overlap[r["params"]["user"]] < 2]
    assert not alone, f"counted c=2 samples that found the server idle: seq {alone}"


# --- resume ----------------------------------------------------------------------------------------

class _BasicAuth(FakeServer):
    """401 unless the request carries Basic user:s3cret-pw (what a base_url user:password@ stands for)."""

    def __init__(self):
        super().__init__()
        self.authorizations: list[str | None] = []

    async def _handle(self, request):
        self.authorizations.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Basic dXNlcjpzM2NyZXQtcHc=":
            return web.json_response({"error": "unauthorized"}, status=401)
        return await super()._handle(request)


def test_resume_of_a_run_with_url_credentials_never_sends_the_redacted_placeholder(tmp_path):
    """README: a user:password@ in base_url is written nowhere (***). Resuming such a run from run.json
    would send 'Basic ***:' and end 'target failed': it is refused (exit 2, one line) until the URL is
    given again, and then the real credential goes out."""
    with _BasicAuth() as server:
        url = server.url.replace("http://", "http://user:s3cret-pw@")
        scenario = write_scenario(tmp_path / "s.toml", url, concurrency=[1], samples=4)
        assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
        records = tmp_path / "run" / "records.jsonl"
        records.write_text("".join(records.read_text().splitlines(keepends=True)[:2]))  # killed after 2 answers
        before = len(server.authorizations)
        code, output = run_cli("run", "--resume", tmp_path / "run", "--quiet")
        assert code == 2 and server.authorizations[before:] == [], (code, output)
        assert output.count("\n") == 1 and "target.base_url" in output and "s3cret" not in output, output
        code, output = run_cli("run", "--resume", tmp_path / "run", "--quiet", "--set", f'target.base_url="{url}"')
        sent = server.authorizations[before:]
    assert code == 0, output
    assert sent and all(a == "Basic dXNlcjpzM2NyZXQtcHc=" for a in sent)


def test_resume_of_a_duration_run_does_not_resend_completed_levels(tmp_path, server):
    """README: '`kevload run --resume DIR` finishes an interrupted one'. A run with load.duration killed
    in its second rate level is resumed: the first level, complete on disk, is sent again for its whole
    duration, and its cell then counts both (twice the requests, a duration spanning the gap)."""
    server.behaviour.latency = 0.01
    scenario = write_scenario(tmp_path / "s.toml", server.url, rate=[8, 16], duration=1.0, samples=1)
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    records = tmp_path / "run" / "records.jsonl"
    lines = records.read_text().splitlines(keepends=True)
    first_level = [line for line in lines if json.loads(line)["rate"] == 8]
    records.write_text("".join(first_level) + "".join(lines[len(first_level):len(first_level) + 3]))
    sent_before = len(server.requests)
    run_cli("run", "--resume", tmp_path / "run", "--quiet")
    resent = [r for r in _rows(tmp_path / "run") if r["rate"] == 8]
    assert len(resent) == len(first_level), (len(resent), len(first_level), len(server.requests) - sent_before)


# --- what the summary says it counts ----------------------------------------------------------------

def test_requests_count_every_request_the_run_sent(tmp_path, server):
    """A run with two warm-ups and c=4 sends more requests than it counts as evidence (the ramp-up and
    the tail of each level): summary.json says both, and run.json's `records` is what was sent, never
    the counted number alone (which once made 26 sent requests read as 16)."""
    server.behaviour.latency = 0.05
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=8, warmup=2)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    sent = len(server.requests)
    assert code == 0 and f"({sent} requests, complete)" in output
    assert len(_rows(tmp_path / "run")) == sent
    assert json.loads((tmp_path / "run" / "run.json").read_text())["records"] == sent
    summary = load_summary(tmp_path / "run")
    assert summary["requests_sent"] == sent and summary["errors_sent_by_type"] == {}
    counted = [r for r in _rows(tmp_path / "run") if r["role"] != "warmup" and r["counted"]]
    assert summary["requests"] == len(counted) < sent
