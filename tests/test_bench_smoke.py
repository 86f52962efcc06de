"""The bench in miniature: a gross regression (kevload's req/s below FLOOR × the plain reference client's) fails.

Absolute times are never asserted: only the ratio, measured side by side in the same run, with both
clients on the same event loop (uvloop, as kevload's CLI runs), so the loop is not what is compared.

Rounds of 20,000 requests: at 4,000 a round lasted 0.4 s, a neighbour's burst on the 2 shared cores moved single
rounds from 0.84 to 1.22, and a healthy tree's median of five fell to 1.00 against a bar at parity. At this size
rounds spread 1.13-1.26 (medians 1.17 and 1.22 in two runs, 1.43 in one beside a pip install), so the bar sits
well below them: a regression of a quarter or more fails here (a busy wait of 20 µs more per request took the
median from 1.22 to 0.99, one of 40 µs to 0.85), and a smaller one is what `make bench` shows.
"""

from __future__ import annotations

import statistics

from bench.run import Endpoint, run_kevload, run_reference

FLOOR = 0.9
ROUNDS = 5  # alternating: a burst on the shared cores costs one round, not the median
REQUESTS = 20000


def test_kevload_is_not_grossly_slower_than_the_reference_client():
    ratios = []
    with Endpoint() as endpoint:
        for _ in range(ROUNDS):
            reference = run_reference(endpoint.plain, REQUESTS, 64, stream=False)
            kevload = run_kevload(endpoint.plain, REQUESTS, 64, stream=False)
            assert reference["loop"] == kevload["loop"] == "uvloop"
            ratios.append(kevload["rps"] / reference["rps"])
    assert statistics.median(ratios) >= FLOOR, f"kevload / reference req/s: {ratios}"
