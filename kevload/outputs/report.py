"""Rendering only: summaries as terminal tables, Markdown and JSON."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from kevload.compare.graded import level_name
from kevload.outputs import gradedview
from kevload.outputs.escaping import visible, xml_text
from kevload.records.summary import (
    CellSummary,
    RunSummary,
    held_without_cuts,
    label_of,
    levels_of,
    name_parts,
    position_label,
)

FORMATS = ("table", "json", "markdown", "html")

_MARKDOWN = re.compile(r"[\\|<&\r\n]")
_MARKDOWN_SPELLED = {
    "\\": "\\\\",
    "|": "\\|",
    "<": "&lt;",
    "&": "&amp;",
    "\r": "\\u000d",
    "\n": "\\u000a",
}


# A code span as CommonMark reads one: a run of backticks, and the next run of the same length.
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
_IN_CODE = re.compile(r"[|\r\n]")


def markdown_cell(text: str) -> str:
    """``text`` as one cell of a Markdown table (or one line of a list): a ``|`` would end the cell and a line break
    the row, so they are escaped, as are ``\\`` (which would escape what follows) and ``<`` and ``&`` (raw HTML and
    entities, which a Markdown renderer passes through); control characters spelled as in ``visible``. Inside a
    code span only ``|`` and line breaks are: there ``&lt;`` would show as written, not as ``<``."""
    spelled, end = [], 0
    # A span holding a backslash is escaped whole, as before: in a code span "\\" shows as written, and
    # a backslash before an escaped "|" would turn it back into the cell's end.
    for span in (m for m in _CODE_SPAN.finditer(text) if "\\" not in m[0]):
        spelled.append(_MARKDOWN.sub(lambda m: _MARKDOWN_SPELLED[m[0]], text[end : span.start()]))
        spelled.append(_IN_CODE.sub(lambda m: _MARKDOWN_SPELLED[m[0]], span[0]))
        end = span.end()
    spelled.append(_MARKDOWN.sub(lambda m: _MARKDOWN_SPELLED[m[0]], text[end:]))
    return visible("".join(spelled))


def _plain(text: str, style: str = "") -> Text:
    """A terminal cell or line as plain text: a string would be read as rich markup (``[red]``, and an unmatched
    ``[/x]`` raises), so a probe id could restyle the table or stop the report."""
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
    """``grid`` itself where its widest rows fit the console; else its columns split over as few tables as fit,
    each repeating the leading key columns (probe, level). Squeezed to fit, rich cuts a probe name to ``capi…``
    and a number to ``6467…`` (at 80 columns, the width of most CI logs, the latency table is 11 columns wide).
    A probe name wider than a third of the console would leave each part room for a column or two: the probes
    are then numbered, #1, #2, …, and a legend under the table names each in full. Only where the key columns
    and one more do not fit either is a part squeezed: its key columns then fold, never cut."""
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
    """The columns at ``indexes`` of ``grid`` as a table of their own, titled as it is with ``suffix``."""
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
    """``grid`` with its probe column as #1, #2, … (in the order rows name them) and the legend naming each."""
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


def cell_text(cell: CellSummary | None) -> str:
    """One matrix cell: distinct outputs, marked when they drift from the serial reference, with
    ``(ok/asked)`` when the cell has fewer ok samples than asked.

    One distinct output that is not the serial one reads ``1 all≠serial``: the copies agree with each
    other, not with the serial answer. ``1 ~`` is latent drift: the serial text, other logprobs. ``t1``: a
    conversation that leaves the serial one at turn 1 (``turns_text``). ``†``: some counted samples never had
    c − 1 others in flight (``never_full_text``). ``✂3``: kevload cut 3 requests of the level (``load.cancel_share``).
    """
    if cell is None:
        return "-"
    text = "no ok" if cell.ok == 0 else str(cell.distinct)
    if cell.ok and cell.drift:
        text += " DRIFT" if cell.distinct > 1 else " all≠serial"
    elif cell.latent_drift:
        text += " ~"
    if cell.first_divergent_turn is not None:
        text += f" t{cell.first_divergent_turn}"
    if cell.samples_never_full:
        text += " †"
    if cell.cancelled:
        text += f" ✂{cell.cancelled}"
    if cell.short:
        text += f" ({cell.ok}/{cell.asked})"
    return text + gradedview.cell_mark(cell)


def turns_text(cell: CellSummary) -> str:
    """Where a conversation cell leaves the serial conversation, and each turn's answers given the serial history:
    ``leaves the serial conversation at turn 1 (0-based); ≠ serial given its history: t0 0/4, t1 3/4, t2 0/1``."""
    per_turn = ", ".join(
        f"t{t['turn']} {t['differ']}/{t['same_history']}" for t in cell.turns or ()
    )
    where = (
        "never leaves the serial conversation"
        if cell.first_divergent_turn is None
        else f"leaves the serial conversation at turn {cell.first_divergent_turn} (0-based)"
    )
    return f"{where}; ≠ serial given its history: {per_turn}"


def cell_phrase(cell: CellSummary, unit: str = "") -> str:
    """``3 distinct in 8, 5 ≠ serial`` / ``1 distinct in 8, all ≠ serial``: what a cell's outputs say."""
    text = f"{cell.distinct} distinct{' outputs' if unit else ''} in {cell.ok}{unit}"
    divergent = cell.divergent_requests
    if cell.drift and divergent:
        text += ", all ≠ serial" if divergent == cell.ok else f", {divergent} ≠ serial"
    return text


def counts_text(counts: Mapping[str, int]) -> str:
    """``timeout: 2, http_503: 1``, or ``none``: counts by kind as every report and the diagnosis state them."""
    return ", ".join(f"{k}: {v}" for k, v in counts.items()) or "none"


def kinds_text(cell: CellSummary) -> str:
    """``4× token, 1× length``: how many of the cell's divergent requests are of each kind (empty when none)."""
    return ", ".join(f"{n}× {kind}" for kind, n in (cell.divergence_kinds or {}).items() if n)


def latent_text(cell: CellSummary) -> str:
    """``same text as serial in 8 samples, logprobs differ from token 3 (0-based), max abs diff 4.2e-06``."""
    diff = cell.logprob_max_abs_diff
    return (
        f"same text as serial in {cell.ok} samples, logprobs differ from "
        f"{position_label(token=cell.first_logprob_divergence_token)}"
        + (f", max abs diff {diff:.2g}" if diff else "")
        + (f"; {logprob_coverage_text(cell)}" if cell.logprob_gap else "")
    )


def logprob_difference_text(cell: CellSummary) -> str:
    """Where a cell's logprobs first leave the serial ones and by how much: ``≠ from token 3 (0-based), max abs diff
    4.2e-06``; ``tokens differ from token 10 (0-based)`` where that first place is one whose tokens differ, which
    has no serial logprob to compare with (the first position and the tokens' agree, and the tokens' is where an
    output's tokens leave the serial ones). The size is the largest |difference| at positions whose tokens match
    the serial ones, said only where one is not 0: "max abs diff 0" beside "≠" read as a difference of nothing."""
    at = position_label(token=cell.first_logprob_divergence_token)
    diff = cell.logprob_max_abs_diff
    if (
        cell.first_divergence_tokens is not None
        and cell.first_logprob_divergence_token == cell.first_divergence_tokens
    ):
        return f"tokens differ from {at}" + (
            f"; at matching tokens max abs diff {diff:.2g}" if diff else ""
        )
    return f"≠ from {at}" + (f", max abs diff {diff:.2g}" if diff else "")


def logprob_text(cell: CellSummary) -> str:
    """The cell's logprobs against serial: ``bitwise = (8)``, ``≠ from token 3 (0-based), max abs diff 4.2e-06
    (8)`` or ``tokens differ from token 10 (0-based) (8)`` (``logprob_difference_text``), ``no claim: logprobs in
    2 of 6`` or ``-``; with the samples that carried a non-finite logprob."""
    n = cell.logprob_samples
    nonfinite = (
        f"; {cell.logprob_nonfinite_samples} with a non-finite logprob"
        if cell.logprob_nonfinite_samples
        else ""
    )
    if cell.logprob_bitwise is None:
        return f"no claim: {logprob_coverage_text(cell)}{nonfinite}" if cell.logprob_gap else "-"
    if cell.logprob_bitwise:
        return f"bitwise = ({n}){nonfinite}"
    return (
        logprob_difference_text(cell)
        + (f" ({n} of {cell.ok})" if cell.logprob_gap else f" ({n})")
        + nonfinite
    )


def logprob_coverage_text(cell: CellSummary, where: str | None = None) -> str:
    """``logprobs in 2 of 6`` (``… at p1 (single) c=4``), with ``(3 with fewer logprobs than tokens)`` where some
    samples' logprobs stop before their tokens do: how many of a cell's ok samples its logprob comparison covers."""
    partial = (
        f" ({cell.logprobs_partial} with fewer logprobs than tokens)"
        if cell.logprobs_partial
        else ""
    )
    return (
        f"logprobs in {cell.logprob_samples or 0} of {cell.ok}"
        + (f" at {where}" if where else "")
        + partial
    )


def logprob_gap_text(cell: CellSummary, where: str | None = None) -> str:
    """``logprobs in 2 of 6 at p1 (single) c=4: no logprob claim``: a cell whose logprobs cover only some of
    its ok samples (a difference among those is still one, and then the claim is that)."""
    claim = "" if cell.logprob_bitwise is False else ": no logprob claim"
    return logprob_coverage_text(cell, where or cell.label) + claim


def never_full_text(cell: CellSummary) -> str:
    """``5 of 40 counted samples never had 3 others in flight; 3 others for 91.2% of their time``."""
    others = f"{cell.concurrency - 1} other{'s' if cell.concurrency > 2 else ''}"
    share = cell.full_load_share
    return (
        f"{cell.samples_never_full} of {cell.requests} counted samples never had {others} in flight"
        + (f"; {others} for {share:.1%} of their time" if share is not None else "")
    )


def unknown_overlap_text(cell: CellSummary) -> str:
    """``overlap unknown for 129 of 300 counted samples (…)``: samples the full-load check leaves out."""
    return (
        f"overlap unknown for {cell.overlap_unknown} of {cell.requests} counted samples (a part of "
        f"the run "
        "sent requests it never recorded, killed or a worker lost, which may have run beside "
        "them); "
        "left out of the full-load check"
    )


def full_load_text(cell: CellSummary) -> str:
    """``99.2%``: the share of the cell's counted time at full load, ``†`` where a sample never was; ``-`` where
    there is no c − 1 to reach (open loop, c=1)."""
    share = cell.full_load_share
    if share is None:
        return "-"
    return f"{share:.1%}" + (" †" if cell.samples_never_full else "")


def rate_text(rate: float | None, interval: list[float] | None) -> str:
    """``62.5% [30.6, 86.3]``: a share with its 95 % interval, in percent."""
    if rate is None:
        return "-"
    return (
        f"{rate:.1%} [{interval[0] * 100:.1f}, {interval[1] * 100:.1f}]"
        if interval
        else f"{rate:.1%}"
    )


AGREEMENT_COLUMNS = (
    "probe (mode)",
    "level",
    "n",
    "exact match [95% CI]",
    "token agreement [95% CI]",
    "logprobs vs serial (n)",
)


def agreement_rows(summary: RunSummary) -> list[list[str]]:
    """Per probe × level: exact-match rate and token agreement with the serial output, and the logprobs."""
    return [
        [
            f"{c.probe} ({c.mode})",
            c.level,
            str(c.ok),
            rate_text(c.exact_match_rate, c.exact_match_ci95),
            rate_text(c.token_agreement, c.token_agreement_ci95),
            logprob_text(c),
        ]
        for c in sorted(summary.probe_cells(), key=lambda c: (c.probe, c.mode, c.level_order))
    ]


def agreement_table(summary: RunSummary) -> Table:
    return _grid("agreement with the serial output", AGREEMENT_COLUMNS, agreement_rows(summary))


def _grid(title: str, columns: tuple[str, ...], rows: list[list[str]]) -> Table:
    """A table of per-cell rows: the probe column left, the numbers right."""
    grid = Table(title=title, title_justify="left")
    for name in columns:
        grid.add_column(name, justify="left" if name.startswith("probe") else "right")
    for row in rows:
        grid.add_row(*map(_plain, row))
    return grid


def sample_noun(cells: Iterable[CellSummary]) -> str:
    """What the samples of these cells are: requests, conversations (each one sample, whatever its turns), or
    samples where there are both."""
    talks = {c.turns is not None for c in cells}
    return "samples" if len(talks) > 1 else "conversations" if talks == {True} else "requests"


def short_text(cell: CellSummary) -> str:
    """``2 of 8 asked ok (timeout: 6)``: why a short cell is short."""
    errors = counts_text(cell.errors) if cell.errors else "no errors: the run was cut short"
    return f"{cell.ok} of {cell.asked} asked ok ({errors})"


def missing_texts(summary: RunSummary) -> list[str]:
    """``p1 (single) c=4: no counted sample (the run was stopped before one was answered)``: each probe cell the run
    asked for that has none, and why, as far as the run says."""
    if summary.state in ("interrupted", "aborted"):
        why = f" (the run was {'stopped' if summary.state == 'interrupted' else 'aborted'} before one was answered)"
    elif summary.samples_asked is None:
        why = " (none was sent and answered within load.duration)"
    else:
        why = ""
    return [f"{label_of(name)}: no counted sample{why}" for name in summary.missing_cells or ()]


def footnotes(summary: RunSummary) -> list[str]:
    """The matrix's footnotes: each drifting cell's divergence kinds, each short cell's shortfall, each cell with
    samples that never had c − 1 others in flight, the lowest full-load share, and the companions' errors
    (reported beside the probes', never mixed into them)."""
    notes = []
    for c in summary.probe_cells():
        name = f"{c.label}"
        if c.drift:
            kinds = kinds_text(c)
            notes.append(f"{name}: {cell_phrase(c)}" + (f"; kinds: {kinds}" if kinds else ""))
        if c.first_divergent_turn is not None:
            notes.append(f"{name}: {turns_text(c)}")
        if c.short:
            notes.append(f"{name}: short, {short_text(c)}")
        if c.latent_drift:
            notes.append(f"{name}: ~ latent drift, {latent_text(c)}")
        elif c.logprob_gap:
            notes.append(f"{name}: {logprob_gap_text(c, 'this level')}")
        if c.samples_never_full:
            notes.append(f"{name}: † {never_full_text(c)}")
        if c.overlap_unknown:
            notes.append(f"{name}: {unknown_overlap_text(c)}")
        if c.server_note:
            notes.append(f"{name}: {c.server_note}")
        if c.cancelled:
            notes.append(f"{name}: ✂ {cancelled_text(c)}")
    notes += missing_texts(summary)
    notes += cancel_findings(summary)
    loaded = [c for c in summary.probe_cells() if c.full_load_share is not None]
    if loaded:
        low = min(loaded, key=lambda c: (c.full_load_share, c.level_order))
        notes.append(
            "full load: at every level c ≥ 2, counted samples had c − 1 others in flight for at "
            "least "
            f"{low.full_load_share:.1%} of their time (lowest: {low.label})"
        )
    if (
        summary.companion_requests or summary.cancelled
    ):  # every companion cut: the run's total of cuts still told
        notes.append(
            f"companions: {summary.companion_errors} of {summary.companion_requests} "
            f"{sample_noun(summary.companion_cells())} failed"
            + (
                f" ({counts_text(summary.companion_errors_by_type)})"
                if summary.companion_errors
                else ""
            )
            + (
                f"; {summary.cancelled} cut by kevload (load.cancel_share: cancelled, not failed)"
                if summary.cancelled is not None
                else ""
            )
        )
    return notes


def cancelled_text(cell: CellSummary) -> str:
    """``12 requests of the level cut; 9 of 20 ok samples had a cut within 0.41 s of their send (the cell's shortest
    flight) (3 ≠ serial), 11 had none (0 ≠ serial)``: a probe cell's level's cuts and how its samples split beside
    them."""
    apart = cell.ok - (cell.beside_cancelled or 0)
    return (
        f"{cell.cancelled} requests of the level cut by kevload; {cell.beside_cancelled} of "
        f"{cell.ok} ok samples "
        f"had a cut within {_window(cell)} ({cell.divergent_beside_cancelled} ≠ serial), {apart} "
        f"had none ({cell.divergent_apart_from_cancelled} ≠ serial)"
    )


def _window(cell: CellSummary) -> str:
    """How long after its send a sample meets a cut: the cell's shortest flight (``beside_window_s``)."""
    return f"{cell.beside_window_s or 0:.3g} s of their send (the cell's shortest flight)"


def cancel_findings(summary: RunSummary) -> list[str]:
    """The cancellation findings, each with the counts that make it checkable from the records."""
    cells = {c.name: c for c in summary.probe_cells()}
    lines = []
    for name in summary.drift_beside_cancelled_cells or ():
        c = cells[name]
        lines.append(
            f"finding: {c.label}: probe drifted only beside cancellations: all "
            f"{c.divergent_beside_cancelled}"
            f" divergent samples had a cut within {_window(c)}, none of the "
            f"{c.ok - (c.beside_cancelled or 0)} without one diverged (one-sided Fisher p = "
            f"{c.cancel_p_value:.3g})"
        )
    for row in summary.drift_with_cancelled_levels or ():
        probe, _, mode = row.rpartition("@")
        mine = sorted(
            (c for c in cells.values() if (c.probe, c.mode) == (probe, mode)),
            key=lambda c: c.level_order,
        )
        drifted = ", ".join(f"{c.level} (✂{c.cancelled})" for c in mine if c.drift)
        held = ", ".join(c.level for c in held_without_cuts(mine))
        lines.append(
            f"finding: {probe} ({mode}): probe drifted only in levels with cancellations: "
            f"{drifted}; "
            f"held the serial output where none was cut: {held}"
        )
    return lines


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
    for (probe, mode), row in _rows(cells).items():
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


def errors_text(cells: Iterable[CellSummary]) -> str:
    """Errors of these cells, with the reconnects beside them when the records carry any."""
    cells = list(cells)
    errors = sum(sum(c.errors.values()) for c in cells)
    reconnects = sum(c.reconnects or 0 for c in cells)
    return f"{errors} (+{reconnects} reconnects)" if reconnects else str(errors)


def latency_columns(summary: RunSummary) -> tuple[str, ...]:
    slo = ("SLO met", "goodput/s") if summary.slo else ()
    return (
        "probe (mode)",
        "level",
        "n",
        "ttft",
        "itl",
        "tpot",
        "e2e",
        "tok/s",
        "req/s",
        "late p99",
        "full load",
        *slo,
    )


def latency_rows(summary: RunSummary) -> list[list[str]]:
    """Latency (ms, p50 / p99) and throughput per probe × level: the terminal's table and Markdown's."""
    rows = []
    for c in sorted(summary.probe_cells(), key=lambda c: (c.probe, c.mode, c.level_order)):
        lat = c.latency
        late = lat.get("lateness", {}).get("p99")
        rows.append(
            [
                f"{c.probe} ({c.mode})",
                c.level,
                str(c.ok),
                *(_p50_p99(lat.get(k)) for k in ("ttft", "itl", "tpot", "e2e")),
                _fmt(c.output_tokens_per_s),
                _fmt(c.requests_per_s),
                f"{late * 1000:.2f}" if late is not None else "-",
                full_load_text(c),
                *((attainment_text(c), _fmt(c.goodput)) if summary.slo else ()),
            ]
        )
    return rows


LATENCY_TITLE = "latency (ms, p50 / p99) and throughput"


def latency_table(summary: RunSummary) -> Table:
    """Latency and throughput per probe × level, in milliseconds: the "is it fast" half of a run."""
    grid = Table(title=LATENCY_TITLE, title_justify="left")
    for name in latency_columns(summary):
        grid.add_column(name, justify="left" if name.startswith("probe") else "right")
    for probe, level, *numbers in latency_rows(summary):
        grid.add_row(_plain(probe), _plain(level), *numbers)
    return grid


SERVER_COLUMNS = (
    "probe (mode)",
    "level",
    "samples",
    "running max",
    "running mean",
    "waiting max",
    "prefix-cache hits",
    "KV cache max",
)


def server_rows(summary: RunSummary) -> list[list[str]]:
    """Per probe × level, what the server's /metrics said while the cell ran; no rows where it published none."""
    cells = sorted(
        (c for c in summary.probe_cells() if c.server_samples is not None),
        key=lambda c: (c.probe, c.mode, c.level_order),
    )
    return [
        [
            f"{c.probe} ({c.mode})",
            c.level,
            str(c.server_samples),
            _num(c.server_running_max),
            _num(c.server_running_mean),
            _num(c.server_waiting_max),
            _num(c.server_prefix_cache_hits),
            "-" if c.server_kv_cache_usage_max is None else f"{c.server_kv_cache_usage_max:.1%}",
        ]
        for c in cells
    ]


def server_table(summary: RunSummary) -> Table:
    return _grid(
        "the server's own view (its /metrics while the cell ran)",
        SERVER_COLUMNS,
        server_rows(summary),
    )


def slo_bounds_text(bounds: Mapping[str, float] | None) -> str:
    """``ttft ≤ 500 ms, e2e ≤ 10000 ms``."""
    return ", ".join(
        f"{name.removesuffix('_ms')} ≤ {value:g} ms" for name, value in (bounds or {}).items()
    )


def attainment_text(cell: CellSummary) -> str:
    """``40.0%``, marked ``✗`` when the cell is under the SLO's attainment; ``-`` without an SLO."""
    if cell.slo_attainment is None:
        return "-"
    return f"{cell.slo_attainment:.1%}" + ("" if cell.meets_slo else " ✗")


def slo_cell_text(cell: CellSummary) -> str:
    """``4 of 10 requests within the SLO (over ttft: 6)``: what kept a cell's requests out of it."""
    requests = cell.requests
    why = [f"over {name}: {n}" for name, n in (cell.slo_misses or {}).items()]
    if cell.slo_unmeasured:
        why.append(f"no first token time: {cell.slo_unmeasured}")
    if requests > cell.ok:
        why.append(f"failed: {requests - cell.ok}")
    return f"{cell.slo_met} of {requests} requests within the SLO" + (
        f" ({', '.join(why)})" if why else ""
    )


def slo_line(summary: RunSummary) -> str:
    """What the SLO says about the run: the cells under the minimum attainment, or the lowest one."""
    cells = [c for c in summary.probe_cells() if c.slo_attainment is not None]
    minimum = summary.min_slo_attainment
    head = f"SLO {slo_bounds_text(summary.slo)}"
    if not cells:
        return f"{head}: no probe cell"
    if minimum is None:
        low = min(cells, key=lambda c: c.slo_attainment or 0.0)  # cells with one
        return (
            f"{head} (measured, not enforced: no load.min_slo_attainment): lowest attainment "
            f"{low.slo_attainment:.1%} at {low.probe} ({low.mode}) {low.level}, "
            f"{slo_cell_text(low)}"
        )
    failed = [c for c in cells if not c.meets_slo]
    if not failed:
        return f"{head}: met, every probe cell has ≥ {minimum:.1%} of its requests within it"
    return f"{head}: MISSED, {len(failed)} probe cell(s) under {minimum:.1%}: " + "; ".join(
        f"{c.label} {c.slo_attainment:.1%}, {slo_cell_text(c)}" for c in failed
    )


def _p50_p99(stats: dict[str, float] | None) -> str:
    if not stats or not stats.get("n"):
        return "-"
    return f"{stats['p50'] * 1000:.0f} / {stats['p99'] * 1000:.0f}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


_VERDICT_CELLS = 10  # drifting cells the verdict line names


def verdict_line(summary: RunSummary) -> str:
    """One sentence a person (or a CI log) can act on, with the sample size behind it."""
    verdict = summary.verdict
    cells = summary.probe_cells()
    short = [c for c in cells if c.short]
    if verdict == "target_failed":
        errors, requests, by_type = (
            summary.probe_errors,
            summary.probe_requests,
            summary.probe_errors_by_type,
        )
        empty = [f"{c.label}" for c in cells if c.ok == 0]
        return (
            f"target failed: {errors} of {requests} probe {sample_noun(cells)} failed "
            f"({counts_text(by_type)}); "
            f"limit is {summary.max_error_share:.0%}"
            + (f"; no ok sample in {', '.join(empty)}" if empty else "")
            + _companions(summary)
        )
    if verdict == "inconclusive":
        parts = [f"{c.label}: {short_text(c)}" for c in short] + missing_texts(summary)
        why = (
            "fewer ok probe samples than asked"
            if short
            else "a probe cell asked for has no counted sample"
            if summary.missing_cells
            else "no probe sample was counted"
        )
        return (
            f"inconclusive: {why}, so no claim of determinism"
            + "".join(f"; {part}" for part in parts)
            + _companions(summary)
        )
    if verdict == "deterministic":
        n = sum(c.ok for c in cells)
        worst = max((c.drift_rate_upper_95 or 0.0) for c in cells) if cells else 1.0
        return (
            f"deterministic: one output per probe at every level (n={n}; "
            f"per cell drift rate < {worst:.1%} at 95% confidence)" + _logprob_clause(cells)
        )
    drifted = [c for c in cells if c.drift]
    parts = []
    for c in drifted:
        at = position_label(char=c.first_divergence_chars, token=c.first_divergence_tokens)
        where = (
            f"first divergence at {at}"
            if c.first_divergence_chars is not None
            else "serial outputs already differ"
        )
        kinds = kinds_text(c)
        parts.append(
            f"{c.label}: {cell_phrase(c)}, {where}" + (f" (kinds: {kinds})" if kinds else "")
        )
    shortfall = len(short) + len(summary.missing_cells or ())
    also = f" (and {shortfall} cell(s) short of samples)" if shortfall else ""
    if (
        len(parts) > _VERDICT_CELLS
    ):  # a dataset's hundreds of drifting cells: summary.json's drift_cells has them
        parts = [*parts[:_VERDICT_CELLS], f"and {len(parts) - _VERDICT_CELLS} more drifting cells"]
    return "nondeterministic: " + "; ".join(parts) + also + _logprob_clause(cells)


def _logprob_clause(cells: tuple[CellSummary, ...]) -> str:
    """What the logprobs add to the verdict: latent drift where it is, the cells whose logprobs cover only
    some samples, or bitwise agreement everywhere (only when every ok sample of every cell was compared)."""
    parts = []
    latent = [c for c in cells if c.latent_drift]
    if latent:
        parts.append(
            "latent drift (same text, other logprobs) in "
            + ", ".join(
                f"{c.label} from {position_label(token=c.first_logprob_divergence_token)}"
                for c in latent
            )
        )
    parts += [logprob_gap_text(c) for c in cells if c.logprob_gap]
    if not parts and cells and all(c.logprob_bitwise for c in cells):
        parts.append(
            f"logprobs bitwise equal to serial in every cell (n={sum(c.logprob_samples or 0 for c in cells)})"
        )
    return "".join(f"; {part}" for part in parts)


def _companions(summary: RunSummary) -> str:
    if not summary.companion_errors:
        return ""
    return (
        f"; companions (not counted): {summary.companion_errors} of {summary.companion_requests} "
        f"failed ({counts_text(summary.companion_errors_by_type)})"
    )


def cache_lines(summary: RunSummary) -> list[str]:
    """load.prefix_cache's cold-vs-warm lines (``kevload.compare.coldwarm.ColdWarm``), each probe's
    under the method's; none without it."""
    cache = summary.prefix_cache
    if cache is None:
        return []
    out = [f"prefix cache, cold vs warm: cold made by {cache['method']} ({cache['why']})"]
    for c in cache["probes"]:
        if not c["rounds"]:
            out.append(
                f"  {c['probe']}: no round compared: "
                + (
                    f"in {c['contradicted']} the server said the warm sample reused no more prompt "
                    f"tokens than the cold "
                    "one (is its prefix cache on?)"
                    if c["contradicted"]
                    else "no round had an ok cold and warm answer"
                )
            )
            continue
        parts = [f"{c['rounds']} rounds"]
        if c["cold"]["distinct"] is not None:
            parts.append(
                f"cold {c['cold']['distinct']} distinct, warm {c['warm']['distinct']} distinct"
            )
        parts.append(
            "cold = warm in every round"
            if c["equal_rounds"] == c["rounds"]
            else f"cold ≠ warm in {c['rounds'] - c['equal_rounds']} of {c['rounds']} rounds (from char "
            f"{c['first_divergence_chars']}, 0-based)"
        )
        if c["warm_unstable_rounds"]:
            parts.append(
                f"warm answers disagree among themselves in {c['warm_unstable_rounds']} rounds"
            )
        varies = (
            "warm answers vary too"
            if (c["warm"]["distinct"] or 1) > 1 or c["warm_unstable_rounds"]
            else "cold answers vary among themselves"
        )
        parts.append(
            {
                True: "cache effect",
                False: "no cache effect on the text",
                None: f"no claim about the cache ({varies})",
            }[c["cache_effect"]]
        )
        if c.get("warm_good_to_bad") is not None:
            parts.append(
                f"graded: the warm cache turned {c['warm_good_to_bad']} answers bad, "
                f"{c['warm_bad_to_good']} good (each against its round's cold answer)"
            )
        if c["logprob_rounds"]:
            size = c["logprob_max_abs_diff"]
            parts.append(
                "logprobs bitwise equal"
                if c["logprob_bitwise"]
                else f"logprobs differ, largest |difference| {size:.3g} before the first differing token"
                if size
                else "logprobs differ from the first token"
                if size is None
                else "logprobs equal up to the first differing token"
            )
        if c["confirmed"]:
            parts.append(
                f"server confirms {c['confirmed']} (cached prompt tokens: cold ≤ "
                f"{c['cached_tokens_cold']}, "
                f"warm ≥ {c['cached_tokens_warm']})"
            )
        elif c["cached_tokens_warm"] is None and not c["contradicted"]:
            parts.append("the server did not say what it cached")
        if c["contradicted"]:
            parts.append(
                f"{c['contradicted']} rounds left out: the server said their warm sample reused no "
                f"more "
                "prompt tokens than the cold one"
            )
        out.append(f"  {c['probe']}: " + "; ".join(parts))
    return out


def markdown(summary: RunSummary) -> str:
    cells = summary.probe_cells()
    levels = levels_of(cells)
    md = markdown_cell
    lines = [
        "| probe (mode) | " + " | ".join(map(md, levels)) + " | n/cell |",
        "| --- | " + " | ".join("---:" for _ in levels) + " | ---: |",
    ]
    for (probe, mode), row in _rows(cells).items():
        texts = [md(cell_text(row.get(level))).replace("DRIFT", "**DRIFT**") for level in levels]
        lines.append(
            f"| {md(probe)} ({md(mode)}) | "
            + " | ".join(texts)
            + f" | {min(c.ok for c in row.values())} |"
        )
    notes = footnotes(summary)
    if notes:
        lines += [""] + [f"- {md(note)}" for note in notes]
    lines += [
        "",
        "| " + " | ".join(AGREEMENT_COLUMNS) + " |",
        "| --- | " + " | ".join("---:" for _ in AGREEMENT_COLUMNS[1:]) + " |",
    ]
    lines += ["| " + " | ".join(map(md, row)) + " |" for row in agreement_rows(summary)]
    if not gradedview.aggregate_only(summary):
        columns = latency_columns(summary)
        lines += [
            "",
            f"{LATENCY_TITLE}:",
            "",
            "| " + " | ".join(columns) + " |",
            "| --- | --- | " + " | ".join("---:" for _ in columns[2:]) + " |",
        ]
        lines += ["| " + " | ".join(map(md, row)) + " |" for row in latency_rows(summary)]
    rows = server_rows(summary)
    if rows:
        lines += [
            "",
            "| " + " | ".join(SERVER_COLUMNS) + " |",
            "| --- | " + " | ".join("---:" for _ in SERVER_COLUMNS[1:]) + " |",
        ]
        lines += ["| " + " | ".join(map(md, row)) + " |" for row in rows]
    cache = cache_lines(summary)
    if cache:
        lines += ["", md(cache[0]), *[f"- {md(line.strip())}" for line in cache[1:]]]
    lines += gradedview.accuracy_markdown(summary) + [
        f"- {md(line)}" for line in gradedview.lines(summary)
    ]
    lines += ["", md(verdict_line(summary)), ""]
    if summary.slo:
        lines += [
            "| probe (mode) | level | requests | within SLO | attainment | goodput/s |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
        ]
        for c in sorted(cells, key=lambda c: (c.probe, c.mode, c.level_order)):
            lines.append(
                f"| {md(c.probe)} ({md(c.mode)}) | {md(c.level)} | {c.requests} "
                f"| {c.slo_met} | {md(attainment_text(c))} | {_fmt(c.goodput)} |"
            )
        lines += ["", md(slo_line(summary)), ""]
    return "\n".join(lines)


def _rows(cells: Iterable[CellSummary]) -> dict[tuple[str, str], dict[str, CellSummary]]:
    rows: dict[tuple[str, str], dict[str, CellSummary]] = {}
    for c in cells:
        rows.setdefault((c.probe, c.mode), {})[c.level] = c
    return rows


def diagnosis_text(diagnosis: dict[str, Any]) -> str:
    """The diagnosis as a person reads it: each step's evidence, the findings, the verdict and what to try next."""
    lines = []
    for step in diagnosis["steps"]:
        if "distinct" not in step:
            lines.append(
                f"  {step['title']}: {'outside' if step.get('outside') else 'inside'} "
                f"({'; '.join(step.get('reasons', [])) or 'no boundary signs'})"
            )
            continue
        bound = (
            f", drift < {step['drift_rate_upper_95']:.0%} (95%)"
            if step.get("drift_rate_upper_95")
            else ""
        )
        errors = f", errors {counts_text(step['errors'])}" if step["errors"] else ""
        drift = f", drift at {', '.join(step['drift_cells'])}" if step["drift_cells"] else ""
        # One output that drifts is one output other than serial's, as the matrix says it.
        one_other = step["distinct"] == 1 and step["drift_cells"]
        distinct = "1, all ≠ serial" if one_other else f"{step['distinct']} distinct"
        gaps = "".join(f"; {gap}" for gap in step.get("logprob_gaps", ()))
        graded = (
            ""
            if step.get("graded_good") is None
            else (
                f", graded {step['graded_good']} good, {step['graded_bad']} bad"
                + (
                    f" ({step['flips_good_to_bad']} good→bad against serial)"
                    if step.get("flips_good_to_bad")
                    else ""
                )
            )
        )
        lines.append(
            f"  {step['title']}: {distinct}{graded}, n={step['ok']}{bound}{errors}{drift}{gaps}"
        )
    findings = ", ".join(f"{k}={_tri(v)}" for k, v in diagnosis["findings"].items())
    dropped = diagnosis.get("dropped_fields") or []
    lines.append(f"  findings: {findings}")
    if dropped:
        lines.append(f"  fields the server rejected (dropped): {', '.join(dropped)}")
    lines.extend(f"  note: {note}" for note in diagnosis.get("notes", []))
    lines.append(f"verdict: {diagnosis['verdict']} — {diagnosis['reason']}")
    if diagnosis["verdict"] == "stable":
        lines.append(
            f"evidence: {_EVIDENCE.get(diagnosis.get('evidence', 'text'), diagnosis.get('evidence'))}"
        )
    for cause in diagnosis.get("causes", [])[1:]:
        lines.append(f"also found: {cause['verdict']} — {cause['reason']}")
    lines.append(f"next: {diagnosis['next']}")
    return "\n".join(lines)


# What a stable verdict rests on, in words.
_EVIDENCE = {
    "text": "output text compared (hashes), not logprobs",
    "logprobs_bitwise": "per-token logprobs bitwise equal, as well as the text",
}


def _tri(value: Any) -> str:
    return {True: "yes", False: "no", None: "unknown"}.get(value, str(value))


def coverage_text(result: dict[str, Any]) -> str:
    on, tr = result["online"], result["train"]
    lines = [
        f"{'':24}{'online':>12}{'train':>12}",
        f"{'count':24}{on['count']:>12}{tr['count']:>12}",
    ]
    for name, side in (("online", on), ("train", tr)):
        skipped = side["skipped_lines"]
        if skipped["count"]:
            lines.append(
                f"{name}: {skipped['count']} bad line(s) skipped; the first, {skipped['first']}: "
                f"{skipped['first_reason']}"
            )
    for key in ("min", "p50", "p90", "p99", "max"):
        lines.append(
            f"{'length ' + key:24}{_num(on['length'][key]):>12}{_num(tr['length'][key]):>12}"
        )
    share = result["outside_length_range_share"]
    lines.append(f"online outside training length range: {share:.1%}" if share is not None else "")
    lines.append(
        "keywords: "
        + (
            "jieba word segmentation"
            if result["segmenter"] == "jieba"
            else "CJK character bigrams (install kevload[zh] for jieba words)"
        )
    )
    lines.append("top keywords online: " + ", ".join(k["keyword"] for k in on["top_keywords"][:10]))
    lines.append("top keywords train:  " + ", ".join(k["keyword"] for k in tr["top_keywords"][:10]))
    rare = result["online_keywords_rare_in_train"]
    lines.append(
        "frequent online, rare or missing in training: "
        + (
            ", ".join(
                f"{r['keyword']} ({r['online_share']:.0%} vs {r['train_share']:.0%})"
                for r in rare[:10]
            )
            or "none"
        )
    )
    labels = result["labels"]
    if labels["psi"] is not None:
        lines.append(
            f"labels: PSI {labels['psi']:.3f}, Jensen-Shannon {labels['js_divergence']:.3f}; "
            f"online "
            + ", ".join(f"{k} {v:.0%}" for k, v in labels["online"].items())
            + "; train "
            + ", ".join(f"{k} {v:.0%}" for k, v in labels["train"].items())
        )
    if "flagged" in result:
        lines.append(f"boundary samples flagged: {result['flagged']} of {on['count']}")
    lines.append("(statistics are clues, not proof)")
    return "\n".join(line for line in lines if line)


def _num(value: Any) -> str:
    return "-" if value is None else str(value)


def junit_xml(summary: RunSummary, suite: str = "kevload", fail_on: str = "drift") -> str:
    """JUnit XML, one testcase per probe × level; drift, no ok sample, a short cell or one under
    ``load.min_slo_attainment`` or ``load.min_good_share`` is a failure, and with
    ``fail_on="latent"`` latent drift too, and a cell whose logprobs cover only some of its samples
    (otherwise both are said in the case's output). With ``fail_on="bad"`` drift fails only where
    load turned an answer bad (``flips_good_to_bad``), as the exit code does. A graded run adds one
    testcase per level for its accuracy, failing where it fell significantly, and under
    load.prefix_cache one per graded probe (``prefix_cache``), failing where the warm cache turned
    answers bad."""
    from xml.etree import ElementTree as ET

    cells = summary.probe_cells()
    verdicts = [(c, _junit_failure(c, summary, fail_on)) for c in cells]
    levels = summary.accuracy or ()
    # load.prefix_cache's graded probes: each a case, failing where the warm cache turned answers
    # bad.
    warm = [
        c
        for c in (summary.prefix_cache or {}).get("probes", ())
        if c.get("warm_good_to_bad") is not None
    ]
    failures = (
        sum(1 for _, failure in verdicts if failure)
        + len(summary.missing_cells or ())
        + sum(1 for entry in levels if entry["fell"])
        + sum(1 for c in warm if c["warm_good_to_bad"])
    )
    seconds = sum(c.duration_s or 0 for c in cells)
    tests = len(cells) + len(summary.missing_cells or ()) + len(levels) + len(warm)
    root = ET.Element(
        "testsuites",
        name=suite,
        tests=str(tests),
        failures=str(failures),
        errors="0",
        time=f"{seconds:.3f}",
    )
    group = ET.SubElement(
        root,
        "testsuite",
        name=summary.scenario or suite,
        tests=str(tests),
        failures=str(failures),
        errors="0",
        skipped="0",
        time=f"{seconds:.3f}",
    )
    for c, failure in verdicts:
        case = ET.SubElement(
            group,
            "testcase",
            classname=f"{suite}.{c.probe}.{c.mode}",
            name=c.level,
            time=f"{c.duration_s or 0:.3f}",
        )
        if failure is not None:
            kind, message, text = failure
            ET.SubElement(case, "failure", message=message, type=kind).text = text
            continue
        within = (
            f"; SLO attainment {c.slo_attainment:.1%} ({slo_cell_text(c)})"
            if c.slo_attainment is not None
            else ""
        )
        latent = f"; latent drift: {latent_text(c)}" if c.latent_drift else ""
        graded = gradedview.cell_figures(c)
        if c.drift:  # drift whose answers load did not make worse, under fail_on bad
            head = f"{cell_phrase(c, ' samples')}, no answer turned bad by load"
        else:
            head = (
                f"1 output in {c.ok} samples; drift rate < {c.drift_rate_upper_95:.2%} at 95% "
                f"confidence; "
                f"logprobs vs serial: {logprob_text(c)}"
            )
        ET.SubElement(case, "system-out").text = (
            head + latent + within + (f"; {graded}" if graded else "")
        )
    for entry in levels:
        case = ET.SubElement(
            group,
            "testcase",
            classname=f"{suite}.accuracy.{entry['mode']}",
            name=level_name(entry).partition("/")[2],
            time="0.000",
        )
        text = gradedview.level_text(entry)
        if entry["fell"]:
            ET.SubElement(
                case,
                "failure",
                type="accuracy_fell",
                message=(f"accuracy fell against serial (McNemar p {entry['mcnemar_p']:.3g})"),
            ).text = text
        else:
            ET.SubElement(case, "system-out").text = text
    for c in warm:
        case = ET.SubElement(
            group, "testcase", classname=f"{suite}.prefix_cache", name=c["probe"], time="0.000"
        )
        text = (
            f"the warm cache turned {c['warm_good_to_bad']} answers bad, {c['warm_bad_to_good']} "
            f"good, over {c['rounds']} rounds (each warm answer against its round's cold one)"
        )
        if c["warm_good_to_bad"]:
            ET.SubElement(case, "failure", type="warm_bad", message=text).text = text
        else:
            ET.SubElement(case, "system-out").text = text
    for name, text in zip(summary.missing_cells or (), missing_texts(summary), strict=True):
        probe, mode, level = name_parts(name)
        case = ET.SubElement(
            group, "testcase", classname=f"{suite}.{probe}.{mode}", name=level, time="0.000"
        )
        ET.SubElement(case, "failure", message="no counted sample", type="inconclusive").text = text
    # ElementTree escapes < & and quotes but writes control characters as they are: a file no XML
    # parser reads.
    for element in root.iter():
        element.attrib = {name: xml_text(value) for name, value in element.attrib.items()}
        if element.text:
            element.text = xml_text(element.text)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def _junit_failure(
    c: CellSummary, summary: RunSummary, fail_on: str
) -> tuple[str, str, str] | None:
    """A probe cell's JUnit failure (type, message, text), or None when it passes. One failure per testcase: a gate
    (SLO, good share) is named inside another failure, or is the failure itself."""
    graded = gradedview.cell_figures(c)
    graded = f"; {graded}" if graded else ""
    slo = (
        f"; under the SLO's minimum attainment {summary.min_slo_attainment:.1%}: "
        f"{c.slo_attainment:.1%}, "
        f"{slo_cell_text(c)}"
        if c.name in summary.slo_failed_cells
        else ""
    )
    share = (
        f"; under load.min_good_share {summary.min_good_share:.1%}: good share {c.good_share:.1%}"
        if c.name in (summary.good_share_failed_cells or ())
        else ""
    )
    outputs = "1 output" if c.distinct == 1 else f"{c.distinct} distinct outputs"
    latent_fails = fail_on == "latent"
    # Under fail_on bad, drift fails only where an answer good in every serial sample came back bad
    # (exitcode).
    drift_fails = c.drift and (fail_on != "bad" or bool(c.flips_good_to_bad))
    if c.ok == 0:
        return "target_failed", "no ok sample", f"errors: {counts_text(c.errors)}{slo}{share}"
    if drift_fails:
        kinds = kinds_text(c)
        short = f"; short: {short_text(c)}" if c.short else ""
        text = (
            f"{cell_phrase(c, ' samples')}; first divergence at "
            f"{position_label(char=c.first_divergence_chars, token=c.first_divergence_tokens)}; "
            f"{c.divergent_requests} requests differ from the serial output"
            + (f" (kinds: {kinds})" if kinds else "")
            + short
            + graded
            + slo
            + share
        )
        if fail_on == "bad":
            return "bad_answers", f"{c.flips_good_to_bad} answers good→bad under load", text
        return "nondeterminism", cell_phrase(c), text
    if c.short:
        return (
            "inconclusive",
            f"short of samples: {c.ok} of {c.asked} ok",
            (
                f"{outputs} in {c.ok} samples, fewer than the {c.asked} asked: "
                f"{short_text(c)}{graded}{slo}{share}"
            ),
        )
    if c.latent_drift and latent_fails:
        return (
            "latent_drift",
            f"latent drift: {latent_text(c)}",
            (
                f"1 output in {c.ok} samples, the serial text, but its per-token logprobs differ "
                f"from the "
                f"serial ones from {position_label(token=c.first_logprob_divergence_token)}: "
                f"{logprob_text(c)}{slo}{share}"
            ),
        )
    if c.logprob_gap and latent_fails:
        gap = logprob_gap_text(c, c.level)
        return (
            "logprobs_missing",
            gap,
            (
                f"1 output in {c.ok} samples; latent drift can be neither shown nor ruled out: "
                f"{gap}{slo}{share}"
            ),
        )
    if slo:
        return (
            "slo",
            f"SLO attainment {c.slo_attainment:.1%} under {summary.min_slo_attainment:.1%}",
            (
                f"SLO {slo_bounds_text(summary.slo)}: {slo_cell_text(c)}; {outputs} in {c.ok} "
                f"samples{graded}{share}"
            ),
        )
    if share:
        return (
            "good_share",
            f"good share {c.good_share:.1%} under {summary.min_good_share:.1%}",
            (f"{outputs} in {c.ok} samples{graded}{share}"),
        )
    return None
