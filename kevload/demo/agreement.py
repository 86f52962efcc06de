"""The demo's last step: the engines side by side on the same graded items at c=1 and c=4, through
``kevload compare``'s own machinery (``load.comparing``'s runs in turns, ``servers.rollout.finish``:
compare.json, .md, .html and the gate) against the demo's targets started again together; and what
it prints of that: the N×N agreement per level and each engine's accuracy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console

from kevload.compare.gate import GateRules
from kevload.compare.rollout import Comparison
from kevload.demo.steps import (
    GRADED_LEVELS,
    LABELS,
    SETTINGS,
    Pace,
    graded_scenario,
    graded_timeout,
    log_to,
)
from kevload.exits import ExitCode
from kevload.load import comparing
from kevload.servers import rollout
from kevload.servers.targets import serving

# The full weights in PyTorch: llama.cpp's Q4_1 and vLLM's kernels read as rollouts of it.
REFERENCE = "transformers"


async def run_agreement(
    names: Sequence[str],
    out: Path,
    console: Console,
    stop: asyncio.Event,
    paces: Mapping[str, Pace],
) -> rollout.Outcome | None:
    """Every target of ``names`` started with its demo settings, all at once, and compared as
    ``kevload compare --target …`` compares them, into ``out``: the demo's share of the graded set,
    each target's requests with the timeout of its pace (``paces``). None where a target
    did not start or the demo was stopped before anything was sent."""
    reference = REFERENCE if REFERENCE in names else names[0]
    ordered = [reference, *(n for n in names if n != reference)]
    console.print(
        f"  comparing {', '.join(LABELS[n] for n in ordered)} item by item (graded set, "
        f"c={','.join(map(str, GRADED_LEVELS))}): starting them together …",
        style="dim",
    )
    async with contextlib.AsyncExitStack() as stack:
        targets = []
        for name in ordered:
            if stop.is_set():
                return None
            running = await stack.enter_async_context(
                serving(name, SETTINGS[name], log=log_to(console), stop=stop)
            )
            if running is None:
                return None
            scenario = graded_scenario(running.url, running.model)
            timeout = graded_timeout(scenario, paces[name])
            scenario = scenario.with_settings({"target.timeout": timeout}, source="demo")
            targets.append(comparing.Target(name, scenario))
        await comparing.run_comparison(targets, out, reference=reference, stop=stop)
    return rollout.finish(out, GateRules(), trust_graders=False, own=True)


def agreement_lines(outcome: rollout.Outcome) -> list[str]:
    """Per level the N×N agreement (row i, column j: the share of items where every text of j is
    among i's), then each engine's accuracy per level; a target whose run did not complete says
    so (the gate's findings)."""
    comparison = outcome.comparison
    lines = []
    for level in comparison.matrix:
        names = [LABELS.get(n, n) for n in level["targets"]]
        where = f"c={level['concurrency']}" if "concurrency" in level else f"rate={level['rate']}"
        lines.append(f"{f'agreement, {where}':<24}" + "".join(f"{n:>14}" for n in names))
        for name, row in zip(names, level["agreement"], strict=True):
            cells = ("-" if v is None else f"{v:.0%}" for v in row)
            lines.append(f"  {name:<22}" + "".join(f"{c:>14}" for c in cells))
    for name, said in accuracy_by_engine(comparison).items():
        lines.append(f"{LABELS.get(name, name)} graded accuracy: {said}")
    if outcome.result.code == ExitCode.TARGET:
        lines += outcome.result.lines
    return lines


def accuracy_by_engine(comparison: Comparison) -> dict[str, str]:
    """Each target's accuracy per level, as ``80% at c=1, 75% at c=4`` (``-`` where none was
    graded): the reference's from its first candidate's levels."""
    said: dict[str, list[str]] = {}
    for i, candidate in enumerate(comparison.candidates):
        for level in candidate.levels:
            if i == 0:
                said.setdefault(comparison.reference, []).append(
                    _accuracy(level.accuracy_reference, level.label)
                )
            said.setdefault(candidate.name, []).append(
                _accuracy(level.accuracy_candidate, level.label)
            )
    return {name: ", ".join(levels) for name, levels in said.items()}


def _accuracy(value: float | None, label: str) -> str:
    return f"{'-' if value is None else f'{value:.1%}'} at {label}"


def failed(outcome: rollout.Outcome | None) -> bool:
    """Whether a target's run of the comparison did not complete (the gate's exit 3); candidates
    that answer otherwise than the reference are what the step shows, not a failure."""
    return outcome is not None and outcome.result.code == ExitCode.TARGET


def closing_line(outcome: rollout.Outcome) -> str:
    """The comparison in a line: per candidate and level, on how many of the items both answered it
    gave the reference's text."""
    comparison = outcome.comparison
    said = [
        f"{LABELS.get(c.name, c.name)} "
        + ", ".join(
            f"{round((lv.agreement or 0) * lv.items)} of {lv.items} at {lv.label}"
            for lv in c.levels
        )
        for c in comparison.candidates
    ]
    reference = LABELS.get(comparison.reference, comparison.reference)
    return f"engines compared, same text as {reference} on: {'; '.join(said)}"
