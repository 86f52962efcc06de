"""Finishing a run directory: ``summary.json`` recomputed from the records on disk, and the end
state in ``run.json`` (``runs.py`` makes and fills the directory, ``resuming.py`` takes one up
again).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

from kevload.compare.cells import Reduction
from kevload.compare.coldwarm import cold_warm
from kevload.compare.graded import Grader, gradings_of
from kevload.compare.overlap import Window, unrecorded_windows
from kevload.compare.reader import reduce_file
from kevload.compare.signals import signals_so_far
from kevload.compare.summarizing import summarize
from kevload.errors import (
    KevloadError,
    SummaryError,
)
from kevload.inputs.gradeworker import DEFAULT_TIMEOUT
from kevload.inputs.scenariokeys import Slo
from kevload.inputs.trace import trace_rates
from kevload.inputs.wordsets import RunState
from kevload.records.rundir import RunDir
from kevload.records.servermetrics import read_samples
from kevload.records.store import (
    now_iso,
    request_part,
    write_json,
)
from kevload.records.summary import RunSummary


def finish_run(
    run_dir: Path,
    *,
    state: RunState | None = None,
    meta: dict[str, Any] | None = None,
    unrecorded: int | None = None,
    trust_graders: bool = False,
) -> RunSummary:
    """(Re)compute ``summary.json`` from the records on disk and, if given, record the end state in
    ``run.json``, for the run and for the part of it that ends here, with the requests it sent that
    have no record (``unrecorded``; None: not known, a worker was lost).

    ``trust_graders``: import the python graders run.json names (``gradings_of``): the run is this
    process's own, or the user said so.

    A run that ends always leaves its end state, never ``running``: where no summary can be made of
    its records, run.json says the state all the same and the run fails with a ``SummaryError``
    (exit 3), whatever went wrong."""
    run = RunDir(run_dir)
    meta = meta if meta is not None else run.meta()
    if state is not None and meta.get("parts"):
        meta = {
            **meta,
            "parts": [
                *meta["parts"][:-1],
                {**meta["parts"][-1], "state": state, "unrecorded": unrecorded},
            ],
        }
    # A signal from here on cuts the grading short (``Grader``); one before it, during the run, does
    # not.
    since = signals_so_far()
    try:
        summary = _summary(run, meta, state, trust_graders, since)
    except Exception as exc:
        if (
            state is None
        ):  # `kevload report`: a records file that is no run's says which line, as a RunDirError
            raise
        write_json(run.run_json, {**meta, "state": state, "ended_at": now_iso()})
        raise SummaryError(
            f"{run_dir}: the run ended {state} but its records could not be summarized: "
            f"{exc if isinstance(exc, KevloadError) else f'{type(exc).__name__}: {exc}'}"
        ) from exc
    except (
        BaseException
    ):  # a second SIGINT/SIGTERM while it grades: kevload ends now, its state told
        if state is not None:
            write_json(run.run_json, {**meta, "state": state, "ended_at": now_iso()})
        raise
    write_json(run.summary_json, summary.to_json())
    if state is not None:
        meta = {**meta, "state": state, "ended_at": now_iso(), "records": summary.requests_sent}
        write_json(run.run_json, meta)
    return summary


def _summary(
    run: RunDir, meta: dict[str, Any], state: RunState | None, trust_graders: bool, since: int
) -> RunSummary:
    """The summary of the records on disk, as run.json describes the run; a signal after the
    ``since``-th (``signals.signals_so_far``) cuts its grading short."""
    max_error_share = meta["load"]["max_error_share"]
    # A level run for a duration has no asked number of samples: only samples-bound cells can be
    # short.
    asked = None if meta["load"].get("duration") else meta["load"].get("samples")
    slo = (
        Slo(**meta["load"]["slo"]) if meta["load"].get("slo") else None
    )  # runs before SLOs have none
    cuts_asked = bool(meta["load"].get("cancel_share"))
    reduction = Reduction(slo=slo, cuts_asked=cuts_asked)
    for path in run.record_files():  # records.jsonl, or one file per worker
        reduction.merge(reduce_file(path, slo=slo, cuts_asked=cuts_asked))
    gradings = gradings_of(meta, run.run_json, trust_graders=trust_graders)
    timeout = meta["load"].get("grade_timeout", DEFAULT_TIMEOUT)  # runs from before it: the default
    with Grader(gradings, timeout, since) if gradings else nullcontext() as grader:
        summary = summarize(
            reduction,
            max_error_share=max_error_share,
            samples_asked=asked,
            min_slo_attainment=meta["load"].get("min_slo_attainment"),
            until_bound=meta["load"].get("until_bound"),
            max_samples=meta["load"].get("max_samples", 1000),
            server=read_samples(run.path),
            asked_cells=_asked_cells(meta),
            unrecorded=_unrecorded_windows(run.path, meta),
            grader=grader,
            min_good_share=meta["load"].get("min_good_share"),
        )
        if meta.get("prefix_cache"):
            summary = _with_cold_warm(summary, meta["prefix_cache"], run, grader)
    summary = replace(
        summary,
        run_id=meta.get("run_id"),
        scenario=meta.get("scenario_name"),
        state=state or meta.get("state"),
        inputs=meta.get("inputs"),
    )
    return summary


def _with_cold_warm(
    summary: RunSummary, cache: dict[str, Any], run: RunDir, grader: Grader | None
) -> RunSummary:
    """The summary with load.prefix_cache's comparison (``compare.coldwarm``), its graded probes'
    warm answers paired with their rounds' cold ones (by the run's grader, each distinct output
    graded once)."""
    grade = grader.grade_record if grader is not None else None
    probes = cold_warm(run.records(), cache["method"], grade)
    return replace(
        summary,
        prefix_cache={**cache, "probes": [c.to_json() for c in probes]},
        warm_bad_probes=None
        if grader is None
        else tuple(c.probe for c in probes if c.warm_good_to_bad),
    )


def _asked_cells(meta: dict[str, Any]) -> list[tuple[str, str, int, float | None]] | None:
    """Every probe at every level of the run, as ``summarize`` names the cells; None for a run from
    before ``run.json`` listed its probes."""
    if "probes" not in meta:
        return None
    load = meta["load"]
    levels = [(0, rate) for rate in load.get("rate") or ()] or [
        (c, None) for c in load["concurrency"]
    ]
    levels += [
        (0, rate)
        for rate in trace_rates(meta.get("datasets", []), load.get("trace_speedup") or [1.0])
        if load.get("trace")
    ]
    return [(probe, load["mode"], *level) for probe in meta["probes"] for level in levels]


def _unrecorded_windows(run_dir: Path, meta: dict[str, Any]) -> list[Window] | None:
    """Where requests the records miss may have run: the windows of the parts that did not record
    every request they sent (``overlap.unrecorded_windows``), one pass over their records; None when
    every part did, or for a run from before run.json kept its parts."""
    if "parts" not in meta:
        return None
    # A part that never wrote its end (killed, or running now) may have sent anything; one that did
    # says so.
    lost = {
        p["part"]: (p["first_seq"], p["workers"])
        for p in meta["parts"]
        if p.get("unrecorded", -1) != 0
    }
    if not lost:
        return None
    run_id = meta["run_id"]
    sends = (
        (part, r.worker or 0, r.seq, r.t_send, r.t_last_byte)
        for r in RunDir(run_dir).records()
        if (part := request_part(r.request_id, run_id)) in lost
    )
    return unrecorded_windows(sends, lost)
