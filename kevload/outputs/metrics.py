"""A run's cells as Prometheus text exposition (version 0.0.4), for node_exporter's textfile
collector and Pushgateway, so nightly determinism results land on the same Grafana boards as the
servers.

Every value is a gauge or a summary: a run is a finished batch job, its counts describe that run and
never grow afterwards, so counters (monotonic over a process's life) would misdescribe them. The
file ends with ``# EOF``: a comment to the Prometheus text parsers (Go's expfmt,
prometheus_client's) and the terminator OpenMetrics parsers require, so both read the same file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from kevload.compare.graded import level_name
from kevload.inputs.wordsets import VERDICTS
from kevload.records.summary import CellSummary, RunSummary

# summary.json latency stats → the quantile label they answer; the maximum is the 1-quantile.
QUANTILES = (("p50", "0.5"), ("p90", "0.9"), ("p99", "0.99"), ("max", "1"))


@dataclass(frozen=True)
class Field:
    """One summary field and the metric it becomes; absent or null in the summary → no series."""

    key: str
    name: str
    help: str
    label: str | None = None  # the field is a {label value: number} mapping: one series per entry


CELL_FIELDS = (
    Field(
        "distinct",
        "kevload_cell_distinct_outputs",
        "Distinct outputs among the cell's ok requests.",
    ),
    Field(
        "drift",
        "kevload_cell_drift",
        "1 if the cell's outputs drift from the serial reference, else 0.",
    ),
    Field(
        "drift_rate",
        "kevload_cell_drift_rate_ratio",
        "Share of the cell's ok requests whose output differs from the serial reference (not at "
        "the reference "
        "level).",
    ),
    Field(
        "drift_rate_upper_95",
        "kevload_cell_drift_rate_upper_95_ratio",
        "Upper 95% confidence bound on the drift rate of a cell without drift.",
    ),
    Field(
        "latent_drift",
        "kevload_cell_latent_drift",
        "1 if outputs have the serial text but different logprobs, else 0; no series without a "
        "logprob claim.",
    ),
    Field(
        "logprob_bitwise",
        "kevload_cell_logprob_bitwise",
        "1 if every ok sample's logprobs were compared and equal serial's bitwise, 0 if compared "
        "ones differ; "
        "no series where only some ok samples had logprobs and those agree.",
    ),
    Field(
        "logprob_samples",
        "kevload_cell_logprob_compared_samples",
        "Ok samples whose logprobs were compared with serial's.",
    ),
    Field(
        "logprobs_missing",
        "kevload_cell_logprob_missing_samples",
        "Ok samples that asked for logprobs and got none.",
    ),
    Field(
        "logprob_nonfinite_samples",
        "kevload_cell_logprob_nonfinite_samples",
        "Ok samples with a logprob of -inf, +inf or NaN.",
    ),
    Field(
        "divergence_kinds",
        "kevload_cell_divergent_outputs",
        "Divergent outputs by how they leave the serial reference (token, length, finish).",
        label="kind",
    ),
    Field("ok", "kevload_cell_ok_requests", "Requests in the cell that returned an output."),
    Field(
        "errors",
        "kevload_cell_error_requests",
        "Failed requests in the cell, by status.",
        label="status",
    ),
    Field(
        "reconnects",
        "kevload_cell_reconnects",
        "Requests resent once on a fresh connection after the reused one closed.",
    ),
    Field(
        "requests_per_s",
        "kevload_cell_requests_per_second",
        "Requests finished per second in the cell.",
    ),
    Field(
        "output_tokens_per_s",
        "kevload_cell_output_tokens_per_second",
        "Output tokens per second in the cell.",
    ),
    Field(
        "goodput",
        "kevload_cell_goodput_requests_per_second",
        "Ok requests per second that met every SLO bound.",
    ),
    Field(
        "slo_attainment",
        "kevload_cell_slo_attainment_ratio",
        "Share of ok requests that met every SLO bound.",
    ),
    # Graded probes (kevload.compare.graded).
    Field(
        "graded_good",
        "kevload_cell_graded_good_samples",
        "Counted ok samples whose answer was graded good.",
    ),
    Field(
        "graded_bad",
        "kevload_cell_graded_bad_samples",
        "Counted ok samples whose answer was graded bad.",
    ),
    Field(
        "good_share",
        "kevload_cell_good_share_ratio",
        "Share of the cell's graded samples graded good.",
    ),
    Field(
        "flips_good_to_bad",
        "kevload_cell_flips_good_to_bad_samples",
        "Samples graded bad where every serial answer was good; no series where serial answers are "
        "mixed.",
    ),
    Field(
        "flips_bad_to_good",
        "kevload_cell_flips_bad_to_good_samples",
        "Samples graded good where every serial answer was bad; no series where serial answers are "
        "mixed.",
    ),
)

# summary.json ``accuracy`` entries → one series per mode and level.
LEVEL_FIELDS = (
    Field(
        "accuracy",
        "kevload_level_accuracy_ratio",
        "Share of the probes graded at the level whose every answer there was good.",
    ),
    Field(
        "good_to_bad",
        "kevload_level_good_to_bad_probes",
        "Probes good serially and bad at the level.",
    ),
    Field(
        "bad_to_good",
        "kevload_level_bad_to_good_probes",
        "Probes bad serially and good at the level.",
    ),
    Field(
        "mcnemar_p",
        "kevload_level_mcnemar_p",
        "Exact McNemar p-value of the level's accuracy against serial.",
    ),
)

# summary.json ``latency`` keys → summary-type metrics with a ``quantile`` label.
LATENCY_FIELDS = (
    Field("e2e", "kevload_cell_e2e_latency_seconds", "End-to-end request latency."),
    Field("ttft", "kevload_cell_time_to_first_token_seconds", "Time to first token (streaming)."),
    Field("itl", "kevload_cell_inter_token_latency_seconds", "Inter-token latency (streaming)."),
    Field(
        "tpot",
        "kevload_cell_time_per_output_token_seconds",
        "Time per output token after the first (streaming).",
    ),
    Field(
        "lateness",
        "kevload_cell_send_lateness_seconds",
        "How late the client sent against the open-loop schedule; grows when the client is the "
        "limit.",
    ),
)

RUN_FIELDS = (
    Field(
        "requests",
        "kevload_run_requests",
        "Requests counted as evidence (sent at full load), companions included; warm-ups and "
        "ramp-ups not.",
    ),
    Field(
        "requests_sent",
        "kevload_run_requests_sent",
        "Every request the run sent: warm-ups, ramp-ups and uncounted copies included.",
    ),
    Field(
        "errors", "kevload_run_error_requests", "Failed requests in the run, companions included."
    ),
    Field("probe_requests", "kevload_run_probe_requests", "Probe requests the run counted."),
    Field("probe_errors", "kevload_run_probe_error_requests", "Failed probe requests."),
    Field(
        "probe_error_share",
        "kevload_run_probe_error_ratio",
        "Share of the run's probe requests that failed (the share the target-failed rule reads).",
    ),
    Field("companion_errors", "kevload_run_companion_error_requests", "Failed companion requests."),
)

RUN_VERDICT = Field("verdict", "kevload_run_verdict", "1 for the run's verdict, 0 for the others.")
RUN_END = Field(
    "ended_at", "kevload_run_end_timestamp_seconds", "When the run ended, Unix time (run.json)."
)

CELL_LABELS = ("scenario", "probe", "mode", "level", "run_id")


def metrics_text(summary: RunSummary, meta: dict[str, Any]) -> str:
    """The exposition text for a summary (summary.json) and its run.json; probe cells only."""
    run = {"scenario": summary.scenario or "", "run_id": summary.run_id or ""}
    cells = [(_cell_labels(c, run), c) for c in summary.probe_cells()]
    lines: list[str] = []
    for field in CELL_FIELDS:
        _family(lines, field, "gauge", _field_samples(field, cells))
    for field in LATENCY_FIELDS:
        _family(lines, field, "summary", _latency_samples(field, cells))
    # Every verdict is listed, so a board can show the ones a run did not reach as 0 (one series
    # each, a state set).
    verdicts = (*VERDICTS, *([summary.verdict] if summary.verdict not in VERDICTS else []))
    _family(
        lines,
        RUN_VERDICT,
        "gauge",
        ((("", {**run, "verdict": v}), summary.verdict == v) for v in verdicts),
    )
    for field in RUN_FIELDS:
        _family(lines, field, "gauge", _field_samples(field, [(run, summary)]))
    for field in LEVEL_FIELDS:
        _family(
            lines,
            field,
            "gauge",
            (
                (("", {**run, "level": level_name(entry)}), entry[field.key])
                for entry in summary.accuracy or ()
                if entry[field.key] is not None
            ),
        )
    ended = meta.get(RUN_END.key)
    _family(
        lines,
        RUN_END,
        "gauge",
        [(("", run), datetime.fromisoformat(ended).timestamp())] if ended else [],
    )
    return "\n".join(lines + ["# EOF", ""])


def write_metrics(path: Path, summary: RunSummary, meta: dict[str, Any]) -> None:
    """Write atomically: the textfile collector may read at any moment and must never see half a
    file.

    The temporary file sits beside the target (a rename is atomic only within one file system) and
    does not end in ``.prom``, so the collector never picks it up; it is created with the umask's
    mode, not mkstemp's 0600, because node_exporter usually runs as another user.
    """
    text = metrics_text(summary, meta).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def escape_label(value: str) -> str:
    """Label value escaping of the text format and OpenMetrics: backslash, double quote and newline;
    any other character, a control character included, stands as itself between the quotes (both
    grammars allow it)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float | int | bool) -> str:
    """Integers (and booleans) as integers; floats with repr, which round-trips every digit, and the
    non-finite ones in the formats' spelling (``NaN``, ``+Inf``, ``-Inf``: a summary.json holds
    none, but a summary made in the run has not been through JSON)."""
    if isinstance(value, bool | int):
        return str(int(value))
    value = float(value)
    if math.isfinite(value):
        return repr(value)
    return "NaN" if math.isnan(value) else "+Inf" if value > 0 else "-Inf"


Sample = tuple[tuple[str, dict[str, str]], float | int | bool]  # ((name suffix, labels), value)


def _family(lines: list[str], field: Field, kind: str, samples: Iterable[Sample]) -> None:
    """HELP, TYPE and the samples of one family, contiguous as both formats require; nothing if no
    sample."""
    body = [
        f"{field.name}{suffix}{{{_labels(labels)}}} {format_value(value)}"
        for (suffix, labels), value in samples
    ]
    if body:
        help_text = field.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines += [f"# HELP {field.name} {help_text}", f"# TYPE {field.name} {kind}", *body]


def _field_samples(
    field: Field, items: Sequence[tuple[dict[str, str], CellSummary | RunSummary]]
) -> Iterator[Sample]:
    for labels, item in items:
        # By name: a field the summary does not have (yet) gives no series, like a null one.
        value = getattr(item, field.key, None)
        if value is None:
            continue
        if field.label is None:
            yield ("", labels), value
        else:
            for label_value, count in value.items():
                yield ("", {**labels, field.label: str(label_value)}), count


def _latency_samples(
    field: Field, cells: list[tuple[dict[str, str], CellSummary]]
) -> Iterator[Sample]:
    for labels, cell in cells:
        stats = cell.latency.get(field.key)
        if not stats or not stats.get("n"):
            continue
        for key, quantile in QUANTILES:
            yield ("", {**labels, "quantile": quantile}), stats[key]
        # The summary keeps the mean, not the sum; mean × n restores it to the mean's 1 µs rounding.
        yield ("_sum", labels), round(stats["mean"] * stats["n"], 6)
        yield ("_count", labels), stats["n"]


def _cell_labels(cell: CellSummary, run: dict[str, str]) -> dict[str, str]:
    values = {**run, "probe": cell.probe, "mode": cell.mode, "level": cell.level}
    return {name: values[name] for name in CELL_LABELS}


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{name}="{escape_label(value)}"' for name, value in labels.items())
