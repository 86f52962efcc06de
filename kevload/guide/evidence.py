"""What `kevload diagnose`'s steps measured: each step's run reduced to a `StepResult`, collected in
an `Evidence`, and the pure reductions of a step's records that fill them in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kevload.compare.stats import drift_upper_bound
from kevload.records.summary import CellSummary


@dataclass(frozen=True)
class StepResult:
    """One step's run, reduced to what the decision needs and the report shows."""

    key: str
    title: str
    params: Mapping[str, Any]
    levels: tuple[int, ...]
    samples: int
    ok: int  # ok probe samples in the weakest probe cell
    distinct: int  # distinct probe outputs in the most varied probe cell
    errors: Mapping[str, int] = field(default_factory=dict)
    drift_cells: tuple[str, ...] = ()
    run: str = ""
    mode: str = "single"
    target_failed: bool = False
    # Measured by some steps only (None elsewhere).
    # Baseline: calls that differ from the most common output
    differing_calls: tuple[int, ...] | None = None
    # Baseline: distinct outputs once the first (cold) call is left out
    distinct_after_first: int | None = None
    # The seed_repeat step: distinct outputs over SEEDS, one call each
    different_seeds_distinct: int | None = None
    # Cache steps: fresh prompts with a cold and at least one warm answer
    compared_rounds: int | None = None
    # … whose warm answers agree and the cold one differs from them
    cold_differs_rounds: int | None = None
    warm_unstable_rounds: int | None = None  # … whose warm answers disagree among themselves
    # Per-token logprobs against the serial ones, where the server returned them: True when every
    # probe cell compared them and all were bitwise equal, False when one differed, None when none
    # was compared.
    logprob_bitwise: bool | None = None
    latent_cells: tuple[str, ...] = ()  # cells with the serial text but other logprobs
    latent_from: int | None = None  # earliest token where a latent cell's logprobs differ
    # Cells whose logprobs cover only some ok samples ("logprobs in 2 of 6 at p@single/c=4: no
    # logprob claim").
    logprob_gaps: tuple[str, ...] = ()
    # Cells at c > 1 where the server's /metrics showed it running ≤ 1 request at a time while
    # others waited.
    serialized_cells: tuple[str, ...] = ()
    # Cache steps: how their cold samples were made (kevload.load.prefixcache: the server's reset,
    # cache_prompt, a marker).
    cache_method: str | None = None
    # … and what its run said of the cache (summary.json prefix_cache cache_effect, over its
    # probes): the finding.
    cache_effect: bool | None = None
    # With --expected/--grade (kevload.compare.graded): the step's answers graded good and bad over
    # its probe cells, and those graded bad where every serial answer was good.
    graded_good: int | None = None
    graded_bad: int | None = None
    flips_good_to_bad: int | None = None

    @property
    def drift(self) -> bool:
        return bool(self.drift_cells)

    @property
    def bound(self) -> float | None:
        """95 % upper bound on the drift rate; None once drift is seen or nothing came back ok."""
        return None if self.drift_cells or not self.ok else round(drift_upper_bound(self.ok), 4)

    def to_json(self) -> dict[str, Any]:
        doc = {
            "step": self.key,
            "title": self.title,
            "params": dict(self.params),
            "mode": self.mode,
            "levels": list(self.levels),
            "samples": self.samples,
            "ok": self.ok,
            "errors": dict(self.errors),
            "distinct": self.distinct,
            "drift": self.drift,
            "drift_cells": list(self.drift_cells),
            "drift_rate_upper_95": self.bound,
            "run": self.run,
        }
        extras = {
            "differing_calls": self.differing_calls,
            "distinct_after_first": self.distinct_after_first,
            "different_seeds_distinct": self.different_seeds_distinct,
            "compared_rounds": self.compared_rounds,
            "cold_differs_rounds": self.cold_differs_rounds,
            "warm_unstable_rounds": self.warm_unstable_rounds,
            "logprob_bitwise": self.logprob_bitwise,
            "latent_cells": self.latent_cells or None,
            "latent_from": self.latent_from,
            "logprob_gaps": self.logprob_gaps or None,
            "serialized_cells": self.serialized_cells or None,
            "cache_method": self.cache_method,
            "cache_effect": self.cache_effect,
            "graded_good": self.graded_good,
            "graded_bad": self.graded_bad,
            "flips_good_to_bad": self.flips_good_to_bad,
        }
        doc.update(
            {k: list(v) if isinstance(v, tuple) else v for k, v in extras.items() if v is not None}
        )
        return doc


@dataclass(frozen=True)
class DataResult:
    """Step 5: where the probe lies against the training set
    (kevload.guide.coverage.probe_coverage's answer)."""

    coverage: Mapping[str, Any]

    @property
    def outside(self) -> bool:
        return bool(self.coverage["outside"])

    @property
    def reasons(self) -> list[str]:
        return list(self.coverage["reasons"])

    def to_json(self) -> dict[str, Any]:
        return {"step": "data", "title": "5 training-data coverage", **self.coverage}


@dataclass(frozen=True)
class Evidence:
    """Everything measured so far, in the order it was measured."""

    steps: tuple[StepResult, ...] = ()
    dropped_fields: tuple[str, ...] = ()  # fixing fields the server rejected
    runs: tuple[str, ...] = ()  # every run directory, the seed runs that are no step included
    data: DataResult | None = None

    def step(self, key: str) -> StepResult | None:
        return next((s for s in self.steps if s.key == key), None)


def differing_calls(rows: Iterable[tuple[str, int, str | None]]) -> tuple[tuple[int, ...], int]:
    """Calls (by sample index) whose output differs from the most common one, and distinct outputs
    after call 0.

    ``rows`` are (probe, sample, sha256) of the ok probe answers of one serial run.
    """
    rows = list(rows)
    counts: dict[str | None, int] = {}
    for _, _, sha in rows:
        counts[sha] = counts.get(sha, 0) + 1
    if not counts:
        return (), 0
    modal = max(counts, key=counts.__getitem__)
    later = {sha for _, sample, sha in rows if sample > 0}
    return tuple(sample for _, sample, sha in rows if sha != modal), len(later)


def logprob_bitwise(cells: Iterable[CellSummary]) -> bool | None:
    """True when every cell compared the logprobs of all its ok samples with serial and all were
    bitwise equal; False when compared ones differed in a cell; None when a cell (or every one)
    makes no claim."""
    cells = tuple(cells)
    if any(c.logprob_bitwise is False for c in cells):
        return False
    return True if cells and all(c.logprob_bitwise for c in cells) else None


def cold_warm_counts(rows: Iterable[tuple[str, int, str | None]]) -> tuple[int, int, int]:
    """(rounds compared, rounds whose cold answer differs from agreeing warm ones, rounds whose warm
    answers disagree).

    ``rows`` are (probe, sample, sha256); each probe is one fresh prompt, sample 0 its cold answer.
    """
    by_probe: dict[str, list[tuple[int, str | None]]] = {}
    for probe, sample, sha in rows:
        by_probe.setdefault(probe, []).append((sample, sha))
    compared = cold_differs = warm_unstable = 0
    for answers in by_probe.values():
        answers.sort()
        if len(answers) < 2 or answers[0][0] != 0:
            continue
        compared += 1
        warm = {sha for _, sha in answers[1:]}
        if len(warm) > 1:
            warm_unstable += 1
        elif answers[0][1] not in warm:
            cold_differs += 1
    return compared, cold_differs, warm_unstable


def cache_rounds(comparisons: Iterable[Mapping[str, Any]]) -> tuple[int, int, int]:
    """(rounds compared, rounds whose cold answer leaves warm ones that agree, rounds whose warm
    answers vary) from a cache step's ``summary.json`` ``prefix_cache`` probes
    (``compare.coldwarm.ColdWarm``). Where every round sends the same input (a server reset,
    cache_prompt) the warm answers' agreement is across rounds: a server whose warm answers vary
    anyway has each differing round counted unstable, not cold-differs."""
    compared = cold_differs = warm_unstable = 0
    for c in comparisons:
        compared += c["rounds"]
        cold_differs += c["cold_differs_rounds"]
        if c["warm"]["distinct"] is None:  # marker: per round
            warm_unstable += c["warm_unstable_rounds"]
        elif c["warm"]["distinct"] > 1:
            warm_unstable += c["rounds"] - c["equal_rounds"]
    return compared, cold_differs, warm_unstable


def cache_effect(comparisons: Iterable[Mapping[str, Any]]) -> bool | None:
    """A cache step's finding from its run's probes: an effect where one shows it, none where every
    one says none, else no claim (the run's null: answers that vary anyway, or nothing compared)."""
    effects = [c["cache_effect"] for c in comparisons]
    return (
        True if True in effects else False if effects and all(e is False for e in effects) else None
    )
