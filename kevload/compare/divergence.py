"""Divergence text: where and how an output leaves the serial one — the first differing char, word
and token, its kind (``token``, ``length``, ``finish``) — and the example window a summary shows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kevload.compare.cells import CellAccumulator, OutputKey, Tokens
from kevload.inputs.wordsets import DIVERGENCE_KINDS, DivergenceKind

# Characters of context kept on each side of a divergence point for the examples in the summary.
_EXAMPLE_CONTEXT = 150


@dataclass(frozen=True)
class Divergence:
    """How a drifting cell's outputs leave the serial one (the ``CellSummary`` fields of the same
    names)."""

    kinds: dict[str, int]  # divergent requests by kind
    first_chars: int
    last_chars: int
    first_words: int
    first_tokens: int | None
    # Both examples are the same window of their texts, starting at char ``example_offset``.
    example_offset: int
    serial_example: str
    divergent_example: str
    divergent_example_kind: DivergenceKind
    serial_finish_reason: str | None
    divergent_finish_reason: str | None


def divergence(
    cell: CellAccumulator, ref_text: str, ref_tokens: Tokens | None, serial: OutputKey
) -> Divergence:
    """Where and how each output other than the serial one leaves it, and the example that shows it.

    The example is the output that leaves the serial one first (ties: the one seen first), so the
    divergence point stated for the cell is the one the example shows.
    """
    kinds: dict[str, int] = dict.fromkeys(DIVERGENCE_KINDS, 0)
    points: list[tuple[int, int, OutputKey, DivergenceKind]] = []  # chars, first seen, output, kind
    words, toks = [], []
    for key, n in cell.counts.items():
        if key == serial:
            continue
        text = cell.texts[key]
        at = common_prefix_length(ref_text, text)
        kind = divergence_kind(ref_text, text, serial[1], key[1])
        kinds[kind] += n
        points.append((at, cell.first_seen[key], key, kind))
        # Words: a token-like position for servers that return no token ids (transformers serve).
        words.append(first_divergence_word(ref_text, text, at))
        if ref_tokens and key in cell.tokens:
            toks.append(common_prefix_length(ref_tokens, cell.tokens[key]))
    at, _, example, kind = min(points)
    offset = max(0, at - _EXAMPLE_CONTEXT)
    window = slice(offset, offset + 2 * _EXAMPLE_CONTEXT)
    return Divergence(
        kinds=kinds,
        first_chars=at,
        last_chars=max(p[0] for p in points),
        first_words=min(words),
        first_tokens=min(toks) if toks else None,
        example_offset=offset,
        serial_example=ref_text[window],
        divergent_example=cell.texts[example][window],
        divergent_example_kind=kind,
        serial_finish_reason=serial[1],
        divergent_finish_reason=example[1],
    )


def divergence_kind(
    reference: str, other: str, reference_finish: str | None = None, other_finish: str | None = None
) -> DivergenceKind:
    """How ``other`` differs from the serial ``reference`` output.

    ``finish``: the same text, ended for another reason (``finish_reason``). ``length``: one text is
    a proper prefix of the other (stop / max_tokens handling leaking between requests). ``token``:
    they differ inside their common length (numerics, sampling), or outside the text itself when
    text and finish_reason are both the same (a hash over more than the text).
    """
    if reference == other:
        return "finish" if reference_finish != other_finish else "token"
    return (
        "length"
        if common_prefix_length(reference, other) == min(len(reference), len(other))
        else "token"
    )


def first_divergence_word(reference: str, other: str, chars: int) -> int:
    """Index of the first whitespace-separated word that differs, given the first differing char.

    The words wholly inside the common prefix agree; the last word of the prefix agrees only when
    both texts end a word right there (whitespace or the end of the text). Otherwise the divergence
    falls inside that word, and it is the first one to differ.
    """
    prefix = reference[:chars]
    words = len(prefix.split())
    if (
        prefix
        and not prefix[-1].isspace()
        and not (_word_ends(reference, chars) and _word_ends(other, chars))
    ):
        words -= 1
    return words


def _word_ends(text: str, at: int) -> bool:
    return at >= len(text) or text[at].isspace()


def common_prefix_length(a: str | Sequence[object], b: str | Sequence[object]) -> int:
    """Index of the first differing element (chars or tokens); the shorter length when one extends
    the other."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    if isinstance(a, str):
        if a[:n] == b[:n]:
            return n
        lo, hi = 0, n  # binary search on slice equality: C-speed compares, O(log n) of them
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if a[:mid] == b[:mid]:
                lo = mid
            else:
                hi = mid - 1
        return lo
    left, right = np.asarray(a[:n], dtype=object), np.asarray(b[:n], dtype=object)
    diff = np.flatnonzero(left != right)
    return int(diff[0]) if diff.size else n
