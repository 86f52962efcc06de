"""Nightly comparison of a run against an earlier one: new drift, unseen outputs, slower latency."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kevload.compare import level_label
from kevload.store import SUMMARY, RunDirError, read_json

LATENCY_METRICS = ("e2e", "ttft")


@dataclass(frozen=True)
class Change:
    kind: str  # new_drift | new_latent_drift | unseen_output | latency | missing_cell | fixed
    cell: str
    detail: str

    @property
    def regression(self) -> bool:
        return self.kind != "fixed"


def load_baseline(path: Path) -> dict[str, Any]:
    """A run directory or a summary.json file."""
    summary_path = path / SUMMARY if path.is_dir() else path
    summary = read_json(summary_path)
    if not isinstance(summary, dict) or "cells" not in summary:
        raise RunDirError(f"{summary_path}: --baseline: expected a kevload summary.json or run directory")
    return summary


def compare_to_baseline(current: dict[str, Any], baseline: dict[str, Any], *,
                        max_latency_regression: float = 0.2) -> list[Change]:
    """What changed, cell by cell (probe cells only). An unchanged server gives an empty list."""
    old = {_key(c): c for c in baseline["cells"] if c["role"] == "probe"}
    # "Seen in the baseline" means at any level of the same probe and mode: a fixed level that
    # returns to the serial output has not produced anything new.
    seen_by_probe: dict[tuple[str, str], set[str]] = {}
    for c in old.values():
        seen_by_probe.setdefault((c["probe"], c["mode"]), set()).update(c.get("output_hashes") or [])
    changes: list[Change] = []
    for cell in (c for c in current["cells"] if c["role"] == "probe"):
        name = _name(cell)
        before = old.get(_key(cell))
        if before is None:
            continue
        if cell["drift"] and not before["drift"]:
            changes.append(Change("new_drift", name, f"{cell['distinct']} distinct in {cell['ok']} "
                                  f"(baseline: 1 in {before['ok']}), first divergence at char "
                                  f"{cell['first_divergence_chars']}"))
        elif before["drift"] and not cell["drift"]:
            changes.append(Change("fixed", name,
                                  f"one output in {cell['ok']} (baseline: {before['distinct']} distinct)"))
        # Latent drift is news only against a baseline whose logprobs were compared and had none.
        if cell.get("latent_drift") and before.get("logprob_samples") and not before.get("latent_drift") \
                and not before["drift"]:
            changes.append(Change("new_latent_drift", name, f"same text as serial, logprobs differ from token "
                                  f"{cell['first_logprob_divergence_token']} (baseline: bitwise equal in "
                                  f"{before['logprob_samples']} samples)"))
        elif before.get("latent_drift") and cell.get("logprob_bitwise") and not cell["drift"]:
            changes.append(Change("fixed", name, f"logprobs bitwise equal to serial in {cell['logprob_samples']} "
                                  "samples (baseline: latent drift)"))
        seen = seen_by_probe.get((cell["probe"], cell["mode"]), set())
        unseen = [h for h in cell.get("output_hashes") or [] if h not in seen]
        # A cell that drifted then and drifts now draws new outputs every night: that is the known drift,
        # not a changed model (a changed model shows in the cells that were stable, the serial one first).
        known_drift = before["drift"] and cell["drift"]
        if seen and unseen and not known_drift:
            changes.append(Change("unseen_output", name, f"{len(unseen)} output(s) never seen in the baseline: "
                                  "the model or server changed"))
        for metric in LATENCY_METRICS:
            now = cell.get("latency", {}).get(metric, {}).get("p50")
            then = before.get("latency", {}).get(metric, {}).get("p50")
            if now and then and now > then * (1 + max_latency_regression):
                changes.append(Change("latency", name, f"{metric} p50 {now * 1000:.1f} ms vs {then * 1000:.1f} ms "
                                      f"(+{now / then - 1:.0%}, limit +{max_latency_regression:.0%})"))
    current_keys = {_key(c) for c in current["cells"] if c["role"] == "probe"}
    for key, before in old.items():
        if key not in current_keys:
            changes.append(Change("missing_cell", _name(before), "in the baseline but not in this run"))
    return changes


def _key(cell: dict[str, Any]) -> tuple:
    return (cell["probe"], cell["mode"], cell["concurrency"], cell.get("rate"))


def _name(cell: dict[str, Any]) -> str:
    return f"{cell['probe']}@{cell['mode']}/{level_label(cell)}"
