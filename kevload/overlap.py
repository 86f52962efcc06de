"""Whether level c was really level c, from the records alone: how much of each counted sample's life had c − 1
other requests of its level in flight, swept over every request's (send, last byte) span."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FullLoad:
    """What a cell's counted samples had around them.

    ``share``: the seconds during which c − 1 others were in flight, over the samples' seconds in all (None when
    they add up to no time at all). ``never_full``: samples that had c − 1 others at no moment of their life.
    """

    samples: int
    share: float | None
    never_full: int


@dataclass(frozen=True)
class Occupancy:
    """Requests in flight over a level's time, and when that reached the level's ``concurrency``.

    A request is in flight from its send up to, not including, its last byte: one that is sent the instant
    another is answered never shared the server with it. Between consecutive event times ``times[k]`` and
    ``times[k + 1]`` exactly ``in_flight[k]`` requests were in flight; ``full_seconds[k]`` and
    ``full_spans[k]`` add up, over the stretches before ``times[k]``, the seconds and the stretches at full load.
    """

    concurrency: int
    times: np.ndarray
    in_flight: np.ndarray
    full_seconds: np.ndarray
    full_spans: np.ndarray

    @classmethod
    def of(cls, spans: np.ndarray, concurrency: int) -> Occupancy:
        """From every request of the level as rows (send, last byte): all roles, counted or not, all workers.
        A last byte before its send (clocks of two hosts) is read as a request of no length."""
        send = spans[:, 0]
        end = np.maximum(spans[:, 1], send)
        times = np.unique(np.concatenate([send, end]))
        # In flight at t: sent at or before t and not yet answered at t.
        in_flight = np.searchsorted(np.sort(send), times, "right") - np.searchsorted(np.sort(end), times, "right")
        full = in_flight[:-1] >= concurrency
        return cls(concurrency, times, in_flight,
                   np.concatenate([[0.0], np.cumsum(np.where(full, np.diff(times), 0.0))]),
                   np.concatenate([[0], np.cumsum(full)]))

    def full_load(self, samples: np.ndarray) -> FullLoad:
        """``FullLoad`` of ``samples``, rows (send, last byte) that are among the level's spans.

        A sample of no length is at full load when c − 1 others were in flight at its instant; it weighs
        nothing in ``share``.
        """
        send = samples[:, 0]
        end = np.maximum(samples[:, 1], send)
        first = np.searchsorted(self.times, send)
        last = np.searchsorted(self.times, end)
        seconds = end - send
        # Float sums: a sample is never fuller than its own length.
        full = np.minimum(self.full_seconds[last] - self.full_seconds[first], seconds)
        ever_full = self.full_spans[last] > self.full_spans[first]
        # A request of no length is left out of in_flight (it was sent and answered at once): the others at its
        # instant are exactly in_flight there.
        instant = last == first
        ever_full[instant] = self.in_flight[first[instant]] >= self.concurrency - 1
        total = float(seconds.sum())
        return FullLoad(samples=len(samples), share=float(full.sum()) / total if total > 0 else None,
                        never_full=int(np.count_nonzero(~ever_full)))
