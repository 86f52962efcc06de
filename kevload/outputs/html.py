"""One self-contained HTML report (inline CSS and SVG, nothing fetched) for a run or a sweep."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable
from typing import Any

from kevload.inputs.wordsets import CANCELLED, OK
from kevload.outputs import gradedview
from kevload.outputs.celltext import (
    attainment_text,
    cell_phrase,
    cell_text,
    errors_text,
    full_load_text,
    kinds_text,
    latent_text,
    logprob_gap_text,
    never_full_text,
    slo_bounds_text,
)
from kevload.outputs.escaping import visible
from kevload.outputs.footnotes import cache_lines, footnotes
from kevload.outputs.tablerows import AGREEMENT_COLUMNS, SERVER_COLUMNS, agreement_rows, server_rows
from kevload.outputs.verdict import slo_line, verdict_line
from kevload.records.machine import where_text
from kevload.records.store import Record, redact
from kevload.records.summary import (
    CellSummary,
    RunSummary,
    levels_of,
    position_label,
)

STABLE = "#2e7d32"
DRIFT = "#c62828"
SHORT = "#ef6c00"  # no drift seen, but fewer ok samples than asked: no claim either way
# the serial text, other per-token logprobs: numerics differ, no token flipped yet
LATENT = "#6a1b9a"
EMPTY = "#9e9e9e"

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#212121;max-width:1200px}
h1{font-size:22px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}
td,th{padding:6px 10px;border:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}
#heatmap td.cell{color:#fff;font-weight:600;min-width:64px;text-align:center}
.verdict{font-size:16px;padding:8px 12px;background:#f5f5f5;border-left:4px solid #555}
pre{background:#f7f7f7;padding:10px;overflow:auto;font-size:12px;white-space:pre-wrap;
overflow-wrap:anywhere}
mark{background:#ffcdd2}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}
#graded{width:100%}
#graded td:not(.answer):not(:first-child),#graded td span{white-space:nowrap}
#graded td.answer{text-align:left;vertical-align:top;min-width:10em}
#graded td.answer pre{margin:0;max-height:9em}
"""


def run_report(summary: RunSummary, meta: dict[str, Any], records: Iterable[Record]) -> str:
    cells = summary.probe_cells()
    rows: dict[str, dict[str, CellSummary]] = {}
    for c in cells:
        rows.setdefault(f"{c.probe} ({c.mode})", {})[c.level] = c
    body = [
        f"<h1>kevload run {_e(meta.get('run_id'))}: {_e(meta.get('scenario_name'))}</h1>",
        f"<p>target {_e(meta.get('target', {}).get('base_url'))} · "
        f"model {_e(meta.get('target', {}).get('model'))}"
        f" · {_e(meta.get('started_at'))} – {_e(meta.get('ended_at'))} · state "
        f"{_e(meta.get('state'))}</p>",
        # Where it ran: a real server's answers under batching move with the CPU and the engine.
        *([f"<p class=machine>{_e(where)}</p>"] if (where := where_text(meta)) else []),
        f"<p class=verdict>{_e(verdict_line(summary))}</p>",
        "<h2>Distinct outputs per probe × level</h2>",
        _heatmap(rows, levels_of(cells)),
        _notes(summary),
        "<h2>Agreement with the serial output</h2>",
        _agreement(summary),
        *_graded(summary),
        "<h2>Latency by level</h2>",
        _latency(cells),
        *_server_view(summary),
        *_cold_warm(summary),
        f"<p>{_e(slo_line(summary))}</p>" if summary.slo else "",
        "<h2>Where outputs first diverge</h2>",
        _divergence(cells),
        "<h2>Requests finished per second, ok and errors</h2>",
        _timeline(records),
        # Masked again here: a run.json written before header values stopped being stored may still
        # hold some.
        "<h2>Run parameters</h2>",
        "<pre>"
        f"{_e(json.dumps(redact(meta.get('scenario'), []), indent=2, ensure_ascii=False))}</pre>",
    ]
    return _page(f"kevload {meta.get('run_id')}", body)


def _max_at_slo(sweep: dict[str, Any]) -> list[str]:
    """First on the page when there is an SLO: per setting, the highest level that met it."""
    rows = [row for row in sweep["rows"] if row.get("max_at_slo")]
    if not rows:
        return []
    out = ["<table><tr><th>setting</th><th>probe</th><th>max level at SLO</th><th>SLO</th></tr>"]
    for row in rows:
        minimum = row.get("min_slo_attainment")
        within = f"≥ {minimum:.1%} within " if minimum is not None else "all within "
        for probe, level in row["max_at_slo"].items():
            out.append(
                f"<tr><td>{_e(row['setting'])}</td><td>{_e(probe)}</td>"
                f"<td>{_e(level or 'none')}</td>"
                f"<td>{_e(within + slo_bounds_text(row['slo']))}</td></tr>"
            )
    return ["<h2>Highest level at SLO</h2>", "".join(out) + "</table>"]


def _heatmap(rows: dict[str, dict[str, CellSummary]], levels: list[str]) -> str:
    out = [
        "<table id=heatmap><tr><th>probe</th>"
        + "".join(f"<th>{_e(lv)}</th>" for lv in levels)
        + "</tr>"
    ]
    for name, by_level in rows.items():
        out.append(f"<tr><td>{_e(name)}</td>")
        out += [_heat_cell(by_level.get(level)) for level in levels]
        out.append("</tr>")
    out.append(_heat_legend(rows, levels))
    return "".join(out)


def _heat_cell(cell: CellSummary | None) -> str:
    """One matrix cell, coloured by what it shows, its details in the title."""
    if cell is None or not cell.ok:
        return (
            f'<td class=cell style="background:{EMPTY}">{_e(cell_text(cell) if cell else "–")}</td>'
        )
    colour = (
        DRIFT if cell.drift else SHORT if cell.short else LATENT if cell.latent_drift else STABLE
    )
    title = (
        cell_phrase(cell)
        + (
            f"; latent drift: {latent_text(cell)}"
            if cell.latent_drift
            else f"; {logprob_gap_text(cell, cell.level)}"
            if cell.logprob_gap
            else ""
        )
        + (f"; † {never_full_text(cell)}" if cell.samples_never_full else "")
        + (f"; {cell.server_note}" if cell.server_note else "")
    )
    return (
        f'<td class=cell style="background:{colour}" title="{_e(title)}">{_e(cell_text(cell))}</td>'
    )


def _heat_legend(rows: dict[str, dict[str, CellSummary]], levels: list[str]) -> str:
    """The colours, and each mark beyond them that the matrix shows."""
    shown = " ".join(
        cell_text(by_level.get(level)) for by_level in rows.values() for level in levels
    )
    marks = "".join(f" · {_e(words)}" for glyph, words in MATRIX_MARKS if re.search(glyph, shown))
    return (
        f"</table><p class=legend>cell: distinct outputs · <span "
        f"style='background:{STABLE}'></span>one "
        f"output, same as serial <span style='background:{DRIFT}'></span>drift (all≠serial: the "
        f"copies "
        f"agree with each other, not with serial) <span style='background:{SHORT}'></span>no drift "
        f"seen, "
        f"fewer ok samples than asked (ok/asked) <span style='background:{LATENT}'></span>~ latent "
        f"drift: the "
        f"serial text, other per-token logprobs <span style='background:{EMPTY}'></span>no ok "
        f"sample · † some "
        "counted samples never had c − 1 others in flight (from the records' send and last-byte "
        f"times){marks}</p>"
    )


# The matrix's marks beyond the colours (celltext.cell_text, gradedview.cell_mark): the legend
# explains each one a matrix shows, by the pattern that finds it in the cells' texts.
MATRIX_MARKS = (
    (r"DRIFT", "DRIFT: more than one distinct output"),
    (r"(?<![\w-])t\d", "t1: a conversation whose answers leave the serial ones at turn 1"),
    (r"✂", "✂3: kevload cut 3 requests of the level (load.cancel_share)"),
    (r"✗", "✗2: 2 answers graded bad where every serial answer was good"),
    (r"↑", "↑1: 1 answer graded good where every serial answer was bad"),
    (r"✓", "✓ drift whose answers all stay graded good"),
)


def _rows_table(table_id: str, columns: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    """A table's head and rows, every value escaped; the caller closes it (a note may follow inside
    the string)."""
    return (
        f"<table id={table_id}><tr>"
        + "".join(f"<th>{_e(name)}</th>" for name in columns)
        + "</tr>"
        + "".join(
            "<tr>" + "".join(f"<td>{_e(value)}</td>" for value in row) + "</tr>" for row in rows
        )
    )


def _agreement(summary: RunSummary) -> str:
    rows = agreement_rows(summary)
    out = [_rows_table("agreement", AGREEMENT_COLUMNS, rows)]
    out.append(
        "</table><p>exact match: share of samples with the serial output (Wilson interval); token "
        "agreement: "
        "mean share of token positions equal to serial before the first divergence; logprobs: "
        "every ok "
        "sample's logprobs compared and bitwise equal to serial (=), or from which token and by "
        "how much "
        "they differ, or no claim where some ok samples came without logprobs. Positions count "
        "from 0.</p>"
    )
    return "".join(out)


def _graded(summary: RunSummary) -> list[str]:
    """Graded probes (kevload.compare.graded): accuracy per level against serial, then every graded
    cell with its flips and one flipped answer beside the serial one (the per-probe detail a
    dataset's terminal table leaves out)."""
    if not gradedview.graded(summary):
        return []
    levels = [
        _rows_table("accuracy", gradedview.ACCURACY_COLUMNS, gradedview.accuracy_rows(summary))
    ]
    notes = gradedview.lines(summary)
    return [
        "<h2>Good or bad: graded answers</h2>",
        "".join(levels) + "</table>",
        "<p>a probe is good at a level when every answer it got there is graded good; good→bad and "
        "bad→good "
        "count probes against their own serial level, with the exact McNemar test over those "
        "pairs.</p>",
        _graded_cells(summary)
        + "</table><p>good→bad: answers graded bad where every serial answer was good (bad→good "
        "the reverse); none counted where the serial answers are mixed.</p>",
        "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>" if notes else "",
    ]


_GRADED_COLUMNS = (
    "probe / level",
    "good",
    "bad",
    "good share [95% CI]",
    "serial answers",
    "good→bad",
    "bad→good",
    "flipped answer",
    "serial answer",
)


def _graded_cells(summary: RunSummary) -> str:
    """The graded cells' table (left open: the caller closes it), a row per graded cell."""
    rows = [
        "<table id=graded><tr>" + "".join(f"<th>{_e(n)}</th>" for n in _GRADED_COLUMNS) + "</tr>"
    ]
    for c in sorted(summary.probe_cells(), key=lambda c: (c.probe, c.mode, c.level_order)):
        if c.graded_good is not None:
            rows.append(_graded_row(c))
    return "".join(rows)


def _graded_row(c: CellSummary) -> str:
    """A graded cell: its counts, good share, serial grade and flips, and one flipped answer beside
    the serial one."""
    share = (
        "–"
        if c.good_share is None or c.good_share_ci95 is None  # written together
        else f"{c.good_share:.1%} [{c.good_share_ci95[0]:.1%}, {c.good_share_ci95[1]:.1%}]"
    )
    reference = c.level == c.reference_level
    failed = f" ({c.grade_failed} not graded: grader failed)" if c.grade_failed else ""
    values = (
        c.graded_good,
        f"{c.graded_bad}{failed}",
        share,
        "reference" if reference else c.serial_grade or "not graded",
        "" if reference else _count(c.flips_good_to_bad),
        "" if reference else _count(c.flips_bad_to_good),
    )
    # Answers wrap inside their column (a long one scrolls within it), and a row without a flip
    # has empty cells, not empty grey boxes: the page keeps to the window's width.
    answers = "".join(
        f"<td class=answer><pre>{_e(text)}</pre></td>" if text else "<td class=answer></td>"
        for text in (c.flip_answer, c.flip_serial_answer)
    )
    # The label breaks only between probe id and level, never inside an id ("sum-en-0").
    label = f"<td><span>{_e(c.probe)}</span> <span>({_e(c.mode)}) {_e(c.level)}</span></td>"
    return "<tr>" + label + "".join(f"<td>{_e(v)}</td>" for v in values) + answers + "</tr>"


def _count(value: int | None) -> str:
    return "not counted" if value is None else str(value)


def _notes(summary: RunSummary) -> str:
    notes = footnotes(summary)
    return "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>" if notes else ""


def _cold_warm(summary: RunSummary) -> list[str]:
    """load.prefix_cache's comparison: how cold was made, then each probe's line."""
    lines = cache_lines(summary)
    if not lines:
        return []
    return [
        "<h2>Prefix cache, cold vs warm</h2>",
        f"<p>{_e(lines[0])}</p>",
        "<ul>" + "".join(f"<li>{_e(line.strip())}</li>" for line in lines[1:]) + "</ul>",
    ]


def _server_view(summary: RunSummary) -> list[str]:
    """What the server's /metrics said per cell, where it published any."""
    rows = server_rows(summary)
    if not rows:
        return []
    out = [_rows_table("server", SERVER_COLUMNS, rows)]
    out.append(
        "</table><p>read from the server's /metrics (sent and answered) between the cell's first "
        "counted "
        "send and its last answer: requests it ran at once and held waiting; a level where it ran "
        "fewer than "
        "c at every read while others waited, no read failing, was set by the server's batch "
        "limit, not by "
        "kevload.</p>"
    )
    return ["<h2>The server's own view</h2>", "".join(out)]


def _latency(cells: Iterable[CellSummary]) -> str:
    cells = list(cells)
    metrics = ("ttft", "itl", "tpot", "e2e")
    slo = any(c.slo_attainment is not None for c in cells)
    out = [
        "<table><tr><th>probe / level</th>"
        + "".join(f"<th>{m} p50</th><th>{m} p99</th>" for m in metrics)
        + "<th>tok/s</th><th>req/s</th><th>errors</th><th>full load</th>"
        + ("<th>SLO met</th><th>goodput/s</th>" if slo else "")
        + "</tr>"
    ]
    top = max((c.latency.get("e2e", {}).get("p99") or 0 for c in cells), default=0) or 1
    bars = []
    for i, c in enumerate(sorted(cells, key=lambda c: (c.probe, c.mode, c.level_order))):
        lat = c.latency
        out.append(f"<tr><td>{_e(c.label)}</td>")
        for m in metrics:
            stats = lat.get(m) or {}
            out.append(f"<td>{_ms(stats.get('p50'))}</td><td>{_ms(stats.get('p99'))}</td>")
        out.append(
            f"<td>{_num(c.output_tokens_per_s)}</td><td>{_num(c.requests_per_s)}</td>"
            f"<td>{_e(errors_text([c]))}</td><td>{_e(full_load_text(c))}</td>"
            + (f"<td>{_e(attainment_text(c))}</td><td>{_num(c.goodput)}</td>" if slo else "")
            + "</tr>"
        )
        e2e = lat.get("e2e") or {}
        y = 10 + i * 22
        for value, colour, offset in (
            (e2e.get("p99"), "#90caf9", 0),
            (e2e.get("p50"), "#1565c0", 0),
        ):
            if value:
                bars.append(
                    f'<rect x="{220 + offset}" y="{y}" width="{600 * value / top:.1f}" height="16" '
                    f'fill="{colour}"/>'
                )
        bars.append(f'<text x="4" y="{y + 12}" font-size="12">{_e(c.probe)} {_e(c.level)}</text>')
    out.append("</table>")
    height = 20 + 22 * len(cells)
    out.append(
        f'<svg width="860" height="{height}" role="img" aria-label="e2e latency p50 and p99">'
        f"{''.join(bars)}"
        f'<text x="220" y="{height - 2}" font-size="11">e2e p50 (dark) and p99 (light), '
        f"max {top * 1000:.0f} ms</text></svg>"
    )
    return "".join(out)


def _divergence(cells: Iterable[CellSummary]) -> str:
    drifted = [c for c in cells if c.drift and c.serial_example is not None]
    if not drifted:
        return "<p>No output differed from the serial reference.</p>"
    out = []
    for c in drifted:
        # The example is the output that leaves the serial one at the char the heading states.
        # A drifted cell has its divergence point and examples: written together.
        at = (c.first_divergence_chars or 0) - (c.example_offset or 0)
        serial, other = c.serial_example or "", c.divergent_example or ""
        lead = "…" if c.example_offset else ""
        kinds = kinds_text(c)
        where = position_label(char=c.first_divergence_chars, token=c.first_divergence_tokens)
        finish = ""
        if c.divergent_example_kind == "finish":
            finish = (
                f"\nsame text; finish_reason {c.serial_finish_reason} (serial) vs "
                f"{c.divergent_finish_reason}"
            )
        out.append(
            f"<h3>{_e(c.label)}: {_e(cell_phrase(c))}, "
            f"first divergence at {_e(where)}"
            f"{_e(f' (kinds: {kinds})' if kinds else '')}"
            f"</h3><pre>serial:    {lead}{_e(serial[:at])}<mark>{_e(serial[at:])}</mark>\n"
            f"divergent: {lead}{_e(other[:at])}<mark>{_e(other[at:])}</mark>{_e(finish)}</pre>"
        )
    return "".join(out)


def _timeline(records: Iterable[Record]) -> str:
    bins: dict[int, list[int]] = {}
    cut = 0  # requests kevload cut on purpose (load.cancel_share): neither answers nor errors
    for r in records:
        if r.role == "warmup":
            continue
        if r.status == CANCELLED:
            cut += 1
            continue
        second = int(r.t_last_byte)
        counts = bins.setdefault(second, [0, 0])
        counts[0 if r.status == OK else 1] += 1
    if not bins:
        return "<p>No requests.</p>"
    first = min(bins)
    width = max(bins) - first + 1
    peak = max(sum(v) for v in bins.values())
    bar_w = max(2.0, min(40.0, 800 / width))
    shapes = []
    for second, (ok, bad) in sorted(bins.items()):
        x = 40 + (second - first) * bar_w
        ok_h, bad_h = 150 * ok / peak, 150 * bad / peak
        shapes.append(
            f'<rect x="{x:.1f}" y="{160 - ok_h - bad_h:.1f}" width="{bar_w - 1:.1f}" '
            f'height="{ok_h:.1f}" '
            f'fill="#81c784"/><rect x="{x:.1f}" y="{160 - bad_h:.1f}" width="{bar_w - 1:.1f}" '
            f'height="{bad_h:.1f}" fill="{DRIFT}"/>'
        )
    errors = sum(v[1] for v in bins.values())
    svg_width = max(700, int(60 + width * bar_w))
    return (
        f'<svg width="{svg_width}" height="180" role="img" '
        f'aria-label="requests finished per second, ok and errors">{"".join(shapes)}'
        f'<text x="40" y="176" font-size="11">requests finished per second: ok (green), '
        f"errors (red); {errors} errors in {width} s, peak {peak}/s"
        f"{f'; {cut} cut by kevload (load.cancel_share), not shown' if cut else ''}</text></svg>"
    )


def _page(title: str, body: list[str]) -> str:
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>"
        f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n"
    )


def _e(value: Any) -> str:
    """Anything user- or server-derived, as HTML text or an attribute value: markup and quotes
    escaped, control characters spelled (``escaping.visible``: ESC and NUL mean nothing on a page,
    and NUL is a parse error)."""
    return html.escape(visible("" if value is None else str(value)))


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.1f}"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"
