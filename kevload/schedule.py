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
    """

    def __init__(self, concurrency: int, needed: int, *, companions: bool, warmup: int = 0):
        self.concurrency = concurrency
        self.needed = needed
        self.warmup = warmup  # sent one at a time before the slots start; never counted
        self.counted = 0
        self._counted_in_flight = 0
        probe_slots = 1 if companions and concurrency > 1 else concurrency
        # Companion slots first: they are started first, so even the first probe finds them in flight.
        self.slots: tuple[str, ...] = (COMPANION,) * (concurrency - probe_slots) + (PROBE,) * probe_slots
        self._probe_slots_open = probe_slots

    def next(self, role: str) -> Send | None:
        """What the slot of ``role`` sends next, or None when it is done."""
        if role == PROBE:
            return Send(PROBE) if self.counted < self.needed or self._counted_in_flight else None
        return Send(COMPANION) if self._probe_slots_open else None

    def sent(self, role: str, in_flight: int) -> bool:
        """Note a send made with ``in_flight`` others in flight; True when it counts.

        A probe counts when sent at full load while samples are still missing; a companion when
        sent at full load (companion cells describe the batch the probes saw).
        """
        full = role != WARMUP and in_flight == self.concurrency - 1
        if role == PROBE:
            full = full and self.counted < self.needed
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
    when ``needed`` probes were sent if no duration is given. Every send but a warm-up counts: the
    open loop promises a schedule, not a number in flight.
    """

    def __init__(self, rate: float, *, needed: int, companions: bool, arrival: str = "constant", seed: int = 0,
                 warmup: int = 0, duration: float = 0.0):
        self.rate = rate
        self.needed = needed
        self.probe_every = 4 if companions else 1
        self.arrival = arrival
        self.seed = seed
        self.warmup = warmup
        self.duration = duration

    def __iter__(self) -> Iterator[Send]:
        gaps = random.Random(self.seed)
        offset, arrivals, probes, warmups = 0.0, 0, 0, self.warmup
        while offset < self.duration if self.duration else probes < self.needed:
            if warmups:
                warmups -= 1
                role = WARMUP
            else:
                role = PROBE if arrivals % self.probe_every == 0 else COMPANION
                probes += role == PROBE
                arrivals += 1
            yield Send(role, offset)
            offset += gaps.expovariate(self.rate) if self.arrival == "poisson" else 1.0 / self.rate

    def sent(self, role: str, in_flight: int) -> bool:
        return role != WARMUP

    def returned(self, role: str, counted: bool) -> None:
        """The open loop's schedule does not depend on answers."""
