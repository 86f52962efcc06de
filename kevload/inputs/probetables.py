"""A scenario's [[probes]] tables read (inline, or ``dataset = ...`` JSONL files, with the trace
and companion files [load] names), and each probe checked as a whole."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from kevload.inputs.conversation import BadTurns, parse_turns
from kevload.inputs.datasets import Dataset, read_dataset
from kevload.inputs.fieldrules import Failer, build, known_keys, read_value, recheck
from kevload.inputs.grading import BadGrading, checked
from kevload.inputs.loadrules import fits_trace
from kevload.inputs.probe import Probe, first_bad_message, rule_of
from kevload.inputs.scenariokeys import Load
from kevload.inputs.trace import TraceDataset, read_trace

_PROBE_FIELDS = {f.name: f for f in fields(Probe)}


def probes_and_datasets(
    fail: Failer, items: list[Any], load: Load, source: str
) -> tuple[tuple[Probe, ...], tuple[Dataset, ...]]:
    """Inline probes and ``[[probes]] dataset = ...`` entries in their order; companion files too,
    when used.

    Files are read here, before anything is sent, so a bad line fails first and the run records the
    exact bytes (by hash) it used. Relative paths are relative to the scenario file.
    """
    base = Path(source).parent
    probes: list[Probe] = []
    datasets: list[Dataset] = []
    for i, item in enumerate(items):
        where = f"probes[{i}]"
        if not isinstance(item, dict):
            fail(where, "a table with id and prompt or messages", item)
        if "dataset" not in item:
            probes.append(build(Probe, with_turns(item, where, fail), where, fail))
            continue
        dataset = _probe_dataset(fail, item, where, load, base)
        datasets.append(dataset)
        probes.extend(dataset.items)
    if load.trace:
        datasets.append(_trace(fail, load, base))
    if load.mode == "mixed" and load.companions != "builtin":
        datasets.append(
            read_dataset(
                base / load.companions,
                role="companion",
                what="load.companions",
                seed=load.dataset_seed,
                count=load.companion_count,
                count_key="load.companion_count",
            )
        )
    return tuple(probes), tuple(datasets)


def _probe_dataset(
    fail: Failer, item: dict[str, Any], where: str, load: Load, base: Path
) -> Dataset:
    """A ``[[probes]] dataset = ...`` entry's keys checked and its JSONL file read: its lines are
    probes."""
    known_keys(item, where, {"dataset", "count", "max_tokens"}, fail)
    count = item.get("count", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        fail(f"{where}.count", "an integer >= 0 (0: every line)", count)
    max_tokens = read_value(
        item.get("max_tokens", 64),
        int,
        rule_of(_PROBE_FIELDS["max_tokens"]),
        f"{where}.max_tokens",
        fail,
    )
    if not isinstance(item["dataset"], str) or not item["dataset"]:
        fail(f"{where}.dataset", "the path of a JSONL file", item["dataset"])
    return read_dataset(
        base / item["dataset"],
        role="probe",
        what=f"{where}.dataset",
        seed=load.dataset_seed,
        count=count,
        count_key=f"{where}.count",
        max_tokens=max_tokens,
    )


def _trace(fail: Failer, load: Load, base: Path) -> TraceDataset:
    """``load.trace`` read (its window checked first) and the keys that depend on what it holds
    checked."""
    trace = read_trace(
        base / load.trace,
        what="load.trace",
        trace_format=load.trace_format,
        seed=load.dataset_seed,
        max_requests=load.trace_max_requests,
        block_tokens=load.trace_block_tokens,
        window=_window(fail, load),
        tokenizer=base / load.trace_tokenizer if load.trace_tokenizer else None,
        tokenizer_what="load.trace_tokenizer",
    )
    fits_trace(fail, load, trace)
    return trace


def _window(fail: Failer, load: Load) -> tuple[float, float] | None:
    """``load.trace_window_s`` as the trace is read with it, checked first: it decides which lines
    are replayed."""
    if not load.trace_window_s:
        return None
    if len(load.trace_window_s) != 2 or load.trace_window_s[0] >= load.trace_window_s[1]:
        fail(
            "load.trace_window_s",
            "[from, to], two numbers of seconds after the trace's first line, from < to",
            list(load.trace_window_s),
        )
    start, end = load.trace_window_s
    return start, end


def checked_probes(fail: Failer, probes: tuple[Probe, ...], source: str) -> tuple[Probe, ...]:
    """Each probe checked as a whole, their ids unique; a schema file or a python grader is found
    from the scenario's directory."""
    if not probes:
        fail("probes", "at least one [[probes]] table", list(probes))
    base = Path(source).parent
    checked = tuple(_checked_probe(fail, p, f"probes[{i}]", base) for i, p in enumerate(probes))
    ids = [p.id for p in checked]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        fail("probes.id", "unique ids", duplicates)
    return checked


def _checked_probe(fail: Failer, probe: Probe, where: str, base: Path) -> Probe:
    """One probe: its fields by their rules, exactly one input, well-formed messages, its grading
    keys."""
    probe = recheck(probe, where, fail)
    given = [k for k in ("prompt", "messages", "turns") if getattr(probe, k) is not None]
    if len(given) != 1:
        fail(where, "exactly one of prompt, messages or turns", given)
    if probe.turns is not None:
        with_turns({"turns": list(probe.turns)}, where, fail)
    elif probe.system is not None:
        fail(
            f"{where}.system",
            "turns beside it (a system message opens a conversation)",
            probe.system,
        )
    bad = first_bad_message(probe.messages or ())
    if bad is not None:
        fail(
            f"{where}.messages[{bad}]",
            "a table with string role and content",
            (probe.messages or ())[bad],
        )
    return _graded(fail, probe, where, base)


def _graded(fail: Failer, probe: Probe, where: str, base: Path) -> Probe:
    """The probe with its grading keys checked (``grading.checked``) and in normal form: the grade
    named (picked from ``expected`` when not given), a schema file read into ``expected``."""
    try:
        graded = checked(probe.expected, probe.grade, probe.grade_tolerance, base)
    except BadGrading as bad:
        fail(f"{where}.{bad.key}", bad.expected, bad.got)
    if graded is None:
        return probe
    if probe.turns is not None:
        # A conversation's output is its whole transcript: no one answer to judge.
        fail(f"{where}.grade", "no grading on a conversation probe (turns)", graded.grade)
    return replace(
        probe, expected=graded.expected, grade=graded.grade, grade_tolerance=graded.tolerance
    )


def with_turns(table: dict[str, Any], where: str, fail: Failer) -> dict[str, Any]:
    """A probe table with its ``turns`` read as ``Turn``s (``conversation.parse_turns``'s rule,
    which names the bad turn), so the field's own rule only has to check their kind."""
    if "turns" not in table:
        return table
    try:
        return {**table, "turns": parse_turns(table["turns"])}
    except BadTurns as bad:
        fail(f"{where}.{bad.key}", bad.expected, bad.got)
