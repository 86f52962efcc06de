"""The number grader exactly (kevload.inputs.numbers): the reader against an exact reference
(numbers rendered in each spelling it reads, read back to the very value), comparisons with a
tolerance against exact arithmetic, and ``expected`` kept as written through run.json, `kevload
report`, case files, datasets and --expected, against crafted servers whose answers are right or
wrong by one in the last digit."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kevload.inputs.grading import checked
from kevload.inputs.numbers import last_number
from kevload.inputs.probe import Probe, probe_inputs
from tests.conftest import load_summary, run_cli, write_scenario

HERE = Path(".")
SQUARE = 99999999**2  # 9999999800000001: a float reads it as 9999999800000000.0
HUGE = 123456789012345678901234567890

# Digits of other scripts, and the separators and minus signs the reader takes.
_SCRIPTS = ("0123456789", "０１２３４５６７８９", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९")
_MINUSES = ("-", "\u2212", "\u2013", "\uff0d")
_GROUPS = (",", " ", "\u2009", "\u202f", "\u00a0")
_SUPERSCRIPTS = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def _in_script(text: str, script: str) -> str:
    return text.translate(str.maketrans("0123456789", script))


def _grouped(digits: str, separator: str) -> str:
    head = len(digits) % 3 or 3
    return separator.join(
        [digits[:head]] + [digits[i : i + 3] for i in range(head, len(digits), 3)]
    )


@settings(max_examples=300, deadline=None)
@given(
    value=st.integers(-(10**60), 10**60),
    script=st.sampled_from(_SCRIPTS),
    minus=st.sampled_from(_MINUSES),
    group=st.sampled_from((None, *_GROUPS)),
    currency=st.sampled_from(("", "$")),
)
def test_an_integer_in_any_spelling_is_read_as_exactly_that_integer(
    value, script, minus, group, currency
):
    digits = str(abs(value))
    body = _grouped(digits, group) if group and len(digits) > 3 else digits
    written = f"{minus if value < 0 else ''}{currency}{_in_script(body, script)}"
    assert last_number(f"The answer is {written}.") == value


@settings(max_examples=300, deadline=None)
@given(
    mantissa=st.integers(-(10**30), 10**30),
    exponent=st.integers(-40, 40),
    spelling=st.sampled_from(("plain", "e", "times ten")),
)
def test_a_decimal_in_any_spelling_is_read_as_exactly_that_decimal(mantissa, exponent, spelling):
    value = Decimal(f"{mantissa}e{exponent}")
    sign = "\u2212" if mantissa < 0 else ""
    if spelling == "plain":
        written = f"{sign}{value.copy_abs():f}"
    elif spelling == "e":
        written = f"{sign}{abs(mantissa)}e{exponent}"
    else:
        written = f"{sign}{abs(mantissa)}×10{str(exponent).translate(_SUPERSCRIPTS)}"
    assert last_number(f"It is {written} exactly") == value


@settings(max_examples=200, deadline=None)
@given(
    whole=st.integers(0, 10**20),
    fraction=st.sampled_from(sorted("¼½¾⅐⅑⅒⅓⅔⅕⅖⅗⅘⅙⅚⅛⅜⅝⅞")),
    over=st.integers(0, 10**12),
    under=st.integers(1, 10**12),
    power=st.integers(-12, 12),
    base=st.integers(1, 10**6),
)
def test_fractions_and_powers_are_read_as_exact_ratios(whole, fraction, over, under, power, base):
    import unicodedata

    value = Fraction(unicodedata.numeric(fraction)).limit_denominator(10)
    assert last_number(f"{whole}{fraction} cups") == whole + value
    assert last_number(f"ratio {over}\u2044{under}") == Fraction(over, under)
    exponent = str(power).translate(_SUPERSCRIPTS)
    assert last_number(f"is {base}{exponent}") == Fraction(base) ** power


_EXPECTED = st.decimals(
    min_value=-(10**12), max_value=10**12, places=6, allow_nan=False, allow_infinity=False
)
_TOLERANCE = st.decimals(min_value=0, max_value=10**6, places=4, allow_nan=False)


@settings(max_examples=400, deadline=None)
@given(expected=_EXPECTED, tolerance=_TOLERANCE, offset=_TOLERANCE, sign=st.sampled_from((1, -1)))
def test_a_tolerance_is_inclusive_and_exact_as_decimal_arithmetic_says(
    expected, tolerance, offset, sign
):
    # The tolerance comes as TOML and JSON give it, a float; read as the decimal it was written as.
    written = float(str(tolerance))
    grading = checked(str(expected), "number", written, HERE)
    answer = expected + sign * offset
    assert grading.good(f"The answer is {answer:f}.", "p") == (
        abs(Fraction(answer) - Fraction(expected)) <= Fraction(Decimal(repr(written)))
    )
    # The ends themselves are inside.
    assert grading.good(f"{expected + Decimal(repr(written)):f}", "p")
    assert grading.good(f"{expected - Decimal(repr(written)):f}", "p")


def test_both_ends_of_a_tolerance_are_good_and_nothing_beyond():
    grading = checked(1.1, None, 0.1, HERE)
    assert [grading.good(a, "p") for a in ("1.0", "1.2", "0.99", "1.21", "1.1")] == [
        True,
        True,
        False,
        False,
        True,
    ]


def test_an_integer_is_compared_as_the_integer_it_is_at_any_size():
    assert checked(SQUARE, None, None, HERE).good(str(SQUARE), "p")
    assert not checked(SQUARE, None, None, HERE).good(str(SQUARE - 1), "p")
    assert checked(HUGE, None, None, HERE).good(f"{HUGE:,}", "p")
    assert not checked(HUGE, None, None, HERE).good(str(HUGE + 1), "p")
    assert not checked(str(HUGE), "number", None, HERE).good("1.2345678901234568e+29", "p")


def test_a_number_too_big_to_be_exact_cheaply_has_no_value_and_costs_no_time():
    import time

    started = time.perf_counter()
    for answer in ("9⁹⁹⁹⁹⁹⁹⁹⁹", "1e999999999½", "7" * 200_000 + "⁹⁹"):
        assert last_number(answer) is None, answer
    for answer in ("1e999999999½", "7" * 200_000 + "⁹⁹", "1⁄" + "3" * 300_000, "7" * 300_000):
        assert not checked(42, None, 0.5, HERE).good(answer, "p")
    # A decimal exponent alone costs nothing to hold exactly: 10^99999999999999 is read, and is no
    # 42.
    assert last_number("1e99999999999999") == Decimal("1e99999999999999")
    assert not checked(42, None, 10.0, HERE).good("1e99999999999999", "p")
    assert time.perf_counter() - started < 2


def test_a_grading_hash_is_what_runs_before_exact_numbers_hashed_where_the_float_was_exact():
    # A baseline from before keeps pairing its grades with a run now: 42 was hashed as 42.0, 1.1 as
    # 1.1.
    def old(expected: float) -> str:
        doc = {"grade": "number", "expected": expected, "tolerance": 0.0}
        return hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def now(expected) -> str:
        grading = checked(expected, "number", None, HERE)
        probe = Probe(id="p", prompt="x", expected=grading.expected, grade="number")
        return probe_inputs(probe, {})["grading"]

    assert now(42) == old(42.0) and now(1.1) == old(1.1) and now("1.10") == old(1.1)
    # Where the float was wrong, the grading is another: a baseline graded by it is not paired.
    assert now(SQUARE) != old(float(SQUARE)) and now(SQUARE) != now(SQUARE - 1)
    assert now(HUGE) != now(HUGE + 1)


def _square_server(prompt: str, overlap: int) -> str:
    """Right serially; under load (another request at the server) wrong by one in the last digit."""
    return f"The square is {SQUARE if overlap < 2 else SQUARE - 1}."


def test_an_integer_answer_wrong_by_one_in_its_last_digit_under_load_fails_fail_on_bad(
    tmp_path, server
):
    server.behaviour.latency = 0.1  # every counted c=4 sample meets others at the server
    server.behaviour.answer_for = _square_server
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        samples=4,
        probes=[{"id": "sq", "prompt": "What is 99999999 squared?", "expected": SQUARE}],
    )
    code, out = run_cli("run", path, "--out", tmp_path / "run", "--quiet", "--fail-on", "bad")
    assert code == 1, out
    cells = {c["concurrency"]: c for c in load_summary(tmp_path / "run")["cells"]}
    assert (cells[1]["graded_good"], cells[1]["graded_bad"]) == (4, 0)
    assert (cells[4]["graded_good"], cells[4]["flips_good_to_bad"]) == (0, 4)
    # run.json keeps expected as written; `kevload report` grades from it the same.
    run_json = (tmp_path / "run" / "run.json").read_text()
    assert '"expected": 9999999800000001' in run_json
    code, out = run_cli("report", tmp_path / "run", "--format", "json")
    assert json.loads(out)["cells"] == load_summary(tmp_path / "run")["cells"], out
    # A case built from the run carries it; rerun against the wrong number, it does not match.
    cases = tmp_path / "cases.jsonl"
    assert run_cli("cases", "build", tmp_path / "run", "-o", cases)[0] == 0
    assert {json.loads(line)["expected"] for line in cases.read_text().splitlines()} == {SQUARE}
    server.behaviour.answer_for = lambda prompt, overlap: str(SQUARE - 1)
    code, out = run_cli(
        "cases", "rerun", cases, "--url", server.url, "--model", "fake", "--times", "2",
        "-o", tmp_path / "after.jsonl", "--out", tmp_path / "reruns",
    )  # fmt: skip
    assert (
        code == 1
        and "does not match expected" in out
        and "matches expected" not in out.replace("does not match expected", "")
    ), out


def test_answers_exactly_at_both_ends_of_the_tolerance_are_both_good_and_no_flip(tmp_path, server):
    server.behaviour.latency = 0.1
    server.behaviour.answer_for = lambda prompt, overlap: "1.2" if overlap < 2 else "1.0"
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        samples=4,
        probes=[{"id": "t", "prompt": "About 1.1?", "expected": 1.1, "grade_tolerance": 0.1}],
    )
    code, out = run_cli("run", path, "--out", tmp_path / "run", "--quiet", "--fail-on", "bad")
    assert code == 0, out
    cells = {c["concurrency"]: c for c in load_summary(tmp_path / "run")["cells"]}
    assert [
        (c["graded_good"], c["graded_bad"], c["flips_good_to_bad"]) for c in cells.values()
    ] == [
        (4, 0, None),
        (4, 0, 0),
    ]


def test_an_integer_beyond_64_bits_is_kept_exactly_from_toml_dataset_and_expected_option(
    tmp_path, server
):
    server.behaviour.answer_for = lambda prompt, overlap: f"It is {HUGE}."
    (tmp_path / "d.jsonl").write_text(f'{{"id": "j", "prompt": "Big?", "expected": {HUGE + 1}}}\n')
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=1,
        probes=[{"id": "t", "prompt": "Big?", "expected": HUGE}, {"dataset": "d.jsonl"}],
    )
    code, out = run_cli("run", path, "--out", tmp_path / "run", "--quiet")
    assert code == 0 and "Traceback" not in out, out  # before: a traceback writing run.json
    cells = {c["probe"]: c for c in load_summary(tmp_path / "run")["cells"]}
    assert (cells["t"]["graded_good"], cells["j"]["graded_bad"]) == (1, 1)
    grading = json.loads((tmp_path / "run" / "run.json").read_text())["grading"]
    assert f'"expected": {HUGE}' in (tmp_path / "run" / "run.json").read_text()
    assert grading["j"]["expected"] == HUGE + 1  # read back by json, which keeps integers
    code, out = run_cli("report", tmp_path / "run", "--format", "json")
    assert json.loads(out)["cells"] == load_summary(tmp_path / "run")["cells"]

    from kevload.guide.diagnoseinput import expected_grading as _cli_grading

    assert _cli_grading(str(HUGE), None, None).expected == HUGE
    assert _cli_grading("0.1000000000000000000001", None, None).expected == Decimal(
        "0.1000000000000000000001"
    )


@pytest.mark.parametrize(
    ("expected", "kept"),
    [
        (42, 42),
        (1.1, 1.1),
        ("1.10", 1.1),
        (".5", 0.5),
        (" +3 ", 3),
        ("1,234", 1234),
        (str(SQUARE), SQUARE),
        ("0.1000000000000000000001", None),
    ],
)
def test_run_json_keeps_expected_as_a_json_number_that_reads_back_as_written(expected, kept):
    grading = checked(expected, "number", None, HERE)
    written = grading.to_json()["expected"]
    # A decimal no double holds is kept as its text, which reads back exactly.
    assert written == (str(grading.expected) if kept is None else kept)
    assert checked(written, "number", None, HERE).expected == grading.expected


def test_json_and_python_graders_keep_an_integer_beyond_64_bits_exactly(tmp_path, server):
    # Once refused at load ("JSON would not keep it"): now run.json keeps it, the json grader reads
    # the answer's integer as that integer, and a python grader gets it exact, in the run and in
    # `kevload report` alike.
    (tmp_path / "exact_graders.py").write_text(
        "def huge(answer, probe, expected):\n"
        f"    return expected == {{'n': {HUGE}}} and type(expected['n']) is int\n"
    )
    answers = {"right": f'{{"n": {HUGE}}}', "wrong": f'{{"n": {HUGE + 1}}}', "deep": "[" * 5000}
    server.behaviour.answer_for = lambda prompt, overlap: answers[prompt.split()[0]]
    probes = [
        {
            "id": f"{grade}-{answer}",
            "prompt": f"{answer} n?",
            "grade": grade,
            "expected": {"n": HUGE},
        }
        for grade in ("json", "python:exact_graders:huge")
        for answer in answers
    ]
    path = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1], samples=1, probes=probes
    )
    code, out = run_cli("run", path, "--out", tmp_path / "run", "--quiet")
    assert code == 0, out
    cells = {c["probe"]: c for c in load_summary(tmp_path / "run")["cells"]}
    good = {probe: (c["graded_good"], c["graded_bad"]) for probe, c in cells.items()}
    assert good == {
        "json-right": (1, 0),
        "json-wrong": (0, 1),
        "json-deep": (0, 1),
        "python:exact_graders:huge-right": (1, 0),
        "python:exact_graders:huge-wrong": (1, 0),  # this grader looks at expected only
        "python:exact_graders:huge-deep": (1, 0),
    }
    code, out = run_cli("report", tmp_path / "run", "--format", "json", "--trust-graders")
    assert json.loads(out)["cells"] == load_summary(tmp_path / "run")["cells"], out


def test_a_line_nested_past_the_json_readers_depth_is_bad_input_not_a_traceback(tmp_path):
    # JSONL and run.json are read by msgspec (integers of any size), whose depth limit is a
    # RecursionError: still the one clear error, exit 2, as orjson's was.
    (tmp_path / "d.jsonl").write_text("[" * 5000 + "\n")
    path = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", probes=[{"dataset": "d.jsonl"}]
    )
    code, out = run_cli("run", path)
    assert code == 2 and "d.jsonl:1: " in out and "expected one JSON object a line" in out, out
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("[" * 5000)
    (tmp_path / "run" / "records.jsonl").write_text("")
    code, out = run_cli("report", tmp_path / "run")
    assert code != 0 and "run.json: not valid JSON" in out and "Traceback" not in out, out


def test_diagnose_expected_keeps_an_integer_beyond_64_bits_exactly(tmp_path, server):
    # --expected was read as the float 1.2345678901234568e+29: the answer wrong by one in its last
    # digit under load was graded good, and each step's run.json kept the float.
    server.behaviour.latency = 0.1
    server.behaviour.answer_for = lambda prompt, overlap: str(HUGE if overlap < 2 else HUGE - 1)
    code, output = run_cli(
        "diagnose", "--url", server.url, "--model", "fake", "--prompt", "Big?",
        "--params", '{"temperature": 0}', "--samples", "6", "--json", tmp_path / "d.json",
        "--out", tmp_path / "runs", "--expected", str(HUGE),
    )  # fmt: skip
    steps = {s["step"]: s for s in json.loads((tmp_path / "d.json").read_text())["steps"]}
    assert (steps["baseline"]["graded_good"], steps["baseline"]["graded_bad"]) == (6, 0), output
    loaded = steps["concurrency_single"]  # c=1 right, c=2 and c=4 wrong: 6 samples each
    assert (loaded["graded_good"], loaded["graded_bad"], loaded["flips_good_to_bad"]) == (6, 12, 12)
    kept = {
        grader["expected"]
        for run_json in (tmp_path / "runs").rglob("run.json")
        for grader in json.loads(run_json.read_text())["grading"].values()
    }
    assert kept == {HUGE}
