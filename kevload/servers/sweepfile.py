"""sweep.json and sweep.md: a row per setting (its run's verdict and probe cells, or why it has
none), written, read back checked, and shown as settings × levels in Markdown."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from kevload.errors import RunDirError
from kevload.inputs.wordsets import SweepVerdict
from kevload.outputs.celltext import slo_bounds_text
from kevload.outputs.escaping import markdown_cell
from kevload.outputs.sweepview import reference_markdown, sweep_cell_text
from kevload.outputs.verdict import verdict_line
from kevload.records.machine import rows_where
from kevload.records.rundir import RunDir
from kevload.records.servermetrics import CELL_FIELDS as SERVER_FIELDS
from kevload.records.store import read_json, write_json
from kevload.records.summary import CellSummary, RunSummary, row_cells
from kevload.servers.sweepgrid import Grid, combinations, label

# Every row in; the rows with their comparison, and sweep.json's ``reference``, out
# (``sweepref.judge``).
Judge = Callable[[list[dict[str, Any]]], tuple[list[dict[str, Any]], dict[str, Any]]]


def setting_row(
    name: str, server: dict[str, Any], scenario: dict[str, Any], run_dir: Path, summary: RunSummary
) -> dict[str, Any]:
    """One setting's row of sweep.json: its run, verdict and probe cells, and where it ran (its
    run.json's ``machine`` and, for a built-in target, ``engine``)."""
    run = RunDir(run_dir)
    meta = run.meta() if run.run_json.is_file() else {}
    return _row(
        {
            "setting": name,
            "server": server,
            "scenario": scenario,
            "run": str(run_dir),
            "verdict": summary.verdict,
            "verdict_line": verdict_line(summary),
            "cells": [_cell(c) for c in summary.probe_cells()],
            **({"machine": meta["machine"]} if "machine" in meta else {}),
            **({"engine": meta["server"]} if "server" in meta else {}),
        },
        summary,
    )


def server_failed(row: dict[str, Any], error: str) -> dict[str, Any]:
    """A setting's row whose server exited or stopped answering its readiness URL by the end of its
    run: failed, whatever its run alone says (kept as ``run_verdict``)."""
    return {
        **row,
        "verdict": "target_failed",
        "run_verdict": row["verdict"],
        "verdict_line": f"failed: {error}; its run alone: {row['verdict_line']}",
        "error": error,
    }


def failed_row(server: dict[str, Any], scenario: dict[str, Any], error: str) -> dict[str, Any]:
    """The row of a setting whose server did not start, or whose run failed: no cells, the reason
    instead."""
    return {
        "setting": label({**server, **scenario}),
        "server": server,
        "scenario": scenario,
        "run": None,
        "verdict": "target_failed",
        "verdict_line": f"failed: {error.splitlines()[0]}",
        "cells": [],
        "error": error,
    }


def not_run_row(server: dict[str, Any], scenario: dict[str, Any], reason: str) -> dict[str, Any]:
    """The row of a setting the sweep never ran, saying why: a setting missing from the matrix would
    read as never asked for."""
    return {
        "setting": label({**server, **scenario}),
        "server": server,
        "scenario": scenario,
        "run": None,
        "verdict": "not_run",
        "verdict_line": f"not run: {reason}",
        "cells": [],
        "reason": reason,
    }


def every_setting(grid: Grid, rows: list[dict[str, Any]], reason: str) -> list[dict[str, Any]]:
    """The rows in the grid's order, one per setting: a ``not_run`` row, for ``reason``, where none
    was made."""
    made = {row["setting"]: row for row in rows}
    return [
        made.get(label({**s, **c})) or not_run_row(s, c, reason)
        for s in combinations(grid.server)
        for c in combinations(grid.scenario)
    ]


def write_sweep(
    out: Path,
    grid: Grid,
    rows: list[dict[str, Any]],
    *,
    complete: bool,
    unrun: str,
    judge: Judge | None = None,
) -> dict[str, Any]:
    """sweep.json and sweep.md, a row for every setting (``unrun``: why those without one did not
    run); with ``judge``, each row against its reference setting and sweep.json's ``reference``."""
    rows = every_setting(grid, rows, unrun)
    reference = None
    if judge is not None:
        rows, reference = judge(rows)
    sweep = {
        "grid": {"server": grid.server, "scenario": grid.scenario},
        "rows": rows,
        "levels": _levels(rows),
        "complete": complete,
        **({"reference": reference} if reference is not None else {}),
    }
    write_json(out / "sweep.json", sweep)
    (out / "sweep.md").write_text(sweep_markdown(sweep), encoding="utf-8")
    return sweep


class _Row(msgspec.Struct, frozen=True):
    """What the matrix and the page read of a row of sweep.json (``read_sweep``); its cells by
    ``CellSummary``."""

    setting: str
    verdict: SweepVerdict
    verdict_line: str
    cells: list[dict[str, Any]]
    error: str | None = None
    reason: str | None = None
    slo: dict[str, float] | None = None
    min_slo_attainment: float | None = None
    max_at_slo: dict[str, str | None] | None = None
    against_reference: _Against | None = None
    accuracy: dict[str, float | None] | None = None
    machine: dict[str, Any] | None = None  # where it ran (records.machine), as its run.json says
    engine: dict[str, Any] | None = None


class _Sweep(msgspec.Struct, frozen=True):
    rows: list[_Row]
    levels: list[str]
    grid: dict[str, Any] = {}
    reference: _Reference | None = None


class _Load(msgspec.Struct, frozen=True):
    requests_per_s: float | None = None


class _Level(msgspec.Struct, frozen=True):
    """What the tables and the page read of a setting's level against its reference."""

    level: str
    items: int
    agreement: float | None
    agreement_ci95: list[float] | None
    latent: int
    graded: int
    good_to_bad: int
    bad_to_good: int
    mcnemar_p: float | None
    accuracy_reference: float | None
    accuracy_candidate: float | None
    latency_p50_ratio: float | None
    reference_load: _Load
    candidate_load: _Load


class _Against(msgspec.Struct, frozen=True):
    reference: str
    levels: list[_Level] = []


class _Reference(msgspec.Struct, frozen=True):
    axis: str
    value: Any
    findings: list[str]
    code: int


def read_sweep(path: Path) -> dict[str, Any]:
    """A sweep.json as written, checked against what ``sweep_markdown`` and the HTML page read of
    it: a key of another type or missing (an edited file) is a ``RunDirError`` naming the file and
    the key (exit 2)."""
    sweep: dict[str, Any] = read_json(path)
    try:
        msgspec.convert(sweep, _Sweep)
    except msgspec.ValidationError as exc:
        raise RunDirError(f"{path}: not a kevload sweep.json: {exc}") from None
    for i, row in enumerate(sweep["rows"]):
        for j, cell in enumerate(row["cells"]):
            problem = CellSummary.type_problem({"role": "probe", **cell}, f"rows[{i}].cells[{j}].")
            if problem is not None:
                raise RunDirError(f"{path}: not a kevload sweep.json: {problem}")
    return sweep


def sweep_markdown(sweep: dict[str, Any], *, reference: bool = True) -> str:
    """Settings × levels; with an SLO, the highest level at SLO comes first: what a capacity
    planner reads. Settings, probe ids and reasons may hold any character (a ``|`` or a line break
    would split the table): each cell and note is escaped (``escaping.markdown_cell``). With
    ``reference`` and a sweep made with --reference, each setting against its reference setting
    follows (``sweepview.reference_markdown``)."""
    md = markdown_cell
    levels = sweep["levels"]
    slo = any(row.get("slo") for row in sweep["rows"])
    first = [f"max {_level_kind(levels)} at SLO"] if slo else []
    lines = [
        "| setting | probe (mode) | " + " | ".join(map(md, first + levels)) + " |",
        "| --- | --- | " + " | ".join("---:" for _ in first + levels) + " |",
    ]
    for row in sweep["rows"]:
        # A setting that failed, or never ran: the reason, and its cells (if it has any) after it.
        why = (
            f"failed: {row['error']}"
            if row.get("error")
            else f"not run: {row['reason']}"
            if row.get("verdict") == "not_run"
            else None
        )
        if why is not None:
            lines.append(
                f"| {md(row['setting'])} | {md(why.splitlines()[0])} | "
                + " | ".join("-" for _ in first + levels)
                + " |"
            )
        for probe, cells in _by_probe(row).items():
            texts = [sweep_cell_text(cells.get(level)) for level in levels]
            if slo:
                texts.insert(
                    0, (row.get("max_at_slo", {}).get(probe) or "none") if row.get("slo") else "-"
                )
            lines.append(
                f"| {md(row['setting'])} | {md(probe)} | " + " | ".join(map(md, texts)) + " |"
            )
    notes = _notes(sweep["rows"], slo)
    text = "\n".join(lines) + "\n\n" + "\n".join(map(md, notes)) + "\n"
    if reference and sweep.get("reference"):
        text += "\n" + reference_markdown(sweep)
    return text


def _notes(rows: list[dict[str, Any]], slo: bool) -> list[str]:
    """What the matrix's cells say, where the settings ran and, with an SLO, what meeting it means
    (once where every setting has the same, else each setting its own)."""
    legend = (
        "cells: distinct outputs (DRIFT when they differ from serial; ~ the serial text with other "
        "logprobs; "
        "≡ logprobs bitwise equal to serial's) · requests answered per second · median end-to-end "
        "latency"
    )
    if any(c.server_running_max is not None for row in rows for c in row_cells(row)):
        legend += (
            " · the most requests the server ran at once (its /metrics; ≥ where its reads cannot "
            "bound it: "
            "some failed, or none saw the level's requests queued)"
        )
    notes = [legend + (" · share of requests within the SLO (✗: under it)" if slo else "")]
    # Where the settings ran: figures move with the CPU and the engine's version.
    notes += rows_where(rows)
    slo_notes = {row["setting"]: _slo_note(row) for row in rows if row.get("slo")}
    if len(set(slo_notes.values())) == 1:
        notes.append(next(iter(slo_notes.values())))
    else:  # the grid sweeps the SLO itself: each setting says its own
        notes += [f"{setting}: {note}" for setting, note in slo_notes.items()]
    return notes


def max_level_at_slo(cells: list[CellSummary]) -> str | None:
    """The highest level up to which every level met the SLO; None when even the lowest missed it.

    A level that misses stops the count: a lucky higher level must not overstate the capacity.
    """
    best = None
    for cell in sorted(cells, key=lambda c: c.level_order):
        if not cell.meets_slo:
            break
        best = cell.level
    return best


def _row(row: dict[str, Any], summary: RunSummary) -> dict[str, Any]:
    """A sweep row with its SLO and, per probe, the highest level that met it."""
    if not summary.slo:
        return row
    return {
        **row,
        "slo": summary.slo,
        "min_slo_attainment": summary.min_slo_attainment,
        "max_at_slo": {
            probe: max_level_at_slo(list(cells.values())) for probe, cells in _by_probe(row).items()
        },
    }


def _level_kind(levels: list[str]) -> str:
    if levels and all(level.startswith("r=") for level in levels):
        return "rate"
    return "concurrency" if all(level.startswith("c=") for level in levels) else "level"


def _slo_note(row: dict[str, Any]) -> str:
    minimum = row.get("min_slo_attainment")
    share = (
        f"at least {minimum:.1%}"
        if minimum is not None
        else "all (no load.min_slo_attainment given)"
    )
    return (
        f"SLO {slo_bounds_text(row['slo'])}: a level meets it when {share} of its requests are "
        f"within every "
        "bound; max at SLO is the highest level up to which every level met it"
    )


def _by_probe(row: dict[str, Any]) -> dict[str, dict[str, CellSummary]]:
    out: dict[str, dict[str, CellSummary]] = {}
    for cell in row_cells(row):
        out.setdefault(f"{cell.probe} ({cell.mode})", {})[cell.level] = cell
    return out


# What sweep.json keeps of each probe cell (with its level label): enough for the matrix, the SLO
# column and the logprob evidence, under the names a run's summary.json gives them.
SWEEP_CELL_FIELDS = (
    "probe",
    "mode",
    "concurrency",
    "rate",
    "ok",
    "asked",
    "short",
    "distinct",
    "drift",
    "agrees_with_serial",
    "first_divergence_chars",
    "logprob_samples",
    "logprob_bitwise",
    "logprob_max_abs_diff",
    "first_logprob_divergence_token",
    "latent_drift",
    "requests_per_s",
    "output_tokens_per_s",
    "errors",
    "latency",
    "slo_met",
    "slo_attainment",
    "goodput",
    "meets_slo",
)


def _cell(c: CellSummary) -> dict[str, Any]:
    return {**{k: getattr(c, k) for k in (*SWEEP_CELL_FIELDS, *SERVER_FIELDS)}, "level": c.level}


def _levels(rows: list[dict[str, Any]]) -> list[str]:
    cells = {c.level: c for row in rows for c in row_cells(row)}
    return [lv for lv, _ in sorted(cells.items(), key=lambda kv: kv[1].level_order)]
