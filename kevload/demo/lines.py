"""What the demo prints: its headline, logprob, graded, sweep and closing lines and the
distinct-output tables, from the runs' summaries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from kevload.compare.graded import level_name
from kevload.compare.stats import drift_upper_bound
from kevload.demo.steps import LABELS, Ran
from kevload.outputs import gradedview
from kevload.outputs.celltext import cell_text
from kevload.records.machine import where_text
from kevload.records.store import read_json
from kevload.records.summary import (
    CellSummary,
    RunSummary,
    answered_per_s,
    label_of,
    position_label,
    row_cells,
)


def closing_line(name: str, runs: list[Ran], not_started: str | None = None) -> str:
    """What one target's runs found, in a line; where one failed, the first such step and why;
    where its server did not start (``not_started``: why), that."""
    label = LABELS[name]
    failed = next((r for r in runs if r.summary.verdict == "target_failed"), None)
    if failed is not None:
        return f"{label} {failed.name}: {_failure_words(name, failed)}"
    if not_started is not None and not runs:
        return f"{label}: did not start: {not_started}"
    if not runs:
        return f"{label}: nothing ran (stopped before its first step answered)"
    if not_started is not None:
        return f"{_found(label, runs)}; then a restart failed: {not_started}"
    return _found(label, runs)


def _found(label: str, runs: list[Ran]) -> str:
    """What a target's runs found, none of them failed: drift, graded accuracy."""
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
        bad = len(graded.bad_cells or ())
        said.append(
            f"graded accuracy {accuracy}, "
            f"{bad} answer{'' if bad == 1 else 's'} turned bad under load"
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
    """Where the demo's runs ran (their run.json's machine and engine), each once: its figures are
    this machine's and these engines', and move with both."""
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
        errors = ", ".join(f"{k}: {v}" for k, v in steps[-1][1].errors_by_type.items())
        return f"{label}: target failed ({errors})"
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
    """Where the drifting outputs leave the serial one: ``at char 7`` when every one leaves it there
    (a window of one point, which read "between char 7 and 7"), else ``between char 7 and 31``."""
    last = max(
        (c.last_divergence_chars for c in drift if c.last_divergence_chars is not None),
        default=first,
    )
    return f"at char {first}" if last <= first else f"between char {first} and {last}"


def logprob_line(label: str, steps: list[tuple[str, RunSummary]]) -> str:
    """What the per-token logprobs of the fixed-parameter steps say against serial, level by
    level."""
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
    """The graded step: one line per level (accuracy [CI], good→bad and bad→good against serial,
    McNemar p), then the items load turned bad, by name; a target that failed says so after what was
    graded before."""
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


def sweep_lines(sweep: dict[str, Any]) -> list[str]:
    """Per setting, what its outputs do against serial and what the highest level costs: the
    trade-off at a glance."""
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


def table(name: str, steps: list[tuple[str, RunSummary]]) -> Table:
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
