"""A run directory as every reader sees it: its records files (``records.jsonl``, a worker run's
``records-<w>.jsonl``), ``run.json`` and ``summary.json``, read through one ``RunDir``."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import orjson

from kevload.errors import RunDirError
from kevload.records.store import RECORDS, RUN, SUMMARY, Record, read_json, read_records, read_typed
from kevload.records.summary import RunSummary


@dataclass(frozen=True)
class RunDir:
    """The files of one run. Nothing is read until asked for: a ``RunDir`` of a directory that holds
    no run yet names where its files go."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "path", Path(self.path)
        )  # a str from the API too: every file is path / name

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> RunDir:
        """The run in ``path``; a directory without a records file is a ``RunDirError``."""
        run = cls(Path(path))
        if not run.record_files():
            raise RunDirError(f"{path}: not a kevload run directory (no {RECORDS})")
        return run

    @property
    def run_json(self) -> Path:
        return self.path / RUN

    @property
    def summary_json(self) -> Path:
        return self.path / SUMMARY

    @property
    def records_jsonl(self) -> Path:
        """The records file of a run in one process (a worker run has one per worker instead)."""
        return self.path / RECORDS

    def record_files(self) -> list[Path]:
        """Every records file: ``records.jsonl`` and, for a run with workers,
        ``records-<worker>.jsonl`` by worker."""
        paths = [self.records_jsonl] if self.records_jsonl.is_file() else []
        workers = [
            p
            for p in self.path.glob("records-*.jsonl")
            if p.stem.removeprefix("records-").isdigit()
        ]
        return paths + sorted(workers, key=lambda p: int(p.stem.removeprefix("records-")))

    def holds_run(self) -> bool:
        """Whether a run has begun here: its run.json or a records file exists."""
        return self.run_json.exists() or bool(self.record_files())

    def run_id(self) -> str | None:
        """The run id of its records (None: none yet); records of two runs in one directory are a
        ``RunDirError``."""
        ids = set().union(*(_run_ids(path) for path in self.record_files()))
        if len(ids) > 1:
            shown = ", ".join(sorted(ids)[:3]) + (", …" if len(ids) > 3 else "")
            raise RunDirError(
                f"{self.path}: holds records of {len(ids)} runs ({shown}); "
                "one directory, one run: rerun into a fresh --out"
            )
        return next(iter(ids), None)

    def meta(self) -> dict[str, Any]:
        """``run.json``: the scenario as run, its load, target, parts and end state, as written; the
        keys kevload reads back from it checked typed first (``_RunJson``), so an edited one is a
        ``RunDirError`` naming the key, never a traceback in whatever reads it later."""
        doc: dict[str, Any] = read_json(self.run_json)
        try:
            msgspec.convert(doc, _RunJson)
        except msgspec.ValidationError as exc:
            raise RunDirError(f"{self.run_json}: {exc} (expected a kevload run.json)") from None
        return doc

    def summary(self) -> RunSummary:
        """``summary.json`` as it was last written (``finishing.finish_run`` recomputes it from the
        records), read typed: a key that does not fit its field, or one every summary has that is
        missing, is a ``RunDirError`` naming it."""
        return read_summary(self.summary_json)

    def records(self) -> Iterator[Record]:
        """Every record, typed, file after file, non-finite logprobs as floats (``Record.floats``);
        a line that is no record is a ``RunDirError`` naming it."""
        for path in self.record_files():
            for record in read_typed(path):
                yield record.floats()

    def record_dicts(self) -> Iterator[dict[str, Any]]:
        """Every record as the JSON object on disk, unchecked: what shows a record as written."""
        for path in self.record_files():
            yield from read_records(path)

    def evidence(self) -> Iterator[Record]:
        """The counted ok probe answers (``Record.is_evidence``): what the cells' claims rest on."""
        return (record for record in self.records() if record.is_evidence)

    def find(self, request_id: str) -> dict[str, Any] | None:
        """The record of the request sent with ``X-Request-Id: request_id``, as written, or None.

        Only lines holding the id's JSON spelling are parsed, so a large file is a byte scan.
        """
        needle = orjson.dumps(request_id)
        for path in self.record_files():
            with path.open("rb") as handle:
                for line in handle:
                    if needle not in line:
                        continue
                    try:
                        record = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        continue  # a torn last line
                    if isinstance(record, dict) and record.get("request_id") == request_id:
                        return record
        return None


class _Slo(msgspec.Struct, forbid_unknown_fields=True):
    ttft_ms: float | None = None
    itl_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None


class _Load(msgspec.Struct):
    """The keys of run.json's ``load`` that its readers use (the summary, resume, case sets), with
    their types; the scenario's own rules checked them when the run began."""

    max_error_share: float
    mode: str = "single"
    concurrency: list[int] = []
    rate: list[float] | None = None
    samples: int | None = None
    duration: float | None = None
    slo: _Slo | None = None
    cancel_share: float | None = None
    min_slo_attainment: float | None = None
    min_good_share: float | None = None
    until_bound: float | None = None
    max_samples: int = 1000
    trace_speedup: list[float] | None = None


class _Part(msgspec.Struct):
    part: int
    first_seq: int
    workers: int
    unrecorded: int | None = None


class _Method(msgspec.Struct):
    method: str
    why: str = ""


class _Target(msgspec.Struct):
    base_url: str
    model: str


class _RunJson(msgspec.Struct):
    """What kevload reads back from a run.json (other keys are kept as written and not read)."""

    load: _Load
    scenario: dict[str, Any] = {}
    target: _Target | None = None
    run_id: str | None = None
    scenario_name: str | None = None
    scenario_source: str | None = None
    state: str | None = None
    probes: list[str] | None = None
    parts: list[_Part] | None = None
    prefix_cache: _Method | None = None
    datasets: list[dict[str, Any]] = []
    grading: dict[str, dict[str, Any]] | None = None
    inputs: dict[str, Any] | None = None


def _run_ids(path: Path) -> set[str]:
    """The run ids in a records file, read fast: lines that start like the last one seen are not
    parsed."""
    ids: set[str] = set()
    prefix = None
    with path.open("rb") as handle:
        for line in handle:
            if prefix is not None and line.startswith(prefix):
                continue
            try:
                run_id = orjson.loads(line)["run_id"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue  # a torn last line; the reader decides whether the file is readable
            if not isinstance(run_id, str):
                # no record (a list is no set member, null no name to sort): the typed reader names
                # its line
                continue
            ids.add(run_id)
            # A Record is written with run_id first and no spaces: the same bytes open every line of
            # a run.
            prefix = orjson.dumps({"run_id": run_id})[:-1] + b","
    return ids


def read_summary(path: str | os.PathLike[str], use: str = "") -> RunSummary:
    """A ``summary.json``, from this version or an older one, read typed: a key whose value does not
    fit its field (null latencies, a number for a hash), or one every summary has that is missing,
    is a ``RunDirError`` naming the file and the key. ``use``: how the command names the file in the
    error (``--baseline: ``)."""
    doc = read_json(Path(path))
    expected = "expected a kevload summary.json"
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
        raise RunDirError(f"{path}: {use}{expected}")
    problem = RunSummary.type_problem(doc)
    if problem is not None:
        raise RunDirError(f"{path}: {use}{problem} ({expected})")
    return RunSummary.from_json(doc)


def apart(labels: list[str]) -> dict[str, str]:
    """Each label's file name: its characters that a file name holds as they are, the others as
    ``_``. Labels that would share a name (target.model=org/m and org_m) get a hash of the label
    after it, so each setting keeps its own directory and log, and a rerun of the same grid names
    them the same. One longer than a file name may be (255 bytes, a log's ``server-`` and ``.log``
    around it) is cut to fit, with the hash after it."""
    plain = {name: _dirname(name) for name in labels}
    shared = Counter(plain.values())
    return {
        name: file
        if shared[file] == 1 and len(file.encode()) <= _NAME_BYTES
        else f"{_cut(file, _NAME_BYTES - 9)}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
        for name, file in plain.items()
    }


# a label's file name at most: 255 bytes less the server log's "server-" and ".log", and room
_NAME_BYTES = 200


def _cut(text: str, size: int) -> str:
    """``text``'s first characters that fit in ``size`` bytes of UTF-8."""
    return text.encode()[:size].decode(errors="ignore")


def _dirname(name: str) -> str:
    file = "".join(ch if ch.isalnum() or ch in "-_.=" else "_" for ch in name)
    # Dots alone ("", ".", "..") name no directory of its own: this one or the one above it.
    return file if file.strip(".") else file.replace(".", "_") + "_"
