"""Open-loop rates keep an exact schedule; latency percentiles match delays the server injects."""

from __future__ import annotations

import statistics

import pytest

from kevload.records.store import read_records
from tests.conftest import load_summary, run_cli, write_scenario


def test_constant_rate_schedule(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, rate=[40], samples=40, warmup=3)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    rows = [r for r in read_records(tmp_path / "run" / "records.jsonl")]
    assert [r["role"] for r in rows].count("warmup") == 3
    probes = sorted((r for r in rows if r["role"] == "probe"), key=lambda r: r["t_scheduled"])
    assert len(probes) == 40
    gaps = [b["t_scheduled"] - a["t_scheduled"] for a, b in zip(probes, probes[1:], strict=False)]
    assert all(
        g == pytest.approx(1 / 40, abs=1e-9) for g in gaps
    )  # an absolute schedule, not sleeps
    lateness = sorted(r["t_send"] - r["t_scheduled"] for r in probes)
    assert lateness[0] >= 0
    assert (
        lateness[int(0.9 * len(lateness))] < 0.02
    )  # generous: CI shares 2 cores; `make bench` measures it
    cell = load_summary(tmp_path / "run")["cells"][0]
    assert cell["rate"] == 40 and cell["latency"]["lateness"]["n"] == 40


def test_poisson_arrivals_and_cap(tmp_path, server):
    server.behaviour.latency = 0.05
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, rate=[100], arrival="poisson", samples=60, max_in_flight=2
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    rows = sorted(read_records(tmp_path / "run" / "records.jsonl"), key=lambda r: r["t_scheduled"])
    gaps = [b["t_scheduled"] - a["t_scheduled"] for a, b in zip(rows, rows[1:], strict=False)]
    assert len(set(round(g, 9) for g in gaps)) > 30  # exponential gaps, not a constant
    assert (
        max(r["in_flight"] for r in rows) <= 1
    )  # at most 2 in flight: one already out when sending
    # The cap (2 × 50 ms) limits throughput to ~40/s, so the schedule falls behind: lateness shows
    # it.
    assert rows[-1]["t_send"] - rows[-1]["t_scheduled"] > 0.3


def test_duration_limit(tmp_path, server):
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, rate=[20], samples=1000, duration=0.5
    )
    run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    rows = list(read_records(tmp_path / "run" / "records.jsonl"))
    assert 9 <= len(rows) <= 11


def test_percentiles_from_injected_delays(tmp_path, server):
    server.behaviour.latency = 0.0
    server.behaviour.ttft = 0.15
    server.behaviour.chunk_delay = 0.04
    server.behaviour.words = 6
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=6, stream=True
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 0, output
    for cell in load_summary(tmp_path / "run")["cells"]:
        lat = cell["latency"]
        assert 0.15 <= lat["ttft"]["p50"] < 0.2
        assert 0.038 <= lat["itl"]["p50"] < 0.06
        # e2e: ttft, 5 gaps between 6 words, and the gap after the last word before finish_reason.
        assert 0.15 + 6 * 0.04 <= lat["e2e"]["p50"] < 0.15 + 6 * 0.04 + 0.08
        assert lat["e2e"]["max"] >= lat["e2e"]["p99"] >= lat["e2e"]["p90"] >= lat["e2e"]["p50"]
        assert cell["output_tokens_per_s"] > 0 and cell["requests_per_s"] > 0
    assert "latency (ms" in output


def test_histogram_quantiles_match_numpy():
    import numpy as np

    from kevload.compare.stats import LatencyHistogram

    rng = np.random.default_rng(1)
    values = rng.lognormal(mean=-3, sigma=1, size=5000)
    hist = LatencyHistogram()
    for v in values:
        hist.add(float(v))
    for q in (0.5, 0.9, 0.99):
        exact = float(np.quantile(values, q, method="inverted_cdf"))
        assert hist.quantile(q) == pytest.approx(exact, rel=0.006)
    assert hist.summary()["max"] == pytest.approx(values.max(), rel=1e-6)
    assert statistics.fmean(values) == pytest.approx(hist.summary()["mean"], rel=1e-4)
