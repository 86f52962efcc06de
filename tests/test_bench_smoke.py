"""The bench in miniature: a gross regression (kevload slower than the plain reference client) fails.

Absolute times are never asserted: only the ratio, measured side by side in the same run, with both
clients on the same event loop (uvloop, as kevload's CLI runs), so the loop is not what is compared.
"""

from __future__ import annotations

import statistics

from bench.run import Endpoint, run_kevload, run_reference


def test_kevload_is_not_slower_than_the_reference_client():
    ratios = []
    with Endpoint() as endpoint:
        # Five alternating rounds: on 2 shared cores one round can lose to a neighbour's burst.
        for _ in range(5):
            reference = run_reference(endpoint.plain, 4000, 64, stream=False)
            kevload = run_kevload(endpoint.plain, 4000, 64, stream=False)
            assert reference["loop"] == kevload["loop"] == "uvloop"
            ratios.append(kevload["rps"] / reference["rps"])
    assert statistics.median(ratios) >= 1.0, f"kevload / reference req/s: {ratios}"
