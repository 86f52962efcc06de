"""Reduce records into per-probe × concurrency uniqueness cells: distinct outputs, drift against the
serial reference, first divergence, what kind of divergence it is and the drift-rate bound a clean cell
supports.

An output is its text (``sha256``) together with its ``finish_reason``: the same text ended for a
different reason (``stop`` against ``length``) is a different answer, a divergence of kind ``finish``.

With an SLO (``load.slo``) each ok record is checked against its bounds as it is reduced, exactly, not
from the latency histograms, whose bins would blur a bound that falls inside one.

Where records carry per-token logprobs, each cell is also compared with the serial reference at the
same token positions (``LogprobTrack``): an output with the serial text but other logprobs is latent
drift — the numerics already differ, no token has flipped yet.

At a closed-loop level c ≥ 2 the (send, last byte) span of every request of the level is kept, whatever its
role and whether it counts, so each counted sample's ``full_load_share`` and ``samples_never_full`` come from
the records: how long c − 1 others were really in flight around it (``kevload.overlap``).
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import signal
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from kevload.overlap import FullLoad, Occupancy, Window
from kevload.scenario import Slo
from kevload.schedule import UntilBound
from kevload.servermetrics import Samples, cell_view
from kevload.stats import LatencyHistogram, drift_upper_bound, mean_share_interval, wilson_interval
from kevload.store import RunDirError, read_records, record_answer
from kevload.summary import CellSummary, RunSummary, level_label, level_order, levels_of
from kevload.words import DIVERGENCE_KINDS

# Below this a records file is read in-process: starting processes costs more than it saves.
_PARALLEL_BYTES = 32 << 20
# How long a reduction's process may take to exit once its part is in, before it is killed.
_EXIT_S = 5.0

LATENCY_NAMES = ("e2e", "ttft", "tpot", "itl", "lateness")
CellKey = tuple[str, str, str, int, float | None]  # probe, role, mode, concurrency, rate (open loop)
AskedCell = tuple[str, str, int, float | None]  # a probe cell a run asks for: probe, mode, concurrency, rate
# A closed-loop level as its spans are pooled: mode, concurrency. Two probes' levels of one concurrency never
# overlap in time (a level ends only when nothing it sent is in flight), so pooling them adds no "other".
SpanKey = tuple[str, int]
OutputKey = tuple[str, str | None]  # sha256 of the text, finish_reason
# Characters of context kept on each side of a divergence point for the examples in the summary.
_EXAMPLE_CONTEXT = 150
# ttft, itl, tpot, e2e bounds in seconds (inf: not bounded), and whether one of the first three is given.
SloLimits = tuple[float, float, float, float, bool]


def slo_limits(slo: Slo | None) -> SloLimits | None:
    """The SLO as the hot loop reads it: seconds, an unbounded measure as inf (a comparison that never fails)."""
    if slo is None:
        return None
    seconds = [math.inf if ms is None else ms / 1000 for ms in (slo.ttft_ms, slo.itl_ms, slo.tpot_ms, slo.e2e_ms)]
    return (*seconds, any(math.isfinite(x) for x in seconds[:3]))


# Distinct logprob vectors counted per output, to pick the serial reference's most common one; beyond
# this the vectors still widen the envelope (so every comparison stays exact) but are not counted.
_LOGPROB_VECTORS = 16
# Differing vectors folded into the envelope together: one numpy pass per batch, not per record.
_LOGPROB_BATCH = 256


class LogprobTrack:
    """The logprob vectors of one distinct output in one cell, in memory that does not grow with requests.

    Kept: how many vectors were seen and how many of each length, up to ``_LOGPROB_VECTORS`` distinct ones with
    their counts (to choose the serial reference's most common vector), and the elementwise envelope of every vector —
    minimum and maximum of the finite values, and which kinds of value (null, finite, NaN, −∞, +∞) any
    vector had there. Against any reference chosen later, the envelope gives exactly whether every
    vector is bitwise equal to it, the first position where one differs, and the largest absolute
    difference between finite values (reached at the minimum or the maximum). So records can arrive in
    any order and from any part of a split file: the comparison waits for ``summarize``, when the serial
    reference is known.
    """

    __slots__ = ("n", "vectors", "pending", "lo", "hi", "kinds", "len_min", "len_max", "lengths", "nonfinite")

    def __init__(self, vector: list, seq: int, nonfinite: bool = False) -> None:
        self.n = 1
        self.vectors: dict[tuple, list[int]] = {tuple(vector): [1, seq]}  # vector -> [count, first seq]
        # Vectors other than a counted one wait here to be folded into the envelope in one batch. The
        # envelope exists once a second, different vector was folded: until then the one counted vector
        # is the envelope, and a bitwise-stable output costs one dict lookup per record.
        self.pending: list[list] = []
        self.lo: np.ndarray | None = None
        self.hi: np.ndarray | None = None
        self.kinds: np.ndarray | None = None
        self.len_min = self.len_max = len(vector)
        self.lengths: dict[int, int] = {len(vector): 1}  # vectors by length: which cover a reference in full
        # A vector held spelled non-finite values (``store.spell_logprobs``): only then are they decoded.
        self.nonfinite = nonfinite

    def add(self, vector: list, seq: int, nonfinite: bool = False) -> None:
        self.n += 1
        self.lengths[len(vector)] = self.lengths.get(len(vector), 0) + 1
        self.nonfinite = self.nonfinite or nonfinite
        key = tuple(vector)
        entry = self.vectors.get(key)
        if entry is not None:
            entry[0] += 1
            entry[1] = min(entry[1], seq)
            return
        self._widen(vector)
        if len(self.vectors) < _LOGPROB_VECTORS:
            self.vectors[key] = [1, seq]

    def merge(self, other: LogprobTrack) -> None:
        other._flush()
        self.nonfinite = self.nonfinite or other.nonfinite
        for key, (count, seq) in other.vectors.items():
            entry = self.vectors.get(key)
            if entry is not None:
                entry[0] += count
                entry[1] = min(entry[1], seq)
                continue
            self._widen(list(key))
            if len(self.vectors) < _LOGPROB_VECTORS:
                self.vectors[key] = [count, seq]
        self._flush()
        if other.lo is not None:
            self._fold(other.lo, other.hi, other.kinds)
        self.n += other.n
        for length, count in other.lengths.items():
            self.lengths[length] = self.lengths.get(length, 0) + count
        self.len_min = min(self.len_min, other.len_min)
        self.len_max = max(self.len_max, other.len_max)

    def modal(self) -> list:
        """The most common vector counted (ties: the one seen first)."""
        return list(max(self.vectors.items(), key=lambda kv: (kv[1][0], -kv[1][1]))[0])

    def compare(self, reference: list, upto: int, same_tokens: bool) -> tuple[int | None, float | None, int]:
        """(first position < ``upto`` where a vector differs from ``reference``, largest |difference| there, how
        many vectors the comparison covers).

        ``upto``: positions whose tokens agree with the reference's. Each position is compared over the vectors
        that have it. The first position is None when every value given equals the reference's bitwise; vectors
        whose tokens leave the reference's (``same_tokens`` False) differ at the first position they stop
        agreeing. A vector with the reference's tokens but fewer entries (a server that left logprobs out) is
        no evidence past its end: while its values agree it is not covered, and the comparison makes no claim
        about it; a difference anywhere covers every vector (it is one). A position equals the reference's where
        every vector has the reference's kind there (−∞ equals −∞, NaN equals NaN, null equals null) and, for a
        finite reference, its value; the difference is taken between finite values only, since one against a
        non-finite one has no size.
        """
        self._flush()
        m = min(upto, len(reference), self.len_max)
        if self.lo is None:
            lo, hi, kinds = _envelope([next(iter(self.vectors))[:m]], self.nonfinite)
        else:
            lo, hi, kinds = self.lo[:m], self.hi[:m], self.kinds[:m]
        ref, _, ref_kinds = _envelope([reference[:m]], any(isinstance(x, str) for x in reference[:m]))
        finite = ref_kinds == _FINITE
        equal = (kinds == ref_kinds) & (~finite | ((lo == ref) & (hi == ref)))
        differs = np.flatnonzero(~equal)
        first = int(differs[0]) if differs.size else None if same_tokens else m
        both = finite & ((kinds & _FINITE) != 0)
        diff = float(np.max(np.maximum(hi[both] - ref[both], ref[both] - lo[both]))) if both.any() else None
        covered = self.n if first is not None else sum(n for length, n in self.lengths.items()
                                                        if length >= len(reference))
        return first, diff, covered

    def _widen(self, vector: list) -> None:
        self.pending.append(vector)
        self.len_min = min(self.len_min, len(vector))
        self.len_max = max(self.len_max, len(vector))
        if len(self.pending) >= _LOGPROB_BATCH:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        by_length: dict[int, list[list]] = {}
        for vector in self.pending:
            by_length.setdefault(len(vector), []).append(vector)
        self.pending = []
        for group in by_length.values():
            self._fold(*_envelope(group, self.nonfinite))

    def _fold(self, lo: np.ndarray, hi: np.ndarray, kinds: np.ndarray) -> None:
        """Widen the envelope by another one; positions only one of them has are padded neutrally."""
        if self.lo is None:
            # Until now every vector was the one counted: the envelope starts as that vector.
            self.lo, self.hi, self.kinds = _envelope([next(iter(self.vectors))], self.nonfinite)
        size = max(len(self.lo), len(lo))
        if len(self.lo) < size:
            pad = size - len(self.lo)
            self.lo = np.concatenate([self.lo, np.full(pad, np.inf)])
            self.hi = np.concatenate([self.hi, np.full(pad, -np.inf)])
            self.kinds = np.concatenate([self.kinds, np.zeros(pad, np.uint8)])
        k = len(lo)
        self.lo[:k] = np.minimum(self.lo[:k], lo)
        self.hi[:k] = np.maximum(self.hi[:k], hi)
        self.kinds[:k] |= kinds


# The kinds of value a logprob position can hold, as bits the envelope ORs over its vectors.
_NULL, _FINITE, _NAN, _NEG_INF, _POS_INF = 1, 2, 4, 8, 16


def _envelope(vectors: list, nonfinite: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectors of one length as an envelope: (min, max of the finite values, kinds seen) per position.

    A null (a token the server gave no logprob for) becomes NaN and is neutral for min and max, as are
    non-finite values. With ``nonfinite`` the vectors may hold the spellings of ``store.spell_logprobs``:
    ``float()`` reads them back, and a spelled ``"NaN"`` is kept apart from a null.
    """
    if nonfinite:
        spelled_nan = np.array([[x == "NaN" for x in v] for v in vectors], dtype=bool).reshape(len(vectors), -1)
        vectors = [[float(x) if isinstance(x, str) else x for x in v] for v in vectors]
    values = np.array(vectors, dtype=np.float64).reshape(len(vectors), -1)
    finite = np.isfinite(values)
    kinds = np.where(finite, _FINITE, np.where(np.isnan(values), _NULL, np.where(values > 0, _POS_INF, _NEG_INF)))
    if nonfinite:
        kinds = np.where(spelled_nan, _NAN, kinds)
    return (np.where(finite, values, np.inf).min(axis=0), np.where(finite, values, -np.inf).max(axis=0),
            np.bitwise_or.reduce(kinds.astype(np.uint8), axis=0))


@dataclass
class CellAccumulator:
    """Everything one cell needs, growing with distinct outputs, not with requests."""

    counts: dict[OutputKey, int] = field(default_factory=dict)
    first_seen: dict[OutputKey, int] = field(default_factory=dict)
    texts: dict[OutputKey, str] = field(default_factory=dict)
    tokens: dict[OutputKey, list] = field(default_factory=dict)
    logprobs: dict[OutputKey, LogprobTrack] = field(default_factory=dict)
    logprobs_missing: int = 0   # ok samples that asked for logprobs and got none
    logprob_nonfinite: int = 0  # ok samples with a logprob of -inf, inf or NaN
    errors: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0
    latency: dict[str, LatencyHistogram] = field(
        default_factory=lambda: {name: LatencyHistogram() for name in LATENCY_NAMES})
    output_tokens: int = 0
    max_in_flight: int | None = None  # the level's cap on requests in flight, from its records
    t_start: float = math.inf
    t_end: float = -math.inf
    slo: SloLimits | None = None
    slo_met: int = 0          # ok requests within every bound
    slo_unmeasured: int = 0   # ok requests without a first token time where a bound needs one
    slo_misses: dict[str, int] = field(default_factory=dict)  # ok requests over each bound (ttft, itl, tpot, e2e)
    # Closed-loop levels c ≥ 2: every counted request's send and last-byte time, in turn (None: nothing to check).
    spans: array | None = None

    def add(self, record: dict[str, Any]) -> None:
        # The comparator's hot loop (a million records in seconds): plain comparisons, no helpers.
        t_send, t_last = record["t_send"], record["t_last_byte"]
        spans = self.spans
        if spans is not None:
            spans.append(t_send)
            spans.append(t_last)
        if t_send < self.t_start:
            self.t_start = t_send
        if t_last > self.t_end:
            self.t_end = t_last
        self.reconnects += record.get("reconnects", 0)
        status = record["status"]
        if status != "ok":
            self.errors[status] = self.errors.get(status, 0) + 1
            return
        key = (record["sha256"], record.get("finish_reason"))
        count = self.counts.get(key)
        if count is None:
            self.counts[key] = 1
            self.first_seen[key] = record["seq"]
            self.texts[key] = record_answer(record)
            toks = record.get("token_ids") or record.get("tokens")
            if toks:
                self.tokens[key] = toks
        else:
            self.counts[key] = count + 1
        logprobs = record.get("logprobs")
        # A vector of nulls only is no logprob at all: the server gave the field, not one value in it.
        if logprobs and (logprobs[0] is not None or logprobs.count(None) < len(logprobs)):
            nonfinite = record.get("logprob_nonfinite")
            if nonfinite:
                self.logprob_nonfinite += 1
            track = self.logprobs.get(key)
            if track is None:
                self.logprobs[key] = LogprobTrack(logprobs, record["seq"], bool(nonfinite))
                if key not in self.tokens:
                    # The output's first record came without logprobs (and their tokens): line it up by this one.
                    toks = record.get("token_ids") or record.get("tokens")
                    if toks:
                        self.tokens[key] = toks
            else:
                track.add(logprobs, record["seq"], bool(nonfinite))
        else:
            asked = (record.get("params") or {}).get("logprobs")
            if asked is not None and asked is not False:  # completions' logprobs: 0 asks too
                self.logprobs_missing += 1
        tokens = record.get("completion_tokens") or 0
        self.output_tokens += tokens
        latency = self.latency
        e2e = t_last - t_send
        latency["e2e"].add(e2e)
        scheduled = record.get("t_scheduled")
        if scheduled is not None:
            # How late the client sent it: the client, not the server, is the limit when this grows.
            latency["lateness"].add(t_send - scheduled)
        t_first = record.get("t_first_token")
        chunks = record.get("chunks") or 0
        # A one-token answer has no gap between tokens: nothing in it can miss an ITL or TPOT bound.
        ttft = itl = tpot = 0.0
        streamed = t_first is not None and chunks
        # Without streaming the first token arrives with the last: TTFT and TPOT would only restate e2e.
        if streamed:
            ttft = t_first - t_send
            latency["ttft"].add(ttft)
            if (tokens or chunks) > 1:
                tpot = (t_last - t_first) / ((tokens or chunks) - 1)
                latency["tpot"].add(tpot)
            if chunks > 1:
                itl = (t_last - t_first) / (chunks - 1)
                latency["itl"].add(itl)
        slo = self.slo
        if slo is None:
            return
        ttft_max, itl_max, tpot_max, e2e_max, needs_first_token = slo
        if needs_first_token and not streamed:
            # No first token time: the request cannot be shown to meet the SLO, so it does not.
            self.slo_unmeasured += 1
            return
        if e2e <= e2e_max and ttft <= ttft_max and itl <= itl_max and tpot <= tpot_max:
            self.slo_met += 1
            return
        misses = self.slo_misses
        for name, value, limit in (("ttft", ttft, ttft_max), ("itl", itl, itl_max), ("tpot", tpot, tpot_max),
                                   ("e2e", e2e, e2e_max)):
            if value > limit:
                misses[name] = misses.get(name, 0) + 1

    def merge(self, other: CellAccumulator) -> None:
        """Fold another part of the same cell in (the parallel reader splits files)."""
        for digest, n in other.counts.items():
            self.counts[digest] = self.counts.get(digest, 0) + n
            if digest not in self.first_seen or other.first_seen[digest] < self.first_seen[digest]:
                self.first_seen[digest] = other.first_seen[digest]
                self.texts[digest] = other.texts[digest]
        for digest, toks in other.tokens.items():
            self.tokens.setdefault(digest, toks)
        for digest, track in other.logprobs.items():
            if digest in self.logprobs:
                self.logprobs[digest].merge(track)
            else:
                self.logprobs[digest] = track
        self.logprobs_missing += other.logprobs_missing
        self.logprob_nonfinite += other.logprob_nonfinite
        for status, n in other.errors.items():
            self.errors[status] = self.errors.get(status, 0) + n
        self.reconnects += other.reconnects
        for name, hist in other.latency.items():
            self.latency[name].merge(hist)
        self.output_tokens += other.output_tokens
        self.t_start = min(self.t_start, other.t_start)
        self.t_end = max(self.t_end, other.t_end)
        if self.spans is not None:
            self.spans.extend(other.spans)
        self.slo_met += other.slo_met
        self.slo_unmeasured += other.slo_unmeasured
        for name, n in other.slo_misses.items():
            self.slo_misses[name] = self.slo_misses.get(name, 0) + n

    @property
    def ok(self) -> int:
        return sum(self.counts.values())


@dataclass
class Reduction:
    cells: dict[CellKey, CellAccumulator] = field(default_factory=dict)
    records: int = 0
    # Every request on record, warm-ups and uncounted sends included: what was sent, not what is evidence.
    sent: int = 0
    sent_errors: dict[str, int] = field(default_factory=dict)
    slo: Slo | None = None
    limits: SloLimits | None = field(init=False, default=None)
    # The spans of a closed-loop level's requests that are in no cell (warm-ups, ramp-ups, tails): "others" too.
    uncounted_spans: dict[SpanKey, array] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.limits = slo_limits(self.slo)

    def add(self, record: dict[str, Any]) -> None:
        self.sent += 1
        status = record["status"]
        if status != "ok":
            self.sent_errors[status] = self.sent_errors.get(status, 0) + 1
        # Warm-ups and sends below full load (a level's ramp-up) are on record but are no evidence.
        if record.get("role") == "warmup" or record.get("counted") is False:
            if record["concurrency"] > 1 and record.get("rate") is None:
                level = (record["mode"], record["concurrency"])
                spans = self.uncounted_spans.get(level)
                if spans is None:
                    spans = self.uncounted_spans[level] = array("d")
                spans.append(record["t_send"])
                spans.append(record["t_last_byte"])
            return
        key = (record["probe"], record["role"], record["mode"], record["concurrency"], record.get("rate"))
        cell = self.cells.get(key)
        if cell is None:
            cell = self.cells[key] = CellAccumulator(
                max_in_flight=record.get("max_in_flight"), slo=self.limits,
                spans=array("d") if record["concurrency"] > 1 and record.get("rate") is None else None)
        cell.add(record)
        self.records += 1

    def merge(self, other: Reduction) -> None:
        for key, cell in other.cells.items():
            if key in self.cells:
                self.cells[key].merge(cell)
            else:
                self.cells[key] = cell
        self.records += other.records
        self.sent += other.sent
        for status, n in other.sent_errors.items():
            self.sent_errors[status] = self.sent_errors.get(status, 0) + n
        for level, spans in other.uncounted_spans.items():
            self.uncounted_spans.setdefault(level, array("d")).extend(spans)


def reduce_file(path: Path, workers: int | None = None, *, slo: Slo | None = None) -> Reduction:
    """Reduce a records file; large files are split at line boundaries and read by parallel processes."""
    workers = workers or os.cpu_count() or 1
    size = path.stat().st_size
    if workers < 2 or size < _PARALLEL_BYTES:
        return reduce_records(read_records(path), slo=slo)
    cuts = _line_cuts(path, size, workers)
    ranges = [(str(path), start, end, end == size, slo) for start, end in zip(cuts, cuts[1:], strict=False)]
    parts = _reduce_ranges(ranges)
    total = parts[0]
    for part in parts[1:]:
        total.merge(part)
    return total


def reduce_records(records: Iterable[dict[str, Any]], *, slo: Slo | None = None) -> Reduction:
    reduction = Reduction(slo=slo)
    for record in records:
        reduction.add(record)
    return reduction


def summarize(reduction: Reduction, *, max_error_share: float = 1.0,
              samples_asked: int | None = None, min_slo_attainment: float | None = None,
              until_bound: float | None = None, max_samples: int = 1000,
              server: Samples | None = None, asked_cells: Iterable[AskedCell] | None = None,
              unrecorded: list[Window] | None = None) -> RunSummary:
    """The summary: ``cells`` (one per probe × role × mode × level), ``matrix`` and ``verdict``.

    The error share and the target-failed rule count probe requests only: companions only shape
    the batch, and their successes must not dilute the probe's failures. ``samples_asked`` is the
    probe samples each cell was asked for (``load.samples``; None when a level runs for a duration
    instead): a probe cell with fewer ok samples is ``short`` and the run cannot be ``deterministic``.
    ``asked_cells`` are the probe cells the run asked for (probe, mode, concurrency, rate): one with no counted
    sample at all has no cell, and is named in ``missing_cells`` (a run stopped before it, a level too short to
    send anything); None when the run does not say (then only the cells on record are known).

    Verdicts: ``target_failed`` (a probe cell whose counted requests all failed, or the probe error share over
    ``max_error_share``) · ``nondeterministic`` (a probe cell drifts; drift seen is drift, however few samples) ·
    ``inconclusive`` (no drift, but a probe cell is short of samples, an asked one is missing, or no probe
    request was counted at all: nothing failed, nothing was measured) · ``deterministic``.

    With an SLO (the reduction's ``slo``) every cell has ``slo_attainment`` (requests within every bound
    over all its requests, failed ones included: a failed request met nothing) and ``goodput`` (those
    requests per second of the cell's duration); a probe cell under ``min_slo_attainment`` is named in
    ``slo_failed_cells``. The verdict stays about determinism: the SLO is a separate gate.

    Each probe cell says why it stopped (``stop_reason``): with ``until_bound`` (``load.until_bound``,
    ``load.max_samples``) the strategy's own rule, asked of the cell's records; without it ``samples``.

    Each cell of a closed-loop level c ≥ 2 has ``full_load_share`` and ``samples_never_full`` (``full_load_fields``);
    ``unrecorded`` are the stretches in which requests the records miss may have run (``overlap.unrecorded_windows``;
    None: the run recorded every request it sent, or does not say), whose samples are ``overlap_unknown`` instead.

    ``server`` is what the server's ``/metrics`` said during the run (``servermetrics.read_samples``): each
    cell gets the ``server_*`` fields of its own time window, from its first counted send to its last answer.
    """
    until = UntilBound(until_bound, samples_asked or 1, max_samples) if until_bound else None
    full_loads = full_load_by_cell(reduction, unrecorded)
    cells: list[CellSummary] = []
    groups: dict[tuple[str, str, str], list[tuple[int, float | None]]] = {}
    for probe, role, mode, level, rate in reduction.cells:
        groups.setdefault((probe, role, mode), []).append((level, rate))
    for (probe, role, mode), levels in sorted(groups.items(), key=lambda g: (g[0][1] != "probe", g[0])):
        levels.sort(key=lambda lv: level_order(*lv))
        reference = reduction.cells[(probe, role, mode, *levels[0])]
        serial_modal = _modal(reference)
        asked = samples_asked if role == "probe" else None
        for level in levels:
            cell = reduction.cells[(probe, role, mode, *level)]
            summary = _cell_summary(probe, role, mode, level, levels[0], cell, reference, serial_modal,
                                    asked=asked, min_slo_attainment=min_slo_attainment)
            cells.append(replace(summary, stop_reason=stop_reason(summary, until),
                                 **full_load_fields(full_loads.get((probe, role, mode, *level))),
                                 **cell_view(server, cell.t_start, cell.t_end, level[0])))
    probe_cells = [c for c in cells if c.role == "probe"]
    companion_cells = [c for c in cells if c.role != "probe"]
    probe_requests = sum(c.requests for c in probe_cells)
    probe_errors = probe_requests - sum(c.ok for c in probe_cells)
    companion_requests = sum(c.requests for c in companion_cells)
    companion_errors = companion_requests - sum(c.ok for c in companion_cells)
    probe_error_share = probe_errors / probe_requests if probe_requests else 0.0
    drift = [c for c in probe_cells if c.drift]
    short = [c for c in probe_cells if c.short]
    latent = [c for c in probe_cells if c.latent_drift]
    compared = any(c.logprob_samples for c in probe_cells)
    missing = None if asked_cells is None else tuple(
        f"{probe}@{mode}/{level_label(concurrency, rate)}" for probe, mode, concurrency, rate in asked_cells
        if (probe, "probe", mode, concurrency, rate) not in reduction.cells)
    if probe_error_share > max_error_share or any(c.ok == 0 for c in probe_cells):
        verdict = "target_failed"
    elif drift:
        verdict = "nondeterministic"
    elif short or missing or not probe_requests:
        verdict = "inconclusive"
    else:
        verdict = "deterministic"
    return RunSummary(
        verdict=verdict,
        requests=probe_requests + companion_requests,
        ok=sum(c.ok for c in cells),
        errors=probe_errors + companion_errors,
        errors_by_type=_merge_counts(c.errors for c in cells),
        requests_sent=reduction.sent,
        errors_sent_by_type=dict(sorted(reduction.sent_errors.items())),
        probe_requests=probe_requests,
        probe_errors=probe_errors,
        probe_error_share=round(probe_error_share, 6),
        probe_errors_by_type=_merge_counts(c.errors for c in probe_cells),
        companion_requests=companion_requests,
        companion_errors=companion_errors,
        companion_errors_by_type=_merge_counts(c.errors for c in companion_cells),
        max_error_share=max_error_share,
        samples_asked=samples_asked,
        until_bound=until_bound,
        drift_cells=tuple(c.name for c in drift),
        short_cells=tuple(c.name for c in short),
        missing_cells=missing,
        # Same text as serial, other logprobs: no verdict of its own (exit 1 only with --fail-on latent).
        latent_cells=tuple(c.name for c in latent) if compared else None,
        logprob_gap_cells=tuple(c.name for c in probe_cells if c.logprob_gap)
        if any(c.logprobs_missing is not None for c in probe_cells) else None,
        logprob_samples=sum(c.logprob_samples or 0 for c in probe_cells) if compared else None,
        matrix=distinct_matrix(probe_cells),
        slo=reduction.slo.bounds() if reduction.slo else None,
        min_slo_attainment=min_slo_attainment if reduction.slo else None,
        # Only an explicit minimum gates: without one the SLO is measured, not enforced.
        slo_failed_cells=tuple(c.name for c in probe_cells if min_slo_attainment is not None
                               and reduction.slo and not c.meets_slo),
        server_limited_cells=tuple(c.name for c in probe_cells if c.server_note),
        cells=tuple(cells),
    )


def distinct_matrix(cells: list[CellSummary]) -> dict[str, Any]:
    """Probes × levels of distinct-output counts (-1 where a cell has no ok sample), as nested lists,
    with the ok samples behind each count and whether the cell is short of the samples asked and whether
    it shows latent drift, and its counted samples that never had c − 1 others in flight (None: not a closed-loop
    level c ≥ 2)."""
    rows = sorted({(c.probe, c.mode) for c in cells})
    levels = levels_of(cells)
    distinct = np.full((len(rows), len(levels)), -1, dtype=np.int64)
    ok = np.zeros((len(rows), len(levels)), dtype=np.int64)
    drift = np.zeros((len(rows), len(levels)), dtype=bool)
    short = np.zeros((len(rows), len(levels)), dtype=bool)
    latent = np.zeros((len(rows), len(levels)), dtype=bool)
    never_full: list[list[int | None]] = [[None] * len(levels) for _ in rows]
    row_of = {r: i for i, r in enumerate(rows)}
    col_of = {lv: j for j, lv in enumerate(levels)}
    for c in cells:
        i, j = row_of[(c.probe, c.mode)], col_of[c.level]
        distinct[i, j] = c.distinct if c.ok else -1
        ok[i, j] = c.ok
        drift[i, j] = c.drift
        short[i, j] = c.short
        latent[i, j] = bool(c.latent_drift)
        never_full[i][j] = c.samples_never_full
    return {
        "rows": [{"probe": p, "mode": m} for p, m in rows],
        "levels": levels,
        "distinct": distinct.tolist(),
        "ok": ok.tolist(),
        "drift": drift.tolist(),
        "short": short.tolist(),
        "latent": latent.tolist(),
        "samples_never_full": never_full,
    }


def divergence_kind(reference: str, other: str, reference_finish: str | None = None,
                    other_finish: str | None = None) -> str:
    """How ``other`` differs from the serial ``reference`` output.

    ``finish``: the same text, ended for another reason (``finish_reason``). ``length``: one text is a
    proper prefix of the other (stop / max_tokens handling leaking between requests). ``token``: they
    differ inside their common length (numerics, sampling), or outside the text itself when text and
    finish_reason are both the same (a hash over more than the text).
    """
    if reference == other:
        return "finish" if reference_finish != other_finish else "token"
    return "length" if common_prefix_length(reference, other) == min(len(reference), len(other)) else "token"


def first_divergence_word(reference: str, other: str, chars: int) -> int:
    """Index of the first whitespace-separated word that differs, given the first differing char.

    The words wholly inside the common prefix agree; the last word of the prefix agrees only when
    both texts end a word right there (whitespace or the end of the text). Otherwise the divergence
    falls inside that word, and it is the first one to differ.
    """
    prefix = reference[:chars]
    words = len(prefix.split())
    if prefix and not prefix[-1].isspace() and not (_word_ends(reference, chars) and _word_ends(other, chars)):
        words -= 1
    return words


def _word_ends(text: str, at: int) -> bool:
    return at >= len(text) or text[at].isspace()


def common_prefix_length(a: str | list, b: str | list) -> int:
    """Index of the first differing element (chars or tokens); the shorter length when one extends the other."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    if isinstance(a, str):
        if a[:n] == b[:n]:
            return n
        lo, hi = 0, n  # binary search on slice equality: C-speed compares, O(log n) of them
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if a[:mid] == b[:mid]:
                lo = mid
            else:
                hi = mid - 1
        return lo
    left, right = np.asarray(a[:n], dtype=object), np.asarray(b[:n], dtype=object)
    diff = np.flatnonzero(left != right)
    return int(diff[0]) if diff.size else n


def _cell_summary(probe: str, role: str, mode: str, level: tuple[int, float | None],
                  ref_level: tuple[int, float | None], cell: CellAccumulator, reference: CellAccumulator,
                  serial_modal: OutputKey | None, *, asked: int | None,
                  min_slo_attainment: float | None = None) -> CellSummary:
    ok = cell.ok
    counts = np.fromiter(cell.counts.values(), dtype=np.int64, count=len(cell.counts))
    modal = _modal(cell)
    serial_set = reference.counts.keys()
    unseen = [h for h in cell.counts if h not in serial_set]
    unseen_requests = sum(cell.counts[h] for h in unseen)
    divergent = 0 if serial_modal is None else ok - cell.counts.get(serial_modal, 0)
    drift = ok > 0 and (len(cell.counts) > 1 or divergent > 0)
    by_digest: dict[str, int] = {}
    for (digest, _finish), n in cell.counts.items():
        by_digest[digest] = by_digest.get(digest, 0) + n
    out: dict[str, Any] = {
        "probe": probe,
        "role": role,
        "mode": mode,
        "concurrency": level[0],
        "rate": level[1],
        "reference_level": level_label(*ref_level),
        "max_in_flight": cell.max_in_flight,
        "ok": ok,
        "asked": asked,
        "short": asked is not None and ok < asked,
        "errors": dict(sorted(cell.errors.items())),
        "reconnects": cell.reconnects,
        "distinct": len(cell.counts),
        "modal_share": round(float(counts.max()) / ok, 6) if ok else None,
        "new_vs_serial": len(unseen),
        "new_vs_serial_requests": unseen_requests,
        "overlap_with_serial": round((ok - unseen_requests) / ok, 6) if ok else None,
        "agrees_with_serial": modal == serial_modal if ok else None,
        "divergent_requests": divergent,
        "divergence_kinds": dict.fromkeys(DIVERGENCE_KINDS, 0),
        "drift": drift,
        "drift_rate": round(divergent / ok, 6) if ok and level != ref_level else None,
        "drift_rate_upper_95": round(drift_upper_bound(ok), 6) if ok and not drift else None,
        "first_divergence_chars": None,
        "last_divergence_chars": None,
        "first_divergence_tokens": None,
        "first_divergence_words": None,
        "modal_sha256": modal[0] if modal else None,
        "modal_finish_reason": modal[1] if modal else None,
        "output_hashes": tuple(sorted(by_digest, key=lambda h: -by_digest[h])[:256]),
        "output_tokens": cell.output_tokens,
        "duration_s": round(cell.t_end - cell.t_start, 6) if ok + sum(cell.errors.values()) else None,
        "latency": {name: hist.summary() for name, hist in sorted(cell.latency.items()) if hist.n_total},
    }
    if drift and serial_modal is not None and divergent:
        out.update(_divergence(cell, reference.texts[serial_modal], reference.tokens.get(serial_modal), serial_modal))
    out.update(_agreement(cell, reference, serial_modal))
    out.update(_logprob_agreement(cell, reference, serial_modal))
    # Latent drift: every output has the serial text, yet the logprobs behind it differ. No claim either
    # way where the logprobs make none (too few of the cell's samples had them, all alike).
    out["latent_drift"] = (None if out["logprob_bitwise"] is None
                           else bool(ok and not drift and not out["logprob_bitwise"]))
    if out["duration_s"]:
        out["requests_per_s"] = round((ok + sum(cell.errors.values())) / out["duration_s"], 3)
        out["output_tokens_per_s"] = round(cell.output_tokens / out["duration_s"], 3)
    if cell.slo is not None:
        out.update(slo_fields(cell.slo_met, ok + sum(cell.errors.values()), out["duration_s"], min_slo_attainment))
        out["slo_unmeasured"] = cell.slo_unmeasured
        out["slo_misses"] = dict(sorted(cell.slo_misses.items()))
    return CellSummary(**out)


def stop_reason(cell: CellSummary, until: UntilBound | None) -> str | None:
    """Why a probe cell stopped taking samples: ``bound``, ``drift``, ``cap`` (``load.until_bound``) or
    ``samples`` (it had ``load.samples``); None for companion cells, a level run for a duration, or a
    cell the run was stopped in before its rule ended it."""
    if cell.role != "probe":
        return None
    errors = sum(cell.errors.values())
    if until is not None:
        return until.reason(cell.requests, errors, cell.drift)
    return "samples" if cell.asked is not None and cell.requests >= cell.asked else None


def full_load_by_cell(reduction: Reduction, unrecorded: list[Window] | None = None) -> dict[CellKey, FullLoad]:
    """Each cell of a closed-loop level c ≥ 2 against every request of its level: its cells' counted spans
    (probes and companions) and its uncounted ones (warm-ups, ramp-ups, tails), from every records file reduced;
    its samples in an ``unrecorded`` window are left unknown. One level's occupancy at a time: memory follows the
    largest level, not the run."""
    by_level: dict[SpanKey, list[CellKey]] = {}
    for key, cell in reduction.cells.items():
        if cell.spans is not None:
            by_level.setdefault((key[2], key[3]), []).append(key)
    out: dict[CellKey, FullLoad] = {}
    for level, keys in by_level.items():
        parts = [reduction.cells[key].spans for key in keys]
        if level in reduction.uncounted_spans:
            parts.append(reduction.uncounted_spans[level])
        occupancy = Occupancy.of(np.concatenate([_span_rows(spans) for spans in parts]), level[1])
        for key in keys:
            out[key] = occupancy.full_load(_span_rows(reduction.cells[key].spans), unrecorded)
    return out


def full_load_fields(full: FullLoad | None) -> dict[str, Any]:
    """``full_load_share``: the share of the cell's counted samples' time during which c − 1 other requests of
    the level were in flight; ``samples_never_full``: its counted samples that never had them; both over the
    samples whose others the records hold, ``overlap_unknown`` counting the rest. None at an open-loop level (no c
    to reach) and at c = 1 (no others to have: a serial sample is trivially full)."""
    if full is None:
        return {"full_load_share": None, "samples_never_full": None, "overlap_unknown": None}
    return {"full_load_share": None if full.share is None else round(full.share, 6),
            "samples_never_full": full.never_full, "overlap_unknown": full.unknown}


def _span_rows(spans: array) -> np.ndarray:
    return np.frombuffer(spans, dtype=np.float64).reshape(-1, 2)


def slo_fields(met: int, requests: int, duration_s: float | None,
               min_attainment: float | None) -> dict[str, Any]:
    """A cell's SLO numbers. Attainment counts failed requests in its denominator (they met no bound);
    goodput is over the cell's duration, like requests_per_s. A level meets the SLO at attainment ≥ the
    minimum, or at 1.0 when none is given: no slack the user did not write down."""
    attainment = met / requests if requests else 0.0
    threshold = 1.0 if min_attainment is None else min_attainment
    return {"slo_met": met, "slo_attainment": round(attainment, 6),
            "goodput": round(met / duration_s, 3) if duration_s else None,
            "meets_slo": attainment >= threshold}


def _agreement(cell: CellAccumulator, reference: CellAccumulator, serial: OutputKey | None) -> dict[str, Any]:
    """How often and how far the cell's outputs agree with the serial one, with 95 % intervals.

    ``exact_match_rate``: share of ok samples whose output is the serial output (Wilson interval).
    ``token_agreement``: per sample, the share of token positions equal to the serial output's before
    the first divergence (common prefix over the longer length), averaged over the samples that have
    tokens (interval: ``stats.mean_share_interval``).
    """
    ok = cell.ok
    out: dict[str, Any] = {"exact_match_rate": None, "exact_match_ci95": None,
                           "token_agreement": None, "token_agreement_ci95": None}
    if not ok or serial is None:
        return out
    matches = cell.counts.get(serial, 0)
    out["exact_match_rate"] = round(matches / ok, 6)
    out["exact_match_ci95"] = [round(x, 6) for x in wilson_interval(matches, ok)]
    ref_tokens = reference.tokens.get(serial)
    if not ref_tokens:
        return out
    shares = []
    for key, n in cell.counts.items():
        if key == serial:
            shares.append((1.0, n))
        elif key in cell.tokens:
            tokens = cell.tokens[key]
            shares.append((common_prefix_length(ref_tokens, tokens) / max(len(ref_tokens), len(tokens)), n))
    interval = mean_share_interval(shares)
    if interval is not None:
        out["token_agreement"] = round(interval[0], 6)
        out["token_agreement_ci95"] = [round(interval[1], 6), round(interval[2], 6)]
    return out


def _logprob_agreement(cell: CellAccumulator, reference: CellAccumulator,
                       serial: OutputKey | None) -> dict[str, Any]:
    """The cell's logprobs against the serial reference's at the same token positions.

    The reference is the most common logprob vector of the serial output in the serial cell. Each
    output is compared where its tokens agree with the serial tokens (an output with the serial text
    everywhere; another output up to its first differing token, where it counts as differing).
    """
    out: dict[str, Any] = {"logprob_samples": None, "logprob_bitwise": None, "logprob_max_abs_diff": None,
                           "first_logprob_divergence_token": None, "logprobs_missing": None,
                           "logprobs_partial": None, "logprob_nonfinite_samples": None}
    if cell.logprobs or cell.logprobs_missing:
        out["logprobs_missing"] = cell.logprobs_missing
        out["logprob_nonfinite_samples"] = cell.logprob_nonfinite
    if serial is None or serial not in reference.logprobs:
        return out
    ref = reference.logprobs[serial].modal()
    ref_tokens = reference.tokens.get(serial)
    samples, partial, firsts, diffs = 0, 0, [], []
    for key, track in cell.logprobs.items():
        tokens = cell.tokens.get(key)
        if ref_tokens and tokens:
            upto = common_prefix_length(ref_tokens, tokens)
            # The serial text whose tokens (read from its logprobs) stop early has the serial tokens, not others.
            same = tokens == ref_tokens or key == serial and upto == min(len(tokens), len(ref_tokens))
            upto = len(ref_tokens) if same else upto
        elif key == serial:
            upto, same = len(ref), True
        else:
            continue  # another output without tokens: its positions cannot be lined up with the serial ones
        first, diff, covered = track.compare(ref, upto, same)
        samples += covered
        partial += track.n - covered
        if first is not None:
            firsts.append(first)
        if diff is not None:
            diffs.append(diff)
    out["logprobs_partial"] = partial if out["logprobs_missing"] is not None else None
    if samples:
        out["logprob_samples"] = samples
        # A difference among the compared samples is evidence whatever the others hold; equality is
        # claimed only over every ok sample of the cell, never over the ones that happened to have logprobs.
        out["logprob_bitwise"] = False if firsts else True if samples == cell.ok else None
        out["logprob_max_abs_diff"] = max(diffs) if diffs else None
        out["first_logprob_divergence_token"] = min(firsts) if firsts else None
    return out


def _divergence(cell: CellAccumulator, ref_text: str, ref_tokens: list | None,
                serial: OutputKey) -> dict[str, Any]:
    """Where and how each output other than the serial one leaves it, and the example that shows it.

    The example is the output that leaves the serial one first (ties: the one seen first), so the
    divergence point stated for the cell is the one the example shows.
    """
    kinds = dict.fromkeys(DIVERGENCE_KINDS, 0)
    points: list[tuple[int, int, OutputKey, str]] = []  # chars, first seen, output, kind
    words, toks = [], []
    for key, n in cell.counts.items():
        if key == serial:
            continue
        text = cell.texts[key]
        at = common_prefix_length(ref_text, text)
        kind = divergence_kind(ref_text, text, serial[1], key[1])
        kinds[kind] += n
        points.append((at, cell.first_seen[key], key, kind))
        # Words: a token-like position for servers that return no token ids (transformers serve).
        words.append(first_divergence_word(ref_text, text, at))
        if ref_tokens and key in cell.tokens:
            toks.append(common_prefix_length(ref_tokens, cell.tokens[key]))
    at, _, example, kind = min(points)
    offset = max(0, at - _EXAMPLE_CONTEXT)
    window = slice(offset, offset + 2 * _EXAMPLE_CONTEXT)
    return {
        "divergence_kinds": kinds,
        "first_divergence_chars": at,
        "last_divergence_chars": max(p[0] for p in points),
        "first_divergence_words": min(words),
        "first_divergence_tokens": min(toks) if toks else None,
        # Both examples are the same window of their texts, starting at char ``example_offset``.
        "example_offset": offset,
        "serial_example": ref_text[window],
        "divergent_example": cell.texts[example][window],
        "divergent_example_kind": kind,
        "serial_finish_reason": serial[1],
        "divergent_finish_reason": example[1],
    }


def _modal(cell: CellAccumulator) -> OutputKey | None:
    """Most common output; ties go to the one seen first, so the choice is reproducible."""
    if not cell.counts:
        return None
    return max(cell.counts, key=lambda h: (cell.counts[h], -cell.first_seen[h]))


def _line_cuts(path: Path, size: int, parts: int) -> list[int]:
    """Byte offsets that split the file into ``parts`` pieces, each starting at a line."""
    cuts = [0]
    with path.open("rb") as handle:
        for i in range(1, parts):
            handle.seek(size * i // parts)
            handle.readline()
            position = handle.tell()
            if cuts[-1] < position < size:
                cuts.append(position)
    return cuts + [size]


def _reduce_ranges(ranges: list[tuple[str, int, int, bool, Slo | None]]) -> list[Reduction]:
    """Each range reduced in a process of its own, in order; a range whose process died is reduced here.

    Spawned, never forked: this runs inside the run's event loop, and a fork would inherit its signal
    handling (a caught SIGTERM, so terminating the child does nothing) and the locks its threads hold. Every
    wait is bounded: a part arrives or its process's end closes the pipe, and each process is joined with a
    timeout, then killed.
    """
    context = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    try:
        for args in ranges:
            receive, send = context.Pipe(duplex=False)
            proc = context.Process(target=_range_main, args=(send, args), name="kevload-reduce", daemon=True)
            proc.start()
            send.close()  # the child holds the only write end: its end, however it comes, is an EOF here
            pipes.append(receive)
            procs.append(proc)
        answers: dict[int, tuple[Reduction | None, RunDirError | None] | None] = {}
        while len(answers) < len(pipes):
            for pipe in multiprocessing.connection.wait([p for i, p in enumerate(pipes) if i not in answers]):
                index = pipes.index(pipe)
                try:
                    answers[index] = pipe.recv()
                except EOFError:
                    answers[index] = None  # the process died before its part was in (OOM killer, kill -9)
    except BaseException:  # a second Ctrl-C, say: nobody waits for the parts any more
        for proc in procs:
            proc.kill()
        raise
    finally:
        for proc in procs:
            proc.join(timeout=_EXIT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for pipe in pipes:
            pipe.close()
    parts = []
    for index, args in enumerate(ranges):
        answer = answers[index]
        if answer is None:
            parts.append(_reduce_range(*args))
            continue
        part, error = answer
        if error is not None:
            raise error
        parts.append(part)
    return parts


def _range_main(pipe: multiprocessing.connection.Connection, args: tuple[str, int, int, bool, Slo | None]) -> None:
    # The run's process owns stops: a Ctrl-C or SIGTERM to the process group must not end a part of its summary.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        pipe.send((_reduce_range(*args), None))
    except RunDirError as exc:
        pipe.send((None, exc))


def _reduce_range(path: str, start: int, end: int, is_last: bool, slo: Slo | None) -> Reduction:
    reduction = Reduction(slo=slo)
    with open(path, "rb") as handle:
        handle.seek(start)
        position = start
        while position < end:
            line = handle.readline()
            position += len(line)
            try:
                reduction.add(orjson.loads(line))
            except orjson.JSONDecodeError:
                # Only the file's very last line may be torn (a run killed mid-write).
                if not (is_last and position >= end):
                    raise RunDirError(f"{path}: a record near byte {position} is not JSON") from None
    return reduction


def _merge_counts(items: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for counts in items:
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value
    return dict(sorted(total.items()))
