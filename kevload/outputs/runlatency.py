"""The ``--baseline`` gate's latency check: the whole run's p50 and p99 end-to-end latency and p50
time to first token against the baseline's, each a ratio with its bootstrap 95 % interval, as
``kevload compare`` reads two servers (``compare.rollout.latency_ratios``)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from kevload.compare.rollout import latency_ratios
from kevload.compare.sides import LevelLoad
from kevload.records.rundir import RunDir

CellKey = tuple[str, str, int, float | None]  # probe, mode, concurrency, rate
# The ratios stated, and those the gate reads (the p50s, as the per-cell check did and compare's
# gate does; p99 rests on few samples per run and is stated, not gated).
_RATIOS = (
    ("latency_p50_ratio", "e2e p50"),
    ("latency_p99_ratio", "e2e p99"),
    ("ttft_p50_ratio", "TTFT p50"),
)
GATED = ("latency_p50_ratio", "ttft_p50_ratio")


def run_load(path: Path, cells: Collection[CellKey]) -> LevelLoad | None:
    """The run's ok probe samples in ``cells`` (their end-to-end latency and time to first token),
    read from the records of ``path``: a run directory, or the one a summary.json lies in. None
    where it holds no records or no such sample (a summary.json copied alone)."""
    run = RunDir(path if path.is_dir() else path.parent)
    if not run.record_files():
        return None
    load = LevelLoad()
    for record in run.records():
        if (
            record.is_evidence
            and (record.probe, record.mode, record.concurrency, record.rate) in cells
        ):
            load.add(record)
    return load if load.e2e else None


def whole_run_latency(now: LevelLoad, then: LevelLoad, limit: float) -> tuple[str, bool]:
    """The line's text and whether it is a regression: this run over the baseline, each ratio with
    its interval; slower where a gated ratio's interval lies wholly above 1 + ``limit``."""
    ratios = latency_ratios(then, now)
    parts = [
        f"{label} ×{ratios[key]:.2f} (95% [{ratios[key + '_ci95'][0]:.2f}, "
        f"{ratios[key + '_ci95'][1]:.2f}])"
        for key, label in _RATIOS
        if ratios[key] is not None
    ]
    slower = [
        label
        for key, label in _RATIOS
        if key in GATED and ratios[key] is not None and ratios[key + "_ci95"][0] > 1 + limit
    ]
    verdict = (
        f"{' and '.join(slower)} slower, the interval wholly above {1 + limit:.2f}"
        if slower
        else f"no interval wholly above {1 + limit:.2f}"
    )
    text = (
        f"this run over the baseline, {len(now.e2e)} and {len(then.e2e)} ok samples in the cells "
        f"both compare: {'; '.join(parts)}; limit +{limit:.0%}: {verdict}"
    )
    return text, bool(slower)
