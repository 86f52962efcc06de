"""The gates: the one place each command's result is mapped to its exit code
(``kevload.exits.ExitCode``), so the CLI holds no policy. Each gate decides from everything it saw,
not only from what matched; its rule is the docstring of its function here (``for_run`` with a
baseline, ``for_rerun``, ``for_sweep``), and docs/nightly.md's "Gates: what each exit code means"
says the same. Every gate exits 2, before anything is sent, for an input it cannot read typed (a
baseline, a case file, a grid): the message names the file and the key."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from kevload.exits import ExitCode as ExitCode  # re-exported: demo names it `exitcode.ExitCode`
from kevload.inputs.wordsets import SweepVerdict, Verdict
from kevload.records.summary import RunSummary

# inconclusive (a probe cell has fewer ok samples than asked) is no pass: the target did not give
# the evidence.
_FOR_VERDICT: Mapping[Verdict, ExitCode] = {
    "deterministic": ExitCode.OK,
    "nondeterministic": ExitCode.DRIFT,
    "target_failed": ExitCode.TARGET,
    "inconclusive": ExitCode.TARGET,
}


def for_summary(summary: RunSummary) -> ExitCode:
    """The verdict's code; otherwise DRIFT when a probe cell is under load.min_slo_attainment
    (TARGET stays)."""
    code = _FOR_VERDICT[summary.verdict]
    if code != ExitCode.TARGET and summary.grade_errors:
        # A user's grader failed: bad input, found late. Fixed, `kevload report` grades the same
        # records again.
        return ExitCode.USAGE
    return (
        ExitCode.DRIFT
        if code == ExitCode.OK and (summary.slo_failed_cells or summary.good_share_failed_cells)
        else code
    )


def for_run(
    summary: RunSummary,
    *,
    fail_on: Literal["drift", "latent", "bad"] = "drift",
    regressions: int | None = None,
) -> ExitCode:
    """``kevload run``: ``for_summary``; with ``fail_on`` latent, latent drift is DRIFT too and a
    cell where ok samples came without logprobs TARGET (latent drift neither shown nor ruled out);
    with ``fail_on`` bad, drift is DRIFT only where load made an answer worse
    (kevload.compare.graded), or the warm prefix cache did (kevload.compare.coldwarm).

    ``kevload run --baseline`` (``regressions``: the changes ``baseline.compare_to_baseline`` calls
    regressions; None without a baseline): TARGET when the run itself is (target failed,
    inconclusive, or a logprob gap under ``fail_on`` latent); USAGE when a grader raised; else DRIFT
    when a regression or a cell under the SLO or load.min_good_share; else OK. Drift the baseline
    had too is no news for a nightly job. A regression is, per probe cell matched by probe, mode and
    level: new drift (new latent drift), an output never seen in the baseline, p50 e2e/TTFT slower
    than allowed, a baseline cell missing; and, where the baseline has nothing to hold the cell
    against — a cell it lacks (``new_cell``), one whose input, params or max_tokens changed
    (``input_changed``), one where it had no ok sample — whatever fails the run's own rule (drift;
    latent drift too under ``fail_on`` latent). Under ``fail_on`` bad the drift kinds count only in
    a cell whose answers load turned bad (``kevload.outputs.baseline``)."""
    code = for_summary(summary)
    if fail_on == "latent" and code == ExitCode.OK and summary.latent_cells:
        code = ExitCode.DRIFT
    elif fail_on == "latent" and code == ExitCode.OK and summary.logprob_gap_cells:
        code = ExitCode.TARGET
    elif fail_on == "bad" and code == ExitCode.DRIFT:
        # Only answers load made worse fail: an answer graded bad where serial was all good, a level
        # whose accuracy fell significantly, or a gate; drift whose answers stay good passes.
        worse = summary.bad_cells or summary.accuracy_fell_levels or summary.warm_bad_probes
        code = (
            ExitCode.DRIFT
            if worse or summary.slo_failed_cells or summary.good_share_failed_cells
            else ExitCode.OK
        )
    # A baseline excuses only the drift it had too: a grader that raised (USAGE) and a cell under a
    # gate of the run's own (the SLO, load.min_good_share) say nothing about drift, and stand as the
    # run itself would have them.
    if regressions is not None and code not in (ExitCode.TARGET, ExitCode.USAGE):
        gated = summary.slo_failed_cells or summary.good_share_failed_cells
        code = ExitCode.DRIFT if regressions or gated else ExitCode.OK
    return code


def for_sweep(
    verdicts: Iterable[SweepVerdict], against_reference: ExitCode | None = None
) -> ExitCode:
    """``kevload sweep``, from its rows' verdicts (one row per setting of the grid, none left out).
    TARGET if any setting is ``target_failed`` (its server did not get ready in time, exited, or
    stopped answering its readiness URL with 200 during or right after its run, or its run failed),
    ``inconclusive`` or ``not_run`` (a setting not measured gives no evidence); else DRIFT if any is
    ``nondeterministic``; else OK. A level under its SLO is no failure here: finding where it breaks
    is what a sweep is for. Bad input (the grid, the scenario, the server command, settings whose
    run directories would collide) is USAGE before any server starts. ``against_reference`` (with
    --reference: compare's gate over each setting against its reference setting) is TARGET when a
    paired run ended short, DRIFT when a setting is worse than its reference: each counts here as
    the same code from a row would."""
    seen = set(verdicts)
    if seen & {"target_failed", "inconclusive", "not_run"} or against_reference == ExitCode.TARGET:
        return ExitCode.TARGET
    drift = "nondeterministic" in seen or against_reference == ExitCode.DRIFT
    return ExitCode.DRIFT if drift else ExitCode.OK


def for_diagnosis(*, target_failed: bool, verdict: str) -> ExitCode:
    """``kevload diagnose``: TARGET when the target failed a step or the verdict is ``inconclusive``
    (too few ok samples: evidence short, as for a run), OK when the output is stable, DRIFT for any
    cause."""
    if target_failed or verdict == "inconclusive":
        return ExitCode.TARGET
    return ExitCode.OK if verdict == "stable" else ExitCode.DRIFT


def for_rerun(
    moves: Mapping[str, Sequence[str]],
    *,
    mismatched: Sequence[str],
    accepted: bool,
    grader_failed: Sequence[str] = (),
) -> ExitCode:
    """``cases rerun``: TARGET if a case got no answer; USAGE if a case's ``python:`` grader raised
    (bad input found late, as in ``for_run``: its answers are not graded, so "does not match
    expected" would be a guess); DRIFT if a stable case became unstable, one answers something else
    (``changed``, unless accepted) or an ``expected`` output is not met."""
    if moves["no answer"]:
        return ExitCode.TARGET
    if grader_failed:
        return ExitCode.USAGE
    changed = moves["changed"] and not accepted
    return ExitCode.DRIFT if moves["stable→unstable"] or changed or mismatched else ExitCode.OK


def for_demo(*, target_failed: bool) -> ExitCode:
    """``kevload demo``: TARGET if a target failed, else OK (drift is what the demo shows, not a
    failure)."""
    return ExitCode.TARGET if target_failed else ExitCode.OK
