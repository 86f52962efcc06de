"""The level's promise proved without a process: N simulated workers drive
``kevload.load.level.Level`` through random answer orders, retry back-offs, stops and resumes, one
shared level (worker processes) or one level per worker with a coordinator's hold (Ray actors). Each
rule is one step of the event loop (an answer and the slot's resend are one, as in the engine; a
level's start is one instant for every worker)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kevload.load.level import Claim, Level
from kevload.load.rayworkers import quota
from kevload.load.schedule import PROBE, ClosedLoop, Role
from kevload.load.workers import slots_of


@dataclass
class Request:
    level: int
    worker: int
    slot: int
    claim: Claim
    fewest: (
        int  # the fewest others in flight at the end of any step of its life (a start is one step)
    )
    paused: bool = False
    # a back-off anywhere during its life: the batch around it may have shrunk
    was_paused: bool = False


@dataclass
class Worker:
    level: Level
    slots: list[Role]
    running: set[int] = field(default_factory=set)  # slot indexes still sending


class LevelMachine(RuleBasedStateMachine):
    @initialize(
        shared=st.booleans(),
        workers=st.integers(1, 3),
        levels=st.lists(st.integers(1, 6), min_size=1, max_size=3),
        companions=st.booleans(),
        samples=st.integers(1, 8),
    )
    def setup(
        self, shared: bool, workers: int, levels: list[int], companions: bool, samples: int
    ) -> None:
        self.shared, self.workers, self.levels = shared, workers, levels
        self.companions, self.samples = companions, samples
        self.index = 0  # the level running now
        self.kept: dict[
            int, int
        ] = {}  # counted probe samples per level, over every part of the run
        self.counted_ids: set[int] = set()
        self.flight: dict[int, Request] = {}
        self.next_id = 0
        self.stopped = False
        self.any_pause = False
        self._start_level()

    # --- the level, as each way of reaching it builds it ---

    def _start_level(self) -> None:
        """Every worker starts the level at one instant: all their slots claim in one step."""
        c = self.levels[self.index]
        needed = self.samples - self.kept.get(self.index, 0)
        plan = ClosedLoop(c, needed, companions=self.companions)
        shared = Level(plan)
        self.team: list[Worker] = []
        for w in range(self.workers):
            slots = list(slots_of(plan.slots, w, self.workers))
            if self.shared:
                level = shared
            else:  # as RayTeam.level builds it
                mine = ClosedLoop(
                    c,
                    quota(needed, plan.slots.count(PROBE), w, self.workers),
                    companions=self.companions,
                )
                level = Level(mine, elsewhere=c - len(slots), held=self.workers > 1)
                level.done_here = PROBE not in slots
            self.team.append(Worker(level, slots, set(range(len(slots)))))
        self.done: set[int] = set()
        for w, worker in enumerate(self.team):
            for slot in sorted(worker.running):
                self._ask(w, slot)
        self._coordinate()
        self._end_step()

    def _ask(self, w: int, slot: int) -> None:
        """The slot asks its level whether to send again; it sends at once, or ends."""
        worker = self.team[w]
        role = worker.slots[slot]
        if not worker.level.next(role):
            worker.level.slot_done(role)
            worker.running.discard(slot)
            return
        others = len(self.flight) - sum(r.paused for r in self.flight.values())
        claim = worker.level.claim(role)
        if self.shared:  # one count for every worker: exact at the send
            assert claim.others == others, (claim, others)
        if claim.counted:
            assert claim.others == self.levels[self.index] - 1, claim
        self.flight[self.next_id] = Request(
            self.index, w, slot, claim, fewest=self.levels[self.index]
        )
        self.next_id += 1

    def _coordinate(self) -> None:
        """The Ray coordinator's one call per actor and level: an actor whose own plan is done says
        so; once all have, every actor's hold is let go."""
        if self.shared:
            return
        self.done |= {w for w, worker in enumerate(self.team) if worker.level.done_here}
        if len(self.done) == self.workers:
            for worker in self.team:
                worker.level.release_hold()

    def _end_step(self) -> None:
        """After each step: every request in flight notes the others around it; a level whose
        workers all ended and whose requests are all answered gives way to the next (the
        barrier)."""
        live = len(self.flight) - sum(r.paused for r in self.flight.values())
        for request in self.flight.values():
            request.fewest = min(request.fewest, live - (not request.paused))
        if self.flight or any(worker.running for worker in self.team):
            return
        if self.stopped:
            return
        if self.kept.get(self.index, 0) >= self.samples:
            self.index += 1
            if self.index < len(self.levels):
                self._start_level()

    # --- the rules ---

    @precondition(lambda self: any(not r.paused for r in self.flight.values()))
    @rule(data=st.data())
    def answer(self, data: st.DataObject) -> None:
        self._answer(
            data.draw(st.sampled_from(sorted(i for i, r in self.flight.items() if not r.paused)))
        )

    def _answer(self, request_id: int) -> None:
        request = self.flight.pop(request_id)
        worker = self.team[request.worker]
        counted = worker.level.release(request.claim)
        assert not counted or request.claim.counted
        if counted and request.claim.role == PROBE:
            assert request.level == self.index  # no answer of an earlier level comes in this one
            if not request.was_paused:
                assert request.fewest >= self.levels[self.index] - 1, request
            self.kept[self.index] = self.kept.get(self.index, 0) + 1
        if counted:
            assert request_id not in self.counted_ids  # nothing counted twice
            self.counted_ids.add(request_id)
        if request.slot in worker.running:
            self._ask(request.worker, request.slot)
        self._coordinate()
        self._end_step()

    @precondition(lambda self: self.shared and any(not r.paused for r in self.flight.values()))
    @rule(data=st.data())
    def back_off(self, data: st.DataObject) -> None:
        """A 429's back-off: the request leaves the count until its retry."""
        ids = sorted(i for i, r in self.flight.items() if not r.paused)
        request = self.flight[data.draw(st.sampled_from(ids))]
        self.team[request.worker].level.pause()
        request.paused = True
        for other in self.flight.values():
            other.was_paused = True
        self._end_step()

    @precondition(lambda self: any(r.paused for r in self.flight.values()))
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        ids = sorted(i for i, r in self.flight.items() if r.paused)
        request = self.flight[data.draw(st.sampled_from(ids))]
        self.team[request.worker].level.resume()
        request.paused = False
        self._end_step()

    @precondition(lambda self: not self.stopped and self.index < len(self.levels))
    @rule()
    def stop(self) -> None:
        """Ctrl-C: every worker's level halts; what is in flight is answered, uncounted."""
        self.stopped = True
        for worker in self.team:
            worker.level.halt()
        self._end_step()

    @precondition(lambda self: self.stopped and not self.flight and self.index < len(self.levels))
    @rule()
    def resume(self) -> None:
        """--resume: the stopped level again, for the samples it still lacks (the records'
        count)."""
        self.stopped = False
        if self.kept.get(self.index, 0) >= self.samples:
            self.index += 1
        if self.index < len(self.levels):
            self._start_level()

    @precondition(lambda self: self.index >= len(self.levels))
    @rule()
    def finished(self) -> None:
        """The run is over: every level has exactly the samples asked for."""
        assert not self.flight and all(
            self.kept.get(i, 0) == self.samples for i in range(len(self.levels))
        )

    @invariant()
    def counts_agree(self) -> None:
        if not hasattr(self, "team"):
            return
        levels = {id(worker.level): worker.level for worker in self.team}
        ours = sum(r.paused is False and r.level == self.index for r in self.flight.values())
        assert sum(level.in_flight for level in levels.values()) == ours
        assert all(
            r.level == self.index for r in self.flight.values()
        )  # no level overlaps the next
        assert self.kept.get(self.index, 0) <= self.samples  # never more than asked

    def teardown(self) -> None:
        # Answer everything, resume until done: every level ends with exactly its samples, each
        # counted once.
        for _ in range(10_000):
            if self.index >= len(self.levels):
                break
            if any(r.paused for r in self.flight.values()):
                for request in self.flight.values():
                    if request.paused:
                        self.team[request.worker].level.resume()
                        request.paused = False
            elif self.flight:
                self._answer(min(self.flight))
            elif self.stopped:
                self.resume()
            else:
                raise AssertionError(f"level {self.index} stalled: {self.kept}")
        assert self.index >= len(self.levels), "the run did not finish"
        assert all(self.kept.get(i, 0) == self.samples for i in range(len(self.levels))), self.kept


LevelMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLevelMachine = LevelMachine.TestCase


def test_worker_processes_share_exactly_the_declared_state():
    """Two workers' levels over one shared array see one count and one plan: what STATE and COUNTERS
    name, and every counter a level changes as it runs is among them (a new one is shared on purpose
    or the test fails)."""
    import multiprocessing

    from kevload.load.workers import _STATE_SIZE, SharedLevel

    state = multiprocessing.get_context("spawn").Array("d", _STATE_SIZE)
    plans = [ClosedLoop(3, 2, companions=True), ClosedLoop(3, 2, companions=True)]
    before = {
        name: value for name, value in vars(plans[0]).items() if isinstance(value, int | float)
    }
    leader, other = (SharedLevel(plan, state) for plan in plans)
    leader.publish()
    companions = [leader.claim("companion"), other.claim("companion")]
    probe = leader.claim(PROBE)
    assert [c.others for c in (*companions, probe)] == [0, 1, 2] and probe.counted
    assert (
        other.next(PROBE) and other.in_flight == 3
    )  # each call brings the count up to date from the array
    assert (
        other.release(probe) and other.claim(PROBE).counted
    )  # the plan's count travelled too: 2 samples
    other.slot_done(PROBE)
    other.halt()
    assert leader.halted and not leader.next("companion")  # the run's one flag
    changed = {
        name
        for plan in plans
        for name, value in vars(plan).items()
        if isinstance(value, int | float) and before.get(name) != value
    }
    assert changed <= set(ClosedLoop.COUNTERS), changed - set(ClosedLoop.COUNTERS)
