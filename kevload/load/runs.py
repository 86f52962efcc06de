"""Run directories: create one (never on top of another run), resume one (cutting a torn tail), finish one
(``summary.json`` and the end state in ``run.json``). ``run_scenario`` drives ``engine.run`` into a directory."""

from __future__ import annotations

import asyncio
import copy
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import aclosing, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from kevload import __version__
from kevload.compare import signals as aio  # the signal count (compare.signals)
from kevload.compare.cells import Reduction
from kevload.compare.coldwarm import cold_warm
from kevload.compare.graded import Grader, grading_json, gradings_of
from kevload.compare.overlap import Window, unrecorded_windows
from kevload.compare.reader import reduce_file
from kevload.compare.summarizing import summarize
from kevload.errors import (
    ClusterError,
    InputError,
    KevloadError,
    RunDirError,
    ScenarioError,
    SummaryError,
)
from kevload.inputs.datasets import check_unchanged
from kevload.inputs.gradeworker import DEFAULT_TIMEOUT
from kevload.inputs.grading import IMPORT, NAMES_ONLY, python_graders, refused_from
from kevload.inputs.overrides import apply_override
from kevload.inputs.probe import probe_inputs
from kevload.inputs.scenario import Scenario, scenario_from_dict
from kevload.inputs.scenariokeys import Slo
from kevload.inputs.trace import trace_rates
from kevload.inputs.wordsets import OK, RunState
from kevload.load import engine, prefixcache
from kevload.records.machine import served, this_machine
from kevload.records.rundir import RunDir
from kevload.records.servermetrics import Sampler, read_samples
from kevload.records.store import (
    Record,
    RecordWriter,
    cut_torn_tail,
    default_run_dir,
    new_run_id,
    now_iso,
    record_line,
    redact,
    request_part,
    url_secrets,
    write_json,
)
from kevload.records.summary import RunSummary
from kevload.wire.client import Client
from kevload.wire.logprobcheck import ask_for_logprobs

# A level of a scenario: (concurrency, None) closed loop, (0, rate) open loop.
Level = tuple[int, float | None]


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    run_id: str
    state: RunState  # complete, interrupted or aborted: a result is never running
    records: int
    summary: RunSummary


async def run_scenario(
    scenario: Scenario,
    run_dir: str | os.PathLike[str] | None = None,
    *,
    on_record: Callable[[Record], None] | None = None,
    stop: asyncio.Event | None = None,
    resume: bool = False,
    overwrite: bool = False,
    ray: str | None = None,
    levels: Sequence[Level] | None = None,
) -> RunResult:
    """Run every probe at every level, writing records as they finish; returns once the summary is on disk.

    A directory that already holds a run is refused (``RunDirError``) unless ``resume`` — its records
    are kept and only the probe samples missing from each level are sent, under the same run id — or
    ``overwrite``, which removes that run's files and starts afresh. ``ray`` (``local``, ``auto`` or
    ``host:port``) runs the workers as actors of that Ray cluster (``kevload.load.rayworkers``).

    ``levels`` (concurrency, rate) — closed-loop ``(c, None)``, open-loop ``(0, r)``: send only
    these of the scenario's levels in this invocation, the others left to a later ``resume``
    (``kevload compare`` takes its targets level by level in turns). run.json records the scenario
    whole, so the run is one run of every level.
    """
    run_dir = None if run_dir is None else Path(run_dir)
    if ray is None:
        if scenario.load.workers > 1:
            from kevload.load.workers import check_host

            check_host(scenario)
        return await _run_scenario(
            scenario,
            run_dir,
            on_record=on_record,
            stop=stop,
            resume=resume,
            overwrite=overwrite,
            levels=levels,
        )
    if scenario.load.until_bound is not None:
        raise InputError("--ray: load.until_bound samples in one process; run it without --ray")
    if scenario.load.prefix_cache != "off":
        raise InputError(
            "--ray: load.prefix_cache sends its rounds in one process; run it without --ray"
        )
    if resume and run_dir is not None and RunDir(run_dir).meta()["clock"].get("records") != "unix":
        raise InputError(
            f"--ray: {run_dir} was recorded in one process (its own clock); resume it without --ray"
        )
    from kevload.load import rayworkers
    from kevload.load.cluster import connect

    # Connected before the run directory exists: a cluster that cannot take the run leaves nothing
    # behind.
    with connect(ray) as ray_module:
        rayworkers.check_cluster(ray_module, scenario)
        return await _run_scenario(
            scenario,
            run_dir,
            on_record=on_record,
            stop=stop,
            resume=resume,
            overwrite=overwrite,
            cluster=(ray, ray_module),
            levels=levels,
        )


async def _run_scenario(
    scenario: Scenario,
    run_dir: Path | None,
    *,
    on_record: Callable[[Record], None] | None,
    stop: asyncio.Event | None,
    resume: bool,
    overwrite: bool,
    cluster: tuple[str, Any] | None = None,
    levels: Sequence[Level] | None = None,
) -> RunResult:
    api_key = scenario.api_key()
    # Header values are masked by name in run.json (redact); scrubbing them as substrings too would
    # rewrite
    # prompts that happen to contain a short value, and resume and `cases build` read the prompts
    # from there.
    secrets = [s for s in [api_key, *url_secrets(scenario.target.base_url)] if s]
    client = Client(scenario.target, api_key)
    stop = stop or asyncio.Event()
    if resume:
        assert run_dir is not None
        meta, already, first_seq, answers = _resume_state(run_dir)
        meta = _resumed_meta(meta, scenario, run_dir)
        run_id = meta["run_id"]
    else:
        run_id = new_run_id()
        run_dir = run_dir or default_run_dir(run_id=run_id)
        refuse_existing(run_dir, overwrite=overwrite)
        meta, already, first_seq, answers = _run_meta(scenario, run_id, secrets), {}, 0, {}
    # Before anything is sent or the run directory is made: a reset the server lacks leaves nothing
    # behind.
    scenario, cache = await _prefix_cache(scenario, meta, api_key, run_id)
    # One check request decides whether the run asks for per-token logprobs (load.logprobs =
    # "auto"); its prompt is
    # its own, so it warms no probe's cache.
    scenario, meta["logprobs"] = await ask_for_logprobs(scenario, api_key, stop=stop)
    if resume:
        # A run killed mid-write leaves a torn last line; appending after it would bury it mid-file.
        for path in RunDir(run_dir).record_files():
            cut_torn_tail(path)
        meta = {
            "probes": [probe.id for probe in scenario.probes],
            **meta,
            "state": "running",
            "resumed_at": [*meta.get("resumed_at", []), now_iso()],
        }
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        run = RunDir(run_dir)
        for path in [*run.record_files(), run.run_json, run.summary_json]:
            path.unlink(missing_ok=True)  # only with overwrite can any of them be there
        if scenario.load.workers > 1 or cluster is not None:
            meta["clock"]["records"] = "unix"  # workers stamp Unix times (kevload.load.workers)
    offset = _records_offset(meta)
    sampler = Sampler(scenario.target, run_dir, clock=lambda: time.perf_counter() + offset)
    meta["server_metrics"] = (
        sampler.info
    )  # the sampler fills it in; finish_run writes it as it ends
    part = len(
        meta.get("resumed_at", [])
    )  # this invocation: the k-th resume is part k, on disk before any send
    # How its workers number their sends: what tells, if it never finishes, which requests it may
    # not have recorded.
    meta["parts"] = [
        *meta.get("parts", []),
        {
            "part": part,
            "first_seq": first_seq,
            "workers": scenario.load.workers,
            "started_at": now_iso(),
        },
    ]
    write_json(RunDir(run_dir).run_json, meta)
    if levels is not None:
        scenario = only_levels(scenario, levels)
    if scenario.load.workers > 1 or meta["clock"].get("records") == "unix":
        return await _run_workers(
            scenario,
            run_dir,
            meta,
            stop=stop,
            already=already,
            first_seq=first_seq,
            part=part,
            cluster=cluster,
            sampler=sampler,
            offset=offset,
        )
    stream = engine.run(
        scenario,
        client,
        run_id=run_id,
        stop=stop,
        already=already,
        first_seq=first_seq,
        part=part,
        answers=answers,
        cache=cache,
    )
    reset_failed = False
    with RecordWriter(RunDir(run_dir).records_jsonl) as writer:
        try:
            async with sampler, client, aclosing(stream.batches()) as batches:
                async for batch in batches:
                    writer.write_lines(b"".join([record_line(record) for record in batch]))
                    if on_record is not None:
                        for record in batch:
                            on_record(record)
        except prefixcache.CacheResetError:
            reset_failed = (
                True  # kevload's run failed, not the cells: it ends aborted, the error says why
            )
            raise
        finally:
            state: RunState = (
                "aborted"
                if stream.aborted or reset_failed
                else "interrupted"
                if stop.is_set()
                else "complete"
            )
            summary = finish_run(
                run_dir,
                state=state,
                meta=meta,
                unrecorded=stream.sent - writer.count,
                trust_graders=True,
            )
    return RunResult(
        run_dir=run_dir, run_id=run_id, state=state, records=writer.count, summary=summary
    )


async def _run_workers(
    scenario: Scenario,
    run_dir: Path,
    meta: dict[str, Any],
    *,
    stop: asyncio.Event,
    already: dict[engine.LevelKey, int],
    first_seq: int,
    part: int,
    cluster: tuple[str, Any] | None,
    sampler: Sampler,
    offset: float,
) -> RunResult:
    """The run on worker processes (``load.workers``), or on Ray actors when ``cluster`` is (address, ray);
    a run stamped in Unix times stays so when resumed. ``offset`` turns this host's perf_counter into the
    records' clock; the sampler reads the server's metrics while the workers run."""
    from kevload.load import workers

    results: list[workers.WorkerResult] = []
    calls: int | None = None
    try:
        async with sampler:
            if cluster is not None:
                from kevload.load import rayworkers

                ray_run = await rayworkers.run_ray(
                    cluster[1],
                    scenario,
                    run_dir,
                    run_id=meta["run_id"],
                    stop=stop,
                    already=already,
                    first_seq=first_seq,
                    part=part,
                )
                results, calls = ray_run.results, ray_run.coordinator_calls
            else:
                results = await workers.run_workers(
                    scenario,
                    run_dir,
                    run_id=meta["run_id"],
                    stop=stop,
                    already=already,
                    first_seq=first_seq,
                    part=part,
                    offset=offset,
                )
    finally:
        aborted = any(r.aborted for r in results)
        state: RunState = (
            "aborted"
            if aborted
            else "interrupted"
            if stop.is_set()
            or len(results) < scenario.load.workers
            or any(r.error for r in results)
            else "complete"
        )
        if cluster is not None:
            # Which node each worker actor ran on, by worker, and how often they called the
            # coordinator: a run
            # resumed on the cluster adds an entry.
            meta = {
                **meta,
                "ray": [
                    *meta.get("ray", []),
                    {
                        "address": cluster[0],
                        "nodes": [r.node for r in results],
                        "coordinator_calls": calls,
                    },
                ],
            }
        known = len(results) == scenario.load.workers and all(r.sent is not None for r in results)
        summary = finish_run(
            run_dir,
            state=state,
            meta=meta,
            unrecorded=sum((r.sent or 0) - r.records for r in results) if known else None,
            trust_graders=True,
        )
    lost = [r for r in results if r.lost]
    if lost:
        option = "--ray" if cluster is not None else "--workers"
        raise ClusterError(
            f"{option}: worker {lost[0].worker} {lost[0].error}; {run_dir} keeps the "
            f"{summary.requests_sent} records collected (state {state}): "
            f"kevload run --resume {run_dir} finishes it"
        )
    failed = [r for r in results if r.error]
    if failed:
        raise RuntimeError(
            f"worker {failed[0].worker} failed; the run keeps what was recorded "
            f"(state {state}):\n{failed[0].error}"
        )
    return RunResult(
        run_dir=run_dir,
        run_id=meta["run_id"],
        state=state,
        records=sum(r.records for r in results),
        summary=summary,
    )


def only_levels(scenario: Scenario, levels: Sequence[Level]) -> Scenario:
    """``scenario`` sending only ``levels`` of its own (``run_scenario``'s ``levels``); one it lacks
    is refused."""
    asked: list[Level] = (
        [(c, None) for c in scenario.load.concurrency] if not scenario.load.rate else []
    )
    asked += [(0, r) for r in scenario.load.rate]
    missing = [level for level in levels if level not in asked]
    if missing or scenario.load.trace:
        raise ScenarioError(
            f"{scenario.source}: levels {missing or list(levels)} are not the scenario's own "
            f"({asked}{', and a trace' if scenario.load.trace else ''})"
        )
    rates = tuple(r for _, r in levels if r is not None)
    return replace(
        scenario,
        load=replace(
            scenario.load,
            concurrency=tuple(c for c, r in levels if r is None) or scenario.load.concurrency,
            rate=rates,
        ),
    )


def refuse_existing(
    run_dir: Path, *, overwrite: bool = False, hint: str = "give a directory of its own"
) -> None:
    """A directory that holds a run is never appended to by a new one: two runs would merge into one matrix."""
    run = RunDir(run_dir)
    if overwrite or not run.holds_run():
        return
    try:
        held = f"run {run.meta()['run_id']}"
    except (RunDirError, KeyError, TypeError):
        held = "a run"
    raise RunDirError(f"{run_dir}: already holds {held}; {hint}")


def resumed_scenario(
    run_dir: Path, overrides: list[str], *, trust_graders: bool = False
) -> Scenario:
    """The scenario a run in ``run_dir`` was started with, ``overrides`` applied, to ``--resume`` it: refused where
    run.json cannot give back what the run sent (header values and URL credentials are stored as ***) or where its
    datasets changed since, and where it names a python grader unless ``trust_graders`` (``recorded_scenario``)."""
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
    """The scenario of run.json (``raw``: its table, changed), its datasets read again as the run read them: refused
    (ScenarioError) where a dataset changed since, so a probe's input is never taken from another file's lines.
    ``graders``: what becomes of the python graders it names (``grading.python_graders``); by default they are
    named, not imported."""
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


def finish_run(
    run_dir: Path,
    *,
    state: RunState | None = None,
    meta: dict[str, Any] | None = None,
    unrecorded: int | None = None,
    trust_graders: bool = False,
) -> RunSummary:
    """(Re)compute ``summary.json`` from the records on disk and, if given, record the end state in ``run.json``,
    for the run and for the part of it that ends here, with the requests it sent that have no record
    (``unrecorded``; None: not known, a worker was lost).

    ``trust_graders``: import the python graders run.json names (``gradings_of``): the run is this process's own,
    or the user said so.

    A run that ends always leaves its end state, never ``running``: where no summary can be made of its records,
    run.json says the state all the same and the run fails with a ``SummaryError`` (exit 3), whatever went wrong."""
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
    since = aio.signals_so_far()
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
    ``since``-th (``aio.signals_so_far``) cuts its grading short."""
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


async def _prefix_cache(
    scenario: Scenario, meta: dict[str, Any], api_key: str | None, run_id: str
) -> tuple[Scenario, prefixcache.CacheControl | None]:
    """With load.prefix_cache: how cold samples are made (a resumed run keeps its method), on record in run.json
    before anything is sent; under the marker method each round is a probe of its own, and run.json lists those."""
    if scenario.load.prefix_cache == "off":
        return scenario, None
    if meta.get("prefix_cache"):
        method = prefixcache.Method(meta["prefix_cache"]["method"], meta["prefix_cache"]["why"])
    else:
        method = await prefixcache.pick_method(scenario, api_key)
        meta["prefix_cache"] = method.to_json()
    if method.name == "marker":
        scenario = prefixcache.marked_rounds(scenario, run_id)
        meta["probes"] = [probe.id for probe in scenario.probes]
        if meta.get("grading"):  # each round graded by its probe's grader, under the round's own id
            meta["grading"] = grading_json(scenario.probes)
        meta["load"] = {**meta["load"], "samples": scenario.load.samples}
    return scenario, prefixcache.CacheControl(method, scenario, api_key)


def _asked_cells(meta: dict[str, Any]) -> list[tuple[str, str, int, float | None]] | None:
    """Every probe at every level of the run, as ``summarize`` names the cells; None for a run from before
    ``run.json`` listed its probes."""
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
    """Where requests the records miss may have run: the windows of the parts that did not record every request
    they sent (``overlap.unrecorded_windows``), one pass over their records; None when every part did, or for a
    run from before run.json kept its parts."""
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


def _resume_state(
    run_dir: Path,
) -> tuple[
    dict[str, Any], dict[engine.LevelKey, int], int, dict[engine.LevelKey, list[engine.Answer]]
]:
    """The run's metadata, its counted probe samples per level, the next sequence number and what those
    samples answered (for load.until_bound's stop rule)."""
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


def _resumed_meta(meta: dict[str, Any], scenario: Scenario, run_dir: Path) -> dict[str, Any]:
    """run.json's metadata for ``scenario`` to finish the run: refused (ScenarioError) where the scenario asks or
    grades a probe otherwise than the run did (a --set of probes or params), since a cell holds the answers to one
    input judged one way; and with the graders the scenario's (checked as --resume checks them, so imported only
    when trusted), never run.json's ``grading`` table read as it stands."""
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


def _run_meta(scenario: Scenario, run_id: str, secrets: list[str]) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "kevload_version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "scenario_name": scenario.name,
        # Absolute: --resume, cases and report find its datasets and graders from wherever they are
        # run.
        "scenario_source": str(Path(scenario.source).resolve())
        if Path(scenario.source).is_file()
        else scenario.source,
        "scenario": redact(scenario.raw, secrets),
        "load": asdict(scenario.load),
        "datasets": [dataset.to_json() for dataset in scenario.datasets],
        "probes": [
            probe.id for probe in scenario.probes
        ],  # with load's levels: the cells the run asks for
        # What each probe asks, hashed: a baseline tells a changed input from a changed server by
        # it.
        "inputs": {probe.id: probe_inputs(probe, scenario.params) for probe in scenario.probes},
        # Each graded probe's grader (kevload.inputs.grading): finish_run and `kevload report` grade
        # from run.json
        # alone.
        **({"grading": gradings} if (gradings := grading_json(scenario.probes)) else {}),
        "target": redact(
            {
                "base_url": scenario.target.base_url,
                "model": scenario.target.model,
                "api": scenario.target.api,
            },
            secrets,
        ),
        # Where it ran: a server's answers under batching move with the CPU and the engine's
        # version (kevload.records.machine). One read of /proc/cpuinfo a run.
        "machine": this_machine(scenario.target.base_url),
        **({"server": server} if (server := served(scenario.target.base_url)) else {}),
        "started_at": now_iso(),
        "clock": {"perf_counter": time.perf_counter(), "unix": time.time()},
        "state": "running",
    }


def _records_offset(meta: dict[str, Any]) -> float:
    """Seconds from ``time.perf_counter`` to the run's records' clock: Unix time for runs with workers, none
    for a run begun in one process (which keeps perf_counter times: one clock for every process of the host)."""
    from kevload.load.workers import clock_offset

    return clock_offset() if meta["clock"].get("records") == "unix" else 0.0
