"""One target's run as a rollout comparison reads it (``kevload compare``): each level's items —
probes, dataset lines, conversations — with their answers, and the level's latencies, throughput and
errors, from its records.

The items are the run's own probe cells (``cells.Reduction``: a conversation's sample is its whole
transcript), so a comparison sees each answer exactly as ``report`` does. Latencies are kept as
values, not histograms: the comparison's bootstrap intervals resample them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from kevload.compare.cells import CellAccumulator
from kevload.compare.reader import reduce_records
from kevload.inputs.grading import Grading
from kevload.inputs.scenariokeys import Slo
from kevload.inputs.wordsets import CANCELLED, OK
from kevload.records.store import Record, counts_in_cell

LevelId = tuple[str, int, float | None]  # mode, concurrency (0 at an open-loop level), rate


@dataclass
class LevelLoad:
    """What one target did at one level: its counted requests, their errors and output tokens, the
    span they ran in, and each ok probe sample's end-to-end latency and time to first token
    (streamed answers only)."""

    e2e: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    requests: int = 0
    ok: int = 0
    errors: int = 0
    output_tokens: int = 0
    t_start: float = math.inf
    t_end: float = -math.inf

    def add(self, record: Record) -> None:
        """A request at full load that is no warm-up (``counts_in_cell``), probe or companion, any
        turn."""
        self.requests += 1
        self.t_start = min(self.t_start, record.t_send)
        self.t_end = max(self.t_end, record.t_last_byte)
        if record.status == OK:
            self.ok += 1
            self.output_tokens += record.completion_tokens or 0
        elif record.status != CANCELLED:  # a cut kevload made is no error of the server's
            self.errors += 1
        if record.is_evidence:
            self.e2e.append(record.t_last_byte - record.t_send)
            if record.t_first_token is not None and record.chunks:
                self.ttft.append(record.t_first_token - record.t_send)

    @property
    def seconds(self) -> float:
        return max(self.t_end - self.t_start, 0.0) if self.requests else 0.0

    def throughput(self, slo_met: int | None = None) -> dict[str, float | int | None]:
        """Requests and output tokens per second over the level's span, with the errors; with an
        SLO, ``goodput``: the requests within every bound (``slo_met``) per second."""
        span = self.seconds
        out: dict[str, float | int | None] = {
            "requests": self.requests,
            "errors": self.errors,
            "requests_per_s": round(self.ok / span, 3) if span > 0 else None,
            "tokens_per_s": round(self.output_tokens / span, 3) if span > 0 else None,
        }
        if slo_met is not None:
            out["goodput"] = round(slo_met / span, 3) if span > 0 else None
        return out


@dataclass
class Side:
    """One target of a comparison: its name, each level's items (probe id → its probe cell) and
    load, the graders its run recorded, and how its run ended (``run.json``'s state; None: not
    known)."""

    name: str
    items: dict[LevelId, dict[str, CellAccumulator]]
    load: dict[LevelId, LevelLoad]
    gradings: Mapping[str, Grading] | None = None
    state: str | None = None
    # Requests within every bound of the run's SLO at each level, probes and companions (None: no
    # SLO).
    slo_met: dict[LevelId, int] | None = None
    # Levels of its run's scenario it holds no record of (``c=2``), in a run that ended complete
    # (its state then ``partial``): nothing pairs them.
    unsent: list[str] = field(default_factory=list)

    def levels(self) -> list[LevelId]:
        return sorted(set(self.items) | set(self.load), key=level_key)


def level_key(level: LevelId) -> tuple[str, int, int, float]:
    """Levels in the order a run sends them: by mode, closed-loop concurrencies first, then
    rates."""
    mode, concurrency, rate = level
    return (mode, 0, concurrency, 0.0) if rate is None else (mode, 1, 0, rate)


def fold_side(
    name: str,
    records: Iterable[Record],
    *,
    gradings: Mapping[str, Grading] | None = None,
    state: str | None = None,
    slo: Slo | None = None,
) -> Side:
    """A run's records (``RunDir.records``) folded into a ``Side``: one pass, the cells as
    ``report`` makes them."""
    loads: dict[LevelId, LevelLoad] = {}

    def tapped() -> Iterator[Record]:
        for record in records:
            if counts_in_cell(record.role, record.counted):
                level = (record.mode, record.concurrency, record.rate)
                loads.setdefault(level, LevelLoad()).add(record)
            yield record

    reduction = reduce_records(tapped(), slo=slo)
    items: dict[LevelId, dict[str, CellAccumulator]] = {}
    met: dict[LevelId, int] = {}
    for (probe, role, mode, concurrency, rate), cell in reduction.cells.items():
        met[(mode, concurrency, rate)] = met.get((mode, concurrency, rate), 0) + cell.slo_met
        if role == "probe":
            items.setdefault((mode, concurrency, rate), {})[probe] = cell
    return Side(
        name=name,
        items=items,
        load=loads,
        gradings=gradings,
        state=state,
        slo_met=met if slo is not None else None,
    )
