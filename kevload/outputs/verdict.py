"""A run's verdict and SLO lines: one sentence each, with the sample size behind it, that a person
or a CI log can act on; and the probe cells asked for that have no sample."""

from __future__ import annotations

from kevload.outputs.celltext import (
    cell_phrase,
    counts_text,
    kinds_text,
    logprob_gap_text,
    sample_noun,
    short_text,
    slo_bounds_text,
    slo_cell_text,
)
from kevload.records.summary import CellSummary, RunSummary, label_of, position_label


def missing_texts(summary: RunSummary) -> list[str]:
    """``p1 (single) c=4: no counted sample (the run was stopped before one was answered)``: each
    probe cell the run asked for that has none, and why, as far as the run says."""
    if summary.state in ("interrupted", "aborted"):
        how = "stopped" if summary.state == "interrupted" else "aborted"
        why = f" (the run was {how} before one was answered)"
    elif summary.samples_asked is None:
        why = " (none was sent and answered within load.duration)"
    else:
        why = ""
    return [f"{label_of(name)}: no counted sample{why}" for name in summary.missing_cells or ()]


_VERDICT_CELLS = 10  # drifting cells the verdict line names


def verdict_line(summary: RunSummary) -> str:
    """One sentence a person (or a CI log) can act on, with the sample size behind it."""
    verdict = summary.verdict
    cells = summary.probe_cells()
    if verdict == "target_failed":
        return _target_failed(summary)
    if verdict == "inconclusive":
        return _inconclusive(summary)
    if verdict == "deterministic":
        n = sum(c.ok for c in cells)
        worst = max((c.drift_rate_upper_95 or 0.0) for c in cells) if cells else 1.0
        return (
            f"deterministic: one output per probe at every level (n={n}; "
            f"per cell drift rate < {worst:.1%} at 95% confidence)" + _logprob_clause(cells)
        )
    return _nondeterministic(summary)


def _target_failed(summary: RunSummary) -> str:
    cells = summary.probe_cells()
    errors, requests, by_type = (
        summary.probe_errors,
        summary.probe_requests,
        summary.probe_errors_by_type,
    )
    empty = [f"{c.label}" for c in cells if c.ok == 0]
    return (
        f"target failed: {errors} of {requests} probe {sample_noun(cells)} failed "
        f"({counts_text(by_type)}); "
        f"limit is {summary.max_error_share:.0%}"
        + (f"; no ok sample in {', '.join(empty)}" if empty else "")
        + _companions(summary)
    )


def _inconclusive(summary: RunSummary) -> str:
    short = [c for c in summary.probe_cells() if c.short]
    parts = [f"{c.label}: {short_text(c)}" for c in short] + missing_texts(summary)
    why = (
        "fewer ok probe samples than asked"
        if short
        else "a probe cell asked for has no counted sample"
        if summary.missing_cells
        else "no probe sample was counted"
    )
    return (
        f"inconclusive: {why}, so no claim of determinism"
        + "".join(f"; {part}" for part in parts)
        + _companions(summary)
    )


def _nondeterministic(summary: RunSummary) -> str:
    """Each drifting cell (the first ``_VERDICT_CELLS``): what its outputs say and where they
    part."""
    cells = summary.probe_cells()
    parts = []
    for c in cells:
        if not c.drift:
            continue
        at = position_label(char=c.first_divergence_chars, token=c.first_divergence_tokens)
        where = (
            f"first divergence at {at}"
            if c.first_divergence_chars is not None
            else "serial outputs already differ"
        )
        kinds = kinds_text(c)
        parts.append(
            f"{c.label}: {cell_phrase(c)}, {where}" + (f" (kinds: {kinds})" if kinds else "")
        )
    shortfall = sum(1 for c in cells if c.short) + len(summary.missing_cells or ())
    also = f" (and {shortfall} cell(s) short of samples)" if shortfall else ""
    if (
        len(parts) > _VERDICT_CELLS
    ):  # a dataset's hundreds of drifting cells: summary.json's drift_cells has them
        parts = [*parts[:_VERDICT_CELLS], f"and {len(parts) - _VERDICT_CELLS} more drifting cells"]
    return "nondeterministic: " + "; ".join(parts) + also + _logprob_clause(cells)


def _logprob_clause(cells: tuple[CellSummary, ...]) -> str:
    """What the logprobs add to the verdict: latent drift where it is, the cells whose logprobs
    cover only some samples, or bitwise agreement everywhere (only when every ok sample of every
    cell was compared)."""
    parts = []
    latent = [c for c in cells if c.latent_drift]
    if latent:
        parts.append(
            "latent drift (same text, other logprobs) in "
            + ", ".join(
                f"{c.label} from {position_label(token=c.first_logprob_divergence_token)}"
                for c in latent
            )
        )
    parts += [logprob_gap_text(c) for c in cells if c.logprob_gap]
    if not parts and cells and all(c.logprob_bitwise for c in cells):
        parts.append(
            "logprobs bitwise equal to serial in every cell "
            f"(n={sum(c.logprob_samples or 0 for c in cells)})"
        )
    return "".join(f"; {part}" for part in parts)


def _companions(summary: RunSummary) -> str:
    if not summary.companion_errors:
        return ""
    return (
        f"; companions (not counted): {summary.companion_errors} of {summary.companion_requests} "
        f"failed ({counts_text(summary.companion_errors_by_type)})"
    )


def slo_line(summary: RunSummary) -> str:
    """What the SLO says about the run: the cells under the minimum attainment, or the lowest
    one."""
    cells = [c for c in summary.probe_cells() if c.slo_attainment is not None]
    minimum = summary.min_slo_attainment
    head = f"SLO {slo_bounds_text(summary.slo)}"
    if not cells:
        return f"{head}: no probe cell"
    if minimum is None:
        low = min(cells, key=lambda c: c.slo_attainment or 0.0)  # cells with one
        return (
            f"{head} (measured, not enforced: no load.min_slo_attainment): lowest attainment "
            f"{low.slo_attainment:.1%} at {low.probe} ({low.mode}) {low.level}, "
            f"{slo_cell_text(low)}"
        )
    failed = [c for c in cells if not c.meets_slo]
    if not failed:
        return f"{head}: met, every probe cell has ≥ {minimum:.1%} of its requests within it"
    return f"{head}: MISSED, {len(failed)} probe cell(s) under {minimum:.1%}: " + "; ".join(
        f"{c.label} {c.slo_attainment:.1%}, {slo_cell_text(c)}" for c in failed
    )
