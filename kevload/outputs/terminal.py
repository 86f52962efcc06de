"""A run in the terminal: its tables (rich), each split over as few parts as fit the console, and
the lines under them; ``render`` also hands back the Markdown and JSON forms as text."""

from __future__ import annotations

import orjson
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from kevload.outputs import gradedview
from kevload.outputs.celltext import cell_text, errors_text
from kevload.outputs.escaping import visible
from kevload.outputs.footnotes import cache_lines, footnotes
from kevload.outputs.markdown import markdown
from kevload.outputs.tablerows import (
    AGREEMENT_COLUMNS,
    LATENCY_TITLE,
    SERVER_COLUMNS,
    agreement_rows,
    latency_columns,
    latency_rows,
    probe_rows,
    server_rows,
)
from kevload.outputs.verdict import slo_line, verdict_line
from kevload.records.summary import RunSummary, levels_of

FORMATS = ("table", "json", "markdown", "html")


def _plain(text: str, style: str = "") -> Text:
    """A terminal cell or line as plain text: a string would be read as rich markup (``[red]``, and
    an unmatched ``[/x]`` raises), so a probe id could restyle the table or stop the report."""
    return Text(visible(text), style=style)


def render(summary: RunSummary, fmt: str, console: Console | None = None) -> str | None:
    """Markdown and JSON come back as text; the table is printed to ``console``."""
    if fmt == "json":
        return orjson.dumps(
            summary.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
        ).decode()
    if fmt == "markdown":
        return markdown(summary)
    console = console or Console()

    def show(grid: Table) -> None:
        for part in fitted(grid, console):
            console.print(part)

    # A graded dataset: one row per level, not hundreds per probe (summary.json and the HTML report
    # keep those).
    if gradedview.aggregate_only(summary):
        show(gradedview.accuracy_table(summary))
    else:
        show(table(summary))
        for note in footnotes(summary):
            console.print(_plain(note))
        show(agreement_table(summary))
        if gradedview.graded(summary):
            show(gradedview.accuracy_table(summary))
    for line in gradedview.lines(summary):
        console.print(_plain(line))
    if not gradedview.aggregate_only(summary):
        show(latency_table(summary))
    if server_rows(summary):
        show(server_table(summary))
    for line in cache_lines(summary):
        console.print(_plain(line))
    console.print(_plain(verdict_line(summary)))
    if summary.slo:
        console.print(_plain(slo_line(summary)))
    return None


KEY_COLUMNS = (
    "probe (mode)",
    "probe",
    "level",
)  # what a row is about: every part of a split table repeats them


def fitted(grid: Table, console: Console) -> list[Table | Text]:
    """``grid`` itself where its widest rows fit the console; else its columns split over as few
    tables as fit, each repeating the leading key columns (probe, level). Squeezed to fit, rich cuts
    a probe name to ``capi…`` and a number to ``6467…`` (at 80 columns, the width of most CI logs,
    the latency table is 11 columns wide). A probe name wider than a third of the console would
    leave each part room for a column or two: the probes are then numbered, #1, #2, …, and a legend
    under the table names each in full. Only where the key columns and one more do not fit either is
    a part squeezed: its key columns then fold, never cut."""
    if _width(grid, console) <= console.width:
        return [grid]
    legend: list[Text] = []
    if (
        grid.columns[0].header == "probe (mode)"
        and _width(_part(grid, [0]), console) > console.width // 3
    ):
        grid, legend = _numbered(grid)
    columns = grid.columns
    keys = 0
    while keys < len(columns) - 1 and columns[keys].header in KEY_COLUMNS:
        keys += 1
    parts: list[list[int]] = []
    for index in range(keys, len(columns)):
        if (
            parts
            and _width(_part(grid, [*range(keys), *parts[-1], index]), console) <= console.width
        ):
            parts[-1].append(index)
        else:
            parts.append([index])
    return [
        *(
            _part(
                grid,
                [*range(keys), *part],
                f" ({n} of {len(parts)})" if len(parts) > 1 else "",
                fold=keys,
            )
            for n, part in enumerate(parts, 1)
        ),
        *legend,
    ]


def _width(grid: Table, console: Console) -> int:
    """The width ``grid`` takes with no cell wrapped or cut."""
    return Measurement.get(console, console.options.update_width(10**6), grid).maximum


def _part(grid: Table, indexes: list[int], suffix: str = "", fold: int = 0) -> Table:
    """The columns at ``indexes`` of ``grid`` as a table of their own, titled as it is with
    ``suffix``."""
    part = Table(
        title=f"{grid.title}{suffix}" if grid.title else None, title_justify=grid.title_justify
    )
    for i in indexes:
        column = grid.columns[i]
        part.add_column(
            column.header, justify=column.justify, overflow="fold" if i < fold else column.overflow
        )
    cells = [list(grid.columns[i].cells) for i in indexes]
    for row in zip(*cells, strict=True):
        part.add_row(*row)
    return part


def _numbered(grid: Table) -> tuple[Table, list[Text]]:
    """``grid`` with its probe column as #1, #2, … (in the order rows name them) and the legend
    naming each."""
    names = [cell.plain if isinstance(cell, Text) else str(cell) for cell in grid.columns[0].cells]
    numbers = {name: f"#{n}" for n, name in enumerate(dict.fromkeys(names), 1)}
    numbered = Table(title=grid.title, title_justify=grid.title_justify)
    for column in grid.columns:
        numbered.add_column(
            "probe" if column is grid.columns[0] else column.header,
            justify=column.justify,
            overflow=column.overflow,
        )
    others = [list(column.cells) for column in grid.columns[1:]]
    for name, *row in zip(names, *others, strict=True):
        numbered.add_row(numbers[name], *row)
    return numbered, [Text(f"{number} {name}") for name, number in numbers.items()]


def table(summary: RunSummary) -> Table:
    cells = summary.probe_cells()
    levels = levels_of(cells)
    grid = Table(title="distinct outputs per probe × level", title_justify="left")
    grid.add_column("probe (mode)")
    for level in levels:
        grid.add_column(level, justify="right")
    grid.add_column("n/cell", justify="right")
    grid.add_column("e2e p50 (c=max)", justify="right")
    grid.add_column("errors", justify="right")
    for (probe, mode), row in probe_rows(cells).items():
        texts = []
        for level in levels:
            cell = row.get(level)
            text = cell_text(cell)
            style = (
                "red"
                if cell and cell.drift
                else "yellow"
                if not cell or not cell.ok or cell.short
                else "green"
            )
            texts.append(_plain(text, style))
        top = max(row.values(), key=lambda c: c.level_order)
        p50 = top.latency.get("e2e", {}).get("p50")
        grid.add_row(
            _plain(f"{probe} ({mode})"),
            *texts,
            str(min(c.ok for c in row.values())),
            f"{p50 * 1000:.0f} ms" if p50 is not None else "-",
            errors_text(row.values()),
        )
    return grid


def agreement_table(summary: RunSummary) -> Table:
    return _grid("agreement with the serial output", AGREEMENT_COLUMNS, agreement_rows(summary))


def latency_table(summary: RunSummary) -> Table:
    """Latency and throughput per probe × level, in milliseconds: the "is it fast" half of a run."""
    grid = Table(title=LATENCY_TITLE, title_justify="left")
    for name in latency_columns(summary):
        grid.add_column(name, justify="left" if name.startswith("probe") else "right")
    for probe, level, *numbers in latency_rows(summary):
        grid.add_row(_plain(probe), _plain(level), *numbers)
    return grid


def server_table(summary: RunSummary) -> Table:
    return _grid(
        "the server's own view (its /metrics while the cell ran)",
        SERVER_COLUMNS,
        server_rows(summary),
    )


def _grid(title: str, columns: tuple[str, ...], rows: list[list[str]]) -> Table:
    """A table of per-cell rows: the probe column left, the numbers right."""
    grid = Table(title=title, title_justify="left")
    for name in columns:
        grid.add_column(name, justify="left" if name.startswith("probe") else "right")
    for row in rows:
        grid.add_row(*map(_plain, row))
    return grid
