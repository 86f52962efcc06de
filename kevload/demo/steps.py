"""The demo's steps against one built-in target: steps 1-3, the graded step, diagnose, the
batching-off rerun and vLLM's max-batch-size sweep, each a run whose timeout follows the server's
pace."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from kevload.guide.diagnose import DiagnoseOptions, diagnose
from kevload.inputs.probe import Probe
from kevload.inputs.scenario import Scenario, build_scenario, load_scenario
from kevload.load.eventloop import until_stopped
from kevload.load.runs import run_scenario
from kevload.records.summary import RunSummary
from kevload.servers.sweep import STOPPED
from kevload.servers.sweepfile import setting_row, write_sweep
from kevload.servers.sweepgrid import Grid
from kevload.servers.targets import RunningTarget, TargetSettings, serving

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "demo.toml"
# Good or bad: a share of the shipped graded set at c=1 and c=4, graded per level against serial.
# Two samples a cell keep it to about two minutes a target on two cores; the unit of the per-level
# test is the probe, not the sample.
GRADED_SCENARIO = SCENARIO.with_name("graded.toml")
GRADED_LEVELS = (1, 4)
GRADED_SAMPLES = 2
LABELS = {"llamacpp": "llama.cpp", "transformers": "transformers", "vllm": "vLLM"}
# What each target runs with: four slots. vLLM in eager mode: torch.compile adds about 40 s to each
# of its three starts (the column and two sweep settings), minutes on a loaded machine; the demo has
# 15 in all.
SETTINGS = {
    "llamacpp": TargetSettings(slots=4),
    "transformers": TargetSettings(slots=4),
    "vllm": TargetSettings(slots=4, enforce_eager=True),
}
# The max-batch-size sweep: step 2 again at these max_num_seqs; the column's own setting (4) is its
# step 2.
SWEEP_SLOTS = {"vllm": (1, 2)}

# Each step's request timeout follows the server's own pace, so a slow machine is not read as a
# failed server: the slowest serial answer of step 1, times the step's top level (a request there
# shares the server with that many), times its share of max_tokens, times a margin for a loaded
# machine's swings; never under the floor (`--timeout`, demo.toml's 120 s by default).
TIMEOUT_FLOOR_S = 120.0
TIMEOUT_MARGIN = 2.0

FIXED = {"temperature": 0, "top_p": 1, "seed": 1234}
PRODUCTION = {"temperature": 0.8, "top_p": 0.95}
DEMO_PROBE = Probe(
    id="story", prompt="Write a short story about a robot learning to paint.", max_tokens=32
)


@dataclass(frozen=True)
class Step:
    name: str
    settings: Mapping[str, Any]  # dotted scenario keys set on demo.toml
    fixed: bool


@dataclass(frozen=True)
class Ran:
    """A run the demo made against one target: what it is called in the closing lines, its summary
    and the request timeout it ran with (seconds)."""

    name: str
    summary: RunSummary
    timeout_s: float


STEPS = (
    Step("1 baseline (T=0.8, no seed)", {"params": PRODUCTION, "load.concurrency": [1]}, False),
    Step("2 fixed params, single", {"params": FIXED, "load.mode": "single"}, True),
    Step("3 fixed params, mixed", {"params": FIXED, "load.mode": "mixed"}, True),
)


@dataclass(frozen=True)
class Pace:
    """One server's pace: each step's request timeout from its slowest serial answer in step 1."""

    floor_s: float
    serial_s: float | None = None  # None before step 1 answered: the floor alone

    def timeout(self, level: int, max_tokens: int = DEMO_PROBE.max_tokens or 32) -> float:
        if self.serial_s is None:
            return self.floor_s
        share = max_tokens / (DEMO_PROBE.max_tokens or 32)
        return max(self.floor_s, float(math.ceil(TIMEOUT_MARGIN * self.serial_s * level * share)))


def serial_seconds(steps: list[tuple[str, RunSummary]]) -> float | None:
    """The slowest answered serial request (e2e seconds) of the steps' serial cells; None if
    none."""
    times = [
        c.latency.get("e2e", {}).get("max")
        for _, s in steps
        for c in s.probe_cells()
        if c.concurrency == 1
    ]
    return max((t for t in times if t is not None), default=None)


def graded_probes(probes: tuple[Probe, ...]) -> tuple[Probe, ...]:
    """The demo's share of the graded set (ids ``kind-lang-i``): items 0 and 1 of every kind in both
    languages, and item 2 of the sums and the counts — 24 probes."""

    def kept(probe: Probe) -> bool:
        kind, _, index = probe.id.split("-")
        return int(index) < 2 or (int(index) == 2 and kind in ("sum", "count"))

    return tuple(p for p in probes if kept(p))


def graded_scenario(url: str, model: str, timeout_s: float | None = None) -> Scenario:
    """scenarios/graded.toml against the started target, on the demo's share of its items, levels
    and samples; ``timeout_s`` its requests' timeout (None: the file's)."""
    whole = load_scenario(GRADED_SCENARIO)
    target = replace(whole.target, base_url=url, model=model)
    return build_scenario(
        target if timeout_s is None else replace(target, timeout=timeout_s),
        graded_probes(whole.probes),
        load=replace(whole.load, concurrency=GRADED_LEVELS, samples=GRADED_SAMPLES),
        params=whole.params,
        name="graded (demo)",
        source="demo",
    )


def graded_timeout(scenario: Scenario, pace: Pace) -> float:
    """The graded set's request timeout at its top level, from the server's pace."""
    return pace.timeout(max(GRADED_LEVELS), max(p.max_tokens or 0 for p in scenario.probes))


async def run_graded(
    url: str,
    model: str,
    run_dir: Path,
    console: Console,
    stop: asyncio.Event,
    pace: Pace | None = None,
) -> Ran:
    """The graded step, its timeout from ``pace`` (None: graded.toml's)."""
    scenario = graded_scenario(url, model)
    timeout = scenario.target.timeout if pace is None else graded_timeout(scenario, pace)
    console.print(
        f"  running {run_dir.name} (graded set, c={','.join(map(str, GRADED_LEVELS))}, "
        f"timeout {timeout:g} s) …",
        style="dim",
    )
    scenario = scenario.with_settings({"target.timeout": timeout}, source="demo")
    return Ran("graded", (await run_scenario(scenario, run_dir, stop=stop)).summary, timeout)


async def run_target(
    name: str,
    samples: int,
    out: Path,
    console: Console,
    stop: asyncio.Event,
    ran: list[Ran],
    done: list[tuple[str, RunSummary]],
    timeout_floor: float,
) -> None:
    """Every run onto ``ran`` (the graded one named ``graded``), the steps that answered onto
    ``done``: as they come, so a server that fails to restart midway leaves what ran before."""
    log = log_to(console)
    pace = Pace(timeout_floor)
    async with serving(name, SETTINGS[name], log=log, stop=stop) as target:
        if target is None:
            return
        for i, step in enumerate(STEPS):
            if stop.is_set():
                return
            run = await _run_step(
                target, step, samples, out / f"{name}-step{i + 1}", console, stop, pace
            )
            ran.append(run)
            _keep(done, step.name, run.summary)
            pace = Pace(timeout_floor, serial_seconds(done))
        if stop.is_set():
            return
        graded_run = await run_graded(
            target.url, target.model, out / f"{name}-graded", console, stop, pace
        )
        ran.append(graded_run)
        if name in SWEEP_SLOTS:
            # Its sweep below is the guide's next step (a smaller max batch size); diagnose would
            # cost minutes more (several on a loaded machine) than the demo's 15 allow.
            console.print(
                f"  {LABELS[name]}: diagnose left out, the sweep follows "
                f"(kevload diagnose --target {name})",
                style="dim",
            )
            await _say_if_failed(target, console)
            return
        await _diagnose(target, out, console, stop, pace)
    if not stop.is_set():
        await _rerun_unbatched(name, samples, out, console, stop, ran, done, pace)


async def _rerun_unbatched(
    name: str,
    samples: int,
    out: Path,
    console: Console,
    stop: asyncio.Event,
    ran: list[Ran],
    done: list[tuple[str, RunSummary]],
    pace: Pace,
) -> None:
    """The guide's next move for crosstalk: turn batching off and run the first drifting step again
    (onto ``done`` and ``ran``), at its lowest and highest level only: unbatched CPU serving is
    slow."""
    verdicts = {step_name: s.verdict for step_name, s in done}
    drifted = [
        step
        for step in STEPS
        if step.fixed and verdicts.get(step.name, "deterministic") != "deterministic"
    ]
    if not drifted:
        return
    step = drifted[0]
    console.print(
        f"  {LABELS[name]} drifted; rerunning '{step.name}' (c=1 and c=4) with batching off …"
    )
    async with serving(
        name, replace(SETTINGS[name], batching=False), log=log_to(console), stop=stop
    ) as target:
        if target is None:
            return
        off = Step(f"{step.name[0]} … batching off", step.settings, step.fixed)
        run = await _run_step(
            target,
            replace(off, settings={**step.settings, "load.concurrency": [1, 4]}),
            samples,
            out / f"{name}-nobatch",
            console,
            stop,
            pace,
        )
        ran.append(run)
        _keep(done, off.name, run.summary)
        await _say_if_failed(target, console)


async def _diagnose(
    target: RunningTarget, out: Path, console: Console, stop: asyncio.Event, pace: Pace
) -> None:
    console.print("  diagnose (the guide's steps as one command) …", style="dim")
    options = DiagnoseOptions(
        url=target.url,
        model=target.model,
        probe=DEMO_PROBE,
        params=PRODUCTION,
        samples=3,
        max_concurrency=4,
        timeout=pace.timeout(4),
        run_all=True,
        out=out / f"{target.name}-diagnose",
    )
    diagnosis = await until_stopped(diagnose(options, log=lambda m: None), stop)
    await _say_if_failed(target, console)
    if diagnosis is not None:
        causes = (
            "; ".join(f"{c['verdict']} ({c['reason']})" for c in diagnosis.causes)
            or diagnosis.reason
        )
        console.print(
            f"  {LABELS[target.name]} diagnose --all: {diagnosis.verdict}; causes found: {causes}"
        )


async def run_sweep(
    name: str,
    step2: RunSummary,
    samples: int,
    out: Path,
    console: Console,
    stop: asyncio.Event,
    ran: list[Ran],
    pace: Pace,
) -> dict[str, Any]:
    """Step 2 at each max_num_seqs, as `kevload sweep --target NAME --grid max_num_seqs=…` runs it;
    the column's own setting is its step 2 run, not run again."""
    own = SETTINGS[name].slots
    rows = {
        own: setting_row(
            f"max_num_seqs={own}", {"max_num_seqs": own}, {}, out / f"{name}-step2", step2
        )
    }
    sweep_dir = out / f"{name}-sweep"
    for slots in SWEEP_SLOTS[name]:
        if stop.is_set():
            break
        console.print(f"  {LABELS[name]} max_num_seqs={slots}: restarting with it …", style="dim")
        async with serving(
            name, replace(SETTINGS[name], slots=slots), log=log_to(console), stop=stop
        ) as target:
            if target is None:
                break
            run_dir = sweep_dir / f"max_num_seqs={slots}"
            step = replace(STEPS[1], name=f"sweep max_num_seqs={slots}")
            run = await _run_step(target, step, samples, run_dir, console, stop, pace)
            ran.append(run)
            await _say_if_failed(target, console)
        rows[slots] = setting_row(
            f"max_num_seqs={slots}", {"max_num_seqs": slots}, {}, run_dir, run.summary
        )
    # Every planned setting gets its row, as `kevload sweep` gives it: one not reached is a not_run
    # row saying why.
    grid = Grid(server={"max_num_seqs": sorted({own, *SWEEP_SLOTS[name]})}, scenario={})
    sweep_dir.mkdir(parents=True, exist_ok=True)  # no setting may have run to make it
    unrun = (
        STOPPED
        if stop.is_set()
        else "not run: the demo's sweep ended when a server before it failed to start"
    )
    return write_sweep(
        sweep_dir, grid, [rows[k] for k in sorted(rows)], complete=not stop.is_set(), unrun=unrun
    )


def log_to(console: Console) -> Callable[[str], None]:
    return lambda message: console.print(f"  {message}", style="dim")


async def _say_if_failed(target: RunningTarget, console: Console) -> None:
    failure = await asyncio.to_thread(target.failure)
    if failure is not None:
        console.print(f"  {failure}", markup=False, highlight=False)


def _keep(done: list[tuple[str, RunSummary]], name: str, summary: RunSummary) -> None:
    """A step stopped before its first probe answered has nothing to show."""
    if summary.probe_cells():
        done.append((name, summary))


async def _run_step(
    target: RunningTarget,
    step: Step,
    samples: int,
    run_dir: Path,
    console: Console,
    stop: asyncio.Event,
    pace: Pace,
) -> Ran:
    scenario = load_scenario(SCENARIO).with_settings(
        {
            "target.base_url": target.url,
            "target.model": target.model,
            "load.samples": samples,
            **step.settings,
        },
        source="demo",
    )
    timeout = pace.timeout(max(scenario.load.concurrency, default=1))
    scenario = scenario.with_settings({"target.timeout": timeout}, source="demo")
    console.print(f"  running {run_dir.name} (timeout {timeout:g} s) …", style="dim")
    return Ran(step.name, (await run_scenario(scenario, run_dir, stop=stop)).summary, timeout)
