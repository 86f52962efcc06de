"""Cold against warm answers (``load.prefix_cache = "cold_warm"``), compared round by round: pure,
records in and the comparison out. Each round sends a probe serially, cold (its prefix not in the
server's cache), then warm (the same input, just served); ``kevload.load.prefixcache`` makes the
cold sample and says how. A round the server's own account contradicts (its warm sample reused no
more prompt tokens than its cold one) is left out, never claimed warm.

Graded probes are paired here too: each warm answer with its own round's cold one (the cells cannot:
each round is a serial sample, and a serial cell is the reference, compared with nothing). A warm
answer graded bad where its round's cold one is good is a flip of its own, ``warm_good_to_bad``
("the warm cache turned N answers bad"), and fails ``--fail-on bad`` as load's flips do;
``warm_bad_to_good`` the reverse.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from kevload.compare.divergence import common_prefix_length
from kevload.records.store import Record

# A probe's k-th round under the marker method is its own cell: ``<probe>@r<k>`` (its input differs
# per round).
_ROUND_ID = re.compile(r"^(?P<probe>.*)@r(?P<round>\d+)$")


def round_length(method: str) -> int:
    """Samples per round: cold, then warm; under the marker method a second warm one, since each
    round is another input and only within a round can warm answers show whether the server varies
    anyway."""
    return 3 if method == "marker" else 2


def base_probe(probe: str, method: str) -> str:
    """The probe a record belongs to: under the marker method its round's id without ``@r<k>``."""
    match = _ROUND_ID.match(probe) if method == "marker" else None
    return match["probe"] if match else probe


@dataclass(frozen=True)
class Side:
    """One state's ok answers, over the rounds compared."""

    n: int
    distinct: (
        int | None
    )  # None under the marker method: each round is another input, so across rounds says nothing


@dataclass(frozen=True)
class ColdWarm:
    """One probe's cold and warm answers compared, round by round (a round: one cold answer, the
    warm ones after)."""

    probe: str
    method: str
    rounds: int  # rounds with ok cold and warm answers, compared
    # … left out: the server said a warm sample reused no more prompt tokens than the cold one
    contradicted: int
    confirmed: int  # … the server said every warm sample reused more (the rest: it said nothing)
    cold: Side
    warm: Side
    equal_rounds: int  # compared rounds whose cold answer is their first warm one
    warm_unstable_rounds: (
        int  # compared rounds whose warm answers disagree among themselves (marker method)
    )
    # Compared rounds whose cold answer leaves warm ones that agree among themselves: within the
    # round under the marker, across rounds with the same input (there a round's one warm answer
    # must be every round's).
    cold_differs_rounds: int
    # True: cold answers leave warm ones that agree among themselves (with the same input every
    # round, cold ones that agree among themselves too); None: they differ, but the warm answers
    # vary too, or (same input) the cold ones (the server varies anyway: no claim about its cache);
    # False: cold is warm in every round.
    cache_effect: bool | None
    first_divergence_chars: int | None  # earliest char where a cold answer leaves its warm one
    logprob_rounds: int  # compared rounds with logprobs on the cold and first warm answer
    logprob_bitwise: (
        bool | None
    )  # every such round's tokens and logprobs bitwise equal (None: no such round)
    logprob_max_abs_diff: (
        float | None
    )  # over positions before the first differing token (None: no such position)
    cached_tokens_cold: int | None  # most prompt tokens the server said it reused for a cold sample
    cached_tokens_warm: int | None  # fewest it said it reused for a warm one (None: it never said)
    # Graded probes: warm answers graded bad whose round's cold answer is good, and the reverse
    # (None: ungraded).
    warm_good_to_bad: int | None = None
    warm_bad_to_good: int | None = None

    def to_json(self) -> dict[str, Any]:
        doc = {k: v for k, v in self.__dict__.items() if k not in ("cold", "warm")}
        return {**doc, "cold": self.cold.__dict__, "warm": self.warm.__dict__}


Round = tuple[Record, list[Record]]  # its cold answer, its warm ones


Grade = Callable[
    [Record], bool | None
]  # an answer's grade: good, bad, None (ungraded, or its grader failed)


def cold_warm(records: Iterable[Record], method: str, grade: Grade | None = None) -> list[ColdWarm]:
    """Per probe, its counted cold and warm answers compared round by round (pure: records in,
    comparison out); with ``grade`` (None for a probe without a grader), each warm answer's grade
    against its round's cold one."""
    length = round_length(method)
    rounds: dict[tuple[str, int], list[Record]] = {}
    for r in records:
        if r.role != "probe" or not r.is_sample or r.cache is None:
            continue
        probe = base_probe(r.probe, method)
        marked = _ROUND_ID.match(r.probe) if probe != r.probe else None
        number = int(marked["round"]) if marked else r.sample // length
        rounds.setdefault((probe, number), []).append(r)
    by_probe: dict[str, list[Round]] = {}
    for (probe, _), sent in sorted(rounds.items()):
        pairs = by_probe.setdefault(probe, [])
        cold = [r for r in sent if r.cache == "cold"]
        warm = sorted((r for r in sent if r.cache == "warm"), key=lambda r: r.sample)
        if len(cold) == 1 and len(warm) == length - 1 and all(r.status == "ok" for r in sent):
            pairs.append((cold[0], warm))
    return [_compare(probe, pairs, method, grade) for probe, pairs in by_probe.items()]


def _graded_flips(rounds: list[Round], grade: Grade) -> tuple[int, int] | None:
    """(warm answers bad whose round's cold one is good, the reverse) over ``rounds``; None where no
    answer is graded. An answer whose grader failed pairs with nothing."""
    to_bad = to_good = 0
    graded = False
    for cold, warm in rounds:
        before = grade(cold)
        for answer in warm:
            after = grade(answer)
            graded = graded or before is not None or after is not None
            if before is None or after is None:
                continue
            to_bad += before and not after
            to_good += after and not before
    return (to_bad, to_good) if graded else None


def _kept_rounds(rounds: list[Round]) -> tuple[list[Round], int, int]:
    """(the rounds compared, those left out because the server contradicts them, those kept whose
    every sample the server gave its cached tokens for)."""
    kept: list[Round] = []
    contradicted = confirmed = 0
    for cold, warm in rounds:
        said = cold.cached_tokens is not None and all(w.cached_tokens is not None for w in warm)
        # A warm sample the server says reused nothing is not warm, whatever it said of the cold
        # one.
        if any(
            w.cached_tokens is not None and w.cached_tokens <= (cold.cached_tokens or 0)
            for w in warm
        ):
            # The server says a warm sample hit its cache no more than the cold one: not warm.
            contradicted += 1
            continue
        confirmed += said
        kept.append((cold, warm))
    return kept, contradicted, confirmed


def _cache_effect(
    kept: list[Round], same_input: bool, equal: int, unstable: int, cold_differs: int
) -> bool | None:
    """``ColdWarm.cache_effect`` of the rounds compared."""
    key = _output
    if not kept:
        return None  # nothing compared, nothing claimed
    if equal == len(kept):
        return False
    if same_input:
        # Every cold answer answers the same input in the same (empty) cache, every warm one
        # likewise: if either side disagrees among itself the server varies anyway, and a cold
        # answer leaving the warm ones shows nothing.
        warm_distinct = len({key(x) for _, w in kept for x in w})
        return True if warm_distinct == 1 and len({key(c) for c, _ in kept}) == 1 else None
    # Only rounds whose warm answers agree can show the cache; as many unstable ones make it
    # noise.
    return True if cold_differs > unstable else None


def _compare(probe: str, rounds: list[Round], method: str, grade: Grade | None) -> ColdWarm:
    """One probe's rounds compared, those the server contradicts left out."""
    kept, contradicted, confirmed = _kept_rounds(rounds)
    key = _output
    equal = sum(key(c) == key(w[0]) for c, w in kept)
    unstable = sum(len({key(x) for x in w}) > 1 for _, w in kept)
    divergence = [
        common_prefix_length(c.answer, w[0].answer) for c, w in kept if key(c) != key(w[0])
    ]
    diffs = [d for c, w in kept if (d := _logprob_diff(c, w[0])) is not None]
    sizes = [size for _, size in diffs if size is not None]
    cold_cached = [c.cached_tokens for c, _ in kept if c.cached_tokens is not None]
    warm_cached = [x.cached_tokens for _, w in kept for x in w if x.cached_tokens is not None]
    same_input = method != "marker"
    warm_distinct = len({key(x) for _, w in kept for x in w}) if same_input else None
    if same_input:
        cold_differs = len(kept) - equal if warm_distinct == 1 else 0
    else:
        cold_differs = sum(key(c) != key(w[0]) and len({key(x) for x in w}) == 1 for c, w in kept)
    flips = None if grade is None else _graded_flips(kept, grade)
    return ColdWarm(
        probe=probe,
        method=method,
        rounds=len(kept),
        contradicted=contradicted,
        confirmed=confirmed,
        cold=Side(len(kept), len({key(c) for c, _ in kept}) if same_input else None),
        warm=Side(sum(len(w) for _, w in kept), warm_distinct),
        equal_rounds=equal,
        warm_unstable_rounds=unstable,
        cold_differs_rounds=cold_differs,
        cache_effect=_cache_effect(kept, same_input, equal, unstable, cold_differs),
        first_divergence_chars=min(divergence) if divergence else None,
        logprob_rounds=len(diffs),
        logprob_bitwise=all(equal for equal, _ in diffs) if diffs else None,
        logprob_max_abs_diff=max(sizes) if sizes else None,
        cached_tokens_cold=max(cold_cached) if cold_cached else None,
        cached_tokens_warm=min(warm_cached) if warm_cached else None,
        warm_good_to_bad=None if flips is None else flips[0],
        warm_bad_to_good=None if flips is None else flips[1],
    )


def _output(r: Record) -> tuple[str | None, str | None]:
    """An output is its text together with its finish_reason, as in every cell."""
    return r.sha256, r.finish_reason


def _logprob_diff(cold: Record, warm: Record) -> tuple[bool, float | None] | None:
    """(bitwise equal, largest |difference|) of two answers' logprobs, or None where one has none.
    Positions are compared up to the first token that differs, which counts as differing (as against
    the serial reference); the difference is over the positions with the same token (None: none
    had), a non-finite value against a finite one counting as inf."""
    if not cold.logprobs or not warm.logprobs or cold.tokens is None or warm.tokens is None:
        return None
    equal, worst, compared = len(cold.tokens) == len(warm.tokens), 0.0, 0
    # RunDir.records gives the spelled non-finite values back as floats (records.store).
    values = cast(list[float | None], cold.logprobs), cast(list[float | None], warm.logprobs)
    for ct, wt, cv, wv in zip(cold.tokens, warm.tokens, *values, strict=False):
        if ct != wt:
            equal = False
            break
        compared += 1
        if cv is None or wv is None or cv == wv or (math.isnan(cv) and math.isnan(wv)):
            equal = equal and (cv is None) == (wv is None)
            continue
        equal = False
        worst = max(worst, abs(cv - wv) if math.isfinite(cv) and math.isfinite(wv) else math.inf)
    return equal, worst if compared else None
