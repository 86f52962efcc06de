"""A run as JUnit XML: a testcase per probe × level, per graded level and per graded prefix-cache
probe, failing by the gate the exit code applies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from xml.etree import ElementTree as ET

from kevload.compare.graded import level_name
from kevload.outputs import gradedview
from kevload.outputs.celltext import (
    cell_phrase,
    counts_text,
    kinds_text,
    latent_text,
    logprob_gap_text,
    logprob_text,
    short_text,
    slo_bounds_text,
    slo_cell_text,
)
from kevload.outputs.escaping import xml_text
from kevload.outputs.verdict import missing_texts
from kevload.records.summary import CellSummary, RunSummary, name_parts, position_label

# A failure as JUnit states it: its type, its message, its text.
Failure = tuple[str, str, str]


def junit_xml(summary: RunSummary, suite: str = "kevload", fail_on: str = "drift") -> str:
    """JUnit XML, one testcase per probe × level; drift, no ok sample, a short cell or one under
    ``load.min_slo_attainment`` or ``load.min_good_share`` is a failure, and with
    ``fail_on="latent"`` latent drift too, and a cell whose logprobs cover only some of its samples
    (otherwise both are said in the case's output). With ``fail_on="bad"`` drift fails only where
    load turned an answer bad (``flips_good_to_bad``), as the exit code does. A graded run adds one
    testcase per level for its accuracy, failing where it fell significantly, and under
    load.prefix_cache one per graded probe (``prefix_cache``), failing where the warm cache turned
    answers bad."""
    cases = [
        *(_cell_case(c, summary, suite, fail_on) for c in summary.probe_cells()),
        *(_accuracy_case(entry, suite) for entry in summary.accuracy or ()),
        *(_warm_case(c, suite) for c in _warm_probes(summary)),
        *_missing_cases(summary, suite),
    ]
    failures = sum(1 for case in cases if case.find("failure") is not None)
    seconds = sum(c.duration_s or 0 for c in summary.probe_cells())
    tests, failed = str(len(cases)), str(failures)
    root = ET.Element(
        "testsuites", name=suite, tests=tests, failures=failed, errors="0", time=f"{seconds:.3f}"
    )
    group = ET.SubElement(
        root,
        "testsuite",
        name=summary.scenario or suite,
        tests=tests,
        failures=failed,
        errors="0",
        skipped="0",
        time=f"{seconds:.3f}",
    )
    group.extend(cases)
    # ElementTree escapes < & and quotes but writes control characters as they are: a file no XML
    # parser reads.
    for element in root.iter():
        element.attrib = {name: xml_text(value) for name, value in element.attrib.items()}
        if element.text:
            element.text = xml_text(element.text)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def _case(
    classname: str, name: str, seconds: float, failure: Failure | None, out: str
) -> ET.Element:
    """A testcase: failing with ``failure``, or passing with ``out`` as what it says."""
    case = ET.Element("testcase", classname=classname, name=name, time=f"{seconds:.3f}")
    if failure is not None:
        kind, message, text = failure
        ET.SubElement(case, "failure", message=message, type=kind).text = text
    else:
        ET.SubElement(case, "system-out").text = out
    return case


def _cell_case(c: CellSummary, summary: RunSummary, suite: str, fail_on: str) -> ET.Element:
    """A probe cell's testcase."""
    failure = _junit_failure(c, summary, fail_on)
    out = "" if failure is not None else _passed_text(c)
    return _case(f"{suite}.{c.probe}.{c.mode}", c.level, c.duration_s or 0, failure, out)


def _passed_text(c: CellSummary) -> str:
    """What a passing probe cell says: its outputs, latent drift, SLO attainment and graded
    figures."""
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
    return head + latent + within + (f"; {graded}" if graded else "")


def _accuracy_case(entry: dict[str, Any], suite: str) -> ET.Element:
    """A graded level's accuracy: failing where it fell significantly against serial."""
    text = gradedview.level_text(entry)
    failure = (
        (
            "accuracy_fell",
            f"accuracy fell against serial (McNemar p {entry['mcnemar_p']:.3g})",
            text,
        )
        if entry["fell"]
        else None
    )
    name = level_name(entry).partition("/")[2]
    return _case(f"{suite}.accuracy.{entry['mode']}", name, 0, failure, text)


def _warm_probes(summary: RunSummary) -> list[dict[str, Any]]:
    """load.prefix_cache's graded probes: each a case, failing where the warm cache turned answers
    bad."""
    return [
        c
        for c in (summary.prefix_cache or {}).get("probes", ())
        if c.get("warm_good_to_bad") is not None
    ]


def _warm_case(c: dict[str, Any], suite: str) -> ET.Element:
    text = (
        f"the warm cache turned {c['warm_good_to_bad']} answers bad, {c['warm_bad_to_good']} "
        f"good, over {c['rounds']} rounds (each warm answer against its round's cold one)"
    )
    failure = ("warm_bad", text, text) if c["warm_good_to_bad"] else None
    return _case(f"{suite}.prefix_cache", c["probe"], 0, failure, text)


def _missing_cases(summary: RunSummary, suite: str) -> list[ET.Element]:
    """A failing case for each probe cell asked for that has no counted sample."""
    cases = []
    for name, text in zip(summary.missing_cells or (), missing_texts(summary), strict=True):
        probe, mode, level = name_parts(name)
        failure = ("inconclusive", "no counted sample", text)
        cases.append(_case(f"{suite}.{probe}.{mode}", level, 0, failure, ""))
    return cases


@dataclass(frozen=True)
class _Gates:
    """What a failing cell's text adds whatever the failure, each ``; …`` or empty: its graded
    figures, the SLO's minimum attainment and load.min_good_share where the cell is under them."""

    graded: str
    slo: str
    share: str


def _gates(c: CellSummary, summary: RunSummary) -> _Gates:
    graded = gradedview.cell_figures(c)
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
    return _Gates(f"; {graded}" if graded else "", slo, share)


def _outputs(c: CellSummary) -> str:
    return "1 output" if c.distinct == 1 else f"{c.distinct} distinct outputs"


def _junit_failure(c: CellSummary, summary: RunSummary, fail_on: str) -> Failure | None:
    """A probe cell's JUnit failure (type, message, text), or None when it passes. One failure per
    testcase: a gate (SLO, good share) is named inside another failure, or is the failure itself."""
    gates = _gates(c, summary)
    if c.ok == 0:
        errors = f"errors: {counts_text(c.errors)}{gates.slo}{gates.share}"
        return "target_failed", "no ok sample", errors
    # Under fail_on bad, drift fails only where an answer good in every serial sample came back bad
    # (exitcode).
    if c.drift and (fail_on != "bad" or bool(c.flips_good_to_bad)):
        return _drift_failure(c, gates, fail_on)
    if c.short:
        return (
            "inconclusive",
            f"short of samples: {c.ok} of {c.asked} ok",
            (
                f"{_outputs(c)} in {c.ok} samples, fewer than the {c.asked} asked: "
                f"{short_text(c)}{gates.graded}{gates.slo}{gates.share}"
            ),
        )
    if fail_on == "latent" and (c.latent_drift or c.logprob_gap):
        return _logprob_failure(c, gates)
    return _gate_failure(c, summary, gates)


def _drift_failure(c: CellSummary, gates: _Gates, fail_on: str) -> Failure:
    """Drift that fails: nondeterminism, or under ``fail_on="bad"`` answers load turned bad."""
    kinds = kinds_text(c)
    short = f"; short: {short_text(c)}" if c.short else ""
    text = (
        f"{cell_phrase(c, ' samples')}; first divergence at "
        f"{position_label(char=c.first_divergence_chars, token=c.first_divergence_tokens)}; "
        f"{c.divergent_requests} requests differ from the serial output"
        + (f" (kinds: {kinds})" if kinds else "")
        + short
        + gates.graded
        + gates.slo
        + gates.share
    )
    if fail_on == "bad":
        return "bad_answers", f"{c.flips_good_to_bad} answers good→bad under load", text
    return "nondeterminism", cell_phrase(c), text


def _logprob_failure(c: CellSummary, gates: _Gates) -> Failure:
    """Under ``fail_on="latent"``: latent drift, or logprobs that cover only some samples."""
    if c.latent_drift:
        return (
            "latent_drift",
            f"latent drift: {latent_text(c)}",
            (
                f"1 output in {c.ok} samples, the serial text, but its per-token logprobs differ "
                f"from the "
                f"serial ones from {position_label(token=c.first_logprob_divergence_token)}: "
                f"{logprob_text(c)}{gates.slo}{gates.share}"
            ),
        )
    gap = logprob_gap_text(c, c.level)
    return (
        "logprobs_missing",
        gap,
        (
            f"1 output in {c.ok} samples; latent drift can be neither shown nor ruled out: "
            f"{gap}{gates.slo}{gates.share}"
        ),
    )


def _gate_failure(c: CellSummary, summary: RunSummary, gates: _Gates) -> Failure | None:
    """A cell that held but is under the SLO's minimum attainment or load.min_good_share."""
    if gates.slo:
        return (
            "slo",
            f"SLO attainment {c.slo_attainment:.1%} under {summary.min_slo_attainment:.1%}",
            (
                f"SLO {slo_bounds_text(summary.slo)}: {slo_cell_text(c)}; {_outputs(c)} in {c.ok} "
                f"samples{gates.graded}{gates.share}"
            ),
        )
    if gates.share:
        return (
            "good_share",
            f"good share {c.good_share:.1%} under {summary.min_good_share:.1%}",
            f"{_outputs(c)} in {c.ok} samples{gates.graded}{gates.share}",
        )
    return None
