"""Conversations: a probe or companion of several user turns, each sent with the history before it.

A conversation's turns are read here (``parse_turns``, one rule for a ``[[probes]]`` table and a
JSONL line), its turn *k* request is built here (``messages_at``: the system message, every earlier
turn's user message and answer, then turn *k*'s user message), and the hashes that tie the records
of one conversation sample together are taken here, so the sender that writes them and the
comparator that reads them share one definition.

An earlier turn's answer in the history is the one given in the file where there is one (the history
is fixed), else the answer that turn actually received (a live conversation: the history grows with
what the server said).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

# a conversation's turns: each record keeps its history, so a record grows with the turn
MAX_TURNS = 64


@dataclass(frozen=True)
class Turn:
    user: str
    # given: used as the history after this turn instead of the answer received
    assistant: str | None = None


class BadTurns(ValueError):
    """``turns`` is not a conversation: ``key`` (a suffix such as ``turns[2].user``) and what it
    expected."""

    def __init__(self, key: str, expected: str, got: Any):
        super().__init__(key, expected, got)
        self.key, self.expected, self.got = key, expected, got


TURNS_EXPECTED = (
    f"a list of 1 to {MAX_TURNS} user messages (strings, or tables with user and optional "
    "assistant)"
)


def parse_turns(value: Any) -> tuple[Turn, ...]:
    """``turns`` as written: a list of user messages, each a string or ``{user, assistant?}``;
    raises ``BadTurns``."""
    if not isinstance(value, list | tuple) or not 1 <= len(value) <= MAX_TURNS:
        raise BadTurns("turns", TURNS_EXPECTED, value)
    turns = []
    for i, item in enumerate(value):
        if isinstance(item, Turn):
            item = {"user": item.user, "assistant": item.assistant}
        if isinstance(item, str):
            turns.append(Turn(item))
            continue
        if not isinstance(item, dict) or set(item) - {"user", "assistant"}:
            raise BadTurns(
                f"turns[{i}]", "a string or a table with user and optional assistant", item
            )
        if not isinstance(item.get("user"), str):
            raise BadTurns(f"turns[{i}].user", "a string", item.get("user"))
        if item.get("assistant") is not None and not isinstance(item["assistant"], str):
            raise BadTurns(f"turns[{i}].assistant", "a string", item["assistant"])
        turns.append(Turn(item["user"], item.get("assistant")))
    return tuple(turns)


def messages_at(
    system: str | None, turns: Sequence[Turn], k: int, answers: Sequence[str]
) -> tuple[dict[str, str], ...]:
    """The chat messages of turn ``k``'s request: ``answers`` are the answers turns 0 … k − 1
    received, each replaced by the turn's given answer where the file has one."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    for turn, received in zip(turns[:k], answers, strict=True):
        messages.append({"role": "user", "content": turn.user})
        messages.append(
            {
                "role": "assistant",
                "content": turn.assistant if turn.assistant is not None else received,
            }
        )
    messages.append({"role": "user", "content": turns[k].user})
    return tuple(messages)


def ends_sample(turn: int | None, turns: int | None, status: str) -> bool:
    """Whether a record ends its sample: any request that is no turn of a conversation, a
    conversation's last turn, and a turn that failed (nothing is sent after it)."""
    return turns is None or turn == turns - 1 or status != "ok"


def history_sha256(messages: Sequence[dict[str, str]]) -> str:
    """The hash of what a turn was asked with (its request's messages): two turns with one hash had
    the same history, so their answers are compared with each other."""
    return hashlib.sha256(orjson.dumps(list(messages), option=orjson.OPT_SORT_KEYS)).hexdigest()


def conversation_sha256(before: str | None, answer_sha256: str, finish_reason: str | None) -> str:
    """The conversation so far, through this turn: the chain of every turn's answer (``sha256``, as
    any record's) and ``finish_reason``. The last turn's is the whole conversation's output: two
    samples with one hash got the same answer, ended the same way, at every turn."""
    return hashlib.sha256(f"{before or ''}\n{answer_sha256}\n{finish_reason}".encode()).hexdigest()


def as_received(text: str, finish_reason: str | None) -> str:
    """An earlier turn's answer as the transcript shows it: its text, then how it ended where that
    was no stop (``[length]``), so two conversations that differ only there differ in their
    transcripts too."""
    return text if finish_reason in (None, "stop") else f"{text} [{finish_reason}]"


def transcript(
    history: Sequence[Mapping[str, object]], received: Sequence[str], answer: str
) -> str:
    """The conversation as one text, for a drifting cell's examples and character positions: each
    message of the last turn's request as ``role: content``, each earlier turn's answer as
    ``received`` (``as_received``; where the file gives one, the history holds that instead, and the
    answer received would be in no text), then the last answer."""
    answers = iter(received)
    return (
        "".join(
            f"{m['role']}: "
            f"{next(answers, m['content']) if m['role'] == 'assistant' else m['content']}\n"
            for m in history
        )
        + f"assistant: {answer}"
    )
