"""Two or more servers side by side (``kevload compare``): each candidate's answers paired item by
item with the reference's at the same level, classed, counted and tested; latencies as ratios with
bootstrap intervals; an N×N agreement matrix per level. Pure: ``Side`` values in
(``sides.fold_side``), a ``Comparison`` out.

Definitions (docs/compare.md):

- An item is a probe or a dataset line (a conversation: its whole transcript). At a level, each
  side's answers to it are the texts of its counted ok samples. The item *agrees* when every text
  the candidate gave is among the texts the reference gave there: against a reference that varies,
  its own spread is the yardstick.
- ``reference_self_agreement``: the share of items at which every reference sample has one text.
- ``latent``: the candidate's modal text is the reference's, both sent logprobs for it, and they
  differ.
- A graded item is good on a side when every answer it got there is graded good (one bad answer:
  bad), as in a run's accuracy (``compare.graded``); ``good_to_bad`` / ``bad_to_good`` count items,
  and the exact McNemar test is over those discordant items.
- ``new_texts``: candidate samples of ungraded items whose text the reference never gave.
  ``reference_varies``: the reference gave more than one text for some ungraded item at the level;
  ``new_texts_p``: then, whether the new texts are more than the reference's own spread explains
  (``stats.spread_p``, a permutation test stratified by item; None where the reference varies
  nowhere: any new text is then one a stable server never gave).

"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kevload.compare.cells import CellAccumulator, OutputKey
from kevload.compare.divergence import common_prefix_length
from kevload.compare.graded import Grader
from kevload.compare.sides import LevelId, LevelLoad, Side, level_key
from kevload.compare.stats import bootstrap_ratio, mcnemar_exact, spread_p, wilson_interval

ITEM_CLASSES = (
    "identical",
    "latent",
    "reworded_good",
    "reworded_bad",
    "good_to_bad",
    "bad_to_good",
    "different",
)
EXAMPLES = 3  # items that parted shown per candidate and level
_WINDOW = 60  # characters of each answer shown around where it parts


@dataclass(frozen=True)
class Parted:
    """An item whose candidate answer parts from the reference's: where, and the two texts around
    that place."""

    item: str
    kind: str  # its class
    at_char: int
    at_token: int | None
    offset: int  # the char both windows below start at
    reference: str
    candidate: str


@dataclass(frozen=True)
class ItemResult:
    """One item at one level, candidate against reference."""

    item: str
    kind: str
    at_char: int | None  # where the first answer that parted leaves the reference's modal one
    at_token: int | None
    logprob_first: int | None  # latent: the first token whose logprob differs
    logprob_diff: float | None  # latent: the largest absolute difference
    # the reference's text, and logprobs for it on both sides: latent or not could be told
    logprobs_compared: bool
    new: int  # candidate samples with a text the reference never gave
    labels: tuple[list[int], list[int]]  # each reference and candidate sample's text, as a label
    graded: tuple[bool, bool] | None  # (reference good, candidate good); None: not graded on both
    example: Parted | None


@dataclass(frozen=True)
class LevelComparison:
    """One candidate against the reference at one level (compare.json's
    ``candidates[].levels[]``)."""

    mode: str
    concurrency: int
    rate: float | None
    items: int
    items_missing: list[str]
    agreement: float | None
    agreement_ci95: list[float] | None
    reference_self_agreement: float | None
    classes: dict[str, int]
    latent: int
    latent_checked: int  # items with the reference's text whose logprobs both sides sent
    latent_max_logprob_diff: float | None
    latent_first_token: int | None
    first_divergence_chars_median: float | None
    first_divergence_tokens_median: float | None
    examples: list[Parted]
    parted: dict[str, list[str]]
    graded: int
    good_to_bad: int
    bad_to_good: int
    mcnemar_p: float | None
    accuracy_reference: float | None
    accuracy_candidate: float | None
    ungraded: int
    ungraded_agreement: float | None
    new_texts: int
    reference_varies: bool
    new_texts_p: float | None
    latency: dict[str, Any]
    reference_load: dict[str, Any]
    candidate_load: dict[str, Any]

    @property
    def label(self) -> str:
        return f"r={self.rate:g}/s" if self.rate is not None else f"c={self.concurrency}"

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc.update(doc.pop("latency"))
        if self.rate is None:
            del doc["rate"]
        else:
            del doc["concurrency"]
        return doc


@dataclass(frozen=True)
class CandidateComparison:
    name: str
    state: str | None
    levels: list[LevelComparison]


@dataclass(frozen=True)
class Comparison:
    """compare.json: the reference, each candidate's levels, and the N×N agreement matrix per
    level."""

    reference: str
    reference_state: str | None
    targets: list[str]
    candidates: list[CandidateComparison]
    matrix: list[dict[str, Any]]
    seed: int = 0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "reference_state": self.reference_state,
            "targets": self.targets,
            "seed": self.seed,
            "notes": self.notes,
            "candidates": [
                {"name": c.name, "state": c.state, "levels": [lv.to_json() for lv in c.levels]}
                for c in self.candidates
            ],
            "matrix": self.matrix,
        }


def compare_sides(
    sides: Sequence[Side], reference: str, *, seed: int = 0, notes: Sequence[str] = ()
) -> Comparison:
    """Each side other than ``reference`` against it, level by level, and every pair's agreement per
    level."""
    by_name = {side.name: side for side in sides}
    ref = by_name[reference]
    grader = Grader(ref.gradings or {})
    candidates = [
        CandidateComparison(
            name=side.name,
            state=side.state,
            levels=[
                compare_level(ref, side, level, grader, seed=seed)
                for level in sorted(set(ref.levels()) | set(side.levels()), key=level_key)
            ],
        )
        for side in sides
        if side.name != reference
    ]
    return Comparison(
        reference=reference,
        reference_state=ref.state,
        targets=[side.name for side in sides],
        candidates=candidates,
        matrix=agreement_matrix(sides),
        seed=seed,
        notes=list(notes),
    )


def compare_level(
    ref: Side, cand: Side, level: LevelId, grader: Grader, *, seed: int = 0
) -> LevelComparison:
    """The candidate against the reference at ``level`` (this module's definitions)."""
    mode, concurrency, rate = level
    ref_items, cand_items = ref.items.get(level, {}), cand.items.get(level, {})
    names = sorted(set(ref_items) | set(cand_items))
    paired = [n for n in names if _answered(ref_items.get(n)) and _answered(cand_items.get(n))]
    results = [
        compare_item(
            name, ref_items[name], cand_items[name], grader if _graded(ref, name) else None
        )
        for name in paired
    ]
    agree = sum(r.at_char is None for r in results)
    low_high = wilson_interval(agree, len(results)) if results else None
    ref_load, cand_load = ref.load.get(level, LevelLoad()), cand.load.get(level, LevelLoad())
    return LevelComparison(
        mode=mode,
        concurrency=concurrency,
        rate=rate,
        items=len(results),
        items_missing=[n for n in names if n not in paired],
        agreement=_round(agree / len(results)) if results else None,
        agreement_ci95=None if low_high is None else [_round(x) for x in low_high],
        reference_self_agreement=_round(
            sum(len(ref_items[n].counts) == 1 for n in paired) / len(paired)
        )
        if paired
        else None,
        **_parting_figures(results),
        **_graded_figures(results),
        **_text_figures(results, seed),
        latency=latency_ratios(ref_load, cand_load, seed=seed),
        reference_load=ref_load.throughput(_met(ref, level)),
        candidate_load=cand_load.throughput(_met(cand, level)),
    )


def _parting_figures(results: Sequence[ItemResult]) -> dict[str, Any]:
    """The classes, the latent items' logprobs, where the others part, and examples."""
    classes = {kind: sum(r.kind == kind for r in results) for kind in ITEM_CLASSES}
    latent = [r for r in results if r.kind == "latent"]
    parted = [r for r in results if r.at_char is not None]
    return {
        "classes": classes,
        "latent": len(latent),
        "latent_checked": sum(r.logprobs_compared for r in results),
        "latent_max_logprob_diff": max(
            (r.logprob_diff for r in latent if r.logprob_diff is not None), default=None
        ),
        "latent_first_token": min(
            (r.logprob_first for r in latent if r.logprob_first is not None), default=None
        ),
        "first_divergence_chars_median": _median([r.at_char for r in parted]),
        "first_divergence_tokens_median": _median([r.at_token for r in parted]),
        "examples": [r.example for r in parted if r.example is not None][:EXAMPLES],
        "parted": {
            kind: [r.item for r in results if r.kind == kind]
            for kind in ITEM_CLASSES
            if kind != "identical" and classes[kind]
        },
    }


def _graded_figures(results: Sequence[ItemResult]) -> dict[str, Any]:
    """The graded items: the discordant ones, the exact McNemar p over them, each side's
    accuracy."""
    pairs = [r.graded for r in results if r.graded is not None]
    to_bad = sum(1 for g in pairs if g[0] and not g[1])
    to_good = sum(1 for g in pairs if g[1] and not g[0])
    return {
        "graded": len(pairs),
        "good_to_bad": to_bad,
        "bad_to_good": to_good,
        "mcnemar_p": float(f"{mcnemar_exact(to_bad, to_good):.6g}") if pairs else None,
        "accuracy_reference": _round(sum(g[0] for g in pairs) / len(pairs)) if pairs else None,
        "accuracy_candidate": _round(sum(g[1] for g in pairs) / len(pairs)) if pairs else None,
    }


def _text_figures(results: Sequence[ItemResult], seed: int) -> dict[str, Any]:
    """The ungraded items: their agreement, the new texts, and those against the reference's
    spread."""
    ungraded = [r for r in results if r.graded is None]
    varies = any(len(set(r.labels[0])) > 1 for r in ungraded)
    return {
        "ungraded": len(ungraded),
        "ungraded_agreement": _round(sum(r.at_char is None for r in ungraded) / len(ungraded))
        if ungraded
        else None,
        "new_texts": sum(r.new for r in ungraded),
        "reference_varies": varies,
        "new_texts_p": float(f"{spread_p([r.labels for r in ungraded], seed=seed):.6g}")
        if varies
        else None,
    }


def compare_item(
    name: str, ref: CellAccumulator, cand: CellAccumulator, grader: Grader | None
) -> ItemResult:
    """One item at one level: its class, where it parts, its logprobs, its new texts and its
    grades."""
    texts = {key[0] for key in ref.counts}
    outside = [key for key in cand.counts if key[0] not in texts]
    ref_modal, cand_modal = ref.modal(), cand.modal()
    assert ref_modal is not None and cand_modal is not None  # paired items have answers on both
    graded = None
    if grader is not None:
        ref_good, cand_good = _grade(grader, name, ref), _grade(grader, name, cand)
        if ref_good is not None and cand_good is not None:
            graded = (ref_good, cand_good)
    first = diff = at_char = at_token = None
    example = None
    compared = False
    if outside:
        other = max(outside, key=lambda k: (cand.counts[k], -cand.first_seen[k]))
        at_char, at_token, example = _parting(name, ref, ref_modal, cand, other)
    else:
        compared, first, diff = _logprob_parting(ref, cand, cand_modal)
    kind = _kind(bool(outside), first is not None, graded)
    if example is not None:
        example = Parted(kind=kind, **{k: v for k, v in asdict(example).items() if k != "kind"})
    label = {
        sha: i for i, sha in enumerate(dict.fromkeys(k[0] for k in [*ref.counts, *cand.counts]))
    }
    return ItemResult(
        item=name,
        kind=kind,
        at_char=at_char,
        at_token=at_token,
        logprob_first=first,
        logprob_diff=diff,
        logprobs_compared=compared,
        new=sum(cand.counts[k] for k in outside),
        labels=(_labels(ref, label), _labels(cand, label)),
        graded=graded,
        example=example,
    )


def _labels(cell: CellAccumulator, label: Mapping[str | None, int]) -> list[int]:
    return [label[key[0]] for key, n in cell.counts.items() for _ in range(n)]


def _kind(parts: bool, latent: bool, graded: tuple[bool, bool] | None) -> str:
    if graded is not None and graded[0] != graded[1]:
        return "good_to_bad" if graded[0] else "bad_to_good"
    if not parts:
        return "latent" if latent else "identical"
    if graded is None:
        return "different"
    return "reworded_good" if graded[0] else "reworded_bad"


def _parting(
    name: str, ref: CellAccumulator, ref_key: OutputKey, cand: CellAccumulator, key: OutputKey
) -> tuple[int, int | None, Parted]:
    """Where the candidate's answer ``key`` leaves the reference's modal one (char, token), and the
    example."""
    ref_text, text = ref.texts[ref_key], cand.texts[key]
    at = common_prefix_length(ref_text, text)
    ref_tokens, tokens = ref.tokens.get(ref_key), cand.tokens.get(key)
    at_token = common_prefix_length(ref_tokens, tokens) if ref_tokens and tokens else None
    start = max(0, at - _WINDOW // 2)
    window = slice(start, start + _WINDOW)
    return at, at_token, Parted(name, "", at, at_token, start, ref_text[window], text[window])


def _logprob_parting(
    ref: CellAccumulator, cand: CellAccumulator, key: OutputKey
) -> tuple[bool, int | None, float | None]:
    """For the candidate's modal text, which the reference gave too: whether both sent logprobs
    for it, the first token whose logprob differs from the reference's modal vector for that text,
    and the largest difference (None, None where they are equal or there is nothing to compare)."""
    track = cand.logprobs.get(key)
    ref_key = key if key in ref.counts else next(k for k in ref.counts if k[0] == key[0])
    ref_track = ref.logprobs.get(ref_key)
    if track is None or ref_track is None:
        return False, None, None
    vector = ref_track.modal()
    first, diff, _ = track.compare(vector, len(vector), True)
    return True, first, None if first is None or diff is None else float(f"{diff:.6g}")


def _grade(grader: Grader, name: str, cell: CellAccumulator) -> bool | None:
    """Good when every graded answer is good, bad with one bad, None with none graded
    (``graded.probe_grade``)."""
    grades = grader.grades(name, cell)
    if any(grades[k] is False for k in cell.counts):
        return False
    return True if any(grades[k] is True for k in cell.counts) else None


def _met(side: Side, level: LevelId) -> int | None:
    return None if side.slo_met is None else side.slo_met.get(level, 0)


def _graded(side: Side, name: str) -> bool:
    return side.gradings is not None and name in side.gradings


def _answered(cell: CellAccumulator | None) -> bool:
    return cell is not None and bool(cell.counts)


def latency_ratios(ref: LevelLoad, cand: LevelLoad, *, seed: int = 0) -> dict[str, Any]:
    """Candidate over reference: p50 and p99 end-to-end and p50 time to first token, each with its
    seeded bootstrap 95 % interval (None where a side has no value)."""
    out: dict[str, Any] = {}
    for name, values, other, q in (
        ("latency_p50_ratio", ref.e2e, cand.e2e, 0.5),
        ("latency_p99_ratio", ref.e2e, cand.e2e, 0.99),
        ("ttft_p50_ratio", ref.ttft, cand.ttft, 0.5),
    ):
        ratio = bootstrap_ratio(values, other, q, seed=seed)
        out[name] = None if ratio is None else _round(ratio[0])
        out[f"{name}_ci95"] = None if ratio is None else [_round(ratio[1]), _round(ratio[2])]
    return out


def agreement_matrix(sides: Sequence[Side]) -> list[dict[str, Any]]:
    """Per level, ``agreement[i][j]``: the share of items answered by both where every text of
    target j is among target i's (row i the reference); None without such an item."""
    levels = sorted({level for side in sides for level in side.items}, key=level_key)
    out = []
    for level in levels:
        rows = [
            [_agreement(a.items.get(level, {}), b.items.get(level, {})) for b in sides]
            for a in sides
        ]
        mode, concurrency, rate = level
        out.append(
            {
                "mode": mode,
                **({"rate": rate} if rate is not None else {"concurrency": concurrency}),
                "targets": [side.name for side in sides],
                "agreement": rows,
            }
        )
    return out


def _agreement(
    ref: Mapping[str, CellAccumulator], cand: Mapping[str, CellAccumulator]
) -> float | None:
    names = [n for n in ref if _answered(ref[n]) and _answered(cand.get(n))]
    if not names:
        return None
    agree = sum({k[0] for k in cand[n].counts} <= {k[0] for k in ref[n].counts} for n in names)
    return _round(agree / len(names))


def _median(values: Sequence[int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(statistics.median(known)) if known else None


def _round(value: float) -> float:
    return round(value, 6)
