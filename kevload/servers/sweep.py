"""`kevload sweep`: one scenario across server settings (restarting the server) and scenario keys."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import re
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from kevload.errors import RunDirError, ScenarioError, ServerError
from kevload.inputs.overrides import toml_value
from kevload.inputs.scenario import load_scenario
from kevload.inputs.urls import shown_url, url_problem
from kevload.inputs.wordsets import SweepVerdict
from kevload.load.runs import run_scenario
from kevload.outputs.celltext import slo_bounds_text
from kevload.outputs.escaping import markdown_cell
from kevload.outputs.sweepview import reference_markdown, sweep_cell_text
from kevload.outputs.verdict import verdict_line
from kevload.records.machine import rows_where
from kevload.records.rundir import RunDir, apart
from kevload.records.servermetrics import CELL_FIELDS as SERVER_FIELDS
from kevload.records.store import read_json, write_json
from kevload.records.summary import CellSummary, RunSummary, row_cells
from kevload.servers.processes import (
    free_port,
    log_tail,
    start_server,
    stop_when_gone,
    trouble,
    wait_ready,
)

# {name} in --server-cmd and --ready-url; any other braces (JSON arguments) are left as they are.
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)\}")
READY_TIMEOUT_S = (
    300.0  # --ready-timeout's default for --server-cmd (a built-in target has its own)
)
STOPPED = "the sweep was stopped (SIGINT or SIGTERM) before this setting ran"
MAX_SETTINGS = 1000  # settings of one sweep: more is a typo, not a test
# Every row in; the rows with their comparison, and sweep.json's ``reference``, out
# (``sweepref.judge``).
Judge = Callable[[list[dict[str, Any]]], tuple[list[dict[str, Any]], dict[str, Any]]]


@dataclass(frozen=True)
class Grid:
    server: dict[str, list[Any]]  # placeholders in --server-cmd, or built-in target settings
    scenario: dict[str, list[Any]]  # dotted scenario keys, swept without restarting anything

    @classmethod
    def parse(cls, specs: list[str]) -> Grid:
        server: dict[str, list[Any]] = {}
        scenario: dict[str, list[Any]] = {}
        for spec in specs:
            name, sep, values = spec.partition("=")
            name = name.strip()
            if not sep or not name or not values.strip():
                raise ScenarioError(
                    f"--grid {spec!r}: expected NAME=V1,V2 "
                    "(e.g. slots=1,2,4 or load.mode=single,mixed)"
                )
            if name in server or name in scenario:
                raise ScenarioError(f"--grid {name}: given twice")
            axis = scenario if "." in name else server
            axis[name] = _distinct(name, [v.strip() for v in values.split(",") if v.strip()])
        # Counted before any setting is made: the settings are the product of the axes.
        settings = math.prod(len(values) for values in (*server.values(), *scenario.values()))
        if settings > MAX_SETTINGS:
            raise ScenarioError(
                f"--grid: expected at most {MAX_SETTINGS:,} settings (each is a run, one after "
                f"another), got {settings:,}"
            )
        return cls(server=server, scenario=scenario)

    def run_dirs(self) -> dict[str, str]:
        """Each setting's run directory name, by its label (a row's ``setting``)."""
        return apart(
            [
                label({**s, **c})
                for s in combinations(self.server)
                for c in combinations(self.scenario)
            ]
        )

    def server_logs(self) -> dict[str, str]:
        """Each server setting's log file name, by its label."""
        names = apart([label(s) for s in combinations(self.server)])
        return {name: f"server-{file}.log" for name, file in names.items()}


def _distinct(name: str, texts: list[str]) -> list[Any]:
    """An axis's values, each once: two that read the same (4,4 or 0.5,0.50) would be one setting run twice,
    under one label and into one run directory."""
    values = [toml_value(text) for text in texts]
    seen: dict[str, str] = {}
    for text, value in zip(texts, values, strict=True):
        if str(value) in seen:
            raise ScenarioError(
                f"--grid {name}: {seen[str(value)]} and {text} are the same setting "
                f"({name}={value}); "
                "give each value once"
            )
        seen[str(value)] = text
    return values


def combinations(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    names = list(axes)
    return [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(axes[n] for n in names))
    ]


def label(setting: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in setting.items()) or "as-is"


async def run_sweep(
    scenario_path: Path,
    overrides: list[str],
    grid: Grid,
    *,
    out: Path,
    server_cmd: str | None = None,
    builtin: str | None = None,
    ready_url: str | None = None,
    ready_timeout: float | None = None,
    stop: asyncio.Event | None = None,
    log: Callable[[str], None] = print,
    elsewhere: Callable[..., Awaitable[list[dict[str, Any]]]] | None = None,
    judge: Judge | None = None,
) -> dict[str, Any]:
    """Run every server setting × scenario setting; the server is stopped after each, however it ends.

    Every setting gets a row: a server that does not start (not ready within ``ready_timeout``, None: 300 s or
    the built-in target's own) fails its setting's rows and the sweep goes on; one that exited or stopped
    answering its readiness URL by the end of a run fails that row, and its setting's later rows are ``not_run``;
    a sweep stopped or ended by an error has a ``not_run`` row for each setting it did not reach.

    ``elsewhere`` runs the server settings instead of this loop, from the loaded scenario, and returns the rows
    (``kevload.servers.raysweep``: side by side on a Ray cluster); the checks before and the matrix after are shared.
    ``judge`` (``sweepref.judge``, with --reference) pairs each setting with its reference setting
    once every setting has its row.
    """
    stop = stop or asyncio.Event()
    base = load_scenario(
        scenario_path, overrides
    )  # bad scenario, overrides or grid fail before any server starts
    for combo in combinations(grid.scenario):
        base.with_settings(combo, source="--grid")
    if ready_url is not None and server_cmd is None:
        raise ScenarioError(
            "--ready-url: only with --server-cmd (a --target is waited for at its own health URL)"
        )
    if server_cmd is not None:
        check_server_cmd(server_cmd, ready_url, list(grid.server))
    if builtin is not None:
        from kevload.servers.targets import TargetSettings, refuse_missing_settings

        for setting in combinations(grid.server):
            TargetSettings.from_options(setting)
        check_axes_used(builtin, grid.server)
        for setting in combinations(grid.server):
            refuse_missing_settings(builtin, TargetSettings.from_options(setting))
    if elsewhere is not None:
        done = await elsewhere(
            base,
            grid,
            out=out,
            server_cmd=server_cmd,
            ready_url=ready_url,
            ready_timeout=ready_timeout,
            stop=stop,
            log=log,
        )
        return write_sweep(out, grid, done, complete=not stop.is_set(), unrun=STOPPED, judge=judge)
    dirs, logs, combos = grid.run_dirs(), grid.server_logs(), combinations(grid.scenario)
    rows: list[dict[str, Any]] = []
    at = ""
    try:
        for server_setting in combinations(grid.server):
            if stop.is_set():
                break
            at = label(server_setting)
            log(f"server {at}: starting …")
            started = False
            try:
                async with _server(
                    server_setting,
                    server_cmd,
                    builtin,
                    ready_url,
                    ready_timeout,
                    out / logs[at],
                    stop,
                    log,
                ) as up:
                    started = True
                    if up is None:  # stopped while the server was starting
                        break
                    for index, combo in enumerate(combos):
                        if stop.is_set():
                            break
                        at = name = label({**server_setting, **combo})
                        scenario = base.with_settings(up.sets, source="sweep").with_settings(
                            combo, source="--grid"
                        )
                        log(f"  running {name} …")
                        result = await run_scenario(scenario, out / dirs[name], stop=stop)
                        row = setting_row(
                            name, server_setting, combo, result.run_dir, result.summary
                        )
                        failure = await asyncio.to_thread(up.failure)
                        if failure is None:
                            rows.append(row)
                            continue
                        # However its run went, the setting's answers came from a server that did
                        # not last it.
                        rows.append(
                            server_failed(
                                row, f"the server {failure} during the run (its log: {up.log_path})"
                            )
                        )
                        log(
                            f"  the server of {label(server_setting)} {failure} during the run; "
                            f"the end of its log:\n"
                            f"{log_tail(up.log_path) if up.log_path else ''}"
                        )
                        # The rest of this setting's scenario keys would only fail: each keeps its
                        # row, saying why.
                        rows += [
                            not_run_row(
                                server_setting,
                                later,
                                f"the server {failure} during {name} (its log: {up.log_path})",
                            )
                            for later in combos[index + 1 :]
                        ]
                        break
            except ServerError as exc:
                if started:
                    raise
                # One setting's server may not start (say, too large a batch for the memory): the
                # others still can.
                log(f"  the server of {label(server_setting)} did not start: {exc}")
                rows += [failed_row(server_setting, combo, str(exc)) for combo in combos]
    except Exception as exc:
        # Anything else ends the sweep (a server command that cannot run would fail every setting);
        # the settings
        # that ran (minutes each on a real server) keep their rows, the others say why they have
        # none.
        write_sweep(
            out, grid, rows, complete=False, unrun=f"the sweep ended at {at}: {_first_line(exc)}"
        )
        raise
    return write_sweep(out, grid, rows, complete=not stop.is_set(), unrun=STOPPED, judge=judge)


def setting_row(
    name: str, server: dict[str, Any], scenario: dict[str, Any], run_dir: Path, summary: RunSummary
) -> dict[str, Any]:
    """One setting's row of sweep.json: its run, verdict and probe cells, and where it ran (its run.json's
    ``machine`` and, for a built-in target, ``engine``)."""
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
    """A setting's row whose server exited or stopped answering its readiness URL by the end of its run: failed,
    whatever its run alone says (kept as ``run_verdict``)."""
    return {
        **row,
        "verdict": "target_failed",
        "run_verdict": row["verdict"],
        "verdict_line": f"failed: {error}; its run alone: {row['verdict_line']}",
        "error": error,
    }


def failed_row(server: dict[str, Any], scenario: dict[str, Any], error: str) -> dict[str, Any]:
    """The row of a setting whose server did not start, or whose run failed: no cells, the reason instead."""
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
    """The row of a setting the sweep never ran, saying why: a setting missing from the matrix would read as
    never asked for."""
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
    """The rows in the grid's order, one per setting: a ``not_run`` row, for ``reason``, where none was made."""
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
    """What the matrix and the page read of a row of sweep.json (``read_sweep``); its cells by ``CellSummary``."""

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
    """A sweep.json as written, checked against what ``sweep_markdown`` and the HTML page read of it: a key of
    another type or missing (an edited file) is a ``RunDirError`` naming the file and the key (exit 2)."""
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


def check_server_cmd(server_cmd: str, ready_url: str | None, axes: list[str]) -> None:
    """Refuse a command kevload would run wrongly: no {port} (the server would listen where kevload does not
    look), a placeholder that is neither {port} nor a --grid axis, or an axis the command never uses."""
    try:
        argv = shlex.split(server_cmd)
    except ValueError as exc:
        raise ScenarioError(f"--server-cmd: cannot split into arguments ({exc})") from None
    used = {name for arg in argv for name in PLACEHOLDER.findall(arg)}
    if "port" not in used:
        raise ScenarioError(
            "--server-cmd: needs {port} where the server takes its port: kevload picks a free "
            "port per setting and points target.base_url at it"
        )
    # The highest port for {port}, so a digit too many shows; the axes' values are not known here.
    filled = PLACEHOLDER.sub(lambda m: "65535" if m[1] == "port" else "1", ready_url or "")
    if ready_url is not None and (problem := url_problem(filled)) is not None:
        # Polled by urllib once each server starts: a blank or an open IPv6 bracket would end the
        # sweep in a
        # traceback there, a port too large wait out --ready-timeout for every setting.
        raise ScenarioError(
            "--ready-url: expected an http:// or https:// URL such as "
            f"http://127.0.0.1:{{port}}/health ({problem}), got {shown_url(ready_url)!r}"
        )
    ready_names = set(PLACEHOLDER.findall(ready_url or ""))
    unknown = sorted((used | ready_names) - {"port", *axes})
    if unknown:
        raise ScenarioError(
            f"--server-cmd: placeholder {{{unknown[0]}}} is neither {{port}} nor a --grid axis "
            f"(axes: {', '.join(axes) or 'none'})"
        )
    unused = [axis for axis in axes if axis not in used]
    if unused:
        raise ScenarioError(
            f"--grid {unused[0]}: --server-cmd has no {{{unused[0]}}}, so every setting would "
            "start the same server"
        )


def check_axes_used(builtin: str, axes: dict[str, list[Any]]) -> None:
    """Refuse a target setting swept in vain: one whose values, the other axes held at any of theirs, give the
    same command line and environment (the target has no such knob, or the values mean the same there, as 64
    and 128 threads on two cores). Its rows would be labelled with settings that were never applied. The model
    file and the port are used before the command line is made."""
    from kevload.servers.targets import TargetSettings, launch_key

    settings = combinations(axes)
    starts = [launch_key(builtin, TargetSettings.from_options(setting)) for setting in settings]
    for name, values in axes.items():
        if name in ("gguf", "port") or len(values) < 2:
            continue
        alike: dict[str, set[tuple[Any, ...]]] = {}
        for setting, start in zip(settings, starts, strict=True):
            alike.setdefault(repr({k: v for k, v in setting.items() if k != name}), set()).add(
                start
            )
        if all(len(group) == 1 for group in alike.values()):
            raise ScenarioError(
                f"--grid {name}: every value starts the same {builtin} server (the target does not "
                "use this setting, or these values mean the same there)"
            )


def server_argv(server_cmd: str, values: dict[str, Any]) -> list[str]:
    """Split first, then fill each argument's placeholders: a value with spaces stays one argument and
    braces that are not a placeholder (JSON such as '{"temperature": 0}') pass through unchanged."""
    return [_fill(arg, values) for arg in shlex.split(server_cmd)]


def _fill(text: str, values: dict[str, Any]) -> str:
    return PLACEHOLDER.sub(lambda m: str(values[m[1]]) if m[1] in values else m[0], text)


def sweep_markdown(sweep: dict[str, Any], *, reference: bool = True) -> str:
    """Settings × levels; with an SLO, the highest level at SLO comes first: what a capacity planner reads. Settings,
    probe ids and reasons may hold any character (a ``|`` or a line break would split the table): each cell and
    note is escaped (``escaping.markdown_cell``). With ``reference`` and a sweep made with
    --reference, each setting against its reference setting follows
    (``sweepview.reference_markdown``)."""
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
    legend = (
        "cells: distinct outputs (DRIFT when they differ from serial; ~ the serial text with other "
        "logprobs; "
        "≡ logprobs bitwise equal to serial's) · requests answered per second · median end-to-end "
        "latency"
    )
    if any(c.server_running_max is not None for row in sweep["rows"] for c in row_cells(row)):
        legend += (
            " · the most requests the server ran at once (its /metrics; ≥ where its reads cannot "
            "bound it: "
            "some failed, or none saw the level's requests queued)"
        )
    notes = [legend + (" · share of requests within the SLO (✗: under it)" if slo else "")]
    # Where the settings ran: figures move with the CPU and the engine's version.
    notes += rows_where(sweep["rows"])
    slo_notes = {row["setting"]: _slo_note(row) for row in sweep["rows"] if row.get("slo")}
    if len(set(slo_notes.values())) == 1:
        notes.append(next(iter(slo_notes.values())))
    else:  # the grid sweeps the SLO itself: each setting says its own
        notes += [f"{setting}: {note}" for setting, note in slo_notes.items()]
    text = "\n".join(lines) + "\n\n" + "\n".join(map(md, notes)) + "\n"
    if reference and sweep.get("reference"):
        text += "\n" + reference_markdown(sweep)
    return text


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
# column and
# the logprob evidence, under the names a run's summary.json gives them.
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


@dataclass(frozen=True)
class _Up:
    """A server started for one setting: the scenario settings that point at it, and why it no longer serves
    (``servers.trouble``; None while it does)."""

    sets: dict[str, Any]
    failure: Callable[[], str | None]
    log_path: Path | None


@contextlib.asynccontextmanager
async def _server(
    setting: dict[str, Any],
    server_cmd: str | None,
    builtin: str | None,
    ready_url: str | None,
    ready_timeout: float | None,
    log_path: Path,
    stop: asyncio.Event,
    log: Callable[[str], None],
) -> AsyncIterator[_Up | None]:
    """Start the server for one setting (None: stopped while starting); it is stopped when the block ends,
    however it ends, a cancel during its start included. A server that exits while in use has the rest of its
    process group stopped at once, so the requests sent to it fail at once."""
    if builtin is not None:
        from kevload.servers.targets import TargetSettings, serving

        async with serving(
            builtin,
            TargetSettings.from_options(setting),
            log=log,
            stop=stop,
            ready_timeout=ready_timeout,
        ) as target:
            yield (
                None
                if target is None
                else _Up(
                    {"target.base_url": target.url, "target.model": target.model},
                    functools.partial(
                        trouble, target.pid, f"http://127.0.0.1:{target.port}/health"
                    ),
                    target.log_path,
                )
            )
        return
    if server_cmd is None:
        yield _Up({}, lambda: None, None)  # only scenario keys are swept: the target stays as it is
        return
    port = free_port()
    values = {**setting, "port": port}
    argv = server_argv(server_cmd, values)
    try:
        server = start_server(argv, log_path)
    except OSError as exc:
        raise ScenarioError(
            f"--server-cmd: cannot run {argv[0]!r}: {exc.strerror or exc}"
        ) from None
    watch = None
    try:
        url = _fill(ready_url or "http://127.0.0.1:{port}/health", values)
        # The pid is known here, in this task, before the wait starts: the finally below stops the
        # server even
        # when this task is cancelled while the thread still polls (that thread then sees it gone
        # and ends).
        wait = functools.partial(
            wait_ready, server, url, timeout=ready_timeout or READY_TIMEOUT_S, cancelled=stop.is_set
        )
        future = asyncio.get_running_loop().run_in_executor(None, wait)
        future.add_done_callback(_retrieve)
        ready = await future
        watch = asyncio.ensure_future(stop_when_gone(server.pid))
        up = _Up(
            {"target.base_url": f"http://127.0.0.1:{port}/v1"},
            functools.partial(trouble, server.pid, url),
            server.log_path,
        )
        yield up if ready else None
    finally:
        if watch is not None:
            watch.cancel()
        server.stop()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Consume the readiness thread's outcome when nobody awaits it any more (its awaiter was cancelled)."""
    if not future.cancelled():
        future.exception()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
