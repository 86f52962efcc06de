"""``kevload compare``: before a rollout, two or more servers — given by URL or started from the
built-in targets — get the same scenario at the same levels in one time window (``load.comparing``),
and their answers are compared item by item (``compare.rollout``), gated (``compare.gate``) and
shown (``outputs.comparison``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgspec

from kevload.compare.gate import GateResult, GateRules, gate
from kevload.compare.graded import gradings_of
from kevload.compare.rollout import Comparison
from kevload.errors import InputError, RunDirError, TargetError
from kevload.inputs.grading import IMPORT
from kevload.inputs.scenario import Scenario, load_scenario
from kevload.load import comparing, eventloop
from kevload.load.resuming import recorded_scenario
from kevload.outputs import comparison as shown
from kevload.records.rundir import RunDir
from kevload.records.store import read_json, write_json
from kevload.servers.targets import NAMES, TargetSettings

GATE = "gate.json"


@dataclass(frozen=True)
class Given:
    """The targets as the command line names them, in order: (name, URL or built-in target name,
    built-in)."""

    targets: list[tuple[str, str, bool]]
    models: dict[str | None, str]  # by target name; None: every target without its own
    # by built-in target name: what ``--target NAME=BUILTIN:KEY=VALUE,…`` set (else the defaults)
    settings: dict[str, TargetSettings] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    comparison: Comparison
    result: GateResult
    out: Path


def named(specs: Sequence[str], option: str) -> list[tuple[str, str]]:
    """``NAME=VALUE`` pairs of an option given several times; one without a name is bad usage naming
    it."""
    out = []
    for spec in specs:
        name, sep, value = spec.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise InputError(
                f"{option} {spec!r}: expected NAME=VALUE, e.g. {option} old=http://…/v1"
            )
        out.append((name.strip(), value.strip()))
    return out


def given(urls: Sequence[str], builtins: Sequence[str], models: Sequence[str]) -> Given:
    """The command line's targets (``--url`` ones first, then ``--target`` ones) and models,
    checked."""
    targets = [(n, u, False) for n, u in named(urls, "--url")]
    settings = {}
    for name, spec in named(builtins, "--target"):
        builtin, settings[name] = builtin_settings(name, spec)
        targets.append((name, builtin, True))
    names = [t[0] for t in targets]
    by_name: dict[str | None, str] = {}
    for spec in models:
        name, sep, model = spec.partition("=")
        if sep and name in names:
            by_name[name] = model
        elif None in by_name:
            raise InputError(
                f"--model {spec!r}: a second model for every target; name it NAME=MODEL"
            )
        else:
            by_name[None] = spec
    return Given(targets=targets, models=by_name, settings=settings)


def builtin_settings(name: str, spec: str) -> tuple[str, TargetSettings]:
    """``llamacpp:slots=1,cache_prompt=false`` → the built-in target and its settings (one setting
    changed is a rollout too: ``--target one=llamacpp:slots=1 --target four=llamacpp``)."""
    builtin, _, given = spec.partition(":")
    if builtin not in NAMES:
        raise InputError(
            f"--target {name}={spec}: expected a built-in target ({', '.join(NAMES)}), "
            "optionally with settings, e.g. llamacpp:slots=1"
        )
    pairs = filter(None, (p.strip() for p in given.split(",")))
    try:
        return builtin, TargetSettings.from_pairs(
            pairs, lambda pair: f"expected KEY=VALUE settings, got {pair!r}"
        )
    except InputError as exc:
        raise InputError(f"--target {name}={spec}: {exc}") from None


def compare(
    scenario_path: Path | None,
    targets: Given,
    *,
    out: Path,
    reference: str | None,
    together: bool,
    resume: bool,
    reference_run: Path | None,
    rules: GateRules,
    log: Callable[[str], None],
    trust_graders: bool = False,
) -> tuple[Outcome | None, int | None]:
    """The whole command: the targets' runs, then the comparison written (compare.json, compare.md)
    and gated. Returns it with the signal that stopped the runs, if any; None for it when stopped
    while a built-in target started, before anything was sent."""
    if resume:
        reference, reference_run = _resumed_reference(out, reference, reference_run)
    names = [t[0] for t in targets.targets]
    if reference_run is not None:
        names = [reference or "reference", *names]
    name = comparing.check_targets(names, reference)
    scenario = _compared_scenario(scenario_path, out, resume)
    if reference_run is not None:  # read before anything is sent: its graders too
        saved = RunDir.open(reference_run)
        comparing.check_reference_run(scenario, saved.meta(), reference_run)
        gradings_of(saved.meta(), saved.run_json, trust_graders=trust_graders)

    async def work(stop: asyncio.Event) -> None:
        async with contextlib.AsyncExitStack() as stack:
            started = []
            for target_name, where, builtin in targets.targets:
                sc = await _target_scenario(
                    stack, scenario, target_name, where, builtin, targets, log, stop
                )
                if sc is None:
                    return
                started.append(comparing.Target(target_name, sc))
            if reference_run is not None:
                started.insert(0, comparing.Target(name, scenario))
            await comparing.run_comparison(
                started,
                out,
                reference=name,
                together=together,
                resume=resume,
                stop=stop,
                reference_run=reference_run,
            )

    _, signum = eventloop.run(work)
    if not (out / comparing.MANIFEST).is_file():
        return None, signum
    # Its own runs' python graders are imported; a saved reference run's only with trust_graders.
    return finish(out, rules, trust_graders=trust_graders, own=True), signum


def _resumed_reference(
    out: Path, reference: str | None, reference_run: Path | None
) -> tuple[str | None, Path | None]:
    """On --resume, the reference it was started with, and its saved run if it had one (unless
    given again)."""
    recorded = comparing.read_manifest(out)
    reference = reference or recorded["reference"]
    if reference_run is None and "reference_run" in recorded:
        reference_run = Path(recorded["reference_run"])
    return reference, reference_run


def _compared_scenario(scenario_path: Path | None, out: Path, resume: bool) -> Scenario:
    """The scenario the targets run: the one started with on --resume, else SCENARIO's, into an
    empty --out; checked as a comparison needs it."""
    if resume:
        scenario = _resumed(out)
    elif scenario_path is None:
        raise InputError("missing SCENARIO (or --resume DIR)")
    else:
        scenario = load_scenario(scenario_path)
        if out.exists() and any(out.iterdir()):
            raise InputError(
                f"--out {out}: not empty; give a directory of its own (or --resume {out})"
            )
    comparing.check_scenario(scenario)
    return scenario


def finish(
    out: Path, rules: GateRules | None, *, trust_graders: bool, own: bool = False
) -> Outcome:
    """compare.json recomputed from the runs, compare.md and compare.html beside it, and the gate,
    whose rules and findings go to gate.json; ``rules`` None (``kevload report``): the rules
    gate.json recorded, else the defaults."""
    if rules is None:
        rules = _recorded_rules(out / GATE)
    comparison = comparing.finish_comparison(out, trust_graders=trust_graders, own=own)
    result = gate(comparison, rules)
    (out / "compare.md").write_text(shown.markdown(comparison, result), encoding="utf-8")
    (out / "compare.html").write_text(shown.html_page(comparison, result), encoding="utf-8")
    doc = {"code": int(result.code), "findings": result.lines, "rules": asdict(rules)}
    write_json(out / GATE, doc)
    return Outcome(comparison=comparison, result=result, out=out)


def _recorded_rules(path: Path) -> GateRules:
    if not path.is_file():
        return GateRules()
    try:
        return msgspec.convert(read_json(path).get("rules", {}), GateRules)
    except (msgspec.ValidationError, AttributeError):
        raise RunDirError(
            f"{path}: rules: expected the gate's rules as compare wrote them"
        ) from None


async def _target_scenario(
    stack: contextlib.AsyncExitStack,
    scenario: Scenario,
    name: str,
    where: str,
    builtin: bool,
    targets: Given,
    log: Callable[[str], None],
    stop: asyncio.Event,
) -> Scenario | None:
    """The scenario as sent to one target: its URL and model (a built-in target started for the
    command)."""
    model = targets.models.get(name, targets.models.get(None))
    if not builtin:
        settings = {"target.base_url": where, **({"target.model": model} if model else {})}
        return scenario.with_settings(settings, source=f"--url {name}")
    from kevload.servers.targets import serving

    started = targets.settings.get(name, TargetSettings())
    running = await stack.enter_async_context(serving(where, started, log=log, stop=stop))
    if running is None:
        return None
    return scenario.with_settings(
        {"target.base_url": running.url, "target.model": running.model}, source=f"--target {name}"
    )


def _resumed(out: Path) -> Scenario:
    """The scenario of a stopped comparison: that of the first of its own runs that began. A saved
    --reference-run is not one: its scenario may grade or ask otherwise, and its python graders
    are imported only with --trust-graders."""
    doc = comparing.read_manifest(out)
    for target in doc["targets"]:
        if "reference_run" in doc and target["name"] == doc["reference"]:
            continue
        run = RunDir(out / target["run_dir"])
        if run.run_json.is_file():
            return recorded_scenario(run, graders=IMPORT)
    raise TargetError(f"{out}: no target's run began; start the comparison again")


def given_again(out: Path) -> Given:
    """A stopped comparison's targets as it recorded them (``--resume`` without --url): their URLs
    and models."""
    doc = comparing.read_manifest(out)
    targets = [t for t in doc["targets"] if t.get("base_url")]
    if "reference_run" in doc:
        targets = [t for t in targets if t["name"] != doc["reference"]]
    return Given(
        targets=[(t["name"], t["base_url"], False) for t in targets],
        models={t["name"]: t["model"] for t in targets},
    )
