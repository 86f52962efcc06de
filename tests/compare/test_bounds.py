"""Absurd numbers get exit 2 and a message naming the key (or option) and its bound, before anything
is allocated in proportion to them. Each runs as a real kevload in its own process group, under a
kill timer and a 1 GiB memory limit, with starting a process made to fail, so a bound that regresses
fails here instead of taking the machine down."""

from __future__ import annotations

import json

import pytest

from tests.bounded import NO_PROCESSES, NO_START, Kevload, cli
from tests.conftest import write_scenario

# nothing listens: a value that got past its check would fail on the network
NOWHERE = "http://127.0.0.1:9/v1"
MEMORY_MB = 1024


def _refused(*args: object, code: str = NO_PROCESSES) -> str:
    with Kevload(*args, code=code, memory_mb=MEMORY_MB) as kevload:
        ended = kevload.end(timeout=30)
    assert ended.code == 2, ended.stderr
    assert "Traceback" not in ended.stderr and ended.left == []
    return ended.stderr


# (load keys, --set overrides, the message): each a number once taken as given and allocated in
# proportion to.
SCENARIOS = [
    (
        {"concurrency": [1, 100_000_000]},
        (),
        "load.concurrency: expected a non-empty list of integers from 1 to 100,000, got [1, "
        "100000000]",
    ),
    (
        {"concurrency": [1, 99_999_999_999_999_999]},
        (),
        "load.concurrency: expected a non-empty list of integers from 1 to 100,000",
    ),
    (
        {"rate": [float("inf")], "duration": 0.5},
        (),
        "load.rate: expected a list of numbers > 0, at most 100,000 "
        "(requests per second), got [inf]",
    ),
    ({"duration": float("inf")}, (), "load.duration: expected seconds from 0 to 604,800"),
    ({}, ("target.timeout=inf",), "target.timeout: expected seconds > 0, at most 604,800, got inf"),
    (
        {"mode": "needle", "needle_length": 10**12},
        (),
        "load.needle_length: expected an integer from 1 to 4,000,000 "
        "(characters), got 1000000000000",
    ),
    (
        {},
        ("load.seed=99999999999999999999",),
        "load.seed: expected a 64-bit integer, got 99999999999999999999",
    ),
    ({"until_bound": 1e-17}, (), "load.until_bound: expected a share from 0.000001 to below 1"),
    (
        {},
        ("params.temperature=nan",),
        "params.temperature: expected a finite number (JSON has no inf or nan), got nan",
    ),
    (
        {"ramp": {"from": 1, "to": 100_000_000, "factor": 2}, "concurrency": [1]},
        (),
        "load.ramp.to: expected an integer from 1 to 100,000, got 100000000",
    ),
    (
        {"max_samples": 10**12, "until_bound": 0.05},
        (),
        "load.max_samples: expected an integer from 1 to 10,000,000",
    ),
    ({"retries": 10**9}, (), "load.retries: expected an integer from 0 to 100"),
    ({"workers": 100_000}, (), "load.workers: expected an integer from 1 to 1,024"),
]


@pytest.mark.parametrize(
    ("load", "overrides", "message"), SCENARIOS, ids=[m.split(":")[0] for *_, m in SCENARIOS]
)
def test_an_absurd_scenario_number_is_refused(tmp_path, load, overrides, message):
    path = write_scenario(tmp_path / "s.toml", NOWHERE, **load)
    if "ramp" in load:  # write_scenario always writes a concurrency; a ramp sets its own
        path.write_text(path.read_text().replace("concurrency = [1]\n", ""))
    sets = [arg for override in overrides for arg in ("--set", override)]
    stderr = _refused("run", path, *sets, "--out", tmp_path / "run")
    assert f"{path}: {message}" in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "run").exists()


def test_an_absurd_probe_max_tokens_is_refused_inline_and_in_a_dataset(tmp_path):
    path = write_scenario(
        tmp_path / "s.toml", NOWHERE, probes=[{"id": "p", "prompt": "x", "max_tokens": 10**12}]
    )
    assert (
        "probes[0].max_tokens: expected an integer from 1 to 10,000,000, got 1000000000000"
        in _refused("run", path)
    )
    (tmp_path / "lines.jsonl").write_text(json.dumps({"prompt": "x", "max_tokens": 10**12}) + "\n")
    path = write_scenario(tmp_path / "s.toml", NOWHERE, probes=[{"dataset": "lines.jsonl"}])
    assert (
        "lines.jsonl:1: probes[0].dataset: max_tokens: expected an integer from 1 to 10,000,000"
        in _refused("run", path)
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("run", "s.toml", "--workers", "100000"),
            "Invalid value for '--workers': 100000 is not in the range 1<=x<=1024",
        ),
        (
            ("run", "s.toml", "--retries", "1000000"),
            "Invalid value for '--retries': 1000000 is not in the range 0<=x<=100",
        ),
        (
            ("run", "s.toml", "--until-bound", "1e-17"),
            "load.until_bound: expected a share from 0.000001 to below 1",
        ),
        (
            ("run", "s.toml", "--until-bound", "inf"),
            "--until-bound: expected a share between 0 and 1",
        ),
        (
            ("run", "s.toml", "--max-latency-regression", "nan"),
            "'--max-latency-regression': 'nan' is not a finite",
        ),
        (
            (
                "diagnose",
                "--url",
                NOWHERE,
                "--model",
                "m",
                "--prompt",
                "x",
                "--max-concurrency",
                "100000000",
            ),
            "Invalid value for '--max-concurrency': 100000000 is not in the range 2<=x<=100000",
        ),
        (
            ("diagnose", "--url", NOWHERE, "--model", "m", "--prompt", "x", "--timeout", "nan"),
            "Invalid value for '--timeout': 'nan' is not a finite number",
        ),
        (
            (
                "diagnose",
                "--url",
                NOWHERE,
                "--model",
                "m",
                "--prompt",
                "x",
                "--samples",
                "100000000000",
            ),
            "Invalid value for '--samples': 100000000000 is not in the range 3<=x<=10000000",
        ),
        (
            (
                "cases",
                "rerun",
                "cases.jsonl",
                "--url",
                NOWHERE,
                "--model",
                "m",
                "-o",
                "out.jsonl",
                "--times",
                "10000000000",
            ),
            "Invalid value for '--times': 10000000000 is not in the range 2<=x<=10000000",
        ),
        # Eight axes of ten values: 10⁸ settings, refused before one is made.
        (
            (
                "sweep",
                "s.toml",
                *(arg for k in range(8) for arg in ("--grid", f"params.a{k}=0,1,2,3,4,5,6,7,8,9")),
                "--out",
                "sweep",
            ),
            "--grid: expected at most 1,000 settings (each is a run, one after another), got "
            "100,000,000",
        ),
    ],
)
def test_an_absurd_option_is_refused(tmp_path, args, message):
    write_scenario(tmp_path / "s.toml", NOWHERE)
    (tmp_path / "cases.jsonl").write_text(
        json.dumps({"id": "c", "input": "x", "params": {}, "verdict": "stable"})
    )
    with Kevload(*args, code=NO_PROCESSES, memory_mb=MEMORY_MB, cwd=tmp_path) as kevload:
        ended = kevload.end(timeout=30)
    assert ended.code == 2, ended.stderr
    assert message in ended.stderr and "Traceback" not in ended.stderr and ended.left == []


def test_more_workers_than_the_host_can_use_are_refused_before_one_starts(tmp_path):
    path = write_scenario(tmp_path / "s.toml", NOWHERE, workers=9)
    # A host of 2 cores, whatever this one has: 4 worker processes a core at most.
    two_cores = cli(*NO_START, "os.cpu_count = lambda: 2")
    stderr = _refused("run", path, "--out", tmp_path / "run", code=two_cores)
    assert "load.workers: expected at most 8 on this host (4 per core, 2 cores), got 9" in stderr
    assert not (tmp_path / "run").exists()
