"""One cell of the comparator's summary against its serial reference, field by field: its outputs,
where and how they leave the serial one, its pace and what the server said meanwhile.

The run around the cells is ``summarizing.py``.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from kevload.compare.agreement import agreement, logprob_agreement
from kevload.compare.cells import CellAccumulator, OutputKey
from kevload.compare.divergence import Divergence, divergence
from kevload.compare.overlap import FullLoad
from kevload.compare.stats import drift_upper_bound
from kevload.compare.turnwise import TurnAgreement, first_divergent_turn
from kevload.compare.verdict import UntilBound, meets_slo, stop_reason
from kevload.inputs.wordsets import DIVERGENCE_KINDS, SampleRole
from kevload.records.servermetrics import CELL_FIELDS, Samples, cell_view
from kevload.records.summary import CellSummary, level_label

Level = tuple[int, float | None]  # concurrency, rate (open loop)


def cell_summary(
    probe: str,
    role: str,
    mode: str,
    level: Level,
    ref_level: Level,
    cell: CellAccumulator,
    reference: CellAccumulator,
    *,
    asked: int | None,
    min_slo_attainment: float | None,
    until: UntilBound | None,
    full_load: FullLoad | None,
    server: Samples | None,
    turns: tuple[TurnAgreement, ...] | None = None,
) -> CellSummary:
    """One cell against its serial reference (the group's first level), field by field: its outputs,
    where and how they leave the serial one, its pace and what the server said meanwhile."""
    ok = cell.ok
    errors = sum(cell.errors.values())
    serial = reference.modal()
    divergent = 0 if serial is None else ok - cell.counts.get(serial, 0)
    drift = ok > 0 and (len(cell.counts) > 1 or divergent > 0)
    duration = round(cell.t_end - cell.t_start, 6) if ok + errors else None
    diverged = (
        divergence(cell, reference.texts[serial], reference.tokens.get(serial), serial)
        if drift and serial is not None and divergent
        else None
    )
    return CellSummary(
        probe=probe,
        role=cast(SampleRole, role),  # a cell's role: no warm-up makes one (counts_in_cell)
        mode=mode,
        concurrency=level[0],
        rate=level[1],
        reference_level=level_label(*ref_level),
        max_in_flight=cell.max_in_flight,
        ok=ok,
        asked=asked,
        short=asked is not None and ok < asked,
        errors=dict(sorted(cell.errors.items())),
        reconnects=cell.reconnects,
        stop_reason=stop_reason(
            role=role, requests=ok + errors, errors=errors, drift=drift, asked=asked, until=until
        ),
        findings=cell.findings or None,
        **_output_fields(cell, reference, serial),
        **_drift_fields(ok, divergent, drift, level == ref_level, diverged),
        **_agreement_fields(cell, reference, serial, drift),
        **_pace_fields(cell, ok + errors, duration, full_load),
        **_slo_fields(cell, ok + errors, duration, min_slo_attainment),
        **_server_fields(server, cell, level[0]),
        **_turn_fields(turns),
    )


def _server_fields(
    server: Samples | None, cell: CellAccumulator, concurrency: int
) -> dict[str, Any]:
    """What the server said while the cell ran (``cell_view``): None each field it does not set."""
    view = cell_view(server, cell.t_start, cell.t_end, concurrency)
    return {name: view.get(name) for name in CELL_FIELDS}


def _output_fields(
    cell: CellAccumulator, reference: CellAccumulator, serial: OutputKey | None
) -> dict[str, Any]:
    """The cell's distinct outputs: how many, how they overlap the serial cell's, the modal one and
    the hashes listed most frequent first."""
    ok = cell.ok
    modal = cell.modal()
    counts = np.fromiter(cell.counts.values(), dtype=np.int64, count=len(cell.counts))
    unseen = [h for h in cell.counts if h not in reference.counts]
    unseen_requests = sum(cell.counts[h] for h in unseen)
    return {
        "distinct": len(cell.counts),
        "modal_share": round(float(counts.max()) / ok, 6) if ok else None,
        "new_vs_serial": len(unseen),
        "new_vs_serial_requests": unseen_requests,
        "overlap_with_serial": round((ok - unseen_requests) / ok, 6) if ok else None,
        "agrees_with_serial": modal == serial if ok else None,
        "modal_sha256": modal[0] if modal else None,
        "modal_finish_reason": modal[1] if modal else None,
        "output_hashes": _output_hashes(cell),
        "output_tokens": cell.output_tokens,
    }


def _output_hashes(cell: CellAccumulator) -> tuple[str, ...]:
    """The cell's output hashes (over finish reasons), most frequent first, at most 256."""
    by_digest: dict[str | None, int] = {}
    # Ties by the first request, as ``modal``: a file read in parts lists them alike.
    first_seen: dict[str | None, int] = {}
    for (digest, finish), n in cell.counts.items():
        by_digest[digest] = by_digest.get(digest, 0) + n
        first_seen[digest] = min(
            first_seen.get(digest, cell.first_seen[(digest, finish)]),
            cell.first_seen[(digest, finish)],
        )
    return tuple(
        h
        for h in sorted(by_digest, key=lambda h: (-by_digest[h], first_seen[h]))[:256]
        if h is not None  # an ok record without its hash (a crafted file) has no hash to list
    )


def _drift_fields(
    ok: int, divergent: int, drift: bool, serial_level: bool, diverged: Divergence | None
) -> dict[str, Any]:
    """Whether and how often the cell's outputs leave the serial one, where, and an example (None
    each without divergent samples)."""
    return {
        "divergent_requests": divergent,
        "drift": drift,
        "drift_rate": round(divergent / ok, 6) if ok and not serial_level else None,
        "drift_rate_upper_95": round(drift_upper_bound(ok), 6) if ok and not drift else None,
        "divergence_kinds": diverged.kinds if diverged else dict.fromkeys(DIVERGENCE_KINDS, 0),
        "first_divergence_chars": diverged.first_chars if diverged else None,
        "last_divergence_chars": diverged.last_chars if diverged else None,
        "first_divergence_tokens": diverged.first_tokens if diverged else None,
        "first_divergence_words": diverged.first_words if diverged else None,
        "example_offset": diverged.example_offset if diverged else None,
        "serial_example": diverged.serial_example if diverged else None,
        "divergent_example": diverged.divergent_example if diverged else None,
        "divergent_example_kind": diverged.divergent_example_kind if diverged else None,
        "serial_finish_reason": diverged.serial_finish_reason if diverged else None,
        "divergent_finish_reason": diverged.divergent_finish_reason if diverged else None,
    }


def _agreement_fields(
    cell: CellAccumulator,
    reference: CellAccumulator,
    serial: OutputKey | None,
    drift: bool,
) -> dict[str, Any]:
    """Agreement with the serial cell, by text and by tokens, and by the logprobs behind them."""
    agreed = agreement(cell, reference, serial)
    logprobs = logprob_agreement(cell, reference, serial)
    return {
        "exact_match_rate": agreed.exact_match_rate,
        "exact_match_ci95": agreed.exact_match_ci95,
        "token_agreement": agreed.token_agreement,
        "token_agreement_ci95": agreed.token_agreement_ci95,
        "logprob_samples": logprobs.samples,
        "logprob_bitwise": logprobs.bitwise,
        "logprob_max_abs_diff": logprobs.max_abs_diff,
        "first_logprob_divergence_token": logprobs.first_divergence_token,
        # Latent drift: every output has the serial text, yet the logprobs behind it differ. No
        # claim either way where the logprobs make none (too few of the cell's samples had them,
        # all alike).
        "latent_drift": None
        if logprobs.bitwise is None
        else bool(cell.ok and not drift and not logprobs.bitwise),
        "logprobs_missing": logprobs.missing,
        "logprobs_partial": logprobs.partial,
        "logprob_nonfinite_samples": logprobs.nonfinite_samples,
    }


def _pace_fields(
    cell: CellAccumulator, requests: int, duration: float | None, full_load: FullLoad | None
) -> dict[str, Any]:
    """The cell's duration, latencies and rates, and how fully loaded its samples ran.

    ``full_load_share`` and ``samples_never_full`` (``overlap.FullLoad``: over the samples whose
    others the records hold, ``overlap_unknown`` counting the rest) are None at an open-loop level
    (no c to reach) and at c = 1 (no others to have: a serial sample is trivially full)."""
    return {
        "duration_s": duration,
        "latency": {
            name: hist.summary() for name, hist in sorted(cell.latency.items()) if hist.n_total
        },
        "full_load_share": None
        if full_load is None or full_load.share is None
        else round(full_load.share, 6),
        "samples_never_full": None if full_load is None else full_load.never_full,
        "overlap_unknown": None if full_load is None else full_load.unknown,
        "requests_per_s": round(requests / duration, 3) if duration else None,
        "output_tokens_per_s": round(cell.output_tokens / duration, 3) if duration else None,
    }


def _slo_fields(
    cell: CellAccumulator, requests: int, duration: float | None, min_attainment: float | None
) -> dict[str, Any]:
    """With an SLO: attainment counts failed requests in its denominator (they met no bound);
    goodput is over the cell's duration, like requests_per_s. None each without one."""
    if cell.slo is None:
        none: dict[str, Any] = dict.fromkeys(
            (
                "slo_met",
                "slo_attainment",
                "goodput",
                "meets_slo",
                "slo_unmeasured",
                "slo_misses",
            )
        )
        return none
    attainment, goodput = _slo_numbers(cell, requests, duration)
    return {
        "slo_met": cell.slo_met,
        "slo_attainment": round(attainment, 6),
        "goodput": goodput,
        "meets_slo": meets_slo(attainment, min_attainment),
        "slo_unmeasured": cell.slo_unmeasured,
        "slo_misses": dict(sorted(cell.slo_misses.items())),
    }


def _turn_fields(turns: tuple[TurnAgreement, ...] | None) -> dict[str, Any]:
    """A conversation cell's turns against the serial cell's; None each for any other cell."""
    return {
        "turns": None if turns is None else tuple(t.to_json() for t in turns),
        "first_divergent_turn": None if turns is None else first_divergent_turn(turns),
    }


def _slo_numbers(
    cell: CellAccumulator, requests: int, duration_s: float | None
) -> tuple[float, float | None]:
    """(attainment, goodput): requests within every bound over all of them, and per second of the
    cell."""
    attainment = cell.slo_met / requests if requests else 0.0
    return attainment, round(cell.slo_met / duration_s, 3) if duration_s else None
