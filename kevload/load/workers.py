"""Worker processes on one host: N processes share each level of one run (``load.workers``,
``--workers N``).

Each worker runs ``engine.run`` with a ``Shared`` team:

- Closed loop: the level's *c* slots are dealt out round-robin, probe slots first, so worker 0 holds
  the probe slot in the companion modes and the other workers hold companion slots, and in
  ``single`` mode the probe slots are spread. All workers call one ``Level``
  (``kevload.load.level``) whose state lives in shared memory (a ``multiprocessing.Array`` of
  doubles): the fields the level and its plan declare (``Level.STATE``, ``ClosedLoop.COUNTERS``),
  loaded and stored around each call under one lock. So "exactly *c* − 1 others in flight" holds
  across processes, and each record's ``in_flight`` is the count across all workers.
- Open loop: worker *w* sends arrivals *w*, *w* + N, … of the one schedule, against one start time.
- Levels start and end together: a barrier in shared memory after the warm-ups and after the drain.

The shared count is kevload's own bookkeeping, as in one process: a request is in flight from the
moment its worker claims it (under the lock, just before its bytes go out) until its answer is in.
Two limits: a send and its count are not one atomic act with the socket write (the same as in one
process), and across processes a slot's return and its next send are no longer one step of one event
loop, so another worker's send can come in between; such a send sees *c* − 2 others and is not
counted — the rule stays exact, only some sends more go uncounted. Every claim takes one lock shared
by all workers (about a microsecond uncontended), which is the price of the exact count.

Each worker writes its own ``records-<worker>.jsonl`` (one unbuffered write per record, as in one
process) with ``worker`` set and Unix times: one offset from ``time.perf_counter`` to ``time.time``
measured once by the driver for the whole host (``perf_counter`` is the host's one monotonic clock),
so times from different workers compare directly.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
import traceback
from collections.abc import MutableSequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec

from kevload.errors import InputError
from kevload.inputs.scenario import Scenario
from kevload.load import engine
from kevload.load.level import Claim, Level, Plan
from kevload.load.schedule import PROBE, ClosedLoop, Role
from kevload.records.store import Record, RecordWriter

START, HALTED, PASSED, LEVEL = 0, 1, 2, 3  # PASSED: arrivals at barriers, all workers together
_STATE_SIZE = LEVEL + 16  # room for a level's declared state and its plan's counters
_WATCH_S = 0.05  # how often a worker looks for a stop from the driver (or the driver's death)
_BARRIER_S = 0.002  # how often a worker at a barrier looks whether the others are there
# Worker processes per core at most (scenario.MAX_WORKERS bounds a run's on any cluster)
_PER_CORE = 4
# How long a worker may take to report after a halt (its stop's grace, then its last records) before
# the driver takes it for lost: one killed while it held the shared lock leaves the others blocked
# on it, never seeing the halt.
_HALT_GRACE_S = engine.STOP_GRACE_S + 8.0


def check_host(scenario: Scenario) -> None:
    """Refuse more worker processes than this host can use, before anything is written or started:
    each is an event loop of its own, and more than a few per core only compete for the cores (and
    take memory)."""
    cores = os.cpu_count() or 1
    if scenario.load.workers > _PER_CORE * cores:
        raise InputError(
            f"load.workers: expected at most {_PER_CORE * cores} on this host ({_PER_CORE} per "
            f"core, "
            f"{cores} cores), got {scenario.load.workers}; --ray spreads more over a cluster's "
            f"hosts"
        )


def records_name(worker: int) -> str:
    return f"records-{worker}.jsonl"


def clock_offset() -> float:
    """Seconds to add to ``time.perf_counter()`` to get Unix time: the closest of a few readings."""
    readings = []
    for _ in range(5):
        before = time.perf_counter()
        unix = time.time()
        after = time.perf_counter()
        readings.append((after - before, unix - (before + after) / 2))
    return min(readings)[1]


def slots_of(slots: tuple[Role, ...], worker: int, workers: int) -> tuple[Role, ...]:
    """This worker's share of a level's slots: dealt round-robin, probe slots first.

    The companion modes have one probe slot, which lands on worker 0; ``single`` spreads its probe
    slots. Within a worker, companion slots come first, as in one process (they start first).
    """
    ordered = sorted(slots, key=lambda role: role != PROBE)
    mine = ordered[worker::workers]
    return tuple(sorted(mine, key=lambda role: role == PROBE))


def cap_of(max_in_flight: int, worker: int, workers: int) -> int:
    """This worker's share of an open loop's ``load.max_in_flight`` (0: no cap); the shares add up
    to it."""
    if not max_in_flight:
        return 0
    return max_in_flight // workers + (worker < max_in_flight % workers)


class SharedLevel(Level):
    """A ``Level`` whose state lives in shared memory, called by every worker under one lock.

    Around each call the level's ``STATE`` and its plan's ``COUNTERS`` (each declared by name where
    it is defined) are loaded from the array and stored back, so the rules stay written once, in
    ``kevload.load.level`` and ``kevload.load.schedule``, and apply to the sends of all workers
    together. ``halted`` is the run's flag.
    """

    def __init__(self, plan: Plan, state: Any):
        # The raw array under the one lock: a synchronized array's own indexing would take the lock
        # per item.
        self._lock = state.get_lock()
        self._state: MutableSequence[float] = state.get_obj()  # the shared doubles
        super().__init__(plan)
        self._fields = [(self, name, type(getattr(self, name))) for name in Level.STATE] + [
            (plan, name, type(getattr(plan, name))) for name in plan.COUNTERS
        ]
        if LEVEL + len(self._fields) > _STATE_SIZE:
            raise RuntimeError(f"a level has {len(self._fields)} shared fields; raise _STATE_SIZE")

    @property
    def halted(self) -> bool:
        return self._state[HALTED] != 0  # a plain read: the flag only ever goes from 0 to 1

    @halted.setter
    def halted(self, value: bool) -> None:
        if value:
            _halt(self._state)

    def publish(self) -> None:
        """The leader's fresh level becomes the shared state (before the level's barrier: nobody
        reads the old)."""
        with self._lock:
            self._store()

    def next(self, role: Role, at: float = 0.0) -> bool:
        with self._lock:
            self._load()
            return super().next(
                role, at
            )  # a slot's question changes nothing but done_here, which is per worker

    def claim(self, role: Role, at: float = 0.0) -> Claim:
        with self._lock:
            self._load()
            claim = super().claim(role, at)
            self._store()
        return claim

    def release(self, claim: Claim) -> bool:
        with self._lock:
            self._load()
            counted = super().release(claim)
            self._store()
        return counted

    def pause(self) -> None:
        with self._lock:
            self._load()
            super().pause()
            self._store()

    def resume(self) -> None:
        with self._lock:
            self._load()
            super().resume()
            self._store()

    def slot_done(self, role: Role) -> None:
        with self._lock:
            self._load()
            super().slot_done(role)
            self._store()

    def _load(self) -> None:
        state = self._state
        for i, (owner, name, kind) in enumerate(self._fields, LEVEL):
            setattr(owner, name, kind(state[i]))

    def _store(self) -> None:
        state = self._state
        for i, (owner, name, _) in enumerate(self._fields, LEVEL):
            state[i] = getattr(owner, name)


class OneOfN(engine.Alone):
    """What every worker set deals out the same way (local processes or Ray actors): worker 0 leads
    and sends the warm-ups, worker *w* runs its dealt slots and sends open-loop arrivals *w*,
    *w* + N, …"""

    def __init__(self, worker: int, workers: int):
        self.worker, self.workers = worker, workers
        self.warms_up = worker == 0

    @property
    def leader(self) -> bool:
        return self.worker == 0

    def slots(self, plan: Plan) -> tuple[Role, ...]:
        return (
            slots_of(plan.slots, self.worker, self.workers) if isinstance(plan, ClosedLoop) else ()
        )

    def mine(self, arrival: int) -> bool:
        return arrival % self.workers == self.worker


class Shared(OneOfN):
    """The engine's view of the other worker processes: one level in shared memory, this worker's
    slots, barriers."""

    def __init__(self, worker: int, workers: int, state: Any, stop: asyncio.Event):
        super().__init__(worker, workers)
        self._shared = state  # what each SharedLevel is built on
        self._lock = state.get_lock()
        self._state: MutableSequence[float] = state.get_obj()  # the shared doubles
        self._stop = stop
        self._passed = 0  # barriers this worker has reached

    def level(self, plan: Plan) -> tuple[Level, tuple[Role, ...]]:
        level = SharedLevel(plan, self._shared)
        if self.leader:
            # Every worker is past the last level's end barrier: nobody reads the old state
            level.publish()
        return level, self.slots(plan)

    def halted(self) -> bool:
        return self._state[HALTED] != 0

    def halt(self) -> None:
        _halt(self._state)

    async def start(self, level: Level, lead: float) -> float:
        if self.leader:
            # Leave the others time to get through the barrier before the first arrival is due.
            self._state[START] = time.perf_counter() + lead + 0.05
        await self._wait()
        return self._state[START]

    async def end(self, level: Level) -> None:
        await self._wait()

    async def _wait(self) -> None:
        """Wait at the barrier until every worker reached it, or a halt. Polled, not a
        multiprocessing.Barrier: its condition waits for every sleeper to wake, so one worker killed
        while waiting there left the others and the driver's abort waiting for ever; here a dead
        worker holds the others up only until the driver sees its death and halts the run."""
        self._passed += 1
        with self._lock:
            self._state[PASSED] += 1
        while self._state[PASSED] < self._passed * self.workers:
            if self.halted():
                self._stop.set()
                return
            await asyncio.sleep(_BARRIER_S)


@dataclass(frozen=True)
class WorkerResult:
    worker: int
    records: int
    aborted: bool
    error: str | None = None
    node: str | None = None  # the Ray node a worker actor ran on (kevload.load.rayworkers)
    # A worker process, Ray actor or node that died: the run lost a worker, not a bug.
    lost: bool = False
    # Requests it numbered (None: not known, it died); more than ``records``: some unrecorded.
    sent: int | None = None


async def run_workers(
    scenario: Scenario,
    run_dir: Path,
    *,
    run_id: str,
    stop: asyncio.Event,
    already: dict[engine.LevelKey, int],
    first_seq: int,
    part: int,
    offset: float,
) -> list[WorkerResult]:
    """Run the scenario on ``load.workers`` processes; returns once all have ended (each writes its
    own file).

    A stop (Ctrl-C, SIGTERM) reaches the workers through the HALTED flag in shared memory, which
    also ends their waits at a barrier; a worker that aborts (the error rule) or dies stops the
    others the same way.
    """
    workers = scenario.load.workers
    ctx = multiprocessing.get_context("spawn")  # never fork a process that runs an event loop
    state = ctx.Array("d", _STATE_SIZE)
    flags = state.get_obj()
    job = _Job(workers, scenario, run_id, already, first_seq, part, offset, os.getpid())
    started = [
        _start(ctx, worker, job, run_dir / records_name(worker), state) for worker in range(workers)
    ]
    results: dict[int, WorkerResult] = {}
    halted_at: float | None = None
    try:
        while len(results) < workers:
            if stop.is_set():
                _halt(flags)
            if flags[HALTED] and halted_at is None:
                halted_at = time.monotonic()
            for worker, (pipe, proc) in enumerate(started):
                if worker in results:
                    continue
                result = _heard_from(worker, pipe, proc, halted_at)
                if result is not None:
                    results[worker] = result
                    if result.aborted or result.error:
                        _halt(flags)
            await asyncio.sleep(_WATCH_S)
    finally:
        if len(results) < workers:  # the driver itself was cancelled: take the workers down with it
            _halt(flags)
        for _, proc in started:
            proc.join(timeout=engine.STOP_GRACE_S + 5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [results[w] for w in range(workers)]


@dataclass(frozen=True)
class _Job:
    """What every worker process of a run is given alike (pickled to it when it starts)."""

    workers: int
    scenario: Scenario
    run_id: str
    already: dict[engine.LevelKey, int]
    first_seq: int
    part: int
    offset: float  # perf_counter → Unix time, measured once by the driver for the whole host
    parent: int  # the driver's pid: a worker whose parent is another has lost its driver


def _start(ctx: Any, worker: int, job: _Job, path: Path, state: Any) -> tuple[Any, Any]:
    """One worker process, started; returns the end of the pipe its result comes back on, and the
    process."""
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_worker_main,
        name=f"kevload-worker-{worker}",
        daemon=True,
        args=(worker, job, str(path), state, send),
    )
    proc.start()
    send.close()
    return receive, proc


def _heard_from(worker: int, pipe: Any, proc: Any, halted_at: float | None) -> WorkerResult | None:
    """How a worker ended, once it has: the result it sent, or lost (it died, or did not stop within
    ``_HALT_GRACE_S`` of the halt, and is killed); None while it runs."""
    alive = proc.is_alive()  # read before the pipe: a worker sends its result, then exits
    try:
        result: WorkerResult | None = pipe.recv() if pipe.poll() else None
    except EOFError:  # its end closed the pipe with no result in it
        result, alive = None, False
    if result is not None:
        return result
    if not alive:
        # Killed (the OOM killer, kill -9): a lost worker, as a Ray actor's death is, not a bug.
        proc.join(timeout=engine.STOP_GRACE_S)  # its exit code
        return WorkerResult(worker, 0, False, f"died (exit code {proc.exitcode})", lost=True)
    if halted_at is not None and time.monotonic() - halted_at > _HALT_GRACE_S:
        proc.kill()  # its records so far are on disk already, one write each
        proc.join(timeout=engine.STOP_GRACE_S)
        return WorkerResult(
            worker,
            0,
            False,
            f"did not stop within {_HALT_GRACE_S:g} s of the halt (killed)",
            lost=True,
        )
    return None


def _halt(flags: Any) -> None:
    # Every worker stops resending only after the flag is set, so an answer that finds it unset had
    # its batch kept full to its end, and one that finds it set is not counted (engine). Written
    # without the lock: a process that dies never holds it up.
    flags[HALTED] = 1


def _worker_main(worker: int, job: _Job, path: str, state: Any, pipe: Any) -> None:
    # Ctrl-C reaches the whole process group, and so does a CI timeout's SIGTERM: the driver alone
    # decides, and tells the workers through the HALTED flag.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import uvloop

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            result = runner.run(_work(worker, job, Path(path), state))
    except Exception:  # noqa: BLE001 - the driver shows it; a worker has no terminal of its own
        result = WorkerResult(worker, 0, False, traceback.format_exc(limit=8))
    pipe.send(result)
    pipe.close()


async def _work(worker: int, job: _Job, path: Path, state: Any) -> WorkerResult:
    from kevload.wire.client import Client

    stop = asyncio.Event()
    flags = state.get_obj()

    async def watch() -> None:
        while not stop.is_set():
            if (
                flags[HALTED] or os.getppid() != job.parent
            ):  # a stop, another worker's abort, or the driver died
                stop.set()
                return
            await asyncio.sleep(_WATCH_S)

    scenario = job.scenario
    cap = scenario.load.max_in_flight
    mine = replace(
        scenario, load=replace(scenario.load, max_in_flight=cap_of(cap, worker, job.workers))
    )
    client = Client(mine.target, mine.api_key())
    team = Shared(worker, job.workers, state, stop)
    stream = engine.run(
        mine,
        client,
        run_id=job.run_id,
        stop=stop,
        already=job.already,
        first_seq=job.first_seq,
        part=job.part,
        team=team,
    )
    watcher = asyncio.create_task(watch())
    with RecordWriter(path) as writer:
        try:
            async with client, aclosing(stream.__aiter__()) as records:
                async for record in records:
                    writer.write(stamp(record, worker, job.offset, cap))
        finally:
            watcher.cancel()
    return WorkerResult(worker, writer.count, stream.aborted, sent=stream.sent)


def stamp(record: Record, worker: int, offset: float, max_in_flight: int) -> Record:
    """A worker's record as the run keeps it: its worker, Unix times, and the open loop's whole
    cap."""
    shift = {
        name: value + offset
        for name in ("t_scheduled", "t_send", "t_first_byte", "t_first_token", "t_last_byte")
        if (value := getattr(record, name)) is not None
    }
    if record.rate is not None:
        shift["max_in_flight"] = max_in_flight or None
    return msgspec.structs.replace(record, worker=worker, **shift)
