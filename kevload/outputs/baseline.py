"""Nightly comparison of a run against an earlier one: new drift, unseen outputs, slower latency.

The rule, cell by cell (probe cells, matched by probe id, mode and level; ``exitcode.for_run`` turns
the regressions into the exit code, and its docstring states the whole gate):

- a cell the baseline lacks is ``new_cell``: nothing to hold it against, so it is judged by the
  run's own rule alone — drift there (latent drift too, under ``--fail-on latent``) is a regression,
  a cell that held is a note;
- a cell whose probe asked something else than in the baseline (its input, params or max_tokens, by
  the hashes both summaries record) is ``input_changed``: the baseline's outputs and latencies
  answered another question, so nothing is held against them and nothing is blamed on the model or
  server; like a new cell, drift there is a regression;
- a baseline cell without an ok sample observed nothing: the cell is judged as a new one, and said
  so;
- otherwise: new drift, new latent drift and an output never seen in the baseline are regressions,
  drift or latent drift gone is an improvement (``fixed``);
- latency, over the whole run (``runlatency``): the ok probe samples of the cells compared, this
  run's over the baseline's, as p50 and p99 e2e and p50 TTFT ratios with their bootstrap intervals;
  one ``latency`` regression where a p50 ratio's interval lies wholly above 1 +
  ``max_latency_regression``; each cell's slower p50 a note (shown with ``--verbose``), or, where
  the baseline's records are not at hand, each a regression;
- a baseline cell this run lacks is ``missing_cell``, a regression;
- per level, over the probes graded in both runs that ask the same, each by the same grader: a probe
  good there in the baseline (every answer graded good) and bad now is ``accuracy_lost``, a
  regression whatever the McNemar p over the paired probes, which the line states: the same question
  answered right before and wrong now is the change a nightly job exists to catch, and a fall too
  small to be significant over few probes is still a right answer lost. Probes that only went
  bad→good are ``accuracy_gained``, an improvement;
- a probe graded in both runs whose grading changed (``expected``, ``grade`` or ``grade_tolerance``:
  fixing a wrong ``expected``) asks the server the same, so its outputs, drift and latency are
  compared as ever; but a grade by another rule is no evidence about the server, so it is paired
  with nothing: ``grading_changed``, a note.

Under ``--fail-on bad`` the drift kinds (new drift, new latent drift, an unseen output, a new or
changed cell that drifts) are regressions only in a cell whose answers load made worse
(``flips_good_to_bad``), as the run's own rule has it: the gate "fail only when answers get worse"
does not fail on a reworded right answer because a baseline is given. Latency, a missing cell and
``accuracy_lost`` stay regressions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kevload.compare.coldwarm import base_probe
from kevload.compare.graded import probe_grade
from kevload.compare.stats import mcnemar_exact
from kevload.exits import ExitCode
from kevload.inputs.probe import UNGRADED
from kevload.outputs import exitcode
from kevload.outputs.runlatency import run_load, whole_run_latency
from kevload.records.rundir import RunDir, read_summary
from kevload.records.summary import (
    CellSummary,
    RunSummary,
    level_label,
    level_order,
    position_label,
)

LATENCY_METRICS = ("e2e", "ttft")
# What changed in a cell against the baseline.
ChangeKind = Literal[
    "new_drift",
    "new_latent_drift",
    "unseen_output",
    "latency",
    "missing_cell",
    "new_cell",
    "input_changed",
    "fixed",
    "accuracy_lost",
    "accuracy_gained",
    "grading_changed",
    "warm_turned_bad",
]
FailOn = Literal["drift", "latent", "bad"]


@dataclass(frozen=True)
class Change:
    kind: ChangeKind
    cell: str
    detail: str
    regression: bool = True

    @property
    def label(self) -> str:
        """How the line starts: REGRESSION, improved (``fixed``) or note (a new or changed cell that
        held)."""
        return (
            "REGRESSION"
            if self.regression
            else "improved"
            if self.kind in ("fixed", "accuracy_gained")
            else "note"
        )


def load_baseline(path: Path) -> RunSummary:
    """A run directory or a summary.json file, from this version or an older one, read typed
    (``rundir.read_summary``): a key that does not fit its field, or one every summary has that is
    missing, is a ``RunDirError`` naming the file and the key, before anything is sent."""
    return read_summary(RunDir(path).summary_json if path.is_dir() else path, "--baseline: ")


def judge(
    current: RunSummary,
    baseline: RunSummary,
    *,
    name: str,
    max_latency_regression: float = 0.2,
    fail_on: FailOn = "drift",
    run_dir: Path | None = None,
    baseline_path: Path | None = None,
    verbose: bool = False,
) -> tuple[list[str], ExitCode]:
    """The ``--baseline`` gate: the lines it prints and its exit code (``exitcode.for_run``). A run
    whose target failed or gave too little evidence is compared with nothing: it exits TARGET on its
    own. With ``run_dir`` and ``baseline_path`` (this run's directory, ``--baseline``) latency is
    judged once, on the whole run's ratio (``_whole_run``); the per-cell latency lines are then
    notes, shown with ``verbose``."""
    if exitcode.for_summary(current) == ExitCode.TARGET:
        return [], exitcode.for_run(current, fail_on=fail_on)
    run_dirs = None if run_dir is None or baseline_path is None else (run_dir, baseline_path)
    whole = _whole_run(current, baseline, run_dirs, max_latency_regression)
    changes = compare_to_baseline(
        current,
        baseline,
        max_latency_regression=max_latency_regression,
        fail_on=fail_on,
        latency_per_cell=whole is None,
    )
    changes += [whole] if whole is not None else []
    regressions = sum(c.regression for c in changes)
    lines = [
        f"{c.label} {c.kind} {c.cell}: {c.detail}"
        for c in changes
        if verbose or c.regression or c.kind != "latency" or c.cell == WHOLE_RUN
    ]
    lines.append(f"against baseline {name}: {regressions} regression(s)")
    return lines, exitcode.for_run(current, fail_on=fail_on, regressions=regressions)


WHOLE_RUN = "whole run"  # the cell a whole-run latency line names


def _whole_run(
    current: RunSummary, baseline: RunSummary, run_dirs: tuple[Path, Path] | None, limit: float
) -> Change | None:
    """Latency over the whole run against the baseline: the ok probe samples of the cells compared
    with the baseline's (in both, the baseline's with an ok sample, the input unchanged), read from
    both runs' records. None where either has no records to read (a summary.json given alone):
    latency is then judged cell by cell, on the p50s the summaries keep."""
    if run_dirs is None:
        return None
    old = {_key(c): c for c in baseline.probe_cells()}
    cells = {
        _key(c)
        for c in current.probe_cells()
        if _key(c) in old and old[_key(c)].ok and not _input_change(current, baseline, c.probe)
    }
    now, then = (run_load(path, cells) for path in run_dirs)
    if now is None or then is None:
        return None
    text, slower = whole_run_latency(now, then, limit)
    return Change("latency", WHOLE_RUN, text, regression=slower)


def compare_to_baseline(
    current: RunSummary,
    baseline: RunSummary,
    *,
    max_latency_regression: float = 0.2,
    fail_on: FailOn = "drift",
    latency_per_cell: bool = True,
) -> list[Change]:
    """What changed, cell by cell (probe cells only), by the rule above. An unchanged server asked
    the same gives an empty list. Without ``latency_per_cell`` a cell's slower p50 is a note, not a
    regression (the whole run's ratio judges latency)."""
    old = {_key(c): c for c in baseline.probe_cells()}
    against = _Against(
        current,
        baseline,
        fail_on,
        max_latency_regression,
        _seen_by_probe(old),
        latency_per_cell,
    )
    changes: list[Change] = []
    for cell in current.probe_cells():
        changes += _cell_changes(cell, old.get(_key(cell)), against)
    current_keys = {_key(c) for c in current.probe_cells()}
    changes += [
        Change("missing_cell", before.name, "in the baseline but not in this run")
        for key, before in old.items()
        if key not in current_keys
    ]
    return changes + accuracy_changes(current, baseline) + warm_changes(current, baseline)


def warm_changes(current: RunSummary, baseline: RunSummary) -> list[Change]:
    """Probes whose warm answers the prefix cache turned bad (``warm_bad_probes``) where the
    baseline's did not: an answer made wrong is news under any rule, and the cold/warm pairing is
    the run's own, so the baseline excuses only the probes it had turn bad too."""
    before = set(baseline.warm_bad_probes or ())
    return [
        Change(
            "warm_turned_bad",
            probe,
            "the warm prefix cache turned its answer bad (its round's cold answer good); "
            "the baseline's warm answers stayed good",
        )
        for probe in current.warm_bad_probes or ()
        if probe not in before
    ]


@dataclass(frozen=True)
class _Against:
    """What every cell is judged against: both runs, the gate's settings, and the outputs the
    baseline saw per probe and mode."""

    current: RunSummary
    baseline: RunSummary
    fail_on: FailOn
    max_latency_regression: float
    seen_by_probe: dict[tuple[str, str], set[str]]
    latency_per_cell: bool

    @property
    def fresh_inputs(self) -> bool:
        """Under load.prefix_cache's marker each run's rounds open with their own run id: other
        inputs than the baseline's, whose answers were never to be seen there."""
        return any(
            (s.prefix_cache or {}).get("method") == "marker" for s in (self.current, self.baseline)
        )


def _seen_by_probe(
    old: dict[tuple[str, str, int, float | None], CellSummary],
) -> dict[tuple[str, str], set[str]]:
    """ "Seen in the baseline" means at any level of the same probe and mode: a fixed level that
    returns to the serial output has not produced anything new."""
    seen: dict[tuple[str, str], set[str]] = {}
    for c in old.values():
        seen.setdefault((c.probe, c.mode), set()).update(c.output_hashes)
    return seen


def _cell_changes(cell: CellSummary, before: CellSummary | None, against: _Against) -> list[Change]:
    """One cell's changes: judged alone where the baseline has nothing to hold it against (a new
    cell, a changed input, a baseline cell without an ok sample), else its drift, latent drift,
    outputs and latency against the baseline cell's."""
    fail_on = against.fail_on
    if before is None:
        return [_judged_alone(cell, fail_on, "new_cell", "new cell (not in the baseline)")]
    changed = _input_change(against.current, against.baseline, cell.probe)
    if changed:
        why = f"input changed: {changed} (outputs and latency not compared with the baseline's)"
        return [_judged_alone(cell, fail_on, "input_changed", why)]
    if not before.ok:
        if not _fails_alone(cell, fail_on):
            return []
        words = f"{_drift_words(cell, fail_on)}; the baseline had no ok sample here"
        return [Change("new_drift", cell.name, words)]
    found = [
        _drift_change(cell, before, fail_on),
        _latent_change(cell, before, fail_on),
        _unseen_change(cell, before, against),
    ]
    return [c for c in found if c is not None] + _latency_changes(
        cell, before, against.max_latency_regression, gate=against.latency_per_cell
    )


def _drift_change(cell: CellSummary, before: CellSummary, fail_on: FailOn) -> Change | None:
    """New drift (a regression under ``fail_on``), or drift gone (``fixed``)."""
    if cell.drift and not before.drift:
        return Change(
            "new_drift",
            cell.name,
            f"{cell.distinct} distinct in {cell.ok} "
            f"(baseline: 1 in {before.ok}), first divergence at "
            f"{position_label(char=cell.first_divergence_chars)}" + _cuts_clause(cell, before),
            regression=_worse(cell, fail_on),
        )
    if before.drift and not cell.drift and cell.ok:
        return Change(
            "fixed",
            cell.name,
            f"one output in {cell.ok} (baseline: {before.distinct} distinct)"
            + _cuts_clause(before, cell),
            regression=False,
        )
    return None


def _latent_change(cell: CellSummary, before: CellSummary, fail_on: FailOn) -> Change | None:
    """New latent drift, or latent drift gone. Latent drift is news only against a baseline whose
    logprobs were compared and had none; a cell whose logprobs now cover only some samples is no
    change by itself, and latent drift among those it covers is still latent drift."""
    if (
        cell.latent_drift
        and before.logprob_samples
        and not before.latent_drift
        and not before.drift
    ):
        then = (
            f"bitwise equal in {before.logprob_samples} samples"
            if before.logprob_bitwise
            else f"no logprob claim, logprobs in {before.logprob_samples} of {before.ok}, "
            "those equal"
        )
        return Change(
            "new_latent_drift",
            cell.name,
            f"same text as serial, logprobs differ from "
            f"{position_label(token=cell.first_logprob_divergence_token)} (baseline: "
            f"{then})",
            regression=fail_on != "bad",
        )
    if before.latent_drift and cell.logprob_bitwise and not cell.drift:
        return Change(
            "fixed",
            cell.name,
            f"logprobs bitwise equal to serial in {cell.logprob_samples} "
            "samples (baseline: latent drift)",
            regression=False,
        )
    return None


def _unseen_change(cell: CellSummary, before: CellSummary, against: _Against) -> Change | None:
    """Outputs the baseline never saw for this probe and mode. A cell that drifted then and drifts
    now draws new outputs every night: that is the known drift, not a changed model (a changed model
    shows in the cells that were stable, the serial one first)."""
    seen = against.seen_by_probe.get((cell.probe, cell.mode), set())
    unseen = [h for h in cell.output_hashes if h not in seen]
    known_drift = before.drift and cell.drift
    if not seen or not unseen or known_drift or against.fresh_inputs:
        return None
    unknown = (
        ""
        if against.baseline.inputs is not None
        else " (the baseline does not record its inputs: a changed input would read the same)"
    )
    return Change(
        "unseen_output",
        cell.name,
        f"{len(unseen)} output(s) never seen in the baseline: the model or server changed{unknown}",
        regression=_worse(cell, against.fail_on),
    )


def _latency_changes(
    cell: CellSummary, before: CellSummary, limit: float, *, gate: bool
) -> list[Change]:
    """The cell's p50 latencies grown beyond ``limit`` against the baseline cell's: regressions
    where ``gate``, else notes."""
    changes = []
    for metric in LATENCY_METRICS:
        now, was = (c.latency.get(metric, {}).get("p50") for c in (cell, before))
        if now and was and now > was * (1 + limit):
            changes.append(
                Change(
                    "latency",
                    cell.name,
                    f"{metric} p50 {now * 1000:.1f} ms vs {was * 1000:.1f} ms "
                    f"(+{now / was - 1:.0%}, limit +{limit:.0%})",
                    regression=gate,
                )
            )
    return changes


def accuracy_changes(current: RunSummary, baseline: RunSummary) -> list[Change]:
    """Per mode and level, the graded probes of both runs paired by probe (those asking the same in
    both, graded by the same rule): a probe good in the baseline and bad now makes
    ``accuracy_lost``, a regression; only bad→good makes ``accuracy_gained``. A probe graded in both
    by another rule is a ``grading_changed`` note, paired with nothing. Nothing where no probe
    changed grade (a run without graded probes included)."""
    then: dict[tuple[str, str, int, float | None], bool] = {}
    for c in baseline.probe_cells():
        if (grade := probe_grade(c)) is not None:
            then[_key(c)] = grade
    pairs: dict[tuple[str, int, float | None], list[tuple[bool, bool]]] = {}
    regraded: set[str] = set()
    for c in current.probe_cells():
        now = probe_grade(c)
        if now is None or _key(c) not in then or _input_change(current, baseline, c.probe):
            continue
        if _grading_changed(current, baseline, c.probe):
            regraded.add(c.probe)
            continue
        pairs.setdefault((c.mode, c.concurrency, c.rate), []).append((then[_key(c)], now))
    changes = _regraded(regraded)
    for (mode, concurrency, rate), graded in sorted(
        pairs.items(), key=lambda kv: (kv[0][0], level_order(*kv[0][1:]))
    ):
        lost = sum(1 for was, now in graded if was and not now)
        gained = sum(1 for was, now in graded if now and not was)
        if not lost and not gained:
            continue
        n = len(graded)
        before, after = sum(was for was, _ in graded), sum(now for _, now in graded)
        detail = (
            f"accuracy {before / n:.1%} → {after / n:.1%} over {n} probes graded in both ({before} "
            f"→ {after} "
            f"good): {lost} good→bad, {gained} bad→good against the baseline, McNemar p "
            f"{mcnemar_exact(lost, gained):.3g}"
        )
        changes.append(
            Change(
                "accuracy_lost" if lost else "accuracy_gained",
                f"{mode}/{level_label(concurrency, rate)}",
                detail,
                regression=bool(lost),
            )
        )
    return changes


def _regraded(probes: set[str]) -> list[Change]:
    """A ``grading_changed`` note per probe graded by another rule than in the baseline."""
    return [
        Change(
            "grading_changed",
            probe,
            "graded by another rule than in the baseline (expected, grade or "
            "grade_tolerance changed): its grades are not paired with the baseline's, so no "
            "accuracy is "
            "lost or gained by them; its outputs are compared as before",
            regression=False,
        )
        for probe in sorted(probes)
    ]


def _fails_alone(cell: CellSummary, fail_on: FailOn) -> bool:
    """Whether the cell fails the run's own rule, with no baseline: drift, latent drift under
    --fail-on latent, an answer load made worse under --fail-on bad."""
    if fail_on == "bad":
        return bool(cell.flips_good_to_bad)
    return cell.drift or (fail_on == "latent" and bool(cell.latent_drift))


def _worse(cell: CellSummary, fail_on: FailOn) -> bool:
    """Whether a change in the cell's outputs counts under ``fail_on``: always, but under --fail-on
    bad only where load turned an answer bad."""
    return fail_on != "bad" or bool(cell.flips_good_to_bad)


def _drift_words(cell: CellSummary, fail_on: FailOn) -> str:
    if cell.drift:
        return (
            f"{cell.distinct} distinct in {cell.ok}, first divergence at "
            f"{position_label(char=cell.first_divergence_chars)}"
        )
    if fail_on == "latent" and cell.latent_drift:
        return (
            f"same text as serial, logprobs differ from "
            f"{position_label(token=cell.first_logprob_divergence_token)}"
        )
    return f"held: one output in {cell.ok}"


def _judged_alone(cell: CellSummary, fail_on: FailOn, kind: ChangeKind, why: str) -> Change:
    """A cell with nothing in the baseline to hold it against: a regression when it fails the run's
    own rule."""
    return Change(
        kind,
        cell.name,
        f"{why}; {_drift_words(cell, fail_on)}",
        regression=_fails_alone(cell, fail_on),
    )


def _input_change(current: RunSummary, baseline: RunSummary, probe: str) -> str:
    """What the probe asks that it did not in the baseline ("the prompt or messages, max_tokens 16 →
    32"); "" when it asks the same, or when either run did not record it (a run from before inputs
    were recorded)."""
    now, then = (_inputs_of(s, probe) for s in (current, baseline))
    if now is None or then is None:
        return ""
    parts = []
    if now.get("input") != then.get("input"):
        # A summary from before the grading was hashed apart hashed it with the input: where either
        # run grades the probe, which of the two changed cannot be told.
        lumped = "grading" not in then and (
            now.get("grading", UNGRADED) != UNGRADED or _graded_in(baseline, probe)
        )
        parts.append(
            "the prompt, messages or grading (the baseline hashed them as one)"
            if lumped
            else "the prompt or messages"
        )
    if now.get("params") != then.get("params"):
        parts.append("params")
    if now.get("max_tokens") != then.get("max_tokens"):
        parts.append(f"max_tokens {then.get('max_tokens')} → {now.get('max_tokens')}")
    return ", ".join(parts)


def _grading_changed(current: RunSummary, baseline: RunSummary, probe: str) -> bool:
    """Whether the probe is graded by another rule than in the baseline (False where either run did
    not record it)."""
    now, then = (_inputs_of(s, probe) or {} for s in (current, baseline))
    return "grading" in now and "grading" in then and now["grading"] != then["grading"]


def _graded_in(summary: RunSummary, probe: str) -> bool:
    return any(probe_grade(c) is not None for c in summary.probe_cells() if c.probe == probe)


def _inputs_of(summary: RunSummary, probe: str) -> dict[str, str | int] | None:
    """The probe's recorded inputs; a marker round (``p1@r0``, load.prefix_cache) asks what its
    probe asks."""
    if summary.inputs is None:
        return None
    return summary.inputs.get(base_probe(probe, (summary.prefix_cache or {}).get("method", "")))


def _cuts_clause(drifted: CellSummary, held: CellSummary) -> str:
    """Where the one of a pair of runs that drifted at a level had cancellations there
    (``load.cancel_share``) and the one that held had none: the same level without them is the
    evidence (``--set load.cancel_share=0``)."""
    if not drifted.cancelled or held.cancelled:
        return ""
    return (
        f"; probe drifted only in levels with cancellations: ✂{drifted.cancelled} where it "
        f"drifted, none where "
        "it held"
    )


def _key(cell: CellSummary) -> tuple[str, str, int, float | None]:
    return (cell.probe, cell.mode, cell.concurrency, cell.rate)
