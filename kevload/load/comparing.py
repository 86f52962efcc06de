"""``kevload compare``'s runs: every target gets the scenario's probes at the scenario's levels in
one time window, each into a run directory of its own (``DIR/<name>/``, an ordinary run: ``report``,
``--baseline`` and ``cases`` read it), then the comparison is computed from their records
(``compare.rollout``) into ``DIR/compare.json``.

In turns by default — the reference at the first level, then each candidate at that level, then the
next level — so a slow hour reads as slow for every target alike; with ``together`` every target
runs its whole scenario at the same time (servers that share no hardware). Each turn is
``run_scenario`` with its ``levels``: a comparison's per-request cost is a run's.
``DIR/compare-run.json`` keeps the targets, so ``resume`` finishes a stopped comparison (each
target's run resumed) and ``kevload report DIR`` recomputes it."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kevload.compare.gate import COMPLETE
from kevload.compare.graded import gradings_of
from kevload.compare.rollout import Comparison, compare_sides
from kevload.compare.sides import Side, fold_side
from kevload.errors import InputError, RunDirError, SummaryError, TargetError
from kevload.inputs.probe import probe_inputs
from kevload.inputs.scenario import Scenario
from kevload.inputs.scenariokeys import Slo
from kevload.load.runs import Level, RunResult, run_scenario
from kevload.records.rundir import RunDir, apart
from kevload.records.store import Record, now_iso, read_json, write_json

MANIFEST = "compare-run.json"
# A run that ended complete without some of its scenario's levels (the gate: evidence short).
PARTIAL = "partial"
COMPARE = "compare.json"
# What a comparison writes beside its targets' run directories (``servers.rollout.finish``).
OWN_FILES = (MANIFEST, COMPARE, "compare.md", "compare.html", "gate.json")


@dataclass(frozen=True)
class Target:
    """One server of a comparison: its name, and the scenario as sent to it (its URL and model
    set)."""

    name: str
    scenario: Scenario


def scenario_levels(scenario: Scenario) -> list[Level]:
    """The scenario's levels as a run sends them: its rates (open loop), else its concurrencies."""
    if scenario.load.rate:
        return [(0, rate) for rate in scenario.load.rate]
    return [(c, None) for c in scenario.load.concurrency]


def check_targets(names: Sequence[str], reference: str | None) -> str:
    """The reference's name; bad usage (``InputError``) for fewer than two targets, a name twice, an
    unknown reference."""
    if len(names) < 2:
        raise InputError(
            f"compare: expected at least two targets (--url NAME=URL or --target NAME=BUILTIN), "
            f"got {len(names)}"
        )
    twice = sorted({n for n in names if list(names).count(n) > 1})
    if twice:
        raise InputError(
            f"compare: target name {twice[0]!r} given twice; each needs a name of its own"
        )
    if reference is not None and reference not in names:
        raise InputError(
            f"--reference {reference!r}: expected one of the targets' names ({', '.join(names)})"
        )
    return reference if reference is not None else names[0]


def check_scenario(scenario: Scenario) -> None:
    """What a comparison cannot pair level by level is refused before anything is sent."""
    if scenario.load.trace:
        raise InputError(
            f"{scenario.source}: load.trace: compare pairs items at the scenario's concurrencies "
            "or rates; a trace's replay is not compared yet (run it with `kevload run` per "
            "server)"
        )
    if scenario.load.prefix_cache != "off" and scenario.load.cache_reset in ("auto", "marker"):
        # The marker carries each run's own id: every target would be asked another input.
        raise InputError(
            f"{scenario.source}: load.cache_reset = {scenario.load.cache_reset!r}: the marker "
            "method opens each probe with its run's id, so the targets would be asked different "
            "inputs; set load.cache_reset to the targets' reset (reset_prefix_cache, flush_cache "
            "or cache_prompt)"
        )
    if scenario.load.until_bound is not None:
        raise InputError(
            f"{scenario.source}: load.until_bound: compare sends every target the same samples; "
            "set load.samples instead"
        )


# What a probe asks the server (``probe.probe_inputs``); its grading is the reference's either way.
_ASKED = ("input", "params", "max_tokens")


def check_reference_run(scenario: Scenario, meta: dict[str, Any], where: Path) -> None:
    """A saved reference run stands for the reference only where it was asked what the candidates
    are: a probe both have, asked otherwise (another prompt, params or max_tokens), would pair
    answers to two questions, so it is refused (``InputError``) before anything is sent. A run
    from before inputs were recorded has nothing to check."""
    recorded = meta.get("inputs") or {}
    for probe in scenario.probes:
        then = recorded.get(probe.id)
        if then is None:  # the saved run lacks the probe: its items are missing, evidence short
            continue
        now = probe_inputs(probe, scenario.params)
        changed = [key for key in _ASKED if key in then and then[key] != now[key]]
        if changed:
            raise InputError(
                f"--reference-run {where}: probe {probe.id!r} was asked otherwise there (its "
                f"{', '.join(changed)} differ from the scenario's); save a run of this scenario"
            )


async def run_comparison(
    targets: Sequence[Target],
    out: Path,
    *,
    reference: str,
    together: bool = False,
    resume: bool = False,
    stop: asyncio.Event | None = None,
    on_record: Callable[[str, Record], None] | None = None,
    reference_run: Path | None = None,
) -> dict[str, RunResult | None]:
    """Every target's run into ``out/<name>/`` (the reference's only when no ``reference_run`` is
    given), in turns or ``together``; a target whose run ends aborted or raises is skipped for the
    levels left, and the others go on. Returns each target's last result (None: it never ran).
    ``resume``: each run directory that holds a run is resumed, the samples it lacks sent."""
    stop = stop or asyncio.Event()
    dirs = target_dirs([t.name for t in targets], out)
    if not resume:
        write_manifest(out, targets, reference, together=together, reference_run=reference_run)
    results: dict[str, RunResult | None] = {t.name: None for t in targets}
    dead: set[str] = set()

    async def turn(target: Target, levels: list[Level] | None) -> None:
        if target.name in dead or stop.is_set():
            return
        run_dir = dirs[target.name]
        tap = None if on_record is None else (lambda r, n=target.name: on_record(n, r))
        try:
            result = await run_scenario(
                target.scenario,
                run_dir,
                on_record=tap,
                stop=stop,
                resume=RunDir(run_dir).holds_run(),
                levels=levels,
            )
        except (TargetError, SummaryError):
            dead.add(target.name)  # a target failed: the others' runs go on, the gate says 3
            return
        results[target.name] = result
        if result.state == "aborted":
            dead.add(target.name)

    running = [t for t in targets if not (reference_run is not None and t.name == reference)]
    if together:
        await asyncio.gather(*(turn(t, None) for t in running))
        return results
    for level in scenario_levels(running[0].scenario):
        for target in running:
            await turn(target, [level])
    return results


def target_dirs(names: Sequence[str], out: Path) -> dict[str, Path]:
    """Each target's run directory: ``out/<name>``, its name made a file name (``rundir.apart``).
    A name that is one of the comparison's own files (a target called ``compare.json``) gets its
    hash after it, as two names that would share a directory do: the file and the directory would
    otherwise be one path."""
    return {name: out / _not_own(name, file) for name, file in apart(list(names)).items()}


def _not_own(name: str, file: str) -> str:
    if file.lower() not in OWN_FILES:  # lower: a file system that ignores case holds one of each
        return file
    return f"{file}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def write_manifest(
    out: Path,
    targets: Sequence[Target],
    reference: str,
    *,
    together: bool,
    reference_run: Path | None,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    dirs = target_dirs([t.name for t in targets], out)
    doc = {
        "reference": reference,
        "together": together,
        "started_at": now_iso(),
        "scenario_source": targets[0].scenario.source,
        "targets": [
            {
                "name": t.name,
                "base_url": t.scenario.target.base_url,
                "model": t.scenario.target.model,
                "run_dir": str(
                    reference_run.resolve()
                    if reference_run is not None and t.name == reference
                    else dirs[t.name].name
                ),
            }
            for t in targets
        ],
        **({"reference_run": str(reference_run.resolve())} if reference_run is not None else {}),
    }
    write_json(out / MANIFEST, doc)


def read_manifest(out: Path) -> dict[str, Any]:
    """``compare-run.json``, checked for what its readers use; a directory without one is no
    comparison."""
    path = out / MANIFEST
    if not path.is_file():
        raise RunDirError(f"{out}: not a kevload comparison ({MANIFEST} missing)")
    doc: dict[str, Any] = read_json(path)
    try:
        names = [t["name"] for t in doc["targets"]]
        dirs = [str(t["run_dir"]) for t in doc["targets"]]
        reference = str(doc["reference"])
    except (KeyError, TypeError):
        raise RunDirError(
            f"{path}: expected targets[] with name and run_dir, and reference"
        ) from None
    if reference not in names or len(dirs) != len(set(names)):
        raise RunDirError(f"{path}: reference {reference!r} is none of its targets")
    return doc


def read_side(name: str, run_dir: Path, *, trust_graders: bool) -> Side:
    """A target's run directory folded for the comparison; a target that never wrote a record is a
    side with nothing at any level (its levels then lack every item: evidence short)."""
    run = RunDir(run_dir)
    if not run.record_files():
        return Side(name=name, items={}, load={}, state="missing")
    meta = run.meta()
    gradings = gradings_of(meta, run.run_json, trust_graders=trust_graders)
    slo = Slo(**meta["load"]["slo"]) if meta["load"].get("slo") else None
    side = fold_side(name, run.records(), gradings=gradings, state=meta.get("state"), slo=slo)
    if side.state == COMPLETE and (unsent := unsent_levels(meta, side)):
        # A stop between two turns can end a run complete without its later levels: on both sides
        # alike, nothing would pair them, and the gate would pass what was never compared.
        return dataclasses.replace(side, state=PARTIAL, unsent=unsent)
    return side


def unsent_levels(meta: dict[str, Any], side: Side) -> list[str]:
    """The levels of the run's scenario (run.json's ``load``) of which ``side`` holds no record."""
    load = meta.get("load") or {}
    planned = [(0, r) for r in load.get("rate") or []] or [
        (c, None) for c in load.get("concurrency") or []
    ]
    ran = {(c, r) for _, c, r in side.levels()}
    return [f"c={c}" if r is None else f"r={r:g}/s" for c, r in planned if (c, r) not in ran]


def finish_comparison(
    out: Path, *, trust_graders: bool = False, own: bool = False, seed: int = 0
) -> Comparison:
    """Recompute ``out/compare.json`` from the targets' records (after a comparison, or by
    ``report``). Python graders are imported with ``trust_graders``, or with ``own`` from the runs
    this process just made (those under ``out``; a saved ``--reference-run`` is data from
    elsewhere)."""
    doc = read_manifest(out)
    sides = [
        read_side(
            t["name"],
            out / t["run_dir"],
            trust_graders=trust_graders or (own and not Path(t["run_dir"]).is_absolute()),
        )
        for t in doc["targets"]
    ]
    notes = []
    if "reference_run" in doc:
        notes.append(
            f"the reference's answers come from a saved run ({doc['reference_run']}): its time "
            "window differs from the candidates', so latency ratios compare two different hours"
        )
    if doc.get("together"):
        notes.append("every target ran at the same time (--together)")
    notes += [
        f"{side.name}: no record at {', '.join(side.unsent)}: the run never sent them"
        for side in sides
        if side.unsent
    ]
    comparison = compare_sides(sides, doc["reference"], seed=seed, notes=notes)
    write_json(out / COMPARE, comparison.to_json())
    return comparison
