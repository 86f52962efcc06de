"""The rollout gate (``kevload compare``'s exit code): does every candidate answer as the reference
does?

Pure: a ``Comparison`` and the ``GateRules`` in, the code and one line per finding out. The rule
(docs/compare.md, "The gate"):

- 3 (``TARGET``) when a target's run did not end complete, or a level lacks an item's answers on
  either side, or a level has no item answered by both: the evidence is short. It wins over 1, as in
  ``exitcode.for_run``.
- 1 (``DRIFT``) when a candidate is worse at a level: graded items with ``good_to_bad`` above
  ``bad_to_good`` and the exact McNemar p under the level's share of α; ungraded items with a text
  the reference never gave, where the reference gave one text per item (a stable server: one new
  text fails), or, where it varies, new texts beyond its own spread (``rollout``'s ``new_texts_p``
  under that share); or, with ``min_agreement``, instead of both, their agreement under it; with
  ``fail_on_bad`` any ``good_to_bad``; with ``max_latency_regression`` R, the p50 latency ratio's 95
  % interval wholly above 1 + R.
- α is shared out over every test the gate makes (Bonferroni: candidates × levels), so a comparison
  of many levels does not fail by chance more often than one of one level: 20 comparisons of a
  server with a rebuild of itself that varies by chance fail about once at α 0.05, not once per
  level.

"""

from __future__ import annotations

from dataclasses import dataclass

from kevload.compare.rollout import Comparison, LevelComparison
from kevload.exits import ExitCode

COMPLETE = "complete"


@dataclass(frozen=True)
class GateRules:
    alpha: float = 0.05
    min_agreement: float | None = None
    fail_on_bad: bool = False
    max_latency_regression: float | None = None


@dataclass(frozen=True)
class GateResult:
    code: ExitCode
    lines: list[str]  # each finding, ``<candidate> <level>: <what>``; none when the gate held
    alpha_per_test: float


def gate(comparison: Comparison, rules: GateRules = GateRules()) -> GateResult:
    """The code and the findings of ``comparison`` under ``rules`` (this module's rule)."""
    tests = max(1, sum(len(c.levels) for c in comparison.candidates))
    alpha = rules.alpha / tests
    short: list[str] = []
    worse: list[str] = []
    if comparison.reference_state not in (None, COMPLETE):
        short.append(f"{comparison.reference}: run ended {comparison.reference_state}")
    for candidate in comparison.candidates:
        if candidate.state not in (None, COMPLETE):
            short.append(f"{candidate.name}: run ended {candidate.state}")
        for level in candidate.levels:
            where = f"{candidate.name} {level.mode}/{level.label}"
            short += [f"{where}: {line}" for line in _short(level)]
            worse += [f"{where}: {line}" for line in _worse(level, rules, alpha)]
    code = ExitCode.TARGET if short else ExitCode.DRIFT if worse else ExitCode.OK
    return GateResult(code=code, lines=short + worse, alpha_per_test=alpha)


def _short(level: LevelComparison) -> list[str]:
    if level.items == 0:
        return ["no item answered by both targets (evidence short)"]
    if level.items_missing:
        shown = ", ".join(level.items_missing[:3]) + (", …" if len(level.items_missing) > 3 else "")
        return [f"{len(level.items_missing)} item(s) without answers on one side: {shown}"]
    return []


def _worse(level: LevelComparison, rules: GateRules, alpha: float) -> list[str]:
    out = []
    p = level.mcnemar_p
    if p is not None and level.good_to_bad > level.bad_to_good and p < alpha:
        out.append(
            f"answers made wrong: {level.good_to_bad} good→bad against {level.bad_to_good} "
            f"bad→good (McNemar p {p:.3g} < {alpha:.3g})"
        )
    elif rules.fail_on_bad and level.good_to_bad:
        out.append(f"answers made wrong: {level.good_to_bad} good→bad (--fail-on bad)")
    if level.ungraded:
        out += _texts(level, rules, alpha)
    ci = level.latency.get("latency_p50_ratio_ci95")
    limit = rules.max_latency_regression
    if limit is not None and ci is not None and ci[0] > 1 + limit:
        out.append(
            f"slower: p50 latency ratio {level.latency['latency_p50_ratio']:.2f} "
            f"(95% [{ci[0]:.2f}, {ci[1]:.2f}]) above 1 + {limit:g}"
        )
    return out


def _texts(level: LevelComparison, rules: GateRules, alpha: float) -> list[str]:
    share = level.ungraded_agreement
    if rules.min_agreement is not None:
        if share is not None and share < rules.min_agreement:
            return [f"ungraded agreement {share:.1%} < --min-agreement {rules.min_agreement:.1%}"]
        return []
    if not level.new_texts:
        return []
    p = level.new_texts_p
    if p is None:
        return [
            f"ungraded answers differ: {level.new_texts} sample(s) with texts the reference, "
            "stable on every item, never gave"
        ]
    if p < alpha:
        return [
            f"ungraded answers differ: {level.new_texts} sample(s) with texts the reference never "
            f"gave, beyond its own spread (p {p:.3g} < {alpha:.3g})"
        ]
    return []
