"""A probe's level as the engine runs it: the closed loop's warm-ups and *c* slots, each resending
the moment its answer is in, or the open loop's arrivals on their schedule; each level ends with the
run's drain."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from kevload.compare.verdict import UntilBound
from kevload.inputs.probe import Probe
from kevload.inputs.trace import trace_of
from kevload.inputs.workload import CompanionPicker
from kevload.load.replay import TraceLoop
from kevload.load.schedule import COMPANION, PROBE, WARMUP, ClosedLoop, OpenLoop, Role
from kevload.load.sender import Cell

if TYPE_CHECKING:
    from kevload.load.engine import EngineRun

# How often a worker with no probe slot of its own asks its level whether the level's probes are
# done.
_PROBES_DONE_POLL_S = 0.05
# What sends one request of a level (``engine.EngineRun.sending``): role, item, sample, and when.
Send = Callable[..., Coroutine[Any, Any, None]]


class ClosedLevel:
    """Level *c* of one probe: its plan (fresh, resumed, or until a bound), the warm-ups, then *c*
    slots in one task group, each resending the moment its answer is in, until the level's ``Level``
    says so; then the drain."""

    def __init__(self, run: EngineRun, probe: Probe, concurrency: int, picker: CompanionPicker):
        self.run, self.probe, self.concurrency, self.picker = run, probe, concurrency, picker

    async def __call__(self) -> None:
        run, probe, picker = self.run, self.probe, self.picker
        concurrency = self.concurrency
        load = run.load
        first, prior = run.resumed(probe.id, concurrency, None)
        serial = concurrency == load.concurrency[0]
        if load.until_bound is None:
            if run.level_done(first):
                return
            plan = ClosedLoop(
                concurrency,
                load.samples - first,
                companions=bool(picker),
                warmup=load.warmup,
                ramp_s=load.ramp_s,
                duration=load.duration,
            )
        else:
            # The serial level holds its answers against its own first one; later levels against its
            # modal answer.
            plan = ClosedLoop(
                concurrency,
                load.samples,
                companions=bool(picker),
                warmup=load.warmup,
                ramp_s=load.ramp_s,
                until=UntilBound(load.until_bound, load.samples, load.max_samples),
                reference=None if serial else run.references.get(probe.id),
                prior=prior,
            )
        if plan.wants_samples:
            await self._slots(plan, first=first)
        if serial:
            run.references[probe.id] = plan.modal()

    async def _slots(self, plan: ClosedLoop, *, first: int) -> None:
        run, probe, picker = self.run, self.probe, self.picker
        concurrency = self.concurrency
        load = run.load
        level, slots = run.team.level(plan)
        run.level = level
        send = run.sending(level, Cell(load.mode, concurrency, None, concurrency), probe)
        await self._warm_up(plan, send)
        samples = {PROBE: first, COMPANION: 0}
        # The ramp-up and a timed level run from here, after the warm-ups; one start for every
        # worker.
        start = await run.team.start(level, 0.0)
        # Every worker's slots start at that one moment, so the level is full from its first sends
        # on every host.
        await asyncio.sleep(max(start - time.perf_counter(), 0.0))

        async def slot(role: Role) -> None:
            try:
                while not run.halted():
                    if role == PROBE and load.mode == "needle":
                        # Vary where the probe lands among requests the server is already running.
                        await asyncio.sleep(picker.jitter(0.05))
                    at = time.perf_counter() - start
                    if not level.next(role, at):
                        return
                    item = probe if role == PROBE else picker.next().item
                    sample = samples[role]
                    samples[role] += 1
                    await send(role, item, sample, at=at)
            finally:
                level.slot_done(role)

        async with asyncio.TaskGroup() as group:
            tasks: dict[Role, list[asyncio.Task[None]]] = {PROBE: [], COMPANION: []}
            for role in slots:
                tasks[role].append(group.create_task(slot(role)))
            if not tasks[PROBE]:
                # No probe slot here (another worker runs it): the level's probes are done when it
                # ends these companions (its probe slots closed, or the hold released); the cut
                # counts from then, not from this worker's start.
                while (
                    not run.stop.is_set()
                    and level.next(COMPANION)
                    and not all(t.done() for t in tasks[COMPANION])
                ):
                    await asyncio.wait(tasks[COMPANION], timeout=_PROBES_DONE_POLL_S)
            await run.drain(tasks[PROBE], tasks[COMPANION])
        await run.team.end(level)

    async def _warm_up(self, plan: ClosedLoop, send: Send) -> None:
        """The closed loop's warm-ups, one at a time before the slots start, where this worker sends
        them."""
        run = self.run
        for i in range(plan.warmup if run.team.warms_up else 0):
            if run.halted():
                break
            # A warm-up in flight at a stop gets the grace any request in flight gets, not
            # target.timeout.
            async with asyncio.TaskGroup() as group:
                await run.wait([group.create_task(send(WARMUP, self.probe, i))], cut_after=None)


class OpenLevel:
    """A rate of one probe, open loop: sends on an absolute schedule (constant or Poisson) whatever
    the server's speed, each in the level's task group; then the drain.

    The schedule is kept against a fixed start time, so one late send does not shift every later
    one; each record keeps its scheduled time, and lateness is reported per cell.
    """

    def __init__(
        self,
        run: EngineRun,
        probe: Probe,
        rate: float,
        picker: CompanionPicker,
        speedup: float | None = None,
    ):
        self.run, self.probe, self.rate, self.picker = run, probe, rate, picker
        # A trace level's (kevload.inputs.trace): its rate is the replay's mean rate.
        self.speedup = speedup

    async def __call__(self) -> None:
        first, _ = self.run.resumed(self.probe.id, 0, self.rate)
        if not self.run.level_done(first):
            await self._arrivals(self._plan(needed=self.run.load.samples - first), first=first)

    def _plan(self, *, needed: int) -> OpenLoop:
        """The level's arrivals: a trace replayed at its speed-up, or the rate's (constant or
        Poisson)."""
        load = self.run.load
        trace = trace_of(self.run.scenario.datasets)
        if self.speedup is not None and trace is not None:
            # The closed-loop levels before it sent the warm-ups; its length is the trace's.
            return TraceLoop(trace, self.speedup, needed=needed, ramp_s=load.ramp_s)
        return OpenLoop(
            self.rate,
            needed=needed,
            companions=bool(self.picker),
            arrival=load.arrival,
            seed=load.seed,
            warmup=load.warmup,
            duration=load.duration,
            ramp_s=load.ramp_s,
        )

    async def _arrivals(self, plan: OpenLoop, *, first: int) -> None:
        """This worker's arrivals, each sent at its moment under the cap; then the drain."""
        run, probe, picker = self.run, self.probe, self.picker
        rate = self.rate
        load = run.load
        cap = asyncio.Semaphore(load.max_in_flight) if load.max_in_flight else None
        level, _ = run.team.level(plan)
        run.level = level
        send = run.sending(level, Cell(load.mode, 0, rate, load.max_in_flight or None), probe)
        samples = {PROBE: first, COMPANION: 0, WARMUP: -1}
        tasks: dict[str, set[asyncio.Task[None]]] = {PROBE: set(), COMPANION: set()}
        start = await run.team.start(level, 0.005)

        async def one(role: str, item: Probe, sample: int, at: float, scheduled: float) -> None:
            try:
                # Not after a stop (or an abort) between this task's making and its first step.
                if not run.halted():
                    await send(role, item, sample, at=at, t_scheduled=scheduled)
            finally:
                if cap is not None:
                    cap.release()

        # A stop ends the wait for the next arrival (or for room under the cap) at once: at a low
        # rate the next one may be minutes away, and it is never sent.
        stopped = asyncio.ensure_future(run.stop.wait())
        async with asyncio.TaskGroup() as group:
            for arrival, planned in enumerate(plan):
                if run.halted():
                    break
                role = planned.role
                sample = samples[role]
                if role != WARMUP:
                    # Every worker numbers every arrival: sample numbers stay those of one process.
                    samples[role] += 1
                if not run.team.mine(arrival):
                    continue
                at = planned.at
                assert at is not None  # the open loop's plan times every send
                scheduled = start + at
                if (
                    not await sleep_until(scheduled, stopped)
                    or cap is not None
                    and not await _acquire(cap, stopped)
                ):
                    break
                item = planned.item or (picker.next().item if role == COMPANION else probe)
                task = group.create_task(one(role, item, sample, at, scheduled))
                # The group awaits every request; these sets only say which are still in flight, for
                # the drain.
                live = tasks[PROBE if role == PROBE else COMPANION]
                live.add(task)
                task.add_done_callback(live.discard)
            stopped.cancel()
            await run.drain(list(tasks[PROBE]), list(tasks[COMPANION]))
        await run.team.end(level)


async def sleep_until(deadline: float, stopped: asyncio.Future[Any]) -> bool:
    """Sleep until ``deadline`` unless ``stopped`` is done first; True when the deadline came. On
    the timer, then a short spin yielding for the last half millisecond: timers are coarse."""
    delay = deadline - time.perf_counter()
    if delay > 0.0005:
        await asyncio.wait((stopped,), timeout=delay - 0.0005)
    while time.perf_counter() < deadline and not stopped.done():
        await asyncio.sleep(0)
    return not stopped.done()


async def _acquire(cap: asyncio.Semaphore, stopped: asyncio.Future[Any]) -> bool:
    """Room under the open loop's cap, unless ``stopped`` is done first; True when a place was
    taken."""
    if not cap.locked():
        await cap.acquire()  # returns at once
        return True
    acquiring = asyncio.ensure_future(cap.acquire())
    await asyncio.wait((acquiring, stopped), return_when=asyncio.FIRST_COMPLETED)
    acquiring.cancel()  # the level ends on a stop: a place taken meanwhile goes with its semaphore
    return not stopped.done()
