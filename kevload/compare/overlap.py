"""Whether level c was really level c, from the records alone: how much of each counted sample's
life had c − 1 other requests of its level in flight, swept over every request's (send, last
byte) span; and where the records cannot tell, because a part of the run sent requests it never
recorded."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# A stretch of time (from, to) in which requests a part of the run never recorded may have been in
# flight.
Window = tuple[float, float]


@dataclass(frozen=True)
class FullLoad:
    """What a cell's counted samples had around them.

    ``share``: the seconds during which c − 1 others were in flight, over the samples' seconds in
    all (None when they add up to no time at all). ``never_full``: samples that had c − 1 others at
    no moment of their life. ``unknown``: samples that ran while requests the records miss may have
    been in flight (``unrecorded_windows``): left out of ``share`` and ``never_full``, whose others
    the records cannot count (None: no part missed any).
    """

    samples: int
    share: float | None
    never_full: int
    unknown: int | None = None


@dataclass(frozen=True)
class Occupancy:
    """Requests in flight over a level's time, and when that reached the level's ``concurrency``.

    A request is in flight from its send up to, not including, its last byte: one that is sent the
    instant another is answered never shared the server with it. Between consecutive event times
    ``times[k]`` and ``times[k + 1]`` exactly ``in_flight[k]`` requests were in flight;
    ``full_seconds[k]`` and ``full_spans[k]`` add up, over the stretches before ``times[k]``, the
    seconds and the stretches at full load.
    """

    concurrency: int
    times: np.ndarray
    in_flight: np.ndarray
    full_seconds: np.ndarray
    full_spans: np.ndarray

    @classmethod
    def of(cls, spans: np.ndarray, concurrency: int) -> Occupancy:
        """From every request of the level as rows (send, last byte): all roles, counted or not, all
        workers. A last byte before its send (clocks of two hosts) is read as a request of no
        length."""
        send = spans[:, 0]
        end = np.maximum(spans[:, 1], send)
        times = np.unique(np.concatenate([send, end]))
        # In flight at t: sent at or before t and not yet answered at t.
        in_flight = np.searchsorted(np.sort(send), times, "right") - np.searchsorted(
            np.sort(end), times, "right"
        )
        full = in_flight[:-1] >= concurrency
        return cls(
            concurrency,
            times,
            in_flight,
            np.concatenate([[0.0], np.cumsum(np.where(full, np.diff(times), 0.0))]),
            np.concatenate([[0], np.cumsum(full)]),
        )

    def full_load(
        self, samples: np.ndarray, unrecorded: Sequence[Window] | None = None
    ) -> FullLoad:
        """``FullLoad`` of ``samples``, rows (send, last byte) that are among the level's spans;
        those that overlap one of the ``unrecorded`` windows are ``unknown``.

        A sample of no length is at full load when c − 1 others were in flight at its instant; it
        weighs nothing in ``share``.
        """
        known = np.ones(len(samples), dtype=bool)
        for start, stop in unrecorded or ():
            known &= ~((samples[:, 1] > start) & (samples[:, 0] <= stop))
        unknown = None if unrecorded is None else int(np.count_nonzero(~known))
        samples = samples[known]
        send = samples[:, 0]
        end = np.maximum(samples[:, 1], send)
        first = np.searchsorted(self.times, send)
        last = np.searchsorted(self.times, end)
        seconds = end - send
        # Float sums: a sample is never fuller than its own length.
        full = np.minimum(self.full_seconds[last] - self.full_seconds[first], seconds)
        ever_full = self.full_spans[last] > self.full_spans[first]
        # A request of no length is left out of in_flight (it was sent and answered at once): the
        # others at its instant are exactly in_flight there.
        instant = last == first
        ever_full[instant] = self.in_flight[first[instant]] >= self.concurrency - 1
        total = float(seconds.sum())
        return FullLoad(
            samples=len(samples),
            share=float(full.sum()) / total if total > 0 else None,
            never_full=int(np.count_nonzero(~ever_full)),
            unknown=unknown,
        )


def unrecorded_windows(
    sends: Iterable[tuple[int, int, int, float, float]], parts: dict[int, tuple[int, int]]
) -> list[Window]:
    """Where the records of ``parts`` (part → its first seq number and its workers) may miss
    requests: parts that sent some they never recorded (killed, a worker lost). ``sends`` are their
    records as (part, worker, seq, send, last byte).

    A worker numbers its sends first_seq + worker, then on by the number of workers, in the order it
    sends them. So a request it never recorded left after the last send before the first number
    missing from its records (or after its last recorded send: the ones in flight when it died), and
    was in flight at most until the part's last recorded moment, the latest a sample of that part
    can have run. A worker with no record at all may have lost one from the part's start. One window
    per part, from the earliest of its workers' bounds.
    """
    by_worker: dict[tuple[int, int], list[tuple[int, float]]] = {}
    ends: dict[int, float] = {}
    for part, worker, seq, t_send, t_last in sends:
        by_worker.setdefault((part, worker), []).append((seq, t_send))
        ends[part] = max(ends.get(part, -math.inf), t_last)
    windows = []
    for part, end in ends.items():
        first, workers = parts[part]
        starts = []
        for worker in range(workers):
            start, expected = -math.inf, first + worker
            for seq, t_send in sorted(by_worker.get((part, worker), ())):
                if seq != expected:
                    break
                start, expected = t_send, expected + workers
            starts.append(start)
        windows.append((min(starts), end))
    return windows
