"""run.json's graders read back (``compare.graded.gradings_of``): an entry that names no grader is a
clear error."""

from pathlib import Path

import pytest

from kevload.compare.graded import gradings_of
from kevload.errors import ScenarioError


def test_a_graded_probe_without_a_grader_in_run_json_is_named() -> None:
    # Before: Grading.from_json gave None for it, kept as the probe's grader, and grading failed
    # later with an AttributeError.
    with pytest.raises(ScenarioError, match=r"run\.json: grading\.p\.grade: expected one of exact"):
        gradings_of({"grading": {"p": {}}}, Path("run.json"), trust_graders=False)


def test_a_graded_probe_reads_back() -> None:
    gradings = gradings_of(
        {"grading": {"p": {"grade": "exact", "expected": "4"}}},
        Path("run.json"),
        trust_graders=False,
    )
    assert gradings is not None and gradings["p"].grade == "exact" and gradings["p"].expected == "4"
