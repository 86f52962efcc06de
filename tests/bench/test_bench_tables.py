"""`make bench`'s tables from its rows: every client's row in the throughput table, and the
until-bound rows from a run's typed summary and its records. The bench itself talks to real targets
for minutes; these are its pure parts."""

from __future__ import annotations

from pathlib import Path

from bench.run import _stats, _until_row
from kevload.records.rundir import RunDir

MIXED = Path(__file__).parents[1] / "data" / "summaries" / "mixed"


def test_throughput_rows_of_clients_without_records_reduce_beside_kevloads():
    wrk = [{"rps": 150000.0, "cpu_per_1000": 0.006, "rss_mb": 5.0}] * 3
    reference = [{"rps": 9000.0, "cpu_per_1000": 0.12, "rss_mb": 70.0}] * 3
    kevload = [
        {
            "rps": r,
            "cpu_per_1000": 0.12,
            "rss_mb": 61.0,
            "full_load_share": share,
            "samples_never_full": never,
        }
        for r, share, never in ((10000.0, 0.9, 0), (10500.0, 0.8, 3), (9800.0, 0.95, None))
    ]
    assert (
        _stats(wrk)["samples_never_full_max"] is None and _stats(wrk)["full_load_share_min"] is None
    )
    assert _stats(reference)["rps_median"] == 9000.0
    kept = _stats(kevload)
    assert (kept["rps_median"], kept["full_load_share_min"], kept["samples_never_full_max"]) == (
        10000.0,
        0.8,
        3,
    )


def test_until_bound_row_reads_the_typed_summary_and_counts_probe_requests_from_the_records():
    summary = RunDir(MIXED).summary()
    row = _until_row("llamacpp", "mixed", MIXED, summary, 12.34)
    probes = [c for c in summary.cells if c.role == "probe"]
    assert row["verdict"] == summary.verdict and row["seconds"] == 12.3
    assert [(c["concurrency"], c["ok"], c["distinct"]) for c in row["cells"]] == [
        (c.concurrency, c.ok, c.distinct) for c in probes
    ]
    assert [c["n"] for c in row["cells"]] == [c.ok + sum(c.errors.values()) for c in probes]
    sent = [r for r in RunDir(MIXED).records() if r.role == "probe"]
    assert (
        row["probe_requests"] == len(sent) == 36
    )  # uncounted copies too: every probe request on record
    assert {c["concurrency"]: c["probe_requests"] for c in row["cells"]} == {1: 12, 2: 12, 4: 12}
