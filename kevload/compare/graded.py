"""Good or bad, beside same or different: each graded probe cell's answers graded (once per distinct
output, from the texts the cell already keeps), flips against the serial cell, and accuracy per
level with the paired test.

Definitions (docs/graded.md: "Good or bad: graded answers"):

- A cell's ``graded_good`` / ``graded_bad``: its counted ok samples whose answer is graded good /
  bad.
- ``serial_grade``: ``good`` when every graded serial sample is good, ``bad`` when every one is
  bad, ``mixed`` otherwise. ``flips_good_to_bad``: samples graded bad in a cell whose serial grade
  is good; ``flips_bad_to_good`` the reverse. Against a mixed serial grade neither is counted
  (None): which serial answer a sample "was" is unknown.
- Per level, the unit is the probe: a probe is good at a level when every counted answer it got
  there is graded good (one bad answer makes it bad), and it is paired with itself at its serial
  level. ``good_to_bad`` / ``bad_to_good`` count probes; the exact McNemar test is over those
  discordant probes. Samples of one probe are not independent (a greedy server gives the same text
  again), so they are never the unit of a test.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kevload.compare import signals
from kevload.compare.cells import CellAccumulator, OutputKey
from kevload.compare.stats import mcnemar_exact, wilson_interval
from kevload.errors import ScenarioError
from kevload.inputs.gradeanswers import GraderFailed
from kevload.inputs.gradeworker import DEFAULT_TIMEOUT, BoundedGrader
from kevload.inputs.grading import (
    IMPORT,
    BadGrading,
    Grading,
    python_graders,
    refused_from,
    schema_files,
    schema_refused_from,
)
from kevload.inputs.probe import Probe
from kevload.records.store import Record
from kevload.records.summary import CellSummary, RunSummary, level_label, level_order

# accuracy "fell" at a level: lower than serial over the paired probes, McNemar p under this
SIGNIFICANT = 0.05
_SHOWN = 300  # characters of a flipped answer (and the serial one) kept in the summary


@dataclass
class Grader:
    """The run's graders by probe id, and each distinct output's grade once known: a text graded at
    one level is not graded again at another (the serial cell's outputs are met at every level).
    Each answer is graded within ``timeout`` seconds (``gradeworker``); a SIGINT/SIGTERM in the
    summary step (from ``since``, a count of ``signals.signals_so_far``) cuts the grading short:
    every answer not graded by then is ``grade_failed``, and the summary is made of the rest. Close
    it (``with``) to end its worker process."""

    gradings: Mapping[str, Grading]
    timeout: float = DEFAULT_TIMEOUT
    since: int = field(default_factory=signals.signals_so_far)
    known: dict[tuple[str, str | None], bool | None] = field(
        default_factory=dict
    )  # (probe, sha256): good, None: failed
    errors: dict[str, str] = field(default_factory=dict)  # probe: its grader's first failure
    cut: int = 0  # answers left ungraded by a signal
    bounded: BoundedGrader = field(init=False)

    def __post_init__(self) -> None:
        self.bounded = BoundedGrader(self.timeout)

    def grades(self, probe: str, cell: CellAccumulator) -> dict[OutputKey, bool | None]:
        grading = self.gradings[probe]
        out = {}
        for key, text in cell.texts.items():
            seen = (probe, key[0])
            if seen not in self.known:
                self.known[seen] = self._grade(grading, text, probe)
            out[key] = self.known[seen]
        return out

    def grade_record(self, record: Record) -> bool | None:
        """One recorded answer's grade (None: its probe is ungraded, or its grader failed), from the
        same cache."""
        grading = self.gradings.get(record.probe)
        if grading is None:
            return None
        seen = (record.probe, record.sha256 or "")
        if seen not in self.known:
            self.known[seen] = self._grade(grading, record.answer, record.probe)
        return self.known[seen]

    def _grade(self, grading: Grading, text: str, probe: str) -> bool | None:
        if signals.signal_since(self.since) is None:
            try:
                with signals.cut_short():
                    return self.bounded.good(grading, text, probe)
            except GraderFailed as failed:
                self.errors.setdefault(probe, f"probe {probe!r}: {failed}")
                return None
            except signals.Cut:
                pass
        self.cut += 1
        return None

    def failures(self) -> tuple[str, ...]:
        """What went wrong, by probe, then the answers a signal left ungraded."""
        signum = signals.signal_since(self.since)
        stopped = (
            f"grading stopped by {signal.Signals(signum).name} in the summary step: {self.cut} "
            "answers not graded (kevload report grades them again)"
            if signum is not None and self.cut
            else None
        )
        return (*(self.errors[p] for p in sorted(self.errors)), *([stopped] if stopped else []))

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bounded.close()


def graded_cell(
    summary: CellSummary,
    cell: CellAccumulator,
    reference: CellAccumulator,
    grader: Grader,
    *,
    serial: bool,
    min_good_share: float | None,
) -> CellSummary:
    """A probe cell's graded figures (this module's definitions); ``serial``: the cell is its
    probe's reference."""
    grades = grader.grades(summary.probe, cell)
    good, bad, failed = _tally(cell.counts, grades)
    ref_good, ref_bad, _ = _tally(reference.counts, grader.grades(summary.probe, reference))
    serial_grade = (
        None
        if ref_good + ref_bad == 0
        else "mixed"
        if ref_good and ref_bad
        else "good"
        if ref_good
        else "bad"
    )
    flips = (
        None
        if serial or serial_grade not in ("good", "bad")
        else (bad, 0)
        if serial_grade == "good"
        else (0, good)
    )
    example = _flip_example(cell, reference, grades, serial_grade) if flips and any(flips) else None
    share = good / (good + bad) if good + bad else None
    return replace(
        summary,
        graded_good=good,
        graded_bad=bad,
        grade_failed=failed,
        good_share=None if share is None else round(share, 6),
        good_share_ci95=None
        if share is None
        else [round(x, 6) for x in wilson_interval(good, good + bad)],
        serial_grade=serial_grade,
        flips_good_to_bad=None if flips is None else flips[0],
        flips_bad_to_good=None if flips is None else flips[1],
        flip_answer=example[0] if example else None,
        flip_serial_answer=example[1] if example else None,
        meets_good_share=None
        if min_good_share is None
        else share is not None and share >= min_good_share,
    )


def _tally(
    counts: Mapping[OutputKey, int], grades: Mapping[OutputKey, bool | None]
) -> tuple[int, int, int]:
    good = sum(n for key, n in counts.items() if grades[key] is True)
    bad = sum(n for key, n in counts.items() if grades[key] is False)
    return good, bad, sum(counts.values()) - good - bad


def _flip_example(
    cell: CellAccumulator,
    reference: CellAccumulator,
    grades: Mapping[OutputKey, bool | None],
    serial_grade: str | None,
) -> tuple[str, str]:
    """The most common flipped output (ties: the first seen) and the serial one, each cut to
    ``_SHOWN`` chars."""
    flipped_to = serial_grade == "bad"
    key = max(
        (k for k, g in grades.items() if g is flipped_to),
        key=lambda k: (cell.counts[k], -cell.first_seen[k]),
    )
    serial = reference.modal()
    assert serial is not None  # a serial grade: the reference had answers
    return cell.texts[key][:_SHOWN], reference.texts[serial][:_SHOWN]


def with_accuracy(run: RunSummary, grader: Grader, min_good_share: float | None) -> RunSummary:
    """The run's graded figures, from its graded probe cells alone (so a summary read back gives
    them again)."""
    cells = [c for c in run.probe_cells() if c.graded_good is not None]
    levels = accuracy(cells)
    return replace(
        run,
        accuracy=tuple(levels),
        bad_cells=tuple(c.name for c in cells if c.flips_good_to_bad),
        accuracy_fell_levels=tuple(level_name(entry) for entry in levels if entry["fell"]),
        min_good_share=min_good_share,
        good_share_failed_cells=tuple(c.name for c in cells if c.meets_good_share is False),
        grade_errors=grader.failures(),
    )


def probe_grade(cell: CellSummary) -> bool | None:
    """A probe at a level: good when every answer there graded is good, bad with one bad; None with
    none graded."""
    if not cell.graded_good and not cell.graded_bad:
        return None
    return not cell.graded_bad


def accuracy(cells: Iterable[CellSummary]) -> list[dict[str, Any]]:
    """One entry per mode and level over the graded probe cells: the probes graded there (``n``),
    those good, the share with its Wilson 95 % interval, and against each probe's own serial level
    the discordant probes and the exact McNemar p (None at the serial level itself). ``fell``: lower
    than serial with p < ``SIGNIFICANT``."""
    by_level: dict[tuple[str, int, float | None], dict[str, CellSummary]] = {}
    for c in cells:
        by_level.setdefault((c.mode, c.concurrency, c.rate), {})[c.probe] = c
    serial = {(c.mode, c.probe): c for c in cells if c.level == c.reference_level}
    out = []
    for (mode, concurrency, rate), row in sorted(
        by_level.items(), key=lambda kv: (kv[0][0], level_order(*kv[0][1:]))
    ):
        grades = {probe: g for probe, c in row.items() if (g := probe_grade(c)) is not None}
        n, good = len(grades), sum(grades.values())
        low, high = wilson_interval(good, n)
        reference = all(c.level == c.reference_level for c in row.values())
        pairs = [
            (s, g)
            for probe, g in grades.items()
            if (ref := serial.get((mode, probe))) is not None
            and (s := probe_grade(ref)) is not None
        ]
        to_bad = sum(1 for s, g in pairs if s and not g)
        to_good = sum(1 for s, g in pairs if g and not s)
        p = None if reference else mcnemar_exact(to_bad, to_good)
        out.append(
            {
                "mode": mode,
                **({"rate": rate} if rate is not None else {"concurrency": concurrency}),
                "n": n,
                "good": good,
                "accuracy": round(good / n, 6) if n else None,
                "ci95": [round(low, 6), round(high, 6)],
                "paired": None if reference else len(pairs),
                "good_to_bad": None if reference else to_bad,
                "bad_to_good": None if reference else to_good,
                "mcnemar_p": None
                if p is None
                else float(f"{p:.6g}"),  # small p-values keep their digits
                "fell": p is not None and to_bad > to_good and p < SIGNIFICANT,
            }
        )
    return out


def level_name(entry: Mapping[str, Any]) -> str:
    """``mixed/c=4``: a level of ``accuracy`` as the summary names it."""
    return f"{entry['mode']}/{level_label(entry.get('concurrency', 0), entry.get('rate'))}"


def grading_json(probes: Iterable[Probe]) -> dict[str, dict[str, Any]]:
    """run.json's ``grading``: each graded probe's grader by probe id (a schema file already read
    into it)."""
    return {
        p.id: Grading(p.grade, p.expected, p.grade_tolerance).to_json()
        for p in probes
        if p.grade is not None
    }


def gradings_of(
    meta: Mapping[str, Any], where: Path, *, trust_graders: bool
) -> dict[str, Grading] | None:
    """The graders run.json (``where``) keeps, checked again; None for a run without graded probes.
    A python grader is imported again from the directory the run found it in only with
    ``trust_graders`` (the run is this process's own, or the user said so): a run directory is data,
    and never the place code is imported from."""
    docs = meta.get("grading")
    if not docs:
        return None
    # Runs from before the directory was recorded: the scenario's, as the run read it.
    base = Path(meta.get("scenario_source") or ".").parent
    out = {}
    what = f"the run directory {where.parent}"
    with (
        python_graders(IMPORT if trust_graders else refused_from(what)),
        schema_files(None if trust_graders else schema_refused_from(what)),
    ):
        for probe, doc in docs.items():
            try:
                out[probe] = Grading.from_json(doc, base)
            except BadGrading as bad:
                raise ScenarioError(
                    f"{where}: grading.{probe}.{bad.key}: expected {bad.expected}, got "
                    f"{str(bad.got)[:80]}"
                ) from None
    return out
