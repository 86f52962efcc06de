"""load.until_bound: each cell samples until drift is seen or its drift-rate bound is strong, at
most max_samples."""

from __future__ import annotations

import json

import pytest

from kevload.compare.stats import drift_upper_bound, samples_for_bound
from kevload.compare.verdict import UntilBound
from kevload.load.finishing import finish_run
from kevload.load.level import decide
from kevload.load.schedule import PROBE, ClosedLoop
from kevload.records.store import RECORDS, read_records
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

NEEDED = samples_for_bound(
    0.05
)  # 59: zero drift in 59 samples bounds the rate below 4.95 % at 95 %


def _counted(run_dir, concurrency: int) -> list[dict]:
    return [
        r
        for r in read_records(run_dir / RECORDS)
        if r["role"] == "probe" and r["counted"] and r["concurrency"] == concurrency
    ]


def _answer(plan: ClosedLoop, answer) -> None:
    """One counted sample through the strategy: sent at full load, returned, answered."""
    assert plan.next(PROBE) is not None and decide(plan, PROBE, plan.concurrency - 1)
    plan.returned(PROBE, True)
    plan.answered(answer)


# --- the rule (pure) ---


def test_the_rule_names_why_a_cell_stops():
    rule = UntilBound(0.05, min_samples=8, max_samples=1000)
    assert (
        NEEDED == 59 and rule.goal == 59 and drift_upper_bound(58) > 0.05 >= drift_upper_bound(59)
    )
    assert rule.reason(58, 0, False) is None and rule.reason(59, 0, False) == "bound"
    assert rule.reason(59, 1, False) is None  # an error is no clean sample: one more is needed
    assert (
        rule.reason(3, 0, True) is None and rule.reason(8, 0, True) == "drift"
    )  # load.samples first
    assert UntilBound(0.05, 8, 20).reason(20, 0, False) == "cap"
    assert UntilBound(0.05, 100, 1000).goal == 100  # never fewer than asked
    assert UntilBound(0.01, 8, 1000).goal == 299


def test_serial_level_stops_at_the_bound_and_drift_against_its_first_answer():
    clean = ClosedLoop(1, 8, companions=False, until=UntilBound(0.05, 8, 1000))
    for _ in range(NEEDED):
        assert clean.wants_samples
        _answer(clean, ("h1", "stop"))
    assert clean.stop_reason == "bound" and clean.next(PROBE) is None and clean.counted == NEEDED

    drifting = ClosedLoop(1, 8, companions=False, until=UntilBound(0.05, 8, 1000))
    for answer in ("h1", "h2", "h1", "h1", "h1", "h1", "h1"):
        _answer(drifting, (answer, "stop"))
    assert (
        drifting.diverged and drifting.wants_samples
    )  # drift seen at the 2nd, but 8 samples are asked
    _answer(drifting, ("h1", "stop"))
    assert drifting.stop_reason == "drift" and drifting.next(PROBE) is None
    assert drifting.modal() == ("h1", "stop")
    # The same text ended for another reason is another answer.
    finish = ClosedLoop(
        1, 1, companions=False, until=UntilBound(0.5, 1, 10), prior=[("h1", "stop")]
    )
    finish.answered(("h1", "length"))
    assert finish.diverged


def test_loaded_level_holds_answers_against_the_serial_modal_and_keeps_c_in_flight():
    plan = ClosedLoop(
        4, 8, companions=False, until=UntilBound(0.05, 8, 1000), reference=("serial", "stop")
    )
    assert [decide(plan, PROBE, n) for n in (0, 1, 2)] == [
        False,
        False,
        False,
    ]  # ramp-up: not counted
    for _ in range(8):
        assert decide(plan, PROBE, 3)
    # Every counted answer agrees with itself but not with the serial answer: that is drift too.
    plan.returned(PROBE, True)
    plan.answered(("same", "stop"))
    assert plan.stop_reason == "drift" and not plan.wants_samples
    # Seven counted samples are still in flight: the slots keep sending uncounted copies beside
    # them.
    assert plan.next(PROBE) is not None and decide(plan, PROBE, 3) is False
    for _ in range(7):
        plan.returned(PROBE, True)
        plan.answered(("same", "stop"))
    assert plan.next(PROBE) is None and plan.counted == 8


def test_an_error_in_flight_reopens_counting_and_the_cap_holds():
    plan = ClosedLoop(
        2, 8, companions=False, until=UntilBound(0.05, 8, 1000), prior=[("h", "stop")] * 57
    )
    assert decide(plan, PROBE, 1) and decide(
        plan, PROBE, 1
    )  # 59 sent: enough if both answer cleanly
    assert not plan.wants_samples
    plan.returned(PROBE, True)
    plan.answered(None)  # a failed request bounds nothing
    assert plan.wants_samples and decide(plan, PROBE, 1)
    capped = ClosedLoop(1, 8, companions=False, until=UntilBound(0.05, 8, 20))
    for _ in range(20):
        _answer(capped, ("h", "stop"))
    assert capped.stop_reason == "cap" and capped.next(PROBE) is None


# --- against a server ---


def test_stable_server_each_cell_stops_at_the_bound(tmp_path, server):
    server.behaviour.latency = 0.05
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=8)
    code, output = run_cli(
        "run", scenario, "--until-bound", "5%", "--out", tmp_path / "run", "--quiet"
    )
    assert code == 0, output
    assert "per cell drift rate < 5.0% at 95% confidence" in output
    summary = load_summary(tmp_path / "run")
    assert summary["until_bound"] == 0.05
    for c, cell in cells_by_level(summary).items():
        assert (cell["ok"], cell["stop_reason"], cell["drift"]) == (NEEDED, "bound", False), c
        assert cell["drift_rate_upper_95"] <= 0.05
        counted = _counted(tmp_path / "run", c)
        assert len(counted) == NEEDED and {r["in_flight"] for r in counted} == {c - 1}
    assert json.loads((tmp_path / "run" / "run.json").read_text())["load"]["until_bound"] == 0.05
    # report recomputes the reasons from the records and run.json alone.
    (tmp_path / "run" / "summary.json").unlink()
    assert [c.stop_reason for c in finish_run(tmp_path / "run").cells] == ["bound", "bound"]


def test_drift_under_load_stops_the_loaded_cell_early(tmp_path):
    with FakeServer(Behaviour(drift_at=3, latency=0.1)) as fake:
        scenario = write_scenario(
            tmp_path / "s.toml",
            fake.url,
            concurrency=[1, 4],
            samples=8,
            max_samples=500,
            until_bound=0.05,
        )
        code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 1, output
    cells = cells_by_level(load_summary(tmp_path / "run"))
    assert (cells[1]["ok"], cells[1]["stop_reason"]) == (NEEDED, "bound")
    loaded = cells[4]
    assert loaded["stop_reason"] == "drift" and loaded["drift"]
    assert (
        8 <= loaded["ok"] < NEEDED
    )  # load.samples at least, far fewer than the bound or the cap would take
    counted = _counted(tmp_path / "run", 4)
    assert len(counted) == loaded["ok"] and {r["in_flight"] for r in counted} == {3}
    # The level stayed full to the end: no request of it saw more than c − 1 others, and the tail
    # kept sending.
    rows = [r for r in read_records(tmp_path / "run" / RECORDS) if r["concurrency"] == 4]
    assert max(r["in_flight"] for r in rows) == 3 and len(rows) > len(counted)


def test_a_cap_below_the_bound_stops_at_the_cap(tmp_path, server):
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1, 2],
        samples=8,
        max_samples=20,
        until_bound=0.05,
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    for c, cell in cells_by_level(load_summary(tmp_path / "run")).items():
        assert (cell["ok"], cell["stop_reason"]) == (20, "cap"), c
        assert cell["drift_rate_upper_95"] > 0.05  # the bound was not reached, and the cell says so
        assert {r["in_flight"] for r in _counted(tmp_path / "run", c)} == {c - 1}


def test_without_until_bound_cells_stop_at_samples(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=3)
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    summary = load_summary(tmp_path / "run")
    assert "until_bound" not in summary  # written only where the run sampled until a bound
    assert [(c["ok"], c["stop_reason"]) for c in summary["cells"]] == [
        (3, "samples"),
        (3, "samples"),
    ]


def test_resume_continues_the_rule_with_the_answers_it_has(tmp_path, server):
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1], samples=8, until_bound=0.05
    )
    out = tmp_path / "run"
    assert run_cli("run", scenario, "--out", out, "--quiet")[0] == 0
    lines = (out / RECORDS).read_bytes().splitlines(keepends=True)
    (out / RECORDS).write_bytes(b"".join(lines[:30]))  # as a run killed after 30 samples leaves it
    code, output = run_cli("run", "--resume", out, "--quiet")
    assert code == 0, output
    cell = cells_by_level(load_summary(out))[1]
    assert (cell["ok"], cell["stop_reason"]) == (NEEDED, "bound")


def test_diagnose_samples_the_claim_steps_until_the_bound(tmp_path, server):
    out = tmp_path / "diag.json"
    code, output = run_cli(
        "diagnose",
        "--url",
        server.url,
        "--model",
        "fake",
        "--prompt",
        "Tell me a fact.",
        "--params",
        '{"temperature": 0}',
        "--samples",
        "4",
        "--max-concurrency",
        "2",
        "--until-bound",
        "0.05",
        "--json",
        out,
        "--out",
        tmp_path / "runs",
    )
    assert code == 0, output
    steps = {s["step"]: s for s in json.loads(out.read_text())["steps"]}
    assert steps["baseline"]["ok"] == 4  # steps that back no claim of determinism keep --samples
    assert [steps[k]["ok"] for k in ("fixed", "concurrency_single", "concurrency_mixed")] == [
        NEEDED
    ] * 3
    assert all(steps[k]["drift_rate_upper_95"] <= 0.05 for k in ("fixed", "concurrency_single"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--until-bound", "0"],
            "--until-bound: expected a share between 0 and 1 such as 5% or 0.05, got '0'",
        ),
        (
            ["--until-bound", "five"],
            "--until-bound: expected a share between 0 and 1 such as 5% or 0.05, got 'five'",
        ),
        (
            ["--set", "load.until_bound=1.5"],
            "load.until_bound: expected a share from 0.000001 to below 1",
        ),
        (
            ["--until-bound", "5%", "--set", "load.max_samples=4"],
            "load.max_samples: expected an integer >= load.samples (8), got 4",
        ),
        (
            ["--until-bound", "5%", "--set", "load.rate=[5]"],
            "load.until_bound: expected closed-loop levels only",
        ),
    ],
)
def test_bad_until_bound_is_one_line_exit_2(tmp_path, args, expected):
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", *args)
    assert code == 2 and expected in output and len(output.strip().splitlines()) == 1, output
