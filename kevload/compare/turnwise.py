"""Where a live conversation leaves the serial one: each turn's answers compared among the samples
that were asked with the serial history, and the first turn at which one differs.

A conversation sample's later turns are asked with the answers its earlier turns received, so once
one answer differs every later turn of that sample has another history: comparing it with the serial
answer would compare different questions. So turn *k* is compared only among the answers whose
``history_sha256`` is the serial one's at turn *k*; the first turn with a differing answer is where
the conversation first left the serial path (before it, every answer given the serial history
agreed, so every sample still had it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# A turn's counted ok answer as the comparator keeps it: (history_sha256, sha256, finish_reason).
TurnAnswer = tuple[str | None, str | None, str | None]
# One cell's turns: turn index → answer → how many.
Tally = Mapping[int, Mapping[TurnAnswer, int]]


@dataclass(frozen=True)
class TurnAgreement:
    turn: int
    same_history: int  # counted ok answers of this turn asked with the serial history
    differ: int  # of them, those that are not the serial answer (text or finish_reason)
    distinct: int  # distinct answers among them

    def to_json(self) -> dict[str, int]:
        return {
            "turn": self.turn,
            "same_history": self.same_history,
            "differ": self.differ,
            "distinct": self.distinct,
        }


def serial_path(serial: Tally) -> dict[int, TurnAnswer]:
    """The serial conversation, turn by turn: its most common history at each turn, and the most
    common answer given that history (ties to the one first seen: the cell's samples in the order
    they ended)."""
    path = {}
    for turn, answers in serial.items():
        histories: dict[str | None, int] = {}
        for (history, _, _), n in answers.items():
            histories[history] = histories.get(history, 0) + n
        if not histories:
            continue
        common = max(histories, key=histories.__getitem__)
        path[turn] = max((a for a in answers if a[0] == common), key=answers.__getitem__)
    return path


def by_turn(cell: Tally, serial: Tally) -> tuple[TurnAgreement, ...]:
    """Each turn of the serial conversation: the cell's answers given the serial history against the
    serial one."""
    out = []
    for turn, reference in sorted(serial_path(serial).items()):
        same = {a: n for a, n in cell.get(turn, {}).items() if a[0] == reference[0]}
        out.append(
            TurnAgreement(
                turn=turn,
                same_history=sum(same.values()),
                differ=sum(n for a, n in same.items() if a != reference),
                distinct=len(same),
            )
        )
    return tuple(out)


def first_divergent_turn(turns: tuple[TurnAgreement, ...]) -> int | None:
    """The first turn (0-based) where an answer given the serial history differs from the serial
    one; None: none."""
    return next((t.turn for t in turns if t.differ), None)
