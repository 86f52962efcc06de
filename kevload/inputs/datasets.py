"""Probe and companion datasets (JSONL): read once, hashed, every line checked, lines chosen by a
seed.

run.json records each file's sha256, line count, seed and how many lines were chosen, so two runs
on different days can be shown to have used the same inputs. The choice depends only on the seed
and the line positions (not on Python's ``random``), so it is the same on any machine and version.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kevload.errors import ScenarioError
from kevload.inputs.conversation import BadTurns, parse_turns
from kevload.inputs.grading import BadGrading, checked
from kevload.inputs.probe import Probe, first_bad_message, parse_jsonl, rule_of
from kevload.inputs.wordsets import SampleRole

# A line's own max_tokens meets the rule of a probe's.
_MAX_TOKENS = next(rule_of(f) for f in fields(Probe) if f.name == "max_tokens")


@dataclass(frozen=True)
class Dataset:
    role: SampleRole
    path: str
    sha256: str  # of the file's bytes, as read
    lines: int  # JSON lines in the file (blank lines do not count)
    seed: int
    count: int  # lines chosen
    items: tuple[Probe, ...] = field(default=(), repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "path": self.path,
            "sha256": self.sha256,
            "lines": self.lines,
            "seed": self.seed,
            "count": self.count,
        }


def read_dataset(
    path: Path,
    *,
    role: SampleRole,
    what: str,
    seed: int,
    count: int = 0,
    count_key: str = "count",
    max_tokens: int = 64,
) -> Dataset:
    """Read and check every line of ``path``, then keep ``count`` of them (0: all) chosen by
    ``seed``.

    Each line is one object with ``prompt``, ``messages`` or ``turns`` (a conversation, with an
    optional ``system``), optional ``id`` and ``max_tokens`` (default ``max_tokens``). ``what``
    names the scenario key in errors, e.g. ``probes[0].dataset``.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(f"{path}: {what}: cannot read: {exc.strerror}") from None
    items = [
        _item(doc, number, path, what, role, max_tokens) for number, doc in _lines(data, path, what)
    ]
    if not items:
        raise ScenarioError(f"{path}: {what}: expected at least one JSON line, the file has none")
    if count > len(items):
        raise ScenarioError(
            f"{path}: {count_key}: expected at most {len(items)} (the JSON lines in this file), "
            f"got {count}"
        )
    chosen = sample(len(items), count, seed)
    return Dataset(
        role=role,
        path=str(path),
        sha256=hashlib.sha256(data).hexdigest(),
        lines=len(items),
        seed=seed,
        count=len(chosen),
        items=tuple(items[i] for i in chosen),
    )


def sample(total: int, count: int, seed: int) -> tuple[int, ...]:
    """Indexes of ``count`` of ``total`` lines (0: all), in file order.

    Each line gets a rank from sha256(seed, its index) and the lowest ranks are kept: a larger count
    keeps every line a smaller one chose, and lines appended to the file do not change the choice
    among the old ones unless they rank lower.
    """
    if not count or count >= total:
        return tuple(range(total))
    ranked = sorted(range(total), key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).digest())
    return tuple(sorted(ranked[:count]))


# A trace's keys that decide, from the same file, which requests it replays and their prompts (a
# --set on --resume
# could change them).
_REPLAYED = ("format", "block_tokens", "window_s")


def check_unchanged(
    recorded: list[dict[str, Any]], datasets: tuple[Dataset, ...], where: str
) -> None:
    """A resumed run must send what its first part sent: the same files (by hash), seed and counts,
    and a trace's prompts the same blocks and words (its tokenizer file, by hash, and the words it
    dropped)."""
    keys = ("role", "sha256", "seed", "count")
    for old, new in itertools.zip_longest(recorded, (d.to_json() for d in datasets)):
        if (
            old is None
            or new is None
            or any(old.get(k) != new[k] for k in keys)
            or any(old.get(k) != new.get(k) for k in _REPLAYED)
            or any(_tokenizer(old, k) != _tokenizer(new, k) for k in ("sha256", "dropped"))
        ):
            raise ScenarioError(
                f"{where}: datasets: expected the inputs the run started with ({_describe(old)}), "
                f"got {_describe(new)}; start a new run instead"
            )


def _tokenizer(doc: dict[str, Any], key: str) -> Any:
    """``key`` of a trace's tokenizer in run.json (None without one): its file's ``sha256``, and the
    words it ``dropped``, which from the same file another kevload or tokenizers may choose
    otherwise."""
    tokenizer = doc.get("tokenizer")
    return tokenizer.get(key) if isinstance(tokenizer, dict) else None


def _describe(doc: dict[str, Any] | None) -> str:
    if doc is None:
        return "no dataset"
    words = (
        f", words of tokenizer sha256 {str(_tokenizer(doc, 'sha256'))[:12]}… "
        f"({len(_tokenizer(doc, 'dropped') or [])} dropped)"
        if _tokenizer(doc, "sha256")
        else ""
    )
    # A trace's blocks and window too: a --set of either alone would otherwise read "expected A, got
    # A".
    shape = "".join(f" {k} {doc[k]}" for k in _REPLAYED if k in doc)
    return (
        f"{doc.get('role')} {doc.get('path')} sha256 {str(doc.get('sha256'))[:12]}… seed "
        f"{doc.get('seed')} "
        f"count {doc.get('count')}{shape}{words}"
    )


def _lines(data: bytes, path: Path, what: str) -> Iterator[tuple[int, Any]]:
    return parse_jsonl(data.splitlines(), path, what)


def _item(doc: Any, number: int, path: Path, what: str, role: SampleRole, max_tokens: int) -> Probe:
    where = f"{path}:{number}: {what}"
    inputs = ("prompt", "messages", "turns")
    if not (
        isinstance(doc, dict)
        and (
            isinstance(doc.get("prompt"), str)
            or isinstance(doc.get("messages"), list)
            or "turns" in doc
        )
    ):
        raise ScenarioError(f"{where}: expected an object with prompt, messages or turns")
    tokens = _max_tokens(doc, where, max_tokens)
    if "messages" in doc and not isinstance(
        doc["messages"], list
    ):  # beside prompt or turns, never read till now
        raise ScenarioError(
            f"{where}: messages: expected a non-empty list of {{role, content}} objects, "
            f"got {doc['messages']!r}"
        )
    messages = tuple(doc["messages"]) if "messages" in doc else None
    turns = _turns(doc, where)
    if role == "companion":
        # An id of any kind, and any input is accepted; but messages are sent (or joined into a
        # completions prompt) as they are, so a bad one must fail here, not mid-run.
        if turns is not None and sum(k in doc for k in inputs) > 1:
            raise ScenarioError(f"{where}: expected turns alone, without prompt or messages")
        _check_messages(messages, where)
        return Probe(
            id=f"companion:{doc.get('id', f'line{number}')}",
            prompt=doc.get("prompt"),
            messages=messages,
            max_tokens=tokens,
            turns=turns,
            system=doc.get("system"),
        )
    # Probes are compared and their text cut into prefixes: the same rules as a [[probes]] table.
    if sum(k in doc for k in inputs) != 1:
        raise ScenarioError(f"{where}: expected exactly one of prompt, messages or turns")
    _check_messages(messages, where)
    pid = doc.get("id", f"{path.stem}:{number}")
    if not isinstance(pid, str | int) or isinstance(pid, bool) or pid == "":
        raise ScenarioError(f"{where}: id: expected a non-empty string, got {pid!r}")
    graded = _grading(doc, where, path.parent)
    return Probe(
        id=str(pid),
        prompt=doc.get("prompt"),
        messages=messages,
        max_tokens=tokens,
        turns=turns,
        system=doc.get("system"),
        **graded,
    )


def _max_tokens(doc: dict[str, Any], where: str, default: int) -> int:
    """A line's own max_tokens, or ``default`` (the entry's), held to a probe's rule."""
    tokens = doc.get("max_tokens", default)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or not _MAX_TOKENS.holds(tokens):
        raise ScenarioError(f"{where}: max_tokens: expected {_MAX_TOKENS.expected}, got {tokens!r}")
    return tokens


def _grading(doc: dict[str, Any], where: str, base: Path) -> dict[str, Any]:
    """A probe line's ``expected``, ``grade`` and ``grade_tolerance``, checked (a schema file is
    found from the dataset's directory) and in normal form; nothing for an ungraded line."""
    try:
        graded = checked(doc.get("expected"), doc.get("grade"), doc.get("grade_tolerance"), base)
    except BadGrading as bad:
        got = "nothing" if bad.got is None else repr(bad.got)
        raise ScenarioError(
            f"{where}: {bad.key}: expected {bad.expected}, got "
            f"{got if len(got) <= 80 else got[:77] + '...'}"
        ) from None
    return (
        {}
        if graded is None
        else {
            "expected": graded.expected,
            "grade": graded.grade,
            "grade_tolerance": graded.tolerance,
        }
    )


def _turns(doc: dict[str, Any], where: str) -> tuple[Any, ...] | None:
    """A line's conversation (``turns``, with its ``system`` message), checked; None for a line
    without one."""
    if "system" in doc and ("turns" not in doc or not isinstance(doc["system"], str)):
        raise ScenarioError(
            f"{where}: system: expected a string beside turns, got {doc['system']!r}"
        )
    if "turns" not in doc:
        return None
    try:
        return parse_turns(doc["turns"])
    except BadTurns as bad:
        raise ScenarioError(
            f"{where}: {bad.key}: expected {bad.expected}, got {bad.got!r}"
        ) from None


def _check_messages(messages: tuple[Any, ...] | None, where: str) -> None:
    if messages is not None and not (messages and first_bad_message(messages) is None):
        raise ScenarioError(
            f"{where}: messages: expected a non-empty list of {{role, content}} objects"
        )
