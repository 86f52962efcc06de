"""Logprob claims at the edges: non-finite numbers in a body, logprobs for only some samples,
logprobs null or cut short under load (missing, not different), and one way of stating positions in
every renderer.

Each claim is tried against a server built to make it false: the fake server writes -inf, inf and
NaN the way Python's ``json.dumps`` does (``-Infinity``, ``Infinity``, ``NaN``), or returns logprobs
only to a request that had no other in flight.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from kevload.compare.summarizing import summarize
from kevload.guide.decision import decide
from kevload.guide.diagnosistext import diagnosis_text
from kevload.guide.evidence import Evidence, StepResult
from kevload.inputs.probe import Probe
from kevload.inputs.scenario import scenario_from_dict
from kevload.outputs.baseline import compare_to_baseline
from kevload.outputs.celltext import logprob_text
from kevload.outputs.html import run_report
from kevload.outputs.junit import junit_xml
from kevload.outputs.markdown import markdown
from kevload.outputs.metrics import metrics_text
from kevload.outputs.terminal import render
from kevload.outputs.verdict import verdict_line
from kevload.records.store import spell_logprobs
from kevload.records.summary import RunSummary
from kevload.wire.client import Client, build_body
from kevload.wire.decoding import _nonfinite_json
from kevload.wire.logprobcheck import logprob_fields
from tests.conftest import cells_by_level, load_summary, reduce_rows, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer
from tests.wire import test_logprobs as logprob_records

INF = math.inf
NONFINITE = {1: -INF, 2: math.nan, 3: INF}  # token positions of the fake server's answer


def strict_json(line: str) -> object:
    """JSON as the standard says it: NaN and Infinity are refused."""

    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(line, parse_constant=refuse)


# --- 1. non-standard numbers never cost the answer ---


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("backend", ["lean", "aiohttp"])
def test_client_reads_nonfinite_logprobs_as_what_they_mean(backend, api, stream):
    with FakeServer(Behaviour(latency=0.0, logprob_nonfinite=NONFINITE)) as server:
        scenario = scenario_from_dict(
            {
                "target": {"base_url": server.url, "model": "fake", "api": api},
                "probes": [{"id": "p", "prompt": "Say something."}],
            },
            source="t",
        )

        async def go():
            body = build_body(
                scenario.target,
                Probe(id="p", prompt="Say something."),
                logprob_fields(api),
                stream=stream,
                nonce=None,
            )
            async with Client(scenario.target, None, transport=backend) as client:
                return await client.send(body)

        outcome = asyncio.run(go())
    assert outcome.status == "ok", outcome.error
    assert (
        len(outcome.output.split(" ")) == 12
    )  # the whole answer, not cut where the odd number was
    assert (
        outcome.logprobs[1] == -INF
        and math.isnan(outcome.logprobs[2])
        and outcome.logprobs[3] == INF
    )
    assert all(math.isfinite(x) for i, x in enumerate(outcome.logprobs) if i not in NONFINITE)
    assert outcome.logprob_nonfinite == 3


def test_only_a_nonfinite_number_is_read_past_orjson():
    assert _nonfinite_json(b'{"a": [-Infinity, NaN, Infinity, 1e999]}')["a"][:1] == [-INF]
    doc = _nonfinite_json(b'{"a": NaN, "n": 123456789012345678901234567890}')
    assert isinstance(doc["n"], float)  # as orjson reads an integer beyond 64 bits
    assert _nonfinite_json(b'{"a": NaN') is None  # torn: still not JSON
    assert _nonfinite_json(b'{"a": NaN, "t": "\\ud800"}') is None  # a lone surrogate orjson refuses
    assert _nonfinite_json(b'{"a": nan}') is None  # not the spelling Python writes
    assert (
        _nonfinite_json(b'{"a": 1,}') is None
    )  # refused for another reason, no non-finite number in it


def test_spelled_logprobs_are_strict_json_and_read_back():
    spelled = spell_logprobs([-0.5, -INF, None, math.nan, INF])
    assert spelled == [-0.5, "-Infinity", None, "NaN", "Infinity"]
    assert strict_json(json.dumps(spelled)) == spelled
    assert [float(x) for x in spelled if isinstance(x, str)][::2] == [-INF, INF]


@pytest.fixture(params=["lean", "aiohttp"])
def backend(request, monkeypatch):
    monkeypatch.setenv("KEVLOAD_HTTP", request.param)
    return request.param


@pytest.mark.parametrize(
    ("api", "stream"),
    [("chat", False), ("chat", True), ("completions", False), ("completions", True)],
)
def test_nonfinite_logprobs_end_to_end(tmp_path, backend, api, stream):
    with FakeServer(Behaviour(latency=0.01, logprob_nonfinite=NONFINITE)) as server:
        scenario = write_scenario(
            tmp_path / "s.toml",
            server.url,
            target={"api": api},
            stream=stream,
            concurrency=[1, 2],
            samples=3,
        )
        code, output = run_cli(
            "run", scenario, "--out", tmp_path / "run", "--quiet", "--fail-on", "latent"
        )
    assert code == 0, output  # before: every answer malformed, target failed (exit 3)
    summary = load_summary(tmp_path / "run")
    assert summary["verdict"] == "deterministic" and summary["errors_by_type"] == {}
    for cell in cells_by_level(summary).values():
        assert cell["ok"] == 3 and cell["distinct"] == 1 and cell["errors"] == {}
        assert cell["logprob_nonfinite_samples"] == 3 and cell["logprobs_missing"] == 0
        assert (
            cell["logprob_bitwise"] is True and cell["latent_drift"] is False
        )  # -inf equals -inf, NaN NaN
        assert cell["logprob_max_abs_diff"] == 0.0
    assert "logprobs bitwise equal to serial in every cell (n=6)" in output
    # Records stay standard JSON and keep what the server sent.
    lines = [
        line
        for path in sorted((tmp_path / "run").glob("records*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    records = [strict_json(line) for line in lines]
    probes = [r for r in records if r["role"] == "probe"]
    assert probes and all(r["logprobs"][1:4] == ["-Infinity", "NaN", "Infinity"] for r in probes)
    assert all(r["logprob_nonfinite"] == 3 for r in probes)
    code, text = run_cli("report", tmp_path / "run", "--format", "json")
    assert (
        code == 0 and json.loads(text)["cells"] == summary["cells"]
    )  # recomputed from disk, the same
    code, text = run_cli("report", tmp_path / "run", "--format", "markdown")
    assert text.count("| bitwise = (3); 3 with a non-finite logprob |") == 2, text


class Records(logprob_records.Records):
    """Records as the engine writes them: logprobs spelled as it spells them, and the params that
    asked."""

    def add(
        self,
        text: str,
        *,
        n: int = 1,
        level: int = 1,
        tokens: list[int] | None = None,
        logprobs: list | None = None,
        asked: bool = True,
    ) -> Records:
        first = len(self.rows)
        super().add(
            text,
            n=n,
            level=level,
            tokens=tokens,
            logprobs=spell_logprobs(logprobs) if logprobs is not None else None,
        )
        nonfinite = sum(1 for x in logprobs or () if x is not None and not math.isfinite(x))
        for row in self.rows[first:]:
            row.update(logprob_nonfinite=nonfinite, params={"logprobs": True} if asked else {})
        return self

    def summary(self) -> RunSummary:
        return summarize(reduce_rows(self.rows))

    def cells(self) -> dict:
        return cells_by_level(self.summary())


TEXT, TOKENS = "a b c d", [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("other", "first", "diff"),
    [
        ([-1.0, -INF, math.nan, -4.0], None, 0.0),  # the same bytes: equal
        ([-1.0, -INF, None, -4.0], 2, 0.0),  # NaN against a missing logprob: not the same answer
        (
            [-1.0, -30.0, math.nan, -4.0],
            1,
            0.0,
        ),  # -inf against a number: differs, no size between them
        ([-1.0, INF, math.nan, -4.0], 1, 0.0),  # -inf against +inf
        ([-1.0, -INF, -3.0, -4.0], 2, 0.0),  # NaN against a number
        ([-1.0, -INF, math.nan, -4.25], 3, 0.25),  # a finite difference is measured as before
    ],
)
def test_nonfinite_values_compare_as_what_they_mean(other, first, diff):
    serial = [-1.0, -INF, math.nan, -4.0]
    cells = (
        Records()
        .add(TEXT, n=3, tokens=TOKENS, logprobs=serial)
        .add(TEXT, n=2, level=2, tokens=TOKENS, logprobs=other)
        .cells()
    )
    cell = cells[2]
    assert cell.logprob_samples == 2 and cell.first_logprob_divergence_token == first
    assert cell.logprob_bitwise is (first is None) and cell.latent_drift is (first is not None)
    assert cell.logprob_max_abs_diff == diff
    assert cell.logprob_nonfinite_samples == 2 and cells[1].logprob_nonfinite_samples == 3


def test_nonfinite_comparison_does_not_depend_on_order_or_split():
    records = Records().add(TEXT, n=5, tokens=TOKENS, logprobs=[-1.0, -INF, math.nan, -4.0])
    for i in range(300):  # past one fold batch (256) and the 16 counted vectors
        records.add(TEXT, level=4, tokens=TOKENS, logprobs=[-1.0, -INF, math.nan, -4.0 - i * 1e-6])
    records.add(TEXT, level=4, tokens=TOKENS, logprobs=[-1.0, -INF, None, -4.0])
    whole = records.summary()
    parts = [reduce_rows(records.rows[i::3]) for i in range(3)]
    for part in parts[1:]:
        parts[0].merge(part)
    assert summarize(parts[0]) == whole
    cell = cells_by_level(whole)[4]
    assert cell.first_logprob_divergence_token == 2 and cell.logprob_max_abs_diff == pytest.approx(
        299e-6
    )
    assert cell.logprob_nonfinite_samples == 301


# --- 2. logprob claims cover only the samples they cover ---


def table_text(summary: RunSummary) -> str:
    out = io.StringIO()
    render(summary, "table", Console(file=out, width=250, color_system=None))
    return out.getvalue()


def gap_records(loaded: list) -> Records:
    """Serial: 6 samples with logprobs. c=4: 6 samples with the serial text, two of them with
    ``loaded``."""
    serial = [-1.0, -2.0, -3.0, -4.0]
    records = Records().add(TEXT, n=6, tokens=TOKENS, logprobs=serial)
    return records.add(TEXT, n=2, level=4, tokens=TOKENS, logprobs=loaded).add(
        TEXT, n=4, level=4, tokens=TOKENS
    )


def test_a_cell_with_missing_logprobs_makes_no_claim():
    summary = gap_records([-1.0, -2.0, -3.0, -4.0]).summary()
    cell = cells_by_level(summary)[4]
    assert (
        cell.logprob_bitwise is None and cell.latent_drift is None
    )  # 2 of 6 agreeing prove nothing
    assert (cell.logprob_samples, cell.logprobs_missing, cell.ok) == (2, 4, 6)
    assert cell.logprob_gap and summary.logprob_gap_cells == ("p1@single/c=4",)
    assert cells_by_level(summary)[1].logprob_bitwise is True
    line = verdict_line(summary)
    assert "logprobs in 2 of 6 at p1 (single) c=4: no logprob claim" in line
    assert "bitwise equal" not in line
    assert logprob_text(cell) == "no claim: logprobs in 2 of 6"
    rendered = {
        "markdown": markdown(summary),
        "table": table_text(summary),
        "junit": junit_xml(summary),
        "html": run_report(summary, {}, []),
        "junit latent": junit_xml(summary, fail_on="latent"),
    }
    for name, text in rendered.items():
        assert "no claim: logprobs in 2 of 6" in text or "logprobs in 2 of 6 at" in text, name
        assert "bitwise = (2)" not in text and "bitwise equal to serial in every" not in text, name
    assert (
        'type="logprobs_missing"' in rendered["junit latent"]
        and 'failures="1"' in rendered["junit latent"]
    )
    assert "<failure" not in rendered["junit"]
    found = {f.name: f for f in text_string_to_metric_families(metrics_text(summary, {}))}
    levels = {
        name: {s.labels["level"]: s.value for s in found[name].samples}
        for name in ("kevload_cell_logprob_bitwise", "kevload_cell_logprob_missing_samples")
    }
    assert levels == {
        "kevload_cell_logprob_bitwise": {"c=1": 1.0},
        "kevload_cell_logprob_missing_samples": {"c=1": 0.0, "c=4": 4.0},
    }
    assert {s.labels["level"] for s in found["kevload_cell_latent_drift"].samples} == {"c=1"}


def test_a_difference_among_the_covered_samples_is_still_evidence():
    summary = gap_records([-1.0, -2.0, -3.5, -4.0]).summary()
    cell = cells_by_level(summary)[4]
    assert (
        cell.logprob_bitwise is False
        and cell.latent_drift is True
        and cell.first_logprob_divergence_token == 2
    )
    assert summary.latent_cells == ("p1@single/c=4",) and summary.logprob_gap_cells == (
        "p1@single/c=4",
    )
    line = verdict_line(summary)
    assert (
        "latent drift (same text, other logprobs) in p1 (single) c=4 from token 2 (0-based)" in line
    )
    assert line.endswith(
        "; logprobs in 2 of 6 at p1 (single) c=4"
    )  # named, yet the difference is a claim
    assert logprob_text(cell) == "≠ from token 2 (0-based), max abs diff 0.5 (2 of 6)"


def test_an_output_whose_tokens_cannot_be_lined_up_is_not_covered():
    records = Records().add(TEXT, n=4, tokens=TOKENS, logprobs=[-1.0, -2.0, -3.0, -4.0])
    records.add(TEXT, n=3, level=2, tokens=TOKENS, logprobs=[-1.0, -2.0, -3.0, -4.0])
    records.add(
        "other", n=1, level=2, tokens=None, logprobs=None, asked=False
    )  # nothing to line up by
    cell = records.cells()[2]
    assert cell.drift and cell.logprob_samples == 3 and cell.ok == 4 and cell.logprobs_missing == 0
    assert cell.logprob_bitwise is None and cell.logprob_gap


def test_no_logprob_fields_where_none_were_asked_or_returned():
    cell = Records().add(TEXT, n=2, asked=False).add(TEXT, n=2, level=2, asked=False).cells()[2]
    assert (
        cell.logprobs_missing is None
        and cell.logprob_nonfinite_samples is None
        and not cell.logprob_gap
    )
    assert "logprobs_missing" not in cell.to_json()


@pytest.fixture
def alone_server():
    # Logprobs only for a request nothing else overlapped; a long latency makes every c=4 sample
    # overlap.
    with FakeServer(Behaviour(logprobs_alone_only=True, latency=0.3)) as fake:
        yield fake


def test_logprobs_only_when_alone_end_to_end(tmp_path, alone_server):
    scenario = write_scenario(tmp_path / "s.toml", alone_server.url, concurrency=[1, 4], samples=4)
    code, output = run_cli(
        "run",
        scenario,
        "--out",
        tmp_path / "run",
        "--fail-on",
        "latent",
        "--junit",
        tmp_path / "j.xml",
        "--metrics",
        tmp_path / "m.prom",
    )
    assert code == 3, output  # --fail-on latent: latent drift neither shown nor ruled out at c=4
    summary = load_summary(tmp_path / "run")
    cells = cells_by_level(summary)
    assert cells[1]["logprob_bitwise"] is True and cells[1]["logprobs_missing"] == 0
    loaded = cells[4]
    assert loaded["ok"] == 4 and loaded["logprobs_missing"] == 4 and "logprob_samples" not in loaded
    assert summary["verdict"] == "deterministic" and summary["logprob_gap_cells"] == [
        "p1@single/c=4"
    ]
    flat = " ".join(output.split())
    assert "logprobs in 0 of 4 at p1 (single) c=4: no logprob claim" in flat
    assert "bitwise equal to serial in every cell" not in flat
    assert 'type="logprobs_missing"' in (tmp_path / "j.xml").read_text()
    prom = (tmp_path / "m.prom").read_text()
    assert (
        'kevload_cell_logprob_missing_samples{scenario="s",probe="p1",mode="single",level="c=4"'
        in prom
    )
    assert (
        'kevload_cell_logprob_bitwise{scenario="s",probe="p1",mode="single",level="c=4"' not in prom
    )
    code, text = run_cli("report", tmp_path / "run", "--format", "json")
    assert json.loads(text)["cells"] == summary["cells"]
    code, output = run_cli("run", scenario, "--out", tmp_path / "run2", "--quiet")
    assert code == 0, output  # text is the default claim, and it held


def test_diagnose_names_the_logprob_gap(tmp_path, alone_server):
    alone_server.behaviour.latency = 0.2
    code, output = run_cli(
        "diagnose",
        "--url",
        alone_server.url,
        "--model",
        "fake",
        "--prompt",
        "Tell me a fact.",
        "--samples",
        "3",
        "--max-concurrency",
        "2",
        "--json",
        tmp_path / "d.json",
        "--out",
        tmp_path / "runs",
    )
    d = json.loads((tmp_path / "d.json").read_text())
    assert code == 0 and d["verdict"] == "stable", output
    assert d["evidence"] == "text"  # not "logprobs_bitwise": c=2 had none
    steps = {s["step"]: s for s in d["steps"]}
    gap = "logprobs in 0 of 3 at probe@single/c=2: no logprob claim"
    assert steps["concurrency_single"]["logprob_gaps"] == [gap]
    assert (
        "logprob_bitwise" not in steps["concurrency_single"]
        and "logprob_gaps" not in steps["fixed"]
    )
    assert re.search(
        r"4 concurrency \[1, 2\], single: 1 distinct, n=3[^\n]*; " + re.escape(gap), output
    ), output


def test_baseline_neither_calls_a_gap_a_regression_nor_lets_it_hide_one():
    full = Records().add(TEXT, n=6, tokens=TOKENS, logprobs=[-1.0, -2.0, -3.0, -4.0])
    full.add(TEXT, n=6, level=4, tokens=TOKENS, logprobs=[-1.0, -2.0, -3.0, -4.0])
    bitwise = full.summary()
    agreeing_gap = gap_records([-1.0, -2.0, -3.0, -4.0]).summary()
    differing_gap = gap_records([-1.0, -2.0, -3.5, -4.0]).summary()
    assert (
        compare_to_baseline(agreeing_gap, bitwise) == []
    )  # fewer logprobs is no regression by itself
    assert (
        compare_to_baseline(agreeing_gap, differing_gap) == []
    )  # two agreeing samples do not fix it
    changes = compare_to_baseline(differing_gap, bitwise)
    assert [(c.kind, c.regression) for c in changes] == [("new_latent_drift", True)]
    assert (
        "differ from token 2 (0-based) (baseline: bitwise equal in 6 samples)" in changes[0].detail
    )
    changes = compare_to_baseline(differing_gap, agreeing_gap)
    assert [c.kind for c in changes] == ["new_latent_drift"]
    assert "(baseline: no logprob claim, logprobs in 2 of 6, those equal)" in changes[0].detail


# --- 3. presentation: counts as counts, one position convention, all ≠ serial ---


def test_every_format_states_one_divergence_at_the_same_position():
    serial = "alpha bravo charlie delta echo foxtrot golf hotel india"
    # leaves serial at char 50, token 8
    other = "alpha bravo charlie delta echo foxtrot golf hotel zulu"
    tokens = list(range(9))
    records = Records().add(serial, n=4, tokens=tokens, logprobs=[-1.0] * 9)
    records.add(serial, n=1, level=2, tokens=tokens, logprobs=[-1.0] * 9)
    records.add(other, n=7, level=2, tokens=tokens[:8] + [99], logprobs=[-1.0] * 9)
    records.add(
        serial, n=4, level=4, tokens=tokens, logprobs=[-1.0] * 5 + [-1.5] * 4
    )  # latent, from token 5
    summary = records.summary()
    cells = cells_by_level(summary)
    assert (cells[2].first_divergence_chars, cells[2].first_divergence_tokens) == (50, 8)
    assert cells[4].first_logprob_divergence_token == 5
    where, latent = "char 50 / token 8 (0-based)", "token 5 (0-based)"
    formats = {
        "verdict": verdict_line(summary),
        "markdown": markdown(summary),
        "table": table_text(summary),
        "html": run_report(summary, {}, []),
        "junit": junit_xml(summary, fail_on="latent"),
    }
    for name, text in formats.items():
        flat = " ".join(text.split())
        assert where in flat, name
        assert latent in flat, name
        # A count is never written where a position could be read: "(kinds: 7× token)", not "(token
        # 7)".
        assert "(token 7)" not in flat and "token 7 " not in flat, name
    assert "(kinds: 7× token)" in formats["verdict"]
    bitwise = Records().add(serial, n=4, tokens=tokens, logprobs=[-1.0] * 9)
    bitwise.add(serial, n=4, level=4, tokens=tokens, logprobs=[-1.0] * 9)
    assert [c.detail for c in compare_to_baseline(summary, bitwise.summary())] == [
        "new cell (not in the baseline); 2 distinct in 8, first divergence at char 50 (0-based)",
        f"same text as serial, logprobs differ from {latent} (baseline: bitwise equal in 4 "
        f"samples)",
    ]
    # diagnose: the same cell, as its concurrency step records it.
    fixed = StepResult(
        key="fixed",
        title="2 randomness fixed (serial)",
        params={},
        levels=(1,),
        samples=4,
        ok=4,
        distinct=1,
        logprob_bitwise=True,
    )
    loaded = StepResult(
        key="concurrency_single",
        title="4 concurrency [1, 2, 4], single",
        params={},
        levels=(1, 2, 4),
        samples=4,
        ok=4,
        distinct=2,
        drift_cells=("p1@single/c=2",),
        logprob_bitwise=False,
        latent_cells=("p1@single/c=4",),
        latent_from=cells[4].first_logprob_divergence_token,
    )
    text = diagnosis_text(decide(Evidence(steps=(fixed, loaded))).to_json())
    assert f"p1@single/c=4; from {latent})" in text, text


def test_diagnose_step_line_says_one_output_other_than_serial_as_the_matrix_does(tmp_path):
    # Crowded requests all get one fixed other answer: one output at c=2, and it is not serial's.
    with FakeServer(Behaviour(drift_at=2, batched_variant=True, latency=0.2)) as server:
        code, output = run_cli(
            "diagnose",
            "--url",
            server.url,
            "--model",
            "fake",
            "--prompt",
            "Tell me a fact.",
            "--samples",
            "3",
            "--max-concurrency",
            "2",
            "--json",
            tmp_path / "d.json",
            "--out",
            tmp_path / "runs",
        )
    d = json.loads((tmp_path / "d.json").read_text())
    assert code == 1 and d["verdict"] == "crosstalk", output
    single = {s["step"]: s for s in d["steps"]}["concurrency_single"]
    assert single["distinct"] == 1 and single["drift_cells"] == ["probe@single/c=2"]
    assert "4 concurrency [1, 2], single: 1, all ≠ serial, n=3" in output
    assert "1 distinct, n=3, drift at" not in output


def test_the_docs_state_the_position_convention_once():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "logprobs.md").read_text(
        encoding="utf-8"
    )
    assert page.startswith("# Logprobs and agreement rates")
    assert page.count("Positions count from 0") == 1


class _NullWhenCrowded(FakeServer):
    """Per-token logprobs as numbers to a request that ran alone (the capability check, serial
    samples), and ``"logprob": null`` on every token to one that had others beside it: a server that
    gives no values under load."""

    def _logprobs(self, body, text, overlap):
        values = super()._logprobs(body, text, overlap)
        return [None] * len(values) if values is not None and overlap > 1 else values


class _CutWhenCrowded(FakeServer):
    """The serial logprobs in full; under load the same numbers for the first two tokens only, the
    rest left out (fewer entries than tokens, the text unchanged)."""

    def _logprobs(self, body, text, overlap):
        self._cut = overlap > 1
        return super()._logprobs(body, text, overlap)

    def _logprob_doc(self, pieces, values, chat, start):
        if self._cut:
            pieces, values = pieces[:2], values[:2]
        return super()._logprob_doc(pieces, values, chat, start)


def _crowded_run(tmp_path, server_class):
    with server_class(Behaviour(latency=0.1)) as server:
        scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=6)
        code, output = run_cli(
            "run", scenario, "--out", tmp_path / "run", "--quiet", "--fail-on", "latent"
        )
        # Ground truth: every counted loaded answer ran beside others, so it carried no (or cut)
        # logprobs.
        crowded = sum(1 for body in server.requests if body.get("logprobs"))
    assert crowded > 0
    return code, " ".join(output.split()), cells_by_level(load_summary(tmp_path / "run"))


def test_logprobs_null_on_every_token_are_missing_not_latent_drift(tmp_path):
    code, output, cells = _crowded_run(tmp_path, _NullWhenCrowded)
    loaded = cells[4]
    assert loaded["distinct"] == 1 and cells[1]["logprob_bitwise"] is True
    # Not one logprob value came back at c=4: the samples asked and got none.
    assert loaded["logprobs_missing"] == loaded["ok"] == 6, loaded
    assert loaded.get("logprob_bitwise") is None and loaded.get("latent_drift") is None, loaded
    assert (
        "latent drift" not in output
        and "logprobs in 0 of 6 at p1 (single) c=4: no logprob claim" in output
    )
    assert code == 3, (
        output
    )  # --fail-on latent: latent drift neither shown nor ruled out (before: 1)


def test_logprobs_with_fewer_entries_than_tokens_are_no_latent_drift(tmp_path):
    code, output, cells = _crowded_run(tmp_path, _CutWhenCrowded)
    loaded = cells[4]
    assert loaded["distinct"] == 1 and loaded["token_agreement"] == 1.0
    # Every logprob the server gave equals serial's at its position; the others were not given, not
    # different.
    assert loaded.get("latent_drift") is not True and loaded.get("logprob_bitwise") is not False, (
        loaded
    )
    assert "latent drift" not in output, output
    assert code == 3, (
        output
    )  # no logprob claim over the cut tokens: inconclusive with --fail-on latent (before: 1)
