"""A run as Markdown: the matrix, its footnotes, the agreement, latency and server tables, the
graded view, the verdict and the SLO table."""

from __future__ import annotations

from kevload.outputs import gradedview
from kevload.outputs.celltext import attainment_text, cell_text
from kevload.outputs.escaping import markdown_cell as md
from kevload.outputs.footnotes import cache_lines, footnotes
from kevload.outputs.tablerows import (
    AGREEMENT_COLUMNS,
    LATENCY_TITLE,
    SERVER_COLUMNS,
    agreement_rows,
    decimal_text,
    latency_columns,
    latency_rows,
    probe_rows,
    server_rows,
)
from kevload.outputs.verdict import slo_line, verdict_line
from kevload.records.summary import RunSummary, levels_of


def markdown(summary: RunSummary) -> str:
    """The run as Markdown, in the terminal's order: the matrix and its footnotes, agreement,
    latency (not for a graded dataset's hundreds of cells), the server's view, cold/warm, the graded
    view, the verdict, and the SLO table."""
    lines = _matrix(summary)
    lines += ["", *_table(AGREEMENT_COLUMNS, agreement_rows(summary))]
    if not gradedview.aggregate_only(summary):
        columns = latency_columns(summary)
        lines += ["", f"{LATENCY_TITLE}:", "", *_table(columns, latency_rows(summary), keys=2)]
    rows = server_rows(summary)
    if rows:
        lines += ["", *_table(SERVER_COLUMNS, rows)]
    cache = cache_lines(summary)
    if cache:
        lines += ["", md(cache[0]), *[f"- {md(line.strip())}" for line in cache[1:]]]
    lines += gradedview.accuracy_markdown(summary) + [
        f"- {md(line)}" for line in gradedview.lines(summary)
    ]
    lines += ["", md(verdict_line(summary)), ""]
    if summary.slo:
        lines += _slo_table(summary)
    return "\n".join(lines)


def _matrix(summary: RunSummary) -> list[str]:
    """Distinct outputs per probe × level, DRIFT in bold, then the footnotes as a list."""
    cells = summary.probe_cells()
    levels = levels_of(cells)
    lines = [
        "| probe (mode) | " + " | ".join(map(md, levels)) + " | n/cell |",
        "| --- | " + " | ".join("---:" for _ in levels) + " | ---: |",
    ]
    for (probe, mode), row in probe_rows(cells).items():
        texts = [md(cell_text(row.get(level))).replace("DRIFT", "**DRIFT**") for level in levels]
        lines.append(
            f"| {md(probe)} ({md(mode)}) | "
            + " | ".join(texts)
            + f" | {min(c.ok for c in row.values())} |"
        )
    notes = footnotes(summary)
    if notes:
        lines += [""] + [f"- {md(note)}" for note in notes]
    return lines


def _table(columns: tuple[str, ...], rows: list[list[str]], keys: int = 1) -> list[str]:
    """A table of per-cell rows: the first ``keys`` columns left-aligned, the numbers right."""
    return [
        "| " + " | ".join(columns) + " |",
        "| " + " | ".join(["---"] * keys + ["---:"] * (len(columns) - keys)) + " |",
        *("| " + " | ".join(map(md, row)) + " |" for row in rows),
    ]


def _slo_table(summary: RunSummary) -> list[str]:
    """Per probe × level: requests, those within the SLO, attainment, goodput; then the SLO line."""
    lines = [
        "| probe (mode) | level | requests | within SLO | attainment | goodput/s |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for c in sorted(summary.probe_cells(), key=lambda c: (c.probe, c.mode, c.level_order)):
        lines.append(
            f"| {md(c.probe)} ({md(c.mode)}) | {md(c.level)} | {c.requests} "
            f"| {c.slo_met} | {md(attainment_text(c))} | {decimal_text(c.goodput)} |"
        )
    return lines + ["", md(slo_line(summary)), ""]
