"""When the next request goes and in which role: closed-loop concurrency levels and open-loop rates.

A strategy only decides (like GuideLLM's scheduling strategies); the engine sends, measures and
records. Both are plain objects with no I/O, so their rules are tested without a server.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, get_args

from kevload.compare.verdict import UntilBound

if TYPE_CHECKING:
    from kevload.inputs.probe import Probe
    from kevload.inputs.scenariokeys import Arrival

Role = Literal["probe", "companion", "warmup"]  # what a request is for; records.jsonl's role
PROBE, COMPANION, WARMUP = get_args(Role)


@dataclass(frozen=True, slots=True)
class Send:
    """One request to send: its role and, in the open loop, when it is due (seconds after the
    level's start); ``item`` what it sends where the plan chooses that itself (a trace's request),
    else the probe or a companion."""

    role: Role
    at: float | None = None
    item: Probe | None = None


class ClosedLoop:
    """Level *c*: *c* slots, each sending its next request the moment its previous one returned.

    A probe sample counts only when it is sent with exactly *c* − 1 others in flight
    (``kevload.load.level`` applies that rule; the plan says which sends are wanted as evidence).
    The ramp-up (the first sends of a level, made while the slots fill) is sent but not counted; the
    probe slots send until ``needed`` samples were sent at full load, and then keep the level full
    with uncounted copies (the tail) until every counted sample is answered, so none of them sees
    its batch shrink. In the companion modes one slot sends the probe and the other *c* − 1 send
    companions for as long as the probe slot runs, which does the same.

    Times are ``at``, seconds since the slots started. For ``ramp_s`` seconds nothing counts (a
    ramp-up at the level's load, like a warm-up); with a ``duration`` the level then counts every
    full-load sample for that many seconds, however many that is, instead of ``needed`` ones.

    With ``until`` the number of samples is not fixed: the strategy is told each counted answer
    (``answered``) and stops counting when ``until.reason`` says so. An answer diverges when it
    differs from ``reference`` (the serial cell's modal answer), or, with no reference (the serial
    cell itself), from the cell's first answer. ``prior`` are the answers a resumed level already
    has, in order.
    """

    # The counters that change while the level runs, by name: what worker processes keep in shared
    # memory.
    # (``answers`` is not among them: ``load.until_bound`` runs in one process.)
    COUNTERS: ClassVar[tuple[str, ...]] = (
        "counted",
        "errors",
        "diverged",
        "_counted_in_flight",
        "_probe_slots_open",
    )

    def __init__(
        self,
        concurrency: int,
        needed: int,
        *,
        companions: bool,
        warmup: int = 0,
        ramp_s: float = 0.0,
        duration: float = 0.0,
        until: UntilBound | None = None,
        reference: Hashable | None = None,
        prior: Iterable[Hashable | None] = (),
    ):
        self.concurrency = concurrency
        self.needed = needed
        self.warmup = warmup  # sent one at a time before the slots start; never counted
        self.ramp_s = ramp_s
        self.duration = duration
        self.until = until
        self.reference = reference
        self.counted = 0
        self.errors = 0
        self.diverged = False
        self.answers: dict[Hashable, int] = {}  # ok answers by output, in the order first seen
        self._counted_in_flight = 0
        for answer in prior:
            self.counted += 1
            self.answered(answer)
        probe_slots = 1 if companions and concurrency > 1 else concurrency
        # Companion slots first: they are started first, so even the first probe finds them in
        # flight.
        self.slots: tuple[Role, ...] = (COMPANION,) * (concurrency - probe_slots) + (
            PROBE,
        ) * probe_slots
        self._probe_slots_open = probe_slots

    def next(self, role: Role, at: float = 0.0) -> Send | None:
        """What the slot of ``role`` sends next, or None when it is done."""
        if role == PROBE:
            busy = at < self.ramp_s or self._wanted(at) or self._counted_in_flight
            return Send(PROBE) if busy else None
        return Send(COMPANION) if self._probe_slots_open else None

    @property
    def wants_samples(self) -> bool:
        """Whether the level still counts samples (time aside: see ``_wanted``)."""
        if self.until is None:
            return self.counted < self.needed
        return self.stop_reason is None

    @property
    def stop_reason(self) -> str | None:
        """Why this level stopped counting (None while it counts); ``samples`` without ``until``."""
        if self.until is None:
            return None if self.counted < self.needed else "samples"
        return self.until.reason(self.counted, self.errors, self.diverged)

    def answered(self, answer: Hashable | None) -> None:
        """A counted probe sample's answer: its output (sha256 and finish_reason), or None for an
        error."""
        if answer is None:
            self.errors += 1
            return
        reference = (
            self.reference if self.reference is not None else next(iter(self.answers), answer)
        )
        self.diverged = self.diverged or answer != reference
        self.answers[answer] = self.answers.get(answer, 0) + 1

    def modal(self) -> Hashable | None:
        """The most common ok answer, ties to the one first seen: the reference for the levels after
        this one."""
        return max(self.answers, key=self.answers.__getitem__, default=None)

    def evidence(self, role: Role, at: float = 0.0) -> bool:
        """Whether a send of ``role`` made ``at`` seconds in is wanted as evidence, were it at full
        load (which ``kevload.load.level`` decides): not a warm-up, past the ramp-up, and for a
        probe while samples (or time) are still wanted. A companion counts after the ramp-up
        (companion cells describe the batch the probes saw)."""
        return role != WARMUP and at >= self.ramp_s and (role != PROBE or self._wanted(at))

    def counts(self, role: Role) -> None:
        """A send of ``role`` was counted."""
        if role == PROBE:
            self.counted += 1
            self._counted_in_flight += 1

    def returned(self, role: Role, counted: bool) -> None:
        if role == PROBE and counted:
            self._counted_in_flight -= 1

    def lost(self, role: Role) -> None:
        """A counted send that did not stay at full load to its end (a conversation whose later turn
        went without c − 1 others): no sample after all, so another is wanted in its place."""
        if role == PROBE:
            self.counted -= 1

    def slot_done(self, role: Role) -> None:
        if role == PROBE:
            self._probe_slots_open -= 1

    def _wanted(self, at: float) -> bool:
        """Whether a probe sent ``at`` seconds in would be evidence: past the ramp-up, samples or
        time left."""
        if at < self.ramp_s:
            return False
        return at < self.ramp_s + self.duration if self.duration else self.wants_samples


class OpenLoop:
    """A rate level: sends due on an absolute schedule, whatever the server does.

    Gaps are constant (1/rate) or exponential (Poisson arrivals, seeded). Warm-ups go first at the
    same pace; after them every ``probe_every``-th arrival is the probe (every one in ``single``
    mode, one in four among companions). The level ends after ``duration`` seconds of schedule, or
    when ``needed`` probes were sent if no duration is given. Every send but a warm-up and those due
    in the first ``ramp_s`` seconds (the ramp-up; the duration follows it) counts: the open loop
    promises a schedule, not a number in flight.
    """

    COUNTERS: ClassVar[tuple[str, ...]] = ()  # nothing changes as the level runs

    def __init__(
        self,
        rate: float,
        *,
        needed: int,
        companions: bool,
        arrival: Arrival = "constant",
        seed: int = 0,
        warmup: int = 0,
        duration: float = 0.0,
        ramp_s: float = 0.0,
    ):
        self.rate = rate
        self.needed = needed
        self.probe_every = 4 if companions else 1
        self.arrival = arrival
        self.seed = seed
        self.warmup = warmup
        self.duration = duration
        self.ramp_s = ramp_s

    def __iter__(self) -> Iterator[Send]:
        gaps = random.Random(self.seed)
        offset, arrivals, probes, warmups = 0.0, 0, 0, self.warmup
        while offset < self.ramp_s + self.duration if self.duration else probes < self.needed:
            if warmups:
                warmups -= 1
                role = WARMUP
            else:
                role = PROBE if arrivals % self.probe_every == 0 else COMPANION
                probes += role == PROBE and offset >= self.ramp_s
                arrivals += 1
            yield Send(role, offset)
            offset += gaps.expovariate(self.rate) if self.arrival == "poisson" else 1.0 / self.rate

    def evidence(self, role: Role, at: float = 0.0) -> bool:
        """``at`` is the send's scheduled offset, so lateness never changes what counts."""
        return role != WARMUP and at >= self.ramp_s

    def counts(self, role: Role) -> None:
        """Nothing to keep: the schedule does not depend on what was counted."""

    def returned(self, role: Role, counted: bool) -> None:
        """The open loop's schedule does not depend on answers."""

    def lost(self, role: Role) -> None:
        """Nor on which sends stayed samples."""

    def answered(self, answer: Hashable | None) -> None:
        """Nor on what they say: ``load.until_bound`` is for closed-loop levels only."""
