"""What ``kevload diagnose``'s options mean together: the probe they make (--prompt or --messages,
graded by --expected and --grade), the request params (--params), and the rules they obey with one
another."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import orjson

from kevload.errors import InputError
from kevload.inputs.grading import BadGrading, Grading, checked
from kevload.inputs.probe import Probe, read_messages


def check_one_input(prompt: str | None, messages_file: Path | None) -> None:
    """One input to diagnose: --prompt or --messages."""
    if (prompt is None) == (messages_file is None):
        raise InputError("give exactly one of --prompt TEXT or --messages FILE")


def check_sets(online: Path | None, train: Path | None) -> None:
    """Step 4's sets: --online and --train both or neither."""
    if (online is None) != (train is None):
        raise InputError("--online and --train go together")


def request_params(params_json: str) -> dict[str, Any]:
    """--params, the request params production sends: a JSON object."""
    try:
        params = orjson.loads(params_json)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"--params: expected a JSON object, got {params_json!r} ({exc})") from None
    if not isinstance(params, dict):
        raise InputError(f"--params: expected a JSON object, got {params_json!r}")
    return params


def given_messages(messages_file: Path | None) -> tuple[dict[str, str], ...] | None:
    """--messages' chat (a JSON file with a messages list), or None without it."""
    return None if messages_file is None else read_messages(messages_file, "--messages")


def diagnosed_probe(
    prompt: str | None,
    messages: tuple[dict[str, str], ...] | None,
    max_tokens: int,
    graded: Grading | None,
) -> Probe:
    """The one probe diagnose sends: --prompt or --messages' chat, graded when --expected or --grade
    is given."""
    grading: dict[str, Any] = (
        {}
        if graded is None
        else {
            "expected": graded.expected,
            "grade": graded.grade,
            "grade_tolerance": graded.tolerance,
        }
    )
    return Probe(id="probe", prompt=prompt, messages=messages, max_tokens=max_tokens, **grading)


def expected_grading(
    expected_text: str | None, grade: str | None, tolerance: float | None
) -> Grading | None:
    """--expected/--grade/--grade-tolerance checked as a probe's keys are (``grading.checked``, a
    schema file or a python grader found from the working directory); None when neither is given. A
    bad one is exit 2 naming it."""
    expected: Any = expected_text
    if expected_text is not None:
        try:
            # msgspec: an integer of any size is read as that integer (orjson reads the float
            # near it).
            parsed = msgspec.json.decode(expected_text)
        except (msgspec.DecodeError, RecursionError):
            parsed = None
        # A number, list or object is meant as one (42 picks the number grader); anything else is
        # the text itself. A decimal number is the decimal written, not the float near it.
        if isinstance(parsed, float):
            expected = Decimal(expected_text.strip())
        elif isinstance(parsed, int | list | dict | str) and not isinstance(parsed, bool):
            expected = parsed
    try:
        return checked(expected, grade, tolerance, Path.cwd())
    except BadGrading as bad:
        raise InputError(
            f"--{bad.key.replace('_', '-')}: expected {bad.expected}, got {str(bad.got)[:80]!r}"
        ) from None
