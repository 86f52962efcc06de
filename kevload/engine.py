"""asyncio scheduling: closed-loop concurrency levels, probes among companions, records to disk."""

from __future__ import annotations

import asyncio
import hashlib
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kevload import __version__
from kevload.client import Client, Outcome, ask_for_logprobs, build_body
from kevload.compare import reduce_file, summarize
from kevload.scenario import Probe, Scenario
from kevload.store import (
    RECORDS,
    RUN,
    SUMMARY,
    Record,
    RecordWriter,
    answer_text,
    new_run_id,
    read_json,
    read_records,
    redact,
    secret_header_values,
    write_json,
)
from kevload.workload import CompanionPicker, companions_for

# How long in-flight requests may finish after a stop was asked for before they are cancelled.
STOP_GRACE_S = 2.0
RETRYABLE = ("http_429", "http_503")
_BACKOFF_S, _BACKOFF_MAX_S = 0.2, 10.0
# Abort a run whose errors make its evidence worthless: at least this many errors and a share over the limit.
_ABORT_MIN_ERRORS = 20


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    run_id: str
    state: str  # complete | interrupted | aborted
    records: int
    summary: dict[str, Any]


async def run_scenario(scenario: Scenario, run_dir: Path | None = None, *,
                       on_record: Callable[[Record], None] | None = None,
                       stop: asyncio.Event | None = None, resume: bool = False) -> RunResult:
    """Run every probe at every level, writing records as they finish; returns once the summary is on disk.

    With ``resume`` the run directory's records are kept and only the probe samples missing from
    each level are sent, appended under the same run id.
    """
    api_key = scenario.api_key()
    base_dir = Path(scenario.source).parent if scenario.source else None
    # Built before anything is sent or written, so a bad companion file fails the run up front.
    pools = [companions_for(probe, scenario.load, base_dir=base_dir) for probe in scenario.probes]
    secrets = [s for s in [api_key, *secret_header_values(scenario.target.headers)] if s]
    done: dict[tuple[str, int, float | None], int] = {}
    next_seq = 0
    if resume:
        assert run_dir is not None
        meta = read_json(run_dir / RUN)
        run_id = meta["run_id"]
        for r in read_records(run_dir / RECORDS):
            next_seq = max(next_seq, r["seq"] + 1)
            if r["role"] == "probe":
                key = (r["probe"], r["concurrency"], r.get("rate"))
                done[key] = done.get(key, 0) + 1
        meta = {**meta, "state": "running", "resumed_at": [*meta.get("resumed_at", []), _now_iso()]}
    else:
        run_id = new_run_id()
        run_dir = run_dir or Path("results") / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        meta = _run_meta(scenario, run_id, secrets)
    scenario, meta["logprobs"] = await ask_for_logprobs(scenario, api_key)
    write_json(run_dir / RUN, meta)
    stop = stop or asyncio.Event()
    runner = _Runner(scenario, run_id, stop, on_record)
    runner.seq = next_seq
    runner.already = done
    with RecordWriter(run_dir / RECORDS) as writer:
        runner.writer = writer
        async with Client(scenario.target, api_key) as client:
            runner.client = client
            try:
                # Open-loop rates replace the closed-loop concurrency levels when they are given.
                levels = [(runner.rate_level, rate) for rate in scenario.load.rate] or \
                    [(runner.level, level) for level in scenario.load.concurrency]
                for index, probe in enumerate(scenario.probes):
                    picker = CompanionPicker(pools[index], seed=scenario.load.seed + index)
                    for run_level, level in levels:
                        if stop.is_set() or runner.aborted:
                            break
                        await run_level(probe, level, picker)
            finally:
                state = "aborted" if runner.aborted else "interrupted" if stop.is_set() else "complete"
                summary = finish_run(run_dir, state=state, meta=meta)
    return RunResult(run_dir=run_dir, run_id=run_id, state=state, records=writer.count, summary=summary)


def finish_run(run_dir: Path, *, state: str | None = None, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """(Re)compute ``summary.json`` from the records on disk and, if given, record the end state in ``run.json``."""
    meta = meta if meta is not None else read_json(run_dir / RUN)
    max_error_share = meta["load"]["max_error_share"]
    # A level run for a duration has no asked number of samples: only samples-bound cells can be short.
    asked = None if meta["load"].get("duration") else meta["load"].get("samples")
    summary = summarize(reduce_file(run_dir / RECORDS), max_error_share=max_error_share, samples_asked=asked)
    summary["run_id"] = meta.get("run_id")
    summary["scenario"] = meta.get("scenario_name")
    summary["state"] = state or meta.get("state")
    write_json(run_dir / SUMMARY, summary)
    if state is not None:
        meta = {**meta, "state": state, "ended_at": _now_iso(), "records": summary["requests"]}
        write_json(run_dir / RUN, meta)
    return summary


class _Runner:
    """State shared by the workers of one run: the client, writer, counters and stop flags."""

    def __init__(self, scenario: Scenario, run_id: str, stop: asyncio.Event,
                 on_record: Callable[[Record], None] | None):
        self.scenario = scenario
        self.load = scenario.load
        self.run_id = run_id
        self.stop = stop
        self.on_record = on_record
        self.client: Client
        self.writer: RecordWriter
        self.seq = 0
        self.already: dict[tuple[str, int, float | None], int] = {}  # probe samples a resumed run has
        self.in_flight = 0
        self.errors = 0
        self.done = 0
        self.aborted = False

    async def level(self, probe: Probe, level: int, picker: CompanionPicker) -> None:
        first = self.already.get((probe.id, level, None), 0)
        if first >= self.load.samples:
            return
        for i in range(self.load.warmup):
            await self._one(probe, "warmup", probe.id, level, i)
        probe_workers = level if self.load.mode == "single" or not picker else 1
        remaining = iter(range(first, self.load.samples))
        probes_done = asyncio.Event()

        async def probe_worker() -> None:
            for sample in remaining:
                if self._halted():
                    return
                if self.load.mode == "needle":
                    # Vary where the probe lands among requests the server is already running.
                    await asyncio.sleep(picker.jitter(0.05))
                await self._one(probe, "probe", probe.id, level, sample)

        async def companion_worker() -> None:
            sample = 0
            while not probes_done.is_set() and not self._halted():
                companion = picker.next()
                await self._one(companion.item, "companion", companion.item.id, level, sample)
                sample += 1

        companions = [asyncio.create_task(companion_worker()) for _ in range(level - probe_workers)]
        probes = [asyncio.create_task(probe_worker()) for _ in range(probe_workers)]
        try:
            await self._gather_until_stopped(probes)
        finally:
            probes_done.set()
            # Companions only shape the batch; once the probes are done, their unfinished requests are no evidence.
            for task in companions:
                task.cancel()
            await asyncio.gather(*companions, return_exceptions=True)

    async def rate_level(self, probe: Probe, rate: float, picker: CompanionPicker) -> None:
        """Open loop: send on an absolute schedule (constant or Poisson) whatever the server's speed.

        The schedule is kept against a fixed start time, so one late send does not shift every later
        one; each record keeps its scheduled time, and lateness is reported per cell.
        """
        load = self.load
        gaps = random.Random(load.seed)
        probe_every = 1 if load.mode == "single" or not picker else 4
        cap = asyncio.Semaphore(load.max_in_flight) if load.max_in_flight else None
        level = load.max_in_flight
        start = time.perf_counter() + 0.005
        probes_sent = self.already.get((probe.id, level, rate), 0)
        if probes_sent >= load.samples and not load.duration:
            return
        offset, arrivals, warmups = 0.0, 0, load.warmup
        tasks: set[asyncio.Task] = set()

        async def send(item: Probe, role: str, sample: int, scheduled: float) -> None:
            try:
                await self._one(item, role, item.id, level, sample, t_scheduled=scheduled, rate=rate)
            finally:
                if cap is not None:
                    cap.release()

        while not self._halted():
            if (offset >= load.duration) if load.duration else (probes_sent >= load.samples):
                break
            scheduled = start + offset
            await _sleep_until(scheduled)
            if cap is not None:
                await cap.acquire()
            if warmups:
                warmups -= 1
                item, role, sample = probe, "warmup", -1
            elif arrivals % probe_every == 0:
                item, role, sample = probe, "probe", probes_sent
                probes_sent += 1
            else:
                item, role, sample = picker.next().item, "companion", arrivals
            if role != "warmup":
                arrivals += 1
            task = asyncio.create_task(send(item, role, sample, scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            offset += gaps.expovariate(rate) if load.arrival == "poisson" else 1.0 / rate
        await self._gather_until_stopped(list(tasks))

    async def _gather_until_stopped(self, tasks: list[asyncio.Task]) -> None:
        """Wait for the workers; on a stop, give their in-flight requests a short grace, then cancel."""
        stop_wait = asyncio.create_task(self.stop.wait())
        pending = set(tasks)
        try:
            while pending and not self.stop.is_set():
                done, pending = await asyncio.wait(pending | {stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                pending.discard(stop_wait)
                for task in done - {stop_wait}:
                    task.result()  # a worker's bug surfaces here rather than vanishing
            if pending:
                await asyncio.wait(pending, timeout=STOP_GRACE_S)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            stop_wait.cancel()

    def _halted(self) -> bool:
        return self.stop.is_set() or self.aborted

    async def _one(self, item: Probe, role: str, name: str, level: int, sample: int, *,
                   t_scheduled: float | None = None, rate: float | None = None) -> None:
        seq = self.seq
        self.seq += 1
        nonce = f"kevload-{self.run_id}-{seq}" if self.load.nonce else None
        body = build_body(self.scenario.target, item, self.scenario.params, stream=self.load.stream, nonce=nonce)
        in_flight = self.in_flight
        self.in_flight += 1
        retries = 0
        try:
            outcome = await self.client.send(body)
            while outcome.status in RETRYABLE and retries < self.load.retries and not self.stop.is_set():
                # Honour the server's Retry-After; otherwise back off exponentially.
                wait = outcome.retry_after if outcome.retry_after is not None else _BACKOFF_S * 2 ** retries
                await asyncio.sleep(min(wait, _BACKOFF_MAX_S))
                retries += 1
                outcome = await self.client.send(body)
        finally:
            self.in_flight -= 1
        record = _record(self.run_id, seq, name, role, self.load.mode, level, rate, sample, in_flight, outcome,
                         body, t_scheduled, retries)
        self.writer.write(record)
        self.done += 1
        if outcome.status != "ok":
            self.errors += 1
            if self.errors >= _ABORT_MIN_ERRORS and self.errors / self.done > self.load.max_error_share:
                self.aborted = True
        if self.on_record is not None:
            self.on_record(record)


def _record(run_id: str, seq: int, name: str, role: str, mode: str, level: int, rate: float | None, sample: int,
            in_flight: int, outcome: Outcome, body: dict[str, Any], t_scheduled: float | None,
            retries: int) -> Record:
    ok = outcome.status == "ok"
    output = outcome.output
    params = {k: v for k, v in body.items() if k not in ("messages", "prompt")}
    return Record(
        run_id=run_id, seq=seq, probe=name, role=role, mode=mode, concurrency=level, rate=rate, sample=sample,
        in_flight=in_flight, status=outcome.status, output=output,
        sha256=hashlib.sha256(answer_text(output, outcome.reasoning, outcome.tool_calls).encode()).hexdigest()
        if ok and output is not None else None,
        finish_reason=outcome.finish_reason, prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens, token_ids=outcome.token_ids, tokens=outcome.tokens,
        logprobs=outcome.logprobs, system_fingerprint=outcome.system_fingerprint, t_scheduled=t_scheduled,
        t_send=outcome.t_send, t_first_byte=outcome.t_first_byte, t_first_token=outcome.t_first_token,
        t_last_byte=outcome.t_last_byte, chunks=outcome.chunks, max_gap=outcome.max_gap, error=outcome.error,
        retries=retries, params=params, reasoning=outcome.reasoning, tool_calls=outcome.tool_calls,
    )


async def _sleep_until(deadline: float) -> None:
    """Sleep on the timer, then yield in a short spin for the last half millisecond: timers are coarse."""
    delay = deadline - time.perf_counter()
    if delay > 0.0005:
        await asyncio.sleep(delay - 0.0005)
    while time.perf_counter() < deadline:
        await asyncio.sleep(0)


def _run_meta(scenario: Scenario, run_id: str, secrets: list[str]) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "kevload_version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "scenario_name": scenario.name,
        "scenario_source": scenario.source,
        "scenario": redact(scenario.raw, secrets),
        "load": asdict(scenario.load),
        "target": redact({"base_url": scenario.target.base_url, "model": scenario.target.model,
                          "api": scenario.target.api}, secrets),
        "started_at": _now_iso(),
        "clock": {"perf_counter": time.perf_counter(), "unix": time.time()},
        "state": "running",
    }


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
