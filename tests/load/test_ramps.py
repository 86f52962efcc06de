"""Stepped ramps (``load.ramp``) expand into ordinary levels; ``load.ramp_s`` sends at load without
counting."""

from __future__ import annotations

import math

import pytest

from kevload.inputs.scenario import ScenarioError, scenario_from_dict
from kevload.inputs.scenariokeys import Ramp
from kevload.load.level import decide
from kevload.load.schedule import COMPANION, PROBE, ClosedLoop, OpenLoop
from kevload.records.store import RECORDS, read_records
from tests.conftest import load_summary, run_cli, write_scenario

BASE = {
    "target": {"base_url": "http://127.0.0.1:1/v1", "model": "m"},
    "probes": [{"id": "p1", "prompt": "hi"}],
}


def _ramp_scenario(path, url, **load):
    """A scenario file whose levels come from ``load.ramp`` alone (write_scenario always writes
    concurrency)."""
    scenario = write_scenario(path, url, **load)
    text = scenario.read_text()
    assert "concurrency = [1, 4]\n" in text
    scenario.write_text(text.replace("concurrency = [1, 4]\n", ""))
    return scenario


def _load(**load):
    return scenario_from_dict({**BASE, "load": load}, source="s.toml").load


@pytest.mark.parametrize(
    ("ramp", "levels"),
    [
        (Ramp("concurrency", 1, 4, step=1), (1, 2, 3, 4)),
        (
            Ramp("concurrency", 1, 64, step=8),
            (1, 9, 17, 25, 33, 41, 49, 57, 64),
        ),  # `to` is always the last level
        (Ramp("concurrency", 1, 100, factor=2), (1, 2, 4, 8, 16, 32, 64, 100)),
        (
            Ramp("concurrency", 1, 10, factor=1.5),
            (1, 2, 3, 5, 8, 10),
        ),  # 1.5 and 2.25 both round to 2: one level
        (Ramp("concurrency", 5, 5, step=3), (5,)),
        (
            Ramp("rate", 0.1, 0.3, step=0.1),
            (0.1, 0.2, 0.3),
        ),  # 0.1 + 2 × 0.1 is a hair past 0.3: still 0.3
        (Ramp("rate", 2, 20, factor=3), (2.0, 6.0, 18.0, 20.0)),
    ],
)
def test_ramp_levels(ramp, levels):
    assert ramp.levels() == levels


def test_a_ramp_expands_into_levels_and_their_length():
    load = _load(ramp={"from": 1, "to": 4, "step": 1, "every_s": 30}, ramp_s=5)
    assert (
        load.concurrency == (1, 2, 3, 4)
        and load.rate == ()
        and load.duration == 30.0
        and load.ramp_s == 5.0
    )
    assert load.ramp == Ramp("concurrency", 1, 4, step=1, every_s=30.0)
    rates = _load(ramp={"of": "rate", "from": 5, "to": 20, "factor": 2}, duration=10)
    assert (
        rates.rate == (5.0, 10.0, 20.0) and rates.duration == 10.0
    )  # no every_s: load.duration stays


@pytest.mark.parametrize(
    ("load", "message"),
    [
        (
            {"ramp": {"from": 1, "to": 4, "step": 1}, "concurrency": [1, 2]},
            "load.ramp and load.concurrency: give one of them (the ramp sets the levels)",
        ),
        (
            {"ramp": {"of": "rate", "from": 1, "to": 4, "step": 1}, "rate": [1]},
            "load.ramp and load.rate: give one of them",
        ),
        (
            {"ramp": {"from": 1, "to": 4, "step": 1}, "rate": [1]},
            "load.ramp and load.rate: give one of them",
        ),
        (
            {"ramp": {"from": 1, "to": 4, "step": 1, "every_s": 5}, "duration": 3},
            "load.ramp.every_s and load.duration: give one of them (the ramp sets the seconds per "
            "level)",
        ),
        (
            {"ramp": {"from": 1, "to": 4}},
            "load.ramp: expected exactly one of step (levels step apart) or factor",
        ),
        (
            {"ramp": {"from": 1, "to": 4, "step": 1, "factor": 2}},
            "load.ramp: expected exactly one of step",
        ),
        (
            {"ramp": {"to": 4, "step": 1}},
            "load.ramp.from: expected an integer from 1 to 100,000, got nothing",
        ),
        (
            {"ramp": {"from": 1.5, "to": 4, "step": 1}},
            "load.ramp.from: expected an integer from 1 to 100,000, got 1.5",
        ),
        (
            {"ramp": {"from": 8, "to": 4, "step": 1}},
            "load.ramp.to: expected a level >= load.ramp.from (8), got 4",
        ),
        (
            {"ramp": {"from": 1, "to": 4, "step": 0}},
            "load.ramp.step: expected an integer from 1 to 100,000, got 0",
        ),
        (
            {"ramp": {"of": "rate", "from": 0, "to": 4, "step": 1}},
            "load.ramp.from: expected a number > 0",
        ),
        ({"ramp": {"from": 1, "to": 4, "factor": 1}}, "load.ramp.factor: expected a number > 1"),
        (
            {"ramp": {"from": 1, "to": 4, "step": 1, "every_s": 0}},
            "load.ramp.every_s: expected seconds > 0",
        ),
        (
            {"ramp": {"from": 1, "to": 4, "step": 1, "every": 5}},
            "load.ramp.every: unknown key (did you mean every_s?)",
        ),
        (
            {"ramp": {"of": "rates", "from": 1, "to": 4, "step": 1}},
            "load.ramp.of: expected one of concurrency, rate (did you mean rate?), got 'rates'",
        ),
        ({"ramp": {"from": 1, "to": 100000, "step": 1}}, "load.ramp: expected at most 1000 levels"),
        ({"ramp": "1..4"}, "load.ramp: expected a table"),
        ({"ramp_s": -1}, "load.ramp_s: expected seconds from 0 to 604,800 (0: no ramp-up), got -1"),
        # A ramp's levels meet the bounds of the levels they become.
        (
            {"ramp": {"from": 1, "to": 100_000_000, "factor": 2}},
            "load.ramp.to: expected an integer from 1 to 100,000, got 100000000",
        ),
        (
            {"ramp": {"of": "rate", "from": 1, "to": math.inf, "factor": 2}},
            "load.ramp.to: expected a number > 0, at most 100,000 (requests per second), got inf",
        ),
        (
            {
                "ramp": {"of": "rate", "from": 1e-9, "to": 1e-8, "factor": 2}
            },  # levels rounded to 1e-6: rate 0
            "load.ramp: expected a list of numbers > 0, at most 100,000 (requests per second), got "
            "[0.0]",
        ),
    ],
)
def test_bad_ramps_name_file_key_and_expectation(load, message):
    with pytest.raises(ScenarioError) as caught:
        _load(**load)
    assert str(caught.value).startswith("s.toml: ") and message in str(caught.value), str(
        caught.value
    )


def test_a_conflict_exits_2_on_one_line(tmp_path):
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:1/v1", ramp={"from": 1, "to": 4, "step": 1}
    )
    code, output = run_cli(
        "run", scenario, "--out", tmp_path / "run"
    )  # write_scenario sets load.concurrency
    assert code == 2 and output.count("\n") == 1 and "Traceback" not in output
    assert "load.ramp and load.concurrency" in output and str(scenario) in output


def test_closed_loop_ramp_up_and_timed_level():
    plan = ClosedLoop(2, 1, companions=False, ramp_s=1.0, duration=2.0)
    # Ramp-up: full-load sends go out and do not count, however many samples are still missing.
    assert plan.next(PROBE, 0.5) is not None and decide(plan, PROBE, 1, 0.5) is False
    plan.returned(PROBE, False)
    # Timed: every full-load sample in [ramp_s, ramp_s + duration) counts, past `needed` (1) too.
    assert [decide(plan, PROBE, 1, at) for at in (1.0, 1.5, 2.9)] == [
        True,
        True,
        True,
    ] and plan.counted == 3
    assert decide(plan, PROBE, 0, 1.5) is False  # below full load: still no evidence
    # Time is up with counted samples in flight: the slots keep the batch full with uncounted
    # copies.
    assert plan.next(PROBE, 3.0) is not None and decide(plan, PROBE, 1, 3.0) is False
    for _ in range(3):
        plan.returned(PROBE, True)
    assert plan.next(PROBE, 3.1) is None

    mixed = ClosedLoop(3, 4, companions=True, ramp_s=1.0)
    assert (
        decide(mixed, COMPANION, 2, 0.2) is False and decide(mixed, PROBE, 2, 0.2) is False
    )  # ramp-up
    assert decide(mixed, COMPANION, 2, 1.2) is True and decide(mixed, PROBE, 2, 1.2) is True


def test_open_loop_ramp_up_is_scheduled_and_not_counted():
    plan = OpenLoop(10.0, needed=3, companions=False, ramp_s=0.5)
    sends = list(plan)
    # Five sends in the ramp-up (0.0 … 0.4 s), then the three that count: samples are counted after
    # it.
    assert (
        len(sends) == 8
        and [decide(plan, s.role, 0, s.at) for s in sends] == [False] * 5 + [True] * 3
    )
    timed = list(OpenLoop(10.0, needed=0, companions=False, ramp_s=0.5, duration=1.0))
    assert len(timed) == 15 and max(s.at for s in timed) < 1.5  # the duration follows the ramp-up


def test_closed_loop_ramp_against_a_server(tmp_path, server):
    """ramp 1→4 step 1, every_s: four timed cells; counted probes at exactly c−1 others; ramp_s
    sends uncounted."""
    server.behaviour.latency = 0.1
    ramp_s, every_s = 0.3, 0.6
    scenario = _ramp_scenario(
        tmp_path / "s.toml",
        server.url,
        samples=1,
        ramp_s=ramp_s,
        ramp={"from": 1, "to": 4, "step": 1, "every_s": every_s},
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    rows = list(read_records(tmp_path / "run" / RECORDS))
    cells = {
        c["concurrency"]: c for c in load_summary(tmp_path / "run")["cells"] if c["role"] == "probe"
    }
    assert sorted(cells) == [1, 2, 3, 4]
    # between a slot's clock reading and the send it stamps: scheduling noise on a busy machine
    slack = 0.1
    for c, cell in cells.items():
        level = [r for r in rows if r["concurrency"] == c]
        counted = [r for r in level if r["counted"]]
        start = min(r["t_send"] for r in level)
        # A timed level counts what every_s gives, not load.samples (1); nothing it counts is short
        # of c.
        assert cell["ok"] == len(counted) >= 2 and cell["short"] is False
        assert {r["in_flight"] for r in counted} == {c - 1}
        assert all(
            ramp_s - slack <= r["t_send"] - start < ramp_s + every_s + slack for r in counted
        )
        # The ramp-up sent at the level's full load, and none of it counted.
        ramped = [r for r in level if r["t_send"] - start < ramp_s - slack]
        assert ramped and not any(r["counted"] for r in ramped)
        assert any(r["in_flight"] == c - 1 for r in ramped)


def test_rate_ramp_against_a_server(tmp_path, server):
    scenario = _ramp_scenario(
        tmp_path / "s.toml",
        server.url,
        ramp_s=0.2,
        ramp={"of": "rate", "from": 10, "to": 20, "step": 10, "every_s": 0.5},
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    rows = list(read_records(tmp_path / "run" / RECORDS))
    for rate, expected_counted, expected_ramp in ((10.0, 5, 2), (20.0, 10, 4)):
        level = [r for r in rows if r["rate"] == rate]
        start = min(r["t_scheduled"] for r in level)
        assert sum(r["counted"] for r in level) == expected_counted
        assert [r["counted"] for r in level if r["t_scheduled"] - start < 0.2 - 1e-9] == [
            False
        ] * expected_ramp


@pytest.mark.parametrize("levels", [{"rate": [20]}, {"concurrency": [2]}])
def test_resume_does_not_top_up_a_timed_level(tmp_path, server, levels):
    scenario = write_scenario(tmp_path / "s.toml", server.url, duration=0.3, **levels)
    out = tmp_path / "run"
    assert run_cli("run", scenario, "--out", out, "--quiet")[0] == 0
    before = len(list(read_records(out / RECORDS)))
    code, output = run_cli("run", "--resume", out, "--quiet")
    assert code == 0, output
    assert len(list(read_records(out / RECORDS))) == before  # a second 0.3 s would double the level
