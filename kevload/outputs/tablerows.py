"""The per-cell rows a run's tables share (terminal, Markdown, HTML): agreement with serial, latency
and throughput, the server's own view; each a list of strings under its column names."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kevload.outputs.celltext import attainment_text, full_load_text, logprob_text, rate_text
from kevload.records.summary import CellSummary, RunSummary

AGREEMENT_COLUMNS = (
    "probe (mode)",
    "level",
    "n",
    "exact match [95% CI]",
    "token agreement [95% CI]",
    "logprobs vs serial (n)",
)


def agreement_rows(summary: RunSummary) -> list[list[str]]:
    """Per probe × level: exact-match rate and token agreement with the serial output, and the
    logprobs."""
    return [
        [
            f"{c.probe} ({c.mode})",
            c.level,
            str(c.ok),
            rate_text(c.exact_match_rate, c.exact_match_ci95),
            rate_text(c.token_agreement, c.token_agreement_ci95),
            logprob_text(c),
        ]
        for c in sorted(summary.probe_cells(), key=lambda c: (c.probe, c.mode, c.level_order))
    ]


LATENCY_TITLE = "latency (ms, p50 / p99) and throughput"


def latency_columns(summary: RunSummary) -> tuple[str, ...]:
    slo = ("SLO met", "goodput/s") if summary.slo else ()
    return (
        "probe (mode)",
        "level",
        "n",
        "ttft",
        "itl",
        "tpot",
        "e2e",
        "tok/s",
        "req/s",
        "late p99",
        "full load",
        *slo,
    )


def latency_rows(summary: RunSummary) -> list[list[str]]:
    """Latency (ms, p50 / p99) and throughput per probe × level: the terminal's table and
    Markdown's."""
    rows = []
    for c in sorted(summary.probe_cells(), key=lambda c: (c.probe, c.mode, c.level_order)):
        lat = c.latency
        late = lat.get("lateness", {}).get("p99")
        rows.append(
            [
                f"{c.probe} ({c.mode})",
                c.level,
                str(c.ok),
                *(_p50_p99(lat.get(k)) for k in ("ttft", "itl", "tpot", "e2e")),
                decimal_text(c.output_tokens_per_s),
                decimal_text(c.requests_per_s),
                f"{late * 1000:.2f}" if late is not None else "-",
                full_load_text(c),
                *((attainment_text(c), decimal_text(c.goodput)) if summary.slo else ()),
            ]
        )
    return rows


SERVER_COLUMNS = (
    "probe (mode)",
    "level",
    "samples",
    "running max",
    "running mean",
    "waiting max",
    "prefix-cache hits",
    "KV cache max",
)


def server_rows(summary: RunSummary) -> list[list[str]]:
    """Per probe × level, what the server's /metrics said while the cell ran; no rows where it
    published none."""
    cells = sorted(
        (c for c in summary.probe_cells() if c.server_samples is not None),
        key=lambda c: (c.probe, c.mode, c.level_order),
    )
    return [
        [
            f"{c.probe} ({c.mode})",
            c.level,
            str(c.server_samples),
            or_dash(c.server_running_max),
            or_dash(c.server_running_mean),
            or_dash(c.server_waiting_max),
            or_dash(c.server_prefix_cache_hits),
            "-" if c.server_kv_cache_usage_max is None else f"{c.server_kv_cache_usage_max:.1%}",
        ]
        for c in cells
    ]


def _p50_p99(stats: dict[str, float] | None) -> str:
    if not stats or not stats.get("n"):
        return "-"
    return f"{stats['p50'] * 1000:.0f} / {stats['p99'] * 1000:.0f}"


def decimal_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def probe_rows(cells: Iterable[CellSummary]) -> dict[tuple[str, str], dict[str, CellSummary]]:
    rows: dict[tuple[str, str], dict[str, CellSummary]] = {}
    for c in cells:
        rows.setdefault((c.probe, c.mode), {})[c.level] = c
    return rows
