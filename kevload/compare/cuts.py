"""Whether a probe drifted *because of* the requests kevload cut (``load.cancel_*``), read from the
records alone.

A probe sample is beside a cut when a request of its level was cut while it was in flight, within
the cell's shortest flight from its send (every sample given the same time to meet a cut), and the
cell says how its divergent samples split between those beside a cut and those not (``beside_cuts``,
``only_beside_cuts``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

# The one-sided p-value under which "drifted only beside cuts" is said: below it, a drift that
# ignores the cuts would rarely have put every divergent sample beside one.
FINDING_P = 0.05


@dataclass(frozen=True, slots=True)
class BesideCuts:
    """A probe cell's ok samples split by whether a request of their level was cut while they were
    in flight."""

    beside: int  # ok samples with a cut in flight
    divergent_beside: int  # … of them not the serial output
    apart: int  # ok samples with no cut in flight
    divergent_apart: int  # … of them not the serial output
    window_s: float = field(
        default=0.0, compare=False
    )  # how long after its send a sample meets a cut

    @property
    def p_value(self) -> float | None:
        """One-sided Fisher exact test: the chance that the divergent samples fall beside cuts at
        least this often if divergence ignored the cuts (each sample as likely to diverge wherever
        it ran). None without divergence."""
        divergent = self.divergent_beside + self.divergent_apart
        total = self.beside + self.apart
        if not divergent:
            return None
        tail = sum(
            math.comb(self.beside, k) * math.comb(self.apart, divergent - k)
            for k in range(self.divergent_beside, min(self.beside, divergent) + 1)
        )
        return tail / math.comb(total, divergent)

    @property
    def only_beside_cuts(self) -> bool:
        """The finding "drifted only beside cancellations": every divergent sample had a cut in
        flight, none of the samples without one diverged, and that split is unlikely by chance
        (``FINDING_P``)."""
        p = self.p_value
        return bool(
            self.divergent_beside and not self.divergent_apart and p is not None and p < FINDING_P
        )


def beside_cuts(samples: Iterable[tuple[float, float, bool]], cuts: Iterable[float]) -> BesideCuts:
    """``samples``: each ok probe sample's (send, last byte, whether it diverged from the serial
    output); ``cuts``: the times the level's requests were cut. A sample is beside a cut when one
    came within the shortest sample's flight from its send, the very send and end included: the same
    time for every sample, as a longer flight meets more cuts, and a server that drifts on its slow
    answers (queued ones), cut or not, would otherwise seem to drift beside the cuts."""
    samples = list(samples)
    times = sorted(cuts)
    window = min((t_last - t_send for t_send, t_last, _ in samples), default=0.0)
    counts = [0, 0, 0, 0]
    for t_send, _, divergent in samples:
        inside = bisect.bisect_right(times, t_send + window) - bisect.bisect_left(times, t_send) > 0
        counts[(0 if inside else 2) + divergent] += 1
    return BesideCuts(
        beside=counts[0] + counts[1],
        divergent_beside=counts[1],
        apart=counts[2] + counts[3],
        divergent_apart=counts[3],
        window_s=window,
    )
