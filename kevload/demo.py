"""`kevload demo`: the guide's steps 1–3 against the built-in real targets, shown side by side."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.columns import Columns
from rich.console import Console
from rich.table import Table

from kevload.diagnose import DiagnoseOptions, diagnose
from kevload.report import cell_text
from kevload.runs import run_scenario
from kevload.scenario import Probe, load_scenario
from kevload.stats import drift_upper_bound
from kevload.store import default_run_dir
from kevload.summary import RunSummary, position_label
from kevload.targets import RunningTarget, TargetSettings, start_target, stop_target

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "demo.toml"
LABELS = {"llamacpp": "llama.cpp", "transformers": "transformers"}

FIXED = {"temperature": 0, "top_p": 1, "seed": 1234}
PRODUCTION = {"temperature": 0.8, "top_p": 0.95}
DEMO_PROBE = Probe(id="story", prompt="Write a short story about a robot learning to paint.", max_tokens=32)


@dataclass(frozen=True)
class Step:
    name: str
    settings: Mapping[str, Any]  # dotted scenario keys set on demo.toml
    fixed: bool


STEPS = (
    Step("1 baseline (T=0.8, no seed)", {"params": PRODUCTION, "load.concurrency": [1]}, False),
    Step("2 fixed params, single", {"params": FIXED, "load.mode": "single"}, True),
    Step("3 fixed params, mixed", {"params": FIXED, "load.mode": "mixed"}, True),
)


async def run_demo(names: list[str], *, samples: int, console: Console, stop: asyncio.Event,
                   out: Path | None = None) -> int:
    """Run the steps against each target in turn; the exit code for what was seen (0, or 3: a target failed).

    Once ``stop`` is set (Ctrl-C under ``aio.run``) the step in progress finishes with what it has,
    nothing new starts, servers are stopped, and what was collected is still shown.
    """
    out = out or default_run_dir("demo")
    results: dict[str, list[tuple[str, RunSummary]]] = {}
    for name in names:
        if stop.is_set():
            break
        console.print(f"[bold]{LABELS[name]}[/bold]: starting (the first start builds or installs it) …")
        results[name] = await _run_target(name, samples, out, console, stop)
    shown = {name: steps for name, steps in results.items() if steps}
    if shown:
        console.print(Columns([_table(name, steps) for name, steps in shown.items()], padding=(0, 4)))
    for name, steps in shown.items():
        console.print(headline(LABELS[name], steps))
        console.print(logprob_line(LABELS[name], steps))
    if stop.is_set():
        console.print("stopped: the matrices hold what was collected before the stop")
    console.print(f"runs: {out}/ (re-read any with `kevload report DIR`)")
    failed = any(s.verdict == "target_failed" for steps in results.values() for _, s in steps)
    return 3 if failed else 0


def headline(label: str, steps: list[tuple[str, RunSummary]]) -> str:
    """One line saying what the matrices show, with the sample size behind the claim."""
    fixed = [(name, s) for name, s in steps if not name.startswith("1 ") and "batching off" not in name]
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
        return (f"{label}: {sampling}fixed params stable under batching "
                f"(n={sum(c.ok for c in cells)}, {n} per cell: drift rate < {drift_upper_bound(n):.0%} per cell)")
    first = min(drift, key=lambda c: c.first_divergence_chars if c.first_divergence_chars is not None else 0)
    where = (f"outputs leave the serial one between char {first.first_divergence_chars} and "
             f"{max(c.last_divergence_chars or 0 for c in drift)} (0-based)"
             if first.first_divergence_chars is not None else "serial outputs already differ")
    levels = sorted({c.concurrency for c in drift})
    off = next((s for name, s in steps if "batching off" in name), None)
    after = ""
    if off is not None:
        after = "; batching off: " + {"deterministic": "stable", "nondeterministic": "still drifts"}.get(
            off.verdict, off.verdict)
    return (f"{label}: {sampling}fixed params drift once batched (c={','.join(map(str, levels))}: up to "
            f"{max(c.distinct for c in drift)} distinct in {first.ok}), {where}{after}")


def logprob_line(label: str, steps: list[tuple[str, dict[str, Any]]]) -> str:
    """What the per-token logprobs of the fixed-parameter steps say against serial, level by level."""
    cells = [c for name, s in steps if not name.startswith("1 ") for c in s.probe_cells()
             if c.logprob_samples or c.logprob_gap]
    if not cells:
        return f"{label} logprobs: none returned, outputs compared as text only"
    differ = [c for c in cells if c.logprob_bitwise is False]
    n = sum(c.logprob_samples or 0 for c in cells)
    unclaimed = [c for c in cells if c.logprob_bitwise is None]
    gaps = (f"; no claim in {len(unclaimed)} (c={','.join(str(c.concurrency) for c in unclaimed)}), where some "
            f"samples came without logprobs" if unclaimed else "")
    if not differ and not unclaimed:
        levels = sorted({c.concurrency for c in cells})
        return (f"{label} logprobs: bitwise equal to serial in all {len(cells)} fixed-param cells "
                f"(c={','.join(map(str, levels))}; {n} samples compared)")
    if not differ:
        return f"{label} logprobs: no difference from serial among the {n} samples compared{gaps}"
    worst = max(differ, key=lambda c: c.logprob_max_abs_diff or 0)
    first = min(c.first_logprob_divergence_token for c in differ)
    levels = sorted({c.concurrency for c in differ})
    diff = worst.logprob_max_abs_diff
    return (f"{label} logprobs: {len(differ)} of {len(cells)} fixed-param cells differ from serial "
            f"(c={','.join(map(str, levels))}), from {position_label(token=first)}"
            + (f", largest |difference| {diff:.3g}" if diff is not None else "") + f"; {n} samples compared{gaps}")


async def _run_target(name: str, samples: int, out: Path, console: Console,
                      stop: asyncio.Event) -> list[tuple[str, RunSummary]]:
    log = lambda message: console.print(f"  {message}", style="dim")  # noqa: E731
    done: list[tuple[str, RunSummary]] = []
    async with _started(name, TargetSettings(slots=4), log, stop) as target:
        if target is None:
            return done
        for i, step in enumerate(STEPS):
            if stop.is_set():
                return done
            _keep(done, step.name, await _run_step(target.url, target.model, step.settings, samples,
                                                   out / f"{name}-step{i + 1}", console, stop))
        console.print("  diagnose (the guide's steps as one command) …", style="dim")
        options = DiagnoseOptions(url=target.url, model=target.model, probe=DEMO_PROBE, params=PRODUCTION,
                                  samples=3, max_concurrency=4, timeout=120, run_all=True,
                                  out=out / f"{name}-diagnose")
        diagnosis = await _until_stopped(diagnose(options, log=lambda m: None), stop)
        if diagnosis is None:
            return done
        causes = "; ".join(f"{c['verdict']} ({c['reason']})" for c in diagnosis.causes) or diagnosis.reason
        console.print(f"  {LABELS[name]} diagnose --all: {diagnosis.verdict}; causes found: {causes}")
    if stop.is_set():
        return done
    verdicts = {step_name: s.verdict for step_name, s in done}
    drifted = [step for step in STEPS if step.fixed and verdicts.get(step.name, "deterministic") != "deterministic"]
    if drifted:
        # The guide's next move for crosstalk: turn batching off and run the same step again. The first
        # drifting step, at its lowest and highest level only: unbatched CPU serving is slow.
        step = drifted[0]
        console.print(f"  {LABELS[name]} drifted; rerunning '{step.name}' (c=1 and c=4) with batching off …")
        async with _started(name, TargetSettings(slots=4, batching=False), log, stop) as target:
            if target is None:
                return done
            _keep(done, f"{step.name[0]} … batching off",
                  await _run_step(target.url, target.model, {**step.settings, "load.concurrency": [1, 4]}, samples,
                                  out / f"{name}-nobatch", console, stop))
    return done


def _keep(done: list[tuple[str, RunSummary]], name: str, summary: RunSummary) -> None:
    """A step stopped before its first probe answered has nothing to show."""
    if summary.probe_cells():
        done.append((name, summary))


@contextlib.asynccontextmanager
async def _started(name: str, settings: TargetSettings, log: Callable[[str], None],
                   stop: asyncio.Event) -> AsyncIterator[RunningTarget | None]:
    """A target for the block (None if ``stop`` came first), stopped when the block ends, however it ends.

    Starting blocks (provisioning, then polling for readiness), so it runs in a thread. Stopping the
    spawned process is what ends that wait early: whichever of the thread (``on_spawn``) and this
    coroutine sees both the process and the stop request stops it.
    """
    spawned: list[RunningTarget] = []

    def on_spawn(target: RunningTarget) -> None:
        spawned.append(target)
        if stop.is_set():
            stop_target(target)

    start = asyncio.ensure_future(asyncio.to_thread(start_target, name, settings, log=log, on_spawn=on_spawn))
    await _until_stopped(asyncio.shield(start), stop)
    if stop.is_set():
        for target in list(spawned):
            await asyncio.to_thread(stop_target, target)
        with contextlib.suppress(Exception):  # the start fails once its server is gone: that was the point
            await start
        yield None
        return
    target = start.result()
    try:
        yield target
    finally:
        await asyncio.to_thread(stop_target, target)


async def _until_stopped(work: Any, stop: asyncio.Event) -> Any:
    """The coroutine's result, or None if ``stop`` is set first (the coroutine is then cancelled)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    return task.result()


async def _run_step(url: str, model: str, settings: Mapping[str, Any], samples: int, run_dir: Path,
                    console: Console, stop: asyncio.Event) -> RunSummary:
    scenario = load_scenario(SCENARIO).with_settings(
        {"target.base_url": url, "target.model": model, "load.samples": samples, **settings}, source="demo")
    console.print(f"  running {run_dir.name} …", style="dim")
    return (await run_scenario(scenario, run_dir, stop=stop)).summary


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
