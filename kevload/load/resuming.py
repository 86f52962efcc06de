"""Resuming a run directory: the scenario its run.json gives back, the samples it already counted,
and the checks that a resume asks and grades what the run did (``runs.py`` sends the rest).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from kevload.compare.graded import grading_json
from kevload.errors import (
    ScenarioError,
)
from kevload.inputs.datasets import check_unchanged
from kevload.inputs.grading import IMPORT, NAMES_ONLY, python_graders, refused_from
from kevload.inputs.overrides import apply_override
from kevload.inputs.probe import probe_inputs
from kevload.inputs.scenario import Scenario, scenario_from_dict
from kevload.inputs.wordsets import OK
from kevload.load import engine
from kevload.records.rundir import RunDir


def resumed_scenario(
    run_dir: Path, overrides: list[str], *, trust_graders: bool = False
) -> Scenario:
    """The scenario a run in ``run_dir`` was started with, ``overrides`` applied, to ``--resume``
    it: refused where run.json cannot give back what the run sent (header values and URL credentials
    are stored as ***) or where its datasets changed since, and where it names a python grader
    unless ``trust_graders`` (``recorded_scenario``)."""
    run = RunDir.open(run_dir)
    meta = run.meta()
    raw = meta["scenario"]
    for override in overrides:
        apply_override(raw, override)
    # run.json keeps header names only; resuming without the values would send requests the run
    # never sent.
    missing = [
        name for name, value in raw.get("target", {}).get("headers", {}).items() if value == "***"
    ]
    if missing:
        raise ScenarioError(
            f"{run_dir}/run.json: target.headers: values are not stored ({', '.join(missing)}); "
            "rerun the scenario file, or pass them again with "
            f"--set 'target.headers.{missing[0]}=\"…\"'"
        )
    # The same for credentials in base_url: run.json keeps them as ***, which is no credential to
    # send.
    # Split by hand: an overridden URL is checked (and named) by the scenario's own rule below, not
    # by urlsplit here.
    netloc = str(raw.get("target", {}).get("base_url", "")).partition("://")[2].partition("/")[0]
    if "***" in netloc.rpartition("@")[0]:
        raise ScenarioError(
            f"{run_dir}/run.json: target.base_url: its user:password@ is not stored; rerun the "
            "scenario file, or pass the URL again with --set 'target.base_url=\"…\"'"
        )
    return recorded_scenario(
        run,
        raw,
        name="resumed",
        graders=IMPORT if trust_graders else refused_from(f"the run directory {run_dir}"),
    )


def recorded_scenario(
    run: RunDir,
    raw: dict[str, Any] | None = None,
    *,
    name: str = "scenario",
    graders: str = NAMES_ONLY,
) -> Scenario:
    """The scenario of run.json (``raw``: its table, changed), its datasets read again as the run
    read them: refused (ScenarioError) where a dataset changed since, so a probe's input is never
    taken from another file's lines. ``graders``: what becomes of the python graders it names
    (``grading.python_graders``); by default they are named, not imported."""
    meta = run.meta()
    with python_graders(graders):
        scenario = scenario_from_dict(
            raw if raw is not None else copy.deepcopy(meta["scenario"]),
            source=meta.get("scenario_source") or str(run.run_json),
            name=meta.get("scenario_name", name),
        )
    if "datasets" in meta:  # runs from before datasets were recorded have nothing to compare with
        check_unchanged(meta["datasets"], scenario.datasets, str(run.run_json))
    return scenario


def resume_state(
    run_dir: Path,
) -> tuple[
    dict[str, Any], dict[engine.LevelKey, int], int, dict[engine.LevelKey, list[engine.Answer]]
]:
    """The run's metadata, its counted probe samples per level, the next sequence number and what
    those samples answered (for load.until_bound's stop rule)."""
    run = RunDir(run_dir)
    meta = run.meta()
    already: dict[engine.LevelKey, int] = {}
    answers: dict[engine.LevelKey, list[engine.Answer]] = {}
    next_seq = 0
    for r in run.records():
        next_seq = max(next_seq, r.seq + 1)
        if r.role == "probe" and r.is_sample:
            key = engine.level_key(r.probe, r.concurrency, r.rate)
            already[key] = already.get(key, 0) + 1
            answers.setdefault(key, []).append(
                (r.sha256, r.finish_reason) if r.status == OK else None
            )
    return meta, already, next_seq, answers


def resumed_meta(meta: dict[str, Any], scenario: Scenario, run_dir: Path) -> dict[str, Any]:
    """run.json's metadata for ``scenario`` to finish the run: refused (ScenarioError) where the
    scenario asks or grades a probe otherwise than the run did (a --set of probes or params), since
    a cell holds the answers to one input judged one way; and with the graders the scenario's
    (checked as --resume checks them, so imported only when trusted), never run.json's ``grading``
    table read as it stands."""
    asked = {probe.id: probe_inputs(probe, scenario.params) for probe in scenario.probes}
    recorded = meta.get(
        "inputs"
    )  # runs from before inputs were recorded have nothing to compare with
    if recorded is not None:
        for probe in sorted(set(asked) | set(recorded)):
            # Entries from before the grading was hashed apart mixed it into "input": those compare
            # what they can.
            keys = (
                ("input", "params", "max_tokens", "grading")
                if "grading" in recorded.get(probe, {})
                else ("params", "max_tokens")
            )
            then, now = recorded.get(probe), asked.get(probe)
            if then is None or now is None or any(then.get(k) != now.get(k) for k in keys):
                what = (
                    "the run had no such probe"
                    if then is None
                    else "the resumed scenario has no such probe"
                    if now is None
                    else f"its {', '.join(k for k in keys if then.get(k) != now.get(k))} changed"
                )
                raise ScenarioError(
                    f"{run_dir}/run.json: --resume: probe {probe!r} would be asked or graded "
                    f"otherwise than the run did ({what}); a resume finishes the run as it was: "
                    "start a new run to ask something else"
                )
    # What every request carries beside its probe's input: a resume that changed one would mix two
    # askings in a cell.
    carried = {
        "target.model": (scenario.target.model, meta["target"].get("model")),
        "target.api": (scenario.target.api, meta["target"].get("api")),
        **{
            f"load.{key}": (getattr(scenario.load, key), meta["load"].get(key))
            for key in ("nonce", "stream", "logprobs")
        },
    }
    for key, (now, then) in carried.items():
        if then is not None and now != then:
            raise ScenarioError(
                f"{run_dir}/run.json: --resume: {key} would be {now!r} where the run sent "
                f"{then!r}; "
                "a resume finishes the run as it was: start a new run to ask otherwise"
            )
    grading = grading_json(scenario.probes)
    return {
        **{k: v for k, v in meta.items() if k != "grading"},
        **({"grading": grading} if grading else {}),
    }
