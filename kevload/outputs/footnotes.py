"""The lines under a run's matrix: each cell's footnotes, the cancellation findings, and
load.prefix_cache's cold/warm lines."""

from __future__ import annotations

from typing import Any

from kevload.outputs.celltext import (
    cancelled_text,
    cell_phrase,
    counts_text,
    kinds_text,
    latent_text,
    logprob_gap_text,
    never_full_text,
    sample_noun,
    short_text,
    turns_text,
    unknown_overlap_text,
    window_text,
)
from kevload.outputs.verdict import missing_texts
from kevload.records.summary import RunSummary, held_without_cuts


def footnotes(summary: RunSummary) -> list[str]:
    """The matrix's footnotes: each drifting cell's divergence kinds, each short cell's shortfall,
    each cell with samples that never had c − 1 others in flight, the lowest full-load share, and
    the companions' errors (reported beside the probes', never mixed into them)."""
    notes = []
    for c in summary.probe_cells():
        name = c.label
        if c.drift:
            kinds = kinds_text(c)
            notes.append(f"{name}: {cell_phrase(c)}" + (f"; kinds: {kinds}" if kinds else ""))
        if c.first_divergent_turn is not None:
            notes.append(f"{name}: {turns_text(c)}")
        if c.short:
            notes.append(f"{name}: short, {short_text(c)}")
        if c.latent_drift:
            notes.append(f"{name}: ~ latent drift, {latent_text(c)}")
        elif c.logprob_gap:
            notes.append(f"{name}: {logprob_gap_text(c, 'this level')}")
        if c.samples_never_full:
            notes.append(f"{name}: † {never_full_text(c)}")
        if c.overlap_unknown:
            notes.append(f"{name}: {unknown_overlap_text(c)}")
        if c.server_note:
            notes.append(f"{name}: {c.server_note}")
        if c.cancelled:
            notes.append(f"{name}: ✂ {cancelled_text(c)}")
    notes += missing_texts(summary)
    notes += cancel_findings(summary)
    loaded = [c for c in summary.probe_cells() if c.full_load_share is not None]
    if loaded:
        low = min(loaded, key=lambda c: (c.full_load_share, c.level_order))
        notes.append(
            "full load: at every level c ≥ 2, counted samples had c − 1 others in flight for at "
            "least "
            f"{low.full_load_share:.1%} of their time (lowest: {low.label})"
        )
    if (
        summary.companion_requests or summary.cancelled
    ):  # every companion cut: the run's total of cuts still told
        notes.append(
            f"companions: {summary.companion_errors} of {summary.companion_requests} "
            f"{sample_noun(summary.companion_cells())} failed"
            + (
                f" ({counts_text(summary.companion_errors_by_type)})"
                if summary.companion_errors
                else ""
            )
            + (
                f"; {summary.cancelled} cut by kevload (load.cancel_share: cancelled, not failed)"
                if summary.cancelled is not None
                else ""
            )
        )
    return notes


def cancel_findings(summary: RunSummary) -> list[str]:
    """The cancellation findings, each with the counts that make it checkable from the records."""
    cells = {c.name: c for c in summary.probe_cells()}
    lines = []
    for name in summary.drift_beside_cancelled_cells or ():
        c = cells[name]
        lines.append(
            f"finding: {c.label}: probe drifted only beside cancellations: all "
            f"{c.divergent_beside_cancelled}"
            f" divergent samples had a cut within {window_text(c)}, none of the "
            f"{c.ok - (c.beside_cancelled or 0)} without one diverged (one-sided Fisher p = "
            f"{c.cancel_p_value:.3g})"
        )
    for row in summary.drift_with_cancelled_levels or ():
        probe, _, mode = row.rpartition("@")
        mine = sorted(
            (c for c in cells.values() if (c.probe, c.mode) == (probe, mode)),
            key=lambda c: c.level_order,
        )
        drifted = ", ".join(f"{c.level} (✂{c.cancelled})" for c in mine if c.drift)
        held = ", ".join(c.level for c in held_without_cuts(mine))
        lines.append(
            f"finding: {probe} ({mode}): probe drifted only in levels with cancellations: "
            f"{drifted}; "
            f"held the serial output where none was cut: {held}"
        )
    return lines


def cache_lines(summary: RunSummary) -> list[str]:
    """load.prefix_cache's cold-vs-warm lines (``kevload.compare.coldwarm.ColdWarm``), each probe's
    under the method's; none without it."""
    cache = summary.prefix_cache
    if cache is None:
        return []
    out = [f"prefix cache, cold vs warm: cold made by {cache['method']} ({cache['why']})"]
    for c in cache["probes"]:
        if not c["rounds"]:
            out.append(f"  {c['probe']}: no round compared: " + _why_no_round(c))
            continue
        parts = [
            *_text_parts(c),
            *_graded_parts(c),
            *_logprob_parts(c),
            *_server_parts(c),
        ]
        out.append(f"  {c['probe']}: " + "; ".join(parts))
    return out


def _why_no_round(c: dict[str, Any]) -> str:
    return (
        f"in {c['contradicted']} the server said the warm sample reused no more prompt "
        f"tokens than the cold "
        "one (is its prefix cache on?)"
        if c["contradicted"]
        else "no round had an ok cold and warm answer"
    )


def _text_parts(c: dict[str, Any]) -> list[str]:
    """A probe's rounds, its cold and warm texts against each other, and whether the cache made
    the difference."""
    parts = [f"{c['rounds']} rounds"]
    if c["cold"]["distinct"] is not None:
        parts.append(
            f"cold {c['cold']['distinct']} distinct, warm {c['warm']['distinct']} distinct"
        )
    parts.append(
        "cold = warm in every round"
        if c["equal_rounds"] == c["rounds"]
        else f"cold ≠ warm in {c['rounds'] - c['equal_rounds']} of {c['rounds']} rounds (from char "
        f"{c['first_divergence_chars']}, 0-based)"
    )
    if c["warm_unstable_rounds"]:
        parts.append(
            f"warm answers disagree among themselves in {c['warm_unstable_rounds']} rounds"
        )
    varies = (
        "warm answers vary too"
        if (c["warm"]["distinct"] or 1) > 1 or c["warm_unstable_rounds"]
        else "cold answers vary among themselves"
    )
    parts.append(
        {
            True: "cache effect",
            False: "no cache effect on the text",
            None: f"no claim about the cache ({varies})",
        }[c["cache_effect"]]
    )
    return parts


def _graded_parts(c: dict[str, Any]) -> list[str]:
    if c.get("warm_good_to_bad") is None:
        return []
    return [
        f"graded: the warm cache turned {c['warm_good_to_bad']} answers bad, "
        f"{c['warm_bad_to_good']} good (each against its round's cold answer)"
    ]


def _logprob_parts(c: dict[str, Any]) -> list[str]:
    if not c["logprob_rounds"]:
        return []
    size = c["logprob_max_abs_diff"]
    return [
        "logprobs bitwise equal"
        if c["logprob_bitwise"]
        else f"logprobs differ, largest |difference| {size:.3g} before the first differing token"
        if size
        else "logprobs differ from the first token"
        if size is None
        else "logprobs equal up to the first differing token"
    ]


def _server_parts(c: dict[str, Any]) -> list[str]:
    """What the server said it cached: confirming the rounds, silent, or contradicting some."""
    parts = []
    if c["confirmed"]:
        parts.append(
            f"server confirms {c['confirmed']} (cached prompt tokens: cold ≤ "
            f"{c['cached_tokens_cold']}, "
            f"warm ≥ {c['cached_tokens_warm']})"
        )
    elif c["cached_tokens_warm"] is None and not c["contradicted"]:
        parts.append("the server did not say what it cached")
    if c["contradicted"]:
        parts.append(
            f"{c['contradicted']} rounds left out: the server said their warm sample reused no "
            f"more "
            "prompt tokens than the cold one"
        )
    return parts
