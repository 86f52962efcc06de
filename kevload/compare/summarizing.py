"""The comparator's summary: a ``Reduction``'s cells against their serial reference, each a
``CellSummary`` built field by field (``cellsummary.py``), and the ``RunSummary`` around them (the
verdict is ``verdict.py``'s policy).

Reading records is ``reader.py``, folding them into cells ``cells.py``, the logprob envelope
``envelope.py``, where outputs leave the serial one ``divergence.py``, agreement with it
``agreement.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kevload.compare.cells import CellAccumulator, CellKey, Reduction
from kevload.compare.cellsummary import Level, cell_summary
from kevload.compare.cuts import beside_cuts
from kevload.compare.graded import Grader, graded_cell, with_accuracy
from kevload.compare.overlap import FullLoad, Window
from kevload.compare.turnwise import TurnAgreement, by_turn
from kevload.compare.verdict import UntilBound, probe_error_share, run_verdict
from kevload.records.servermetrics import Samples
from kevload.records.summary import (
    CellSummary,
    RunSummary,
    held_without_cuts,
    level_label,
    level_order,
    levels_of,
)

# A probe cell a run asks for: probe, mode, concurrency, rate.
AskedCell = tuple[str, str, int, float | None]


@dataclass(frozen=True)
class _CellRules:
    """What every cell of one run is judged by: the run's asks, passed once to each cell.

    Each probe cell says why it stopped (``stop_reason``): with ``until`` (``load.until_bound``,
    ``load.max_samples``) the strategy's own rule, asked of the cell's records; without it
    ``samples``."""

    samples_asked: int | None
    min_slo_attainment: float | None
    until: UntilBound | None
    full_loads: dict[CellKey, FullLoad]
    server: Samples | None
    grader: Grader | None
    min_good_share: float | None


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

    ``samples_asked`` is the probe samples each cell was asked for (``load.samples``; None when a
    level runs for a duration instead): a probe cell with fewer ok samples is ``short`` and the run
    cannot be ``deterministic``. ``asked_cells`` are the probe cells the run asked for (probe, mode,
    concurrency, rate): one with no counted sample at all is named in ``missing_cells``.

    With an SLO (the reduction's ``slo``) every cell has ``slo_attainment`` and ``goodput``; a probe
    cell under ``min_slo_attainment`` is named in ``slo_failed_cells``. The verdict stays about
    determinism: the SLO is a separate gate.

    ``unrecorded`` are the stretches in which requests the records miss may have run
    (``overlap.unrecorded_windows``; None: the run recorded every request it sent, or does not say).
    ``server`` is what the server's ``/metrics`` said during the run
    (``servermetrics.read_samples``). ``grader`` (the run's graders by probe id, bounded in time)
    grades each graded probe's cells and the run per level (``kevload.compare.graded``);
    ``min_good_share`` (``load.min_good_share``) is the good share under which a graded probe cell
    fails.
    """
    rules = _CellRules(
        samples_asked=samples_asked,
        min_slo_attainment=min_slo_attainment,
        until=UntilBound(until_bound, samples_asked or 1, max_samples) if until_bound else None,
        full_loads=reduction.full_loads(unrecorded),
        server=server,
        grader=grader,
        min_good_share=min_good_share,
    )
    cells = _cell_summaries(reduction, rules)
    probe_cells = [c for c in cells if c.role == "probe"]
    run = replace(
        _run_counts(reduction, cells, max_error_share, asked_cells),
        samples_asked=samples_asked,
        until_bound=until_bound,
        min_slo_attainment=min_slo_attainment if reduction.slo else None,
        slo_failed_cells=_slo_failed(probe_cells, reduction, min_slo_attainment),
        **_cancel_findings(reduction, probe_cells),
    )
    return with_accuracy(run, grader, min_good_share) if grader is not None else run


def _cell_summaries(reduction: Reduction, rules: _CellRules) -> list[CellSummary]:
    """Every cell of the reduction, probes first, each group's levels in order against its first."""
    cells: list[CellSummary] = []
    groups: dict[tuple[str, str, str], list[Level]] = {}
    for probe, role, mode, concurrency, rate in reduction.cells:
        groups.setdefault((probe, role, mode), []).append((concurrency, rate))
    for (probe, role, mode), levels in sorted(
        groups.items(), key=lambda g: (g[0][1] != "probe", g[0])
    ):
        levels.sort(key=lambda lv: level_order(*lv))
        for level in levels:
            cells.append(_judged_cell(reduction, rules, (probe, role, mode, *level), levels[0]))
    return cells


def _judged_cell(
    reduction: Reduction, rules: _CellRules, key: CellKey, ref_level: Level
) -> CellSummary:
    """One cell's summary against the serial level's cell, with its cuts and its grades."""
    probe, role, mode, concurrency, rate = key
    level = (concurrency, rate)
    serial_key: CellKey = (probe, role, mode, *ref_level)
    cell, reference = reduction.cells[key], reduction.cells[serial_key]
    summary = cell_summary(
        probe,
        role,
        mode,
        level,
        ref_level,
        cell,
        reference,
        asked=rules.samples_asked if role == "probe" else None,
        min_slo_attainment=rules.min_slo_attainment,
        until=rules.until,
        full_load=rules.full_loads.get(key),
        server=rules.server,
        turns=_turns(reduction, key, serial_key),
    )
    if reduction.cancel_planned:
        summary = _with_cuts(summary, cell, reference, reduction.cuts.get((mode, *level), ()))
    grader = rules.grader
    if grader is not None and role == "probe" and probe in grader.gradings:
        summary = graded_cell(
            summary,
            cell,
            reference,
            grader,
            serial=level == ref_level,
            min_good_share=rules.min_good_share,
        )
    return summary


def _run_counts(
    reduction: Reduction,
    cells: list[CellSummary],
    max_error_share: float,
    asked_cells: Iterable[AskedCell] | None,
) -> RunSummary:
    """The run's verdict, its counts and the cells each finding names (the verdict is
    ``verdict.run_verdict``'s).

    The error share and the target-failed rule count probe requests only: companions only shape
    the batch, and their successes must not dilute the probe's failures. A probe cell the run asked
    for with no counted sample at all has no cell, and is named in ``missing_cells`` (a run stopped
    before it, a level too short to send anything); None when the run does not say what it asked.
    """
    probe_cells = [c for c in cells if c.role == "probe"]
    companion_cells = [c for c in cells if c.role != "probe"]
    probe_requests = sum(c.requests for c in probe_cells)
    probe_errors = probe_requests - sum(c.ok for c in probe_cells)
    companion_requests = sum(c.requests for c in companion_cells)
    companion_errors = companion_requests - sum(c.ok for c in companion_cells)
    compared = any(c.logprob_samples for c in probe_cells)
    missing = _missing_cells(reduction, asked_cells)
    return RunSummary(
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
        server_limited_cells=tuple(c.name for c in probe_cells if c.server_note),
        cells=tuple(cells),
    )


def _missing_cells(
    reduction: Reduction, asked_cells: Iterable[AskedCell] | None
) -> tuple[str, ...] | None:
    """The probe cells asked for without a cell on record (``p1@single/c4``); None: not said."""
    if asked_cells is None:
        return None
    return tuple(
        f"{probe}@{mode}/{level_label(concurrency, rate)}"
        for probe, mode, concurrency, rate in asked_cells
        if (probe, "probe", mode, concurrency, rate) not in reduction.cells
    )


def _slo_failed(
    probe_cells: list[CellSummary], reduction: Reduction, min_slo_attainment: float | None
) -> tuple[str, ...]:
    """Probe cells under the SLO's minimum attainment. Only an explicit minimum gates: without one
    the SLO is measured, not enforced."""
    if min_slo_attainment is None or not reduction.slo:
        return ()
    return tuple(c.name for c in probe_cells if not c.meets_slo)


def _cancel_findings(reduction: Reduction, probe_cells: list[CellSummary]) -> dict[str, Any]:
    """The run's cuts and what drifted beside them; None each where the run planned no cuts."""
    if not reduction.cancel_planned:
        none: dict[str, Any] = dict.fromkeys(
            ("cancelled", "drift_beside_cancelled_cells", "drift_with_cancelled_levels")
        )
        return none
    return {
        "cancelled": sum(len(cuts) for cuts in reduction.cuts.values()),
        "drift_beside_cancelled_cells": tuple(
            c.name for c in probe_cells if c.drift_only_beside_cancelled
        ),
        "drift_with_cancelled_levels": _drift_with_cuts(probe_cells),
    }


def _with_cuts(
    summary: CellSummary, cell: CellAccumulator, reference: CellAccumulator, cuts: Iterable[float]
) -> CellSummary:
    """A cell of a run that cut requests (``kevload.load.cancel``): a companion cell's own cuts; a
    probe cell's level's cuts while its samples ran (first send to last answer: another probe's
    level of the same concurrency runs at another time) and how its ok samples split beside them."""
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
    """Probes (``p1@mixed``) that drifted only in levels where requests were cut, and there only
    beside the cuts (no sample without a cut in its window left the serial output: a level that
    drifts by its shape, cut or not, drifts there too), while a heavier loaded level of theirs with
    no cut held the serial output (``held_without_cuts``): more load without cancellations, as
    evidence."""
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
    """Probes × levels of distinct-output counts (-1 where a cell has no ok sample), as nested
    lists, with the ok samples behind each count and whether the cell is short of the samples asked
    and whether it shows latent drift, and its counted samples that never had c − 1 others in flight
    (None: not a closed-loop level c ≥ 2)."""
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


def _turns(reduction: Reduction, key: CellKey, serial: CellKey) -> tuple[TurnAgreement, ...] | None:
    """A conversation cell's turns against the serial cell's (``turnwise.by_turn``); None for any
    other cell."""
    if key not in reduction.turns and serial not in reduction.turns:
        return None
    return by_turn(reduction.turns.get(key, {}), reduction.turns.get(serial, {}))


def _merge_counts(items: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for counts in items:
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value
    return dict(sorted(total.items()))
