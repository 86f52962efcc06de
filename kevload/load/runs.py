"""A run into its directory: ``run_scenario`` makes one (never on top of another run) or takes one
up again (cutting a torn tail), writes run.json before anything is sent, and drives ``engine.run``
or the workers into it; ``resuming.py`` reads back what a resume needs, ``finishing.py`` writes
``summary.json`` and the end state."""

from __future__ import annotations

import asyncio
import functools
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import aclosing
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kevload import __version__
from kevload.compare.graded import grading_json
from kevload.errors import (
    ClusterError,
    InputError,
    RunDirError,
    ScenarioError,
)
from kevload.inputs.probe import probe_inputs
from kevload.inputs.scenario import Scenario
from kevload.inputs.wordsets import RunState
from kevload.load import engine, prefixcache
from kevload.load.finishing import finish_run
from kevload.load.resuming import resume_state, resumed_meta
from kevload.records.machine import served, this_machine
from kevload.records.rundir import RunDir
from kevload.records.servermetrics import Sampler
from kevload.records.store import (
    Record,
    RecordWriter,
    cut_torn_tail,
    default_run_dir,
    new_run_id,
    now_iso,
    record_line,
    redact,
    url_secrets,
    write_json,
)
from kevload.records.summary import RunSummary
from kevload.wire.client import Client
from kevload.wire.logprobcheck import ask_for_logprobs

if TYPE_CHECKING:  # imported where workers run: a run in one process never loads them
    from kevload.load.workers import WorkerResult

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
    """Run every probe at every level, writing records as they finish; returns once the summary is
    on disk.

    A directory that already holds a run is refused (``RunDirError``) unless ``resume`` — its
    records are kept and only the probe samples missing from each level are sent, under the same run
    id — or ``overwrite``, which removes that run's files and starts afresh. ``ray`` (``local``,
    ``auto`` or ``host:port``) runs the workers as actors of that Ray cluster
    (``kevload.load.rayworkers``).

    ``levels`` (concurrency, rate) — closed-loop ``(c, None)``, open-loop ``(0, r)``: send only
    these of the scenario's levels in this invocation, the others left to a later ``resume``
    (``kevload compare`` takes its targets level by level in turns). run.json records the scenario
    whole, so the run is one run of every level.
    """
    where = None if run_dir is None else Path(run_dir)
    run = functools.partial(
        _run_scenario,
        scenario,
        where,
        on_record=on_record,
        stop=stop,
        resume=resume,
        overwrite=overwrite,
        levels=levels,
    )
    if ray is None:
        if scenario.load.workers > 1:
            from kevload.load.workers import check_host

            check_host(scenario)
        return await run()
    _check_ray(scenario, where, resume=resume)
    from kevload.load import rayworkers
    from kevload.load.cluster import connect

    # Connected before the run directory exists: a cluster unfit for the run leaves nothing behind.
    with connect(ray) as ray_module:
        rayworkers.check_cluster(ray_module, scenario)
        return await run(cluster=(ray, ray_module))


def _check_ray(scenario: Scenario, run_dir: Path | None, *, resume: bool) -> None:
    """--ray refuses what only one process can send, and resuming a run recorded in one process."""
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


@dataclass(frozen=True)
class _Part:
    """This invocation of a run (its k-th resume is part k): where it records, run.json's table
    (the sampler fills in its ``server_metrics``; ``finish_run`` writes it as it ends), what the run
    already counted and how it goes on."""

    run_dir: Path
    run_id: str
    meta: dict[str, Any]
    already: dict[engine.LevelKey, int]
    first_seq: int
    answers: dict[engine.LevelKey, list[engine.Answer]]
    part: int
    sampler: Sampler
    offset: float  # from this host's perf_counter to the records' clock
    stop: asyncio.Event


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
    """The run of ``run_scenario``: its directory made or taken up again, run.json written before
    anything is sent, then the sends in this process or on workers."""
    api_key = scenario.api_key()
    # Header values are masked by name in run.json (redact); scrubbing them as substrings too would
    # rewrite prompts that happen to contain a short value, and resume and `cases build` read the
    # prompts from there.
    secrets = [s for s in [api_key, *url_secrets(scenario.target.base_url)] if s]
    client = Client(scenario.target, api_key)
    stop = stop or asyncio.Event()
    if resume:
        assert run_dir is not None
        meta, already, first_seq, answers = resume_state(run_dir)
        meta = resumed_meta(meta, scenario, run_dir)
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
    # "auto"); its prompt is its own, so it warms no probe's cache.
    scenario, meta["logprobs"] = await ask_for_logprobs(scenario, api_key, stop=stop)
    meta = _opened(run_dir, meta, scenario, resume=resume, ray=cluster is not None)
    offset = _records_offset(meta)
    sampler = Sampler(scenario.target, run_dir, clock=lambda: time.perf_counter() + offset)
    meta["server_metrics"] = sampler.info
    part = _new_part(meta, first_seq, scenario.load.workers)
    write_json(RunDir(run_dir).run_json, meta)
    if levels is not None:
        scenario = only_levels(scenario, levels)
    this = _Part(run_dir, run_id, meta, already, first_seq, answers, part, sampler, offset, stop)
    if scenario.load.workers > 1 or meta["clock"].get("records") == "unix":
        return await _run_workers(scenario, this, cluster=cluster)
    return await _run_here(scenario, this, client, cache, on_record)


def _opened(
    run_dir: Path, meta: dict[str, Any], scenario: Scenario, *, resume: bool, ray: bool
) -> dict[str, Any]:
    """The run directory ready for this invocation's records, and run.json's table for it: a resumed
    run's torn tail cut and its resume noted; a new run's directory made empty, its records stamped
    in Unix times where workers (processes, or Ray actors) send them."""
    if resume:
        # A run killed mid-write leaves a torn last line; appending after it would bury it mid-file.
        for path in RunDir(run_dir).record_files():
            cut_torn_tail(path)
        return {
            "probes": [probe.id for probe in scenario.probes],
            **meta,
            "state": "running",
            "resumed_at": [*meta.get("resumed_at", []), now_iso()],
        }
    run_dir.mkdir(parents=True, exist_ok=True)
    run = RunDir(run_dir)
    for path in [*run.record_files(), run.run_json, run.summary_json]:
        path.unlink(missing_ok=True)  # only with overwrite can any of them be there
    if scenario.load.workers > 1 or ray:
        meta["clock"]["records"] = "unix"  # workers stamp Unix times (kevload.load.workers)
    return meta


def _new_part(meta: dict[str, Any], first_seq: int, workers: int) -> int:
    """This invocation's part number (the k-th resume is part k), on record in run.json's ``parts``
    before any send: how its workers number their sends tells, if it never finishes, which requests
    it may not have recorded."""
    part = len(meta.get("resumed_at", []))
    meta["parts"] = [
        *meta.get("parts", []),
        {"part": part, "first_seq": first_seq, "workers": workers, "started_at": now_iso()},
    ]
    return part


async def _run_here(
    scenario: Scenario,
    this: _Part,
    client: Client,
    cache: prefixcache.CacheControl | None,
    on_record: Callable[[Record], None] | None,
) -> RunResult:
    """The run in this process: ``engine.run``'s records written as they come, then finished."""
    stream = engine.run(
        scenario,
        client,
        run_id=this.run_id,
        stop=this.stop,
        already=this.already,
        first_seq=this.first_seq,
        part=this.part,
        answers=this.answers,
        cache=cache,
    )
    reset_failed = False
    with RecordWriter(RunDir(this.run_dir).records_jsonl) as writer:
        try:
            async with this.sampler, client, aclosing(stream.batches()) as batches:
                async for batch in batches:
                    writer.write_lines(b"".join([record_line(record) for record in batch]))
                    if on_record is not None:
                        for record in batch:
                            on_record(record)
        except prefixcache.CacheResetError:
            # kevload's run failed, not the cells: it ends aborted, the error says why.
            reset_failed = True
            raise
        finally:
            state: RunState = (
                "aborted"
                if stream.aborted or reset_failed
                else "interrupted"
                if this.stop.is_set()
                else "complete"
            )
            summary = finish_run(
                this.run_dir,
                state=state,
                meta=this.meta,
                unrecorded=stream.sent - writer.count,
                trust_graders=True,
            )
    return RunResult(
        run_dir=this.run_dir, run_id=this.run_id, state=state, records=writer.count, summary=summary
    )


async def _run_workers(
    scenario: Scenario, this: _Part, *, cluster: tuple[str, Any] | None
) -> RunResult:
    """The run on worker processes (``load.workers``), or on Ray actors when ``cluster`` is
    (address, ray); a run stamped in Unix times stays so when resumed. The sampler reads the
    server's metrics while the workers run."""
    results: list[WorkerResult] = []
    calls: int | None = None
    meta = this.meta
    try:
        async with this.sampler:
            results, calls = await _worker_results(scenario, this, cluster)
    finally:
        state = _workers_state(results, scenario.load.workers, this.stop)
        if cluster is not None:
            # Which node each worker actor ran on, by worker, and how often they called the
            # coordinator: a run resumed on the cluster adds an entry.
            ray = {"address": cluster[0], "nodes": [r.node for r in results]}
            meta = {**meta, "ray": [*meta.get("ray", []), {**ray, "coordinator_calls": calls}]}
        known = len(results) == scenario.load.workers and all(r.sent is not None for r in results)
        summary = finish_run(
            this.run_dir,
            state=state,
            meta=meta,
            unrecorded=sum((r.sent or 0) - r.records for r in results) if known else None,
            trust_graders=True,
        )
    _raise_for_workers(results, cluster, this.run_dir, summary, state)
    return RunResult(
        run_dir=this.run_dir,
        run_id=this.run_id,
        state=state,
        records=sum(r.records for r in results),
        summary=summary,
    )


async def _worker_results(
    scenario: Scenario, this: _Part, cluster: tuple[str, Any] | None
) -> tuple[list[WorkerResult], int | None]:
    """Each worker's result, and how often Ray's actors called the coordinator (None: no Ray)."""
    from kevload.load import workers

    if cluster is None:
        results = await workers.run_workers(
            scenario,
            this.run_dir,
            run_id=this.run_id,
            stop=this.stop,
            already=this.already,
            first_seq=this.first_seq,
            part=this.part,
            offset=this.offset,
        )
        return results, None
    from kevload.load import rayworkers

    ray_run = await rayworkers.run_ray(
        cluster[1],
        scenario,
        this.run_dir,
        run_id=this.run_id,
        stop=this.stop,
        already=this.already,
        first_seq=this.first_seq,
        part=this.part,
    )
    return ray_run.results, ray_run.coordinator_calls


def _workers_state(results: list[WorkerResult], workers: int, stop: asyncio.Event) -> RunState:
    """How a run on workers ended: aborted where one aborted it, interrupted where stopped or where
    a worker is missing or failed."""
    if any(r.aborted for r in results):
        return "aborted"
    if stop.is_set() or len(results) < workers or any(r.error for r in results):
        return "interrupted"
    return "complete"


def _raise_for_workers(
    results: list[WorkerResult],
    cluster: tuple[str, Any] | None,
    run_dir: Path,
    summary: RunSummary,
    state: RunState,
) -> None:
    """A lost worker (``ClusterError``) or a failed one, once the run kept what was recorded."""
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
    """A directory that holds a run is never appended to by a new one: two runs would merge into one
    matrix."""
    run = RunDir(run_dir)
    if overwrite or not run.holds_run():
        return
    try:
        held = f"run {run.meta()['run_id']}"
    except (RunDirError, KeyError, TypeError):
        held = "a run"
    raise RunDirError(f"{run_dir}: already holds {held}; {hint}")


async def _prefix_cache(
    scenario: Scenario, meta: dict[str, Any], api_key: str | None, run_id: str
) -> tuple[Scenario, prefixcache.CacheControl | None]:
    """With load.prefix_cache: how cold samples are made (a resumed run keeps its method), on record
    in run.json before anything is sent; under the marker method each round is a probe of its own,
    and run.json lists those."""
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
        # from run.json alone.
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
    """Seconds from ``time.perf_counter`` to the run's records' clock: Unix time for runs with
    workers, none for a run begun in one process (which keeps perf_counter times: one clock for
    every process of the host)."""
    from kevload.load.workers import clock_offset

    return clock_offset() if meta["clock"].get("records") == "unix" else 0.0
