"""The graders applied: an answer's graded part (its content, without the reasoning block), each
grader's rule over it, and what a grader that fails on an answer says (``grading.py`` checks and
compiles the graders at load).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgspec
import regex

from kevload.inputs.choices import choice_letter
from kevload.inputs.numbers import bounds, last_exact, within
from kevload.inputs.wordsets import shortened

if TYPE_CHECKING:  # the model is grading.py's, which applies its graders here
    from kevload.inputs.grading import Grading

_MAX_SHOWN = 120  # characters of an answer quoted in an error


class GraderFailed(Exception):
    """A user's grader raised or returned something other than True or False: a finding on the
    answer, not a crash."""


def local_schemas() -> Any:
    """The registry json_schema resolves references with: the JSON Schema metaschemas jsonschema
    ships, and nothing retrieved (jsonschema's default registry fetches a remote reference over the
    network, for each answer graded)."""
    from jsonschema_specifications import REGISTRY

    return REGISTRY


# The reasoning block ``store.answer_text`` puts before the content (what a model thought is not its
# answer, and is not graded). Mostly the tags alone; a reasoning that holds the closing tag line
# itself (or a content that begins like a block) would be cut at the wrong place, so there the block
# gives the reasoning's length instead.
# what every block begins with: a text that does not is read back as it is
REASONING_TAG = "<reasoning"
_BLOCK_OPEN, _BLOCK_CLOSE = f"{REASONING_TAG}>\n", "\n</reasoning>\n"
_SIZED, _SIZED_END = f'{REASONING_TAG} chars="', '">\n'
# the most a written length has: a longer number is no block of kevload's (and int() is bounded)
_SIZE_DIGITS = 15


def with_reasoning(reasoning: str | None, rest: str) -> str:
    """``rest`` (the content, then the tool calls) behind the block of ``reasoning``, such that
    ``content_of`` gives exactly ``rest`` back and no other (reasoning, rest) gives the same text.
    The plain tags wherever they read back right, so answers hash as they always did; the sized
    block only where they would not."""
    if reasoning:
        text = f"{_BLOCK_OPEN}{reasoning}{_BLOCK_CLOSE}{rest}"
        # Read back right when the first closing tag line after the opening is the one written after
        # the reasoning. One that comes earlier holds all of "</reasoning>" inside the reasoning: a
        # reasoning without "<" (most) is read right, known by memchr, not by the tag's search (some
        # 50 times slower, per request).
        if "<" not in reasoning or text.find(_BLOCK_CLOSE, len(_BLOCK_OPEN)) == len(
            _BLOCK_OPEN
        ) + len(reasoning):
            return text
    elif content_of(rest) == rest:
        return rest
    reasoning = reasoning or ""
    return f"{_SIZED}{len(reasoning)}{_SIZED_END}{reasoning}{_BLOCK_CLOSE}{rest}"


def content_of(answer: str) -> str:
    """The part of a cell's answer text (``store.answer_text``) that is graded: the content and tool
    calls, without the reasoning block (``with_reasoning``)."""
    if answer.startswith(_SIZED):
        digits_end = answer.find(_SIZED_END, len(_SIZED), len(_SIZED) + _SIZE_DIGITS + 1)
        digits = answer[len(_SIZED) : digits_end]
        if digits_end > 0 and digits.isascii() and digits.isdigit():
            end = digits_end + len(_SIZED_END) + int(digits)
            if answer.startswith(_BLOCK_CLOSE, end):
                return answer[end + len(_BLOCK_CLOSE) :]
    elif answer.startswith(_BLOCK_OPEN):
        end = answer.find(_BLOCK_CLOSE, len(_BLOCK_OPEN))
        if end >= 0:
            return answer[end + len(_BLOCK_CLOSE) :]
    return answer


def grade_answer(grading: Grading, text: str, probe: str, timeout: float | None = None) -> bool:
    """Whether ``text`` (an answer's ``content_of``) of ``probe`` is good by ``grading``."""
    grade, expected = grading.grade, grading.expected
    if grade == "exact":
        return bool(text.strip() == expected.strip())
    if grade == "contains":
        return expected in text
    if grade == "regex":
        return regex.search(expected, text, timeout=timeout) is not None
    if grade == "one_of":
        return text.strip() in {x.strip() for x in expected}
    if grade == "number":
        value = last_exact(text)
        return value is not None and within(value, *bounds(expected, grading.tolerance))
    if grade == "choice":
        return bool(choice_letter(text) == expected)
    if grade in ("json", "json_schema"):
        value = parse_json(text)
        if value is _NOT_JSON:
            return False
        if grade == "json":
            return expected is None or same_json(value, expected)
        return _schema_grade(grading, value, text)
    return _user_grade(grading, text, probe)


def _schema_grade(grading: Grading, value: Any, text: str) -> bool:
    """Whether ``value`` (the answer as JSON) is valid by the schema; ``GraderFailed`` when the
    validator raises instead of answering (load resolved every reference, yet a schema can still
    fail: one that refers to itself without end, ``{"$ref": "#"}``, recurses until Python stops
    it)."""
    import jsonschema

    schema = grading.expected
    try:
        return jsonschema.validators.validator_for(schema)(
            schema, registry=local_schemas()
        ).is_valid(value)
    except (
        Exception
    ) as exc:  # the validator's failure on this answer is a finding on it, as a python grader's is
        raise GraderFailed(
            f"json_schema raised {type(exc).__name__}: {_cut(str(exc))} on the answer {shown(text)}"
        ) from None


def _user_grade(grading: Grading, text: str, probe: str) -> bool:
    assert grading.function is not None  # ``checked`` imported it
    try:
        result = grading.function(text, probe, grading.expected)
    # The user's code, run in a process of its own (``gradeworker``): whatever it raises is a
    # finding on this answer, sys.exit's SystemExit and a GeneratorExit too.
    except BaseException as exc:  # noqa: BLE001
        raise GraderFailed(
            f"{grading.grade} raised {type(exc).__name__}: {exc} on the answer {shown(text)}"
        ) from None
    if result is not True and result is not False:
        returned = repr(result)
        raise GraderFailed(
            f"{grading.grade} returned {returned[:_MAX_SHOWN]}, expected True or False, on the "
            "answer "
            f"{shown(text)}"
        )
    return result


def shown(text: str) -> str:
    return repr(_cut(text))


def _cut(text: str) -> str:
    return shortened(text, _MAX_SHOWN + len("…"))


_NOT_JSON = object()
_FENCE = re.compile(r"\A```[A-Za-z]*\n(.*)\n```\Z", re.DOTALL)


def parse_json(text: str) -> Any:
    """The answer as JSON (one Markdown code fence around it is dropped: models add one), or
    ``_NOT_JSON``. Read by msgspec: an integer of any size is that integer (orjson reads one past 64
    bits as a float near it, which equals no exact ``expected``); nesting past msgspec's depth is no
    JSON, as past orjson's was."""
    text = text.strip()
    fenced = _FENCE.match(text)
    try:
        return msgspec.json.decode(fenced.group(1) if fenced else text)
    except (msgspec.DecodeError, RecursionError):
        return _NOT_JSON


def same_json(a: Any, b: Any) -> bool:
    """JSON equality: objects by keys, numbers by value (1 = 1.0), but true is no number (Python's
    True == 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
