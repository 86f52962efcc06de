"""Rendering only: summaries as terminal tables, Markdown and JSON."""

from __future__ import annotations

from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from kevload.compare import level_label, level_sort_key, levels_of

FORMATS = ("table", "json", "markdown", "html")


def render(summary: dict[str, Any], fmt: str, console: Console | None = None) -> str | None:
    """Markdown and JSON come back as text; the table is printed to ``console``."""
    if fmt == "json":
        return orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    if fmt == "markdown":
        return markdown(summary)
    console = console or Console()
    console.print(table(summary))
    console.print(latency_table(summary))
    console.print(verdict_line(summary))
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
            style = "red" if cell and cell["drift"] else "green" if cell and cell["ok"] else "yellow"
            texts.append(f"[{style}]{text}[/{style}]")
        top = max(row.values(), key=level_sort_key)
        p50 = top.get("latency", {}).get("e2e", {}).get("p50")
        errors = sum(sum(c["errors"].values()) for c in row.values())
        grid.add_row(f"{probe} ({mode})", *texts, str(min(c["ok"] for c in row.values())),
                     f"{p50 * 1000:.0f} ms" if p50 is not None else "-", str(errors))
    return grid


def latency_table(summary: dict[str, Any]) -> Table:
    """Latency and throughput per probe × level, in milliseconds: the "is it fast" half of a run."""
    grid = Table(title="latency (ms, p50 / p99) and throughput", title_justify="left")
    for name in ("probe (mode)", "level", "n", "ttft", "itl", "tpot", "e2e", "tok/s", "req/s", "late p99"):
        grid.add_column(name, justify="left" if name.startswith("probe") else "right")
    for c in sorted(_probe_cells(summary), key=lambda c: (c["probe"], c["mode"], level_sort_key(c))):
        lat = c.get("latency", {})
        late = lat.get("lateness", {}).get("p99")
        grid.add_row(f"{c['probe']} ({c['mode']})", level_label(c), str(c["ok"]),
                     *(_p50_p99(lat.get(k)) for k in ("ttft", "itl", "tpot", "e2e")),
                     _fmt(c.get("output_tokens_per_s")), _fmt(c.get("requests_per_s")),
                     f"{late * 1000:.2f}" if late is not None else "-")
    return grid


def _p50_p99(stats: dict[str, float] | None) -> str:
    if not stats or not stats.get("n"):
        return "-"
    return f"{stats['p50'] * 1000:.0f} / {stats['p99'] * 1000:.0f}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


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
        parts.append(f"{c['probe']} ({c['mode']}) {level_label(c)}: {c['distinct']} distinct in {c['ok']}, {where}")
    return "nondeterministic: " + "; ".join(parts)


def markdown(summary: dict[str, Any]) -> str:
    cells = _probe_cells(summary)
    levels = levels_of(cells)
    lines = ["| probe (mode) | " + " | ".join(levels) + " | n/cell |",
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
        rows.setdefault((c["probe"], c["mode"]), {})[level_label(c)] = c
    return rows



def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items()) or "none"


def diagnosis_text(diagnosis: dict[str, Any]) -> str:
    """The diagnosis as a person reads it: each step's evidence, the findings, the verdict and what to try next."""
    lines = []
    for step in diagnosis["steps"]:
        if "distinct" not in step:
            lines.append(f"  {step['title']}: {'outside' if step.get('outside') else 'inside'} "
                         f"({'; '.join(step.get('reasons', [])) or 'no boundary signs'})")
            continue
        bound = f", drift < {step['drift_rate_upper_95']:.0%} (95%)" if step.get("drift_rate_upper_95") else ""
        errors = f", errors {_counts(step['errors'])}" if step["errors"] else ""
        drift = f", drift at {', '.join(step['drift_cells'])}" if step["drift_cells"] else ""
        lines.append(f"  {step['title']}: {step['distinct']} distinct, n={step['ok']}{bound}{errors}{drift}")
    findings = ", ".join(f"{k}={_tri(v)}" for k, v in diagnosis["findings"].items())
    dropped = diagnosis.get("dropped_fields") or []
    lines.append(f"  findings: {findings}")
    if dropped:
        lines.append(f"  fields the server rejected (dropped): {', '.join(dropped)}")
    lines.extend(f"  note: {note}" for note in diagnosis.get("notes", []))
    lines.append(f"verdict: {diagnosis['verdict']} — {diagnosis['reason']}")
    if diagnosis["verdict"] == "stable":
        lines.append(f"evidence: {_EVIDENCE.get(diagnosis.get('evidence', 'text'), diagnosis.get('evidence'))}")
    for cause in diagnosis.get("causes", [])[1:]:
        lines.append(f"also found: {cause['verdict']} — {cause['reason']}")
    lines.append(f"next: {diagnosis['next']}")
    return "\n".join(lines)


# What a stable verdict rests on, in words.
_EVIDENCE = {"text": "output text compared (hashes), not logprobs",
             "logprobs_bitwise": "per-token logprobs bitwise equal, as well as the text"}


def _tri(value: Any) -> str:
    return {True: "yes", False: "no", None: "unknown"}.get(value, str(value))


def coverage_text(result: dict[str, Any]) -> str:
    on, tr = result["online"], result["train"]
    lines = [f"{'':24}{'online':>12}{'train':>12}", f"{'count':24}{on['count']:>12}{tr['count']:>12}"]
    for name, side in (("online", on), ("train", tr)):
        skipped = side["skipped_lines"]
        if skipped["count"]:
            lines.append(f"{name}: {skipped['count']} bad line(s) skipped; the first, {skipped['first']}: "
                         f"{skipped['first_reason']}")
    for key in ("min", "p50", "p90", "p99", "max"):
        lines.append(f"{'length ' + key:24}{_num(on['length'][key]):>12}{_num(tr['length'][key]):>12}")
    share = result["outside_length_range_share"]
    lines.append(f"online outside training length range: {share:.1%}" if share is not None else "")
    lines.append("keywords: " + ("jieba word segmentation" if result["segmenter"] == "jieba" else
                                 "CJK character bigrams (install kevload[zh] for jieba words)"))
    lines.append("top keywords online: " + ", ".join(k["keyword"] for k in on["top_keywords"][:10]))
    lines.append("top keywords train:  " + ", ".join(k["keyword"] for k in tr["top_keywords"][:10]))
    rare = result["online_keywords_rare_in_train"]
    lines.append("frequent online, rare or missing in training: " + (", ".join(
        f"{r['keyword']} ({r['online_share']:.0%} vs {r['train_share']:.0%})" for r in rare[:10]) or "none"))
    labels = result["labels"]
    if labels["psi"] is not None:
        lines.append(f"labels: PSI {labels['psi']:.3f}, Jensen-Shannon {labels['js_divergence']:.3f}; online "
                     + ", ".join(f"{k} {v:.0%}" for k, v in labels["online"].items()) + "; train "
                     + ", ".join(f"{k} {v:.0%}" for k, v in labels["train"].items()))
    if "flagged" in result:
        lines.append(f"boundary samples flagged: {result['flagged']} of {on['count']}")
    lines.append("(statistics are clues, not proof)")
    return "\n".join(line for line in lines if line)


def _num(value: Any) -> str:
    return "-" if value is None else str(value)


def junit_xml(summary: dict[str, Any], suite: str = "kevload") -> str:
    """JUnit XML, one testcase per probe × level; drift or no ok sample is a failure."""
    from xml.etree import ElementTree as ET

    cells = _probe_cells(summary)
    failures = sum(1 for c in cells if c["drift"] or c["ok"] == 0)
    seconds = sum(c.get("duration_s") or 0 for c in cells)
    root = ET.Element("testsuites", name=suite, tests=str(len(cells)), failures=str(failures), errors="0",
                      time=f"{seconds:.3f}")
    group = ET.SubElement(root, "testsuite", name=summary.get("scenario") or suite, tests=str(len(cells)),
                          failures=str(failures), errors="0", skipped="0", time=f"{seconds:.3f}")
    for c in cells:
        case = ET.SubElement(group, "testcase", classname=f"{suite}.{c['probe']}.{c['mode']}",
                             name=level_label(c), time=f"{c.get('duration_s') or 0:.3f}")
        if c["ok"] == 0:
            ET.SubElement(case, "failure", message="no ok sample", type="target_failed").text = (
                f"errors: {_counts(c['errors'])}")
        elif c["drift"]:
            text = (f"{c['distinct']} distinct outputs in {c['ok']} samples; first divergence at char "
                    f"{c['first_divergence_chars']}, token {c['first_divergence_tokens']}; "
                    f"{c['divergent_requests']} requests differ from the serial output")
            ET.SubElement(case, "failure", message=f"{c['distinct']} distinct outputs in {c['ok']}",
                          type="nondeterminism").text = text
        else:
            ET.SubElement(case, "system-out").text = (
                f"1 output in {c['ok']} samples; drift rate < {c['drift_rate_upper_95']:.2%} at 95% confidence")
    return ET.tostring(root, encoding="unicode", xml_declaration=True)
