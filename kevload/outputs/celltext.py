"""A probe cell in words: the matrix's mark, its logprobs, shortfall, cuts, full load and SLO, as
every output of a run (terminal, Markdown, HTML, JUnit) and the diagnosis state them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kevload.outputs import gradedview
from kevload.records.summary import CellSummary, position_label


def cell_text(cell: CellSummary | None) -> str:
    """One matrix cell: distinct outputs, marked when they drift from the serial reference, with
    ``(ok/asked)`` when the cell has fewer ok samples than asked.

    One distinct output that is not the serial one reads ``1 all≠serial``: the copies agree with
    each other, not with the serial answer. ``1 ~`` is latent drift: the serial text, other
    logprobs. ``t1``: a conversation that leaves the serial one at turn 1 (``turns_text``). ``†``:
    some counted samples never had c − 1 others in flight (``never_full_text``). ``✂3``: kevload cut
    3 requests of the level (``load.cancel_share``).
    """
    if cell is None:
        return "-"
    text = "no ok" if cell.ok == 0 else str(cell.distinct)
    if cell.ok and cell.drift:
        text += " DRIFT" if cell.distinct > 1 else " all≠serial"
    elif cell.latent_drift:
        text += " ~"
    if cell.first_divergent_turn is not None:
        text += f" t{cell.first_divergent_turn}"
    if cell.samples_never_full:
        text += " †"
    if cell.cancelled:
        text += f" ✂{cell.cancelled}"
    if cell.short:
        text += f" ({cell.ok}/{cell.asked})"
    return text + gradedview.cell_mark(cell)


def turns_text(cell: CellSummary) -> str:
    """Where a conversation cell leaves the serial conversation, and each turn's answers given the
    serial history: ``leaves the serial conversation at turn 1 (0-based); ≠ serial given its
    history: t0 0/4, t1 3/4, t2 0/1``."""
    per_turn = ", ".join(
        f"t{t['turn']} {t['differ']}/{t['same_history']}" for t in cell.turns or ()
    )
    where = (
        "never leaves the serial conversation"
        if cell.first_divergent_turn is None
        else f"leaves the serial conversation at turn {cell.first_divergent_turn} (0-based)"
    )
    return f"{where}; ≠ serial given its history: {per_turn}"


def cell_phrase(cell: CellSummary, unit: str = "") -> str:
    """``3 distinct in 8, 5 ≠ serial`` / ``1 distinct in 8, all ≠ serial``: what a cell's outputs
    say."""
    text = f"{cell.distinct} distinct{' outputs' if unit else ''} in {cell.ok}{unit}"
    divergent = cell.divergent_requests
    if cell.drift and divergent:
        text += ", all ≠ serial" if divergent == cell.ok else f", {divergent} ≠ serial"
    return text


def counts_text(counts: Mapping[str, int]) -> str:
    """``timeout: 2, http_503: 1``, or ``none``: counts by kind as every report and the diagnosis
    state them."""
    return ", ".join(f"{k}: {v}" for k, v in counts.items()) or "none"


def kinds_text(cell: CellSummary) -> str:
    """``4× token, 1× length``: how many of the cell's divergent requests are of each kind (empty
    when none)."""
    return ", ".join(f"{n}× {kind}" for kind, n in (cell.divergence_kinds or {}).items() if n)


def latent_text(cell: CellSummary) -> str:
    """``same text as serial in 8 samples, logprobs differ from token 3 (0-based), max abs diff
    4.2e-06``."""
    diff = cell.logprob_max_abs_diff
    return (
        f"same text as serial in {cell.ok} samples, logprobs differ from "
        f"{position_label(token=cell.first_logprob_divergence_token)}"
        + (f", max abs diff {diff:.2g}" if diff else "")
        + (f"; {logprob_coverage_text(cell)}" if cell.logprob_gap else "")
    )


def logprob_difference_text(cell: CellSummary) -> str:
    """Where a cell's logprobs first leave the serial ones and by how much: ``≠ from token 3
    (0-based), max abs diff 4.2e-06``; ``tokens differ from token 10 (0-based)`` where that first
    place is one whose tokens differ, which has no serial logprob to compare with (the first
    position and the tokens' agree, and the tokens' is where an output's tokens leave the serial
    ones). The size is the largest |difference| at positions whose tokens match the serial ones,
    said only where one is not 0: "max abs diff 0" beside "≠" read as a difference of nothing."""
    at = position_label(token=cell.first_logprob_divergence_token)
    diff = cell.logprob_max_abs_diff
    if (
        cell.first_divergence_tokens is not None
        and cell.first_logprob_divergence_token == cell.first_divergence_tokens
    ):
        return f"tokens differ from {at}" + (
            f"; at matching tokens max abs diff {diff:.2g}" if diff else ""
        )
    return f"≠ from {at}" + (f", max abs diff {diff:.2g}" if diff else "")


def logprob_text(cell: CellSummary) -> str:
    """The cell's logprobs against serial: ``bitwise = (8)``, ``≠ from token 3 (0-based), max abs
    diff 4.2e-06 (8)`` or ``tokens differ from token 10 (0-based) (8)``
    (``logprob_difference_text``), ``no claim: logprobs in 2 of 6`` or ``-``; with the samples that
    carried a non-finite logprob."""
    n = cell.logprob_samples
    nonfinite = (
        f"; {cell.logprob_nonfinite_samples} with a non-finite logprob"
        if cell.logprob_nonfinite_samples
        else ""
    )
    if cell.logprob_bitwise is None:
        return f"no claim: {logprob_coverage_text(cell)}{nonfinite}" if cell.logprob_gap else "-"
    if cell.logprob_bitwise:
        return f"bitwise = ({n}){nonfinite}"
    return (
        logprob_difference_text(cell)
        + (f" ({n} of {cell.ok})" if cell.logprob_gap else f" ({n})")
        + nonfinite
    )


def logprob_coverage_text(cell: CellSummary, where: str | None = None) -> str:
    """``logprobs in 2 of 6`` (``… at p1 (single) c=4``), with ``(3 with fewer logprobs than
    tokens)`` where some samples' logprobs stop before their tokens do: how many of a cell's ok
    samples its logprob comparison covers."""
    partial = (
        f" ({cell.logprobs_partial} with fewer logprobs than tokens)"
        if cell.logprobs_partial
        else ""
    )
    return (
        f"logprobs in {cell.logprob_samples or 0} of {cell.ok}"
        + (f" at {where}" if where else "")
        + partial
    )


def logprob_gap_text(cell: CellSummary, where: str | None = None) -> str:
    """``logprobs in 2 of 6 at p1 (single) c=4: no logprob claim``: a cell whose logprobs cover only
    some of its ok samples (a difference among those is still one, and then the claim is that)."""
    claim = "" if cell.logprob_bitwise is False else ": no logprob claim"
    return logprob_coverage_text(cell, where or cell.label) + claim


def never_full_text(cell: CellSummary) -> str:
    """``5 of 40 counted samples never had 3 others in flight; 3 others for 91.2% of their
    time``."""
    others = f"{cell.concurrency - 1} other{'s' if cell.concurrency > 2 else ''}"
    share = cell.full_load_share
    return (
        f"{cell.samples_never_full} of {cell.requests} counted samples never had {others} in flight"
        + (f"; {others} for {share:.1%} of their time" if share is not None else "")
    )


def unknown_overlap_text(cell: CellSummary) -> str:
    """``overlap unknown for 129 of 300 counted samples (…)``: samples the full-load check leaves
    out."""
    return (
        f"overlap unknown for {cell.overlap_unknown} of {cell.requests} counted samples (a part of "
        f"the run "
        "sent requests it never recorded, killed or a worker lost, which may have run beside "
        "them); "
        "left out of the full-load check"
    )


def full_load_text(cell: CellSummary) -> str:
    """``99.2%``: the share of the cell's counted time at full load, ``†`` where a sample never was;
    ``-`` where there is no c − 1 to reach (open loop, c=1)."""
    share = cell.full_load_share
    if share is None:
        return "-"
    return f"{share:.1%}" + (" †" if cell.samples_never_full else "")


def rate_text(rate: float | None, interval: list[float] | None) -> str:
    """``62.5% [30.6, 86.3]``: a share with its 95 % interval, in percent."""
    if rate is None:
        return "-"
    return (
        f"{rate:.1%} [{interval[0] * 100:.1f}, {interval[1] * 100:.1f}]"
        if interval
        else f"{rate:.1%}"
    )


def sample_noun(cells: Iterable[CellSummary]) -> str:
    """What the samples of these cells are: requests, conversations (each one sample, whatever its
    turns), or samples where there are both."""
    talks = {c.turns is not None for c in cells}
    return "samples" if len(talks) > 1 else "conversations" if talks == {True} else "requests"


def short_text(cell: CellSummary) -> str:
    """``2 of 8 asked ok (timeout: 6)``: why a short cell is short."""
    errors = counts_text(cell.errors) if cell.errors else "no errors: the run was cut short"
    return f"{cell.ok} of {cell.asked} asked ok ({errors})"


def cancelled_text(cell: CellSummary) -> str:
    """``12 requests of the level cut; 9 of 20 ok samples had a cut within 0.41 s of their send (the
    cell's shortest flight) (3 ≠ serial), 11 had none (0 ≠ serial)``: a probe cell's level's cuts
    and how its samples split beside them."""
    apart = cell.ok - (cell.beside_cancelled or 0)
    return (
        f"{cell.cancelled} requests of the level cut by kevload; {cell.beside_cancelled} of "
        f"{cell.ok} ok samples "
        f"had a cut within {window_text(cell)} ({cell.divergent_beside_cancelled} ≠ serial), "
        f"{apart} "
        f"had none ({cell.divergent_apart_from_cancelled} ≠ serial)"
    )


def window_text(cell: CellSummary) -> str:
    """How long after its send a sample meets a cut: the cell's shortest flight
    (``beside_window_s``)."""
    return f"{cell.beside_window_s or 0:.3g} s of their send (the cell's shortest flight)"


def errors_text(cells: Iterable[CellSummary]) -> str:
    """Errors of these cells, with the reconnects beside them when the records carry any."""
    cells = list(cells)
    errors = sum(sum(c.errors.values()) for c in cells)
    reconnects = sum(c.reconnects or 0 for c in cells)
    return f"{errors} (+{reconnects} reconnects)" if reconnects else str(errors)


def slo_bounds_text(bounds: Mapping[str, float] | None) -> str:
    """``ttft ≤ 500 ms, e2e ≤ 10000 ms``."""
    return ", ".join(
        f"{name.removesuffix('_ms')} ≤ {value:g} ms" for name, value in (bounds or {}).items()
    )


def attainment_text(cell: CellSummary) -> str:
    """``40.0%``, marked ``✗`` when the cell is under the SLO's attainment; ``-`` without an SLO."""
    if cell.slo_attainment is None:
        return "-"
    return f"{cell.slo_attainment:.1%}" + ("" if cell.meets_slo else " ✗")


def slo_cell_text(cell: CellSummary) -> str:
    """``4 of 10 requests within the SLO (over ttft: 6)``: what kept a cell's requests out of it."""
    requests = cell.requests
    why = [f"over {name}: {n}" for name, n in (cell.slo_misses or {}).items()]
    if cell.slo_unmeasured:
        why.append(f"no first token time: {cell.slo_unmeasured}")
    if requests > cell.ok:
        why.append(f"failed: {requests - cell.ok}")
    return f"{cell.slo_met} of {requests} requests within the SLO" + (
        f" ({', '.join(why)})" if why else ""
    )
