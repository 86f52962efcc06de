"""The choice grader against a crafted server (kevload.inputs.choices): an option the answer rules
out is never its pick, so an answer that names the right letter and rules another out is graded by
the letter it gives, serially and under load alike; and the reader stays linear in the answer's
length."""

from __future__ import annotations

import time

from kevload.inputs.choices import choice_letter
from tests.conftest import load_summary, run_cli, write_scenario


def test_an_answer_that_rules_an_option_out_under_load_is_graded_by_the_letter_it_gives(
    tmp_path, server
):
    # Serially "C"; under load "C, not option A" (right, documented as C: once read as A, 4
    # good→bad, exit 1) for one probe, and "D. Option B would be wrong" (wrong: once read as B,
    # graded good) for the other, whose expected is B.
    answers = {
        "c": ("C", "C, not option A"),
        "b": ("B", "D. Option B would be wrong"),
    }
    server.behaviour.latency = 0.1  # every counted c=4 sample meets others at the server
    server.behaviour.answer_for = lambda prompt, overlap: answers[prompt.split()[0]][overlap > 1]
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        samples=4,
        probes=[
            {"id": "c", "prompt": "c Which?", "expected": "C", "grade": "choice"},
            {"id": "b", "prompt": "b Which?", "expected": "B", "grade": "choice"},
        ],
    )
    code, out = run_cli("run", path, "--out", tmp_path / "run", "--quiet", "--fail-on", "bad")
    cells = {(c["probe"], c["concurrency"]): c for c in load_summary(tmp_path / "run")["cells"]}
    graded = {key: (c["graded_good"], c["graded_bad"]) for key, c in cells.items()}
    assert graded == {("c", 1): (4, 0), ("c", 4): (4, 0), ("b", 1): (4, 0), ("b", 4): (0, 4)}
    assert cells[("c", 4)]["flips_good_to_bad"] == 0 and cells[("b", 4)]["flips_good_to_bad"] == 4
    assert code == 1, out  # the one answer load made wrong, and only it


def test_reading_a_letter_stays_linear_in_the_answers_length():
    # The answer is the server's: a megabyte of blanks after a head, or of ruled-out options, is
    # read in moments (each ruled-out option is looked at within a bounded window).
    started = time.perf_counter()
    assert choice_letter("Answer:" + " \t\n" * 350_000) is None
    assert choice_letter("not option A, " * 80_000 + "so B.") is None
    assert choice_letter("Option A is wrong. " * 55_000 + "Answer: C") == "C"
    assert time.perf_counter() - started < 5
