"""Exit codes, which CI depends on: the one ``ExitCode`` enum and the one place each command's result is mapped
to it, so the CLI holds no policy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import IntEnum
from typing import Literal

from kevload.summary import RunSummary
from kevload.words import Verdict


class ExitCode(IntEnum):
    OK = 0            # everything held
    DRIFT = 1         # nondeterminism found, a regression against a baseline, a level under its SLO
    USAGE = 2         # bad usage or a bad scenario (errors.InputError)
    TARGET = 3        # the target failed, or gave too little evidence to say (inconclusive)
    INTERRUPTED = 130  # SIGINT, once what was collected is written
    TERMINATED = 143  # SIGTERM, likewise


# inconclusive (a probe cell has fewer ok samples than asked) is no pass: the target did not give the evidence.
_FOR_VERDICT: Mapping[Verdict, ExitCode] = {"deterministic": ExitCode.OK, "nondeterministic": ExitCode.DRIFT,
                                            "target_failed": ExitCode.TARGET, "inconclusive": ExitCode.TARGET}


def for_summary(summary: RunSummary) -> ExitCode:
    """The verdict's code; otherwise DRIFT when a probe cell is under load.min_slo_attainment (TARGET stays)."""
    code = _FOR_VERDICT[summary.verdict]
    if code != ExitCode.TARGET and summary.grade_errors:
        # A user's grader failed: bad input, found late. Fixed, `kevload report` grades the same records again.
        return ExitCode.USAGE
    return ExitCode.DRIFT if code == ExitCode.OK and (summary.slo_failed_cells or summary.good_share_failed_cells) \
        else code


def for_run(summary: RunSummary, *, fail_on: Literal["drift", "latent", "bad"] = "drift",
            regressions: int | None = None) -> ExitCode:
    """``kevload run``: ``for_summary``; with ``fail_on`` latent, latent drift is DRIFT too and a cell where ok
    samples came without logprobs TARGET (latent drift neither shown nor ruled out); with ``fail_on`` bad, drift is
    DRIFT only where load made an answer worse (kevload.graded). Against a baseline
    (``regressions``: the changes that are regressions; None without one) drift the baseline had too is no news
    for a nightly job: only regressions and the SLO decide, unless the target failed."""
    code = verdict_code = for_summary(summary)
    if fail_on == "latent" and code == ExitCode.OK and summary.latent_cells:
        code = ExitCode.DRIFT
    elif fail_on == "latent" and code == ExitCode.OK and summary.logprob_gap_cells:
        code = ExitCode.TARGET
    elif fail_on == "bad" and code == ExitCode.DRIFT:
        # Only answers load made worse fail: an answer graded bad where serial was all good, a level whose accuracy
        # fell significantly, or a gate; drift whose answers stay good passes.
        worse = summary.bad_cells or summary.accuracy_fell_levels
        code = ExitCode.DRIFT if worse or summary.slo_failed_cells or summary.good_share_failed_cells else ExitCode.OK
    if regressions is not None and verdict_code != ExitCode.TARGET:
        code = ExitCode.DRIFT if regressions or summary.slo_failed_cells else ExitCode.OK
    return code


def for_sweep(verdicts: Iterable[Verdict]) -> ExitCode:
    """A sweep: TARGET if any setting's target failed or was inconclusive, else DRIFT if any drifted."""
    seen = set(verdicts)
    if seen & {"target_failed", "inconclusive"}:
        return ExitCode.TARGET
    return ExitCode.DRIFT if "nondeterministic" in seen else ExitCode.OK


def for_diagnosis(*, target_failed: bool, verdict: str) -> ExitCode:
    """``kevload diagnose``: TARGET when the target failed a step, OK when the output is stable, DRIFT for any cause."""
    if target_failed:
        return ExitCode.TARGET
    return ExitCode.OK if verdict == "stable" else ExitCode.DRIFT


def for_rerun(moves: Mapping[str, Sequence[str]], *, mismatched: Sequence[str], accepted: bool) -> ExitCode:
    """``cases rerun``: TARGET if a case got no answer; DRIFT if a stable case became unstable, one answers
    something else (``changed``, unless accepted) or an ``expected`` output is not met."""
    if moves["no answer"]:
        return ExitCode.TARGET
    changed = moves["changed"] and not accepted
    return ExitCode.DRIFT if moves["stable→unstable"] or changed or mismatched else ExitCode.OK


def for_demo(*, target_failed: bool) -> ExitCode:
    """``kevload demo``: TARGET if a target failed, else OK (drift is what the demo shows, not a failure)."""
    return ExitCode.TARGET if target_failed else ExitCode.OK
