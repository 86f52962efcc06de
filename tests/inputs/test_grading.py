"""Graders (kevload.inputs.grading): each reads an answer the way it says, and every grading key is
checked at load, in a scenario and on a JSONL line alike (file, line, key, what was expected; exit
2)."""

from __future__ import annotations

import json
import threading
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kevload.errors import ScenarioError
from kevload.inputs.choices import choice_letter
from kevload.inputs.gradeanswers import GraderFailed, content_of
from kevload.inputs.grading import GRADES, BadGrading, Grading, checked
from kevload.inputs.numbers import last_number
from kevload.inputs.scenario import load_scenario
from kevload.records.store import answer_text, read_json, write_json
from tests.bounded import Kevload
from tests.conftest import run_cli, write_scenario

HERE = Path(".")


def good(answer: str, expected=None, grade=None, tolerance=None, base: Path = HERE) -> bool:
    return checked(expected, grade, tolerance, base).good(answer, "p1")


def test_exact_trims_whitespace_and_nothing_else():
    assert good("  Paris\n", "Paris")
    assert not good("paris", "Paris")
    assert not good("Paris.", "Paris")


def test_contains_regex_and_one_of():
    assert good("It is Paris, of course.", "Paris", "contains")
    assert not good("It is Lyon.", "Paris", "contains")
    assert good("The answer: 42 apples", r"\b42\b", "regex")
    assert not good("The answer: 420", r"\b42\b", "regex")
    assert good(" yes ", ["Yes", "yes"])
    assert not good("yes!", ["Yes", "yes"])


@pytest.mark.parametrize(
    ("answer", "number"),
    [
        ("The sum is 12.", 12.0),
        ("12 + 30 = 42", 42.0),
        ("-7", -7.0),
        ("x = -3.5 then", -3.5),
        ("1,234,567 people", 1234567.0),
        ("答案是４２。", 42.0),
        ("5-3=2", 2.0),
        ("none here", None),
        ("1e3", 1000.0),
        ("version 2.0, answer 7", 7.0),
    ],
)
def test_last_number_reads_answers_as_written(answer, number):
    read = last_number(answer)
    assert read is None if number is None else read == Fraction(str(number))


@pytest.mark.parametrize(
    ("answer", "number"),
    [
        # A minus sign, or a dash before the digit, is a minus; a dash between two numbers is none.
        ("−42", -42.0),
        ("x = –3.5", -3.5),
        ("—7", -7.0),
        ("‒7", -7.0),
        ("－42", -42.0),
        ("5−3=2", 2.0),
        ("pages 10–20", 20.0),
        ("The answer—42", 42.0),
        # Vulgar fractions and the fraction slash: their value, alone or after a whole number.
        ("½", 0.5),
        ("3½ cups", 3.5),
        ("2 ½", 2.5),
        ("−¾", -0.75),
        ("1⁄2", 0.5),
        ("¹⁄₂", 0.5),
        ("3¹⁄₂", 3.5),
        ("1⁄0", None),
        # Superscripts are powers (and a unit's square is no number); subscripts are no digits of
        # the number before.
        ("2⁴", 16.0),
        ("10⁻³", 0.001),
        ("1.5×10⁻³", 0.0015),
        ("3 x 10⁵", 3e5),
        ("-2²", -4.0),
        ("5 m²", 5.0),
        ("x² = 9", 9.0),
        ("101₂", None),
        ("CO₂ is 44", 44.0),
        ("9⁹⁹⁹⁹⁹⁹", None),
        # Thousands apart by a space, no-break, thin or narrow no-break space, in groups of three;
        # else two numbers.
        ("1 000", 1000.0),
        ("1 000", 1000.0),
        ("1 000", 1000.0),
        ("1 000 000", 1e6),
        ("12 345.5", 12345.5),
        ("1 2", 2.0),
        ("1 2345", 2345.0),
        ("1 00", 0.0),
    ],
)
def test_last_number_reads_math_typography_as_a_demanding_grader_does(answer, number):
    read = last_number(answer)
    assert read is None if number is None else read == Fraction(str(number))


def test_a_server_writing_math_typography_is_graded_by_the_numbers_it_wrote(tmp_path, server):
    # NFKC read "−42" as 42, "2⁴" as 24 and "1 000" as 0: each answer below was graded the other way
    # round.
    answers = {"neg": "The answer is −42.", "pow": "It is 2⁴.", "big": "About 1 000 of them."}
    server.behaviour.answer_for = lambda prompt, overlap: answers[prompt.split()[0]]
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=2,
        probes=[
            {"id": "neg", "prompt": "neg 6 - 48?", "expected": -42},
            {"id": "pow", "prompt": "pow 2 ** 4?", "expected": 24},
            {"id": "big", "prompt": "big how many?", "expected": 1000},
        ],
    )
    run_cli("run", path, "--out", tmp_path / "r", "--quiet")
    cells = json.loads((tmp_path / "r" / "summary.json").read_text())["cells"]
    assert {c["probe"]: (c["graded_good"], c["graded_bad"]) for c in cells} == {
        "neg": (2, 0),
        "pow": (0, 2),
        "big": (2, 0),
    }


def test_number_grade_with_tolerance():
    assert good("It is 42.", 42)
    assert good(
        "It is 42.0", "42", "number"
    )  # a string holding a number, as datasets often carry them
    assert not good("It is 43.", 42)
    assert good("It is 3.15", 3.14159, tolerance=0.01)
    assert not good("It is 3.2", 3.14159, tolerance=0.01)
    assert not good("no number", 42)


@pytest.mark.parametrize(
    ("answer", "letter"),
    [
        ("B", "B"),
        ("(C)", "C"),
        ("D.", "D"),
        ("A) Paris", "A"),
        ("Answer: B", "B"),
        ("The answer is (c).", "C"),
        ("I think the correct answer is **D**", "D"),
        ("答案：Ｂ", "B"),
        ("答案是C。", "C"),
        ("选 A", "A"),
        ("Let me see. A good guess: (B) fits.", "B"),
        ("Paris is the capital.", None),
        ("\\boxed{C}", "C"),
        ("A is wrong; answer: C", "C"),
        ("The answer is a cat.", None),
        ("adoption B", None),
        ("answer: b", "B"),
    ],
)
def test_choice_reads_the_letter_as_mmlu_graders_do(answer, letter):
    assert choice_letter(answer) == letter


@pytest.mark.parametrize(
    ("answer", "letter"),
    [
        ("Answer: C. Option A is wrong because it is a vehicle.", "C"),
        ("The correct answer is C, not option A.", "C"),
        ("答案是C，选项A不对", "C"),
        ("The answer is C. Answer A is a distractor.", "C"),
        ("The answer is option C. Option A is wrong.", "C"),
        ("答案是选项C，选项A不对", "C"),
        ("I think option A is a trap; the correct option is D", "D"),
        ("选项A和选项C中，应选C", "C"),
        (
            "The answer is B. Wait, no: the answer is C.",
            "C",
        ),  # a model correcting itself: its last answer
        ("Option B is correct.", "B"),
        ("Option A seems right", "A"),  # a mention alone is read where nothing else is
        ("Answer: (b) because", "B"),
        ("The answer is\nD", "D"),
        ("The final answer is D.", "D"),
    ],
)
def test_choice_an_answer_head_wins_over_a_mention_of_an_option(answer, letter):
    assert choice_letter(answer) == letter


@pytest.mark.parametrize(
    ("answer", "letter"),
    [
        ("The answer is I think B", "B"),
        ("The answer is, I think, B.", "B"),
        ("Answer: I would say D", "D"),
        ("Answer: I'm not sure", None),
        ("Answer: a cat", None),
        ("Answer: A car is no fruit, so B", None),
        ("The answer is a cat.", None),
        # The letters themselves, where the words cannot be meant.
        ("The answer is I.", "I"),
        ("The answer is I because it fits", "I"),
        ("Answer: a", "A"),
        ("Answer: I", "I"),
        ("The answer is A because", "A"),
        ("The answer is A\nthe others are wrong", "A"),
        ("Option I seems right", "I"),
        ("Answer: A Paris", "A"),
        ("I'd say the answer is (d)", "D"),
    ],
)
def test_choice_reads_a_and_i_as_words_where_they_are_the_article_or_pronoun(answer, letter):
    assert choice_letter(answer) == letter


@pytest.mark.parametrize(
    ("answer", "letter"),
    [
        # The article after either head form alike (the head without a colon read "The answer is A
        # cat" as A).
        ("The answer is A cat", None),
        ("Answer: A cat", None),
        ("The correct answer is A cat.", None),
        ("The answer is A because it is a fruit", "A"),
        ("The answer is A. A cat is no fruit.", "A"),
        # An option named after a head is a letter whatever follows.
        ("The answer is option A seems right", "A"),
        ("Answer: B. No, the answer is option A, it seems", "A"),
        # A hedge between the head and the letter: the head says an answer follows, the hedge only
        # who says it.
        ("Answer: I am sure it is B", "B"),
        ("The answer is, I am quite sure, C.", "C"),
        ("Answer: I'd go with C", "C"),
        ("The answer is I am sure it's D", "D"),
        ("Answer: I think it is not B", None),
        ("Answer: I am sure it is a cat", None),
        ("Answer: I am not sure between B and C", None),
    ],
)
def test_choice_reads_every_answer_head_alike_and_the_letter_after_a_hedge(answer, letter):
    assert choice_letter(answer) == letter


def test_choice_grades_an_answer_that_rules_an_option_out_by_its_answer(tmp_path, server):
    server.behaviour.answer_for = lambda prompt, overlap: (
        "Answer: C. Option A is wrong because a car is no fruit."
    )
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=2,
        probes=[
            {
                "id": "fruit",
                "prompt": "Which is a fruit? A. car B. stone C. banana D. chair",
                "expected": "C",
                "grade": "choice",
            }
        ],
    )
    code, out = run_cli("run", path, "--out", tmp_path / "r", "--quiet")
    (cell,) = json.loads((tmp_path / "r" / "summary.json").read_text())["cells"]
    assert (cell["graded_good"], cell["graded_bad"]) == (2, 0), out
    assert code == 0, out


def test_an_answer_head_followed_by_blanks_is_graded_in_moments(tmp_path, server):
    # The answer is the server's: blanks after a head ("Answer:" then 300 kB of tabs and newlines;
    # no spaces, which the fake server would stream as 300 000 tokens) once cost a step per way to
    # split them between the regex's gaps (minutes here, hours for a megabyte), and the run hung in
    # its summary.
    server.behaviour.answer_for = lambda prompt, overlap: (
        "Answer:" + "\t\n" * 150_000 + "x(Answer:\t" + "\n" * 9
    )
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=2,
        probes=[{"id": "pick", "prompt": "Pick one.", "expected": "B", "grade": "choice"}],
    )
    with Kevload("run", path, "--out", tmp_path / "r", "--quiet") as kevload:
        ended = kevload.end(timeout=60)
    assert ended.code == 0, ended.stderr
    (cell,) = json.loads((tmp_path / "r" / "summary.json").read_text())["cells"]
    assert (cell["graded_good"], cell["graded_bad"]) == (0, 2)


def test_choice_grade():
    assert good("Answer: b", "B", "choice")
    assert not good("Answer: A", "B", "choice")
    assert not good("Paris", "B", "choice")


def test_json_and_json_schema(tmp_path):
    assert good('{"a": 1}', grade="json")
    assert good('```json\n{"a": 1}\n```', grade="json")  # the one fence models add
    assert not good("{a: 1}", grade="json")
    assert good('{"a": 1.0, "b": [true]}', {"a": 1, "b": [True]}, "json")
    assert not good('{"a": 1, "b": [1]}', {"a": 1, "b": [True]}, "json")  # true is no number
    schema = {"type": "object", "required": ["name"], "properties": {"age": {"type": "integer"}}}
    assert good('{"name": "x", "age": 3}', schema, "json_schema")
    assert not good('{"age": 3}', schema, "json_schema")
    assert not good("not json", schema, "json_schema")
    (tmp_path / "s.json").write_text(json.dumps(schema))
    assert good('{"name": "x"}', "s.json", "json_schema", base=tmp_path)


def test_reasoning_block_is_not_graded():
    assert good("<reasoning>\nmaybe 41\n</reasoning>\n42", "42")
    assert good(answer_text("42", "maybe 41"), "42")


# Texts made of the block's own pieces: a reasoning or a content that writes the tags itself, whole
# or in part.
_PIECES = (
    "<reasoning>\n",
    "\n</reasoning>\n",
    "</reasoning>",
    "\n",
    "<",
    "a",
    "0",
    "12",
    '<reasoning chars="',
    '<reasoning chars="2">\n',
    '">\n',
)
_TAG_PIECES = st.lists(st.sampled_from(_PIECES), max_size=8).map("".join)


@settings(max_examples=400, deadline=None)
@given(
    output=_TAG_PIECES,
    reasoning=st.none() | _TAG_PIECES,
    other_output=_TAG_PIECES,
    other_reasoning=st.none() | _TAG_PIECES,
    calls=st.lists(st.tuples(_TAG_PIECES, _TAG_PIECES), max_size=2),
)
def test_the_graded_part_of_an_answer_is_exactly_its_content_whatever_its_reasoning_holds(
    output, reasoning, other_output, other_reasoning, calls
):
    assert content_of(answer_text(output, reasoning)) == output
    tool_calls = [{"name": name, "arguments": arguments} for name, arguments in calls]
    assert content_of(answer_text(output, reasoning, tool_calls)) == content_of(
        answer_text(output, None, tool_calls)
    )
    # One text for one (reasoning, content): a cell grades each distinct text once, by its hash.
    if (output, reasoning or None) != (other_output, other_reasoning or None):
        assert answer_text(output, reasoning) != answer_text(other_output, other_reasoning)


def test_an_answer_whose_reasoning_writes_the_closing_tag_is_told_from_its_twins():
    leaky = answer_text("43", "Let me think.\n</reasoning>\n42")
    assert content_of(leaky) == "43"
    assert leaky != answer_text("42\n</reasoning>\n43", "Let me think.")
    assert (
        content_of(answer_text("<reasoning>\nx\n</reasoning>\n43"))
        == "<reasoning>\nx\n</reasoning>\n43"
    )
    # Every other answer keeps the text (and so the hash) it always had.
    assert answer_text("42", "maybe 41") == "<reasoning>\nmaybe 41\n</reasoning>\n42"


def test_a_reasoning_that_writes_the_closing_tag_itself_leaks_nothing_into_the_graded_answer(
    tmp_path, server
):
    # The block was cut at the first closing tag line: a reasoning "…</reasoning>\n42" before the
    # content "43" was graded as "42\n</reasoning>\n43", so every wrong answer was graded good.
    server.behaviour.reasoning_field = "reasoning_content"
    server.behaviour.reasoning_for = lambda content: "Let me think.\n</reasoning>\n42"
    server.behaviour.answer_for = lambda prompt, overlap: "43"
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1, 2],
        samples=2,
        probes=[
            {"id": "n", "prompt": "What is 40+2?", "expected": "42", "grade": "contains"},
            {"id": "e", "prompt": "What is 40+2? Just the number.", "expected": 42},
        ],
    )
    run_cli("run", path, "--out", tmp_path / "r", "--quiet")
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    graded = {
        (c["probe"], c["concurrency"]): (c["graded_good"], c["graded_bad"])
        for c in summary["cells"]
    }
    assert graded == {(p, c): (0, 2) for p in ("n", "e") for c in (1, 2)}
    # kevload report grades the records again (their content and reasoning fields) the same way.
    code, out = run_cli("report", tmp_path / "r", "--format", "json")
    again = {
        (c["probe"], c["concurrency"]): (c["graded_good"], c["graded_bad"])
        for c in json.loads(out)["cells"]
    }
    assert again == graded, out


def test_python_grader_gets_answer_probe_and_expected(tmp_path):
    (tmp_path / "mygraders_a.py").write_text(
        "def check(answer, probe, expected):\n    return answer.upper() == expected and probe == "
        "'p1'\n"
        "def boom(answer, probe, expected):\n    return int(answer) > 0\n"
        "def vague(answer, probe, expected):\n    return 1\n"
    )
    assert good("ok", "OK", "python:mygraders_a:check", base=tmp_path)
    assert not good("no", "OK", "python:mygraders_a:check", base=tmp_path)
    with pytest.raises(
        GraderFailed, match=r"python:mygraders_a:boom raised ValueError: .* on the answer 'x'"
    ):
        good("x", None, "python:mygraders_a:boom", base=tmp_path)
    with pytest.raises(GraderFailed, match="returned 1, expected True or False"):
        good("x", None, "python:mygraders_a:vague", base=tmp_path)


def test_two_python_graders_of_one_module_name_in_two_directories_are_refused_not_mixed(
    tmp_path, server
):
    """Python keeps one module per name: the grader beside the second dataset would grade by the
    first's."""
    import sys

    for folder, right in (("a", "42"), ("b", "43")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "kevload_test_twin.py").write_text(
            f"def check(answer, probe, expected):\n    return answer.strip() == {right!r}\n"
        )
        (tmp_path / folder / "items.jsonl").write_text(
            json.dumps(
                {"id": folder, "prompt": "What is it?", "grade": "python:kevload_test_twin:check"}
            )
            + "\n"
        )
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        probes=[{"dataset": "a/items.jsonl"}, {"dataset": "b/items.jsonl"}],
    )
    try:
        code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    finally:
        sys.modules.pop("kevload_test_twin", None)
    assert code == 2 and not server.requests, output
    assert f"{tmp_path / 'a' / 'kevload_test_twin.py'}" in output and f"{tmp_path / 'b'}" in output


def test_a_namespace_package_of_one_name_in_two_directories_is_refused_and_the_same_one_is_not(
    tmp_path,
):
    import sys

    from kevload.inputs.grading import python_grader

    for folder in ("a", "b"):
        (tmp_path / folder / "kevload_test_ns").mkdir(
            parents=True
        )  # no __init__.py: a namespace package
        (tmp_path / folder / "kevload_test_ns" / "g.py").write_text(
            "def check(answer, probe, expected):\n    return True\n"
        )
    try:
        first = python_grader("python:kevload_test_ns.g:check", tmp_path / "a")
        assert python_grader("python:kevload_test_ns.g:check", tmp_path / "a") is first
        with pytest.raises(
            BadGrading, match=r"kevload_test_ns is already .*/a/kevload_test_ns, not .*/b/"
        ):
            python_grader("python:kevload_test_ns.g:check", tmp_path / "b")
    finally:
        for name in ("kevload_test_ns", "kevload_test_ns.g"):
            sys.modules.pop(name, None)


def test_a_grader_module_named_after_an_installed_library_is_refused_before_it_stands_in_for_it(
    tmp_path,
):
    import sys

    import jsonschema

    from kevload.inputs.grading import python_grader

    (tmp_path / "jsonschema.py").write_text(
        "def check(answer, probe, expected):\n    return True\n"
    )
    with pytest.raises(
        BadGrading, match=r"jsonschema is already .*site-packages.*, not .*jsonschema.py; rename"
    ):
        python_grader("python:jsonschema:check", tmp_path)
    assert sys.modules["jsonschema"] is jsonschema
    # One not imported yet (the standard library's tabnanny): found where Python would import it
    # from.
    (tmp_path / "tabnanny.py").write_text("def check(answer, probe, expected):\n    return True\n")
    assert "tabnanny" not in sys.modules
    with pytest.raises(BadGrading, match=r"tabnanny is already .*tabnanny.py, not .*rename"):
        python_grader("python:tabnanny:check", tmp_path)


@pytest.mark.parametrize(
    ("expected", "grade", "tolerance", "key", "words"),
    [
        (None, "exact", None, "expected", "a string beside grade"),
        ("x", "fuzzy", None, "grade", "one of exact, contains"),
        ("(", "regex", None, "expected", "a regular expression"),
        ([], "one_of", None, "expected", "a non-empty list of strings"),
        ("forty", "number", None, "expected", "a number"),
        ("AB", "choice", None, "expected", "one letter from A to J"),
        (42, None, -1, "grade_tolerance", "a number >= 0"),
        ("x", None, 0.5, "grade_tolerance", 'grade = "number" beside it'),
        (None, None, 0.5, "grade_tolerance", "expected and grade"),
        ({"type": "objekt"}, "json_schema", None, "expected", "a valid JSON Schema"),
        ("missing.json", "json_schema", None, "expected", "a JSON Schema file that reads as JSON"),
        (None, "python:no_such_module_xyz:f", None, "grade", "importing no_such_module_xyz"),
        (
            None,
            "python:json:no_such_function",
            None,
            "grade",
            "json has no function no_such_function",
        ),
        (None, "python:json", None, "grade", "python:module:function"),
        ({"a": 1}, None, None, "grade", "only a string, a number or a list picks its grader"),
    ],
)
def test_bad_grading_keys_are_named(expected, grade, tolerance, key, words):
    with pytest.raises(BadGrading) as bad:
        checked(expected, grade, tolerance, HERE)
    assert bad.value.key == key and words in bad.value.expected


def test_no_keys_is_ungraded():
    assert checked(None, None, None, HERE) is None


def test_scenario_probe_grading_errors_exit_2(tmp_path):
    path = write_scenario(
        tmp_path / "s.toml",
        "http://127.0.0.1:9/v1",
        probes=[{"id": "p1", "prompt": "Pick.", "grade": "choice", "expected": "Z"}],
    )
    code, out = run_cli("run", path)
    assert code == 2
    assert f"{path}: probes[0].expected: expected one letter from A to J, got 'Z'" in out


def test_scenario_malformed_schema_exits_2(tmp_path):
    path = write_scenario(
        tmp_path / "s.toml",
        "http://127.0.0.1:9/v1",
        probes=[
            {
                "id": "p1",
                "prompt": "JSON.",
                "grade": "json_schema",
                "expected": {"type": "object", "required": "a"},
            }
        ],
    )
    code, out = run_cli("run", path)
    assert code == 2 and "probes[0].expected: expected a valid JSON Schema (at required:" in out


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"$ref": "#/definitions/missing"}, "$ref '#/definitions/missing' (PointerToNowhere: "),
        (
            {"properties": {"a": {"$ref": "#/$defs/b"}}, "$defs": {"b": {"$ref": "#/$defs/c"}}},
            "$ref '#/$defs/c' (",
        ),
        ({"$dynamicRef": "#nowhere"}, "$dynamicRef '#nowhere' (NoSuchAnchor: "),
        ({"$ref": "urn:example:elsewhere"}, "$ref 'urn:example:elsewhere' (Unresolvable: "),
        (
            {"$ref": "#/enum/0", "enum": [3]},
            "$ref '#/enum/0' (it leads to '3', which is no schema)",
        ),
        # Draft 3's extends: the referencing library's walk of it raised (a traceback, exit 1) where
        # it is not refused.
        (
            {"$schema": "http://json-schema.org/draft-03/schema#", "extends": {"type": "integer"}},
            "its references could not be followed (AttributeError: ",
        ),
    ],
)
def test_a_schema_reference_that_resolves_nowhere_is_refused_before_anything_is_sent(
    tmp_path, server, schema, why
):
    # It passed the metaschema check, and every answer's grading then failed on it after the whole
    # run was sent.
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        probes=[{"id": "p1", "prompt": "JSON.", "grade": "json_schema", "expected": schema}],
    )
    code, out = run_cli("run", path, "--out", tmp_path / "r")
    assert code == 2, out
    assert (
        f"{path}: probes[0].expected: expected a JSON Schema whose every reference resolves within "
        f"it" in out
    )
    assert why in out and "Traceback" not in out
    assert server.requests == []


def test_a_schema_files_unresolved_reference_names_the_file_and_the_dataset_line(tmp_path):
    (tmp_path / "schema.json").write_text(
        '{"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}}'
    )
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "JSON.", "grade": "json_schema", "expected": "schema.json"}\n')
    path = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", probes=[{"dataset": "d.jsonl"}]
    )
    with pytest.raises(
        ScenarioError,
        match=rf"{data}:1: probes\[0\].dataset: expected: expected the JSON Schema file "
        rf"{tmp_path / 'schema.json'} whose every reference .*: one \$ref does not, "
        r"got 'schema.json'$",  # the file named, nothing of its text quoted (not the reference)
    ):
        load_scenario(path)


@pytest.fixture
def schema_host():
    """An HTTP server on 127.0.0.1 holding a schema at /int.json, and the paths it was asked for."""
    asked: list[str] = []

    class Schema(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            asked.append(self.path)
            body = b'{"type": "integer"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Schema) as http:
        thread = threading.Thread(
            target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        try:
            yield f"http://127.0.0.1:{http.server_address[1]}/int.json", asked
        finally:
            http.shutdown()
            thread.join(timeout=5)


def test_a_remote_schema_reference_is_refused_and_never_fetched(schema_host):
    url, asked = schema_host
    with pytest.raises(BadGrading) as bad:
        checked({"$ref": url}, "json_schema", None, HERE)
    assert f"$ref '{url}' (Unresolvable: " in bad.value.expected
    # Nor when an answer is graded (jsonschema's own registry fetches a remote reference for each
    # validation).
    with pytest.raises(
        GraderFailed, match=r"json_schema raised .*Unresolvable: .* on the answer '3'"
    ):
        Grading("json_schema", {"$ref": url}).good("3")
    assert asked == []


def test_a_schema_that_fails_its_validator_is_a_failed_grade_in_the_run_and_in_report(
    tmp_path, server
):
    # {"$ref": "#"} resolves, yet validating anything with it recurses without end: the summary step
    # raised
    # RecursionError (the run ended 3, "could not be summarized") and `kevload report` printed a
    # traceback.
    server.behaviour.answer_for = lambda prompt, overlap: '{"a": 1}'
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=2,
        probes=[{"id": "p1", "prompt": "JSON.", "grade": "json_schema", "expected": {"$ref": "#"}}],
    )
    code, out = run_cli("run", path, "--out", tmp_path / "r", "--quiet")
    assert code == 2 and "Traceback" not in out, out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    (cell,) = summary["cells"]
    assert (cell["graded_good"], cell["graded_bad"], cell["grade_failed"]) == (0, 0, 2)
    assert summary["grade_errors"][0].startswith("probe 'p1': json_schema raised RecursionError: ")
    code, out = run_cli("report", tmp_path / "r", "--format", "json")
    assert code == 2 and json.loads(out)["grade_errors"] == summary["grade_errors"]


def test_report_of_a_run_json_whose_schema_reference_resolves_nowhere_is_bad_input(
    tmp_path, server
):
    server.behaviour.answer_for = lambda prompt, overlap: '{"a": 1}'
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=2,
        probes=[
            {"id": "p1", "prompt": "JSON.", "grade": "json_schema", "expected": {"type": "object"}}
        ],
    )
    assert run_cli("run", path, "--out", tmp_path / "r", "--quiet")[0] == 0
    meta = read_json(tmp_path / "r" / "run.json")
    meta["grading"]["p1"]["expected"] = {"$ref": "#/definitions/missing"}
    write_json(tmp_path / "r" / "run.json", meta)
    code, out = run_cli("report", tmp_path / "r", "--format", "json")
    assert code == 2 and "Traceback" not in out, out
    assert "grading.p1.expected: expected a JSON Schema whose every reference resolves" in out


def test_dataset_line_grading_errors_name_file_and_line(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(
        '{"prompt": "1+1?", "expected": 2}\n'
        '{"prompt": "2+2?", "expected": "four", "grade": "number"}\n'
    )
    path = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", probes=[{"dataset": "d.jsonl"}]
    )
    with pytest.raises(
        ScenarioError, match=rf"{data}:2: probes\[0\].dataset: expected: expected a number"
    ):
        load_scenario(path)


def test_dataset_schema_file_is_found_beside_the_dataset(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "schema.json").write_text('{"type": "array"}')
    (tmp_path / "data" / "d.jsonl").write_text(
        '{"prompt": "A list.", "grade": "json_schema", "expected": "schema.json"}\n'
    )
    path = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", probes=[{"dataset": "data/d.jsonl"}]
    )
    (probe,) = load_scenario(path).probes
    assert probe.grade == "json_schema" and probe.expected == {"type": "array"}


def test_grading_keys_read_into_normal_form(tmp_path):
    path = write_scenario(
        tmp_path / "s.toml",
        "http://127.0.0.1:9/v1",
        probes=[
            {"id": "a", "prompt": "x", "expected": "4"},
            {"id": "b", "prompt": "x", "expected": 4, "grade_tolerance": 1},
            {"id": "c", "prompt": "x", "expected": ["yes", "y"]},
            {"id": "d", "prompt": "x", "expected": "c", "grade": "choice"},
            {"id": "e", "prompt": "x"},
        ],
    )
    probes = {p.id: (p.grade, p.expected, p.grade_tolerance) for p in load_scenario(path).probes}
    assert probes == {
        "a": ("exact", "4", 0.0),
        "b": ("number", 4.0, 1.0),
        "c": ("one_of", ("yes", "y"), 0.0),
        "d": ("choice", "C", 0.0),
        "e": (None, None, 0.0),
    }


def test_min_good_share_needs_graded_probes(tmp_path):
    path = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", min_good_share=0.9)
    code, out = run_cli("run", path)
    assert (
        code == 2 and "load.min_good_share: expected probes with expected or grade beside it" in out
    )


def test_conversation_probes_are_not_graded(tmp_path):
    path = write_scenario(
        tmp_path / "s.toml",
        "http://127.0.0.1:9/v1",
        probes=[{"id": "p1", "turns": [{"user": "hi"}], "expected": "x"}],
    )
    code, out = run_cli("run", path)
    assert code == 2 and "probes[0].grade: expected no grading on a conversation probe" in out


@pytest.mark.parametrize(
    ("toml", "grade", "key", "got"),
    [
        ("1979-05-27", "json", "probes[0].expected", "datetime.date(1979, 5, 27)"),
        ("nan", "json", "probes[0].expected", "nan"),
        ("-inf", "json", "probes[0].expected", "-inf"),
        ("{ when = 07:32:00 }", "json", "probes[0].expected.when", "datetime.time(7, 32)"),
        (
            "[1, 1979-05-27T07:32:00Z]",
            "python:json:dumps",
            "probes[0].expected[1]",
            "datetime.datetime(1979, 5, 27",
        ),
        (
            '{ type = "string", const = 1979-05-27 }',
            "json_schema",
            "probes[0].expected.const",
            "datetime.date",
        ),
    ],
)
def test_an_expected_json_would_change_is_refused_before_anything_is_sent(
    tmp_path, server, toml, grade, key, got
):
    # run.json keeps expected as JSON and `kevload report` grades from it: a TOML date (a string
    # there), nan (null) or an integer beyond 64 bits (no JSON number orjson writes) would be graded
    # otherwise there, or not written.
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        probes=[{"id": "d", "prompt": "A date.", "grade": grade, "expected": "@EXPECTED@"}],
    )
    path.write_text(path.read_text().replace('"@EXPECTED@"', toml))
    code, out = run_cli("run", path, "--out", tmp_path / "r")
    assert code == 2, out
    assert f"{path}: {key}: expected a value JSON keeps as it is" in out and f"got {got}" in out, (
        out
    )
    assert server.requests == [] and "Traceback" not in out


def test_an_expected_given_by_set_is_checked_the_same(tmp_path, server):
    path = write_scenario(tmp_path / "s.toml", server.url)
    code, out = run_cli(
        "run", path, "--set", 'probes=[{id="n", prompt="x", grade="json", expected=nan}]'
    )
    assert code == 2 and "probes[0].expected: expected a value JSON keeps as it is" in out, out


def test_a_number_beyond_a_floats_range_is_kept_exactly_and_a_tolerance_beyond_it_is_bad_grading():
    assert checked(10**400, None, None, HERE).expected == 10**400
    assert checked(10**27 + 1, None, None, HERE).expected == 10**27 + 1
    with pytest.raises(BadGrading) as bad:
        checked(42, None, 10**400, HERE)
    assert bad.value.key == "grade_tolerance"


# What TOML can give as ``expected`` (JSONL lines give less): dates, times, nan, inf, integers of
# any size.
_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=4)
    | st.sampled_from(["A", "c", "42", "4.2e1", "(", "a+"])
    | st.dates()
    | st.times()
    | st.datetimes()
)
_TOML_VALUES = st.recursive(
    _LEAF,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=5,
)
_USER_GRADER = "python:roundtrip_grader:same"


@pytest.fixture(scope="module")
def grader_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("graders")
    # A user's grader that sees expected exactly: a date and the string run.json writes for it
    # differ here.
    (base / "roundtrip_grader.py").write_text(
        "def same(answer, probe, expected):\n    return answer == repr(expected)\n"
    )
    return base


@settings(max_examples=300, deadline=None)
@given(
    expected=_TOML_VALUES,
    grade=st.sampled_from((None, *GRADES, _USER_GRADER)),
    tolerance=st.sampled_from((None, 0, 0.5)),
    answer=st.text(max_size=8),
)
def test_every_grading_accepted_grades_alike_from_run_json(
    grader_dir, expected, grade, tolerance, answer
):
    """Whatever a scenario gives, a grading accepted at load grades every answer as the one `kevload
    report` reads back from run.json does; what would not is refused at load (BadGrading, no other
    exception)."""
    try:
        grading = checked(expected, grade, tolerance, grader_dir)
    except BadGrading:
        return
    if grading is None:
        return
    run_json = grader_dir / "run.json"
    write_json(run_json, {"grading": {"p": grading.to_json()}})
    again = Grading.from_json(read_json(run_json)["grading"]["p"], grader_dir)
    written = json.dumps(read_json(run_json)["grading"]["p"]["expected"])
    for text in (
        answer,
        written,
        f"The answer is {written}.",
        repr(expected),
        repr(grading.expected),
    ):
        assert grading.good(text, "p") == again.good(text, "p"), (text, grading, again)
