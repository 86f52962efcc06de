"""Workers as Ray actors (``--ray ADDRESS``): the ``load.workers`` of ``kevload.load.workers``,
spread over a cluster.

No request waits for another actor. Each actor decides alone, on a ``Level`` of its own slots
(``RayTeam``), and one coordinator actor is called a handful of times per level, never per request:

- Closed loop: the slots are dealt as in ``kevload.load.workers`` (``slots_of``) and the level's
  samples split between the probe slots (``quota``). A send counts when the actor's own slots are
  all in flight (the other actors' slots taken as busy: the record's ``in_flight`` is *c* − 1) and
  its plan still wants samples. An actor whose plan is done says so (``done``) and keeps its slots
  sending, uncounted, until every actor has: no actor stops while another one counts. So a counted
  sample is one sent in the level's full phase, between the start (one Unix time for every actor)
  and the first actor's end. Whether the other hosts' slots really were in flight is shown from the
  records: each cell's ``full_load_share`` and ``samples_never_full`` (``kevload.compare.overlap``).
- Open loop: actor *w* sends arrivals *w*, *w* + N, … against one level start; ``in_flight`` is its
  own count.
- The coordinator calls: per level and actor, the barrier at its start and end and one ``done``; per
  actor and run one ``wait_halt`` (how a stop or another actor's abort reaches it); ``run.json``
  keeps the count.
- A stop (Ctrl-C, SIGTERM), an actor's abort (the error rule) or a lost actor halts the coordinator,
  which opens its barrier and tells every worker. Actors hear of it a message later, each at its own
  moment, so the driver applies the engine's rule at a stop itself: a closed-loop answer that came
  after the time it stopped the run is written as not counted. An actor's own stopped slots release
  nothing to anyone: their count is local.

Records travel to the driver in batches: every ``_BATCH_S`` seconds it drains each actor's finished
records (JSON lines, stamped as the local workers stamp them, with Unix times from that actor's host
clock) and appends them to ``records-<worker>.jsonl`` in the run directory, so a stopped run keeps
every record an actor had finished.

Ray is imported only here and in ``kevload.load.cluster``, and only when ``--ray`` asks for it; the
actor classes are plain classes made remote at run time.
"""

from __future__ import annotations

import asyncio
import copy
import time
from contextlib import aclosing, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from kevload.errors import ClusterError, InputError
from kevload.inputs.scenario import Scenario
from kevload.load import engine
from kevload.load.level import Level, Plan
from kevload.load.schedule import PROBE, ClosedLoop, Role
from kevload.load.workers import OneOfN, WorkerResult, cap_of, clock_offset, records_name, stamp
from kevload.records.store import RecordWriter, record_line

_BATCH_S = 0.2  # how often the driver collects finished records
_REPLY_S = 60.0  # an actor that does not answer a drain (or get placed) for this long is lost
# A level starts this long after the barrier opens: time for the news to reach every host
_START_MARGIN_S = 0.1


class KevloadCoordinator:
    """What the actors of a run agree on (an async Ray actor), a handful of calls per level and
    never per request: the barrier at each level's start and end, the moment every actor's plan is
    done, and the halt."""

    def __init__(self, workers: int):
        self.workers = workers
        self._calls = 0
        self._arrived = 0
        self._gate = asyncio.Event()
        self._start = 0.0
        self._done = 0
        self._all_done = asyncio.Event()
        self._halted = asyncio.Event()

    async def arrive(self, lead: float) -> float | None:
        """The barrier at a level's start and end; returns the level's start (Unix time), None once
        halted."""
        self._calls += 1
        if self._halted.is_set():
            return None
        gate = self._gate
        self._arrived += 1
        if self._arrived == self.workers:
            # Nobody is between a level's start and its last done: the next level's count starts
            # afresh.
            self._arrived, self._done = 0, 0
            self._start = time.time() + lead + _START_MARGIN_S
            self._gate = asyncio.Event()
            gate.set()
        else:
            await gate.wait()
        return None if self._halted.is_set() else self._start

    async def done(self) -> None:
        """This actor's plan for the level is done (nothing of it counts any more); returns once
        every actor's is, or at a halt. Until then the actor keeps its slots sending, uncounted, for
        the others' counted samples."""
        self._calls += 1
        gate = self._all_done
        self._done += 1
        if self._done == self.workers:
            self._all_done = asyncio.Event()
            gate.set()
        else:
            await asyncio.wait(
                [asyncio.ensure_future(gate.wait()), asyncio.ensure_future(self._halted.wait())],
                return_when=asyncio.FIRST_COMPLETED,
            )

    def halt(self) -> None:
        self._calls += 1
        self._halted.set()
        self._gate.set()

    async def wait_halt(self) -> bool:
        self._calls += 1
        await self._halted.wait()
        return True

    def calls(self) -> int:
        """Calls the actors and the driver made so far (this one not included): the bench's
        figure."""
        return self._calls


class RayTeam(OneOfN):
    """The engine's view of the other actors: each actor decides alone on a level of its own slots.

    Closed loop: the level's other slots, on other actors, are taken as busy (``Level.elsewhere``),
    so a send counts when this actor's own slots are all in flight and its plan still wants samples;
    the samples wanted are split between the actors' probe slots (``quota``). Once its plan is done
    an actor keeps its slots sending, uncounted, until every actor's is (one ``done`` call each), so
    no actor's counted samples see the level shrink. Nothing is asked per request: the records show
    afterwards how full the level was (``full_load_share``, ``samples_never_full``).
    """

    def __init__(
        self, worker: int, workers: int, coordinator: Any, offset: float, stop: asyncio.Event
    ):
        super().__init__(worker, workers)
        self._coordinator = coordinator
        self._offset = offset  # this host's perf_counter → Unix time
        self._stop = stop
        self._hold: asyncio.Task[None] | None = None

    def level(self, plan: Plan) -> tuple[Level, tuple[Role, ...]]:
        if not isinstance(plan, ClosedLoop):
            return Level(plan), ()
        slots = self.slots(plan)
        mine = copy.copy(
            plan
        )  # the level's plan with this actor's share of its samples; the rest is the same
        mine.needed = quota(plan.needed, plan.slots.count(PROBE), self.worker, self.workers)
        level = Level(mine, elsewhere=plan.concurrency - len(slots), held=self.workers > 1)
        level.done_here = (
            PROBE not in slots
        )  # an actor with no probe slot has nothing of its own to finish
        return level, slots

    async def start(self, level: Level, lead: float) -> float:
        start: float | None = await self._coordinator.arrive.remote(lead)
        if start is None:
            self._stop.set()
            return time.perf_counter()
        if level.held:
            done = asyncio.Event()
            level.on_done = done.set
            if level.done_here:
                done.set()
            self._hold = asyncio.create_task(self._until_all_done(level, done))
        return start - self._offset

    async def _until_all_done(self, level: Level, done: asyncio.Event) -> None:
        await done.wait()
        await self._coordinator.done.remote()
        level.release_hold()

    async def end(self, level: Level) -> None:
        if self._hold is not None:
            self._hold.cancel()  # a halt ended the level before every actor was done
            self._hold = None
        if await self._coordinator.arrive.remote(0.0) is None:
            self._stop.set()

    def halt(self) -> None:
        self._coordinator.halt.remote()


def quota(needed: int, probe_slots: int, worker: int, workers: int) -> int:
    """This actor's share of a level's ``needed`` probe samples: each probe slot an equal share, the
    first slots (dealt round-robin, as ``slots_of`` deals them) one more where they do not divide
    evenly."""
    if not probe_slots:
        return 0
    return sum(
        needed // probe_slots + (slot < needed % probe_slots)
        for slot in range(worker, probe_slots, workers)
    )


class KevloadWorker:
    """One worker (an async Ray actor): runs the engine with a ``RemoteShare``, keeps finished
    records for ``drain``."""

    def __init__(
        self,
        worker: int,
        workers: int,
        scenario: Scenario,
        run_id: str,
        already: dict[engine.LevelKey, int],
        first_seq: int,
        part: int,
        coordinator: Any,
    ):
        self.worker, self.workers = worker, workers
        self.scenario, self.run_id = scenario, run_id
        self.already, self.first_seq, self.part = already, first_seq, part
        self.coordinator = coordinator
        self._lines: list[bytes] = []
        self._stop = asyncio.Event()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    async def run(self) -> WorkerResult:
        from kevload.wire.client import Client

        cap = self.scenario.load.max_in_flight
        mine = replace(
            self.scenario,
            load=replace(self.scenario.load, max_in_flight=cap_of(cap, self.worker, self.workers)),
        )
        offset = (
            clock_offset()
        )  # this host's own: records carry Unix times from the host that sent them
        client = Client(mine.target, mine.api_key())
        team = RayTeam(self.worker, self.workers, self.coordinator, offset, self._stop)
        stream = engine.run(
            mine,
            client,
            run_id=self.run_id,
            stop=self._stop,
            already=self.already,
            first_seq=self.first_seq,
            part=self.part,
            team=team,
        )
        watcher = asyncio.create_task(self._watch())
        count = 0
        try:
            async with client, aclosing(stream.__aiter__()) as records:
                async for record in records:
                    self._lines.append(record_line(stamp(record, self.worker, offset, cap)))
                    count += 1
        finally:
            watcher.cancel()
        return WorkerResult(self.worker, count, stream.aborted, sent=stream.sent)

    async def _watch(self) -> None:
        """Another actor's abort, or the driver's stop, reaches this one through the coordinator."""
        await self.coordinator.wait_halt.remote()
        self._stop.set()

    async def drain(self) -> bytes:
        """The records finished since the last drain, as JSON lines."""
        lines, self._lines = self._lines, []
        return b"".join(lines)

    async def stop(self) -> None:
        self._stop.set()


def check_cluster(ray: Any, scenario: Scenario) -> None:
    """Refuse a run the cluster has no room for, before anything is written: each worker actor takes
    one CPU."""
    cpus = ray.cluster_resources().get("CPU", 0)
    if cpus < scenario.load.workers:
        raise InputError(
            f"--ray: load.workers = {scenario.load.workers}, but the cluster has {cpus:g} CPUs "
            "(each worker actor takes one)"
        )


async def run_ray(
    ray: Any,
    scenario: Scenario,
    run_dir: Path,
    *,
    run_id: str,
    stop: asyncio.Event,
    already: dict[engine.LevelKey, int],
    first_seq: int,
    part: int,
) -> RayRun:
    """Run the scenario on ``load.workers`` actors of the connected cluster; returns once all have
    ended.

    Each result carries the node its actor ran on. A lost actor (its process or node died, or it
    stopped answering) halts the others and comes back with ``lost`` set; every record drained
    before stays on disk.
    """
    workers = scenario.load.workers
    coordinator = ray.remote(KevloadCoordinator).options(num_cpus=0).remote(workers)
    # SPREAD: one actor per node where it can, so the workers add hosts' cores rather than share one
    # host's.
    actor = ray.remote(KevloadWorker).options(num_cpus=1, scheduling_strategy="SPREAD")
    actors = [
        actor.remote(w, workers, scenario, run_id, already, first_seq, part, coordinator)
        for w in range(workers)
    ]
    driver = _Driver(ray, coordinator, actors, await _placed(ray, coordinator, actors), run_dir)
    try:
        while len(driver.drained) < workers:
            if stop.is_set():
                driver.halt()
            await _wait_stop(stop, _BATCH_S)
            await driver.settle()
    finally:
        calls = await driver.finish()
    return driver.ended(calls)


async def _placed(ray: Any, coordinator: Any, actors: list[Any]) -> list[str]:
    """The node each actor was placed on; actors not all placed in time fail the run before it
    begins, taken down with the coordinator."""
    try:
        nodes: list[str] = await asyncio.wait_for(
            asyncio.gather(*(a.node.remote() for a in actors)), _REPLY_S
        )
    except (TimeoutError, ray.exceptions.RayError) as exc:
        _kill(ray, [coordinator, *actors])
        raise ClusterError(
            f"--ray: the cluster did not start {len(actors)} worker actors in {_REPLY_S:g} s "
            f"({_why(exc)})"
        ) from None
    return nodes


class _Driver:
    """The driver's side of a run on actors: each actor's finished records appended to its file, how
    each actor ended, and the halt that reaches them all through the coordinator."""

    def __init__(
        self, ray: Any, coordinator: Any, actors: list[Any], nodes: list[str], run_dir: Path
    ):
        self.ray, self.coordinator, self.actors, self.nodes = ray, coordinator, actors, nodes
        self.workers = len(actors)
        self.runs = {actor.run.remote(): w for w, actor in enumerate(actors)}
        self.results: dict[int, WorkerResult] = {}
        self.drained: set[int] = set()  # actors whose last records are on disk (or that are lost)
        self.files = [RecordWriter(run_dir / records_name(w)) for w in range(self.workers)]
        # The stop's time, taken before any actor can hear of it, in the records' terms
        # (perf_counter plus an offset measured at the start, as each actor stamps its records): on
        # one host the same clock, whatever NTP does since.
        self.offset = clock_offset()
        self.halted_at: float | None = None

    def halt(self) -> None:
        if self.halted_at is None:
            self.halted_at = time.perf_counter() + self.offset
            self.coordinator.halt.remote()
            for w, handle in enumerate(self.actors):
                if w not in self.results:
                    handle.stop.remote()

    def end(self, w: int, result: WorkerResult) -> None:
        self.results[w] = result
        if result.aborted or result.error:
            self.halt()

    async def collect(self) -> None:
        """Append each actor's finished records to its file; an actor that ended is drained one last
        time."""
        live = [w for w in range(self.workers) if w not in self.drained]
        replies = await asyncio.gather(
            *(asyncio.wait_for(self.actors[w].drain.remote(), _REPLY_S) for w in live),
            return_exceptions=True,
        )
        for w, reply in zip(live, replies, strict=True):
            if isinstance(reply, bytes):
                halted_at = self.halted_at
                self.files[w].write_lines(reply if halted_at is None else _cut(reply, halted_at))
                if w in self.results:
                    self.drained.add(w)
            else:
                self.drained.add(w)
                if w not in self.results or not self.results[w].lost:
                    self.end(w, _lost(w, self.nodes[w], reply))

    async def settle(self) -> None:
        """Take in the results of the actors that ended, then collect every actor's records."""
        ray = self.ray
        ready, _ = ray.wait(list(self.runs), num_returns=len(self.runs), timeout=0)
        for ref in ready:
            w = self.runs.pop(ref)
            if w in self.results:
                continue
            try:
                self.end(w, replace(await ref, node=self.nodes[w]))
            except ray.exceptions.RayActorError as exc:
                self.drained.add(w)
                self.end(w, _lost(w, self.nodes[w], exc))
            except (
                ray.exceptions.RayTaskError
            ) as exc:  # a bug in the worker: shown as the local workers show it
                self.end(w, WorkerResult(w, 0, False, str(exc), node=self.nodes[w]))
        await self.collect()

    async def finish(self) -> int | None:
        """Close the files and take the actors down; returns the coordinator's count of calls."""
        if (
            len(self.drained) < self.workers
        ):  # the driver itself was cancelled: stop the actors, keep what they finished
            self.halt()
            await asyncio.wait(
                [asyncio.ensure_future(ref) for ref in self.runs], timeout=engine.STOP_GRACE_S + 5
            )
            await self.settle()
        for file in self.files:
            file.close()
        calls = await _calls(self.ray, self.coordinator)
        _kill(self.ray, [self.coordinator, *self.actors])
        return calls

    def ended(self, calls: int | None) -> RayRun:
        """How each actor ended (one that never reported: no records, not aborted), with its records
        on disk."""
        return RayRun(
            [
                replace(
                    self.results.get(w) or WorkerResult(w, 0, False, node=self.nodes[w]),
                    records=self.files[w].count,
                )
                for w in range(self.workers)
            ],
            calls,
        )


@dataclass(frozen=True)
class RayRun:
    """How a run's actors ended, and how often the coordinator was called (None: it did not
    answer)."""

    results: list[WorkerResult]
    coordinator_calls: int | None


async def _calls(ray: Any, coordinator: Any) -> int | None:
    try:
        return await asyncio.wait_for(coordinator.calls.remote(), _BATCH_S * 10)
    except (TimeoutError, ray.exceptions.RayError):
        return None


def _cut(lines: bytes, stopped_at: float) -> bytes:
    """The engine's rule at a stop, on the driver's clock: a closed-loop answer that came after the
    stop lost its batch and is not counted. An actor hears of the stop a message later, and not at
    the same moment as the others."""
    kept = []
    for line in lines.splitlines(keepends=True):
        record = orjson.loads(line)
        if record["counted"] and record["rate"] is None and record["t_last_byte"] > stopped_at:
            line = orjson.dumps({**record, "counted": False}) + b"\n"
        kept.append(line)
    return b"".join(kept)


def _lost(worker: int, node: str, exc: BaseException) -> WorkerResult:
    return WorkerResult(
        worker, 0, False, f"lost on node {node[:12]} ({_why(exc)})", node=node, lost=True
    )


def _why(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


async def _wait_stop(stop: asyncio.Event, seconds: float) -> None:
    with suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def _kill(ray: Any, handles: list[Any]) -> None:
    for handle in handles:
        ray.kill(handle)
