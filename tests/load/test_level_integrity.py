"""Every cell's evidence is what it claims: levels never overlap, c really is in flight, one run per
directory."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import fields

import pytest
from aiohttp import web

from kevload.inputs.scenario import load_scenario
from kevload.load import engine, sender
from kevload.load.level import decide
from kevload.load.schedule import COMPANION, PROBE, WARMUP, ClosedLoop, OpenLoop
from kevload.records import store
from kevload.records.store import RECORDS, Record, read_records
from kevload.wire.answer import Outcome
from kevload.wire.client import Client
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

TWO_PROBES = [
    {"id": "p1", "prompt": "Say something.", "max_tokens": 16},
    {"id": "p2", "prompt": "Tell me more.", "max_tokens": 16},
]


def _rows(run_dir):
    return list(read_records(run_dir / RECORDS))


@pytest.mark.parametrize("backend", ["lean", "aiohttp"])
def test_leftover_companions_never_reach_the_next_cell(tmp_path, server, monkeypatch, backend):
    """Companions still running when p1's c=4 cell ends used to overlap p2's serial cell."""
    monkeypatch.setenv("KEVLOAD_HTTP", backend)
    server.behaviour.drift_when_mixed = True
    # non-streaming requests held long: cancelled ones outlive the cell
    server.behaviour.latency = 0.3
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        probes=TWO_PROBES,
        mode="mixed",
        concurrency=[1, 4],
        samples=3,
        max_error_share=1.0,
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    rows = _rows(tmp_path / "run")
    serial = cells_by_level(load_summary(tmp_path / "run"), probe="p2")[1]
    assert serial["ok"] == 3 and serial["distinct"] == 1 and serial["drift"] is False, output
    assert all(r["in_flight"] == 0 for r in rows if r["concurrency"] == 1 and r["counted"])
    # A level ends only when nothing it sent is in flight: each request of a cell is sent after
    # every request of the cell before it came back. Cells run c=1, 4, 1, 4 and records are numbered
    # in send order.
    cells: list[list[dict]] = []
    for r in sorted(rows, key=lambda r: r["seq"]):
        if not cells or cells[-1][0]["concurrency"] != r["concurrency"]:
            cells.append([])
        cells[-1].append(r)
    assert [cell[0]["concurrency"] for cell in cells] == [1, 4, 1, 4]
    for earlier, later in zip(cells, cells[1:], strict=False):
        assert min(r["t_send"] for r in later) >= max(r["t_last_byte"] for r in earlier)


def test_single_mode_reaches_c_even_with_fewer_samples(tmp_path, server):
    """A level of c=8 with 4 samples used to reach at most 4 in flight (3 others)."""
    server.behaviour.latency = 0.3
    server.behaviour.drift_at = 8
    # the server answers differently once it holds 8 at once
    server.behaviour.batched_variant = True
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 8], samples=4)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 1, output
    counted = [
        r
        for r in _rows(tmp_path / "run")
        if r["role"] == "probe" and r["counted"] and r["concurrency"] == 8
    ]
    assert len(counted) == 4 and {r["in_flight"] for r in counted} == {7}
    # Server side: every counted request was held while 8 were in the server, none saw its batch
    # shrink.
    cell = cells_by_level(load_summary(tmp_path / "run"))[8]
    assert cell["ok"] == 4 and cell["distinct"] == 1 and cell["agrees_with_serial"] is False


@pytest.mark.parametrize("mode", ["single", "mixed", "needle"])
def test_every_counted_probe_is_sent_with_c_minus_1_others(tmp_path, server, mode):
    """docs/load-shapes.md's "exactly c requests are in flight", proven from the records."""
    server.behaviour.latency = 0.05
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        mode=mode,
        concurrency=[1, 3, 5],
        samples=6,
        needle_length=200,
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    rows = _rows(tmp_path / "run")
    for c in (1, 3, 5):
        probes = [r for r in rows if r["role"] == "probe" and r["concurrency"] == c]
        counted = [r for r in probes if r["counted"]]
        assert len(counted) == 6, (c, len(counted))
        assert {r["in_flight"] for r in counted} == {c - 1}
        assert all(
            r["in_flight"] < c - 1
            for r in probes
            if not r["counted"] and r["seq"] < counted[0]["seq"]
        )
        assert all(r["in_flight"] <= c - 1 for r in rows if r["concurrency"] == c)
    assert [c["ok"] for c in load_summary(tmp_path / "run")["cells"] if c["role"] == "probe"] == [
        6,
        6,
        6,
    ]


class _RoleFaults(FakeServer):
    """Fails requests for one prompt (the probe's or the companions') with a 500 after
    ``fail_delay``."""

    def __init__(self, fail_probe: bool, fail_delay: float):
        super().__init__()
        self.fail_probe = fail_probe
        self.fail_delay = fail_delay

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        is_probe = body["messages"][-1]["content"] == "Say something."
        if is_probe == self.fail_probe:
            await asyncio.sleep(self.fail_delay)
            return web.json_response({"error": "injected"}, status=500)
        return await super()._handle(request)


def test_probe_errors_abort_however_many_companions_succeed(tmp_path):
    """7 fast, healthy companion slots used to dilute 100 % probe errors below the limit."""
    with _RoleFaults(fail_probe=True, fail_delay=0.1) as fake:
        fake.behaviour.latency = 0.005
        scenario = write_scenario(
            tmp_path / "s.toml", fake.url, mode="mixed", concurrency=[8], samples=40
        )
        run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert json.loads((tmp_path / "run" / "run.json").read_text())["state"] == "aborted"
    probes = [r for r in _rows(tmp_path / "run") if r["role"] == "probe" and r["counted"]]
    assert len(probes) == engine._ABORT_MIN_ERRORS


def test_companion_errors_never_abort(tmp_path):
    """Failing companions used to trigger the abort though every probe answered."""
    with _RoleFaults(fail_probe=False, fail_delay=0.0) as fake:
        fake.behaviour.latency = 0.1
        scenario = write_scenario(
            tmp_path / "s.toml", fake.url, mode="mixed", concurrency=[4], samples=5
        )
        run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    rows = _rows(tmp_path / "run")
    assert (
        sum(r["role"] == "companion" and r["status"] == "http_500" for r in rows)
        > engine._ABORT_MIN_ERRORS
    )
    assert json.loads((tmp_path / "run" / "run.json").read_text())["state"] == "complete"
    assert cells_by_level(load_summary(tmp_path / "run"))[4]["ok"] == 5


def test_reused_out_is_refused_unless_overwrite(tmp_path, server):
    """A second run into the same --out used to append to the first run's records."""
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
    out = tmp_path / "nightly"
    assert run_cli("run", scenario, "--out", out, "--quiet")[0] == 0
    before = (out / RECORDS).read_bytes()
    first_id = json.loads((out / "run.json").read_text())["run_id"]
    code, output = run_cli("run", scenario, "--out", out, "--quiet")
    assert code == 2
    assert output.strip() == (
        f"kevload: error: {out}: already holds run {first_id}; --resume {out} finishes it, "
        f"--overwrite starts it afresh"
    )
    assert (out / RECORDS).read_bytes() == before
    assert run_cli("run", "--resume", out, "--overwrite")[0] == 2

    code, output = run_cli("run", scenario, "--out", out, "--quiet", "--overwrite")
    assert code == 0, output
    ids = {r["run_id"] for r in _rows(out)}
    assert len(ids) == 1 and first_id not in ids and len(_rows(out)) == 2


def test_report_refuses_records_of_two_runs(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
    for name in ("a", "b"):
        run_cli("run", scenario, "--out", tmp_path / name, "--quiet")
    with (tmp_path / "a" / RECORDS).open("ab") as merged:
        merged.write((tmp_path / "b" / RECORDS).read_bytes())
    code, output = run_cli("report", tmp_path / "a")
    assert (
        code == 2 and "holds records of 2 runs" in output and len(output.strip().splitlines()) == 1
    )


def test_default_directories_are_unique_within_one_second(monkeypatch):
    """The directories diagnose-<time> and cases-rerun-<time> used to collide for two starts in one
    second."""
    from kevload.guide.diagnose import DiagnoseOptions, _Diagnoser
    from kevload.inputs.probe import Probe

    monkeypatch.setattr(store.time, "strftime", lambda fmt: "20260101-000000")
    options = DiagnoseOptions(
        url="http://127.0.0.1:9/v1", model="m", probe=Probe(id="p", prompt="x"), params={}
    )
    first, second = (_Diagnoser(options, print, asyncio.Event()).out for _ in range(2))
    assert first != second and re.fullmatch(r"diagnose-20260101-000000-[0-9a-f]{6}", first.name)
    names = {
        store.default_run_dir(kind).name
        for kind in ("cases-rerun", "cases-rerun", "sweep", "sweep", "")
    }
    assert len(names) == 5


def test_resume_cuts_a_torn_last_line(tmp_path, server):
    """Appending after a torn line used to leave it mid-file, and the run became unreadable."""
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=3)
    out = tmp_path / "run"
    assert run_cli("run", scenario, "--out", out, "--quiet")[0] == 0
    lines = (out / RECORDS).read_bytes().splitlines(keepends=True)
    # As a kill mid-write leaves it: the last two records lost, the one before them half written.
    (out / RECORDS).write_bytes(b"".join(lines[:-3]) + lines[-3][: len(lines[-3]) // 2])
    code, output = run_cli("run", "--resume", out, "--quiet")
    assert code == 0, output
    rows = _rows(out)  # raises if a torn line were left inside the file
    assert len({r["seq"] for r in rows}) == len(rows)
    assert [c["ok"] for c in load_summary(out)["cells"]] == [3, 3]
    assert run_cli("report", out)[0] == 0


def test_open_loop_cells_keep_max_in_flight_apart_from_concurrency(tmp_path, server):
    """Open-loop records used to store load.max_in_flight in the concurrency field."""
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, rate=[50], samples=10, max_in_flight=3
    )
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    assert {(r["concurrency"], r["max_in_flight"]) for r in _rows(tmp_path / "run")} == {(0, 3)}
    cell = load_summary(tmp_path / "run")["cells"][0]
    assert (cell["concurrency"], cell["rate"], cell["max_in_flight"]) == (0, 50, 3)


def test_engine_run_yields_records_without_a_run_directory(tmp_path, server):
    """engine.run is a plain async iterator: no files, every record in send order of sequence
    numbers."""
    scenario = load_scenario(
        write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=3)
    )

    async def collect() -> list[Record]:
        async with Client(scenario.target, None) as client:
            return [
                record async for record in engine.run(scenario, client, run_id="r", first_seq=10)
            ]

    records = asyncio.run(collect())
    assert sorted(r.seq for r in records) == list(range(10, 10 + len(records)))
    assert sum(r.counted for r in records) == 6 and {r.run_id for r in records} == {"r"}
    assert list(tmp_path.iterdir()) == [tmp_path / "s.toml"]


def test_record_takes_every_shared_outcome_field_by_name():
    """Fields added to both Outcome and Record travel without touching the engine."""
    shared = {f.name for f in fields(Outcome)} & set(Record.__struct_fields__)
    values = {f.name: f"value-{f.name}" for f in fields(Outcome)}
    # Counts the record keeps only in their range: numbers of their own, each different.
    values.update(
        status="ok",
        tool_calls=[{"name": "f", "arguments": "{}"}],
        prompt_tokens=3,
        completion_tokens=5,
        cached_tokens=2,
    )
    record = sender.record(
        Outcome(**values),
        {"model": "m", "prompt": "x"},
        run_id="r",
        seq=0,
        probe="p",
        role=PROBE,
        mode="single",
        concurrency=1,
        rate=None,
        sample=0,
        in_flight=0,
        counted=True,
        max_in_flight=1,
        t_scheduled=None,
        retries=0,
    )
    assert shared >= {"status", "output", "t_send", "error", "chunks"}
    assert all(getattr(record, name) == values[name] for name in shared)
    assert record.params == {"model": "m"}


def test_closed_loop_counts_only_full_load_and_covers_the_tail():
    plan = ClosedLoop(3, 2, companions=False)
    assert plan.slots == (PROBE, PROBE, PROBE)
    assert [decide(plan, PROBE, n) for n in (0, 1, 2)] == [
        False,
        False,
        True,
    ]  # the ramp-up is not counted
    plan.returned(PROBE, False)
    assert plan.next(PROBE) and decide(plan, PROBE, 2)  # the second sample
    plan.returned(PROBE, False)
    # Both samples are sent, but still in flight: the slot sends an uncounted copy to keep them in a
    # full batch.
    assert plan.next(PROBE) is not None and decide(plan, PROBE, 2) is False
    plan.returned(PROBE, True)
    plan.returned(PROBE, True)
    assert plan.next(PROBE) is None

    mixed = ClosedLoop(3, 1, companions=True)
    assert mixed.slots == (
        COMPANION,
        COMPANION,
        PROBE,
    )  # companions start first: the first probe finds them
    assert decide(mixed, COMPANION, 0) is False and decide(mixed, PROBE, 2) is True
    assert decide(mixed, WARMUP, 2) is False
    mixed.returned(PROBE, True)
    assert mixed.next(COMPANION) is not None and mixed.next(PROBE) is None
    mixed.slot_done(PROBE)
    assert mixed.next(COMPANION) is None  # companions stop once the probe slot is done


def test_open_loop_schedule():
    sends = list(OpenLoop(4.0, needed=3, companions=True, warmup=2))
    assert [s.role for s in sends] == [
        WARMUP,
        WARMUP,
        PROBE,
        COMPANION,
        COMPANION,
        COMPANION,
        PROBE,
        COMPANION,
        COMPANION,
        COMPANION,
        PROBE,
    ]
    assert [s.at for s in sends[:3]] == [0.0, 0.25, 0.5]
    timed = list(
        OpenLoop(10.0, needed=0, companions=False, duration=1.0, arrival="poisson", seed=3)
    )
    assert all(s.at < 1.0 for s in timed) and timed == list(
        OpenLoop(10.0, needed=0, companions=False, duration=1.0, arrival="poisson", seed=3)
    )


class _Overlap(FakeServer):
    """Notes, per request nonce, the most requests the server worked on at once while answering
    it."""

    def __init__(self, behaviour):
        super().__init__(behaviour)
        self.overlap: dict[str, int] = {}

    def _answer(self, body, prompt, state):
        self.overlap[body.get("user")] = state["max_overlap"]
        return super()._answer(body, prompt, state)


def test_counted_sample_is_never_alone_at_the_server_while_another_slot_backs_off(tmp_path):
    """The docs: 'every counted probe sample is sent with exactly c−1 other requests in flight', and
    '"In flight" means sent by kevload and not yet answered'. With --retries, a 429 is answered, yet
    the slot that got it sits out Retry-After (1 s) still counted in flight: the other slot's
    samples in that second are recorded as counted at c=2 (in_flight 1) while the server works on
    them alone."""
    faults = [None] * 9 + ["http_429"]
    with _Overlap(Behaviour(latency=0.3, faults=faults, retry_after="1")) as server:
        scenario = write_scenario(
            tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=6, nonce=True
        )
        run_cli("run", scenario, "--out", tmp_path / "run", "--quiet", "--retries", "1")
        overlap = server.overlap
    counted = [r for r in _rows(tmp_path / "run") if r["concurrency"] == 2 and r["counted"]]
    assert len(counted) == 6 and {r["in_flight"] for r in counted} == {1}
    # Overlap over the whole answer, not at arrival: a partner sent in the same instant may arrive
    # later.
    alone = [r["seq"] for r in counted if overlap[r["params"]["user"]] < 2]
    assert not alone, f"counted c=2 samples that found the server idle: seq {alone}"
