"""The guide's step 5: case sets built from runs, rerun after every change, compared before/after.

A case belongs to one target (server and model): the same input and params asked of another
server, or of another model, is another case. Its identity is a digest of the target, the input,
the params and the load it ran under (mode, concurrency, companions), so `build` can say which
cases it already has. `kevload.guide.rerun` reproduces that load and compares the answers with the
recorded ones; here are the building and the reading of a case file.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

import msgspec
import orjson

from kevload.errors import ScenarioError
from kevload.inputs.grading import (
    IMPORT,
    BadGrading,
    Grading,
    checked,
    python_graders,
    refused_from,
    schema_files,
    schema_refused_from,
)
from kevload.inputs.probe import iter_jsonl
from kevload.inputs.trace import trace_rates
from kevload.load.resuming import recorded_scenario
from kevload.records.rundir import RunDir
from kevload.records.store import json_bytes
from kevload.records.summary import CellSummary

# Which load keys shape the batch around the probe in each mode; the others do not change the case.
_MODE_KEYS = {
    "single": (),
    "mixed": ("seed", "companions"),
    "prefix": ("seed", "prefix_lengths"),
    "needle": ("seed", "needle_length"),
}
# What replays a trace level (load.trace) as the run did; its speed-up is the cell's own.
_TRACE_KEYS = ("trace", "trace_format", "trace_max_requests", "trace_block_tokens", "dataset_seed")
# … and these where the run set them (only then, so the other trace cases keep their ids): the part
# of the trace replayed, and the tokenizer whose words its prompts were.
_TRACE_KEYS_IF_SET = ("trace_window_s", "trace_tokenizer")
# The companions a run abandoned (load.cancel_share) and when (kevload.load.cancel).
CANCEL_KEYS = ("cancel_share", "cancel_after_s", "cancel_after_tokens")


@dataclass(frozen=True)
class Skip:
    """A case `build` did not add, and why."""

    id: str
    run: str
    reason: str


@dataclass(frozen=True)
class BuildReport:
    new: int
    kept: int
    skipped: tuple[Skip, ...]


def build_cases(
    run_dirs: list[Path], cases_path: Path, *, target_name: str | None = None
) -> BuildReport:
    """Append one case per probe × level of each run; cases already in the file are never touched.

    A case that is already in the file, or that an earlier run in ``run_dirs`` gave, is skipped and
    reported with the reason, never dropped in silence.
    """
    existing = read_cases(cases_path) if cases_path.exists() else []
    source_of = {case["id"]: case.get("source_run", str(cases_path)) for case in existing}
    in_file = set(source_of)
    added: list[dict[str, Any]] = []
    skipped: list[Skip] = []
    for run_dir in run_dirs:
        cases, unbuilt = cases_from_run(RunDir.open(run_dir), target_name=target_name)
        skipped.extend(Skip(name, str(run_dir), reason) for name, reason in unbuilt)
        for case in cases:
            if case["input"] is None:  # a probe's turns: its cells compare whole conversations
                skipped.append(
                    Skip(
                        case["id"],
                        str(run_dir),
                        "a conversation (turns): a case is one request's input, asked again alone",
                    )
                )
            elif not case["outputs"]:
                skipped.append(Skip(case["id"], str(run_dir), "no ok answer in the run"))
            elif case["id"] in source_of:
                where = (
                    f"already in {cases_path}"
                    if case["id"] in in_file
                    else "given earlier in this build"
                )
                skipped.append(
                    Skip(
                        case["id"],
                        str(run_dir),
                        "same target, model, input, params and load as the "
                        f"case from {source_of[case['id']]} ({where})",
                    )
                )
            else:
                source_of[case["id"]] = str(run_dir)
                added.append(case)
    with cases_path.open("ab") as handle:
        for case in added:
            handle.write(json_bytes(case) + b"\n")
    return BuildReport(new=len(added), kept=len(existing), skipped=tuple(skipped))


def target_name_of(base_url: str) -> str:
    """The server part of a case's identity: host and port (the path and credentials left out)."""
    try:
        parsed = urlparse(base_url)
        host, port = parsed.hostname or "", parsed.port
    except ValueError:  # an edited run.json: no run sends to such a URL
        raise ScenarioError(
            f"target.base_url: expected a URL with a host and a port from 1 to 65535, got "
            f"{base_url!r}"
        ) from None
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port or (443 if parsed.scheme == 'https' else 80)}"


def cases_from_run(
    run: RunDir, *, target_name: str | None = None
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """One case per probe cell of the run, and (cell name, why) for each cell no case can be built
    from."""
    meta = run.meta()
    summary = run.summary()
    scenario = meta["scenario"]
    probe_list, unread = _run_probes(run, meta)
    # The probe's index is the engine's: what it seeds the companion picker with (case_load).
    index_of = {str(p["id"]): i for i, p in enumerate(probe_list)}
    params = scenario.get("params", {})
    try:
        name = target_name or target_name_of(meta["target"]["base_url"])
    except ScenarioError as bad:
        raise ScenarioError(f"{run.run_json}: {bad}") from None
    target = {"name": name, "model": meta["target"]["model"]}
    recorded_at = meta.get("ended_at") or meta.get("started_at")
    outputs: dict[tuple[str, int, float | None], Counter[str]] = {}
    for r in run.evidence():
        outputs.setdefault((r.probe, r.concurrency, r.rate), Counter())[r.answer] += 1
    cells = [c for c in summary.probe_cells() if c.probe in index_of]
    unbuilt = [
        (c.name, unread or _not_a_probe(c.probe, meta))
        for c in summary.probe_cells()
        if c.probe not in index_of
    ]
    cases = []
    for c in cells:
        probe = probe_list[index_of[c.probe]]
        case_input = probe.get("prompt", probe.get("messages"))
        case_params = _case_params(params, probe, c)
        load = case_load(meta, c, index_of[c.probe])
        texts = outputs.get((c.probe, c.concurrency, c.rate), Counter())
        identity = {k: v for k, v in load.items() if k != "samples"}
        cases.append(
            {
                "id": f"{c.probe}-{_digest([target, case_input, case_params, identity])}",
                "input": case_input,
                "params": case_params,
                "outputs": counted_outputs(texts),
                "expected": None,
                **_case_grading(meta.get("grading", {}).get(c.probe)),
                "verdict": "unstable" if c.drift else "stable",
                "note": _note(c, [x for x in cells if x.probe == c.probe and x.mode == c.mode]),
                "target": target,
                "load": load,
                "source_run": str(run.path),
                "recorded_at": recorded_at,
            }
        )
    return cases, unbuilt


def _case_params(
    params: dict[str, Any], probe: dict[str, Any], cell: CellSummary
) -> dict[str, Any]:
    """What a case asks: the run's params, the probe's max_tokens, and the level its cell ran at."""
    case_params = {
        **params,
        "max_tokens": probe.get("max_tokens", 64),
        "mode": cell.mode,
        "concurrency": cell.concurrency,
    }
    if cell.rate is not None:
        case_params["rate"] = cell.rate
    return case_params


def _run_probes(run: RunDir, meta: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The run's probes as ``[[probes]]`` tables, in the order the engine numbered them: inline ones
    as written, and each ``[[probes]] dataset = …`` entry as the lines the run chose from its file
    (read again, as ``--resume`` reads them, and checked against the hashes run.json recorded). ([],
    why) where a dataset cannot be read as the run read it: then no probe's index, nor a dataset
    probe's input, is known."""
    raw = meta["scenario"].get("probes", [])
    if not any(isinstance(item, dict) and "dataset" in item for item in raw):
        return raw, ""
    try:
        scenario = recorded_scenario(run)
    except ScenarioError as exc:
        return [], f"its probes come from a dataset that cannot be read as the run read it: {exc}"
    # A conversation has neither prompt nor messages: build_cases skips it, as it does an inline
    # one.
    return [
        {
            "id": p.id,
            "max_tokens": p.max_tokens,
            **({"prompt": p.prompt} if p.prompt is not None else {}),
            **({"messages": list(p.messages)} if p.messages is not None else {}),
        }
        for p in scenario.probes
    ], ""


def _not_a_probe(probe: str, meta: dict[str, Any]) -> str:
    """Why a cell's probe is none of the scenario's: a prefix-cache marker round, whose input opens
    with a marker of that run's own (a case asked again would be another input), or a run.json that
    does not list it."""
    if (meta.get("prefix_cache") or {}).get("method") == "marker":
        return (
            "a load.prefix_cache marker round: its input opens with the run's own marker, so asked "
            "again it "
            "is another input"
        )
    return "its probe is not among the scenario's probes in run.json"


def case_load(meta: dict[str, Any], cell: CellSummary, probe_index: int) -> dict[str, Any]:
    """What a rerun needs to send the probe among the same requests as the run did."""
    run_load = meta["load"]
    mode = cell.mode
    load: dict[str, Any] = {
        "mode": mode,
        "concurrency": cell.concurrency,
        "samples": cell.ok,
        "stream": run_load.get("stream", False),
    }
    if cell.rate is not None:
        load.update(
            rate=cell.rate,
            arrival=run_load.get("arrival", "constant"),
            max_in_flight=run_load.get("max_in_flight", 0),
        )
    if cell.rate is not None and run_load.get("trace"):
        # A trace level is its replay, not its mean rate: the rerun sends the trace again at the
        # cell's speed-up.
        speedups = run_load.get("trace_speedup") or [1.0]
        speedup = dict(
            zip(trace_rates(meta.get("datasets", []), speedups), speedups, strict=False)
        ).get(cell.rate)
        load.update(
            {key: run_load[key] for key in _TRACE_KEYS if key in run_load},
            trace_speedup=[speedup or 1.0],
        )
        load.update({key: run_load[key] for key in _TRACE_KEYS_IF_SET if run_load.get(key)})
    for key in _MODE_KEYS[mode]:
        load[key] = run_load[key]
    if mode != "single" and run_load.get("cancel_share"):
        # The companions it cut are part of that load: a probe that drifts only beside cuts, rerun
        # without them, would be called fixed.
        load.update({key: run_load[key] for key in CANCEL_KEYS if run_load.get(key) is not None})
    if run_load.get("prefix_cache", "off") != "off":
        # Its outputs are cold and warm answers: a rerun makes them the same way (the method the run
        # used).
        load.update(
            prefix_cache=run_load["prefix_cache"], cache_reset=meta["prefix_cache"]["method"]
        )
    if "seed" in load:
        # The engine seeds each probe's companion picker with seed + the probe's index; a rerun
        # sends the case as the only probe (index 0), so the offset moves into the seed.
        load["seed"] += probe_index
    for key in ("companions", "trace", "trace_tokenizer"):
        if key in load and load[key] != "builtin":
            path = Path(load[key])
            if not path.is_absolute():
                path = Path(meta.get("scenario_source") or ".").parent / path
            load[key] = str(path.resolve())
    if "prefix_lengths" in load:
        load["prefix_lengths"] = list(load["prefix_lengths"])
    return load


# What a rerun reads of a case, typed (``read_cases``): a value of another type (a verdict no build
# writes, an id that is no text, outputs that are no list, a level that is no count) is a bad case
# file, refused before anything is sent; it crashed a rerun with a traceback or, read as a recorded
# output, was called a change of the model. The other keys, and the [load] table's other keys (read
# by Load's own rules at the rerun), are kept as they are.
_Level = Annotated[int, msgspec.Meta(ge=0)]
_Rate = Annotated[float, msgspec.Meta(gt=0)]


class _Output(msgspec.Struct, frozen=True):
    text: str
    count: Annotated[int, msgspec.Meta(ge=1)] = 1


class _CaseTarget(msgspec.Struct, frozen=True):
    name: str | None = None
    model: str | None = None


class _CaseParams(msgspec.Struct, frozen=True):
    concurrency: _Level = 1
    rate: _Rate | None = None


class _CaseLoad(msgspec.Struct, frozen=True):
    concurrency: _Level | None = None
    rate: _Rate | None = None


class _Case(msgspec.Struct, frozen=True):
    id: Annotated[str, msgspec.Meta(min_length=1)]
    input: str | list[Any]
    params: _CaseParams
    verdict: Literal["stable", "unstable"]
    outputs: list[str | _Output] | None = None
    expected: Any = None  # what its grader reads (case_grading checks it against the grade)
    target: _CaseTarget | None = None
    load: _CaseLoad | None = None


def read_cases(path: Path, *, trust_graders: bool = False) -> list[dict[str, Any]]:
    """A case file's cases as written (keys a rerun does not read kept for ``accept_changes``), each
    checked against what a rerun reads of it (``_Case``): a bad one is a ``ScenarioError`` naming
    its line and key. A case file is data: a python grader it names is refused unless
    ``trust_graders``, and then imported."""
    cases = []
    lines: dict[str, int] = {}  # each id's line: a rerun's directory is named by it
    for number, case in iter_jsonl(path, "case set"):
        missing = [
            f
            for f in ("id", "input", "params", "verdict")
            if not isinstance(case, dict) or f not in case
        ]
        if missing:
            raise ScenarioError(f"{path}:{number}: case lacks {', '.join(missing)}")
        try:
            msgspec.convert(case, _Case)
        except msgspec.ValidationError as exc:
            raise ScenarioError(f"{path}:{number}: case {case['id']!r}: {exc}") from None
        if case["id"] in lines:
            raise ScenarioError(
                f"{path}:{number}: case {case['id']!r}: the id of line {lines[case['id']]} too; "
                "give each case an id of its own"
            )
        lines[case["id"]] = number
        try:
            what = f"the case file {path}"
            with (
                python_graders(IMPORT if trust_graders else refused_from(what)),
                schema_files(None if trust_graders else schema_refused_from(what)),
            ):
                case_grading(case, path.parent)
        except BadGrading as bad:
            raise ScenarioError(
                f"{path}:{number}: case {case['id']}: {bad.key}: expected {bad.expected}, got "
                f"{str(bad.got)[:80]!r}"
            ) from None
        cases.append(case)
    return cases


def case_grading(case: dict[str, Any], base: Path) -> Grading | None:
    """A case's grader: its ``expected`` with its ``grade`` (picked from the kind of ``expected``
    when not given, so a plain string is ``exact`` after trimming whitespace) and
    ``grade_tolerance``, checked as a probe's keys are (``grading.checked``; ``base``: where a
    schema file is found, and a python grader unless the case keeps the directory the run found it
    in, ``grader_dir``); None without either key."""
    home = case.get("grader_dir")
    if home is not None and not (isinstance(home, str) and Path(home).is_absolute()):
        raise BadGrading(
            "grader_dir",
            "the absolute path of the directory the python grader was imported from",
            home,
        )
    return checked(
        case.get("expected"),
        case.get("grade"),
        case.get("grade_tolerance"),
        Path(home) if home else base,
    )


def _case_grading(doc: dict[str, Any] | None) -> dict[str, Any]:
    """A built case's grading keys from the run's probe grader (run.json ``grading``); none for an
    ungraded probe."""
    if doc is None:
        return {}
    return {
        "expected": doc["expected"],
        "grade": doc["grade"],
        **({"grade_tolerance": doc["tolerance"]} if doc.get("tolerance") else {}),
        **({"grader_dir": doc["dir"]} if doc.get("dir") else {}),
    }


def recorded_texts(case: dict[str, Any]) -> set[str]:
    """The outputs a case recorded: kevload's ``{text, count}`` objects or the guide's plain
    strings."""
    return {o["text"] if isinstance(o, dict) else o for o in case.get("outputs") or []}


def counted_outputs(texts: Counter[str]) -> list[dict[str, Any]]:
    """Answers as a case file keeps them: ``{text, count}``, the most frequent first."""
    return [
        {"text": t, "count": n} for t, n in sorted(texts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


def _note(cell: CellSummary, row: list[CellSummary]) -> str:
    """The guide's note: at which levels (concurrency, or rate for open-loop runs; both, by their
    labels, for a trace's levels after the serial one) the probe drifted."""
    open_loop = cell.rate is not None
    mixed = len({c.rate is None for c in row}) > 1
    noun = "level" if mixed else "rate" if open_loop else "concurrency"
    levels = sorted(row, key=lambda c: c.level_order)
    unstable = [c for c in levels if c.drift]

    def named(cells: list[CellSummary]) -> str:
        return ", ".join(
            c.level if mixed else f"{c.rate:g}/s" if open_loop else str(c.concurrency)
            for c in cells
        )

    if not unstable:
        return f"stable at {noun} {named(levels)} (n={cell.ok})"
    if unstable == levels:
        every = "every level" if mixed else f"every {noun} level"
        return f"unstable at {every}" + ("" if open_loop and not mixed else ", serial included")
    if unstable == levels[levels.index(unstable[0]) :]:
        return f"unstable only at {noun} ≥ {named(unstable[:1])}"
    return f"unstable at {noun} {named(unstable)}"


def _digest(parts: Any) -> str:
    return hashlib.sha256(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()[:10]
