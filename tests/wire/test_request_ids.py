"""Every request carries X-Request-Id, its record keeps it as request_id, and `report --request`
finds it."""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from pathlib import Path

import pytest

from kevload.inputs.scenario import load_scenario
from kevload.load import engine
from kevload.records.rundir import RunDir
from kevload.records.store import RECORDS, read_records
from kevload.wire.client import Client
from tests.conftest import run_cli, write_scenario
from tests.load.test_stop_batches import signal_mid_level
from tests.wire.test_transport import REQUEST, RawServer, answer_once_then_drop, target

BACKENDS = ["lean", "aiohttp"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_server_sees_exactly_the_ids_the_records_hold(tmp_path, server, backend):
    server.behaviour.latency = 0.05
    server.behaviour.faults = [
        None,
        None,
        "http_429",
    ]  # the third arrival is refused once, then retried
    scenario = load_scenario(
        write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 3], samples=3, retries=1)
    )

    async def collect():
        async with Client(scenario.target, None, transport=backend) as client:
            return [r async for r in engine.run(scenario, client, run_id="run7")]

    records = asyncio.run(collect())
    ids = [r.request_id for r in records]
    assert ids == [f"run7-{r.seq}" for r in records] and len(set(ids)) == len(ids)
    # The retried request went out twice under one id; every other id arrived once; nothing arrived
    # without one.
    retried = [r.request_id for r in records if r.retries]
    assert len(retried) == 1
    assert Counter(server.request_ids) == Counter(ids + retried)
    # The nonce in the OpenAI `user` field is untouched by the header.
    assert sorted(body["user"] for body in server.requests) == sorted(
        f"kevload-{i}" for i in ids + retried
    )


def kill_and_resume(tmp_path: Path, server, run_args: list[str], resume_args: list[str]) -> None:
    """``kill -9`` mid-level, while requests are in flight that the run never records, then
    ``--resume``; the server saw every X-Request-Id and every ``user`` nonce once, and each record
    has an id of its own."""
    code, output, _ = signal_mid_level(tmp_path, server, signal.SIGKILL, *run_args)
    assert code == -signal.SIGKILL, output
    run_dir = tmp_path / "run"
    lost = len(server.visits) - len(list(RunDir(run_dir).record_dicts()))
    assert (
        lost >= 1
    )  # sent, never recorded: what a resume that numbers on from the records would send again
    assert json.loads((run_dir / "run.json").read_text())["state"] == "running"
    before = len(list(RunDir(run_dir).record_dicts()))
    code, output = run_cli("run", "--resume", run_dir, "--quiet", *resume_args)
    assert code == 0, output
    total = len(list(RunDir(run_dir).record_dicts()))
    # The closing line counts the run (as run.json does), and this part beside it.
    assert f"({total} requests, {total - before} sent by this --resume, complete)" in " ".join(
        output.split()
    )
    ids = [visit[0] for visit in server.visits]
    nonces = [visit[1] for visit in server.visits]
    assert len(set(ids)) == len(ids), [i for i, n in Counter(ids).items() if n > 1]
    assert len(set(nonces)) == len(nonces) and None not in nonces
    rows = list(RunDir(run_dir).record_dicts())
    assert len({r["request_id"] for r in rows}) == len(rows) and {
        r["request_id"] for r in rows
    } <= set(ids)
    meta = json.loads((run_dir / "run.json").read_text())
    resumed = [r for r in rows if r["request_id"].startswith(f"{meta['run_id']}-r1-")]
    assert (
        len(meta["resumed_at"]) == 1
        and resumed
        and all(r["request_id"] == f"{meta['run_id']}-r1-{r['seq']}" for r in resumed)
    )


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ids_and_nonces_stay_unique_across_a_kill_and_a_resume(tmp_path, server, workers):
    kill_and_resume(tmp_path, server, ["--workers", workers], [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resend_after_a_reconnect_keeps_the_id(backend):
    async def send_four(url):
        async with Client(target(url), None, transport=backend) as client:
            return [await client.send(REQUEST, request_id=f"id-{i}") for i in range(4)]

    with RawServer(answer_once_then_drop) as server:
        outcomes = asyncio.run(send_four(server.url()))
    assert [o.status for o in outcomes] == ["ok"] * 4
    seen = [
        line.split(b": ", 1)[1].decode()
        for head in server.heads
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"x-request-id:")
    ]
    assert len(seen) == len(server.heads)
    # A request resent on a fresh connection arrives twice, both times with its own id.
    assert seen == [f"id-{i}" for i, o in enumerate(outcomes) for _ in range(1 + o.reconnects)]
    assert sum(o.reconnects for o in outcomes) >= 2


def test_report_prints_the_record_of_a_request(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=2)
    out = tmp_path / "run"
    assert run_cli("run", scenario, "--out", out, "--quiet")[0] == 0
    records = list(read_records(out / RECORDS))
    wanted = records[len(records) // 2]
    code, output = run_cli("report", out, "--request", wanted["request_id"])
    assert code == 0 and json.loads(output) == wanted
    assert wanted["request_id"] in server.request_ids

    code, output = run_cli(
        "report", out, "--request", wanted["request_id"] + "x"
    )  # an id no request had
    assert code == 2 and output.count("\n") == 1 and "Traceback" not in output
    assert f"--request {wanted['request_id']}x: no record in" in output


def test_report_finds_the_record_of_a_request_in_every_workers_file(tmp_path, server):
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=2, workers=2
    )
    out = tmp_path / "run"
    assert run_cli("run", scenario, "--out", out, "--quiet")[0] == 0
    assert not (out / RECORDS).exists()  # records-0.jsonl and records-1.jsonl only
    for worker in (0, 1):
        wanted = next(r for r in RunDir(out).record_dicts() if r["worker"] == worker)
        code, output = run_cli("report", out, "--request", wanted["request_id"])
        assert code == 0 and json.loads(output) == wanted, output
    code, output = run_cli("report", out, "--request", "nope")
    assert (
        code == 2
        and output == f"kevload: error: --request nope: no record in {out} has that request_id\n"
    )


@pytest.mark.parametrize("name", ["X-Request-Id", "x-request-id"])
def test_a_user_request_id_header_is_refused(tmp_path, name):
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:1/v1", target={"headers": {name: "fixed-0c1d"}}
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and output.count("\n") == 1 and "Traceback" not in output
    assert (
        f"target.headers.{name}: expected no X-Request-Id header" in output
        and str(scenario) in output
    )
    assert "fixed-0c1d" not in output  # header values never appear, not even in errors
