"""Per-token logprobs: asked for, read, compared with the serial reference; latent drift; agreement
rates with intervals.

The comparator tests build records directly (exact expected numbers, no server). The end-to-end
tests use the fake server with logprobs that are a fixed function of word and position, or that move
(the text staying put) once requests overlap: ``logprob_drift_at``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re

import pytest

from kevload.compare.stats import mean_share_interval, wilson_interval
from kevload.compare.summarizing import summarize
from kevload.inputs.probe import Probe
from kevload.inputs.scenario import ScenarioError, load_scenario, scenario_from_dict
from kevload.outputs.celltext import cell_text, logprob_text
from kevload.outputs.junit import junit_xml
from kevload.outputs.markdown import markdown
from kevload.outputs.verdict import verdict_line
from kevload.records.summary import CellSummary, RunSummary
from kevload.wire.client import Client, build_body
from kevload.wire.logprobcheck import ask_for_logprobs, logprob_fields
from tests.conftest import (
    cells_by_level,
    crafted_times,
    load_summary,
    reduce_rows,
    run_cli,
    write_scenario,
)
from tests.fakeserver import Behaviour, FakeServer

# --- the pure parts: Wilson interval and the mean-share interval ---


def wilson_reference(k: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson's interval as the roots of |p̂ - p| = z·sqrt(p(1-p)/n), solved as a quadratic in p."""
    p = k / n
    a, b, c = 1 + z * z / n, -(2 * p + z * z / n), p * p
    root = (b * b - 4 * a * c) ** 0.5
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


@pytest.mark.parametrize(
    ("k", "n", "published"),
    [
        (8, 8, (0.6756, 1.0)),
        (0, 8, (0.0, 0.3244)),
        (5, 10, (0.2366, 0.7634)),
        (5, 8, (0.3057, 0.8632)),
    ],
)
def test_wilson_interval_against_published_values_and_the_quadratic(k, n, published):
    low, high = wilson_interval(k, n)
    assert (round(low, 4), round(high, 4)) == published
    assert (low, high) == pytest.approx(wilson_reference(k, n), abs=1e-12)


def test_wilson_interval_without_samples_claims_nothing():
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_mean_share_interval_is_wilson_on_the_summed_shares():
    mean, low, high = mean_share_interval([(1.0, 5), (0.5, 2), (0.8, 1)])
    assert mean == pytest.approx(0.85)
    assert (low, high) == pytest.approx(wilson_reference(6.8, 8), abs=1e-12)
    # Full agreement keeps a width: 8 samples cannot prove 100 %.
    assert mean_share_interval([(1.0, 8)]) == pytest.approx((1.0, 0.6755924, 1.0), abs=1e-6)
    assert mean_share_interval([]) is None


# --- the comparator on crafted records ---


class Records:
    """Records as the engine writes them, with tokens and logprobs."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(
        self,
        text: str,
        *,
        n: int = 1,
        level: int = 1,
        tokens: list[int] | None = None,
        logprobs: list[float | None] | None = None,
    ) -> Records:
        for _ in range(n):
            seq = len(self.rows)
            self.rows.append(
                {
                    "run_id": "r",
                    "seq": seq,
                    "probe": "p1",
                    "role": "probe",
                    "mode": "single",
                    "concurrency": level,
                    "rate": None,
                    "status": "ok",
                    "output": text,
                    "sha256": hashlib.sha256(text.encode()).hexdigest(),
                    "finish_reason": "stop",
                    "completion_tokens": len(tokens or []),
                    "token_ids": tokens,
                    "logprobs": logprobs,
                    "chunks": 0,
                    **crafted_times(seq, level),
                }
            )
        return self

    def cells(self) -> dict[int, dict]:
        return {c.concurrency: c for c in summarize(reduce_rows(self.rows)).cells}


SERIAL_TEXT, SERIAL_TOKENS, SERIAL_LP = "a b c d", [1, 2, 3, 4], [-1.0, -2.0, -3.0, -4.0]


def test_agreement_rates_of_crafted_outputs():
    records = Records().add(SERIAL_TEXT, n=8, tokens=SERIAL_TOKENS)
    records.add(SERIAL_TEXT, n=5, level=4, tokens=SERIAL_TOKENS)
    records.add("a b x y", n=2, level=4, tokens=[1, 2, 9, 9])  # 2 of 4 positions agree
    records.add("a b c d e", n=1, level=4, tokens=[1, 2, 3, 4, 5])  # 4 of 5 (the longer length)
    cells = records.cells()
    serial, crowded = cells[1], cells[4]
    assert serial.exact_match_rate == 1.0 and serial.exact_match_ci95 == [0.675592, 1.0]
    assert serial.token_agreement == 1.0 and serial.token_agreement_ci95 == [0.675592, 1.0]
    assert serial.drift_rate_upper_95 == 0.312344  # kept for clean cells
    assert crowded.exact_match_rate == 0.625
    assert crowded.exact_match_ci95 == [0.305742, 0.863156]  # Wilson, 5 of 8
    assert crowded.token_agreement == 0.85  # (5 × 1 + 2 × 0.5 + 0.8) / 8
    assert crowded.token_agreement_ci95 == [0.503533, 0.969382]  # Wilson on 6.8 of 8
    assert crowded.drift_rate_upper_95 is None


def test_agreement_without_tokens_has_the_exact_match_rate_only():
    records = (
        Records().add(SERIAL_TEXT, n=4).add(SERIAL_TEXT, n=3, level=2).add("other", n=1, level=2)
    )
    crowded = records.cells()[2]
    assert crowded.exact_match_rate == 0.75 and crowded.exact_match_ci95 == [0.300642, 0.954413]
    assert crowded.token_agreement is None and crowded.token_agreement_ci95 is None
    assert (
        crowded.logprob_samples is None
        and crowded.logprob_bitwise is None
        and crowded.latent_drift is None
    )


def test_latent_drift_in_crafted_records():
    records = Records().add(SERIAL_TEXT, n=6, tokens=SERIAL_TOKENS, logprobs=SERIAL_LP)
    records.add(SERIAL_TEXT, n=3, level=2, tokens=SERIAL_TOKENS, logprobs=SERIAL_LP)
    records.add(SERIAL_TEXT, n=1, level=2, tokens=SERIAL_TOKENS, logprobs=[-1.0, -2.0, -3.5, -4.0])
    records.add(SERIAL_TEXT, n=4, level=4, tokens=SERIAL_TOKENS, logprobs=SERIAL_LP)
    cells = records.cells()
    assert (cells[1].logprob_samples, cells[1].logprob_bitwise, cells[1].latent_drift) == (
        6,
        True,
        False,
    )
    assert cells[1].logprob_max_abs_diff == 0.0 and cells[1].first_logprob_divergence_token is None
    latent = cells[2]
    assert not latent.drift and latent.distinct == 1
    assert latent.latent_drift is True and latent.logprob_bitwise is False
    assert latent.logprob_samples == 4
    assert latent.first_logprob_divergence_token == 2
    assert latent.logprob_max_abs_diff == 0.5
    assert cells[4].logprob_bitwise is True and not cells[4].latent_drift
    assert cell_text(latent) == "1 ~" and cell_text(cells[4]) == "1"
    summary = summarize(reduce_rows(records.rows))
    assert summary.verdict == "deterministic"  # latent drift is no text drift
    assert summary.latent_cells == ("p1@single/c=2",) and summary.matrix["latent"] == [
        [False, True, False]
    ]
    assert verdict_line(summary).endswith(
        "; latent drift (same text, other logprobs) in p1 (single) c=2 from token 2 (0-based)"
    )


def test_a_text_divergent_output_is_compared_up_to_its_first_other_token():
    records = Records().add(SERIAL_TEXT, n=4, tokens=SERIAL_TOKENS, logprobs=SERIAL_LP)
    # Same logprobs on the two shared tokens, then another token: it differs where the token does.
    records.add("a b x y", n=2, level=2, tokens=[1, 2, 9, 9], logprobs=[-1.0, -2.0, -0.1, -0.2])
    records.add(SERIAL_TEXT, n=2, level=2, tokens=SERIAL_TOKENS, logprobs=SERIAL_LP)
    cell = records.cells()[2]
    assert cell.drift and not cell.latent_drift  # text drift, never also called latent
    assert cell.logprob_samples == 4 and cell.logprob_bitwise is False
    assert cell.first_logprob_divergence_token == 2 and cell.logprob_max_abs_diff == 0.0


def test_reference_is_the_most_common_serial_vector_and_nulls_compare_as_nulls():
    odd = [-1.0, -2.0, -3.0, -4.5]  # the first (cold) serial answer's numerics differ
    usual = [None, -2.0, -3.0, -4.0]  # a server that gives the first token no logprob
    records = Records().add(SERIAL_TEXT, tokens=SERIAL_TOKENS, logprobs=odd)
    records.add(SERIAL_TEXT, n=3, tokens=SERIAL_TOKENS, logprobs=usual)
    records.add(SERIAL_TEXT, n=4, level=2, tokens=SERIAL_TOKENS, logprobs=usual)
    cells = records.cells()
    assert cells[2].logprob_bitwise is True and cells[2].logprob_max_abs_diff == 0.0
    # The serial cell itself wobbles: latent at the reference level, from token 0 (a number vs a
    # null).
    assert cells[1].latent_drift and cells[1].first_logprob_divergence_token == 0
    assert cells[1].logprob_max_abs_diff == 0.5


def test_a_shorter_vector_is_no_evidence_past_its_end():
    # Fewer logprobs than tokens, every value given the serial one: not other logprobs, only fewer
    # of them.
    records = Records().add(SERIAL_TEXT, n=2, tokens=SERIAL_TOKENS, logprobs=SERIAL_LP)
    records.add(SERIAL_TEXT, n=1, level=2, tokens=SERIAL_TOKENS, logprobs=SERIAL_LP[:3])
    records.add(SERIAL_TEXT, n=2, level=2, tokens=SERIAL_TOKENS, logprobs=SERIAL_LP)
    cell = records.cells()[2]
    assert (cell.logprob_samples, cell.logprobs_partial, cell.logprobs_missing) == (2, 1, 0)
    assert cell.logprob_bitwise is None and cell.latent_drift is None and cell.logprob_gap
    assert (
        "logprobs in 2 of 3 at p1 (single) c=2 (1 with fewer logprobs than tokens): no logprob "
        "claim" in verdict_line(summarize(reduce_rows(records.rows)))
    )


def test_a_shorter_vector_that_differs_where_it_has_values_is_latent_drift():
    records = Records().add(SERIAL_TEXT, n=2, tokens=SERIAL_TOKENS, logprobs=SERIAL_LP)
    records.add(
        SERIAL_TEXT,
        n=1,
        level=2,
        tokens=SERIAL_TOKENS,
        logprobs=[*SERIAL_LP[:2], SERIAL_LP[2] + 1e-6],
    )
    cell = records.cells()[2]
    assert (
        cell.latent_drift
        and cell.logprob_bitwise is False
        and cell.first_logprob_divergence_token == 2
    )


def test_logprob_comparison_does_not_depend_on_record_order_or_file_split():
    rng = random.Random(7)
    records = Records().add(SERIAL_TEXT, n=20, tokens=SERIAL_TOKENS, logprobs=SERIAL_LP)
    for _ in range(
        300
    ):  # more than it counts (16) and than one fold batch (256): the envelope keeps it exact
        noisy = [x + (rng.uniform(-1e-5, 1e-5) if i >= 1 else 0.0) for i, x in enumerate(SERIAL_LP)]
        records.add(SERIAL_TEXT, level=4, tokens=SERIAL_TOKENS, logprobs=noisy)
    whole = summarize(reduce_rows(records.rows))
    rows = list(records.rows)
    rng.shuffle(rows)
    parts = [reduce_rows(rows[i::3]) for i in range(3)]
    for part in parts[1:]:
        parts[0].merge(part)
    assert summarize(parts[0]) == summarize(reduce_rows(rows)) == whole
    cell = {c.concurrency: c for c in whole.cells}[4]
    expected = max(
        abs(r["logprobs"][i] - SERIAL_LP[i]) for r in records.rows[20:] for i in range(4)
    )
    assert cell.logprob_max_abs_diff == expected and cell.first_logprob_divergence_token == 1


# --- what the client asks for and reads ---


def probe_outcome(server: FakeServer, api: str, stream: bool):
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
        async with Client(scenario.target, None) as client:
            return await client.send(body)

    return asyncio.run(go())


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("api", "style", "ids"),
    [
        ("chat", "openai", False),
        ("chat", "openai", True),
        ("completions", "openai", False),
        ("completions", "content", False),
    ],
)
def test_client_reads_logprobs_of_every_shape(api, style, ids, stream):
    behaviour = Behaviour(completions_logprobs=style, logprob_ids=ids, latency=0.0)
    with FakeServer(behaviour) as server:
        outcome = probe_outcome(server, api, stream)
        body = server.requests[-1]
    assert outcome.status == "ok"
    assert body["logprobs"] == (True if api == "chat" else 1)
    assert body.get("top_logprobs") == (1 if api == "chat" else None)
    words = outcome.output.split(" ")
    assert outcome.tokens == [w if i == 0 else " " + w for i, w in enumerate(words)]
    assert len(outcome.logprobs) == len(words) and all(x < 0 for x in outcome.logprobs)
    expected = FakeServer(behaviour)._logprobs({"logprobs": True}, outcome.output, overlap=1)
    assert outcome.logprobs == expected  # bitwise: what the server sent, streamed or whole
    assert outcome.token_ids == (
        [1000 + __import__("tests.fakeserver").fakeserver.WORDS.index(w) for w in words]
        if ids
        else None
    )


def test_client_keeps_logprobs_aligned_with_their_tokens():
    from kevload.wire.answer import _Accumulator
    from kevload.wire.decoding import _STRICT

    acc = _Accumulator()
    for event in (
        b'{"choices": [{"logprobs": {"tokens": ["a", " b", " c"], '
        b'"token_logprobs": [null, -0.5]}}]}',
        b'{"choices": [{"logprobs": {"content": [{"token": " d", "logprob": -1, "id": 4}]}}]}',
    ):
        answer = _STRICT.decode(event)
        acc.take_extras(answer, answer.choices[0])
    assert acc.tokens == ["a", " b", " c", " d"]
    assert acc.logprobs == [
        None,
        -0.5,
        None,
        -1.0,
    ]  # a missing one is null, never a shifted neighbour
    assert acc.logprob_ids is None  # one piece came without ids: no partial id list


# --- load.logprobs: auto, true, false, and the user's own params ---


def scenario_for(url: str, **load) -> object:
    return scenario_from_dict(
        {
            "target": {"base_url": url, "model": "fake"},
            "load": load,
            "probes": [{"id": "p", "prompt": "x"}],
        },
        source="t",
    )


def test_ask_for_logprobs_settings(server):
    said: list[str] = []
    scenario, info = asyncio.run(ask_for_logprobs(scenario_for(server.url), None, said.append))
    assert info == {"asked": "auto", "available": True, "why": None}
    assert scenario.params == {"logprobs": True, "top_logprobs": 1} and not said
    scenario, info = asyncio.run(
        ask_for_logprobs(scenario_for(server.url, logprobs=True), None, said.append)
    )
    assert info["available"] is None and scenario.params["logprobs"] is True
    scenario, info = asyncio.run(
        ask_for_logprobs(scenario_for(server.url, logprobs=False), None, said.append)
    )
    assert info["available"] is None and scenario.params == {}
    own = scenario_from_dict(
        {
            "target": {"base_url": server.url, "model": "fake"},
            "params": {"top_logprobs": 5},
            "probes": [{"id": "p", "prompt": "x"}],
        },
        source="t",
    )
    scenario, info = asyncio.run(ask_for_logprobs(own, None, said.append))
    assert (
        scenario.params == {"top_logprobs": 5} and "[params]" in info["why"]
    )  # the user's own wins
    assert not said and server.requests == []  # the check is no request of the run


def test_ask_for_logprobs_falls_back_when_the_server_ignores_the_field(server):
    server.behaviour.logprobs_supported = False
    said: list[str] = []
    scenario, info = asyncio.run(ask_for_logprobs(scenario_for(server.url), None, said.append))
    assert server.checks == 3  # answers with tokens and no logprobs, three times: then it says so
    assert info == {
        "asked": "auto",
        "available": False,
        "why": "the server returned no per-token logprobs",
    }
    assert scenario.params == {}
    assert said == [
        "kevload: logprobs: the server returned no per-token logprobs; comparing output text only"
    ]


def test_a_check_answered_without_logprobs_is_sent_again_before_it_says_there_are_none(server):
    # llama.cpp at T=0.8 answered the demo's diagnose check "Say hi." with "\ufffd" (a token ending
    # inside a character) and no logprob entry, 2 times in 60: "no per-token logprobs", and the
    # whole diagnosis compared text only although every later answer carried logprobs.
    server.behaviour.empty_checks = 2
    said: list[str] = []
    scenario, info = asyncio.run(ask_for_logprobs(scenario_for(server.url), None, said.append))
    assert (
        server.checks == 3
        and info == {"asked": "auto", "available": True, "why": None}
        and not said
    )
    assert scenario.params == {"logprobs": True, "top_logprobs": 1}


def test_a_check_never_answered_with_a_token_asks_for_logprobs_without_claiming_them(server):
    server.behaviour.empty_checks, server.behaviour.empty_check_text = 99, ""
    said: list[str] = []
    scenario, info = asyncio.run(ask_for_logprobs(scenario_for(server.url), None, said.append))
    assert (
        server.checks == 3
        and info["available"] is None
        and "held no token" in info["why"]
        and not said
    )
    assert scenario.params == {"logprobs": True, "top_logprobs": 1}


@pytest.mark.parametrize("value", ['"maybe"', "1"])
def test_bad_logprobs_setting_is_one_line_exit_2(tmp_path, value):
    path = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    path.write_text(path.read_text().replace("[load]", f"[load]\nlogprobs = {value}"))
    with pytest.raises(ScenarioError, match=r"load\.logprobs: expected"):
        load_scenario(path)
    code, output = run_cli("run", path)
    assert code == 2 and output.count("\n") == 1 and "load.logprobs" in output


# --- end to end: bitwise stable, latent, no logprobs ---


@pytest.mark.parametrize(
    ("api", "stream"), [("chat", False), ("chat", True), ("completions", True)]
)
def test_bitwise_stable_server(tmp_path, server, api, stream):
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        target={"api": api},
        concurrency=[1, 3],
        samples=4,
        stream=stream,
    )
    code, output = run_cli(
        "run", scenario, "--out", tmp_path / "run", "--quiet", "--fail-on", "latent"
    )
    assert code == 0, output
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["logprobs"] == {"asked": "auto", "available": True, "why": None}
    summary = load_summary(tmp_path / "run")
    for cell in cells_by_level(summary).values():
        assert cell["logprob_samples"] == 4 and cell["logprob_bitwise"] is True
        assert (
            cell["logprob_max_abs_diff"] == 0.0 and cell["first_logprob_divergence_token"] is None
        )
        assert cell["latent_drift"] is False and cell["token_agreement"] == 1.0
    assert "logprobs bitwise equal to serial in every cell (n=8)" in output


@pytest.fixture
def latent_server():
    # Text fixed; from token 3 on the logprobs move once 2 requests overlap. Long latency: overlap
    # at c=4 does not depend on a quiet machine.
    with FakeServer(Behaviour(logprob_drift_at=2, latency=0.3)) as fake:
        yield fake


def test_latent_drift_end_to_end(tmp_path, latent_server):
    scenario = write_scenario(tmp_path / "s.toml", latent_server.url, concurrency=[1, 4], samples=4)
    code, output = run_cli(
        "run",
        scenario,
        "--out",
        tmp_path / "run",
        "--junit",
        tmp_path / "j.xml",
        "--metrics",
        tmp_path / "m.prom",
    )
    assert code == 0, output  # latent drift is no text drift: exit 0 by default
    summary = load_summary(tmp_path / "run")
    cells = cells_by_level(summary)
    assert summary["verdict"] == "deterministic" and summary["latent_cells"] == ["p1@single/c=4"]
    assert cells[1]["logprob_bitwise"] is True and not cells[1]["latent_drift"]
    latent = cells[4]
    assert latent["distinct"] == 1 and not latent["drift"] and latent["exact_match_rate"] == 1.0
    assert latent["latent_drift"] is True and latent["logprob_samples"] == 4
    assert latent["first_logprob_divergence_token"] == 3
    assert 1e-7 <= latent["logprob_max_abs_diff"] <= 1e-5
    assert re.search(r"│\s+1 ~ │", output)  # the matrix mark
    assert (
        "latent drift (same text, other logprobs) in p1 (single) c=4 from token 3 (0-based)"
        in " ".join(output.split())
    )
    junit = (tmp_path / "j.xml").read_text()
    assert 'failures="0"' in junit and "latent drift: same text as serial in 4 samples" in junit
    assert (
        'kevload_cell_latent_drift{scenario="s",probe="p1",mode="single",level="c=4"'
        in (tmp_path / "m.prom").read_text()
    )
    assert (
        "| p1 (single) | c=4 | 4 | 100.0% [51.0, 100.0] | 100.0% [51.0, 100.0] | ≠ from token 3 "
        "(0-based)" in markdown(RunSummary.from_json(summary))
    )
    table = markdown(RunSummary.from_json(summary)).split("latency (ms")[0]  # the agreement table
    rows = [line for line in table.splitlines() if line.startswith("| p1 (single) | c=")]
    assert len(rows) == 2 and all(
        line.count("|") == 7 for line in rows
    )  # no stray pipe splits a cell
    code, _ = run_cli("report", tmp_path / "run", "--format", "html", "-o", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert code == 0 and re.search(
        r'background:#6a1b9a" title="[^"]*latent drift: same text as serial[^"]*">1 ~<', page
    )
    assert "<table id=agreement>" in page and "<td>bitwise = (4)</td>" in page

    code, output = run_cli(
        "run",
        scenario,
        "--out",
        tmp_path / "run2",
        "--quiet",
        "--fail-on",
        "latent",
        "--junit",
        tmp_path / "j2.xml",
    )
    assert code == 1, output
    assert (
        'failures="1"' in (tmp_path / "j2.xml").read_text()
        and 'type="latent_drift"' in (tmp_path / "j2.xml").read_text()
    )
    # The default fails on text drift only.
    assert junit_xml(RunSummary.from_json(load_summary(tmp_path / "run2"))).count("<failure") == 0


def test_new_latent_drift_is_a_baseline_regression(tmp_path, latent_server):
    scenario = write_scenario(tmp_path / "s.toml", latent_server.url, concurrency=[1, 4], samples=4)
    latent_server.behaviour.logprob_drift_at = None
    code, output = run_cli("run", scenario, "--out", tmp_path / "good", "--quiet")
    assert code == 0 and load_summary(tmp_path / "good")["latent_cells"] == []
    latent_server.behaviour.logprob_drift_at = 2
    code, output = run_cli(
        "run", scenario, "--out", tmp_path / "night", "--quiet", "--baseline", tmp_path / "good"
    )
    assert code == 1, output
    assert (
        "REGRESSION new_latent_drift p1@single/c=4: same text as serial, logprobs differ from "
        "token 3 (0-based) "
        "(baseline: bitwise equal in 4 samples)" in output
    )
    # The latent night as the baseline: the same latent drift again is no news.
    code, output = run_cli(
        "run", scenario, "--out", tmp_path / "night2", "--quiet", "--baseline", tmp_path / "night"
    )
    assert code == 0, output


def test_server_without_logprobs_compares_text_only_and_says_so_once(tmp_path, server):
    server.behaviour.logprobs_supported = False
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=3)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    assert (
        output.count(
            "kevload: logprobs: the server returned no per-token logprobs; comparing output text "
            "only"
        )
        == 1
    )
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["logprobs"] == {
        "asked": "auto",
        "available": False,
        "why": "the server returned no per-token logprobs",
    }
    assert all("logprobs" not in body for body in server.requests)  # not asked for again
    summary = load_summary(tmp_path / "run")
    assert (
        "logprob_samples" not in summary and "latent_cells" not in summary
    )  # nothing compared, nothing claimed
    assert all("logprob_bitwise" not in c and "latent_drift" not in c for c in summary["cells"])
    assert "logprobs" not in verdict_line(RunSummary.from_json(summary))


def test_a_cell_whose_tokens_differ_says_so_not_a_logprob_difference_of_0(tmp_path):
    # Outputs leave the serial text at word 5 once batched; the fake server's logprobs before it are
    # the serial ones.
    with FakeServer(Behaviour(drift_at=2, batched_variant=True, diverge_at_word=5)) as server:
        scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=8)
        code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 1, output
    cell = RunSummary.from_json(load_summary(tmp_path / "run")).cells[-1]
    assert (
        cell.concurrency == 4
        and cell.first_divergence_tokens == cell.first_logprob_divergence_token == 5
    )
    assert cell.logprob_max_abs_diff == 0.0 and cell.logprob_bitwise is False
    text = markdown(RunSummary.from_json(load_summary(tmp_path / "run")))
    assert "| tokens differ from token 5 (0-based) (8) |" in text
    assert "max abs diff 0" not in text and "max abs diff 0" not in " ".join(output.split())


def test_a_size_is_given_where_logprobs_at_matching_tokens_differ():
    def cell(**fields) -> str:
        return logprob_text(
            CellSummary.from_json(
                {
                    "probe": "p",
                    "mode": "single",
                    "role": "probe",
                    "concurrency": 4,
                    "ok": 8,
                    "logprob_samples": 8,
                    "logprob_bitwise": False,
                    **fields,
                }
            )
        )

    assert (
        cell(first_logprob_divergence_token=3, logprob_max_abs_diff=4.2e-06)
        == "≠ from token 3 (0-based), max abs diff 4.2e-06 (8)"
    )
    assert (
        cell(
            first_logprob_divergence_token=10, first_divergence_tokens=10, logprob_max_abs_diff=0.0
        )
        == "tokens differ from token 10 (0-based) (8)"
    )
    assert (
        cell(
            first_logprob_divergence_token=10, first_divergence_tokens=10, logprob_max_abs_diff=0.25
        )
        == "tokens differ from token 10 (0-based); at matching tokens max abs diff 0.25 (8)"
    )
    # Other kinds at the same tokens (−inf for a number): a difference with no size, never "max abs
    # diff 0".
    assert (
        cell(
            first_logprob_divergence_token=2, first_divergence_tokens=None, logprob_max_abs_diff=0.0
        )
        == "≠ from token 2 (0-based) (8)"
    )


def test_no_logprobs_is_said_once_per_server_however_many_steps_check(server, capsys):
    # The demo checked before each of its six runs against transformers serve: six identical lines.
    server.behaviour.logprobs_supported = False
    for _ in range(3):
        scenario, info = asyncio.run(ask_for_logprobs(scenario_for(server.url), None))
        assert info["available"] is False  # every run still records what its own check found
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "kevload: logprobs: the server returned no per-token logprobs; comparing output text only"
    ]
