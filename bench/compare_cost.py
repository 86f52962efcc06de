"""What ``kevload compare`` costs per request, against a run's: two canned endpoints (nginx's
/plain/v1 under two names) compared as the command compares them (``load.comparing``'s runs in
turns, then ``servers.rollout.finish``: compare.json, .md, .html and the gate), alternated per round
with one ``run_scenario`` of the same requests at the same concurrency, in one process on uvloop.

A comparison's sending is its targets' runs (``run_scenario`` per target and level), so its µs per
request should be a run's; what it adds is the finish, reading both runs' records back and pairing
them item by item, given here per request compared too."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import uvloop

from kevload.compare.gate import GateRules
from kevload.inputs.scenario import Scenario, scenario_from_dict
from kevload.load import comparing
from kevload.load.runs import run_scenario
from kevload.records.rundir import RunDir
from kevload.servers import rollout

PROBES = 16  # items to pair: the requests are spread over them, as a graded set's would be


def _scenario(url: str, requests: int, concurrency: int) -> Scenario:
    raw = {
        "target": {"base_url": url, "model": "bench", "timeout": 10},
        "params": {"temperature": 0},
        "load": {"concurrency": [concurrency], "samples": requests // PROBES},
        "probes": [{"id": f"p{i}", "prompt": f"hi {i}", "max_tokens": 20} for i in range(PROBES)],
    }
    return scenario_from_dict(raw, source="bench", name="compare-cost")


def _timed(work: object) -> tuple[float, float]:
    """Wall and process CPU seconds of one coroutine run on uvloop."""
    wall, cpu = time.perf_counter(), time.process_time()
    uvloop.run(work)  # type: ignore[arg-type]
    return time.perf_counter() - wall, time.process_time() - cpu


def _records(run_dir: Path) -> int:
    """The requests a run made: its records, more than the samples asked for, not the same count
    each time."""
    return sum(len(p.read_bytes().splitlines()) for p in RunDir(run_dir).record_files())


def _round(url: str, requests: int, concurrency: int, tmp: Path, k: int) -> dict[str, float]:
    scenario = _scenario(url, requests, concurrency)
    run_s, run_cpu = _timed(run_scenario(scenario, tmp / f"run-{k}"))
    sent = _records(tmp / f"run-{k}")
    out = tmp / f"compare-{k}"
    targets = [comparing.Target("old", scenario), comparing.Target("new", scenario)]
    cmp_s, cmp_cpu = _timed(comparing.run_comparison(targets, out, reference="old"))
    compared = _records(out / "old") + _records(out / "new")
    start = time.perf_counter()
    outcome = rollout.finish(out, GateRules(), trust_graders=False, own=True)
    finish_s = time.perf_counter() - start
    assert outcome.comparison.candidates[0].levels[0].agreement == 1.0, "canned answers differ"
    return {
        "run_us": 1e6 * run_s / sent,
        "compare_us": 1e6 * cmp_s / compared,
        "finish_us": 1e6 * finish_s / compared,
        "run_cpu_per_1000": 1000 * run_cpu / sent,
        "compare_cpu_per_1000": 1000 * cmp_cpu / compared,
        "requests": sent,
        "compared_requests": compared,
    }


def measure(url: str, requests: int = 8000, concurrency: int = 64, repeats: int = 3) -> dict:
    """Per round, a run asking ``requests`` probe samples (it records more), then
    a comparison of two targets each sent the same; medians over ``repeats`` rounds of µs per
    recorded request (wall) and CPU s per 1,000 requests."""
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(repeats):
            rounds.append(_round(url, requests, concurrency, Path(tmp), k))
    keys = [key for key in rounds[0] if "requests" not in key]
    median = {key: round(statistics.median(r[key] for r in rounds), 3) for key in keys}
    return {
        "run_requests": [r["requests"] for r in rounds],
        "compared_requests": [r["compared_requests"] for r in rounds],
        "concurrency": concurrency,
        "rounds": rounds,
        "median": median,
        "compare_over_run": round(median["compare_us"] / median["run_us"], 3),
    }


def print_compare(result: dict) -> None:
    m = result["median"]
    print(
        f"\ncompare (2 canned endpoints, {result['compared_requests'][0]} requests in all, "
        f"c={result['concurrency']}): {m['compare_us']:.1f} µs/request against a run's "
        f"{m['run_us']:.1f} in the same rounds (× {result['compare_over_run']:.2f}); "
        f"CPU {m['compare_cpu_per_1000']:.3f} s / 1000 req (run {m['run_cpu_per_1000']:.3f}); "
        f"the finish (compare.json from the records) {m['finish_us']:.1f} µs per request"
    )
