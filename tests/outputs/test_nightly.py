"""Nightly use: baselines catch change in both directions, JUnit XML is valid and says what
drifted."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import xmlschema

from tests.conftest import load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

SCHEMA = xmlschema.XMLSchema(Path(__file__).parents[1] / "data" / "junit.xsd")


def nightly(tmp_path, server, name, *extra):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=8)
    return run_cli("run", scenario, "--out", tmp_path / name, "--quiet", *extra)


def test_unchanged_server_no_false_alarm(tmp_path, server):
    # Latency well above the scheduling noise of a busy machine, so an unchanged server stays
    # unchanged.
    server.behaviour.latency = 0.2
    assert nightly(tmp_path, server, "good")[0] == 0
    code, output = nightly(tmp_path, server, "again", "--baseline", tmp_path / "good")
    assert code == 0, output
    assert "0 regression(s)" in output and "REGRESSION" not in output


def test_new_drift_and_unseen_outputs_are_regressions(tmp_path, server):
    assert nightly(tmp_path, server, "good")[0] == 0
    server.behaviour.drift_at = 3
    server.behaviour.latency = 0.1
    code, output = nightly(
        tmp_path, server, "bad", "--baseline", tmp_path / "good" / "summary.json"
    )
    assert code == 1
    assert "REGRESSION new_drift p1@single/c=4" in output
    assert "REGRESSION unseen_output p1@single/c=4" in output
    assert "REGRESSION new_drift p1@single/c=1" not in output
    # The other direction: last night drifted, tonight does not. Improvement, exit 0.
    server.behaviour.drift_at = None
    code, output = nightly(tmp_path, server, "fixed", "--baseline", tmp_path / "bad")
    assert code == 0, output
    assert "improved fixed p1@single/c=4" in output


def test_changed_model_gives_unseen_outputs(tmp_path, server):
    nightly(tmp_path, server, "good")
    server.behaviour.words = 13  # another "model": every output is new
    code, output = nightly(tmp_path, server, "new", "--baseline", tmp_path / "good")
    assert code == 1
    assert output.count("REGRESSION unseen_output") == 2


def test_latency_regression(tmp_path, server):
    server.behaviour.latency = 0.02
    nightly(tmp_path, server, "fast")
    server.behaviour.latency = 0.08
    code, output = nightly(
        tmp_path, server, "slow", "--baseline", tmp_path / "fast", "--max-latency-regression", "0.5"
    )
    assert code == 1
    # The gate reads the whole run's ratio; the per-cell line is a note behind --verbose.
    assert "REGRESSION latency whole run: this run over the baseline" in output
    code, output = nightly(
        tmp_path,
        server,
        "slow-verbose",
        "--baseline",
        tmp_path / "fast",
        "--max-latency-regression",
        "0.5",
        "--verbose",
    )
    assert code == 1
    assert "note latency p1@single/c=1: e2e p50" in output
    code, _ = nightly(
        tmp_path, server, "slow2", "--baseline", tmp_path / "fast", "--max-latency-regression", "10"
    )
    assert code == 0


def test_junit_xml_is_valid_and_names_the_drift(tmp_path, server):
    server.behaviour.drift_at = 3
    server.behaviour.latency = 0.1
    nightly(tmp_path, server, "run", "--junit", tmp_path / "junit.xml")
    xml = (tmp_path / "junit.xml").read_text()
    SCHEMA.validate(xml)
    doc = SCHEMA.to_dict(xml)
    cases = doc["testsuite"][0]["testcase"]
    assert [c["@name"] for c in cases] == ["c=1", "c=4"]
    assert "failure" not in cases[0]
    failure = cases[1]["failure"][0]
    assert failure["@type"] == "nondeterminism"
    assert re.match(
        r"\d distinct outputs in 8 samples, (all|\d) ≠ serial; first divergence at char \d+",
        failure["$"],
    ), failure["$"]
    assert re.search(r"\(kinds: \d+× token", failure["$"]), failure["$"]
    assert doc["@failures"] == 1


def test_drift_in_cells_the_baseline_lacks_is_a_regression(tmp_path, server):
    # Last night: p1 at c=1 and c=2, steady. Tonight a new probe and a new level, and the server
    # drifts from 3 in flight on: both drift only at c=4, which the baseline never had.
    server.behaviour.latency = 0.1
    probes = [
        {"id": "p1", "prompt": "Say something.", "max_tokens": 16},
        {"id": "p2", "prompt": "Say another thing.", "max_tokens": 16},
    ]
    scenario = write_scenario(
        tmp_path / "wider.toml", server.url, probes=probes, concurrency=[1, 4], samples=8
    )
    write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=8)
    assert run_cli("run", tmp_path / "s.toml", "--out", tmp_path / "narrow", "--quiet")[0] == 0
    server.behaviour.drift_at = 3
    code, output = run_cli(
        "run", scenario, "--out", tmp_path / "wider", "--quiet", "--baseline", tmp_path / "narrow"
    )
    assert code == 1, output
    assert re.search(
        r"REGRESSION new_cell p1@single/c=4: new cell \(not in the baseline\); \d distinct in 8",
        output,
    )
    assert "REGRESSION new_cell p2@single/c=4" in output
    # A new cell that held is said, and is no regression.
    assert (
        "note new_cell p2@single/c=1: new cell (not in the baseline); held: one output in 8"
        in output
    )
    assert "REGRESSION missing_cell p1@single/c=2" in output
    assert "against baseline" in output and "3 regression(s)" in output


def test_a_changed_input_is_not_blamed_on_the_model(tmp_path, server):
    assert nightly(tmp_path, server, "good")[0] == 0
    probes = [{"id": "p1", "prompt": "Say something else.", "max_tokens": 16}]
    write_scenario(tmp_path / "s.toml", server.url, probes=probes, concurrency=[1, 4], samples=8)
    code, output = run_cli(
        "run",
        tmp_path / "s.toml",
        "--out",
        tmp_path / "asked",
        "--quiet",
        "--baseline",
        tmp_path / "good",
    )
    assert code == 0, output
    assert "unseen_output" not in output and "the model or server changed" not in output
    assert (
        "note input_changed p1@single/c=1: input changed: the prompt or messages (outputs and "
        "latency not "
        "compared with the baseline's); held: one output in 8"
    ) in output
    # Params and max_tokens are inputs too; drift in a cell whose input changed is a regression, as
    # in a new cell.
    server.behaviour.drift_at = 3
    server.behaviour.latency = 0.1
    probes = [{"id": "p1", "prompt": "Say something.", "max_tokens": 20}]
    write_scenario(
        tmp_path / "s.toml",
        server.url,
        probes=probes,
        params={"temperature": 0, "seed": 1},
        concurrency=[1, 4],
        samples=8,
    )
    code, output = run_cli(
        "run",
        tmp_path / "s.toml",
        "--out",
        tmp_path / "drifted",
        "--quiet",
        "--baseline",
        tmp_path / "good",
    )
    assert code == 1, output
    assert re.search(
        r"REGRESSION input_changed p1@single/c=4: input changed: params, max_tokens 16 → 20 .*; "
        r"\d distinct in 8",
        output,
    ), output
    assert "note input_changed p1@single/c=1" in output and "1 regression(s)" in output


def test_a_baseline_cell_without_an_ok_sample_is_quoted_as_such(tmp_path, server):
    # The baseline's c=4 failed every request (serial first: 8 samples, then c=4's); tonight c=4
    # drifts.
    server.behaviour.faults = [None] * 8 + ["http_500"] * 200
    nightly(tmp_path, server, "failed")
    assert [c["ok"] for c in load_summary(tmp_path / "failed")["cells"]] == [8, 0]
    server.behaviour.faults = []
    server.behaviour.drift_at = 3
    server.behaviour.latency = 0.1
    code, output = nightly(tmp_path, server, "now", "--baseline", tmp_path / "failed")
    assert code == 1, output
    assert re.search(
        r"REGRESSION new_drift p1@single/c=4: \d distinct in 8, first divergence at char \d+ "
        r"\(0-based\); the baseline had no ok sample here",
        output,
    ), output
    assert "in 0" not in output


@pytest.mark.parametrize(
    "key, value, named",
    [
        (
            "latency",
            None,
            "cells[1].latency: expected an object of objects of non-negative numbers, got null",
        ),
        ("output_hashes", None, "cells[1].output_hashes: expected a list of strings, got null"),
        ("output_hashes", [3], "cells[1].output_hashes[0]: expected a string, got 3"),
        ("drift", "no", 'cells[1].drift: expected true or false, got "no"'),
        # Counts, times and shares are never negative: a graded_good of -3 was read as a good
        # answer.
        (
            "graded_good",
            -3,
            "cells[1].graded_good: expected a non-negative integer or null, got -3",
        ),
        ("ok", -1, "cells[1].ok: expected a non-negative integer, got -1"),
        (
            "errors",
            {"http_500": -2},
            "cells[1].errors.http_500: expected a non-negative integer, got -2",
        ),
        (
            "latency",
            {"e2e": {"p50": -0.5}},
            "cells[1].latency.e2e.p50: expected a non-negative number, got -0.5",
        ),
    ],
)
def test_a_baseline_of_the_wrong_types_exits_2_before_anything_is_sent(
    tmp_path, server, key, value, named
):
    nightly(tmp_path, server, "good")
    doc = load_summary(tmp_path / "good")
    doc["cells"][1][key] = value
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    sent = len(server.requests)
    code, output = nightly(tmp_path, server, "now", "--baseline", tmp_path / "bad.json")
    assert code == 2, output
    assert f"{tmp_path / 'bad.json'}: --baseline: {named}" in output
    assert "Traceback" not in output
    assert len(server.requests) == sent and not (tmp_path / "now").exists()


@pytest.mark.parametrize("where", ["run", "cell"])
def test_a_baseline_missing_a_key_every_summary_has_exits_2_naming_it(tmp_path, server, where):
    nightly(tmp_path, server, "good")
    doc = load_summary(tmp_path / "good")
    if where == "run":
        del doc["verdict"]
    else:
        del doc["cells"][1]["probe"]
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    code, output = nightly(tmp_path, server, "now", "--baseline", tmp_path / "bad.json")
    assert code == 2, output  # before: a TypeError's traceback (missing verdict), exit 1
    named = "verdict" if where == "run" else "cells[1].probe"
    assert (
        f"{tmp_path / 'bad.json'}: --baseline: {named}: expected" in output and "missing" in output
    ), output
    assert "Traceback" not in output and not (tmp_path / "now").exists()


def test_known_drift_against_its_own_baseline_is_no_news(tmp_path):
    """The docs: 'drift the baseline already had is not news'. The same server, run twice, with
    crosstalk at c=4 both nights: tonight's random c=4 outputs differ from last night's, and kevload
    calls that 'REGRESSION unseen_output …: the model or server changed' with exit 1, although
    nothing changed."""
    with FakeServer(Behaviour(drift_at=3, latency=0.1)) as server:
        scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=8)
        assert run_cli("run", scenario, "--out", tmp_path / "night1", "--quiet")[0] == 1
        code, output = run_cli(
            "run",
            scenario,
            "--out",
            tmp_path / "night2",
            "--quiet",
            "--baseline",
            tmp_path / "night1",
        )
    assert "REGRESSION" not in output, output
    assert code == 0, output
