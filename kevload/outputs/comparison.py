"""What a comparison of servers shows (``kevload compare``, ``kevload report`` on its directory):
the terminal table (candidate × level, within 80 columns) with a few items that parted, Markdown,
JUnit (a testcase per candidate × level) and OpenMetrics text; ``compare.json`` itself is
``Comparison.to_json``."""

from __future__ import annotations

import html
from collections.abc import Iterator

from rich.cells import cell_len, chop_cells, set_cell_size

from kevload.compare.gate import GateResult
from kevload.compare.rollout import CandidateComparison, Comparison, LevelComparison
from kevload.outputs.escaping import markdown_cell, visible, xml_text
from kevload.outputs.metrics import escape_label, format_value

WIDTH = 80
_HEAD = f"{'candidate':<13} {'level':<10} {'items':>5} {'agree':>6} {'accuracy ref→cand':>17} "
_HEAD += f"{'g→b/b→g':>8} {'p':>7} {'p50×':>6}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def _ratio(level: LevelComparison) -> str:
    ratio = level.latency.get("latency_p50_ratio")
    return "-" if ratio is None else f"{ratio:.2f}"


def _latent(level: LevelComparison) -> str:
    """``2 of 17``: latent items among those with the reference's text whose logprobs both sides
    sent."""
    return f"{level.latent} of {level.latent_checked}"


def _unchecked(comparison: Comparison) -> Iterator[str]:
    """Per candidate, how many items with the reference's text could not be told latent or not: a
    side sent no logprobs, so ``identical`` there is of the text alone."""
    for candidate in comparison.candidates:
        same = sum(lv.classes["identical"] + lv.latent for lv in candidate.levels)
        unchecked = same - sum(lv.latent_checked for lv in candidate.levels)
        if unchecked:
            yield (
                f"{candidate.name}: {unchecked} of {same} item-levels with the reference's text "
                "not checked for latent drift (no logprobs from a side)"
            )


def _level(level: LevelComparison) -> str:
    """``c=4``; ``mixed/c=4`` in another mode than single."""
    return level.label if level.mode == "single" else f"{level.mode}/{level.label}"


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` terminal columns, counted as a terminal shows them: a wide
    character (CJK, most emoji) takes two, so a name's characters are no measure of its width."""
    text = visible(text).replace("\n", "⏎")
    return text if cell_len(text) <= width else set_cell_size(text, width - 1) + "…"


def _column(text: str, width: int) -> str:
    """``text`` cut to and padded out to exactly ``width`` columns: a table column."""
    return set_cell_size(_cut(text, width), width)


def _wrapped(text: str) -> list[str]:
    """A finding in lines of at most ``WIDTH`` columns, broken between words (a word wider than a
    line inside it), the later lines indented; wrapped, not cut: its reason is at its end."""
    lines: list[str] = []
    line = ""
    for word in visible(text).split():
        for piece in chop_cells(word, WIDTH - 2):
            joined = f"{line} {piece}" if line.strip() else line + piece
            if line.strip() and cell_len(joined) > WIDTH:
                lines.append(line)
                joined = "  " + piece
            line = joined
    return [*lines, line] if line else lines


def _rows(comparison: Comparison) -> Iterator[tuple[CandidateComparison, LevelComparison]]:
    for candidate in comparison.candidates:
        for level in candidate.levels:
            yield candidate, level


def table(comparison: Comparison, result: GateResult | None = None) -> str:
    """The terminal table: a row per candidate × level, then the items that parted (a few each), the
    notes and the gate's findings; every line at most 80 columns."""
    lines = [_cut(f"reference: {comparison.reference}", WIDTH), _HEAD]
    for candidate, level in _rows(comparison):
        accuracy = (
            "-"
            if level.accuracy_reference is None
            else f"{_pct(level.accuracy_reference)} → {_pct(level.accuracy_candidate)}"
        )
        flips = f"{level.good_to_bad}/{level.bad_to_good}" if level.graded else "-"
        lines.append(
            f"{_column(candidate.name, 13)} {_column(_level(level), 10)} {level.items:>5} "
            f"{_pct(level.agreement):>6} {accuracy:>17} {flips:>8} {_p(level.mcnemar_p):>7} "
            f"{_ratio(level):>6}"
        )
    for candidate, level in _rows(comparison):
        for example in level.examples:
            where = (
                f"{candidate.name} {level.label} {example.item} {example.kind} at {example.at_char}"
            )
            lines.append(_cut(f"  {where}:", WIDTH))
            lines.append(_cut(f"    ref  {example.reference!r}", WIDTH))
            lines.append(_cut(f"    cand {example.candidate!r}", WIDTH))
    for note in [*comparison.notes, *_unchecked(comparison)]:
        lines += _wrapped(f"note: {note}")
    if result is not None:
        for line in result.lines:
            lines += _wrapped(line)
        lines.append(f"gate: exit {int(result.code)}")
    return "\n".join(lines)


def markdown(comparison: Comparison, result: GateResult | None = None) -> str:
    """The same as the table, as Markdown, with latent items and every class count."""
    out = [
        f"# Compared with {markdown_cell(comparison.reference)}",
        "",
        "| candidate | level | items | agreement (95%) | latent (of checked) | accuracy ref → cand "
        "| good→bad / bad→good | McNemar p | p50 ratio (95%) |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for candidate, level in _rows(comparison):
        none: list[float | None] = [None, None]
        ci = level.agreement_ci95 or none
        lat = level.latency.get("latency_p50_ratio_ci95") or none
        accuracy = (
            "-"
            if level.accuracy_reference is None
            else f"{_pct(level.accuracy_reference)} → {_pct(level.accuracy_candidate)}"
        )
        out.append(
            f"| {markdown_cell(candidate.name)} | {level.mode}/{level.label} | {level.items} "
            f"| {_pct(level.agreement)} ({_pct(ci[0])}–{_pct(ci[1])}) | {_latent(level)} "
            f"| {accuracy} | {level.good_to_bad} / {level.bad_to_good} | {_p(level.mcnemar_p)} "
            f"| {_ratio(level)} ({_p(lat[0])}–{_p(lat[1])}) |"
        )
    parted = [
        f"- {markdown_cell(c.name)} {lv.label} `{markdown_cell(e.item)}` {e.kind} at char "
        f"{e.at_char}: {markdown_cell(repr(e.reference))} → {markdown_cell(repr(e.candidate))}"
        for c, lv in _rows(comparison)
        for e in lv.examples
    ]
    if parted:
        out += ["", "Items that parted:", "", *parted]
    notes = [*comparison.notes, *_unchecked(comparison)]
    out += ["", *(f"- note: {markdown_cell(n)}" for n in notes)]
    if result is not None:
        out += [f"- {markdown_cell(line)}" for line in result.lines]
        out.append(f"- gate: exit {int(result.code)}")
    return "\n".join(out).rstrip() + "\n"


def junit_xml(comparison: Comparison, result: GateResult, suite: str = "kevload-compare") -> str:
    """JUnit XML: one testcase per candidate × level, failing with the gate's findings there (a
    candidate's run that did not end complete fails each of its levels)."""
    from xml.etree import ElementTree as ET

    cases = []
    for candidate, level in _rows(comparison):
        where = f"{candidate.name} {level.mode}/{level.label}:"
        found = [
            line
            for line in result.lines
            if line.startswith(where) or line.startswith(f"{candidate.name}: ")
        ]
        cases.append((candidate.name, f"{level.mode}/{level.label}", found))
    failures = sum(1 for *_, found in cases if found)
    root = ET.Element("testsuites", name=suite, tests=str(len(cases)), failures=str(failures))
    group = ET.SubElement(
        root, "testsuite", name=xml_text(comparison.reference), tests=str(len(cases))
    )
    group.set("failures", str(failures))
    for name, label, found in cases:
        case = ET.SubElement(
            group, "testcase", classname=xml_text(f"{suite}.{name}"), name=xml_text(label)
        )
        if found:
            failure = ET.SubElement(case, "failure", message=xml_text(found[0]))
            failure.text = xml_text("\n".join(found))
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


_METRICS = (
    (
        "agreement",
        "kevload_compare_agreement_ratio",
        "Share of items whose answers have the reference's text.",
    ),
    (
        "latent",
        "kevload_compare_latent_items",
        "Items with the reference's text and other logprobs.",
    ),
    (
        "good_to_bad",
        "kevload_compare_good_to_bad_items",
        "Graded items good on the reference, bad here.",
    ),
    (
        "bad_to_good",
        "kevload_compare_bad_to_good_items",
        "Graded items bad on the reference, good here.",
    ),
    ("mcnemar_p", "kevload_compare_mcnemar_p", "Exact McNemar p of good→bad against bad→good."),
    ("accuracy_reference", "kevload_compare_accuracy_reference_ratio", "The reference's accuracy."),
    ("accuracy_candidate", "kevload_compare_accuracy_candidate_ratio", "The candidate's accuracy."),
    (
        "latency_p50_ratio",
        "kevload_compare_latency_p50_ratio",
        "p50 e2e latency, candidate/reference.",
    ),
)


def metrics_text(comparison: Comparison) -> str:
    """OpenMetrics text (gauges; ``# EOF`` ends it): each figure per candidate × level."""
    lines = []
    for key, name, help_text in _METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for candidate, level in _rows(comparison):
            value = level.to_json().get(key)
            if value is None:
                continue
            labels = {
                "reference": comparison.reference,
                "candidate": candidate.name,
                "mode": level.mode,
                "level": level.label,
            }
            shown = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{shown}}} {format_value(value)}")
    return "\n".join([*lines, "# EOF"]) + "\n"


_CSS = (
    "body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#212121;max-width:1200px}"
    "table{border-collapse:collapse;margin:8px 0}td,th{padding:6px 10px;border:1px solid #ddd}"
    "pre{background:#f7f7f7;padding:8px;margin:0;white-space:pre-wrap;font-size:12px}"
    "mark{background:#ffcdd2}.fail{border-left:4px solid #c62828;padding-left:8px}"
)


def _h(value: object) -> str:
    """Server- or user-derived text as HTML: markup and quotes escaped, control characters
    spelled."""
    return html.escape(visible("" if value is None else str(value)))


def _marked(text: str, at: int) -> str:
    """A window of an answer with everything from where it parts marked."""
    return f"<pre>{_h(text[:at])}<mark>{_h(text[at:])}</mark></pre>"


def html_page(comparison: Comparison, result: GateResult) -> str:
    """One self-contained page: the table, then each item that parted, reference and candidate side
    by side with the first divergence marked, then the gate's findings."""
    rows = "".join(
        f"<tr><td>{_h(c.name)}</td><td>{_h(_level(lv))}</td><td>{lv.items}</td>"
        f"<td>{_pct(lv.agreement)}</td><td>{_latent(lv)}</td>"
        f"<td>{_pct(lv.accuracy_reference)} → {_pct(lv.accuracy_candidate)}</td>"
        f"<td>{lv.good_to_bad} / {lv.bad_to_good}</td><td>{_p(lv.mcnemar_p)}</td>"
        f"<td>{_ratio(lv)}</td></tr>"
        for c, lv in _rows(comparison)
    )
    parted = "".join(
        f"<h3>{_h(c.name)} {_h(_level(lv))}: {_h(e.item)} ({_h(e.kind)}, at char {e.at_char})</h3>"
        f"<table><tr><th>{_h(comparison.reference)}</th><th>{_h(c.name)}</th></tr><tr>"
        f"<td>{_marked(e.reference, e.at_char - e.offset)}</td>"
        f"<td>{_marked(e.candidate, e.at_char - e.offset)}</td></tr></table>"
        for c, lv in _rows(comparison)
        for e in lv.examples
    )
    findings = "".join(f"<p class=fail>{_h(line)}</p>" for line in result.lines)
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>compared with "
        f"{_h(comparison.reference)}</title><style>{_CSS}</style></head><body>"
        f"<h1>Compared with {_h(comparison.reference)}</h1><table><tr><th>candidate</th>"
        "<th>level</th><th>items</th><th>agreement</th><th>latent (of checked)</th>"
        "<th>accuracy ref → cand</th>"
        f"<th>good→bad / bad→good</th><th>McNemar p</th><th>p50 ratio</th></tr>{rows}</table>"
        f"<h2>Items that parted</h2>{parted or '<p>None.</p>'}"
        f"<h2>Gate: exit {int(result.code)}</h2>{findings}"
        + "".join(f"<p>note: {_h(n)}</p>" for n in [*comparison.notes, *_unchecked(comparison)])
        + "</body></html>\n"
    )
