"""What a run sends, below the scenario: ``Probe`` (one prompt or chat), the field rules every
scenario table is checked by (``Rule``), the one check of chat messages, and reading a user's JSONL
file line by line."""

from __future__ import annotations

import codecs
import hashlib
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import MISSING, Field, asdict, dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import orjson

from kevload.errors import ScenarioError
from kevload.inputs.conversation import Turn, messages_at
from kevload.inputs.numbers import hash_form

MAX_TOKENS = 10_000_000  # a probe's max_tokens: beyond the longest context served


@dataclass(frozen=True)
class Rule:
    """What a field accepts beyond its type: bounds (a list's bound holds for each item) and the
    words the error message uses for it (``expected``; empty: named from the type)."""

    expected: str = ""
    min: float | None = None  # value >= min
    above: float | None = None  # value > above
    max: float | None = None  # value <= max
    below: float | None = None  # value < below
    nonempty: bool = False
    key: str = ""  # the TOML key, where the field's name cannot be it (a Python keyword)

    def holds(self, value: Any) -> bool:
        """The bounds hold (for a list: it is non-empty where asked, and each item is within
        them)."""
        if isinstance(value, tuple | str | dict):
            return (len(value) > 0 or not self.nonempty) and all(
                self.holds(x) for x in value if isinstance(value, tuple)
            )
        # Each bound says what holds (x >= min), not what fails (x < min): NaN then fails them all.
        return (
            (self.min is None or value >= self.min)
            and (self.above is None or value > self.above)
            and (self.max is None or value <= self.max)
            and (self.below is None or value < self.below)
        )


def rule(default: Any = MISSING, *, factory: Any = MISSING, **kwargs: Any) -> Any:
    """A dataclass field with its ``Rule`` in the metadata."""
    return field(default=default, default_factory=factory, metadata={"rule": Rule(**kwargs)})


def rule_of(f: Field[Any]) -> Rule:
    rule: Rule = f.metadata.get("rule", _NO_RULE)
    return rule


def key_of(f: Field[Any]) -> str:
    """The field's key in a TOML table."""
    return rule_of(f).key or f.name


_NO_RULE = Rule()


@dataclass(frozen=True)
class Probe:
    id: str = rule(nonempty=True, expected="a non-empty string")
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = rule(
        None, nonempty=True, expected="a non-empty list of {role, content} tables"
    )
    max_tokens: int = rule(
        64, min=1, max=MAX_TOKENS, expected=f"an integer from 1 to {MAX_TOKENS:,}"
    )
    # A conversation (``kevload.inputs.conversation``): its user turns, sent one after another, and
    # the system message.
    turns: tuple[Turn, ...] | None = None
    system: str | None = None
    # What a good answer is and how it is judged (kevload.inputs.grading checks them at load);
    # neither: ungraded.
    expected: Any = rule(None, expected="a string, number, list or table (what a good answer is)")
    grade: str | None = None
    grade_tolerance: float = rule(0.0, min=0, below=math.inf, expected="a number >= 0")

    @property
    def text(self) -> str:
        """The part of the input that companions may share a prefix with: the last message's content
        (a conversation's: its last user turn)."""
        if self.prompt is not None:
            return self.prompt
        if self.turns is not None:
            return self.turns[-1].user
        assert self.messages is not None
        return self.messages[-1]["content"]

    def with_text(self, text: str, id: str) -> Probe:
        """The same input with ``text`` in place of ``self.text`` (earlier chat messages kept), as
        ``id``."""
        if self.prompt is not None:
            return replace(self, id=id, prompt=text)
        if self.turns is not None:
            return replace(
                self, id=id, turns=(*self.turns[:-1], replace(self.turns[-1], user=text))
            )
        assert self.messages is not None  # a probe is a prompt, a chat or a conversation
        return replace(
            self, id=id, messages=(*self.messages[:-1], {**self.messages[-1], "content": text})
        )

    def turn(self, k: int, answers: Sequence[str]) -> Probe:
        """Turn ``k`` of a conversation as the one chat request it is, given what turns 0 … k − 1
        received."""
        assert self.turns is not None
        return replace(
            self, messages=messages_at(self.system, self.turns, k, answers), turns=None, system=None
        )


def probe_inputs(probe: Probe, params: dict[str, Any]) -> dict[str, str | int]:
    """What a probe asks, as a baseline compares it (``kevload.outputs.baseline``): a hash of its
    input (the prompt, the messages, or a conversation's turns and system message), a hash of the
    request params, max_tokens, and apart from them a hash of how its answers are graded
    (``expected``, ``grade``, ``grade_tolerance``; that of None when ungraded). Two runs whose probe
    has the same first three asked the same thing; a changed output is then the server's. A changed
    grading asks nothing else of the server: only the graded figures stop being comparable."""
    # The grading keys at their defaults leave the input hash what it was when they were hashed with
    # it (None values dropped, grade_tolerance 0.0 kept): an ungraded probe's hash matches a
    # baseline's from before they were apart.
    sent = replace(probe, expected=None, grade=None, grade_tolerance=0.0)
    asked = {
        k: v for k, v in asdict(sent).items() if k not in ("id", "max_tokens") and v is not None
    }
    graded = probe.grade is not None or probe.expected is not None
    expected = probe.expected
    if probe.grade == "number" and isinstance(expected, int | Decimal):
        expected = hash_form(
            expected
        )  # exact, and what runs before exact numbers hashed where it is that
    return {
        "input": _sha256(asked),
        "params": _sha256(params),
        "max_tokens": probe.max_tokens,
        "grading": _sha256(
            {"grade": probe.grade, "expected": expected, "tolerance": probe.grade_tolerance}
        )
        if graded
        else UNGRADED,
    }


def _sha256(value: Any) -> str:
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (
        TypeError
    ):  # an integer past 64 bits (an expected answer): msgspec writes it, as run.json does
        text = _SORTED.encode(value)
    return hashlib.sha256(text).hexdigest()


_SORTED = msgspec.json.Encoder(order="sorted")


UNGRADED = _sha256(None)  # ``probe_inputs``' "grading" of a probe without grading keys


def first_bad_message(messages: Sequence[Any]) -> int | None:
    """Where chat ``messages`` stop being ``{role, content}`` objects with string values: the index
    of the first that is not, or None when every one is (an empty list too: whether one may be empty
    is the caller's rule)."""
    return next(
        (
            i
            for i, m in enumerate(messages)
            if not (
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
            )
        ),
        None,
    )


def read_messages(path: Path, what: str) -> tuple[dict[str, str], ...]:
    """A JSON file holding one chat: a non-empty list of ``{role, content}`` objects; ``what`` names
    the input."""
    try:
        messages = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ScenarioError(
            f"{path}: {what}: expected a JSON list of {{role, content}} objects ({exc})"
        ) from None
    if not (isinstance(messages, list) and messages and first_bad_message(messages) is None):
        raise ScenarioError(f"{path}: {what}: expected a JSON list of {{role, content}} objects")
    return tuple(messages)


def iter_jsonl(path: Path, what: str) -> Iterator[tuple[int, Any]]:
    """(line number, object) for each non-blank line of a user's JSONL file, streamed.

    Errors name the file and line; ``what`` says which input it is (e.g. "load.companions").
    """
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ScenarioError(f"{path}: {what}: cannot read: {exc.strerror}") from None
    with handle:
        yield from parse_jsonl(handle, path, what)


def parse_jsonl(lines: Iterable[bytes], path: Path, what: str) -> Iterator[tuple[int, Any]]:
    """(line number, object) for each non-blank line; the first that is not JSON is an error naming
    it.

    A UTF-8 byte order mark opening the file (editors on Windows write one) is read as what it
    is."""
    for number, line in enumerate(lines, 1):
        if number == 1:
            line = line.removeprefix(codecs.BOM_UTF8)
        if not line.strip():
            continue
        try:
            # msgspec, not orjson: an integer beyond 64 bits (an expected answer) is read as
            # that integer, where orjson reads the float nearest it.
            yield number, msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError):  # msgspec's depth limit is a RecursionError
            raise ScenarioError(
                f"{path}:{number}: {what}: expected one JSON object a line (JSONL)"
            ) from None
