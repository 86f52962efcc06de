"""What a run says, typed: one ``CellSummary`` per probe × role × mode × level and the
``RunSummary`` around them. ``summary.json`` is ``RunSummary.to_json()``; ``from_json()`` reads it
back, from this version or an older one (a field an older run lacks takes its default — None where a
zero would claim what was never counted; a key this version does not know is left out).

Adding a field is one line here, in the class it belongs to: ``name: type = default`` when every
summary has it, ``name: type = written_with("anchor")`` when it is written only beside ``anchor``
(left out of the JSON while ``anchor`` is None — itself for a field of its own). The comparator
(``compare.summarize``) fills it; JSON, baselines and metrics (``metrics.py`` looks fields up by
name) follow from the declaration.
"""

from __future__ import annotations

import functools
import json
import types
import typing
from collections.abc import Iterable
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Union

from kevload.inputs.wordsets import (
    DivergenceKind,
    RunState,
    SampleRole,
    StopReason,
    Verdict,
    shortened,
)

_ANCHOR = "kevload.written_with"


def written_with(anchor: str) -> Any:
    """A field written to JSON only while field ``anchor`` is not None (an SLO cell's numbers, a
    drift example)."""
    return field(default=None, metadata={_ANCHOR: anchor})


def level_label(concurrency: int, rate: float | None) -> str:
    """``c=4`` for a closed-loop level, ``r=5/s`` for an open-loop rate."""
    return f"r={rate:g}/s" if rate is not None else f"c={concurrency}"


def position_label(*, char: int | None = None, token: int | None = None) -> str:
    """``char 33 / token 11 (0-based)``: a position as every report states it. Positions count from
    0, so a position is also how many chars or tokens agree before it."""
    return (
        " / ".join(
            f"{unit} {at}" for unit, at in (("char", char), ("token", token)) if at is not None
        )
        + " (0-based)"
    )


def name_parts(name: str) -> tuple[str, str, str]:
    """(probe, mode, level) of a cell named ``p1@mixed/c=4`` (``CellSummary.name``, the names in
    ``*_cells``); a probe id may hold ``@`` or ``/`` itself, a mode neither."""
    probe, _, rest = name.rpartition("@")
    mode, _, level = rest.partition("/")
    return probe, mode, level


def label_of(name: str) -> str:
    """``p1 (mixed) c=4``, how reports name the cell named ``p1@mixed/c=4``
    (``CellSummary.label``)."""
    probe, mode, level = name_parts(name)
    return f"{probe} ({mode}) {level}"


def level_order(concurrency: int, rate: float | None) -> tuple[int, float]:
    """Closed-loop levels by concurrency first, then open-loop rates by rate."""
    return (0, concurrency) if rate is None else (1, rate)


class _Json:
    """to_json/from_json for a frozen dataclass: the field declarations are the format."""

    if TYPE_CHECKING:  # every subclass is a dataclass: what ``fields`` takes
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            anchor = f.metadata.get(_ANCHOR)
            if anchor is not None and getattr(self, anchor) is None:
                continue
            out[f.name] = _plain(getattr(self, f.name))
        return out

    @classmethod
    def _fields_from(cls, doc: dict[str, Any]) -> dict[str, Any]:
        # A sequence field is a tuple here (frozen, as the summary made in memory), a list in JSON.
        # A class is hashable: mypy checks the instances' __hash__ against functools.cache instead.
        sequences = _sequence_fields(cls)  # type: ignore[arg-type]
        names = {f.name for f in fields(cls)}
        return {
            key: tuple(value) if key in sequences and value is not None else value
            for key, value in doc.items()
            if key in names
        }

    @classmethod
    def type_problem(cls, doc: dict[str, Any], where: str = "") -> str | None:
        """The first key of ``doc`` whose value does not fit its field's declared type, as
        ``where.key: expected …, got …``; None when every one fits. A key this version does not
        know, or one an older version did not write, is no problem (``from_json`` leaves it out or
        takes the default)."""
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            # A field without a default is in every summary any version wrote: without it none can
            # be built.
            if f.name not in doc and f.default is MISSING and f.default_factory is MISSING:
                return f"{where}{f.name}: expected {_expected(hints[f.name])}, missing"
        return next(
            (
                problem
                for f in fields(cls)
                if f.name in doc
                and (problem := _misfit(doc[f.name], hints[f.name], f"{where}{f.name}"))
            ),
            None,
        )


@functools.cache
def _sequence_fields(cls: type) -> frozenset[str]:
    """The fields of ``cls`` typed as a tuple (``tuple[str, ...] | None`` too): by type, not by
    default, since a field written only by some runs defaults to None."""
    hints = typing.get_type_hints(cls)
    return frozenset(
        f.name
        for f in fields(cls)
        if any(
            typing.get_origin(h) is tuple for h in (hints[f.name], *typing.get_args(hints[f.name]))
        )
    )


def _misfit(value: Any, hint: Any, where: str) -> str | None:
    """``where: expected …, got …`` for the deepest part of ``value``, read from JSON, that does not
    fit ``hint`` (a field's type; ``where`` names it, ``cells[3].latency.e2e`` below it); None when
    all of it fits. JSON has one number type: an integer fits a float, a boolean fits neither. Every
    number a summary types is a count, a position, a time, a rate or a share, so none is negative: a
    graded_good of -3 is no count of good answers."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        misfits = [_misfit(value, arg, where) for arg in args]
        if None in misfits:
            return None
        # A container that fits one of the types but for an item: that item is the news, not the
        # union.
        deeper = [m for m in misfits if m is not None and not m.startswith(f"{where}: ")]
        return deeper[0] if deeper else f"{where}: expected {_expected(hint)}, got {_shown(value)}"
    if origin in (tuple, list) and isinstance(value, list):
        return next(
            (m for i, v in enumerate(value) if (m := _misfit(v, args[0], f"{where}[{i}]"))), None
        )
    if origin is dict and isinstance(value, dict):
        return next(
            (m for k, v in value.items() if (m := _misfit(v, args[1], f"{where}.{k}"))), None
        )
    fits = (
        hint is Any
        or (hint is type(None) and value is None)
        or (origin is Literal and value in args)
        or (hint is bool and isinstance(value, bool))
        or (hint is str and isinstance(value, str))
        or (
            hint in (int, float)
            and isinstance(value, hint if hint is int else int | float)
            and not isinstance(value, bool)
            and value >= 0
        )
    )
    return None if fits else f"{where}: expected {_expected(hint)}, got {_shown(value)}"


def _expected(hint: Any, plural: bool = False) -> str:
    """What a field of type ``hint`` holds, in words: ``an object of numbers``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_expected(arg, plural) for arg in args)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (tuple, list):
        return f"{'lists' if plural else 'a list'} of {_expected(args[0], True)}"
    if origin is dict:
        return f"{'objects' if plural else 'an object'} of {_expected(args[1], True)}"
    words = {
        type(None): ("null", "nulls"),
        bool: ("true or false", "booleans"),
        int: ("a non-negative integer", "non-negative integers"),
        float: ("a non-negative number", "non-negative numbers"),
        str: ("a string", "strings"),
        Any: ("any value", "any values"),
    }
    if hint not in words:
        raise TypeError(f"no JSON rule for {hint!r}")  # a field of a type added without one here
    return words[hint][plural]


def _shown(value: Any) -> str:
    """A JSON value as an error message quotes it: short."""
    return shortened(json.dumps(value, ensure_ascii=False), 40, "...")


def _plain(value: Any) -> Any:
    if isinstance(value, _Json):
        return value.to_json()
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


@dataclass(frozen=True)
class CellSummary(_Json):
    """One probe × role × mode × level: what its outputs say against the serial reference, and how
    fast."""

    probe: str
    role: SampleRole
    mode: str
    concurrency: int
    rate: float | None = None  # open loop: requests/s (concurrency is then 0)
    reference_level: str | None = None
    max_in_flight: int | None = None
    ok: int = 0
    asked: int | None = None
    short: bool = False
    errors: dict[str, int] = field(default_factory=dict)
    reconnects: int | None = None  # None: a summary from before reconnects were counted
    distinct: int = 0
    modal_share: float | None = None
    new_vs_serial: int = 0
    new_vs_serial_requests: int = 0
    overlap_with_serial: float | None = None
    agrees_with_serial: bool | None = None
    divergent_requests: int = 0
    # Divergent requests by kind against the serial output; they add up to divergent_requests.
    divergence_kinds: dict[str, int] | None = None
    drift: bool = False
    # Why the cell stopped taking samples: bound, drift, cap (load.until_bound) or samples.
    stop_reason: StopReason | None = written_with("stop_reason")
    drift_rate: float | None = None
    drift_rate_upper_95: float | None = None
    first_divergence_chars: int | None = None
    last_divergence_chars: int | None = None
    first_divergence_tokens: int | None = None
    first_divergence_words: int | None = None
    modal_sha256: str | None = None
    modal_finish_reason: str | None = None
    # Text hashes, kept so a later run can ask "was this output ever seen?" without the old records.
    output_hashes: tuple[str, ...] = ()
    output_tokens: int = 0
    duration_s: float | None = None
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    # Closed-loop levels c ≥ 2, from the records' send and last-byte times: the share of the counted
    # samples' time during which c − 1 others of the level were in flight, and the counted samples
    # that never had them (absent: an open-loop or serial level, nothing to reach).
    full_load_share: float | None = written_with("samples_never_full")
    samples_never_full: int | None = written_with("samples_never_full")
    # Counted samples left out of both: they ran while requests a part of the run never recorded
    # (killed, a worker lost) may have been in flight, so their others cannot be counted (absent:
    # every request sent was recorded).
    overlap_unknown: int | None = written_with("overlap_unknown")
    # Agreement with the serial output (exact matches; token positions where tokens exist), 95 %
    # intervals.
    exact_match_rate: float | None = written_with("exact_match_rate")
    exact_match_ci95: list[float] | None = written_with("exact_match_rate")
    token_agreement: float | None = written_with("exact_match_rate")
    token_agreement_ci95: list[float] | None = written_with("exact_match_rate")
    # Logprob evidence against the serial reference; absent where no logprobs were compared.
    logprob_samples: int | None = written_with("logprob_samples")
    logprob_bitwise: bool | None = written_with("logprob_samples")
    logprob_max_abs_diff: float | None = written_with("logprob_samples")
    first_logprob_divergence_token: int | None = written_with("logprob_samples")
    # The serial text with other logprobs.
    latent_drift: bool | None = written_with("logprob_samples")
    # Where logprobs were asked for or returned: ok samples that asked and got none (or nulls only),
    # ok samples with the serial tokens but fewer logprobs than tokens whose values given agree (no
    # claim past their end), and ok samples with a logprob of -inf, inf or NaN.
    logprobs_missing: int | None = written_with("logprobs_missing")
    logprobs_partial: int | None = written_with("logprobs_missing")
    logprob_nonfinite_samples: int | None = written_with("logprobs_missing")
    # Ok samples whose answer held a value that did not fit its field (a count that is no count, a
    # logprob above 0):
    # the value was dropped, the answer compared (absent: none had one).
    findings: int | None = written_with("findings")
    # The drift example: both texts are the same window, starting at char example_offset.
    example_offset: int | None = written_with("example_offset")
    serial_example: str | None = written_with("example_offset")
    divergent_example: str | None = written_with("example_offset")
    divergent_example_kind: DivergenceKind | None = written_with("example_offset")
    serial_finish_reason: str | None = written_with("example_offset")
    divergent_finish_reason: str | None = written_with("example_offset")
    requests_per_s: float | None = written_with("requests_per_s")
    output_tokens_per_s: float | None = written_with("requests_per_s")
    # With an SLO (load.slo): requests within every bound, their share, per second, and why the
    # others missed.
    slo_met: int | None = written_with("slo_met")
    slo_attainment: float | None = written_with("slo_met")
    goodput: float | None = written_with("slo_met")
    meets_slo: bool | None = written_with("slo_met")
    slo_unmeasured: int | None = written_with("slo_met")
    slo_misses: dict[str, int] | None = written_with("slo_met")
    # The server's own view while the cell ran (its /metrics, kevload.records.servermetrics):
    # server_view says whether the run holds the server's samples (False: it published none, and the
    # fields below are None).
    server_view: bool | None = written_with("server_view")
    server_samples: int | None = written_with("server_view")
    server_running_max: float | None = written_with("server_view")
    server_running_mean: float | None = written_with("server_view")
    server_waiting_max: float | None = written_with("server_view")
    server_prefix_cache_hits: float | None = written_with("server_view")
    server_kv_cache_usage_max: float | None = written_with("server_view")
    # "server ran ≤ 1 at a time, 3 waiting: …" where the server held requests back at a level.
    server_note: str | None = written_with("server_view")
    # A conversation cell (kevload.compare.turnwise): per turn, the answers asked with the serial
    # history and how many of them differ from the serial answer; the first turn (0-based) where one
    # does: where it leaves the serial one.
    turns: tuple[dict[str, int], ...] | None = written_with("turns")
    first_divergent_turn: int | None = written_with("turns")
    # Cut by kevload (load.cancel_share, kevload.load.cancel); absent where the run cut nothing. A
    # companion cell: its requests cut. A probe cell: the requests of its level cut (counted or not)
    # while its samples ran (first send to last answer), its ok samples with such a cut in flight
    # (within beside_window_s of their send), and how many of those and of the others left the
    # serial output; whether the divergent ones were all beside a cut, unlikely by chance (the
    # one-sided Fisher p-value under kevload.compare.cuts.FINDING_P).
    cancelled: int | None = written_with("cancelled")
    beside_cancelled: int | None = written_with("cancelled")
    # A sample is beside a cut when one came within this long of its send: the cell's shortest ok
    # flight, the same time for every sample (a longer flight meets more cuts).
    beside_window_s: float | None = written_with("cancelled")
    divergent_beside_cancelled: int | None = written_with("cancelled")
    divergent_apart_from_cancelled: int | None = written_with("cancelled")
    cancel_p_value: float | None = written_with("cancelled")
    drift_only_beside_cancelled: bool | None = written_with("cancelled")
    # A graded probe's cell (kevload.compare.graded); absent for an ungraded one. Counted ok samples
    # graded good and bad (and those whose own python grader failed: neither), the good share with
    # its Wilson 95 % interval; the serial cell's grade (good, bad, or mixed: some of each); against
    # it, samples graded bad where every serial answer was good and the reverse (None at the serial
    # level itself, and where the serial answers are mixed or ungraded), with one flipped answer and
    # the serial one beside it; whether the good share meets load.min_good_share.
    graded_good: int | None = written_with("graded_good")
    graded_bad: int | None = written_with("graded_good")
    grade_failed: int | None = written_with("graded_good")
    good_share: float | None = written_with("graded_good")
    good_share_ci95: list[float] | None = written_with("graded_good")
    serial_grade: str | None = written_with("graded_good")
    flips_good_to_bad: int | None = written_with("graded_good")
    flips_bad_to_good: int | None = written_with("graded_good")
    flip_answer: str | None = written_with("flip_answer")
    flip_serial_answer: str | None = written_with("flip_answer")
    meets_good_share: bool | None = written_with("meets_good_share")

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> CellSummary:
        return cls(**cls._fields_from(doc))

    @property
    def level(self) -> str:
        """``c=4`` or ``r=5/s``."""
        return level_label(self.concurrency, self.rate)

    @property
    def level_order(self) -> tuple[int, float]:
        return level_order(self.concurrency, self.rate)

    @property
    def name(self) -> str:
        """``p1@mixed/c=4``: how summaries, baselines and logs name a cell."""
        return f"{self.probe}@{self.mode}/{self.level}"

    @property
    def label(self) -> str:
        """``p1 (mixed) c=4``: how reports name a cell."""
        return f"{self.probe} ({self.mode}) {self.level}"

    @property
    def requests(self) -> int:
        """Requests counted in the cell, failed ones included."""
        return self.ok + sum(self.errors.values())

    @property
    def logprob_gap(self) -> bool:
        """Logprobs were in play, but not every ok sample was compared: no claim of equality can be
        made."""
        return self.logprobs_missing is not None and (self.logprob_samples or 0) < self.ok


@dataclass(frozen=True)
class RunSummary(_Json):
    """The run's verdict, its counts (probes apart from companions) and its cells."""

    verdict: Verdict
    requests: int = 0
    ok: int = 0
    errors: int = 0
    errors_by_type: dict[str, int] = field(default_factory=dict)
    # Every request sent (records.jsonl's lines: warm-ups, ramp-ups and uncounted copies too), and
    # their errors.
    requests_sent: int | None = written_with("requests_sent")
    errors_sent_by_type: dict[str, int] | None = written_with("requests_sent")
    probe_requests: int = 0
    probe_errors: int = 0
    probe_error_share: float = 0.0
    probe_errors_by_type: dict[str, int] = field(default_factory=dict)
    companion_requests: int = 0
    companion_errors: int = 0
    companion_errors_by_type: dict[str, int] = field(default_factory=dict)
    max_error_share: float = 1.0
    samples_asked: int | None = None
    until_bound: float | None = written_with("until_bound")
    drift_cells: tuple[str, ...] = ()
    short_cells: tuple[str, ...] = ()
    # Probe cells the run asked for that have no counted sample at all (no cell): short too, by all
    # their samples.
    # None: the run does not list what it asked for (run.json from before it listed its probes).
    missing_cells: tuple[str, ...] | None = written_with("missing_cells")
    # Logprob evidence over the probe cells; absent where no logprobs were compared.
    logprob_samples: int | None = written_with("logprob_samples")
    latent_cells: tuple[str, ...] | None = written_with("logprob_samples")
    # Probe cells where logprobs were in play but not every ok sample was compared
    # (CellSummary.logprob_gap).
    logprob_gap_cells: tuple[str, ...] | None = written_with("logprob_gap_cells")
    matrix: dict[str, Any] = field(default_factory=dict)
    slo: dict[str, float] | None = None
    min_slo_attainment: float | None = None
    slo_failed_cells: tuple[str, ...] = ()
    # Probe cells at c > 1 whose server ran fewer requests at a time than the level while others
    # waited.
    server_limited_cells: tuple[str, ...] | None = written_with("server_limited_cells")
    cells: tuple[CellSummary, ...] = ()
    # Per probe id, what it asked (probe.probe_inputs: hashes of its input and params, its
    # max_tokens) and the hash of how it was graded, so a baseline tells a changed input from a
    # changed server and pairs graded answers only under the same grader; absent in runs from before
    # it was recorded (the grading hash: before it was apart). Under load.prefix_cache's marker
    # method the ids are the probes', not their rounds'.
    inputs: dict[str, dict[str, str | int]] | None = written_with("inputs")
    run_id: str | None = None
    scenario: str | None = None
    state: RunState | None = None
    # load.prefix_cache: how cold samples were made and each probe's cold and warm answers compared
    # (kevload.compare.coldwarm.ColdWarm); absent without it.
    prefix_cache: dict[str, Any] | None = written_with("prefix_cache")
    # … and with graded probes, those whose warm answers the cache turned bad (against their rounds'
    # cold ones).
    warm_bad_probes: tuple[str, ...] | None = written_with("prefix_cache")
    # Requests kevload cut (load.cancel_share): neither answers nor errors; absent where the run cut
    # nothing. The findings: probe cells whose divergent samples all had a cut in flight
    # (CellSummary.drift_only_beside_cancelled), and probes (``p1@mixed``) that drifted only in
    # levels with cuts while a loaded level without any held.
    cancelled: int | None = written_with("cancelled")
    drift_beside_cancelled_cells: tuple[str, ...] | None = written_with("cancelled")
    drift_with_cancelled_levels: tuple[str, ...] | None = written_with("cancelled")
    # Graded probes (kevload.compare.graded); absent without any. Per level, over the probes graded
    # there: accuracy with its interval and the paired comparison with serial (good_to_bad,
    # bad_to_good, the exact McNemar p). The probe cells where load turned a good answer bad; the
    # levels whose accuracy fell significantly (p < 0.05); the probe cells under
    # load.min_good_share; what a user's python grader did wrong (each naming its probe).
    accuracy: tuple[dict[str, Any], ...] | None = written_with("accuracy")
    bad_cells: tuple[str, ...] | None = written_with("accuracy")
    accuracy_fell_levels: tuple[str, ...] | None = written_with("accuracy")
    min_good_share: float | None = written_with("accuracy")
    good_share_failed_cells: tuple[str, ...] | None = written_with("accuracy")
    grade_errors: tuple[str, ...] | None = written_with("accuracy")

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RunSummary:
        values = cls._fields_from(doc)
        values["cells"] = tuple(CellSummary.from_json(c) for c in doc.get("cells") or ())
        return cls(**values)

    @classmethod
    def type_problem(cls, doc: dict[str, Any], where: str = "") -> str | None:
        """``_Json.type_problem`` for the run's keys and each cell's (``cells[3].latency: …``)."""
        if not isinstance(doc.get("cells", []), list):
            return f"{where}cells: expected a list of cell objects, got {_shown(doc['cells'])}"
        for i, cell in enumerate(doc.get("cells", [])):
            if not isinstance(cell, dict):
                return f"{where}cells[{i}]: expected a cell object, got {_shown(cell)}"
            problem = CellSummary.type_problem(cell, f"{where}cells[{i}].")
            if problem:
                return problem
        return super().type_problem({k: v for k, v in doc.items() if k != "cells"}, where)

    def probe_cells(self) -> tuple[CellSummary, ...]:
        """The cells the verdict is about; companion cells only shaped the batch around them."""
        return tuple(c for c in self.cells if c.role == "probe")

    def companion_cells(self) -> tuple[CellSummary, ...]:
        return tuple(c for c in self.cells if c.role != "probe")


def levels_of(cells: Iterable[CellSummary]) -> list[str]:
    """The distinct level labels of ``cells`` in matrix order: closed-loop levels, then rates."""
    return [
        c.level for c in sorted({c.level: c for c in cells}.values(), key=lambda c: c.level_order)
    ]


def held_without_cuts(row: Iterable[CellSummary]) -> list[CellSummary]:
    """One probe's cells of one mode: the loaded levels (not the serial one) that held the serial
    output with nothing cut (``load.cancel_share``), each of the same kind as and heavier than
    every level that drifted — the evidence of "drifted only in levels with cancellations". A
    lighter level that held is none: a server that drifts under heavier load, cut or not, holds
    there too."""
    ordered = sorted(row, key=lambda c: c.level_order)
    drifted = [c for c in ordered if c.drift]
    return [
        c
        for c in ordered[1:]
        if c.ok
        and not c.drift
        and c.cancelled == 0
        and all(
            d.level_order[0] == c.level_order[0] and d.level_order < c.level_order for d in drifted
        )
    ]


def answered_per_s(cell: CellSummary) -> float | None:
    """What a setting costs: the answers it gives per second. ``requests_per_s`` also counts the
    failed requests, and a dead server fails them faster than any live one answers."""
    if not cell.ok or not cell.requests_per_s:
        return None
    return round(cell.requests_per_s * cell.ok / (cell.ok + sum(cell.errors.values())), 3)


def row_cells(row: dict[str, Any]) -> list[CellSummary]:
    """A sweep row (sweep.json)'s cells, read back from what sweep.json keeps of them (probe cells
    only)."""
    return [CellSummary.from_json({"role": "probe", **cell}) for cell in row["cells"]]
