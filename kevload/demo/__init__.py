"""`kevload demo`: the guide's steps 1–3 against the built-in real targets side by side, vLLM's
batch-size sweep, and the engines compared item by item on the graded set (``demo.agreement``).
Its steps are ``demo.steps``; what it prints, ``demo.lines``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.columns import Columns
from rich.console import Console

from kevload.demo import agreement, lines
from kevload.demo.steps import (
    LABELS,
    STEPS,
    SWEEP_SLOTS,
    TIMEOUT_FLOOR_S,
    Pace,
    Ran,
    run_sweep,
    run_target,
    serial_seconds,
)
from kevload.errors import ProvisionError, TargetError
from kevload.outputs import exitcode
from kevload.records.store import default_run_dir
from kevload.records.summary import RunSummary
from kevload.servers.rollout import Outcome
from kevload.servers.sweepfile import sweep_markdown

__all__ = ["Seen", "run_demo"]


@dataclass
class Seen:
    """What the demo's steps gave, per target, as they come in (its one mutable record)."""

    results: dict[str, list[tuple[str, RunSummary]]] = field(default_factory=dict)
    graded: dict[str, RunSummary] = field(default_factory=dict)
    sweeps: dict[str, dict[str, Any]] = field(default_factory=dict)
    ran: dict[str, list[Ran]] = field(default_factory=dict)
    paces: dict[str, Pace] = field(default_factory=dict)
    compared: Outcome | None = None
    # a target whose server did not start (or restart), and why: the others still run
    not_started: dict[str, str] = field(default_factory=dict)


async def run_demo(
    names: list[str],
    *,
    samples: int,
    console: Console,
    stop: asyncio.Event,
    out: Path | None = None,
    timeout_floor: float = TIMEOUT_FLOOR_S,
) -> exitcode.ExitCode:
    """Run the steps against each target in turn, then compare those that answered item by item;
    the exit code for what was seen (``exitcode.for_demo``).

    Once ``stop`` is set (Ctrl-C under ``eventloop.run``) the step in progress finishes with what it
    has, nothing new starts, servers are stopped, and what was collected is still shown. The last
    lines say, one per target, what it found or which step failed and why (``closing_line``).
    """
    out = out or default_run_dir("demo")
    seen = Seen()
    for name in names:
        if stop.is_set():
            break
        await _one_target(name, samples, out, console, stop, seen, timeout_floor)
    answered = [n for n in names if _answered(seen, n)]
    if len(answered) > 1 and not stop.is_set():
        try:
            seen.compared = await agreement.run_agreement(
                answered, out / "compare", console, stop, seen.paces
            )
        except (ProvisionError, TargetError) as exc:
            seen.not_started["compare"] = str(exc).splitlines()[0]
    _show(seen, out, console, stop)
    failed = any(r.summary.verdict == "target_failed" for runs in seen.ran.values() for r in runs)
    failed |= any(
        row["verdict"] == "target_failed" for sweep in seen.sweeps.values() for row in sweep["rows"]
    )
    failed |= agreement.failed(seen.compared) or bool(seen.not_started)
    code = exitcode.for_demo(target_failed=failed)
    console.print("\n[bold]in short[/bold]")
    for name, runs in seen.ran.items():
        said = lines.closing_line(name, runs, seen.not_started.get(name))
        console.print(said, markup=False, highlight=False)
    if "compare" in seen.not_started:
        said = f"engines compared: a server did not start again: {seen.not_started['compare']}"
        console.print(said, markup=False, highlight=False)
    if seen.compared is not None:
        console.print(agreement.closing_line(seen.compared), markup=False, highlight=False)
    if not stop.is_set():  # a stopped demo exits 130 or 143, as its signal says
        said = "a target failed a step (said above)" if failed else "every step was answered"
        console.print(f"exit {int(code)}: {said}", markup=False, highlight=False)
    return code


async def _one_target(
    name: str,
    samples: int,
    out: Path,
    console: Console,
    stop: asyncio.Event,
    seen: Seen,
    timeout_floor: float,
) -> None:
    """One target's steps, graded step and (vLLM) sweep, onto ``seen``."""
    console.print(
        f"[bold]{LABELS[name]}[/bold]: starting (the first start builds or installs it) …"
    )
    seen.ran[name], seen.results[name] = [], []
    try:
        await run_target(
            name, samples, out, console, stop, seen.ran[name], seen.results[name], timeout_floor
        )
    except (ProvisionError, TargetError) as exc:
        # One engine that will not start (a failed build, a server that exits) is that target's
        # finding; the other targets' steps are still worth their minutes, and what it answered
        # before a restart failed (the batching-off rerun's) is kept.
        seen.not_started[name] = str(exc).splitlines()[0]
        console.print(f"  {LABELS[name]}: {seen.not_started[name]}", style="red", markup=False)
    graded_run = next((r.summary for r in seen.ran[name] if r.name == "graded"), None)
    if graded_run is not None:
        seen.graded[name] = graded_run
    if name in seen.not_started:
        return
    seen.paces[name] = pace = Pace(timeout_floor, serial_seconds(seen.results[name]))
    step2 = next((s for step, s in seen.results[name] if step == STEPS[1].name), None)
    if name in SWEEP_SLOTS and step2 is not None and not stop.is_set():
        seen.sweeps[name] = await run_sweep(
            name, step2, samples, out, console, stop, seen.ran[name], pace
        )


def _answered(seen: Seen, name: str) -> bool:
    """A target worth comparing: its steps ran and none failed."""
    runs = seen.ran.get(name, [])
    return (
        bool(runs)
        and name not in seen.not_started
        and all(r.summary.verdict != "target_failed" for r in runs)
    )


def _show(seen: Seen, out: Path, console: Console, stop: asyncio.Event) -> None:
    """The matrices side by side, each target's headline, logprob and graded lines, the sweeps,
    the engines compared, and where it all ran."""
    shown = {name: steps for name, steps in seen.results.items() if steps}
    if shown:
        console.print(
            Columns([lines.table(name, steps) for name, steps in shown.items()], padding=(0, 4))
        )
    for name, steps in shown.items():
        console.print(lines.headline(LABELS[name], steps))
        console.print(lines.logprob_line(LABELS[name], steps))
    for name, summary in seen.graded.items():
        for line in lines.graded_lines(LABELS[name], summary):
            console.print(line, markup=False, highlight=False)
    for name, sweep in seen.sweeps.items():
        console.print(
            f"\n[bold]{LABELS[name]}: step 2 at each max_num_seqs (the max batch size)[/bold]"
        )
        console.print(sweep_markdown(sweep), markup=False, highlight=False, soft_wrap=True)
        for line in lines.sweep_lines(sweep):
            console.print(line)
    if seen.compared is not None:
        console.print("\n[bold]the engines compared item by item (kevload compare)[/bold]")
        for line in agreement.agreement_lines(seen.compared):
            console.print(line, markup=False, highlight=False)
        console.print(f"compare: {seen.compared.out}/compare.json, .md, .html")
    for line in lines.where_lines(out):
        console.print(line, markup=False, highlight=False)
    if stop.is_set():
        console.print("stopped: the matrices hold what was collected before the stop")
    console.print(f"runs: {out}/ (re-read any with `kevload report DIR`)")
