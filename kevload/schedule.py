"""When the next request goes and in which role: closed-loop concurrency levels and open-loop rates.

A strategy only decides (like GuideLLM's scheduling strategies); the engine sends, measures and
records. Both are plain objects with no I/O, so their rules are tested without a server.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

PROBE, COMPANION, WARMUP = "probe", "companion", "warmup"


@dataclass(frozen=True, slots=True)
class Send:
    """One request to send: its role and, in the open loop, when it is due (seconds after the level's start)."""

    role: str
    at: float | None = None


class ClosedLoop:
    """Level *c*: *c* slots, each sending its next request the moment its previous one returned.

    A probe sample counts only when it is sent with exactly *c* − 1 others in flight. The ramp-up
    (the first sends of a level, made while the slots fill) is sent but not counted; the probe
    slots send until ``needed`` samples were sent at full load, and then keep the level full with
    uncounted copies (the tail) until every counted sample is answered, so none of them sees its
    batch shrink. In the companion modes one slot sends the probe and the other *c* − 1 send
    companions for as long as the probe slot runs, which does the same.

    Times are ``at``, seconds since the slots started. For ``ramp_s`` seconds nothing counts (a
    ramp-up at the level's load, like a warm-up); with a ``duration`` the level then counts every
    full-load sample for that many seconds, however many that is, instead of ``needed`` ones.
    """

    def __init__(self, concurrency: int, needed: int, *, companions: bool, warmup: int = 0,
                 ramp_s: float = 0.0, duration: float = 0.0):
        self.concurrency = concurrency
        self.needed = needed
        self.warmup = warmup  # sent one at a time before the slots start; never counted
        self.ramp_s = ramp_s
        self.duration = duration
        self.counted = 0
        self._counted_in_flight = 0
        probe_slots = 1 if companions and concurrency > 1 else concurrency
        # Companion slots first: they are started first, so even the first probe finds them in flight.
        self.slots: tuple[str, ...] = (COMPANION,) * (concurrency - probe_slots) + (PROBE,) * probe_slots
        self._probe_slots_open = probe_slots

    def _wanted(self, at: float) -> bool:
        """Whether a probe sent ``at`` seconds in would be evidence: past the ramp-up, samples or time left."""
        if at < self.ramp_s:
            return False
        return at < self.ramp_s + self.duration if self.duration else self.counted < self.needed

    def next(self, role: str, at: float = 0.0) -> Send | None:
        """What the slot of ``role`` sends next, or None when it is done."""
        if role == PROBE:
            busy = at < self.ramp_s or self._wanted(at) or self._counted_in_flight
            return Send(PROBE) if busy else None
        return Send(COMPANION) if self._probe_slots_open else None

    def sent(self, role: str, in_flight: int, at: float = 0.0) -> bool:
        """Note a send made ``at`` seconds in with ``in_flight`` others in flight; True when it counts.

        A probe counts when sent at full load while samples (or time) are still wanted; a companion
        when sent at full load after the ramp-up (companion cells describe the batch the probes saw).
        """
        full = role != WARMUP and in_flight == self.concurrency - 1 and at >= self.ramp_s
        if role == PROBE:
            full = full and self._wanted(at)
            self.counted += full
            self._counted_in_flight += full
        return full

    def returned(self, role: str, counted: bool) -> None:
        if role == PROBE and counted:
            self._counted_in_flight -= 1

    def slot_done(self, role: str) -> None:
        if role == PROBE:
            self._probe_slots_open -= 1


class OpenLoop:
    """A rate level: sends due on an absolute schedule, whatever the server does.

    Gaps are constant (1/rate) or exponential (Poisson arrivals, seeded). Warm-ups go first at the
    same pace; after them every ``probe_every``-th arrival is the probe (every one in ``single``
    mode, one in four among companions). The level ends after ``duration`` seconds of schedule, or
    when ``needed`` probes were sent if no duration is given. Every send but a warm-up and those due
    in the first ``ramp_s`` seconds (the ramp-up; the duration follows it) counts: the open loop
    promises a schedule, not a number in flight.
    """

    def __init__(self, rate: float, *, needed: int, companions: bool, arrival: str = "constant", seed: int = 0,
                 warmup: int = 0, duration: float = 0.0, ramp_s: float = 0.0):
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

    def sent(self, role: str, in_flight: int, at: float = 0.0) -> bool:
        """``at`` is the send's scheduled offset, so lateness never changes what counts."""
        return role != WARMUP and at >= self.ramp_s

    def returned(self, role: str, counted: bool) -> None:
        """The open loop's schedule does not depend on answers."""
