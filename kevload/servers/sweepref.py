"""``kevload sweep --reference AXIS=VALUE``: each setting's answers paired item by item with those
of its reference setting — the same setting with AXIS at VALUE — and gated as ``kevload compare``
gates a candidate (docs/sweeps.md, "Against a reference setting").

Every setting's run directory is an ordinary run: it is read as a comparison's target is
(``comparing.read_side``) and paired by ``compare.rollout.compare_sides``, so the figures are
compare.json's. Each row of sweep.json gains ``against_reference`` (its reference and
compare.json's ``levels[]``) and ``accuracy`` (per level, over the graded items both answered);
sweep.json gains ``reference`` (the axis, value, rules, findings and the gate's code).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kevload.compare.gate import GateRules, gate
from kevload.compare.rollout import Comparison, LevelComparison, compare_sides
from kevload.errors import ScenarioError
from kevload.exits import ExitCode
from kevload.inputs.overrides import toml_value
from kevload.load.comparing import read_side
from kevload.servers.sweepgrid import Grid, label

# Axes that set the levels or the mode: a setting and its reference would have no level in common
# to pair items at (and a run already holds each level against its own serial answer).
UNPAIRED_AXES = ("load.concurrency", "load.rate", "load.mode")


@dataclass(frozen=True)
class Reference:
    """The reference setting's axis and value: a setting's reference is itself with AXIS at
    VALUE (every other axis as its own)."""

    axis: str
    value: Any

    @classmethod
    def parse(cls, spec: str, grid: Grid) -> Reference:
        """``AXIS=VALUE``; an axis the grid lacks, a value it does not sweep, or an axis that sets
        the levels is bad usage (``ScenarioError``, exit 2) naming it."""
        axis, sep, text = (part.strip() for part in spec.partition("="))
        axes = {**grid.server, **grid.scenario}
        if not sep or not axis or not text:
            raise ScenarioError(f"--reference {spec!r}: expected AXIS=VALUE (e.g. slots=1)")
        if axis not in axes:
            raise ScenarioError(
                f"--reference {axis}: not a --grid axis (axes: {', '.join(axes) or 'none'})"
            )
        if axis in UNPAIRED_AXES:
            raise ScenarioError(
                f"--reference {axis}: this axis sets the levels or the mode, so a setting and its "
                "reference share no level to pair items at; give a server axis or another key"
            )
        value = toml_value(text)
        known = {str(v): v for v in axes[axis]}
        if str(value) not in known:
            raise ScenarioError(
                f"--reference {axis}={text}: {axis} is swept over "
                f"{', '.join(map(str, axes[axis]))}, not {text}"
            )
        if len(axes[axis]) < 2:
            raise ScenarioError(
                f"--reference {axis}: the axis has one value, so no setting differs from it"
            )
        return cls(axis=axis, value=known[str(value)])

    def of(self, row: dict[str, Any]) -> str:
        """The label of a row's reference setting (its axes in the grid's order, as ``label``)."""
        return label({**row["server"], **row["scenario"]} | {self.axis: self.value})


def judge(
    rows: list[dict[str, Any]], reference: Reference, rules: GateRules
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every row that ran, paired with its reference setting's run; the rows with
    ``against_reference`` and ``accuracy`` added, and sweep.json's ``reference``. α is shared out
    over every setting × level compared in the sweep (Bonferroni, as compare's gate does)."""
    by_label = {row["setting"]: row for row in rows}
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(reference.of(row), []).append(row)
    comparisons = [
        comparison
        for ref_label, members in groups.items()
        if (comparison := _compare(by_label[ref_label], members)) is not None
    ]
    tests = max(1, sum(map(_tests, comparisons)))
    # The gate shares the α it is given over its own comparison's tests: giving each reference's
    # comparison its part of α leaves every test of the sweep α / tests.
    results = [
        gate(cmp, dataclasses.replace(rules, alpha=rules.alpha * _tests(cmp) / tests))
        for cmp in comparisons
    ]
    against = {c.name: (cmp.reference, c.levels) for cmp in comparisons for c in cmp.candidates}
    reference_levels = {cmp.reference: cmp.candidates[0].levels for cmp in comparisons}
    out = [_judged(row, reference, against, reference_levels) for row in rows]
    code = _code([r.code for r in results])
    return out, {
        "axis": reference.axis,
        "value": reference.value,
        "rules": {
            "alpha": rules.alpha,
            "min_agreement": rules.min_agreement,
            "fail_on_bad": rules.fail_on_bad,
        },
        "alpha_per_test": rules.alpha / tests,
        "findings": [line for r in results for line in r.lines],
        "code": int(code),
    }


def _tests(comparison: Comparison) -> int:
    return sum(len(c.levels) for c in comparison.candidates)


def _compare(ref_row: dict[str, Any], members: Sequence[dict[str, Any]]) -> Comparison | None:
    """The settings of one reference against it (None: the reference has no run, or no other
    setting of its group has one; ``exitcode.for_sweep`` already fails a setting without a run)."""
    others = [m for m in members if m is not ref_row and m.get("run")]
    if not ref_row.get("run") or not others:
        return None
    sides = [
        # The sweep's own runs, made by this process from the user's scenario: its graders are
        # imported as a run's are.
        read_side(row["setting"], Path(row["run"]), trust_graders=True)
        for row in (ref_row, *others)
    ]
    return compare_sides(sides, ref_row["setting"])


def _judged(
    row: dict[str, Any],
    reference: Reference,
    against: dict[str, tuple[str, list[LevelComparison]]],
    reference_levels: dict[str, list[LevelComparison]],
) -> dict[str, Any]:
    name = row["setting"]
    if name in reference_levels:
        accuracy = {_name(lv): lv.accuracy_reference for lv in reference_levels[name]}
        return {**row, **_accuracy(accuracy), "against_reference": {"reference": name}}
    if name not in against:
        # No run of its own, or its reference has none: nothing paired (the gate already says 3).
        return {**row, "against_reference": {"reference": reference.of(row), "levels": []}}
    ref_label, levels = against[name]
    accuracy = {_name(lv): lv.accuracy_candidate for lv in levels}
    return {
        **row,
        **_accuracy(accuracy),
        "against_reference": {
            "reference": ref_label,
            "levels": [{"level": _name(lv), **lv.to_json()} for lv in levels],
        },
    }


def _accuracy(by_level: dict[str, float | None]) -> dict[str, Any]:
    """``accuracy`` only where some level has graded items."""
    return {"accuracy": by_level} if any(v is not None for v in by_level.values()) else {}


def _name(level: LevelComparison) -> str:
    """``c=4``; ``mixed/c=4`` in another mode than single (compare's table's spelling)."""
    return level.label if level.mode == "single" else f"{level.mode}/{level.label}"


def _code(codes: Sequence[ExitCode]) -> ExitCode:
    if ExitCode.TARGET in codes:
        return ExitCode.TARGET
    return ExitCode.DRIFT if ExitCode.DRIFT in codes else ExitCode.OK
