"""Runs a scenario's schedule against a client and yields one record per finished request.

``run(scenario, client, run_id=…)`` is an async iterator of ``Record``s. Probes run one after
another, each at every level; a level ends only when nothing it sent is still in flight, so no
request of one level overlaps the next. A level itself (the closed loop's slots, the open loop's
arrivals) is run by ``kevload.load.loops``; run directories (writing, resuming, summaries) live in
``kevload.load.runs``; timing and roles in ``kevload.load.schedule``.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncGenerator, Hashable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from kevload.inputs.probe import Probe
from kevload.inputs.scenario import Scenario
from kevload.inputs.trace import trace_of
from kevload.inputs.workload import CompanionPicker, companions_for
from kevload.load.cancel import CancelPlan
from kevload.load.level import Level, Plan
from kevload.load.loops import ClosedLevel, OpenLevel, Send
from kevload.load.prefixcache import CacheControl
from kevload.load.schedule import COMPANION, PROBE, ClosedLoop, Role
from kevload.load.sender import Cell, Cut, Sender
from kevload.records.store import Record
from kevload.records.summary import level_label
from kevload.wire.client import Client

# How long in-flight requests may finish after a stop was asked for before they are cancelled.
STOP_GRACE_S = 2.0
# The fewest counted probe errors that abort a run (``ErrorShare``), whatever their share.
_ABORT_MIN_ERRORS = 20

# (probe id, concurrency or None, rate or None) → counted probe samples a run already has.
LevelKey = tuple[str, int | None, float | None]
# A counted probe answer as the stop rule of load.until_bound sees it: (sha256, finish_reason), None
# for an error.
Answer = tuple[str | None, str | None] | None


def level_key(probe: str, concurrency: int, rate: float | None) -> LevelKey:
    """Closed-loop levels are keyed by concurrency, open-loop ones by rate alone."""
    return (probe, None, rate) if rate is not None else (probe, concurrency, None)


def run(
    scenario: Scenario,
    client: Client,
    *,
    run_id: str,
    stop: asyncio.Event | None = None,
    already: dict[LevelKey, int] | None = None,
    first_seq: int = 0,
    part: int = 0,
    answers: dict[LevelKey, list[Answer]] | None = None,
    team: Alone | None = None,
    cache: CacheControl | None = None,
) -> RecordStream:
    """Every probe at every level; ``async for record in run(…)`` as requests finish.

    ``already`` holds the counted probe samples a resumed run has per level; only the missing ones
    are sent, with sequence numbers from ``first_seq`` on. ``part`` is the run's invocation (0, then
    one more for each resume): it goes into every request id and nonce, so no two requests of a run
    share one whatever the records on disk lost. With ``load.until_bound`` the stop rule needs what
    they answered too: ``answers`` per level, in record order. The companion pools are built here,
    before anything is sent, so a bad companion file fails at once. ``team`` makes this run one of
    several workers sharing each level (``kevload.load.workers``); alone by default. ``cache`` makes
    each probe sample cold or warm (``load.prefix_cache``).
    """
    return RecordStream(
        EngineRun(
            scenario,
            client,
            run_id,
            stop or asyncio.Event(),
            already or {},
            first_seq,
            part,
            answers or {},
            team or Alone(),
            cache,
        )
    )


class Alone:
    """How a run reaches the other workers of its levels: the default, there are none.

    ``kevload.load.workers.Shared`` (worker processes on one host, one level in shared memory) and
    ``kevload.load.rayworkers.RayTeam`` (Ray actors, each on a level of its own slots) are the
    others. Whatever the team, every count and every counted/uncounted decision is the ``Level``'s,
    and the engine only asks it.
    """

    worker, workers = 0, 1
    # whether this worker sends the closed loop's warm-ups (one at a time, before the slots start)
    warms_up = True

    def level(self, plan: Plan) -> tuple[Level, tuple[Role, ...]]:
        """The level this worker's sends go through, and the closed loop's slots it runs (none in
        the open loop)."""
        return Level(plan), plan.slots if isinstance(plan, ClosedLoop) else ()

    def mine(self, arrival: int) -> bool:
        """Whether this worker sends the open loop's ``arrival``-th request (warm-ups included)."""
        return True

    def halted(self) -> bool:
        """Whether the driver or another worker stopped the run: a stop this worker's own flags may
        not show yet."""
        return False

    def halt(self) -> None:
        """This worker stops the run (the error rule): the other workers' levels end with it."""

    async def start(self, level: Level, lead: float) -> float:
        """Called once the level's warm-ups are sent; returns its start (``time.perf_counter``)."""
        return time.perf_counter() + lead

    async def end(self, level: Level) -> None:
        """Called once nothing of the level is in flight here."""


class RecordStream:
    """The records of one run, as they finish; ``aborted`` says whether the error rule ended it
    early, ``sent`` how many requests it numbered (each one a record, unless the stream was torn
    down before it came)."""

    def __init__(self, run: EngineRun):
        self._runner = run

    def __aiter__(self) -> AsyncGenerator[Record, None]:
        return self._runner.records()

    def batches(self) -> AsyncGenerator[list[Record], None]:
        """The records in lists, each of those that finished together (``EngineRun.batches``)."""
        return self._runner.batches()

    @property
    def aborted(self) -> bool:
        return self._runner.aborted

    @property
    def sent(self) -> int:
        return self._runner.sender.sent


class EngineRun:
    """One run: its probes at every level in turn, the stream of records, the stop and the stop
    condition, and the drain that ends each level."""

    def __init__(
        self,
        scenario: Scenario,
        client: Client,
        run_id: str,
        stop: asyncio.Event,
        already: dict[LevelKey, int],
        first_seq: int,
        part: int,
        answers: dict[LevelKey, list[Answer]],
        team: Alone,
        cache: CacheControl | None = None,
    ):
        self.team = team
        self.level: Level | None = None  # the level running now (one at a time)
        self.pools = [companions_for(probe, scenario) for probe in scenario.probes]
        self.scenario = scenario
        self.load = scenario.load
        self.sender = Sender(
            scenario,
            client,
            run_id=run_id,
            part=part,
            first_seq=first_seq,
            worker=team.worker,
            workers=team.workers,
            hear_stop=self.halted,
            stop=stop,
            cache=cache,
        )
        self.stop = stop
        self.already = already
        self.answers = answers
        # Per probe: the serial (first) level's modal answer, which later levels' answers are held
        # against.
        self.references: dict[str, Hashable | None] = {}
        self.errors = ErrorShare(self.load.max_error_share)
        self.cancels = CancelPlan.of(
            self.load.cancel_share,
            self.load.cancel_after_s,
            self.load.cancel_after_tokens,
            self.load.seed,
        )
        self.aborted = False
        # one grace period from the stop, however many groups wait
        self._stopped_at: float | None = None
        self._ready: collections.deque[Record] = collections.deque()
        self._wake = asyncio.Event()

    async def records(self) -> AsyncGenerator[Record, None]:
        async with aclosing(
            self.batches()
        ) as batches:  # closed with this stream: its driver is torn down at once
            async for batch in batches:
                for record in batch:
                    yield record

    async def batches(self) -> AsyncGenerator[list[Record], None]:
        """The records as they finish, those that finished since the stream was last read in one
        list (a writer writes them in one system call: per request that call cost more than building
        the record)."""
        driver = asyncio.create_task(self._drive())
        driver.add_done_callback(lambda _: self._wake.set())
        try:
            while True:
                if self._ready:
                    batch = list(self._ready)
                    self._ready.clear()
                    yield batch
                    continue
                if driver.done():
                    break
                self._wake.clear()
                await self._wake.wait()
            try:
                driver.result()  # a bug in a sender surfaces here rather than vanishing
            except (
                BaseExceptionGroup
            ) as group:  # a level's task group: the bug itself, as without a group
                raise _first(group) from None
        finally:
            if not driver.done():
                driver.cancel()
                await asyncio.gather(driver, return_exceptions=True)

    async def _drive(self) -> None:
        load = self.load
        for index, probe in enumerate(self.scenario.probes):
            # Workers pick from their own seeded sequences, so they do not send the same companions
            # in step.
            picker = CompanionPicker(
                self.pools[index], seed=load.seed + index + 7919 * self.team.worker
            )
            # Open-loop rates replace the closed-loop concurrency levels when they are given; a
            # trace's levels follow them, so the serial level c=1 is the reference its probes are
            # held against.
            levels: list[OpenLevel | ClosedLevel] = [
                OpenLevel(self, probe, rate, picker) for rate in load.rate
            ] or [ClosedLevel(self, probe, c, picker) for c in load.concurrency]
            if (trace := trace_of(self.scenario.datasets)) is not None:
                levels += [
                    OpenLevel(self, probe, trace.rate(speedup), picker, speedup=speedup)
                    for speedup in load.trace_speedup
                ]
            for level in levels:
                if self.halted():
                    return
                await level()

    async def drain(
        self, probes: list[asyncio.Task[None]], others: list[asyncio.Task[None]]
    ) -> None:
        """End a level only when nothing it sent is in flight.

        Probe requests run to their own end (the client's timeouts bound them). Companions still
        running ``target.timeout`` seconds after the probes finished are cut: cancelled, which
        closes their connections, and recorded as timeouts. A stop gives everything a short grace
        instead.
        """
        await self.wait(probes, cut_after=None)
        await self.wait(others, cut_after=self.scenario.target.timeout)

    async def wait(self, tasks: list[asyncio.Task[None]], *, cut_after: float | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if cut_after is None else loop.time() + cut_after
        stop_wait = asyncio.create_task(self.stop.wait())
        pending: set[asyncio.Task[Any]] = set(tasks)
        try:
            while pending and not self.stop.is_set():
                timeout = None if deadline is None else max(deadline - loop.time(), 0.0)
                done, pending = await asyncio.wait(
                    pending | {stop_wait}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(stop_wait)
                for task in done - {stop_wait}:
                    task.result()  # a worker's bug surfaces here rather than vanishing
                if pending and deadline is not None and loop.time() >= deadline:
                    await self._cut(
                        pending,
                        Cut(
                            f"cut: still in flight {cut_after:g} s after the level's probes "
                            "were done"
                        ),
                    )
                    pending = set()
            if pending:
                if self._stopped_at is None:
                    self._stopped_at = loop.time()
                await asyncio.wait(
                    pending, timeout=max(self._stopped_at + STOP_GRACE_S - loop.time(), 0.0)
                )
                await self._cut(
                    pending,
                    Cut(f"cut: still in flight {STOP_GRACE_S:g} s after the stop", stop=True),
                )
        finally:
            stop_wait.cancel()

    @staticmethod
    async def _cut(tasks: set[asyncio.Task[None]], cut: Cut) -> None:
        """Cancel requests still in flight (their connections close), each with the reason it is
        recorded with."""
        for task in tasks:
            task.cancel(cut)
        await asyncio.gather(*tasks, return_exceptions=True)

    def halted(self) -> bool:
        """Whether the run stopped (a stop, the error rule, another worker); the level running now
        hears of it."""
        if self.stop.is_set() or self.aborted or self.team.halted():
            if self.level is not None:
                self.level.halt()
            return True
        return False

    def resumed(
        self, probe: str, concurrency: int, rate: float | None
    ) -> tuple[int, Sequence[Answer]]:
        """What a resumed run already has of a level: its counted probe samples, and their answers
        in record order (``load.until_bound``)."""
        key = level_key(probe, concurrency, rate)
        return self.already.get(key, 0), self.answers.get(key, ())

    def level_done(self, counted: int) -> bool:
        """Whether a resumed run has this level: its samples, or for a timed level any (topping one
        up would run it for longer than load.duration)."""
        return counted > 0 if self.load.duration else counted >= self.load.samples

    def sending(self, level: Level, cell: Cell, probe: Probe) -> Send:
        """What sends one request of this level of ``probe``: the sender's record goes to the
        stream, a counted probe's answer to the level (``load.until_bound``) and to the stop
        condition. A companion ``load.cancel_share`` chose is sent to be cut."""
        label = level_label(cell.concurrency, cell.rate)

        async def send(role: Role, item: Probe, sample: int, **when: Any) -> None:
            plan = self.cancels
            cut = (
                plan is not None
                and role == COMPANION
                and plan.chosen(probe.id, label, self.team.worker, sample)
            )
            cancel = plan.at if cut and plan is not None else None
            if item.turns is None:
                self._note(
                    level,
                    role,
                    await self.sender.send(level, cell, role, item, sample, cancel=cancel, **when),
                )
                return
            async for record in self.sender.converse(
                level, cell, role, item, sample, cancel=cancel, **when
            ):
                self._note(level, role, record)

        return send

    def _note(self, level: Level, role: Role, record: Record) -> None:
        """A record to the stream; a counted probe sample's answer to the level and to the stop
        condition: a conversation's once, with the record that ends it (its whole conversation, or
        the turn that failed)."""
        self._ready.append(record)
        self._wake.set()
        if role == PROBE and record.is_sample:
            answer = record.sha256 if record.turns is None else record.conversation_sha256
            level.answered((answer, record.finish_reason) if record.status == "ok" else None)
            if self.errors.note(record.status == "ok"):
                self.aborted = True
                self.team.halt()


@dataclass(slots=True)
class ErrorShare:
    """The run's stop condition (like GuideLLM's constraints): stop once its errors make the
    evidence worthless, at least ``_ABORT_MIN_ERRORS`` counted probe errors and more than ``limit``
    of the counted probes. Companions only shape the batch: their errors neither trigger nor dilute
    it."""

    limit: float
    probes: int = 0
    errors: int = 0

    def note(self, ok: bool) -> bool:
        """A counted probe's outcome; True when the run must stop now."""
        self.probes += 1
        self.errors += not ok
        return (
            not ok and self.errors >= _ABORT_MIN_ERRORS and self.errors / self.probes > self.limit
        )


def _first(group: BaseExceptionGroup) -> BaseException:
    """The first exception in a (nested) exception group."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
