"""One level's state and rules with no I/O (what h11 is to httpcore): its plan, the requests in
flight, which send counts, the hold that keeps a worker sending while others still count, and the
halt at a stop.

Every way of reaching a level calls these methods and nothing else: the engine in one process
directly; worker processes on one host under one lock, with ``STATE`` and the plan's ``COUNTERS``
kept in shared memory (``kevload.load.workers``); Ray actors each on a level of their own slots
(``kevload.load.rayworkers``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from kevload.load.schedule import PROBE, ClosedLoop, OpenLoop, Role

Plan = ClosedLoop | OpenLoop


def decide(plan: Plan, role: Role, others: int, at: float = 0.0) -> bool:
    """The counted rule: whether a send of ``role`` made ``at`` seconds into the level, with
    ``others`` in flight, counts; a counted send is noted on the plan.

    Closed loop: only at full load, exactly *c* − 1 others in flight, and only while the plan wants
    evidence (past the ramp-up, samples or time left). Open loop: every send the schedule wants
    (past its ramp-up, no warm-up): it promises a schedule, not a number in flight.
    """
    full = others == plan.concurrency - 1 if isinstance(plan, ClosedLoop) else True
    counted = full and plan.evidence(role, at)
    if counted:
        plan.counts(role)
    return counted


@dataclass(frozen=True, slots=True)
class Claim:
    """A send as the level saw it: its role, the others in flight when it went, whether it
    counts."""

    role: Role
    others: int
    counted: bool


class Level:
    """The level's rules, applied to one count of requests in flight.

    ``elsewhere``: slots of this level that other workers hold and this one does not see (Ray actors
    decide alone); they are taken as busy, so a send counts when this worker's own slots are all in
    flight. The records say afterwards whether they were (``kevload.compare.overlap``). ``held``:
    other workers still count, so this one's slots keep the level full with uncounted sends after
    its own plan is done, until ``release_hold``.
    """

    # What worker processes share, by name, with the plan's COUNTERS (halted is the run's own flag;
    # held and done_here are each worker's).
    STATE = ("in_flight",)

    def __init__(self, plan: Plan, *, elsewhere: int = 0, held: bool = False):
        self.plan = plan
        self.elsewhere = elsewhere
        self.in_flight = 0
        self.halted = False
        self.held = held
        # the hold was let go: every worker's plan is done, so is the level here
        self.released = False
        self.done_here = False  # this worker's own plan is done: nothing of it counts any more
        # told once done_here is set (a Ray actor tells the others)
        self.on_done: Callable[[], None] | None = None

    def next(self, role: Role, at: float = 0.0) -> bool:
        """Whether the closed-loop slot of ``role`` sends again ``at`` seconds into the level."""
        if self.halted or self.released:
            return False
        plan = self.plan
        assert isinstance(plan, ClosedLoop)  # only a closed loop's slots ask
        if plan.next(role, at) is not None:
            return True
        if role == PROBE and not self.done_here:
            self.done_here = True
            if self.on_done is not None:
                self.on_done()
        return self.held

    def claim(self, role: Role, at: float = 0.0) -> Claim:
        """A send going out now, ``at`` seconds into the level (scheduled, in the open loop):
        counted or not.

        Counted only while the level is not halted: a stop ends the level around what is in flight.
        """
        others = self.in_flight + self.elsewhere
        counted = not self.halted and decide(self.plan, role, others, at)
        self.in_flight += 1
        return Claim(role, others, counted)

    def claim_turn(self, first: Claim) -> Claim:
        """A later turn of a conversation sample going out now. The sample's ``first`` claim (its
        first turn's) is held until its last turn is answered, so the others in flight are the count
        but this sample; the turn counts when the first did, it goes at full load again, and the
        level is not halted."""
        others = self.in_flight - 1 + self.elsewhere
        full = others == self.plan.concurrency - 1 if isinstance(self.plan, ClosedLoop) else True
        return Claim(first.role, others, first.counted and full and not self.halted)

    def release(self, claim: Claim) -> bool:
        """Its answer is in (or it was cut): whether it still counts. A closed-loop answer that
        comes after a halt lost its batch on the way (the other slots no longer resend), so it is no
        sample of full load."""
        self.in_flight -= 1
        self.plan.returned(claim.role, claim.counted)
        return claim.counted and not (self.halted and isinstance(self.plan, ClosedLoop))

    def lost(self, claim: Claim) -> None:
        """A counted claim, released, whose sample lost its full load on the way (a conversation's
        later turn, ``claim_turn``): the plan wants another sample in its place."""
        self.plan.lost(claim.role)

    def pause(self) -> None:
        """A request left the wire for a while (a retry's back-off): it is not in flight
        meanwhile."""
        self.in_flight -= 1

    def resume(self) -> None:
        self.in_flight += 1

    def slot_done(self, role: Role) -> None:
        if isinstance(self.plan, ClosedLoop):
            self.plan.slot_done(role)

    def answered(self, answer: Hashable | None) -> None:
        """A counted probe's answer (sha256 and finish_reason, None for an error), for
        ``load.until_bound``."""
        self.plan.answered(answer)

    def release_hold(self) -> None:
        """Every worker's plan is done: every slot here ends (a companion slot too, whose probe slot
        is elsewhere)."""
        self.held, self.released = False, True

    def halt(self) -> None:
        """A stop, an abort or a lost worker: no slot resends, no answer from now on counts."""
        self.halted = True
