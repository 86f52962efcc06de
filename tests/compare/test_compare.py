"""The comparator's pure parts: the parallel file reader agrees with the serial one; prefixes;
bounds."""

from __future__ import annotations

import pytest

from kevload.compare import reader
from kevload.compare.divergence import common_prefix_length
from kevload.compare.reader import reduce_file
from kevload.compare.stats import drift_upper_bound, samples_for_bound
from kevload.compare.summarizing import summarize
from tests.conftest import run_cli, write_scenario


def test_parallel_reader_matches_serial(tmp_path, server, monkeypatch):
    server.behaviour.drift_at = 3
    server.behaviour.latency = 0.05
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=24, mode="mixed"
    )
    run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    records = tmp_path / "run" / "records.jsonl"
    with records.open("ab") as handle:
        handle.write(b'{"torn": ')  # a kill in the middle of a write
    monkeypatch.setattr(reader, "_PARALLEL_BYTES", 0)
    serial = summarize(reduce_file(records, workers=1))
    for workers in (2, 3, 5):
        assert summarize(reduce_file(records, workers=workers)) == serial
    assert serial.requests > 48
    # Every part's spans make one level again: the c=4 cells' full load is the serial reader's.
    assert all(c.samples_never_full is not None for c in serial.cells if c.concurrency == 4)


def test_common_prefix_length():
    assert common_prefix_length("abcdef", "abcxyz") == 3
    assert common_prefix_length("abc", "abcdef") == 3
    assert common_prefix_length("", "x") == 0
    assert common_prefix_length([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix_length("x" * 10000 + "a", "x" * 10000 + "b") == 10000


def test_drift_bound_is_the_exact_rule_of_three():
    assert drift_upper_bound(100) == pytest.approx(0.0295, abs=1e-4)  # ≈ 3/n
    assert samples_for_bound(0.01) == 299
    assert drift_upper_bound(samples_for_bound(0.01)) <= 0.01
