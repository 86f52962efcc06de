"""A baseline against a run that grades its probes otherwise: how a probe is graded is no input (the
server is asked the same, so drift and outputs are still compared), and grades by another rule are
paired with nothing."""

from __future__ import annotations

import json

from kevload.inputs.conversation import Turn
from kevload.inputs.probe import UNGRADED, Probe, probe_inputs
from tests.conftest import run_cli, write_scenario

PROMPT = "What is 40+2?"


def right_alone_wrong_in_a_crowd(prompt: str, overlap: int) -> str:
    return "42" if overlap < 2 else "The answer is 43"


def _run(tmp_path, server, name: str, *args: str, **probe) -> tuple[int, str]:
    server.behaviour.latency = 0.1  # every counted c=4 sample meets others at the server
    server.behaviour.answer_for = right_alone_wrong_in_a_crowd
    path = write_scenario(
        tmp_path / f"{name}.toml",
        server.url,
        probes=[{"id": "sum", "prompt": PROMPT, **probe}],
        concurrency=[1, 4],
        samples=4,
    )
    return run_cli("run", path, "--out", tmp_path / name, "--quiet", *args)


def test_grading_a_probe_the_baseline_did_not_grade_keeps_the_drift_comparison(tmp_path, server):
    # Last night the probe was ungraded and drifted at c=4; tonight the same prompt gets an expected
    # answer. The server was asked the same: its drift is the drift the baseline had, no news.
    assert _run(tmp_path, server, "ungraded")[0] == 1
    code, output = _run(
        tmp_path, server, "graded", "--baseline", str(tmp_path / "ungraded"), expected=42
    )
    assert "input_changed" not in output and "REGRESSION" not in output, output
    assert "0 regression(s)" in output and code == 0


def test_a_fixed_expected_keeps_the_drift_comparison_and_pairs_no_grades(tmp_path, server):
    # The baseline graded against a wrong expected (43): serial "bad", c=4 "good". Fixed to 42, the
    # same answers grade the other way: paired, that would read as an accuracy lost at c=4, which no
    # change of the server made.
    assert _run(tmp_path, server, "wrong", expected=43)[0] == 1
    code, output = _run(
        tmp_path, server, "fixed", "--baseline", str(tmp_path / "wrong"), expected=42
    )
    assert (
        "input_changed" not in output
        and "accuracy_lost" not in output
        and "accuracy_gained" not in output
    ), output
    assert (
        "note grading_changed sum: graded by another rule than in the baseline (expected, grade or "
        "grade_tolerance changed)" in output
    )
    assert "REGRESSION" not in output and code == 0, output
    # The same grading again: paired as ever, nothing to note.
    code, output = _run(
        tmp_path, server, "again", "--baseline", str(tmp_path / "fixed"), expected=42
    )
    assert "grading_changed" not in output and code == 0, output


def test_a_baseline_that_hashed_grading_with_the_input_says_it_cannot_tell_them_apart(
    tmp_path, server
):
    assert _run(tmp_path, server, "graded", expected=42)[0] == 1
    summary = tmp_path / "graded" / "summary.json"
    doc = json.loads(summary.read_text())
    # As an older kevload wrote it: no grading hash, the input's hash taken over expected and grade
    # too.
    doc["inputs"]["sum"] = {
        "input": "0" * 64,
        "params": doc["inputs"]["sum"]["params"],
        "max_tokens": 64,
    }
    summary.write_text(json.dumps(doc))
    _, output = _run(tmp_path, server, "now", "--baseline", str(summary), expected=42)
    assert (
        "input changed: the prompt, messages or grading (the baseline hashed them as one)" in output
    ), output


def test_an_ungraded_probes_input_hash_is_the_one_earlier_versions_recorded():
    # Recorded by the version that hashed the grading keys with the input: an ungraded probe's
    # hashes must not change, or every nightly against an older baseline would read as a changed
    # input.
    asked = probe_inputs(Probe(id="p1", prompt="Say something.", max_tokens=16), {"temperature": 0})
    assert asked == {
        "input": "3e16abdada235dc272344845d1dbba77f3c9d9a94649997e367ab95e2294f4d7",
        "params": "e4ff491169b8a9ea78518a7972422b5a24d5e3790e0d9a9e5cbfb384d9b621e0",
        "max_tokens": 16,
        "grading": UNGRADED,
    }
    talk = Probe(id="c", turns=(Turn("hi"), Turn("and?", "ok")), system="be brief")
    assert (
        probe_inputs(talk, {})["input"]
        == "ea1c871aa1a11f7f6f292ffe45fd310435584c7d2f7c57dcc334f1513516df9a"
    )


def test_grading_keys_change_the_grading_hash_and_not_the_input():
    plain = Probe(id="p", prompt=PROMPT)
    variants = [
        Probe(id="p", prompt=PROMPT, expected="42", grade="exact"),
        Probe(id="p", prompt=PROMPT, expected=42.0, grade="number"),
        Probe(id="p", prompt=PROMPT, expected=42.0, grade="number", grade_tolerance=1.0),
    ]
    hashes = [probe_inputs(p, {}) for p in (plain, *variants)]
    assert len({h["input"] for h in hashes}) == 1
    assert len({h["grading"] for h in hashes}) == len(hashes)
    assert probe_inputs(Probe(id="p", prompt="What is 40+3?"), {})["input"] != hashes[0]["input"]
