"""Per-cell accumulation: records folded one at a time into probe × role × mode × level cells whose
memory grows with distinct outputs, not with requests; parts of a split file merge.

An output is its text (``sha256``) together with its ``finish_reason``: the same text ended for a
different reason (``stop`` against ``length``) is a different answer. With an SLO each ok record is
checked against its bounds as it is added, exactly, not from the latency histograms, whose bins
would blur a bound that falls inside one. At a closed-loop level c ≥ 2 the (send, last byte) span of
every request of the level is kept, whatever its role and whether it counts, so each counted
sample's full load comes from the records (``kevload.compare.overlap``).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

import msgspec
import numpy as np

from kevload.compare.envelope import LogprobTrack
from kevload.compare.overlap import FullLoad, Occupancy, Window
from kevload.compare.stats import LatencyHistogram
from kevload.compare.turnwise import TurnAnswer
from kevload.inputs.conversation import as_received, ends_sample, transcript
from kevload.inputs.scenariokeys import Slo
from kevload.inputs.wordsets import CANCELLED
from kevload.records.store import Record, counts_in_cell

LATENCY_NAMES = ("e2e", "ttft", "tpot", "itl", "lateness")
CellKey = tuple[
    str, str, str, int, float | None
]  # probe, role, mode, concurrency, rate (open loop)
# A conversation's turn kept until its sample ends: (turn, its answer given its history or None, the
# text received, its output tokens, its send, the SLO bounds it missed: ``slo_missed``).
KeptTurn = tuple[int, TurnAnswer | None, str, int, float, tuple[str, ...]]
# A closed-loop level as its spans are pooled: mode, concurrency. Two probes' levels of one
# concurrency never overlap in time (a level ends only when nothing it sent is in flight), so
# pooling them adds no "other".
SpanKey = tuple[str, int]
OutputKey = tuple[
    str | None, str | None
]  # sha256 of the text (None: a record without one), finish_reason
# An output's tokens: their ids where the server gave them, else their texts.
Tokens = list[int] | list[str]
# A level as its cuts are pooled: mode, concurrency, rate. Levels of one key never overlap in time
# (as SpanKey).
CutKey = tuple[str, int, float | None]
# ttft, itl, tpot, e2e bounds in seconds (inf: not bounded), and whether one of the first three is
# given.
SloLimits = tuple[float, float, float, float, bool]


@dataclass
class CellAccumulator:
    """Everything one cell needs, growing with distinct outputs, not with requests."""

    counts: dict[OutputKey, int] = field(default_factory=dict)
    first_seen: dict[OutputKey, int] = field(default_factory=dict)
    texts: dict[OutputKey, str] = field(default_factory=dict)
    tokens: dict[OutputKey, Tokens] = field(default_factory=dict)
    logprobs: dict[OutputKey, LogprobTrack] = field(default_factory=dict)
    logprobs_missing: int = 0  # ok samples that asked for logprobs and got none
    logprob_nonfinite: int = 0  # ok samples with a logprob of -inf, inf or NaN
    errors: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0
    latency: dict[str, LatencyHistogram] = field(
        default_factory=lambda: {name: LatencyHistogram() for name in LATENCY_NAMES}
    )
    output_tokens: int = 0
    max_in_flight: int | None = None  # the level's cap on requests in flight, from its records
    t_start: float = math.inf
    t_end: float = -math.inf
    slo: SloLimits | None = None
    slo_met: int = 0  # ok requests within every bound
    slo_unmeasured: int = 0  # ok requests without a first token time where a bound needs one
    slo_misses: dict[str, int] = field(
        default_factory=dict
    )  # ok requests over each bound (ttft, itl, tpot, e2e)
    # Closed-loop levels c ≥ 2: every counted request's send and last-byte time, in turn (None:
    # nothing to check).
    spans: array[float] | None = None
    cancelled: int = 0  # requests kevload cut (load.cancel_share): neither answers nor errors
    # ok requests whose answer held a value that did not fit its field (Record.findings)
    findings: int = 0
    # Probe cells: each ok sample's send and last-byte time, in turn, and its output beside it, so
    # that the samples with a cut of their level in flight can be told from the others
    # (kevload.compare.cuts.beside_cuts).
    sample_spans: array[float] | None = None
    sample_outputs: list[OutputKey] | None = None

    def add(self, record: Record) -> None:
        """One record folded in. The comparator's hot loop (a million records in seconds): plain
        comparisons, the common path inline; what fewer records take (an error, a new output,
        logprobs, an SLO) in helpers."""
        t_send, t_last = record.t_send, record.t_last_byte
        spans = self.spans
        if spans is not None:
            spans.append(t_send)
            spans.append(t_last)
        if t_send < self.t_start:
            self.t_start = t_send
        if t_last > self.t_end:
            self.t_end = t_last
        self.reconnects += record.reconnects
        if record.status != "ok":
            self._failed(record.status)
            return
        if record.findings:
            self.findings += 1
        key = (record.sha256, record.finish_reason)
        count = self.counts.get(key)
        if count is None:
            self._first(key, record)
        else:
            self.counts[key] = count + 1
        if self.sample_outputs is not None:
            self._sample(t_send, t_last, key)
        if not (record.logprobs and self._logprobs(key, record)):
            asked = record.params.get("logprobs")
            if asked is not None and asked is not False:  # completions' logprobs: 0 asks too
                self.logprobs_missing += 1
        tokens = record.completion_tokens or 0
        self.output_tokens += tokens
        latency = self.latency
        e2e = t_last - t_send
        latency["e2e"].add(e2e)
        if record.t_scheduled is not None:
            # How late the client sent it: the client, not the server, is the limit when this grows.
            latency["lateness"].add(t_send - record.t_scheduled)
        t_first, chunks = record.t_first_token, record.chunks
        # A one-token answer has no gap between tokens: nothing in it can miss an ITL or TPOT bound.
        ttft = itl = tpot = 0.0
        # Without streaming the first token comes with the last: TTFT and TPOT would restate e2e.
        if streamed := (t_first is not None and chunks > 0):
            ttft = t_first - t_send
            latency["ttft"].add(ttft)
            if (tokens or chunks) > 1:
                tpot = (t_last - t_first) / ((tokens or chunks) - 1)
                latency["tpot"].add(tpot)
            if chunks > 1:
                itl = (t_last - t_first) / (chunks - 1)
                latency["itl"].add(itl)
        if self.slo is not None:
            self._slo_check(streamed, ttft, itl, tpot, e2e)

    def _slo_check(self, streamed: bool, ttft: float, itl: float, tpot: float, e2e: float) -> None:
        """Whether an ok record met the SLO, or which bounds it missed."""
        assert self.slo is not None  # add's check
        ttft_max, itl_max, tpot_max, e2e_max, needs_first_token = self.slo
        if needs_first_token and not streamed:
            # No first token time: the request cannot be shown to meet the SLO, so it does not.
            self.slo_unmeasured += 1
        elif e2e <= e2e_max and ttft <= ttft_max and itl <= itl_max and tpot <= tpot_max:
            self.slo_met += 1
        else:
            misses = self.slo_misses
            for name, value, limit in (
                ("ttft", ttft, ttft_max),
                ("itl", itl, itl_max),
                ("tpot", tpot, tpot_max),
                ("e2e", e2e, e2e_max),
            ):
                if value > limit:
                    misses[name] = misses.get(name, 0) + 1

    def _failed(self, status: str) -> None:
        """A record that is no answer: cut by kevload (``cancelled``) or an error."""
        if status == CANCELLED:
            self.cancelled += 1
        else:
            self.errors[status] = self.errors.get(status, 0) + 1

    def _first(self, key: OutputKey, record: Record) -> None:
        """The first record of an output: its count, its order, its text and its tokens."""
        self.counts[key] = 1
        self.first_seen[key] = record.seq
        self.texts[key] = record.answer
        toks = record.token_ids or record.tokens
        if toks:
            self.tokens[key] = toks

    def _sample(self, t_send: float, t_last: float, key: OutputKey) -> None:
        """A probe sample's span and output, kept where the run asked for cuts."""
        sample_spans, outputs = self.sample_spans, self.sample_outputs
        assert sample_spans is not None and outputs is not None  # kept together
        sample_spans.append(t_send)
        sample_spans.append(t_last)
        outputs.append(key)

    def _logprobs(self, key: OutputKey, record: Record) -> bool:
        """An ok record's logprobs into its output's track; False where they are none: a vector of
        nulls only is no logprob at all (the server gave the field, not one value in it)."""
        logprobs = record.logprobs
        assert logprobs  # add's check
        if logprobs[0] is None and logprobs.count(None) == len(logprobs):
            return False
        nonfinite = record.logprob_nonfinite
        if nonfinite:
            self.logprob_nonfinite += 1
        track = self.logprobs.get(key)
        if track is not None:
            track.add(logprobs, record.seq, bool(nonfinite))
            return True
        self.logprobs[key] = LogprobTrack(logprobs, record.seq, bool(nonfinite))
        if key not in self.tokens:
            # The output's first record came without logprobs (and tokens): line it up by this one.
            toks = record.token_ids or record.tokens
            if toks:
                self.tokens[key] = toks
        return True

    def slo_fold(self, last: tuple[str, ...], earlier: set[str]) -> None:
        """A conversation sample, counted by ``add`` on its last turn (which missed ``last``), is
        within the SLO only if every turn was: the bounds its ``earlier`` turns missed count against
        it too, once per bound."""
        if not earlier or "unmeasured" in last:
            return
        if not last:  # ``add`` counted it met
            self.slo_met -= 1
            if "unmeasured" in earlier:
                self.slo_unmeasured += 1
                return
        for name in earlier - set(last) - {"unmeasured"}:
            self.slo_misses[name] = self.slo_misses.get(name, 0) + 1

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
        self.findings += other.findings
        for status, n in other.errors.items():
            self.errors[status] = self.errors.get(status, 0) + n
        self.reconnects += other.reconnects
        for name, hist in other.latency.items():
            self.latency[name].merge(hist)
        self.output_tokens += other.output_tokens
        self.t_start = min(self.t_start, other.t_start)
        self.t_end = max(self.t_end, other.t_end)
        if self.spans is not None and other.spans is not None:  # both or neither: one level
            self.spans.extend(other.spans)
        self.cancelled += other.cancelled
        if (
            self.sample_outputs is not None
            and self.sample_spans is not None
            and other.sample_outputs is not None
            and other.sample_spans is not None
        ):  # all or none: one cell, in a run that asked for cuts or not
            self.sample_spans.extend(other.sample_spans)
            self.sample_outputs.extend(other.sample_outputs)
        self.slo_met += other.slo_met
        self.slo_unmeasured += other.slo_unmeasured
        for name, n in other.slo_misses.items():
            self.slo_misses[name] = self.slo_misses.get(name, 0) + n

    @property
    def ok(self) -> int:
        return sum(self.counts.values())

    def samples(self) -> list[tuple[float, float, OutputKey]]:
        """Each ok sample of a probe cell: (send, last byte, output)."""
        spans, outputs = self.sample_spans, self.sample_outputs
        if spans is None or outputs is None:
            return []
        return [(spans[2 * i], spans[2 * i + 1], key) for i, key in enumerate(outputs)]

    def modal(self) -> OutputKey | None:
        """Most common output; ties go to the one seen first, so the choice is reproducible."""
        if not self.counts:
            return None
        return max(self.counts, key=lambda h: (self.counts[h], -self.first_seen[h]))


@dataclass
class Reduction:
    """Every cell of a run's records, and what was sent besides: the comparator's whole state."""

    cells: dict[CellKey, CellAccumulator] = field(default_factory=dict)
    records: int = 0
    # Every request on record, warm-ups and uncounted sends included: what was sent, not what is
    # evidence.
    sent: int = 0
    sent_errors: dict[str, int] = field(default_factory=dict)
    slo: Slo | None = None
    limits: SloLimits | None = field(init=False, default=None)
    # The spans of a closed-loop level's requests that are in no cell (warm-ups, ramp-ups, tails):
    # "others" too.
    uncounted_spans: dict[SpanKey, array[float]] = field(default_factory=dict)
    # Conversation cells: each turn's counted ok answers, by history (``kevload.compare.turnwise``).
    turns: dict[CellKey, dict[int, dict[TurnAnswer, int]]] = field(default_factory=dict)
    # Every cut of a level (load.cancel_share), counted or not: the times its requests were
    # cancelled.
    cuts: dict[CutKey, array[float]] = field(default_factory=dict)
    # requests on record that load.cancel_share chose to cut (0: the run cut nothing)
    cancel_planned: int = 0
    # The run asked for cuts (load.cancel_share > 0): only then is every probe sample's span kept,
    # to tell the samples beside a cut from the others; it is memory that grows with the samples,
    # which no other run should pay.
    cuts_asked: bool = False
    # Conversations whose ending record this part has not read yet: their earlier turns, in order.
    talks: dict[str, list[KeptTurn]] = field(default_factory=dict)
    # Ending records whose conversation's first turns this part lacks, with the turns it has
    # (``_turn``).
    ends: dict[str, tuple[Record, list[KeptTurn]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.limits = slo_limits(self.slo)

    def add(self, record: Record) -> None:
        self.sent += 1
        status = record.status
        self.cancel_planned += record.cancel_planned
        if status == CANCELLED:
            level = (record.mode, record.concurrency, record.rate)
            cuts = self.cuts.get(level)
            if cuts is None:
                cuts = self.cuts[level] = array("d")
            cuts.append(record.t_last_byte)
        elif status != "ok":
            self.sent_errors[status] = self.sent_errors.get(status, 0) + 1
        if record.turns is not None:
            self._turn(record)
            return
        # Warm-ups and sends below full load (a level's ramp-up) are on record but are no evidence.
        if not counts_in_cell(record.role, record.counted):
            self._other(record)
            return
        self._sample(record)

    def _sample(self, record: Record) -> None:
        key = (record.probe, record.role, record.mode, record.concurrency, record.rate)
        cell = self.cells.get(key)
        if cell is None:
            probe = record.role == "probe"
            cell = self.cells[key] = CellAccumulator(
                max_in_flight=record.max_in_flight,
                slo=self.limits,
                spans=array("d") if record.concurrency > 1 and record.rate is None else None,
                sample_spans=array("d") if probe and self.cuts_asked else None,
                sample_outputs=[] if probe and self.cuts_asked else None,
            )
        cell.add(record)
        self.records += 1

    def _other(self, record: Record) -> None:
        """A request of a closed-loop level c ≥ 2 that is no sample of a cell: one of the others
        beside those that are."""
        if record.concurrency > 1 and record.rate is None:
            level = (record.mode, record.concurrency)
            spans = self.uncounted_spans.get(level)
            if spans is None:
                spans = self.uncounted_spans[level] = array("d")
            spans.append(record.t_send)
            spans.append(record.t_last_byte)

    def _turn(self, record: Record) -> None:
        """A turn of a conversation. An earlier one is one of its level's others, and kept (its
        answer) until the record that ends its sample (the last turn, or the turn that failed)
        says whether the sample counts: a conversation cut by a stop or a crash, or whose later
        turn went below full load, is no sample, nor are its turns. A record that ends a
        conversation whose first turns this part lacks (a large file read in parts) waits for
        ``merge`` to bring them."""
        conversation, turn, ok = record.conversation, record.turn, record.status == "ok"
        assert conversation is not None and turn is not None  # a turn's (Record.__post_init__)
        if not ends_sample(turn, record.turns, record.status):
            answer = (record.history_sha256, record.sha256, record.finish_reason) if ok else None
            text = as_received(record.answer, record.finish_reason) if ok else ""
            missed = slo_missed(self.limits, record) if ok and self.limits is not None else ()
            self.talks.setdefault(conversation, []).append(
                (turn, answer, text, record.completion_tokens or 0, record.t_send, missed)
            )
            self._other(record)
            return
        earlier = self.talks.pop(conversation, [])
        if turn and (not earlier or earlier[0][0] != 0):
            self.ends[conversation] = (record, earlier)
            return
        self._end(record, earlier)

    def _end(self, record: Record, earlier: list[KeptTurn]) -> None:
        """The record that ends a conversation sample, with its earlier turns. A counted one is the
        sample the cell counts, its output the whole conversation, and every turn's answer goes into
        the cell's turn tally (each given its own history); an uncounted one is one of its level's
        others."""
        if not counts_in_cell(record.role, record.counted):
            self._other(record)
            return
        key = (record.probe, record.role, record.mode, record.concurrency, record.rate)
        ok = record.status == "ok"
        answers = [(turn, answer) for turn, answer, *_ in earlier]
        if ok:
            assert record.turn is not None  # it ends a conversation: a turn of it
            answers.append(
                (record.turn, (record.history_sha256, record.sha256, record.finish_reason))
            )
        for turn, answer in answers:
            if answer is not None:
                tally = self.turns.setdefault(key, {}).setdefault(turn, {})
                tally[answer] = tally.get(answer, 0) + 1
        if ok:
            # The conversation's text and hash stand for the answer; its logprobs are each turn's,
            # compared nowhere.
            record = msgspec.structs.replace(
                record,
                sha256=record.conversation_sha256,
                reasoning=None,
                tool_calls=None,
                output=transcript(
                    record.history or (), [kept[2] for kept in earlier], record.answer
                ),
                token_ids=None,
                tokens=None,
                logprobs=None,
                logprob_nonfinite=0,
                params={
                    k: v for k, v in record.params.items() if k not in ("logprobs", "top_logprobs")
                },
            )
        self._sample(record)
        # Its latency is its last turn's, but its span and output are the whole conversation's
        # (duration, tok/s).
        cell = self.cells[key]
        if ok and self.limits is not None:
            cell.slo_fold(
                slo_missed(self.limits, record), {name for kept in earlier for name in kept[5]}
            )
        cell.t_start = min([cell.t_start, *(kept[4] for kept in earlier)])
        if ok and earlier and cell.sample_spans is not None:
            # Beside a cut or not is the whole conversation's (kevload.compare.cuts.beside_cuts):
            # from its first send.
            cell.sample_spans[-2] = earlier[0][4]
        if ok:
            cell.output_tokens += sum(kept[3] for kept in earlier)

    def merge(self, other: Reduction) -> None:
        for key, turns in other.turns.items():
            mine = self.turns.setdefault(key, {})
            for turn, answers in turns.items():
                tally = mine.setdefault(turn, {})
                for answer, n in answers.items():
                    tally[answer] = tally.get(answer, 0) + n
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
        for cut_level, cuts in other.cuts.items():
            self.cuts.setdefault(cut_level, array("d")).extend(cuts)
        self.cancel_planned += other.cancel_planned
        # A conversation split between parts: this part has its first turns, ``other`` the later
        # ones.
        for conversation, earlier in other.talks.items():
            self.talks.setdefault(conversation, []).extend(earlier)
        for conversation, (record, earlier) in other.ends.items():
            begun = self.talks.pop(conversation, None)
            if begun is None:
                self.ends[conversation] = (record, earlier)
            else:
                self._end(record, begun + earlier)

    def full_loads(self, unrecorded: list[Window] | None = None) -> dict[CellKey, FullLoad]:
        """Each cell of a closed-loop level c ≥ 2 against every request of its level: its cells'
        counted spans (probes and companions) and its uncounted ones (warm-ups, ramp-ups, tails),
        from every records file reduced; its samples in an ``unrecorded`` window are left unknown.
        One level's occupancy at a time: memory follows the largest level, not the run."""
        by_level: dict[SpanKey, list[tuple[CellKey, array[float]]]] = {}
        for key, cell in self.cells.items():
            if cell.spans is not None:
                by_level.setdefault((key[2], key[3]), []).append((key, cell.spans))
        out: dict[CellKey, FullLoad] = {}
        for level, keyed in by_level.items():
            parts = [spans for _, spans in keyed]
            if level in self.uncounted_spans:
                parts.append(self.uncounted_spans[level])
            occupancy = Occupancy.of(
                np.concatenate([_span_rows(spans) for spans in parts]), level[1]
            )
            for key, spans in keyed:
                out[key] = occupancy.full_load(_span_rows(spans), unrecorded)
        return out


def slo_missed(limits: SloLimits, record: Record) -> tuple[str, ...]:
    """The bounds an ok record is over (``CellAccumulator.add``'s rule, for one record):
    ``("unmeasured",)`` where a bound needs a first token time it lacks; empty where it is within
    every bound."""
    ttft_max, itl_max, tpot_max, e2e_max, needs_first_token = limits
    t_send, t_last, t_first = record.t_send, record.t_last_byte, record.t_first_token
    chunks, tokens = record.chunks, record.completion_tokens or 0
    if t_first is None or not chunks:
        return ("unmeasured",) if needs_first_token else ("e2e",) * (t_last - t_send > e2e_max)
    ttft = t_first - t_send
    tpot = (t_last - t_first) / ((tokens or chunks) - 1) if (tokens or chunks) > 1 else 0.0
    itl = (t_last - t_first) / (chunks - 1) if chunks > 1 else 0.0
    return tuple(
        name
        for name, value, limit in (
            ("ttft", ttft, ttft_max),
            ("itl", itl, itl_max),
            ("tpot", tpot, tpot_max),
            ("e2e", t_last - t_send, e2e_max),
        )
        if value > limit
    )


def slo_limits(slo: Slo | None) -> SloLimits | None:
    """The SLO as the hot loop reads it: seconds, an unbounded measure as inf (a comparison that
    never fails)."""
    if slo is None:
        return None
    seconds = [
        math.inf if ms is None else ms / 1000
        for ms in (slo.ttft_ms, slo.itl_ms, slo.tpot_ms, slo.e2e_ms)
    ]
    ttft, itl, tpot, e2e = seconds
    return (ttft, itl, tpot, e2e, any(math.isfinite(x) for x in seconds[:3]))


def _span_rows(spans: array[float]) -> np.ndarray:
    return np.frombuffer(spans, dtype=np.float64).reshape(-1, 2)
