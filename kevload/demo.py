"""`kevload demo`: the guide's steps 1–3 against the built-in real targets side by side, and vLLM's batch-size sweep."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.columns import Columns
from rich.console import Console
from rich.table import Table

from kevload import exitcode
from kevload.aio import until_stopped
from kevload.compare.graded import level_name
from kevload.compare.stats import drift_upper_bound
from kevload.guide.diagnose import DiagnoseOptions, diagnose
from kevload.inputs.probe import Probe
from kevload.inputs.scenario import Scenario, build_scenario, load_scenario
from kevload.load.runs import run_scenario
from kevload.outputs import gradedview
from kevload.outputs.report import cell_text
from kevload.records.machine import where_text
from kevload.records.store import default_run_dir, read_json
from kevload.servers.sweep import STOPPED
from kevload.servers.sweepfile import setting_row, sweep_markdown, write_sweep
from kevload.servers.sweepgrid import Grid
from kevload.servers.targets import RunningTarget, TargetSettings, serving
from kevload.summary import (
    CellSummary,
    RunSummary,
    answered_per_s,
    label_of,
    position_label,
    row_cells,
)

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "demo.toml"
# Good or bad: a share of the shipped graded set at c=1 and c=4, graded per level against serial.
# Two samples a cell
# keep it to about two minutes a target on two cores; the unit of the per-level test is the probe,
# not the sample.
GRADED_SCENARIO = SCENARIO.with_name("graded.toml")
GRADED_LEVELS = (1, 4)
GRADED_SAMPLES = 2
LABELS = {"llamacpp": "llama.cpp", "transformers": "transformers", "vllm": "vLLM"}
# What each target runs with: four slots. vLLM in eager mode: torch.compile adds about 40 s to each
# of its
# three starts (the column and two sweep settings), minutes on a loaded machine; the demo has 15 in
# all.
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


async def run_demo(
    names: list[str],
    *,
    samples: int,
    console: Console,
    stop: asyncio.Event,
    out: Path | None = None,
    timeout_floor: float = TIMEOUT_FLOOR_S,
) -> exitcode.ExitCode:
    """Run the steps against each target in turn; the exit code for what was seen (``exitcode.for_demo``).

    Once ``stop`` is set (Ctrl-C under ``aio.run``) the step in progress finishes with what it has,
    nothing new starts, servers are stopped, and what was collected is still shown. The last lines
    say, one per target, what it found or which step failed and why (``closing_line``).
    """
    out = out or default_run_dir("demo")
    results: dict[str, list[tuple[str, RunSummary]]] = {}
    graded: dict[str, RunSummary] = {}
    sweeps: dict[str, dict[str, Any]] = {}
    ran: dict[str, list[Ran]] = {}
    for name in names:
        if stop.is_set():
            break
        console.print(
            f"[bold]{LABELS[name]}[/bold]: starting (the first start builds or installs it) …"
        )
        ran[name] = []
        results[name], graded_run = await _run_target(
            name, samples, out, console, stop, ran[name], timeout_floor
        )
        if graded_run is not None:
            graded[name] = graded_run
        step2 = next((s for step, s in results[name] if step == STEPS[1].name), None)
        if name in SWEEP_SLOTS and step2 is not None and not stop.is_set():
            pace = Pace(timeout_floor, serial_seconds(results[name]))
            sweeps[name] = await _sweep(name, step2, samples, out, console, stop, ran[name], pace)
    shown = {name: steps for name, steps in results.items() if steps}
    if shown:
        console.print(
            Columns([_table(name, steps) for name, steps in shown.items()], padding=(0, 4))
        )
    for name, steps in shown.items():
        console.print(headline(LABELS[name], steps))
        console.print(logprob_line(LABELS[name], steps))
    for name, summary in graded.items():
        for line in graded_lines(LABELS[name], summary):
            console.print(line, markup=False, highlight=False)
    for name, sweep in sweeps.items():
        console.print(
            f"\n[bold]{LABELS[name]}: step 2 at each max_num_seqs (the max batch size)[/bold]"
        )
        console.print(sweep_markdown(sweep), markup=False, highlight=False, soft_wrap=True)
        for line in sweep_lines(sweep):
            console.print(line)
    for line in where_lines(out):
        console.print(line, markup=False, highlight=False)
    if stop.is_set():
        console.print("stopped: the matrices hold what was collected before the stop")
    console.print(f"runs: {out}/ (re-read any with `kevload report DIR`)")
    failed = any(ran_.summary.verdict == "target_failed" for runs in ran.values() for ran_ in runs)
    failed |= any(
        row["verdict"] == "target_failed" for sweep in sweeps.values() for row in sweep["rows"]
    )
    code = exitcode.for_demo(target_failed=failed)
    console.print("\n[bold]in short[/bold]")
    for name, runs in ran.items():
        console.print(closing_line(name, runs), markup=False, highlight=False)
    if not stop.is_set():  # a stopped demo exits 130 or 143, as its signal says
        said = "a target failed a step (said above)" if failed else "every step was answered"
        console.print(f"exit {int(code)}: {said}", markup=False, highlight=False)
    return code


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
    """The slowest answered serial request (e2e seconds) of the steps' serial cells; None if none."""
    times = [
        c.latency.get("e2e", {}).get("max")
        for _, s in steps
        for c in s.probe_cells()
        if c.concurrency == 1
    ]
    return max((t for t in times if t is not None), default=None)


def closing_line(name: str, runs: list[Ran]) -> str:
    """What one target's runs found, in a line; where one failed, the first such step and why."""
    label = LABELS[name]
    failed = next((r for r in runs if r.summary.verdict == "target_failed"), None)
    if failed is not None:
        return f"{label} {failed.name}: {_failure_words(name, failed)}"
    if not runs:
        return f"{label}: nothing ran (stopped before its first step answered)"
    fixed = [c for r in runs if r.name[0] in "23" for c in r.summary.probe_cells()]
    drift = sorted({c.concurrency for c in fixed if c.drift})
    said = [
        f"fixed params drift at c={','.join(map(str, drift))}"
        if drift
        else "fixed params stable under batching"
        if fixed
        else "no fixed-parameter step answered"
    ]
    graded = next((r.summary for r in runs if r.name == "graded"), None)
    if graded is not None and graded.accuracy:
        accuracy = ", ".join(
            f"{e['accuracy']:.1%} at {level_name(e)}"
            for e in graded.accuracy
            if e["accuracy"] is not None
        )
        said.append(
            f"graded accuracy {accuracy}, {len(graded.bad_cells or ())} answers turned bad under load"
        )
    return f"{label}: {'; '.join(said)}"


def _failure_words(name: str, ran: Ran) -> str:
    errors = dict(ran.summary.errors_by_type)
    timeouts = errors.pop("timeout", 0)
    words = []
    if timeouts:
        words.append(
            f"{timeouts} request{'s' if timeouts > 1 else ''} timed out after {ran.timeout_s:g} s "
            f"— the machine may be too slow; rerun with `kevload demo --targets {name} "
            f"--timeout {2 * ran.timeout_s:g}`"
        )
    if errors:
        words.append(
            "requests failed (" + ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) + ")"
        )
    return "; ".join(words) or "target failed (the lines above say how)"


def where_lines(out: Path) -> list[str]:
    """Where the demo's runs ran (their run.json's machine and engine), each once: its figures are this
    machine's and these engines', and move with both."""
    found = (where_text(read_json(path)) for path in sorted(out.glob("**/run.json")))
    lines = list(dict.fromkeys(w for w in found if w))
    return [f"measured on {w}" for w in lines] + (
        ["(one machine's figures: they move with the CPU and the engine's version)"]
        if lines
        else []
    )


def headline(label: str, steps: list[tuple[str, RunSummary]]) -> str:
    """One line saying what the matrices show, with the sample size behind the claim."""
    fixed = [
        (name, s) for name, s in steps if not name.startswith("1 ") and "batching off" not in name
    ]
    cells = [c for _, s in fixed for c in s.probe_cells()]
    baseline = next((s for name, s in steps if name.startswith("1 ")), None)
    base_distinct = baseline and max(c.distinct for c in baseline.probe_cells())
    sampling = f"T=0.8 without seed: {base_distinct} distinct in serial calls; " if baseline else ""
    if any(s.verdict == "target_failed" for _, s in steps):
        return f"{label}: target failed ({', '.join(f'{k}: {v}' for k, v in steps[-1][1].errors_by_type.items())})"
    if not cells:
        return f"{label}: {sampling}stopped before the fixed-parameter steps"
    drift = [c for c in cells if c.drift]
    if not drift:
        n = min(c.ok for c in cells)
        return (
            f"{label}: {sampling}fixed params stable under batching "
            f"(n={sum(c.ok for c in cells)}, {n} per cell: drift rate < {drift_upper_bound(n):.0%} "
            f"per cell)"
        )
    first = min(
        drift, key=lambda c: c.first_divergence_chars if c.first_divergence_chars is not None else 0
    )
    where = (
        f"outputs leave the serial one {_chars(first.first_divergence_chars, drift)} (0-based)"
        if first.first_divergence_chars is not None
        else "serial outputs already differ"
    )
    levels = sorted({c.concurrency for c in drift})
    off = next((s for name, s in steps if "batching off" in name), None)
    after = ""
    if off is not None:
        after = "; batching off: " + {
            "deterministic": "stable",
            "nondeterministic": "still drifts",
        }.get(off.verdict, off.verdict)
    return (
        f"{label}: {sampling}fixed params drift once batched (c={','.join(map(str, levels))}: up "
        f"to "
        f"{max(c.distinct for c in drift)} distinct in {first.ok}), {where}{after}"
    )


def _chars(first: int, drift: list[CellSummary]) -> str:
    """Where the drifting outputs leave the serial one: ``at char 7`` when every one leaves it there (a window of
    one point, which read "between char 7 and 7"), else ``between char 7 and 31``."""
    last = max(
        (c.last_divergence_chars for c in drift if c.last_divergence_chars is not None),
        default=first,
    )
    return f"at char {first}" if last <= first else f"between char {first} and {last}"


def logprob_line(label: str, steps: list[tuple[str, RunSummary]]) -> str:
    """What the per-token logprobs of the fixed-parameter steps say against serial, level by level."""
    cells = [
        c
        for name, s in steps
        if not name.startswith("1 ")
        for c in s.probe_cells()
        if c.logprob_samples or c.logprob_gap
    ]
    if not cells:
        return f"{label} logprobs: none returned, outputs compared as text only"
    differ = [c for c in cells if c.logprob_bitwise is False]
    n = sum(c.logprob_samples or 0 for c in cells)
    unclaimed = [c for c in cells if c.logprob_bitwise is None]
    gaps = (
        f"; no claim in {len(unclaimed)} (c={','.join(str(c.concurrency) for c in unclaimed)}), "
        f"where some "
        "samples came without logprobs"
        if unclaimed
        else ""
    )
    if not differ and not unclaimed:
        levels = sorted({c.concurrency for c in cells})
        return (
            f"{label} logprobs: bitwise equal to serial in all {len(cells)} fixed-param cells "
            f"(c={','.join(map(str, levels))}; {n} samples compared)"
        )
    if not differ:
        return f"{label} logprobs: no difference from serial among the {n} samples compared{gaps}"
    worst = max(differ, key=lambda c: c.logprob_max_abs_diff or 0)
    first = min(
        (t for c in differ if (t := c.first_logprob_divergence_token) is not None), default=None
    )
    levels = sorted({c.concurrency for c in differ})
    diff = worst.logprob_max_abs_diff
    return (
        f"{label} logprobs: {len(differ)} of {len(cells)} fixed-param cells differ from serial "
        f"(c={','.join(map(str, levels))}), from {position_label(token=first)}"
        + (f", largest |difference| {diff:.3g}" if diff else "")
        + f"; {n} samples compared{gaps}"
    )


def graded_lines(label: str, summary: RunSummary) -> list[str]:
    """The graded step: one line per level (accuracy [CI], good→bad and bad→good against serial, McNemar p), then
    the items load turned bad, by name; a target that failed says so after what was graded before."""
    lines = [
        f"{label} graded {entry['n']} items, {gradedview.level_text(entry)}"
        for entry in summary.accuracy or ()
    ]
    if summary.bad_cells:
        lines.append(
            f"{label} graded: answers load turned bad: "
            + ", ".join(label_of(n) for n in summary.bad_cells)
        )
    if summary.verdict == "target_failed":
        errors = ", ".join(f"{k}: {v}" for k, v in summary.errors_by_type.items())
        lines.append(f"{label} graded: target failed ({errors})")
    return lines or [f"{label} graded: no answer graded"]


def graded_probes(probes: tuple[Probe, ...]) -> tuple[Probe, ...]:
    """The demo's share of the graded set (ids ``kind-lang-i``): items 0 and 1 of every kind in both languages, and
    item 2 of the sums and the counts — 24 probes."""

    def kept(probe: Probe) -> bool:
        kind, _, index = probe.id.split("-")
        return int(index) < 2 or (int(index) == 2 and kind in ("sum", "count"))

    return tuple(p for p in probes if kept(p))


def graded_scenario(url: str, model: str, timeout_s: float | None = None) -> Scenario:
    """scenarios/graded.toml against the started target, on the demo's share of its items, levels and samples;
    ``timeout_s`` its requests' timeout (None: the file's)."""
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
    timeout = (
        scenario.target.timeout
        if pace is None
        else pace.timeout(max(GRADED_LEVELS), max(p.max_tokens or 0 for p in scenario.probes))
    )
    console.print(
        f"  running {run_dir.name} (graded set, c={','.join(map(str, GRADED_LEVELS))}, "
        f"timeout {timeout:g} s) …",
        style="dim",
    )
    scenario = scenario.with_settings({"target.timeout": timeout}, source="demo")
    return Ran("graded", (await run_scenario(scenario, run_dir, stop=stop)).summary, timeout)


def sweep_lines(sweep: dict[str, Any]) -> list[str]:
    """Per setting, what its outputs do against serial and what the highest level costs: the trade-off at a glance."""
    lines = []
    for row in sweep["rows"]:
        cells = sorted(row_cells(row), key=lambda c: c.level_order)
        if row.get("error"):  # a server that died mid-run: its cells after that hold only failures
            lines.append(f"{row['setting']}: failed: {row['error'].splitlines()[0]}")
            continue
        if row.get("verdict") == "not_run":
            lines.append(f"{row['setting']}: {row['verdict_line']}")
            continue
        if not cells:
            continue

        def levels(chosen: list[CellSummary]) -> str:
            return ",".join(str(c.concurrency) for c in chosen)

        drift = [c for c in cells if c.drift]
        latent = [c for c in cells if c.latent_drift]
        if drift:
            said = f"text drifts at c={levels(drift)}"
        elif latent:
            said = (
                f"the serial text everywhere, other logprobs at c={levels(latent)} "
                f"(largest |difference| {max(c.logprob_max_abs_diff or 0 for c in latent):.3g})"
            )
        elif all(c.logprob_bitwise for c in cells):
            said = f"logprobs bitwise equal to serial at c={levels(cells)}"
        else:
            said = f"the serial text at c={levels(cells)}"
        top = cells[-1]
        p50 = top.latency.get("e2e", {}).get("p50")
        cost = f"{answered_per_s(top) or 0:.2f} req/s" + (
            f", p50 {p50:.1f} s" if p50 is not None else ""
        )
        lines.append(
            f"{row['setting']}: {said}; at c={top.concurrency} {cost} ({top.ok} samples per cell)"
        )
    return lines


async def _run_target(
    name: str,
    samples: int,
    out: Path,
    console: Console,
    stop: asyncio.Event,
    ran: list[Ran],
    timeout_floor: float,
) -> tuple[list[tuple[str, RunSummary]], RunSummary | None]:
    """The steps' runs, and the graded run (None where it did not run); every run also onto ``ran``."""
    log = _log(console)
    done: list[tuple[str, RunSummary]] = []
    graded = None
    pace = Pace(timeout_floor)
    async with serving(name, SETTINGS[name], log=log, stop=stop) as target:
        if target is None:
            return done, graded
        for i, step in enumerate(STEPS):
            if stop.is_set():
                return done, graded
            run = await _run_step(
                target, step, samples, out / f"{name}-step{i + 1}", console, stop, pace
            )
            ran.append(run)
            _keep(done, step.name, run.summary)
            pace = Pace(timeout_floor, serial_seconds(done))
        if stop.is_set():
            return done, graded
        graded_run = await run_graded(
            target.url, target.model, out / f"{name}-graded", console, stop, pace
        )
        ran.append(graded_run)
        graded = graded_run.summary
        if name in SWEEP_SLOTS:
            # Its sweep below is the guide's next step (a smaller max batch size); diagnose would
            # cost minutes more (several on a loaded machine) than the demo's 15 allow.
            console.print(
                f"  {LABELS[name]}: diagnose left out, the sweep follows "
                f"(kevload diagnose --target {name})",
                style="dim",
            )
            await _say_if_failed(target, console)
            return done, graded
        await _diagnose(target, out, console, stop, pace)
    if stop.is_set():
        return done, graded
    verdicts = {step_name: s.verdict for step_name, s in done}
    drifted = [
        step
        for step in STEPS
        if step.fixed and verdicts.get(step.name, "deterministic") != "deterministic"
    ]
    if drifted:
        # The guide's next move for crosstalk: turn batching off and run the same step again. The
        # first drifting step, at its lowest and highest level only: unbatched CPU serving is slow.
        step = drifted[0]
        console.print(
            f"  {LABELS[name]} drifted; rerunning '{step.name}' (c=1 and c=4) with batching off …"
        )
        async with serving(
            name, replace(SETTINGS[name], batching=False), log=log, stop=stop
        ) as target:
            if target is None:
                return done, graded
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
    return done, graded


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


async def _sweep(
    name: str,
    step2: RunSummary,
    samples: int,
    out: Path,
    console: Console,
    stop: asyncio.Event,
    ran: list[Ran],
    pace: Pace,
) -> dict[str, Any]:
    """Step 2 at each max_num_seqs, as `kevload sweep --target NAME --grid max_num_seqs=…` runs it; the column's
    own setting is its step 2 run, not run again."""
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
            name, replace(SETTINGS[name], slots=slots), log=_log(console), stop=stop
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


def _log(console: Console) -> Callable[[str], None]:
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


def _table(name: str, steps: list[tuple[str, RunSummary]]) -> Table:
    levels = sorted({c.concurrency for _, s in steps for c in s.probe_cells()})
    table = Table(title=f"{LABELS[name]}: distinct outputs", title_justify="left")
    table.add_column("step")
    for level in levels:
        table.add_column(f"c={level}", justify="right")
    for step_name, summary in steps:
        by_level = {c.concurrency: c for c in summary.probe_cells()}
        texts = []
        for level in levels:
            cell = by_level.get(level)
            style = "red" if cell and cell.drift else "green"
            texts.append(f"[{style}]{cell_text(cell)}[/{style}]" if cell else "")
        table.add_row(step_name, *texts)
    return table
