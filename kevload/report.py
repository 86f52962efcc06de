"""Rendering only: summaries as terminal tables, Markdown and JSON."""

from __future__ import annotations

from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

FORMATS = ("table", "json", "markdown")


def render(summary: dict[str, Any], fmt: str, console: Console | None = None) -> str | None:
    """Markdown and JSON come back as text; the table is printed to ``console``."""
    if fmt == "json":
        return orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    if fmt == "markdown":
        return markdown(summary)
    (console or Console()).print(table(summary))
    (console or Console()).print(verdict_line(summary))
    return None


def cell_text(cell: dict[str, Any] | None) -> str:
    """One matrix cell: distinct outputs, marked when they drift from the serial reference."""
    if cell is None:
        return "-"
    if cell["ok"] == 0:
        return "no ok"
    text = str(cell["distinct"])
    if cell["drift"]:
        text += " DRIFT" if cell["distinct"] > 1 else " ≠serial"
    return text


def table(summary: dict[str, Any]) -> Table:
    cells = _probe_cells(summary)
    levels = sorted({c["concurrency"] for c in cells})
    grid = Table(title="distinct outputs per probe × concurrency", title_justify="left")
    grid.add_column("probe (mode)")
    for level in levels:
        grid.add_column(f"c={level}", justify="right")
    grid.add_column("n/cell", justify="right")
    grid.add_column("e2e p50 (c=max)", justify="right")
    grid.add_column("errors", justify="right")
    for (probe, mode), row in _rows(cells).items():
        texts = []
        for level in levels:
            cell = row.get(level)
            text = cell_text(cell)
            style = "red" if cell and cell["drift"] else "green" if cell and cell["ok"] else "yellow"
            texts.append(f"[{style}]{text}[/{style}]")
        top = row[max(row)]
        p50 = top.get("latency", {}).get("e2e", {}).get("p50")
        errors = sum(sum(c["errors"].values()) for c in row.values())
        grid.add_row(f"{probe} ({mode})", *texts, str(min(c["ok"] for c in row.values())),
                     f"{p50 * 1000:.0f} ms" if p50 is not None else "-", str(errors))
    return grid


def verdict_line(summary: dict[str, Any]) -> str:
    """One sentence a person (or a CI log) can act on, with the sample size behind it."""
    verdict = summary["verdict"]
    cells = _probe_cells(summary)
    if verdict == "target_failed":
        return (f"target failed: {summary['errors']} of {summary['requests']} requests failed "
                f"({_counts(summary['errors_by_type'])}); limit is {summary['max_error_share']:.0%}")
    if verdict == "deterministic":
        n = sum(c["ok"] for c in cells)
        worst = max((c["drift_rate_upper_95"] or 0.0) for c in cells) if cells else 1.0
        return (f"deterministic: one output per probe at every level (n={n}; "
                f"per cell drift rate < {worst:.1%} at 95% confidence)")
    drifted = [c for c in cells if c["drift"]]
    parts = []
    for c in drifted:
        where = f"first divergence at char {c['first_divergence_chars']}" if c["first_divergence_chars"] is not None \
            else "serial outputs already differ"
        if c["first_divergence_tokens"] is not None:
            where += f" / token {c['first_divergence_tokens']}"
        parts.append(f"{c['probe']} ({c['mode']}) c={c['concurrency']}: {c['distinct']} distinct in {c['ok']}, {where}")
    return "nondeterministic: " + "; ".join(parts)


def markdown(summary: dict[str, Any]) -> str:
    cells = _probe_cells(summary)
    levels = sorted({c["concurrency"] for c in cells})
    lines = ["| probe (mode) | " + " | ".join(f"c={lv}" for lv in levels) + " | n/cell |",
             "| --- | " + " | ".join("---:" for _ in levels) + " | ---: |"]
    for (probe, mode), row in _rows(cells).items():
        texts = [cell_text(row.get(level)).replace("DRIFT", "**DRIFT**") for level in levels]
        lines.append(f"| {probe} ({mode}) | " + " | ".join(texts) + f" | {min(c['ok'] for c in row.values())} |")
    lines += ["", verdict_line(summary), ""]
    return "\n".join(lines)


def _probe_cells(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in summary["cells"] if c["role"] == "probe"]


def _rows(cells: list[dict[str, Any]]) -> dict[tuple[str, str], dict[int, dict[str, Any]]]:
    rows: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for c in cells:
        rows.setdefault((c["probe"], c["mode"]), {})[c["concurrency"]] = c
    return rows


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items()) or "none"
