"""Stops: SIGINT and SIGTERM end every command the same way (130 or 143, records kept, run.json finished with its
state, summary written), at once, with nothing sent after the stop and no process left behind. Each kevload
runs as a real subprocess in its own process group with a kill timer (tests.bounded)."""

from __future__ import annotations

import json
import signal

import pytest

from kevload.store import read_run_records
from tests.bounded import PARALLEL_REDUCTION, Kevload
from tests.conftest import load_summary, write_scenario

EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
SIGNALS = pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])

# Reduces a run directory N times inside kevload's event loop, its SIGINT/SIGTERM handlers installed, with the
# parallel reduction forced (four processes): a reduction that forks the loop's process hangs in about one of four.
REDUCE_IN_LOOP = ("import os, sys; from pathlib import Path; from kevload import aio, compare; "
                  "compare._PARALLEL_BYTES = 1; os.cpu_count = lambda: 4; from kevload.runs import finish_run\n"
                  "async def main(stop):\n"
                  "    for _ in range(int(sys.argv[2])): finish_run(Path(sys.argv[1]))\n"
                  "aio.run(main)")


def _closed_run(tmp_path, server, samples=12):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=samples)
    return scenario, tmp_path / "run"


def test_parallel_reduction_finishes_and_leaves_no_process(tmp_path, server):
    scenario, out = _closed_run(tmp_path, server)
    with Kevload("run", scenario, "--out", out, "--quiet", code=PARALLEL_REDUCTION) as kevload:
        ended = kevload.end(timeout=60)
    assert ended.code == 0, ended.stderr
    assert ended.left == []
    parallel = load_summary(out)
    with Kevload(out, 10, code=REDUCE_IN_LOOP) as again:
        ended = again.end(timeout=120)
    assert (ended.code, ended.left) == (0, []), ended.stderr
    # The parts merged equal the file read in one process.
    with Kevload("report", out, "--format", "json") as report:
        assert report.end(timeout=30).code == 0
    assert load_summary(out) == parallel
    assert parallel["requests"] == 24


@pytest.mark.parametrize("group", [False, True], ids=["to kevload", "to its group"])
def test_sigterm_while_the_summary_is_reduced(tmp_path, server, group):
    scenario, out = _closed_run(tmp_path, server)
    with Kevload("run", scenario, "--out", out, "--quiet", code=PARALLEL_REDUCTION) as kevload:
        # Every request answered and the reduction's processes started: the run is writing its summary.
        kevload.wait_for(lambda: len(server.requests) >= 24 and kevload.children(), timeout=60)
        kevload.signal(signal.SIGTERM, group=group)
        ended = kevload.end(timeout=60)
    assert ended.code == 143, ended.stderr
    assert "Traceback" not in ended.stderr
    assert ended.left == []
    assert load_summary(out)["requests"] == 24 and len(list(read_run_records(out))) == len(server.requests)
    assert json.loads((out / "run.json").read_text())["state"] == "complete"  # every record was in
