"""Verdict policy: what a run's probe cells add up to, why a cell stopped sampling, when a level
meets its SLO."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kevload.compare.stats import samples_for_bound
from kevload.inputs.wordsets import StopReason, Verdict
from kevload.records.summary import CellSummary


@dataclass(frozen=True, slots=True)
class UntilBound:
    """``load.until_bound``: take probe samples until drift is seen or the 95 % bound on the drift
    rate falls to ``bound``, at most ``max_samples``; a drifting cell still takes ``min_samples``
    (``load.samples``).

    ``reason`` is the one rule, asked twice: by the strategy while the level runs (``sent`` counted
    sends, ``errors`` of them answered with an error, so ``sent - errors`` are ok or still in
    flight), and by the summary afterwards from the cell's records (every send answered). Both get
    the same answer, so ``kevload report`` recomputes ``stop_reason`` from the records alone.
    """

    bound: float
    min_samples: int
    max_samples: int

    @property
    def goal(self) -> int:
        """Clean ok samples that bound the drift rate at ``bound`` (at 95 %), and never fewer than
        asked."""
        return max(self.min_samples, samples_for_bound(self.bound))

    def reason(self, sent: int, errors: int, diverged: bool) -> StopReason | None:
        """Why counting stops now, or None while the cell still needs samples."""
        if diverged and sent >= self.min_samples:
            return "drift"
        if not diverged and sent - errors >= self.goal:
            return "bound"
        if sent >= self.max_samples:
            return "cap"
        return None


def run_verdict(
    probe_cells: Sequence[CellSummary], *, max_error_share: float, missing: Sequence[str] | None
) -> Verdict:
    """``target_failed`` (a probe cell whose counted requests all failed, or the probe error share
    over ``max_error_share``) · ``nondeterministic`` (a probe cell drifts; drift seen is drift,
    however few samples) · ``inconclusive`` (no drift, but a probe cell is short of samples, an
    asked one is ``missing``, or no probe request was counted at all: nothing failed, nothing was
    measured) · ``deterministic``.

    The error share counts probe requests only: companions only shape the batch, and their successes
    must not dilute the probe's failures."""
    requests = sum(c.requests for c in probe_cells)
    error_share = probe_error_share(probe_cells)
    if error_share > max_error_share or any(c.ok == 0 for c in probe_cells):
        return "target_failed"
    if any(c.drift for c in probe_cells):
        return "nondeterministic"
    if any(c.short for c in probe_cells) or missing or not requests:
        return "inconclusive"
    return "deterministic"


def probe_error_share(probe_cells: Sequence[CellSummary]) -> float:
    """Failed probe requests over all probe requests counted (0.0 when none was)."""
    requests = sum(c.requests for c in probe_cells)
    return (requests - sum(c.ok for c in probe_cells)) / requests if requests else 0.0


def stop_reason(
    *,
    role: str,
    requests: int,
    errors: int,
    drift: bool,
    asked: int | None,
    until: UntilBound | None,
) -> StopReason | None:
    """Why a probe cell stopped taking samples: ``bound``, ``drift``, ``cap`` (``load.until_bound``,
    the strategy's own rule asked of the cell's records) or ``samples`` (it had ``load.samples``);
    None for companion cells, a level run for a duration, or a cell the run was stopped in before
    its rule ended it."""
    if role != "probe":
        return None
    if until is not None:
        return until.reason(requests, errors, drift)
    return "samples" if asked is not None and requests >= asked else None


def meets_slo(attainment: float, min_attainment: float | None) -> bool:
    """A level meets the SLO at attainment ≥ the minimum, or at 1.0 when none is given: no slack the
    user did not write down."""
    return attainment >= (1.0 if min_attainment is None else min_attainment)
