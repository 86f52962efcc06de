"""The logprob envelope: the per-token logprob vectors of one distinct output in one cell, kept in
memory that does not grow with requests, compared exactly with the serial reference once it is
known."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# One position of a vector: a logprob, a null (none given), or a spelled non-finite one
# (``store.spell_logprobs``).
Logprob = float | str | None
# Distinct logprob vectors counted per output, to pick the serial reference's most common one;
# beyond this the vectors still widen the envelope (so every comparison stays exact) but are not
# counted.
_LOGPROB_VECTORS = 16
# Differing vectors folded into the envelope together: one numpy pass per batch, not per record.
_LOGPROB_BATCH = 256


class LogprobTrack:
    """The logprob vectors of one distinct output in one cell, in memory that does not grow with
    requests.

    Kept: how many vectors were seen and how many of each length, up to ``_LOGPROB_VECTORS``
    distinct ones with their counts (to choose the serial reference's most common vector), and the
    elementwise envelope of every vector — minimum and maximum of the finite values, and which kinds
    of value (null, finite, NaN, −∞, +∞) any vector had there. Against any reference chosen later,
    the envelope gives exactly whether every vector is bitwise equal to it, the first position where
    one differs, and the largest absolute difference between finite values (reached at the minimum
    or the maximum). So records can arrive in any order and from any part of a split file: the
    comparison waits for ``summarize``, when the serial reference is known.
    """

    __slots__ = (
        "n",
        "vectors",
        "pending",
        "lo",
        "hi",
        "kinds",
        "len_min",
        "len_max",
        "lengths",
        "nonfinite",
    )

    def __init__(self, vector: Sequence[Logprob], seq: int, nonfinite: bool = False) -> None:
        self.n = 1
        self.vectors: dict[tuple[Logprob, ...], list[int]] = {
            tuple(vector): [1, seq]
        }  # vector -> [count, first seq]
        # Vectors other than a counted one wait here to be folded into the envelope in one batch.
        # The envelope exists once a second, different vector was folded: until then the one counted
        # vector is the envelope, and a bitwise-stable output costs one dict lookup per record.
        self.pending: list[Sequence[Logprob]] = []
        self.lo: np.ndarray | None = None
        self.hi: np.ndarray | None = None
        self.kinds: np.ndarray | None = None
        self.len_min = self.len_max = len(vector)
        self.lengths: dict[int, int] = {
            len(vector): 1
        }  # vectors by length: which cover a reference in full
        # A vector held spelled non-finite values (``store.spell_logprobs``): only then are they
        # decoded.
        self.nonfinite = nonfinite

    def add(self, vector: Sequence[Logprob], seq: int, nonfinite: bool = False) -> None:
        self.n += 1
        self.lengths[len(vector)] = self.lengths.get(len(vector), 0) + 1
        self.nonfinite = self.nonfinite or nonfinite
        key = tuple(vector)
        entry = self.vectors.get(key)
        if entry is not None:
            entry[0] += 1
            entry[1] = min(entry[1], seq)
            return
        self._widen(vector)
        if len(self.vectors) < _LOGPROB_VECTORS:
            self.vectors[key] = [1, seq]

    def merge(self, other: LogprobTrack) -> None:
        other._flush()
        self.nonfinite = self.nonfinite or other.nonfinite
        for key, (count, seq) in other.vectors.items():
            entry = self.vectors.get(key)
            if entry is not None:
                entry[0] += count
                entry[1] = min(entry[1], seq)
                continue
            self._widen(list(key))
            if len(self.vectors) < _LOGPROB_VECTORS:
                self.vectors[key] = [count, seq]
        self._flush()
        if other.lo is not None and other.hi is not None and other.kinds is not None:
            self._fold(other.lo, other.hi, other.kinds)
        self.n += other.n
        for length, count in other.lengths.items():
            self.lengths[length] = self.lengths.get(length, 0) + count
        self.len_min = min(self.len_min, other.len_min)
        self.len_max = max(self.len_max, other.len_max)

    def modal(self) -> list[Logprob]:
        """The most common vector counted (ties: the one seen first)."""
        return list(max(self.vectors.items(), key=lambda kv: (kv[1][0], -kv[1][1]))[0])

    def compare(
        self, reference: Sequence[Logprob], upto: int, same_tokens: bool
    ) -> tuple[int | None, float | None, int]:
        """(first position < ``upto`` where a vector differs from ``reference``, largest
        |difference| there, how many vectors the comparison covers).

        ``upto``: positions whose tokens agree with the reference's. Each position is compared over
        the vectors that have it. The first position is None when every value given equals the
        reference's bitwise; vectors whose tokens leave the reference's (``same_tokens`` False)
        differ at the first position they stop agreeing. A vector with the reference's tokens but
        fewer entries (a server that left logprobs out) is no evidence past its end: while its
        values agree it is not covered, and the comparison makes no claim about it; a difference
        anywhere covers every vector (it is one). A position equals the reference's where every
        vector has the reference's kind there (−∞ equals −∞, NaN equals NaN, null equals null) and,
        for a finite reference, its value; the difference is taken between finite values only, since
        one against a non-finite one has no size.
        """
        self._flush()
        m = min(upto, len(reference), self.len_max)
        if self.lo is None or self.hi is None or self.kinds is None:  # all three or none
            lo, hi, kinds = _envelope([next(iter(self.vectors))[:m]], self.nonfinite)
        else:
            lo, hi, kinds = self.lo[:m], self.hi[:m], self.kinds[:m]
        ref, _, ref_kinds = _envelope(
            [reference[:m]], any(isinstance(x, str) for x in reference[:m])
        )
        finite = ref_kinds == _FINITE
        equal = (kinds == ref_kinds) & (~finite | ((lo == ref) & (hi == ref)))
        differs = np.flatnonzero(~equal)
        first = int(differs[0]) if differs.size else None if same_tokens else m
        both = finite & ((kinds & _FINITE) != 0)
        diff = (
            float(np.max(np.maximum(hi[both] - ref[both], ref[both] - lo[both])))
            if both.any()
            else None
        )
        covered = (
            self.n
            if first is not None
            else sum(n for length, n in self.lengths.items() if length >= len(reference))
        )
        return first, diff, covered

    def _widen(self, vector: Sequence[Logprob]) -> None:
        self.pending.append(vector)
        self.len_min = min(self.len_min, len(vector))
        self.len_max = max(self.len_max, len(vector))
        if len(self.pending) >= _LOGPROB_BATCH:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        by_length: dict[int, list[Sequence[Logprob]]] = {}
        for vector in self.pending:
            by_length.setdefault(len(vector), []).append(vector)
        self.pending = []
        for group in by_length.values():
            self._fold(*_envelope(group, self.nonfinite))

    def _fold(self, lo: np.ndarray, hi: np.ndarray, kinds: np.ndarray) -> None:
        """Widen the envelope by another one; positions only one of them has are padded
        neutrally."""
        if self.lo is None or self.hi is None or self.kinds is None:  # all three or none
            # Until now every vector was the one counted: the envelope starts as that vector.
            self.lo, self.hi, self.kinds = _envelope([next(iter(self.vectors))], self.nonfinite)
        size = max(len(self.lo), len(lo))
        if len(self.lo) < size:
            pad = size - len(self.lo)
            self.lo = np.concatenate([self.lo, np.full(pad, np.inf)])
            self.hi = np.concatenate([self.hi, np.full(pad, -np.inf)])
            self.kinds = np.concatenate([self.kinds, np.zeros(pad, np.uint8)])
        k = len(lo)
        self.lo[:k] = np.minimum(self.lo[:k], lo)
        self.hi[:k] = np.maximum(self.hi[:k], hi)
        self.kinds[:k] |= kinds


# The kinds of value a logprob position can hold, as bits the envelope ORs over its vectors.
_NULL, _FINITE, _NAN, _NEG_INF, _POS_INF = 1, 2, 4, 8, 16


def _envelope(
    vectors: Sequence[Sequence[Logprob]], nonfinite: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectors of one length as an envelope: (min, max of the finite values, kinds seen) per
    position.

    A null (a token the server gave no logprob for) becomes NaN and is neutral for min and max, as
    are non-finite values. With ``nonfinite`` the vectors may hold the spellings of
    ``store.spell_logprobs``: ``float()`` reads them back, and a spelled ``"NaN"`` is kept apart
    from a null.
    """
    if nonfinite:
        spelled_nan = np.array([[x == "NaN" for x in v] for v in vectors], dtype=bool).reshape(
            len(vectors), -1
        )
        vectors = [[float(x) if isinstance(x, str) else x for x in v] for v in vectors]
    values = np.array(vectors, dtype=np.float64).reshape(len(vectors), -1)
    finite = np.isfinite(values)
    kinds = np.where(
        finite, _FINITE, np.where(np.isnan(values), _NULL, np.where(values > 0, _POS_INF, _NEG_INF))
    )
    if nonfinite:
        kinds = np.where(spelled_nan, _NAN, kinds)
    return (
        np.where(finite, values, np.inf).min(axis=0),
        np.where(finite, values, -np.inf).max(axis=0),
        np.bitwise_or.reduce(kinds.astype(np.uint8), axis=0),
    )
