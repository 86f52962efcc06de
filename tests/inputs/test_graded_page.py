"""docs/graded.md's number and choice rules, graded as the page says: every row of their tables is
read here and graded by the code, so the page and the graders cannot drift apart."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest

from kevload.inputs.choices import choice_letter
from kevload.inputs.grading import checked
from kevload.inputs.numbers import last_number

PAGE = Path(__file__).resolve().parents[2] / "docs" / "graded.md"


def _table(heading: str, header: str) -> list[list[str]]:
    """The rows of the table whose header line is ``header``, in the section under ``heading``; each
    cell with its code span's backticks dropped."""
    section = PAGE.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = section.split("\n")
    start = lines.index(header) + 2  # the header, then its --- line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows.append([c[1:-1] if c.startswith("`") and c.endswith("`") else c for c in cells])
    assert rows, f"no table {header!r} under {heading!r}"
    return rows


NUMBERS = _table("The number rule", "| answer | read as |")
TOLERANCES = _table("The number rule", "| expected | grade_tolerance | answer | grade |")
CHOICES = _table("The choice rule", "| answer | letter |")


def test_the_page_quotes_the_corners_the_rules_decide():
    quoted = {row[0] for row in NUMBERS + CHOICES}
    assert {"ω-3", "-$3", "42²", "4 100%", "C, not option A", "I eliminated option B"} <= quoted


@pytest.mark.parametrize(("answer", "reading"), NUMBERS, ids=[r[0] for r in NUMBERS])
def test_every_number_the_page_quotes_is_read_as_it_says(answer, reading):
    assert last_number(answer) == (None if reading == "none" else Fraction(reading))


@pytest.mark.parametrize(
    ("expected", "tolerance", "answer", "grade"), TOLERANCES, ids=[" ".join(r) for r in TOLERANCES]
)
def test_every_tolerance_the_page_quotes_grades_as_it_says(expected, tolerance, answer, grade):
    # As a scenario gives them: TOML reads 1.1 as a float, "42" as a string, 0 as an integer.
    import tomllib

    keys = tomllib.loads(f"expected = {expected}\ngrade_tolerance = {tolerance}")
    grading = checked(keys["expected"], "number", keys["grade_tolerance"], Path("."))
    assert grading.good(answer, "p") == {"good": True, "bad": False}[grade]


@pytest.mark.parametrize(("answer", "letter"), CHOICES, ids=[r[0] for r in CHOICES])
def test_every_choice_the_page_quotes_is_read_as_it_says(answer, letter):
    assert choice_letter(answer) == (None if letter == "none" else letter)
    # As a grade: the letter read is good, and no other letter is, a ruled-out one least of all.
    for expected in "ABCDEFGHIJ":
        grading = checked(expected, "choice", None, Path("."))
        assert grading.good(answer, "p") == (expected == letter)
