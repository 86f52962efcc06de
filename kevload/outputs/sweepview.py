"""What a sweep shows of each setting, as text: a matrix cell (``sweep_cell_text``, read by sweep.md
and the sweep's page) and, with ``--reference``, each setting against its reference setting — the
terminal table (within 80 columns), its Markdown, and accuracy per setting. Pure: sweep.json's
dict in, text out (docs/sweeps.md)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

from kevload.outputs.celltext import attainment_text, cell_text
from kevload.outputs.escaping import markdown_cell, visible
from kevload.records.summary import CellSummary, answered_per_s

WIDTH = 80
# setting 14, level 8, agreement (95 %) 13, latent 6, accuracy 13, g→b/b→g 7, p 6, p50× 5
_HEAD = (
    f"{'setting':<14} {'level':<8} {'agree (95%)':>13} {'latent':>6} {'acc ref→set':>13} "
    f"{'g→b/b→g':>7} {'p':>6} {'p50×':>5}"
)


def sweep_cell_text(cell: CellSummary | None) -> str:
    """What one setting does at one level, text and logprobs, and what it costs:
    ``1 ≡ · 2.1/s · p50 1900 ms``."""
    if cell is None:
        return "-"
    parts = [cell_text(cell) + (" ≡" if cell.logprob_bitwise else "")]
    answered = answered_per_s(cell)
    if answered:
        parts.append(f"{answered:.{2 if answered < 1 else 1}f}/s")
    p50 = cell.latency.get("e2e", {}).get("p50")
    if p50 is not None:
        parts.append(f"p50 {p50 * 1000:.0f} ms")
    if cell.slo_attainment is not None:
        parts.append(attainment_text(cell))
    if cell.server_running_max is not None:
        # The most its reads saw running is only a floor: it is the ceiling where kevload itself
        # held the level to it (closed loop; more is other clients' load) or where the footnote's
        # rule says the batch limit did.
        bounded = cell.server_note or (
            cell.rate is None and cell.server_running_max == cell.concurrency
        )
        parts.append(f"server ran {'≤' if bounded else '≥'} {cell.server_running_max:g}")
    return " · ".join(parts)


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def agreement_text(level: dict[str, Any]) -> str:
    """``90% (60–98)``: the agreement and its Wilson 95 % interval."""
    ci = level.get("agreement_ci95")
    interval = "" if ci is None else f" ({ci[0] * 100:.0f}–{ci[1] * 100:.0f})"
    return pct(level.get("agreement")) + interval


def accuracy_text(level: dict[str, Any]) -> str:
    """``100% → 80%``: the reference's accuracy, then the setting's; ``-`` without graded items."""
    if level.get("accuracy_reference") is None:
        return "-"
    return f"{pct(level['accuracy_reference'])} → {pct(level['accuracy_candidate'])}"


def flips_text(level: dict[str, Any]) -> str:
    return f"{level['good_to_bad']}/{level['bad_to_good']}" if level.get("graded") else "-"


def p_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def ratio_text(level: dict[str, Any]) -> str:
    ratio = level.get("latency_p50_ratio")
    return "-" if ratio is None else f"{ratio:.2f}"


def compared(sweep: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Each setting × level compared with its reference: (setting, its reference, the level)."""
    for row in sweep["rows"]:
        against = row.get("against_reference") or {}
        for level in against.get("levels", []):
            yield row["setting"], against["reference"], level


def accuracy_lines(sweep: dict[str, Any]) -> list[str]:
    """``slots=1 (reference): c=1 100% · c=4 100%``: each graded setting's accuracy per level."""
    out = []
    for row in sweep["rows"]:
        if not row.get("accuracy"):
            continue
        mark = " (reference)" if is_reference(row) else ""
        levels = " · ".join(f"{lv} {pct(share)}" for lv, share in row["accuracy"].items())
        out.append(f"{row['setting']}{mark}: {levels}")
    return out


def is_reference(row: dict[str, Any]) -> bool:
    """Whether a sweep.json row is its own reference setting."""
    against = row.get("against_reference") or {}
    return bool(against.get("reference") == row["setting"])


def _cut(text: str, width: int) -> str:
    text = visible(text).replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


def reference_table(sweep: dict[str, Any]) -> str:
    """The terminal table: a row per setting × level against its reference, accuracy per setting,
    the gate's findings and its exit line; every line at most 80 columns."""
    ref = sweep["reference"]
    lines = [_cut(f"against the reference {ref['axis']}={ref['value']}", WIDTH), _HEAD]
    last = None
    for setting, reference, level in compared(sweep):
        shown = setting
        if len(visible(setting)) > 14:
            # A long setting (several axes) on a line of its own, whole, with its reference: cut,
            # two settings would read alike.
            if setting != last:
                lines += textwrap.wrap(visible(f"{setting} against {reference}:"), WIDTH)
            shown = ""
        last = setting
        lines.append(
            f"{_cut(shown, 14):<14} {_cut(level['level'], 8):<8} "
            f"{agreement_text(level):>13} {level['latent']:>6} {accuracy_text(level):>13} "
            f"{flips_text(level):>7} {p_text(level['mcnemar_p']):>6} {ratio_text(level):>5}"
        )
    accuracy = accuracy_lines(sweep)
    if accuracy:
        lines.append("accuracy per setting:")
        for line in accuracy:
            lines += textwrap.wrap(
                visible(line), WIDTH, initial_indent="  ", subsequent_indent="    "
            )
    for line in ref["findings"]:  # wrapped, not cut: a finding's reason is at its end
        lines += textwrap.wrap(visible(line), WIDTH, subsequent_indent="  ")
    lines.append(f"against the reference: exit {ref['code']}")
    return "\n".join(lines)


def reference_markdown(sweep: dict[str, Any]) -> str:
    """The same as the terminal table, as Markdown, with each setting's reference named."""
    md = markdown_cell
    ref = sweep["reference"]
    lines = [
        f"Against the reference {md(ref['axis'])}={md(str(ref['value']))}:",
        "",
        "| setting | reference | level | items | agreement (95%) | latent "
        "| accuracy ref → setting | good→bad / bad→good | McNemar p | p50 ratio |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for setting, reference, level in compared(sweep):
        lines.append(
            f"| {md(setting)} | {md(reference)} | {md(level['level'])} | {level['items']} "
            f"| {agreement_text(level)} | {level['latent']} | {accuracy_text(level)} "
            f"| {flips_text(level)} | {p_text(level['mcnemar_p'])} | {ratio_text(level)} |"
        )
    lines += ["", *(f"- accuracy {md(line)}" for line in accuracy_lines(sweep))]
    lines += [f"- {md(line)}" for line in ref["findings"]]
    lines.append(f"- against the reference: exit {ref['code']}")
    return "\n".join(lines) + "\n"
