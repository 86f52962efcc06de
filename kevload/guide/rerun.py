"""The guide's step 5 after a change: each case of a set rerun under its recorded load, its answers
compared with the recorded ones (``transition``), and changed answers accepted into the case
file."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from kevload.guide.cases import (
    CANCEL_KEYS,
    case_grading,
    counted_outputs,
    read_cases,
    recorded_texts,
)
from kevload.inputs.fieldrules import read_table
from kevload.inputs.grading import Grading
from kevload.inputs.probe import Probe
from kevload.inputs.scenario import Scenario, build_scenario
from kevload.inputs.scenariokeys import Api, Load, Target
from kevload.load.runs import run_scenario
from kevload.records.rundir import RunDir, apart
from kevload.records.store import json_bytes, new_run_id, now_iso
from kevload.records.summary import CellSummary, RunSummary, level_label

TRANSITIONS = ("unstable→stable", "stable→unstable", "changed", "no answer", "unchanged")


def rerun_load(case: dict[str, Any], times: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(request params, scenario [load] table) to rerun a case as it was run; older cases lack
    ``load``."""
    params = dict(case["params"])
    mode = params.pop("mode", "single")
    level = int(params.pop("concurrency", 1))
    rate = params.pop("rate", None)
    recorded = case.get("load") or {"mode": mode, "concurrency": level, "rate": rate}
    load = {k: v for k, v in recorded.items() if k not in ("samples", "rate", "concurrency")}
    load.update(samples=times, max_error_share=0.5)
    if recorded.get("trace"):
        # A trace level is judged against the serial answer, as the run judged it: c=1 first, then
        # the replay.
        load["concurrency"] = [1]
    elif recorded.get("rate") is not None:
        # An open-loop level is its rate (its concurrency is the in-flight cap, kept in
        # max_in_flight). With Poisson arrivals the seed also draws the gaps; a case keeps the seed
        # its companions used.
        load["rate"] = [recorded["rate"]]
    else:
        # A closed-loop case at c>1 is judged as the run judged it: against the serial answer too,
        # so its serial level is rerun first (same mode, seed, companions); copies that agree with
        # each other but not with the serial answer are drift, which the distinct count at c alone
        # cannot see.
        level = int(recorded.get("concurrency", level))
        load["concurrency"] = [1, level] if level > 1 else [level]
    return params, load


async def rerun_cases(
    cases: list[dict[str, Any]],
    *,
    url: str,
    model: str,
    times: int,
    api: Api = "chat",
    timeout: float = 60.0,
    out: Path | None = None,
    stop: asyncio.Event | None = None,
    log: Callable[[str], None] = print,
    base: Path | None = None,
) -> list[dict[str, Any]]:
    """Rerun each case ``times`` times under its recorded load; returns the cases with the results.

    Each rerun writes ``OUT/cases-rerun-<run id>/<case id as a file name>/`` (OUT defaults to
    ``results``): a fresh directory, so a second rerun into the same OUT never mixes its records
    with the first one's. A case the stop event interrupted is left out: its answers are incomplete
    evidence. A case with ``expected`` or ``grade`` is graded by its grader (``case_grading``;
    ``base``, the case file's directory, finds a schema file or a python grader):
    ``matches_expected`` when every answer at its level is graded good.
    """
    out = (out or Path("results")) / f"cases-rerun-{new_run_id()}"
    # A case id is its probe's id, which may hold any character (a /, .., a NUL): each rerun's
    # directory is named from it as a sweep names a setting's, inside ``out`` and apart from every
    # other case's.
    dirs = apart([case["id"] for case in cases])
    target = Target(base_url=url, model=model, api=api, timeout=timeout)
    results = []
    for case in cases:
        if stop is not None and stop.is_set():
            break
        rerun = _prepared(case, times, target, base or Path.cwd())
        log(f"rerun {case['id']} ({describe_load(rerun.sent)}) …")
        run_dir = out / dirs[case["id"]]
        result = await run_scenario(rerun.scenario, run_dir, stop=stop)
        if result.state == "interrupted":
            break
        results.append(_compared(case, rerun, result.summary, run_dir))
    return results


@dataclass(frozen=True)
class _Rerun:
    """One case made ready to rerun: the scenario that sends it, what it sends (``describe_load``),
    and its grader."""

    scenario: Scenario
    sent: dict[str, Any]
    grading: Grading | None


def _prepared(case: dict[str, Any], times: int, target: Target, base: Path) -> _Rerun:
    """The case as a scenario of its own: its input as the only probe, under its recorded load."""
    params, load = rerun_load(case, times)
    max_tokens = params.pop("max_tokens", 64)
    source = f"case {case['id']}"
    grading = case_grading(case, base)  # the caller read the case (read_cases) and trusts it
    # The case file's [load] table is read by Load's own field rules, like a scenario file's.
    scenario = build_scenario(
        target,
        [_probe(case, max_tokens, grading)],
        load=read_table(Load, load, where="load", source=source),
        params=params,
        source=source,
    )
    sent = {
        "mode": load.get("mode", "single"),
        "concurrency": load.get("concurrency", [None])[-1],
        "rate": load["rate"][0] if "rate" in load else (case.get("load") or {}).get("rate"),
        "samples": times,
        **{
            k: load[k]
            for k in ("seed", "companions", "prefix_lengths", "needle_length", *CANCEL_KEYS)
            if k in load
        },
        "params": {**params, "max_tokens": max_tokens},
    }
    return _Rerun(scenario, sent, grading)


def _probe(case: dict[str, Any], max_tokens: int, grading: Grading | None) -> Probe:
    graded = (
        {}
        if grading is None
        else {
            "expected": grading.expected,
            "grade": grading.grade,
            "grade_tolerance": grading.tolerance,
        }
    )
    return Probe(
        id=case["id"],
        max_tokens=max_tokens,
        **graded,
        **{"prompt" if isinstance(case["input"], str) else "messages": case["input"]},
    )


def _compared(
    case: dict[str, Any], rerun: _Rerun, summary: RunSummary, run_dir: Path
) -> dict[str, Any]:
    """The case with its rerun's answers, their verdict, and how they compare with the recorded
    ones."""
    # The case's own cell (the last level); a serial level run before it only feeds that cell's
    # drift.
    cell = max(summary.probe_cells(), key=lambda c: c.level_order)
    texts = Counter(
        r.answer
        for r in RunDir(run_dir).evidence()
        if r.concurrency == cell.concurrency and r.rate == cell.rate
    )
    recorded = recorded_texts(case)
    after = {
        **case,
        "rerun": rerun.sent,
        "rerun_uniq": len(texts),
        "rerun_ok": cell.ok,
        "rerun_outputs": counted_outputs(texts),
        "verdict_after": "no_answer"
        if not texts
        else "unstable"
        if cell.drift or len(texts) > 1
        else "stable",
        "matches_recorded": set(texts) <= recorded if texts and recorded else None,
        "rerun_dir": str(run_dir),
    }
    if rerun.grading is not None:
        after.update(_graded_after(rerun.grading, cell, summary))
    after["transition"] = transition(after)
    return after


def _graded_after(grading: Grading, cell: CellSummary, summary: RunSummary) -> dict[str, Any]:
    """The grader's verdict on every answer at the case's level (kevload.compare.graded), not string
    equality."""
    graded: dict[str, Any] = {
        "graded_after": {
            "grade": grading.grade,
            "good": cell.graded_good or 0,
            "bad": cell.graded_bad or 0,
            "failed": cell.grade_failed or 0,
        },
        "matches_expected": (
            bool(cell.graded_good) and not cell.graded_bad and not cell.grade_failed
        ),
    }
    if summary.grade_errors:
        graded["grade_errors"] = list(summary.grade_errors)  # each names the case: its probe's id
    return graded


def transition(result: dict[str, Any]) -> str:
    """How a case moved: a stable case that now answers something else, stably, has ``changed``."""
    before, after = result["verdict"], result["verdict_after"]
    if after == "no_answer":
        return "no answer"
    if before == after == "stable" and result["matches_recorded"] is False:
        return "changed"
    return "unchanged" if before == after else f"{before}→{after}"


def transitions(results: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {key: [] for key in TRANSITIONS}
    for r in results:
        out[r["transition"]].append(r["id"])
    return out


def accept_changes(
    cases_path: Path, results: list[dict[str, Any]], *, now: str | None = None
) -> list[str]:
    """Record the rerun answers of the ``changed`` cases as their outputs; the old ones move to
    ``history``.

    The file is rewritten through a temporary file and a rename, so a crash leaves the old file
    whole. Returns the ids of the cases updated.
    """
    now = now or now_iso()
    changed = {r["id"]: r for r in results if r["transition"] == "changed"}
    if not changed:
        return []
    cases = read_cases(cases_path)
    for case in cases:
        result = changed.get(case["id"])
        if result is None:
            continue
        old = {
            "outputs": case.get("outputs"),
            "recorded_at": case.get("recorded_at"),
            "replaced_at": now,
            "replaced_by": result["rerun_dir"],
        }
        case["history"] = [*case.get("history", []), old]
        case["outputs"] = result["rerun_outputs"]
        case["recorded_at"] = now
    tmp = cases_path.with_name(cases_path.name + ".tmp")
    tmp.write_bytes(b"".join(json_bytes(case) + b"\n" for case in cases))
    os.replace(tmp, cases_path)
    return sorted(changed)


def describe_load(rerun: dict[str, Any]) -> str:
    """One line: what a case's rerun sent (mode, level, companions seed, samples, params)."""
    level = level_label(rerun["concurrency"], rerun.get("rate"))
    extra = "".join(
        f" {k}={rerun[k]}"
        for k in ("seed", "companions", "prefix_lengths", "needle_length", *CANCEL_KEYS)
        if k in rerun
    )
    return (
        f"mode={rerun['mode']} {level}{extra} samples={rerun['samples']} "
        f"params={orjson.dumps(rerun['params'], option=orjson.OPT_SORT_KEYS).decode()}"
    )
