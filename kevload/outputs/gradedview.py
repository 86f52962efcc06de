"""Graded answers as reports show them (kevload.compare.graded's figures): the per-level accuracy
table, each graded cell's line (flips with one flipped answer beside the serial one, drift whose
answers all stay good), the gates' lines.

A run of many probes (a dataset) shows the accuracy table instead of its matrix: hundreds of rows
say less than one per level; the per-probe detail stays in summary.json and the HTML report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.table import Table

from kevload.compare.graded import level_name
from kevload.outputs.escaping import visible
from kevload.records.summary import CellSummary, RunSummary, label_of

# graded probes past which the terminal shows the accuracy table instead of the matrix
MATRIX_ROWS = 20
_LISTED = 5  # cells a many-probe run lists by name under a finding (the rest are counted)
ACCURACY_COLUMNS = ("level", "n", "accuracy [95% CI]", "good→bad", "bad→good", "McNemar p")


def graded(summary: RunSummary) -> bool:
    return summary.accuracy is not None


def aggregate_only(summary: RunSummary) -> bool:
    """Whether the terminal shows the accuracy table instead of the probe × level matrix."""
    return graded(summary) and len({(c.probe, c.mode) for c in summary.probe_cells()}) > MATRIX_ROWS


def cell_mark(cell: CellSummary | None) -> str:
    """The matrix cell's graded mark: `` ✗3`` for 3 answers load turned bad, `` ✓`` for drift whose
    answers all stay good, `` ↑2`` for 2 turned good; empty for an ungraded cell or one with nothing
    to say."""
    if cell is None or cell.graded_good is None:
        return ""
    if cell.flips_good_to_bad:
        return f" ✗{cell.flips_good_to_bad}"
    if cell.flips_bad_to_good:
        return f" ↑{cell.flips_bad_to_good}"
    if cell.drift and cell.graded_good and not cell.graded_bad and not cell.grade_failed:
        return " ✓"
    return ""


def accuracy_rows(summary: RunSummary) -> list[list[str]]:
    rows = []
    for entry in summary.accuracy or ():
        low, high = entry["ci95"]
        accuracy = (
            "-"
            if entry["accuracy"] is None
            else f"{entry['accuracy']:.1%} [{low * 100:.1f}, {high * 100:.1f}]"
        )
        serial = entry["mcnemar_p"] is None
        rows.append(
            [
                level_name(entry),
                str(entry["n"]),
                f"{entry['good']} good, {accuracy}",
                "serial" if serial else str(entry["good_to_bad"]),
                "" if serial else str(entry["bad_to_good"]),
                ""
                if serial
                else f"{entry['mcnemar_p']:.3g}" + (" (fell)" if entry["fell"] else ""),
            ]
        )
    return rows


def level_text(entry: Mapping[str, Any]) -> str:
    """One level of ``accuracy`` in a line (JUnit, the demo): accuracy with its interval, then
    against serial."""
    low, high = entry["ci95"]
    accuracy = (
        "-" if entry["accuracy"] is None else f"{entry['accuracy']:.1%} [{low:.1%}, {high:.1%}]"
    )
    text = f"{level_name(entry)}: accuracy {accuracy} ({entry['good']} of {entry['n']} probes good)"
    if entry["mcnemar_p"] is None:
        return text + "; the serial level, the reference"
    return (
        text + f"; against serial over {entry['paired']} paired probes: {entry['good_to_bad']} "
        f"good→bad, "
        f"{entry['bad_to_good']} bad→good, McNemar p {entry['mcnemar_p']:.3g}"
        + (" (fell significantly)" if entry["fell"] else "")
    )


# The terminal's table fits a CI log's 80 columns in one piece, its title too, for levels as wide as
# they come (a rate, four-digit counts, a p of 1e-105 that fell): the good count goes with n, a
# trailing .0 goes from the interval, "fell" is a mark (↓), and the box has no sides. Markdown and
# HTML keep the long forms.
TERMINAL_COLUMNS = ("level", "good/n", "accuracy [95% CI]", "good→bad", "bad→good", "p")
TERMINAL_TITLE = "graded answers per level: a probe is good where every answer is; ↓: fell"


def accuracy_table(summary: RunSummary) -> Table:
    grid = Table(
        title=TERMINAL_TITLE,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
        min_width=len(TERMINAL_TITLE),  # rich wraps a title to its table's width
    )
    for name in TERMINAL_COLUMNS:
        grid.add_column(name, justify="left" if name == "level" else "right", no_wrap=True)
    for entry in summary.accuracy or ():
        serial = entry["mcnemar_p"] is None
        grid.add_row(
            level_name(entry),
            f"{entry['good']}/{entry['n']}",
            "-" if entry["accuracy"] is None else _short_accuracy(entry),
            "serial" if serial else str(entry["good_to_bad"]),
            "" if serial else str(entry["bad_to_good"]),
            "" if serial else f"{entry['mcnemar_p']:.2g}" + (" ↓" if entry["fell"] else ""),
        )
    return grid


def _short_accuracy(entry: Mapping[str, Any]) -> str:
    low, high = (f"{x * 100:.1f}".removesuffix(".0") for x in entry["ci95"])
    return f"{entry['accuracy']:.1%} [{low}, {high}]"


def accuracy_markdown(summary: RunSummary) -> list[str]:
    if not graded(summary):
        return []
    rule = "| --- | " + " | ".join("---:" for _ in ACCURACY_COLUMNS[1:]) + " |"
    return [
        "",
        "| " + " | ".join(ACCURACY_COLUMNS) + " |",
        rule,
        *("| " + " | ".join(row) + " |" for row in accuracy_rows(summary)),
    ]


def cell_line(cell: CellSummary) -> str | None:
    """What a graded cell says beyond its counts, or None when it says nothing new (every answer
    good, no drift)."""
    if cell.graded_good is None:
        return None
    counts = f"{cell.graded_good} good, {cell.graded_bad} bad" + (
        f", {cell.grade_failed} not graded (grader failed)" if cell.grade_failed else ""
    )
    if cell.flips_good_to_bad or cell.flips_bad_to_good:
        way = "good→bad" if cell.flips_good_to_bad else "bad→good"
        n = cell.flips_good_to_bad or cell.flips_bad_to_good
        return (
            f"{cell.label}: {n} {way} against a serial level whose answers were all "
            f"{'good' if cell.flips_good_to_bad else 'bad'} ({counts}); e.g. "
            f"{_quote(cell.flip_answer)} "
            f"where serial answered {_quote(cell.flip_serial_answer)}"
        )
    if cell.serial_grade == "mixed" and cell.reference_level != cell.level:
        return f"{cell.label}: {counts}; serial answers mixed good and bad, so no flip is counted"
    if cell.serial_grade == "mixed":
        return f"{cell.label}: serial answers mixed: {counts}"
    if cell.drift and cell.graded_good and not cell.graded_bad and not cell.grade_failed:
        return f"{cell.label}: drift, every answer still good ({counts})"
    if cell.drift:
        return (
            f"{cell.label}: drift, answers as {cell.serial_grade or 'ungraded'} as serial "
            f"({counts})"
        )
    return None


def cell_figures(cell: CellSummary) -> str | None:
    """A graded cell's figures in one line (JUnit, HTML): its good and bad answers with the good
    share and its interval, and against serial the flips (or why none are counted), with one flipped
    answer beside the serial one; None for an ungraded cell."""
    if cell.graded_good is None:
        return None
    text = f"graded {cell.graded_good} good, {cell.graded_bad} bad" + (
        f", {cell.grade_failed} not graded (grader failed)" if cell.grade_failed else ""
    )
    if cell.good_share is not None and cell.good_share_ci95:
        low, high = cell.good_share_ci95
        text += f", good share {cell.good_share:.1%} [{low:.1%}, {high:.1%}]"
    if cell.level == cell.reference_level:
        return text + f"; the serial reference (answers {cell.serial_grade or 'not graded'})"
    if cell.flips_good_to_bad is None:
        why = "mixed good and bad" if cell.serial_grade == "mixed" else "not graded"
        return text + f"; serial answers {why}, so no flip is counted"
    text += (
        f"; against serial (all {cell.serial_grade}): {cell.flips_good_to_bad} good→bad, "
        f"{cell.flips_bad_to_good} bad→good"
    )
    if cell.flip_answer is not None:
        text += (
            f"; e.g. {_quote(cell.flip_answer)} "
            f"where serial answered {_quote(cell.flip_serial_answer)}"
        )
    return text


def _quote(text: str | None) -> str:
    """A server's answer quoted in a line: on one line, cut to 80 characters, its control characters
    spelled as every output spells them (``escaping.visible``), whatever output the line goes to."""
    text = (text or "").replace("\n", "⏎")
    return f"'{visible(text if len(text) <= 80 else text[:79] + '…')}'"


def lines(summary: RunSummary) -> list[str]:
    """The graded lines under the tables: each cell's (a many-probe run: counts and a few names),
    then the gates."""
    if not graded(summary):
        return []
    cells = [c for c in summary.probe_cells() if c.graded_good is not None]
    out = []
    if aggregate_only(summary):
        stayed = [c.name for c in cells if cell_mark(c) == " ✓"]
        out += turned_bad_lines(summary)
        if stayed:
            out.append(f"{len(stayed)} probe cells drifted with every answer still good")
    else:
        out += [line for c in cells if (line := cell_line(c)) is not None]
    return out + gate_lines(summary)


def turned_bad_lines(summary: RunSummary) -> list[str]:
    """The probe cells where load turned a good serial answer bad, in one line (none without any):
    what ``--fail-on bad`` fails on beside ``gate_lines``."""
    flipped = summary.bad_cells or ()
    return (
        [f"{len(flipped)} probe cells with answers load turned bad: {_names(flipped)}"]
        if flipped
        else []
    )


def gate_lines(summary: RunSummary) -> list[str]:
    """The graded reasons a run fails, one line each: accuracy that fell significantly, answers the
    warm prefix cache turned bad, cells under load.min_good_share, a python grader that failed."""
    out = []
    if summary.warm_bad_probes:
        turned = sum(
            c.get("warm_good_to_bad") or 0 for c in (summary.prefix_cache or {}).get("probes", ())
        )
        out.append(
            f"the warm cache turned {turned} answers bad (against their rounds' cold answers): "
            f"{_names(summary.warm_bad_probes)}"
        )
    if summary.accuracy_fell_levels:
        out.append(
            "accuracy fell significantly (McNemar p < 0.05) at "
            + ", ".join(summary.accuracy_fell_levels)
        )
    if summary.good_share_failed_cells:
        out.append(
            f"under load.min_good_share {summary.min_good_share:.1%}: "
            f"{_names(summary.good_share_failed_cells)}"
        )
    return out + [f"grader failed: {error}" for error in summary.grade_errors or ()]


def _names(names: tuple[str, ...] | list[str]) -> str:
    shown = ", ".join(label_of(n) for n in names[:_LISTED])
    return shown + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")
