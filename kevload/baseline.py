"""Nightly comparison of a run against an earlier one: new drift, unseen outputs, slower latency."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kevload.rundir import RunDir
from kevload.store import RunDirError, read_json
from kevload.summary import CellSummary, RunSummary, position_label

LATENCY_METRICS = ("e2e", "ttft")
# What changed in a cell against the baseline; every kind but ``fixed`` is a regression.
ChangeKind = Literal["new_drift", "new_latent_drift", "unseen_output", "latency", "missing_cell", "fixed"]


@dataclass(frozen=True)
class Change:
    kind: ChangeKind
    cell: str
    detail: str

    @property
    def regression(self) -> bool:
        return self.kind != "fixed"


def load_baseline(path: Path) -> RunSummary:
    """A run directory or a summary.json file, from this version or an older one, read typed: a key whose value does
    not fit its field (null latencies, a number for a hash) is a ``RunDirError`` naming the file and the key, before
    anything is sent."""
    summary_path = RunDir(path).summary_json if path.is_dir() else path
    summary = read_json(summary_path)
    expected = "expected a kevload summary.json or run directory"
    if not isinstance(summary, dict) or not isinstance(summary.get("cells"), list):
        raise RunDirError(f"{summary_path}: --baseline: {expected}")
    problem = RunSummary.type_problem(summary)
    if problem is not None:
        raise RunDirError(f"{summary_path}: --baseline: {problem} ({expected})")
    return RunSummary.from_json(summary)


def compare_to_baseline(current: RunSummary, baseline: RunSummary, *,
                        max_latency_regression: float = 0.2) -> list[Change]:
    """What changed, cell by cell (probe cells only). An unchanged server gives an empty list."""
    old = {_key(c): c for c in baseline.probe_cells()}
    # "Seen in the baseline" means at any level of the same probe and mode: a fixed level that
    # returns to the serial output has not produced anything new.
    seen_by_probe: dict[tuple[str, str], set[str]] = {}
    for c in old.values():
        seen_by_probe.setdefault((c.probe, c.mode), set()).update(c.output_hashes)
    # Under load.prefix_cache's marker each run's rounds open with their own run id: other inputs than the
    # baseline's, whose answers were never to be seen there.
    fresh_inputs = any((s.prefix_cache or {}).get("method") == "marker" for s in (current, baseline))
    changes: list[Change] = []
    for cell in current.probe_cells():
        name = cell.name
        before = old.get(_key(cell))
        if before is None:
            continue
        if cell.drift and not before.drift:
            changes.append(Change("new_drift", name, f"{cell.distinct} distinct in {cell.ok} "
                                  f"(baseline: 1 in {before.ok}), first divergence at "
                                  f"{position_label(char=cell.first_divergence_chars)}"
                                  + _cuts_clause(cell, before)))
        elif before.drift and not cell.drift:
            changes.append(Change("fixed", name,
                                  f"one output in {cell.ok} (baseline: {before.distinct} distinct)"
                                  + _cuts_clause(before, cell)))
        # Latent drift is news only against a baseline whose logprobs were compared and had none; a cell
        # whose logprobs now cover only some samples is no change by itself, and latent drift among those
        # it covers is still latent drift.
        if cell.latent_drift and before.logprob_samples and not before.latent_drift and not before.drift:
            then = (f"bitwise equal in {before.logprob_samples} samples" if before.logprob_bitwise else
                    f"no logprob claim, logprobs in {before.logprob_samples} of {before.ok}, those equal")
            changes.append(Change("new_latent_drift", name, f"same text as serial, logprobs differ from "
                                  f"{position_label(token=cell.first_logprob_divergence_token)} (baseline: {then})"))
        elif before.latent_drift and cell.logprob_bitwise and not cell.drift:
            changes.append(Change("fixed", name, f"logprobs bitwise equal to serial in {cell.logprob_samples} "
                                  "samples (baseline: latent drift)"))
        seen = seen_by_probe.get((cell.probe, cell.mode), set())
        unseen = [h for h in cell.output_hashes if h not in seen]
        # A cell that drifted then and drifts now draws new outputs every night: that is the known drift,
        # not a changed model (a changed model shows in the cells that were stable, the serial one first).
        known_drift = before.drift and cell.drift
        if seen and unseen and not known_drift and not fresh_inputs:
            changes.append(Change("unseen_output", name, f"{len(unseen)} output(s) never seen in the baseline: "
                                  "the model or server changed"))
        for metric in LATENCY_METRICS:
            now = cell.latency.get(metric, {}).get("p50")
            then = before.latency.get(metric, {}).get("p50")
            if now and then and now > then * (1 + max_latency_regression):
                changes.append(Change("latency", name, f"{metric} p50 {now * 1000:.1f} ms vs {then * 1000:.1f} ms "
                                      f"(+{now / then - 1:.0%}, limit +{max_latency_regression:.0%})"))
    current_keys = {_key(c) for c in current.probe_cells()}
    for key, before in old.items():
        if key not in current_keys:
            changes.append(Change("missing_cell", before.name, "in the baseline but not in this run"))
    return changes


def _cuts_clause(drifted: CellSummary, held: CellSummary) -> str:
    """Where the one of a pair of runs that drifted at a level had cancellations there (``load.cancel_share``) and
    the one that held had none: the same level without them is the evidence (``--set load.cancel_share=0``)."""
    if not drifted.cancelled or held.cancelled:
        return ""
    return (f"; probe drifted only in levels with cancellations: ✂{drifted.cancelled} where it drifted, none where "
            "it held")


def _key(cell: CellSummary) -> tuple:
    return (cell.probe, cell.mode, cell.concurrency, cell.rate)
