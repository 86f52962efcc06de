"""Graders bounded: whatever a grader raises (BaseException too) or however long it takes, the run
ends with its verdict, summary.json and run.json's final state; the failure is ``grade_failed``
naming the probe and the grader, exit 2. A SIGINT/SIGTERM while the summary grades stops it within
about a second, with a summary and a final state.

Measured on the project's 2-core machine (``test_the_cost_per_distinct_output_of_a_python_grader``):
the worker process starts in some 60 ms once per summary, then each distinct output costs one pipe
round trip, some 70 µs."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from kevload.inputs.gradeanswers import GraderFailed
from kevload.inputs.grading import Grading, checked
from tests.bounded import Kevload
from tests.compare.test_graded import sum_probes, sums_server
from tests.conftest import load_summary, write_scenario


def _graded_run(tmp_path: Path, server, grader: str, **load) -> tuple[int, str]:
    """``sum_probes`` graded by ``python:<module>:check`` (``grader`` is the module's text), the
    crafted server right serially and wrong under load for s0, s2, s4; kevload in a process of its
    own with a kill timer (a grader that hangs the run fails the test, not the suite)."""
    module = f"kevload_bounds_{abs(hash(grader)) % 10**8}"
    (tmp_path / f"{module}.py").write_text(grader)
    server.behaviour.latency = 0.1
    server.behaviour.answer_for = sums_server
    probes = sum_probes(grade=f"python:{module}:check")
    path = write_scenario(tmp_path / "s.toml", server.url, probes=probes, samples=4, **load)
    return _bounded("run", path, "--out", tmp_path / "run")


def _bounded(*args: object) -> tuple[int, str]:
    with Kevload(*args) as kevload:
        ended = kevload.end(timeout=60)
    assert ended.left == []
    return ended.code, ended.stdout + ended.stderr


_RIGHT = "    return answer.split()[-1].rstrip('.') == str(int(expected))\n"


def _ended_graded(tmp_path: Path) -> dict:
    """summary.json, after asserting run.json's state is final."""
    assert json.loads((tmp_path / "run" / "run.json").read_text())["state"] == "complete"
    return load_summary(tmp_path / "run")


def test_a_grader_that_calls_sys_exit_on_one_answer_is_grade_failed_and_the_run_ends_with_exit_2(
    tmp_path, server
):
    # s0's loaded answer is "4" (wrong): the grader exits there. Before: exit 0, no verdict, no
    # summary.json, run.json left "running", though s2 and s4 turned bad under load.
    grader = (
        "import sys\ndef check(answer, probe, expected):\n"
        f"    if (probe, answer) == ('s0', '4'): sys.exit(0)\n{_RIGHT}"
    )
    code, out = _graded_run(tmp_path, server, grader)
    assert code == 2, out
    assert "distinct outputs per probe × level" in out and "Traceback" not in out
    assert "SystemExit" in out  # the failure is named where the run ends
    summary = _ended_graded(tmp_path)
    [error] = summary["grade_errors"]
    assert error.startswith("probe 's0': python:kevload_bounds_")
    assert error.endswith(":check raised SystemExit: 0 on the answer '4'")
    cells = {(c["probe"], c["concurrency"]): c for c in summary["cells"]}
    assert cells[("s0", 4)]["grade_failed"] == 4
    assert cells[("s2", 4)]["flips_good_to_bad"] == 4  # the real flip is still counted


@pytest.mark.parametrize("raised", ["GeneratorExit", "KeyboardInterrupt"])
def test_a_grader_that_raises_a_base_exception_is_grade_failed_not_a_traceback(
    tmp_path, server, raised
):
    grader = f"def check(answer, probe, expected):\n    raise {raised}('mine')\n"
    code, out = _graded_run(tmp_path, server, grader)
    assert code == 2, out
    assert "Traceback" not in out
    summary = _ended_graded(tmp_path)
    assert f"raised {raised}: mine on the answer" in summary["grade_errors"][0]


def test_a_grader_that_ends_its_process_is_grade_failed(tmp_path, server):
    grader = (
        "import os\ndef check(answer, probe, expected):\n"
        f"    if (probe, answer) == ('s0', '4'): os._exit(7)\n{_RIGHT}"
    )
    code, out = _graded_run(tmp_path, server, grader)
    assert code == 2, out
    summary = _ended_graded(tmp_path)
    assert "ended the grading process (exit code 7) on the answer '4'" in summary["grade_errors"][0]
    cells = {(c["probe"], c["concurrency"]): c for c in summary["cells"]}
    assert cells[("s2", 4)]["flips_good_to_bad"] == 4  # graded by a fresh worker after s0's


def test_a_looping_python_grader_is_cut_at_grade_timeout_once_and_not_called_again(
    tmp_path, server
):
    # s0, s1
    grader = f"def check(answer, probe, expected):\n    while answer == '4': pass\n{_RIGHT}"
    started = time.monotonic()
    code, out = _graded_run(tmp_path, server, grader, grade_timeout=0.5)
    assert code == 2, out
    summary = _ended_graded(tmp_path)
    assert (
        "took longer than 0.5 s (load.grade_timeout) on the answer '4'"
        in summary["grade_errors"][0]
    )
    assert time.monotonic() - started < 30


def test_a_server_answer_that_would_stall_a_backtracking_regex_is_graded_in_time(tmp_path, server):
    # Python's re takes exponential time for ^(a+)+$ against a…a!: the summary step hung for good.
    server.behaviour.answer_for = lambda prompt, overlap: "a" * 60 + "!"
    probes = [{"id": "p", "prompt": "Say a.", "expected": "^(a+)+$", "grade": "regex"}]
    path = write_scenario(tmp_path / "s.toml", server.url, probes=probes, samples=2)
    code, out = _bounded("run", path, "--out", tmp_path / "run", "--quiet")
    summary = _ended_graded(tmp_path)
    assert code == 0 and summary["cells"][0]["graded_bad"] == 2 and not summary["grade_errors"]


def test_a_regex_past_grade_timeout_is_grade_failed_naming_probe_and_grader(tmp_path, server):
    # ^(a|a)*$ still backtracks exponentially in the regex package: its match timeout ends it.
    server.behaviour.answer_for = lambda prompt, overlap: "a" * 60 + "!"
    probes = [{"id": "p", "prompt": "Say a.", "expected": "^(a|a)*$", "grade": "regex"}]
    path = write_scenario(
        tmp_path / "s.toml", server.url, probes=probes, samples=2, grade_timeout=0.3
    )
    code, out = _bounded("run", path, "--out", tmp_path / "run", "--quiet")
    summary = _ended_graded(tmp_path)
    assert code == 2
    assert summary["grade_errors"] == [
        f"probe 'p': regex took longer than 0.3 s (load.grade_timeout) on the answer '{'a' * 60}!'"
    ]


LOOP = "def check(answer, probe, expected):\n    while True: pass\n"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("grade", ["python", "regex"])
def test_a_signal_during_the_summary_step_stops_it_within_a_second(tmp_path, server, signum, grade):
    """The grader never returns (grade_timeout an hour): the signal must end the grading, not wait
    for it."""
    server.behaviour.answer_for = lambda prompt, overlap: "a" * 60 + "!"
    (tmp_path / "kevload_bounds_loop.py").write_text(LOOP)
    probe = (
        {"grade": "python:kevload_bounds_loop:check"}
        if grade == "python"
        else {"grade": "regex", "expected": "^(a|a)*$"}
    )
    probes = [{"id": "p", "prompt": "Say a.", **probe}]
    path = write_scenario(
        tmp_path / "s.toml", server.url, probes=probes, samples=2, grade_timeout=3600
    )
    out = tmp_path / "run"
    with Kevload("run", path, "--out", out, "--quiet") as kevload:
        # Every request answered and run.json still "running": kevload is in its summary step,
        # grading.
        kevload.wait_for(lambda: len(server.requests) >= 4, timeout=60)
        time.sleep(1.0)
        assert json.loads((out / "run.json").read_text())["state"] == "running"
        at = kevload.signal(signum)
        ended = kevload.end(timeout=10)
        took = time.monotonic() - at
    assert ended.code == {signal.SIGTERM: 143, signal.SIGINT: 130}[signum], ended.stderr
    assert took < 1.5, took
    assert "Traceback" not in ended.stderr and ended.left == []
    assert json.loads((out / "run.json").read_text())["state"] == "complete"
    summary = load_summary(out)
    name = signal.Signals(signum).name
    assert summary["grade_errors"][-1].startswith(f"grading stopped by {name} in the summary step")
    assert summary["cells"][0]["grade_failed"] == 2


def test_the_cost_per_distinct_output_of_a_python_grader(tmp_path):
    """What the bound costs: the worker's start once, then a round trip per distinct output
    (printed, asserted only loosely: a shared 2-core machine)."""
    from kevload.inputs.gradeworker import BoundedGrader

    (tmp_path / "kevload_bounds_cost.py").write_text(
        f"def check(answer, probe, expected):\n{_RIGHT}"
    )
    grading = checked(3, "python:kevload_bounds_cost:check", 0, tmp_path)
    assert isinstance(grading, Grading)
    try:
        with BoundedGrader(5.0) as bounded:
            started = time.perf_counter()
            assert bounded.good(grading, "it is 3", "p") is True
            first = time.perf_counter() - started
            started = time.perf_counter()
            for n in range(1000):
                assert bounded.good(grading, f"it is {n}", "p") is (n == 3)
            each = (time.perf_counter() - started) / 1000
    finally:
        sys.modules.pop("kevload_bounds_cost", None)
    print(f"python grader: first answer (worker start) {first * 1e3:.0f} ms, then ", end="")
    print(f"{each * 1e6:.0f} µs each")
    assert first < 5 and each < 0.01


def test_bounded_graders_raise_grader_failed_not_base_exceptions():
    from kevload.inputs.gradeworker import BoundedGrader

    grading = checked("^(a|a)*$", "regex", 0, Path("."))
    assert grading is not None
    with BoundedGrader(0.2) as bounded, pytest.raises(GraderFailed, match="took longer than 0.2 s"):
        bounded.good(grading, "a" * 60 + "!", "p")


def test_a_second_signal_while_the_summary_grades_leaves_a_final_state(tmp_path, server):
    """The first SIGTERM stops the sending (the summary then grades, as a stopped run's does); the
    grader loops, and a second SIGTERM ends kevload at once: 143, run.json's state final (before:
    left "running")."""
    server.behaviour.latency = 0.5
    server.behaviour.answer_for = lambda prompt, overlap: "an answer"
    (tmp_path / "kevload_bounds_loop2.py").write_text(LOOP)
    probes = [{"id": "p", "prompt": "Say a.", "grade": "python:kevload_bounds_loop2:check"}]
    path = write_scenario(
        tmp_path / "s.toml", server.url, probes=probes, samples=8, grade_timeout=3600
    )
    out = tmp_path / "run"
    with Kevload("run", path, "--out", out, "--quiet") as kevload:
        # The logprobs check, then the first probe sample: the stop lets it end (0.5 s), and it is
        # graded.
        kevload.wait_for(lambda: len(server.requests) >= 2, timeout=60)
        kevload.signal(signal.SIGTERM)
        # The summary step has begun once the grading worker runs (kevload's only child here).
        kevload.wait_for(lambda: bool(kevload.children()), timeout=30)
        time.sleep(0.5)
        at = kevload.signal(signal.SIGTERM)
        ended = kevload.end(timeout=10)
        took = time.monotonic() - at
    assert ended.code == 143, ended.stderr
    assert took < 1.5 and ended.left == []
    assert json.loads((out / "run.json").read_text())["state"] == "interrupted"
