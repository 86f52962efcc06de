"""`kevload run --quiet`, what a nightly CI log shows: whatever makes the exit code non-zero is
printed, one line each, in the full table's words. A job that fails on a gate the verdict line does
not mention (load.min_good_share, answers turned bad under --fail-on bad, a grader that raised)
would otherwise show "deterministic: …" and fail."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

GRADED = [{"id": "p1", "prompt": "What is 40 + 2?", "expected": 42, "max_tokens": 8}]


def _42_alone(prompt: str, overlap: int) -> str:
    return "42" if overlap < 2 else "43"


def _always_43(prompt: str, overlap: int) -> str:
    return "The answer is 43"


# gate → (the server, the scenario's keys, run's options, the exit code, what a line must say)
GATES = {
    "drift": (Behaviour(drift_at=2), {}, [], 1, "nondeterministic: p1 (single) c=4"),
    "slo": (
        Behaviour(),
        {"slo": {"e2e_ms": 0.001}, "min_slo_attainment": 0.9},
        [],
        1,
        "SLO e2e ≤ 0.001 ms: MISSED",
    ),
    "min_good_share": (
        Behaviour(answer_for=_always_43),
        {"probes": GRADED, "min_good_share": 0.5},
        [],
        1,
        "under load.min_good_share 50.0%: p1 (single) c=1, p1 (single) c=4",
    ),
    "bad_flips": (
        Behaviour(answer_for=_42_alone),
        {"probes": GRADED},
        ["--fail-on", "bad"],
        1,
        "1 probe cells with answers load turned bad: p1 (single) c=4",
    ),
    "grader_failed": (
        Behaviour(answer_for=_always_43),
        {"probes": [{**GRADED[0], "grade": "python:kevload_test_quiet_grader:check"}]},
        [],
        2,
        "grader failed: probe 'p1': python:kevload_test_quiet_grader:check raised "
        "ZeroDivisionError",
    ),
    "latent": (
        Behaviour(logprob_drift_at=2),
        {},
        ["--fail-on", "latent"],
        1,
        "latent drift (same text, other logprobs) in p1 (single) c=4",
    ),
    "inconclusive": (
        Behaviour(faults=[None, None, "http_500"]),
        {"max_error_share": 0.5},
        [],
        3,
        "inconclusive: fewer ok probe samples than asked",
    ),
    "target_failed": (
        Behaviour(faults=["http_500"] * 100),
        {},
        [],
        3,
        "target failed: 8 of 8 probe requests failed",
    ),
    "baseline_regression": (
        Behaviour(drift_at=2),
        {},
        ["--baseline", "{baseline}"],
        1,
        "REGRESSION new_drift p1@single/c=4",
    ),
}


@pytest.mark.parametrize("gate", GATES)
def test_every_non_zero_exit_of_a_quiet_run_prints_a_line_saying_why(tmp_path, gate):
    behaviour, keys, options, expected_code, why = GATES[gate]
    (tmp_path / "kevload_test_quiet_grader.py").write_text(
        "def check(answer, probe, expected):\n    return 1 / 0\n"
    )
    behaviour.latency = 0.1  # every counted c=4 sample meets others at the server
    keys = {"samples": 4, **keys}
    if "{baseline}" in options:
        with FakeServer(Behaviour(latency=0.1)) as steady:  # one output everywhere
            scenario = write_scenario(tmp_path / "base.toml", steady.url, **keys)
            assert run_cli("run", scenario, "--out", tmp_path / "baseline", "--quiet")[0] == 0
    with FakeServer(behaviour) as server:
        scenario = write_scenario(tmp_path / "s.toml", server.url, **keys)
        given = [o.format(baseline=tmp_path / "baseline") for o in options]
        code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet", *given)
    assert code == expected_code, output
    assert any(why in line for line in output.splitlines()), output
