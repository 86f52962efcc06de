"""The bench's compare row measures what it says: both targets' requests sent, paired and agreeing,
beside a run of the same requests."""

from __future__ import annotations

from bench.compare_cost import PROBES, measure
from tests.fakeserver import Behaviour, FakeServer


def test_the_compare_row_sends_each_target_a_runs_requests_and_reports_both_per_request():
    with FakeServer(Behaviour(latency=0.001)) as server:
        result = measure(server.url, requests=4 * PROBES, concurrency=4, repeats=2)
        sent = len(server.arrivals)
    # At least the probes' samples asked for, to each target.
    assert all(n >= 4 * PROBES for n in result["run_requests"])
    assert all(n >= 2 * 4 * PROBES for n in result["compared_requests"])
    assert len(result["rounds"]) == 2
    for row in result["rounds"]:
        assert row["run_us"] > 0 and row["compare_us"] > 0 and row["finish_us"] > 0
    # Per round: a run, then the two targets' runs, each request recorded.
    assert sent == sum(result["run_requests"]) + sum(result["compared_requests"])
