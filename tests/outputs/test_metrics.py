"""--metrics: the run's cells as Prometheus text, read back by prometheus_client's own parsers."""

from __future__ import annotations

import copy
import json
import os
import time
from datetime import datetime

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_prometheus

from kevload.outputs import metrics
from kevload.outputs.metrics import CELL_FIELDS, LATENCY_FIELDS, metrics_text, write_metrics
from kevload.records.summary import RunSummary
from tests.conftest import load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

# A quote, a backslash and a newline: each must be escaped in a label value, and come back
# unchanged.
PROBE = 'say "hi"\\x\ny'
CELL_LABELS = {"scenario", "probe", "mode", "level", "run_id"}
# Arrival order: c=1 takes requests 0-7, c=4 requests 8-15; two failures land in each level.
FAULTS = [
    "http_500",
    None,
    None,
    "malformed",
    None,
    None,
    None,
    None,
    None,
    None,
    "http_500",
    None,
    "http_503",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One run with drift at c=4 and injected errors; the server is gone once the fixture yields."""
    tmp = tmp_path_factory.mktemp("metrics")
    with FakeServer(Behaviour(drift_at=3, latency=0.1, faults=list(FAULTS))) as server:
        scenario = write_scenario(
            tmp / "s.toml",
            server.url,
            stream=True,
            max_error_share=0.5,
            probes=[{"id": PROBE, "prompt": "Say something.", "max_tokens": 16}],
        )
        code, output = run_cli(
            "run", scenario, "--out", tmp / "run", "--quiet", "--metrics", tmp / "run.prom"
        )
    assert code == 1, output  # drift at c=4, errors under the limit
    return tmp


def families(text: str) -> dict:
    return {f.name: f for f in parse_prometheus(text)}


def assert_strict_escapes(text: str) -> None:
    """Go's parser (node_exporter, Pushgateway) rejects escapes other than \\\\, \\" and \\n;
    Python's does not."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        chars = iter(line)
        for char in chars:
            if char == "\\":
                assert next(chars, "") in ("\\", '"', "n"), line


def by_labels(family, sample_name: str | None = None) -> dict[frozenset, float]:
    name = sample_name or family.name
    return {frozenset(s.labels.items()): s.value for s in family.samples if s.name == name}


def cell_key(cell: dict, **extra: str) -> frozenset:
    level = f"c={cell['concurrency']}"
    return frozenset(
        {
            "scenario": "s",
            "probe": cell["probe"],
            "mode": cell["mode"],
            "level": level,
            "run_id": cell["run_id"],
            **extra,
        }.items()
    )


def probe_cells(summary: dict) -> list[dict]:
    return [{**c, "run_id": summary["run_id"]} for c in summary["cells"] if c["role"] == "probe"]


def test_run_metrics_parse_and_equal_the_summary(run):
    summary = load_summary(run / "run")
    text = (run / "run.prom").read_text()
    found = families(text)
    assert_strict_escapes(text)
    cells = probe_cells(summary)
    assert [c["probe"] for c in cells] == [PROBE, PROBE]
    assert {c["concurrency"]: c["drift"] for c in cells} == {1: False, 4: True}
    counted_errors = [
        r
        for r in map(json.loads, (run / "run" / "records.jsonl").read_text().splitlines())
        if r["role"] == "probe" and r["counted"] and r["status"] != "ok"
    ]
    assert sum(sum(c["errors"].values()) for c in cells) == len(counted_errors) > 0

    # Every field a cell carries becomes a gauge with the same value; a field no cell carries, no
    # family.
    for field in CELL_FIELDS:
        carried = [c for c in cells if c.get(field.key) not in (None, {})]
        assert (field.name in found) == bool(carried), field.name
        if not carried:
            continue
        assert found[field.name].type == "gauge"
        expected = {}
        for c in carried:
            if field.label is None:
                expected[cell_key(c)] = float(c[field.key])
            else:
                expected.update(
                    {cell_key(c, **{field.label: k}): float(v) for k, v in c[field.key].items()}
                )
        assert by_labels(found[field.name]) == expected, field.name
    for name in (
        "kevload_cell_distinct_outputs",
        "kevload_cell_drift",
        "kevload_cell_drift_rate_ratio",
        "kevload_cell_drift_rate_upper_95_ratio",
        "kevload_cell_ok_requests",
        "kevload_cell_error_requests",
        "kevload_cell_requests_per_second",
        "kevload_cell_output_tokens_per_second",
    ):
        assert name in found, name
    assert {dict(k)["status"] for k in by_labels(found["kevload_cell_error_requests"])} >= {
        "http_500"
    }

    # Latency: a summary per kind, quantiles 0.5 / 0.9 / 0.99 / 1 (the maximum), _count and _sum.
    for field in LATENCY_FIELDS:
        carried = [c for c in cells if field.key in c["latency"]]
        assert (field.name in found) == bool(carried), field.name
        if not carried:
            continue
        family = found[field.name]
        assert family.type == "summary"
        quantiles, counts, sums = (
            by_labels(family),
            by_labels(family, field.name + "_count"),
            by_labels(family, field.name + "_sum"),
        )
        for c in carried:
            stats = c["latency"][field.key]
            for key, q in (("p50", "0.5"), ("p90", "0.9"), ("p99", "0.99"), ("max", "1")):
                assert quantiles[cell_key(c, quantile=q)] == stats[key]
            assert counts[cell_key(c)] == stats["n"]
            assert sums[cell_key(c)] == pytest.approx(stats["mean"] * stats["n"], abs=1e-6)
    for name in (
        "e2e_latency",
        "time_to_first_token",
        "inter_token_latency",
        "time_per_output_token",
    ):
        assert f"kevload_cell_{name}_seconds" in found, name

    run_labels = {"scenario": "s", "run_id": summary["run_id"]}
    verdicts = {dict(k)["verdict"]: v for k, v in by_labels(found["kevload_run_verdict"]).items()}
    assert verdicts == {
        "deterministic": 0,
        "nondeterministic": 1,
        "inconclusive": 0,
        "target_failed": 0,
    }
    assert summary["verdict"] == "nondeterministic"
    for name, key in (
        ("kevload_run_requests", "requests"),
        ("kevload_run_error_requests", "errors"),
        ("kevload_run_probe_error_ratio", "probe_error_share"),
        ("kevload_run_probe_requests", "probe_requests"),
        ("kevload_run_companion_error_requests", "companion_errors"),
    ):
        assert by_labels(found[name]) == {frozenset(run_labels.items()): summary[key]}, name
    ended = json.loads((run / "run" / "run.json").read_text())["ended_at"]
    assert by_labels(found["kevload_run_end_timestamp_seconds"]) == {
        frozenset(run_labels.items()): datetime.fromisoformat(ended).timestamp()
    }
    assert abs(datetime.fromisoformat(ended).timestamp() - time.time()) < 3600

    # Every series carries exactly the cell labels (plus its own), and the OpenMetrics parser
    # agrees.
    for family in found.values():
        for sample in family.samples:
            extra = set(sample.labels) - CELL_LABELS
            assert set(sample.labels) >= CELL_LABELS or family.name.startswith("kevload_run_"), (
                sample
            )
            assert len(extra) <= 1, sample
    assert [(s.name, s.labels, s.value) for f in parse_openmetrics(text) for s in f.samples] == [
        (s.name, s.labels, s.value) for f in parse_prometheus(text) for s in f.samples
    ]


def test_report_writes_the_same_metrics_from_the_records(run):
    """No server (it stopped with the fixture), no summary.json: the records alone give the same
    file."""
    (run / "run" / "summary.json").unlink()
    code, output = run_cli(
        "report", run / "run", "--format", "json", "--metrics", run / "report.prom"
    )
    assert code == 1, output
    assert (run / "report.prom").read_text() == (run / "run.prom").read_text()


def test_fields_other_parts_add_appear_only_when_present(run):
    summary = load_summary(run / "run")
    richer = copy.deepcopy(summary)
    optional = ("latent_drift", "goodput", "slo_attainment", "reconnects", "divergence_kinds")
    for cell in richer["cells"]:
        for key in optional:
            cell.pop(key, None)
    c1, c4 = (c for c in richer["cells"] if c["role"] == "probe")
    c1["latent_drift"] = False
    c4.update(
        latent_drift=True,
        goodput=12.5,
        slo_attainment=0.75,
        reconnects=2,
        divergence_kinds={"token": 3, "length": 1},
    )
    found = families(metrics_text(RunSummary.from_json(richer), {}))
    key4 = cell_key({**c4, "run_id": summary["run_id"]})
    key1 = cell_key({**c1, "run_id": summary["run_id"]})
    assert by_labels(found["kevload_cell_latent_drift"]) == {key1: 0.0, key4: 1.0}
    assert by_labels(found["kevload_cell_goodput_requests_per_second"]) == {key4: 12.5}
    assert by_labels(found["kevload_cell_slo_attainment_ratio"]) == {key4: 0.75}
    assert by_labels(found["kevload_cell_reconnects"]) == {key4: 2.0}
    assert by_labels(found["kevload_cell_divergent_outputs"]) == {
        key4 | {("kind", "token")}: 3.0,
        key4 | {("kind", "length")}: 1.0,
    }
    assert "kevload_run_end_timestamp_seconds" not in found  # no ended_at given

    for cell in richer["cells"]:
        for key in optional:
            cell.pop(key, None)
    bare = families(metrics_text(RunSummary.from_json(richer), {}))
    for name in (
        "kevload_cell_latent_drift",
        "kevload_cell_goodput_requests_per_second",
        "kevload_cell_slo_attainment_ratio",
        "kevload_cell_reconnects",
        "kevload_cell_divergent_outputs",
    ):
        assert name not in bare, name
    assert "kevload_cell_distinct_outputs" in bare


@pytest.mark.parametrize(
    "probe", ['a"b', "back\\slash", "line\nbreak", "literal \\n not a newline", '\\"', ""]
)
def test_label_values_round_trip(run, probe):
    doc = load_summary(run / "run")
    for cell in doc["cells"]:
        cell["probe"] = probe
    text = metrics_text(RunSummary.from_json(doc), {})
    assert_strict_escapes(text)
    found = families(text)
    probes = {dict(k)["probe"] for k in by_labels(found["kevload_cell_distinct_outputs"])}
    assert probes == {probe}


def test_the_file_is_replaced_whole_or_not_at_all(run, monkeypatch, tmp_path):
    summary = RunSummary.from_json(load_summary(run / "run"))
    target = tmp_path / "kevload.prom"
    target.write_text("# the previous night\n")

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(metrics.os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        write_metrics(target, summary, {})
    assert target.read_text() == "# the previous night\n"
    assert [p.name for p in tmp_path.iterdir()] == ["kevload.prom"]  # no temporary file left behind

    monkeypatch.undo()
    old_umask = os.umask(0o022)
    try:
        write_metrics(target, summary, {})
    finally:
        os.umask(old_umask)
    assert target.read_text() == metrics_text(summary, {})
    assert [p.name for p in tmp_path.iterdir()] == ["kevload.prom"]
    # node_exporter usually runs as another user: the file must be readable by it, not 0600.
    assert target.stat().st_mode & 0o777 == 0o644


def test_unwritable_metrics_path_fails_before_any_request(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
    missing = tmp_path / "no-such-dir" / "m.prom"
    code, output = run_cli(
        "run", scenario, "--out", tmp_path / "r", "--quiet", "--metrics", missing
    )
    assert code == 2
    assert (
        output.strip() == f"kevload: error: --metrics {missing}: "
        "expected a file in an existing, writable directory"
    )
    assert server.requests == []
    code, output = run_cli("report", tmp_path / "r", "--metrics", missing)
    assert code == 2 and output.startswith(f"kevload: error: --metrics {missing}: ")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}")
    code, output = run_cli("report", sweep, "--metrics", tmp_path / "m.prom")
    assert code == 2 and "is a sweep" in output and not (tmp_path / "m.prom").exists()
