"""A sweep's HTML page (``kevload report SWEEP_DIR --format html``): the grid, per setting and level
what sweep.md's matrix shows (≡ / ~ / drift, answers/s, p50, ``server ran ≤ N``), and with
``--reference`` each setting's agreement and accuracy against its reference setting and a chart of
throughput against agreement — the price of holding, at a glance. Self-contained (inline CSS and
SVG, nothing fetched) and narrow: long values wrap, no raw JSON."""

from __future__ import annotations

from typing import Any

from kevload.outputs.html import DRIFT, EMPTY, LATENT, SHORT, STABLE, _e, _max_at_slo, _num, _page
from kevload.outputs.sweepview import (
    accuracy_text,
    agreement_text,
    compared,
    flips_text,
    is_reference,
    p_text,
    pct,
    ratio_text,
    sweep_cell_text,
)
from kevload.records.machine import rows_where
from kevload.records.summary import CellSummary, answered_per_s, row_cells

# Long settings wrap after their commas (``_name``) and, past that, inside a word: the page stays
# within its width however many axes a setting has.
_WRAP = "<style>td,li{overflow-wrap:break-word}#heatmap td.cell{font-size:12px}</style>"
_W, _H, _PAD = 640, 320, 48  # the chart's size and its margin for the axes' labels
_COLOURS = ("#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#c62828", "#00838f", "#5d4037")


def sweep_report(sweep: dict[str, Any]) -> str:
    rows: dict[str, dict[str, CellSummary]] = {}
    for row in sweep["rows"]:
        for cell in row_cells(row):
            rows.setdefault(f"{row['setting']} · {cell.probe} ({cell.mode})", {})[cell.level] = cell
    # A setting that failed or never ran may have no cell at all: the reason is its only trace, as
    # in sweep.md.
    failed = [
        f"<li>{_e(row['setting'])}: {_e(row['error'].splitlines()[0])}</li>"
        for row in sweep["rows"]
        if row.get("error")
    ]
    failed += [
        f"<li>{_e(row['setting'])}: {_e(row['verdict_line'])}</li>"
        for row in sweep["rows"]
        if row.get("verdict") == "not_run"
    ]
    body = [
        _WRAP,
        "<h1>kevload sweep</h1>",
        _grid(sweep),
        *[f"<p class=machine>{_e(where)}</p>" for where in rows_where(sweep["rows"])],
        *_reference(sweep),
        *_max_at_slo(sweep),
        *(
            ["<h2>Settings that failed or did not run</h2>", f"<ul>{''.join(failed)}</ul>"]
            if failed
            else []
        ),
        "<h2>Each setting × level</h2>",
        _matrix(rows, sweep["levels"]),
        "<h2>Throughput</h2>",
        _throughput(rows, sweep["levels"]),
    ]
    return _page("kevload sweep", body)


def _grid(sweep: dict[str, Any]) -> str:
    """The axes, one line each: what was swept, without restarts (scenario keys) or with."""
    grid = sweep.get("grid") or {}
    items = [
        f"<li>{_e(name)} = {_e(', '.join(map(str, values)))}{kind}</li>"
        for part, kind in (("server", " (server)"), ("scenario", " (scenario key)"))
        for name, values in (grid.get(part) or {}).items()
    ]
    return f"<ul id=grid>{''.join(items)}</ul>" if items else ""


def _reference(sweep: dict[str, Any]) -> list[str]:
    """With --reference: the gate, the chart, the table against the reference and the findings."""
    ref = sweep.get("reference")
    if not ref:
        return []
    rows = "".join(
        f"<tr><td>{_name(setting)}</td><td>{_name(reference)}</td><td>{_e(level['level'])}</td>"
        f"<td>{level['items']}</td><td>{_e(agreement_text(level))}</td><td>{level['latent']}</td>"
        f"<td>{_e(accuracy_text(level))}</td><td>{_e(flips_text(level))}</td>"
        f"<td>{_e(p_text(level['mcnemar_p']))}</td><td>{_e(ratio_text(level))}</td></tr>"
        for setting, reference, level in compared(sweep)
    )
    accuracy = "".join(
        f"<tr><td>{_name(row['setting'])}{' (reference)' if is_reference(row) else ''}</td>"
        + "".join(f"<td>{_e(lv)} {pct(share)}</td>" for lv, share in row["accuracy"].items())
        + "</tr>"
        for row in sweep["rows"]
        if row.get("accuracy")
    )
    findings = "".join(f"<li>{_e(line)}</li>" for line in ref["findings"])
    return [
        f"<h2>Against the reference {_e(ref['axis'])}={_e(ref['value'])}: exit {ref['code']}</h2>",
        f"<ul>{findings}</ul>"
        if findings
        else "<p>The gate found no setting worse than its reference (α "
        f"{ref['alpha_per_test']:.3g} per setting × level).</p>",
        _chart(sweep),
        "<table id=against><tr><th>setting</th><th>reference</th><th>level</th><th>items</th>"
        "<th>agreement (95%)</th><th>latent</th><th>accuracy ref → setting</th>"
        f"<th>good→bad / bad→good</th><th>McNemar p</th><th>p50 ratio</th></tr>{rows}</table>",
        f"<h3>Accuracy per setting</h3><table id=accuracy>{accuracy}</table>" if accuracy else "",
    ]


def _name(setting: str) -> str:
    """A setting's name as HTML, free to wrap after each of its axes."""
    return _e(setting).replace(",", ",<wbr>")


def chart_points(sweep: dict[str, Any]) -> list[tuple[str, str, float, float]]:
    """(setting, level, agreement, answers/s) per setting × level compared; a reference setting
    at agreement 1 (it is its own yardstick), its throughput as measured beside its settings."""
    points: dict[tuple[str, str], tuple[float, float]] = {}
    for setting, reference, level in compared(sweep):
        ours = level["candidate_load"].get("requests_per_s")
        theirs = level["reference_load"].get("requests_per_s")
        if level["agreement"] is not None and ours is not None:
            points[setting, level["level"]] = (level["agreement"], ours)
        if theirs is not None:
            points[reference, level["level"]] = (1.0, theirs)
    return [(s, lv, a, t) for (s, lv), (a, t) in points.items()]


def _chart(sweep: dict[str, Any]) -> str:
    """Answers per second (up) against agreement with the reference (right), a dot per setting ×
    level, coloured by level: a setting up and to the right is fast and holds."""
    points = chart_points(sweep)
    if not points:
        return "<p>No setting was compared: no chart.</p>"
    top = max(t for *_, t in points) * 1.1 or 1.0
    levels = list(dict.fromkeys(lv for _, lv, _, _ in points))
    colour = {lv: _COLOURS[i % len(_COLOURS)] for i, lv in enumerate(levels)}
    marks = _axes(top) + _dots(points, levels, colour, top)
    legend = " ".join(f"<span style='background:{colour[lv]}'></span>{_e(lv)}" for lv in levels)
    return (
        f'<svg id=price width="{_W}" height="{_H}" role="img" '
        f'aria-label="answers per second against agreement with the reference">'
        f"{''.join(marks)}</svg><p class=legend>each dot a setting at a level: {legend}</p>"
    )


def _x(agreement: float) -> float:
    return _PAD + agreement * (_W - 2 * _PAD)


def _y(rate: float, top: float) -> float:
    return _H - _PAD - rate / top * (_H - 2 * _PAD)


def _axes(top: float) -> list[str]:
    """The chart's axes, their names and ticks (0, 50, 100 % agreement; 0 and the fastest rate)."""
    marks = [
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="#555"/>',
        f'<line x1="{_PAD}" y1="{_PAD}" x2="{_PAD}" y2="{_H - _PAD}" stroke="#555"/>',
        f'<text x="{_W / 2}" y="{_H - 10}" text-anchor="middle" font-size="12">'
        "agreement with the reference</text>",
        f'<text x="12" y="{_H / 2}" transform="rotate(-90 12 {_H / 2})" text-anchor="middle" '
        'font-size="12">answers/s</text>',
    ]
    for share in (0.0, 0.5, 1.0):
        marks.append(
            f'<text x="{_x(share):.1f}" y="{_H - _PAD + 16}" text-anchor="middle" '
            f'font-size="11">{share:.0%}</text>'
        )
    for rate in (0.0, top / 1.1):
        marks.append(
            f'<text x="{_PAD - 4}" y="{_y(rate, top) + 4:.1f}" text-anchor="end" font-size="11">'
            f"{_num(rate)}</text>"
        )
    return marks


def _dots(
    points: list[tuple[str, str, float, float]],
    levels: list[str],
    colour: dict[str, str],
    top: float,
) -> list[str]:
    """A dot per setting × level, each setting named once."""
    marks = []
    named: set[str] = set()
    for setting, level, agreement, rate in points:
        x, y = _x(agreement), _y(rate, top)
        # Levels of one setting often fall on one spot: each level's dot smaller than the one
        # before, and translucent, so none hides another; the setting named once.
        radius = max(3, 8 - 2 * levels.index(level))
        title = f"{setting} {level}: {pct(agreement)} agree, {rate:.2f} answers/s"
        marks.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{radius}" '
            f'fill="{colour[level]}" fill-opacity="0.75"><title>{_e(title)}</title></circle>'
        )
        if setting not in named:
            named.add(setting)
            marks.append(
                f'<text x="{x - 10:.1f}" y="{y - 10:.1f}" text-anchor="end" '
                f'font-size="10">{_e(setting)}</text>'
            )
    return marks


def _matrix(rows: dict[str, dict[str, CellSummary]], levels: list[str]) -> str:
    """sweep.md's matrix, each cell coloured as a run's heatmap colours it."""
    out = [
        "<table id=heatmap><tr><th>setting · probe</th>"
        + "".join(f"<th>{_e(lv)}</th>" for lv in levels)
        + "</tr>"
    ]
    for name, by_level in rows.items():
        out.append(f"<tr><td>{_name(name)}</td>")
        for level in levels:
            cell = by_level.get(level)
            colour = (
                EMPTY
                if cell is None or not cell.ok
                else DRIFT
                if cell.drift
                else SHORT
                if cell.short
                else LATENT
                if cell.latent_drift
                else STABLE
            )
            out.append(
                f'<td class=cell style="background:{colour}">{_e(sweep_cell_text(cell))}</td>'
            )
        out.append("</tr>")
    out.append(
        "</table><p class=legend>cell: distinct outputs (DRIFT when they differ from serial; ~ the "
        "serial text with other logprobs; ≡ logprobs bitwise equal to serial's) · answers per "
        "second · median end-to-end latency · the most requests the server ran at once (its "
        f"/metrics) · <span style='background:{STABLE}'></span>as serial "
        f"<span style='background:{DRIFT}'></span>drift <span style='background:{SHORT}'></span>"
        f"fewer ok samples than asked <span style='background:{LATENT}'></span>latent drift "
        f"<span style='background:{EMPTY}'></span>no ok sample</p>"
    )
    return "".join(out)


def _throughput(rows: dict[str, dict[str, CellSummary]], levels: list[str]) -> str:
    out = [
        "<table><tr><th>setting</th>"
        + "".join(f"<th>{_e(lv)} answered/s</th>" for lv in levels)
        + "</tr>"
    ]
    for name, by_level in rows.items():
        out.append(
            f"<tr><td>{_e(name)}</td>"
            + "".join(
                f"<td>{_num(answered_per_s(by_level[lv]) if lv in by_level else None)}</td>"
                for lv in levels
            )
            + "</tr>"
        )
    return "".join(out) + "</table>"
