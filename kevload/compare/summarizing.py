"""The comparator's summary: a ``Reduction``'s cells against their serial reference, each a ``CellSummary``
built field by field, and the ``RunSummary`` around them (the verdict is ``verdict.py``'s policy).

Reading records is ``reader.py``, folding them into cells ``cells.py``, the logprob envelope ``envelope.py``,
where outputs leave the serial one ``divergence.py``, agreement with it ``agreement.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, cast

import numpy as np

from kevload.compare.agreement import agreement, logprob_agreement
from kevload.compare.cells import CellAccumulator, CellKey, Reduction
from kevload.compare.cuts import beside_cuts
from kevload.compare.divergence import divergence
from kevload.compare.graded import Grader, graded_cell, with_accuracy
from kevload.compare.overlap import FullLoad, Window
from kevload.compare.stats import drift_upper_bound
from kevload.compare.turnwise import TurnAgreement, by_turn, first_divergent_turn
from kevload.compare.verdict import (
    UntilBound,
    meets_slo,
    probe_error_share,
    run_verdict,
    stop_reason,
)
from kevload.inputs.wordsets import DIVERGENCE_KINDS, SampleRole
from kevload.records.servermetrics import Samples, cell_view
from kevload.records.summary import (
    CellSummary,
    RunSummary,
    held_without_cuts,
    level_label,
    level_order,
    levels_of,
)

AskedCell = tuple[
    str, str, int, float | None
]  # a probe cell a run asks for: probe, mode, concurrency, rate
Level = tuple[int, float | None]  # concurrency, rate (open loop)


def summarize(
    reduction: Reduction,
    *,
    max_error_share: float = 1.0,
    samples_asked: int | None = None,
    min_slo_attainment: float | None = None,
    until_bound: float | None = None,
    max_samples: int = 1000,
    server: Samples | None = None,
    asked_cells: Iterable[AskedCell] | None = None,
    unrecorded: list[Window] | None = None,
    grader: Grader | None = None,
    min_good_share: float | None = None,
) -> RunSummary:
    """The summary: ``cells`` (one per probe × role × mode × level), ``matrix`` and ``verdict``.

    The error share and the target-failed rule count probe requests only: companions only shape
    the batch, and their successes must not dilute the probe's failures. ``samples_asked`` is the
    probe samples each cell was asked for (``load.samples``; None when a level runs for a duration
    instead): a probe cell with fewer ok samples is ``short`` and the run cannot be ``deterministic``.
    ``asked_cells`` are the probe cells the run asked for (probe, mode, concurrency, rate): one with no counted
    sample at all has no cell, and is named in ``missing_cells`` (a run stopped before it, a level too short to
    send anything); None when the run does not say (then only the cells on record are known).

    The verdict is ``verdict.run_verdict``'s.

    With an SLO (the reduction's ``slo``) every cell has ``slo_attainment`` (requests within every bound
    over all its requests, failed ones included: a failed request met nothing) and ``goodput`` (those
    requests per second of the cell's duration); a probe cell under ``min_slo_attainment`` is named in
    ``slo_failed_cells``. The verdict stays about determinism: the SLO is a separate gate.

    Each probe cell says why it stopped (``stop_reason``): with ``until_bound`` (``load.until_bound``,
    ``load.max_samples``) the strategy's own rule, asked of the cell's records; without it ``samples``.

    Each cell of a closed-loop level c ≥ 2 has ``full_load_share`` and ``samples_never_full`` (``overlap.FullLoad``);
    ``unrecorded`` are the stretches in which requests the records miss may have run (``overlap.unrecorded_windows``;
    None: the run recorded every request it sent, or does not say), whose samples are ``overlap_unknown`` instead.

    ``server`` is what the server's ``/metrics`` said during the run (``servermetrics.read_samples``): each
    cell gets the ``server_*`` fields of its own time window, from its first counted send to its last answer.

    ``grader`` (the run's graders by probe id, bounded in time) grades each graded probe's cells and
    the run per level (``kevload.compare.graded``); ``min_good_share`` (``load.min_good_share``) is
    the good share under which a graded probe cell fails.
    """
    until = UntilBound(until_bound, samples_asked or 1, max_samples) if until_bound else None
    full_loads = reduction.full_loads(unrecorded)
    cells: list[CellSummary] = []
    groups: dict[tuple[str, str, str], list[Level]] = {}
    for probe, role, mode, concurrency, rate in reduction.cells:
        groups.setdefault((probe, role, mode), []).append((concurrency, rate))
    for (probe, role, mode), levels in sorted(
        groups.items(), key=lambda g: (g[0][1] != "probe", g[0])
    ):
        levels.sort(key=lambda lv: level_order(*lv))
        reference = reduction.cells[(probe, role, mode, *levels[0])]
        for level in levels:
            cell = reduction.cells[(probe, role, mode, *level)]
            summary = _cell_summary(
                probe,
                role,
                mode,
                level,
                levels[0],
                cell,
                reference,
                asked=samples_asked if role == "probe" else None,
                min_slo_attainment=min_slo_attainment,
                until=until,
                full_load=full_loads.get((probe, role, mode, *level)),
                server=server,
                turns=_turns(
                    reduction, (probe, role, mode, *level), (probe, role, mode, *levels[0])
                ),
            )
            if reduction.cancel_planned:
                summary = _with_cuts(
                    summary, cell, reference, reduction.cuts.get((mode, *level), ())
                )
            if grader is not None and role == "probe" and probe in grader.gradings:
                summary = graded_cell(
                    summary,
                    cell,
                    reference,
                    grader,
                    serial=level == levels[0],
                    min_good_share=min_good_share,
                )
            cells.append(summary)
    probe_cells = [c for c in cells if c.role == "probe"]
    companion_cells = [c for c in cells if c.role != "probe"]
    probe_requests = sum(c.requests for c in probe_cells)
    probe_errors = probe_requests - sum(c.ok for c in probe_cells)
    companion_requests = sum(c.requests for c in companion_cells)
    companion_errors = companion_requests - sum(c.ok for c in companion_cells)
    compared = any(c.logprob_samples for c in probe_cells)
    missing = (
        None
        if asked_cells is None
        else tuple(
            f"{probe}@{mode}/{level_label(concurrency, rate)}"
            for probe, mode, concurrency, rate in asked_cells
            if (probe, "probe", mode, concurrency, rate) not in reduction.cells
        )
    )
    run = RunSummary(
        verdict=run_verdict(probe_cells, max_error_share=max_error_share, missing=missing),
        requests=probe_requests + companion_requests,
        ok=sum(c.ok for c in cells),
        errors=probe_errors + companion_errors,
        errors_by_type=_merge_counts(c.errors for c in cells),
        requests_sent=reduction.sent,
        errors_sent_by_type=dict(sorted(reduction.sent_errors.items())),
        probe_requests=probe_requests,
        probe_errors=probe_errors,
        probe_error_share=round(probe_error_share(probe_cells), 6),
        probe_errors_by_type=_merge_counts(c.errors for c in probe_cells),
        companion_requests=companion_requests,
        companion_errors=companion_errors,
        companion_errors_by_type=_merge_counts(c.errors for c in companion_cells),
        max_error_share=max_error_share,
        samples_asked=samples_asked,
        until_bound=until_bound,
        drift_cells=tuple(c.name for c in probe_cells if c.drift),
        short_cells=tuple(c.name for c in probe_cells if c.short),
        missing_cells=missing,
        # Same text as serial, other logprobs: no verdict of its own (exit 1 only with --fail-on
        # latent).
        latent_cells=tuple(c.name for c in probe_cells if c.latent_drift) if compared else None,
        logprob_gap_cells=tuple(c.name for c in probe_cells if c.logprob_gap)
        if any(c.logprobs_missing is not None for c in probe_cells)
        else None,
        logprob_samples=sum(c.logprob_samples or 0 for c in probe_cells) if compared else None,
        matrix=distinct_matrix(probe_cells),
        slo=reduction.slo.bounds() if reduction.slo else None,
        min_slo_attainment=min_slo_attainment if reduction.slo else None,
        # Only an explicit minimum gates: without one the SLO is measured, not enforced.
        slo_failed_cells=tuple(
            c.name
            for c in probe_cells
            if min_slo_attainment is not None and reduction.slo and not c.meets_slo
        ),
        server_limited_cells=tuple(c.name for c in probe_cells if c.server_note),
        cells=tuple(cells),
        cancelled=sum(len(cuts) for cuts in reduction.cuts.values())
        if reduction.cancel_planned
        else None,
        drift_beside_cancelled_cells=tuple(
            c.name for c in probe_cells if c.drift_only_beside_cancelled
        )
        if reduction.cancel_planned
        else None,
        drift_with_cancelled_levels=_drift_with_cuts(probe_cells)
        if reduction.cancel_planned
        else None,
    )
    return with_accuracy(run, grader, min_good_share) if grader is not None else run


def _with_cuts(
    summary: CellSummary, cell: CellAccumulator, reference: CellAccumulator, cuts: Iterable[float]
) -> CellSummary:
    """A cell of a run that cut requests (``kevload.load.cancel``): a companion cell's own cuts; a probe cell's level's
    cuts while its samples ran (first send to last answer: another probe's level of the same concurrency runs at
    another time) and how its ok samples split beside them."""
    if summary.role != "probe":
        return replace(summary, cancelled=cell.cancelled)
    cuts = [t for t in cuts if cell.t_start <= t <= cell.t_end]
    serial = reference.modal()
    split = beside_cuts(
        ((t_send, t_last, output != serial) for t_send, t_last, output in cell.samples()), cuts
    )
    p = split.p_value
    return replace(
        summary,
        cancelled=len(cuts),
        beside_cancelled=split.beside,
        beside_window_s=round(split.window_s, 6) if split.beside + split.apart else None,
        divergent_beside_cancelled=split.divergent_beside,
        divergent_apart_from_cancelled=split.divergent_apart,
        cancel_p_value=None if p is None else round(p, 6),
        drift_only_beside_cancelled=split.only_beside_cuts,
    )


def _drift_with_cuts(cells: list[CellSummary]) -> tuple[str, ...]:
    """Probes (``p1@mixed``) that drifted only in levels where requests were cut, and there only beside the cuts (no
    sample without a cut in its window left the serial output: a level that drifts by its shape, cut or not, drifts
    there too), while a heavier loaded level of theirs with no cut held the serial output (``held_without_cuts``):
    more load without cancellations, as evidence."""
    found = []
    for (probe, mode), row in sorted(_by_probe(cells).items()):
        drifted = [c for c in row if c.drift]
        if (
            drifted
            and held_without_cuts(row)
            and all(c.cancelled and not c.divergent_apart_from_cancelled for c in drifted)
        ):
            found.append(f"{probe}@{mode}")
    return tuple(found)


def _by_probe(cells: Iterable[CellSummary]) -> dict[tuple[str, str], list[CellSummary]]:
    rows: dict[tuple[str, str], list[CellSummary]] = {}
    for c in cells:
        rows.setdefault((c.probe, c.mode), []).append(c)
    return rows


def distinct_matrix(cells: list[CellSummary]) -> dict[str, Any]:
    """Probes × levels of distinct-output counts (-1 where a cell has no ok sample), as nested lists,
    with the ok samples behind each count and whether the cell is short of the samples asked and whether
    it shows latent drift, and its counted samples that never had c − 1 others in flight (None: not a closed-loop
    level c ≥ 2)."""
    rows = sorted({(c.probe, c.mode) for c in cells})
    levels = levels_of(cells)
    distinct = np.full((len(rows), len(levels)), -1, dtype=np.int64)
    ok = np.zeros((len(rows), len(levels)), dtype=np.int64)
    drift = np.zeros((len(rows), len(levels)), dtype=bool)
    short = np.zeros((len(rows), len(levels)), dtype=bool)
    latent = np.zeros((len(rows), len(levels)), dtype=bool)
    never_full: list[list[int | None]] = [[None] * len(levels) for _ in rows]
    row_of = {r: i for i, r in enumerate(rows)}
    col_of = {lv: j for j, lv in enumerate(levels)}
    for c in cells:
        i, j = row_of[(c.probe, c.mode)], col_of[c.level]
        distinct[i, j] = c.distinct if c.ok else -1
        ok[i, j] = c.ok
        drift[i, j] = c.drift
        short[i, j] = c.short
        latent[i, j] = bool(c.latent_drift)
        never_full[i][j] = c.samples_never_full
    return {
        "rows": [{"probe": p, "mode": m} for p, m in rows],
        "levels": levels,
        "distinct": distinct.tolist(),
        "ok": ok.tolist(),
        "drift": drift.tolist(),
        "short": short.tolist(),
        "latent": latent.tolist(),
        "samples_never_full": never_full,
        # Conversation probes only: each cell's first turn (0-based) whose answer, given the serial
        # history, differs.
        **(
            {
                "first_divergent_turn": _grid(
                    cells, row_of, col_of, len(levels), "first_divergent_turn"
                )
            }
            if any(c.turns is not None for c in cells)
            else {}
        ),
    }


def _grid(
    cells: list[CellSummary], row_of: dict[Any, int], col_of: dict[Any, int], width: int, name: str
) -> list[list[Any]]:
    """One field of every cell as rows × levels (None where a row has no cell at a level)."""
    grid: list[list[Any]] = [[None] * width for _ in row_of]
    for c in cells:
        grid[row_of[(c.probe, c.mode)]][col_of[c.level]] = getattr(c, name)
    return grid


def _cell_summary(
    probe: str,
    role: str,
    mode: str,
    level: Level,
    ref_level: Level,
    cell: CellAccumulator,
    reference: CellAccumulator,
    *,
    asked: int | None,
    min_slo_attainment: float | None,
    until: UntilBound | None,
    full_load: FullLoad | None,
    server: Samples | None,
    turns: tuple[TurnAgreement, ...] | None = None,
) -> CellSummary:
    """One cell against its serial reference (the group's first level), field by field.

    ``full_load_share`` and ``samples_never_full`` (``overlap.FullLoad``: over the samples whose others the records
    hold, ``overlap_unknown`` counting the rest) are None at an open-loop level (no c to reach) and at c = 1 (no
    others to have: a serial sample is trivially full). With an SLO, attainment counts failed requests in its
    denominator (they met no bound); goodput is over the cell's duration, like requests_per_s."""
    ok = cell.ok
    errors = sum(cell.errors.values())
    serial = reference.modal()
    modal = cell.modal()
    counts = np.fromiter(cell.counts.values(), dtype=np.int64, count=len(cell.counts))
    unseen = [h for h in cell.counts if h not in reference.counts]
    unseen_requests = sum(cell.counts[h] for h in unseen)
    divergent = 0 if serial is None else ok - cell.counts.get(serial, 0)
    drift = ok > 0 and (len(cell.counts) > 1 or divergent > 0)
    by_digest: dict[str | None, int] = {}
    first_seen: dict[
        str | None, int
    ] = {}  # ties by the first request, as ``modal``: a file read in parts lists them alike
    for (digest, finish), n in cell.counts.items():
        by_digest[digest] = by_digest.get(digest, 0) + n
        first_seen[digest] = min(
            first_seen.get(digest, cell.first_seen[(digest, finish)]),
            cell.first_seen[(digest, finish)],
        )
    duration = round(cell.t_end - cell.t_start, 6) if ok + errors else None
    diverged = (
        divergence(cell, reference.texts[serial], reference.tokens.get(serial), serial)
        if drift and serial is not None and divergent
        else None
    )
    agreed = agreement(cell, reference, serial)
    logprobs = logprob_agreement(cell, reference, serial)
    slo = _slo_numbers(cell, ok + errors, duration) if cell.slo is not None else None
    view = cell_view(server, cell.t_start, cell.t_end, level[0])
    return CellSummary(
        probe=probe,
        role=cast(SampleRole, role),  # a cell's role: no warm-up makes one (counts_in_cell)
        mode=mode,
        concurrency=level[0],
        rate=level[1],
        reference_level=level_label(*ref_level),
        max_in_flight=cell.max_in_flight,
        ok=ok,
        asked=asked,
        short=asked is not None and ok < asked,
        errors=dict(sorted(cell.errors.items())),
        reconnects=cell.reconnects,
        distinct=len(cell.counts),
        modal_share=round(float(counts.max()) / ok, 6) if ok else None,
        new_vs_serial=len(unseen),
        new_vs_serial_requests=unseen_requests,
        overlap_with_serial=round((ok - unseen_requests) / ok, 6) if ok else None,
        agrees_with_serial=modal == serial if ok else None,
        divergent_requests=divergent,
        divergence_kinds=diverged.kinds if diverged else dict.fromkeys(DIVERGENCE_KINDS, 0),
        drift=drift,
        stop_reason=stop_reason(
            role=role, requests=ok + errors, errors=errors, drift=drift, asked=asked, until=until
        ),
        drift_rate=round(divergent / ok, 6) if ok and level != ref_level else None,
        drift_rate_upper_95=round(drift_upper_bound(ok), 6) if ok and not drift else None,
        first_divergence_chars=diverged.first_chars if diverged else None,
        last_divergence_chars=diverged.last_chars if diverged else None,
        first_divergence_tokens=diverged.first_tokens if diverged else None,
        first_divergence_words=diverged.first_words if diverged else None,
        modal_sha256=modal[0] if modal else None,
        modal_finish_reason=modal[1] if modal else None,
        output_hashes=tuple(
            h
            for h in sorted(by_digest, key=lambda h: (-by_digest[h], first_seen[h]))[:256]
            if h is not None  # an ok record without its hash (a crafted file) has no hash to list
        ),
        output_tokens=cell.output_tokens,
        duration_s=duration,
        latency={
            name: hist.summary() for name, hist in sorted(cell.latency.items()) if hist.n_total
        },
        full_load_share=None
        if full_load is None or full_load.share is None
        else round(full_load.share, 6),
        samples_never_full=None if full_load is None else full_load.never_full,
        overlap_unknown=None if full_load is None else full_load.unknown,
        exact_match_rate=agreed.exact_match_rate,
        exact_match_ci95=agreed.exact_match_ci95,
        token_agreement=agreed.token_agreement,
        token_agreement_ci95=agreed.token_agreement_ci95,
        logprob_samples=logprobs.samples,
        logprob_bitwise=logprobs.bitwise,
        logprob_max_abs_diff=logprobs.max_abs_diff,
        first_logprob_divergence_token=logprobs.first_divergence_token,
        # Latent drift: every output has the serial text, yet the logprobs behind it differ. No
        # claim either
        # way where the logprobs make none (too few of the cell's samples had them, all alike).
        latent_drift=None
        if logprobs.bitwise is None
        else bool(ok and not drift and not logprobs.bitwise),
        logprobs_missing=logprobs.missing,
        logprobs_partial=logprobs.partial,
        logprob_nonfinite_samples=logprobs.nonfinite_samples,
        findings=cell.findings or None,
        example_offset=diverged.example_offset if diverged else None,
        serial_example=diverged.serial_example if diverged else None,
        divergent_example=diverged.divergent_example if diverged else None,
        divergent_example_kind=diverged.divergent_example_kind if diverged else None,
        serial_finish_reason=diverged.serial_finish_reason if diverged else None,
        divergent_finish_reason=diverged.divergent_finish_reason if diverged else None,
        requests_per_s=round((ok + errors) / duration, 3) if duration else None,
        output_tokens_per_s=round(cell.output_tokens / duration, 3) if duration else None,
        slo_met=cell.slo_met if slo else None,
        slo_attainment=round(slo[0], 6) if slo else None,
        goodput=slo[1] if slo else None,
        meets_slo=meets_slo(slo[0], min_slo_attainment) if slo else None,
        slo_unmeasured=cell.slo_unmeasured if slo else None,
        slo_misses=dict(sorted(cell.slo_misses.items())) if slo else None,
        server_view=view.get("server_view"),
        server_samples=view.get("server_samples"),
        server_running_max=view.get("server_running_max"),
        server_running_mean=view.get("server_running_mean"),
        server_waiting_max=view.get("server_waiting_max"),
        server_prefix_cache_hits=view.get("server_prefix_cache_hits"),
        server_kv_cache_usage_max=view.get("server_kv_cache_usage_max"),
        server_note=view.get("server_note"),
        turns=None if turns is None else tuple(t.to_json() for t in turns),
        first_divergent_turn=None if turns is None else first_divergent_turn(turns),
    )


def _turns(reduction: Reduction, key: CellKey, serial: CellKey) -> tuple[TurnAgreement, ...] | None:
    """A conversation cell's turns against the serial cell's (``turnwise.by_turn``); None for any other cell."""
    if key not in reduction.turns and serial not in reduction.turns:
        return None
    return by_turn(reduction.turns.get(key, {}), reduction.turns.get(serial, {}))


def _slo_numbers(
    cell: CellAccumulator, requests: int, duration_s: float | None
) -> tuple[float, float | None]:
    """(attainment, goodput): requests within every bound over all of them, and per second of the cell."""
    attainment = cell.slo_met / requests if requests else 0.0
    return attainment, round(cell.slo_met / duration_s, 3) if duration_s else None


def _merge_counts(items: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for counts in items:
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value
    return dict(sorted(total.items()))
