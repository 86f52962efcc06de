"""Level c really was level c (issue 19): the share of each counted sample's life with c − 1 others in flight and
the samples that never had them, from the records' send and last-byte times alone."""

from __future__ import annotations

import numpy as np
import pytest

from kevload.overlap import FullLoad, Occupancy


def _full_load(level: list[tuple[float, float]], samples: list[int], concurrency: int) -> FullLoad:
    """``samples``: indices into ``level``, which holds every request of the level."""
    spans = np.array(level, dtype=np.float64).reshape(-1, 2)
    return Occupancy.of(spans, concurrency).full_load(spans[samples])


@pytest.mark.parametrize(("level", "samples", "c", "expected"), [
    # Half overlapping at c=2: each had its one other for half its life.
    ([(0, 10), (5, 15)], [0], 2, FullLoad(1, 0.5, 0)),
    ([(0, 10), (5, 15)], [0, 1], 2, FullLoad(2, 0.5, 0)),
    # Sent and answered at the same instants: together all along.
    ([(0, 10), (0, 10)], [0, 1], 2, FullLoad(2, 1.0, 0)),
    # Sent the instant the other was answered: never together.
    ([(0, 10), (10, 20)], [0, 1], 2, FullLoad(2, 0.0, 2)),
    # c=3: A had both others only while C ran; C had A and B all its life.
    ([(0, 10), (2, 8), (4, 6)], [0], 3, FullLoad(1, 0.2, 0)),
    ([(0, 10), (2, 8), (4, 6)], [1], 3, FullLoad(1, 2 / 6, 0)),
    ([(0, 10), (2, 8), (4, 6)], [2], 3, FullLoad(1, 1.0, 0)),
    # A probe that outlives the others: full until they stop.
    ([(0, 10), (0, 4), (0, 4)], [0], 3, FullLoad(1, 0.4, 0)),
    # One other in flight at every moment, but never two at once: c=3 is never reached.
    ([(0, 10), (0, 5), (5, 10)], [0], 3, FullLoad(1, 0.0, 1)),
    # Time-weighted: 5 of 10 s and 2 of 2 s make 7 of 12, not the mean of 0.5 and 1.0.
    ([(0, 10), (20, 22), (5, 23)], [0, 1], 2, FullLoad(2, 7 / 12, 0)),
    # More than c in flight is full load too.
    ([(0, 10), (0, 10), (0, 10)], [0], 2, FullLoad(1, 1.0, 0)),
    # A resend gap: the other slot's answer at 5, its next send at 5.5.
    ([(0, 10), (0, 5), (5.5, 12)], [0], 2, FullLoad(1, 0.95, 0)),
])
def test_full_load_of_hand_built_spans(level, samples, c, expected):
    assert _full_load(level, samples, c) == pytest.approx(expected)


@pytest.mark.parametrize(("level", "c", "ever_full"), [
    ([(5, 5), (0, 10)], 2, True),     # sent and answered inside another's life: that other was in flight
    ([(10, 10), (0, 10)], 2, False),  # at the instant the other was answered: it was not
    ([(0, 0), (0, 10)], 2, True),     # at the instant the other was sent: it was
    ([(5, 5), (5, 5)], 2, False),     # two of no length: neither is in flight at any moment
    ([(5, 5), (0, 10), (4, 6)], 3, True),
])
def test_a_sample_of_no_length_is_full_when_others_were_in_flight_at_its_instant(level, c, ever_full):
    full = _full_load(level, [0], c)
    assert full == FullLoad(1, None, 0 if ever_full else 1)  # no time to weigh: no share


def test_a_request_of_no_length_is_no_other_and_weighs_nothing():
    # B (no length) in A's life is in flight at no moment: A never had an other.
    assert _full_load([(0, 10), (5, 5)], [0], 2) == FullLoad(1, 0.0, 1)
    # Beside a sample with time, one of no length adds to the count and nothing to the share.
    assert _full_load([(0, 10), (5, 15), (7, 7)], [0, 2], 2) == FullLoad(2, 0.5, 0)


def test_a_last_byte_before_its_send_is_a_request_of_no_length():
    # Two hosts' clocks can disagree by more than a short request takes.
    assert _full_load([(3, 2), (0, 10)], [0], 2) == FullLoad(1, None, 0)


def test_unix_times_keep_microseconds():
    """Worker records carry Unix seconds (~1.7e9): a 5 ms request with a 20 µs gap is still measured."""
    t = 1.7e9
    level = [(t, t + 0.005), (t - 0.001, t + 0.002), (t + 0.00202, t + 0.01)]
    full = _full_load(level, [0], 2)
    assert full.never_full == 0 and full.share == pytest.approx((0.005 - 0.00002) / 0.005, abs=1e-4)


def test_sweep_matches_counting_every_moment():
    """Against a brute-force count on a grid: random integer spans, so ties and requests of no length abound."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        send = rng.integers(0, 20, n)
        level = [(float(s), float(s + rng.integers(0, 6))) for s in send]
        c = int(rng.integers(2, 5))
        samples = sorted(set(rng.integers(0, n, int(rng.integers(1, n + 1))).tolist()))
        full_seconds, seconds, never = 0.0, 0.0, 0
        for i in samples:
            s, e = level[i]
            moments = [t + 0.5 for t in range(int(s), int(e))] or [s]  # each unit of its life, or its instant
            at_full = [sum(1 for j, (s2, e2) in enumerate(level) if j != i and s2 <= t < e2) >= c - 1
                       for t in moments]
            full_seconds += sum(at_full) if e > s else 0
            seconds += e - s
            never += not any(at_full)
        expected = FullLoad(len(samples), full_seconds / seconds if seconds else None, never)
        assert _full_load(level, samples, c) == pytest.approx(expected), (level, samples, c)
