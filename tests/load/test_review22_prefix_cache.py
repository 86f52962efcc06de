"""Review of load.prefix_cache (issue 22): crafted servers on which kevload once said something false about the
cache, each kept as a test of what it says now."""

from __future__ import annotations

import asyncio
import json

from kevload.inputs.scenario import scenario_from_dict
from kevload.load import prefixcache
from kevload.load.runs import run_scenario
from kevload.outputs.report import cache_lines
from kevload.records.rundir import RunDir
from tests.fakeserver import Behaviour, FakeServer


def _run(tmp_path, server: FakeServer, probes: list[dict], **load):
    raw = {"target": {"base_url": server.url, "model": "fake"}, "params": {"temperature": 0},
           "load": {"prefix_cache": "cold_warm", "samples": 8, **load}, "probes": probes}
    result = asyncio.run(run_scenario(scenario_from_dict(raw, source="test.toml"), tmp_path / "run"))
    records = list(RunDir(tmp_path / "run").records())
    return result.summary, records


def test_a_marker_is_new_for_every_probe_not_only_every_round(tmp_path):
    # Two probes with the same input at two lengths. The marker named the round and the run only, so the second
    # probe's "cold" sample was the first probe's input again, served from the cache, and its rounds said "cold =
    # warm in every round; no cache effect" of a server whose cached answers all differ from computed ones.
    probes = [{"id": "short", "prompt": "tell me a story about a robot", "max_tokens": 4},
              {"id": "long", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with FakeServer(Behaviour(warm_differs=True)) as server:
        summary, records = _run(tmp_path, server, probes)
    by_probe = {c["probe"]: c for c in summary.prefix_cache["probes"]}
    assert summary.prefix_cache["method"] == "marker"
    assert {p: (c["equal_rounds"], c["cache_effect"]) for p, c in by_probe.items()} == {
        "short": (0, True), "long": (0, True)}
    assert "no cache effect" not in "\n".join(cache_lines(summary))
    # No cold sample's input was sent before it.
    sent: set[str] = set()
    for body, r in zip(server.requests, [r for r in records if r.role == "probe"], strict=True):
        assert r.cache == "warm" or body["messages"][-1]["content"] not in sent, r.probe
        sent.add(body["messages"][-1]["content"])


def test_markers_differ_across_probes_from_their_opening(tmp_path):
    raw = {"target": {"base_url": "http://127.0.0.1:9/v1", "model": "fake"},
           "load": {"prefix_cache": "cold_warm", "samples": 4, "cache_reset": "marker"},
           "probes": [{"id": pid, "max_tokens": 4, "messages": [{"role": "system", "content": "Be brief."},
                                                                 {"role": "user", "content": ask}]}
                      for pid, ask in (("a", "A fact."), ("b", "Another fact."))]}
    marked = prefixcache.marked_rounds(scenario_from_dict(raw, source="t.toml"), "RUN")
    firsts = [p.messages[0]["content"] for p in marked.probes]
    assert len(set(firsts)) == len(firsts) == 4  # a system message shared by both probes is cached by neither


class _Glitch(FakeServer):
    """No cache effect at all; one answer, the third request's (a cold sample), differs: a server that varies anyway."""

    def _answer(self, body, prompt, state):
        text = super()._answer(body, prompt, state)
        return text + " glitch" if len(self.requests) == 3 else text


def test_one_cold_answer_that_differs_from_the_other_cold_ones_is_no_cache_effect(tmp_path):
    # Every round sends the same input after a reset, so the cold answers answer one question in one state: when they
    # disagree among themselves the server varies anyway, and a differing cold answer says nothing of the cache.
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with _Glitch(Behaviour(reset_endpoint="/reset_prefix_cache", cached_tokens="usage")) as server:
        summary, _ = _run(tmp_path, server, probes)
    (c,) = summary.prefix_cache["probes"]
    assert (c["rounds"], c["equal_rounds"], c["cold"]["distinct"], c["warm"]["distinct"]) == (4, 3, 2, 1)
    assert c["cache_effect"] is None
    line = cache_lines(summary)[1]
    assert "cache effect" not in line.replace("no claim about the cache", "")
    assert "cold answers vary among themselves" in line


def test_diagnose_makes_no_cache_claim_where_its_run_makes_none(tmp_path):
    # The README: diagnose's cache_effect "is the runs' cache_effect". On a server whose answers vary serially with
    # every randomness field fixed, the cache step's run says null (warm answers vary too: no claim about the cache);
    # diagnose said false, "no cache effect", a claim its run did not make.
    from click.testing import CliRunner

    from kevload.cli import main
    from kevload.summary import RunSummary

    with FakeServer(Behaviour(always_drift=True, reset_endpoint="/reset_prefix_cache", cached_tokens="usage")) as s:
        CliRunner().invoke(main, ["diagnose", "--url", s.url, "--model", "fake", "--prompt", "a robot",
                                  "--params", '{"temperature": 0}', "--samples", "4",
                                  "--json", str(tmp_path / "d.json"), "--out", str(tmp_path / "d")])
    d = json.loads((tmp_path / "d.json").read_text())
    step = next(s for s in d["steps"] if s["step"] == "cache")
    run = RunSummary.from_json(json.loads((tmp_path / "d" / "cache" / "summary.json").read_text()))
    (c,) = run.prefix_cache["probes"]
    assert c["cache_effect"] is None and step["compared_rounds"] == 3
    assert d["findings"]["cache_effect"] is c["cache_effect"]
    assert d["verdict"] == "server_nondeterministic"


class _WebUi(FakeServer):
    """No reset of any kind; like a server with a web UI, it answers every unknown path with its HTML page, 200."""

    async def _reset(self, request):
        from aiohttp import web

        return web.Response(text="<!doctype html><html><body>Chat UI</body></html>", content_type="text/html")


def test_an_html_page_answering_the_reset_is_no_reset(tmp_path):
    # "auto" took the page's 200 for a reset: the run said "cold made by reset_prefix_cache" and every cold sample
    # after the first was served from the cache.
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with _WebUi(Behaviour(warm_differs=True)) as server:
        summary, records = _run(tmp_path, server, probes)
    assert summary.prefix_cache["method"] == "marker"
    assert "POST /reset_prefix_cache answered 200 with an HTML page" in summary.prefix_cache["why"]
    (c,) = summary.prefix_cache["probes"]
    assert (c["rounds"], c["equal_rounds"], c["cache_effect"]) == (4, 0, True)


def test_a_ramp_up_is_refused_with_cold_warm(tmp_path):
    # A ramp-up's uncounted sends came first: under the marker each round's counted "cold" sample was its input's
    # fourth send, served from the cache, and a server whose cached answers all differ was called deterministic.
    import pytest

    from kevload.errors import ScenarioError

    raw = {"target": {"base_url": "http://127.0.0.1:9/v1", "model": "fake"},
           "load": {"prefix_cache": "cold_warm", "samples": 4, "cache_reset": "marker", "ramp_s": 0.12},
           "probes": [{"id": "a", "prompt": "story one", "max_tokens": 4}]}
    with pytest.raises(ScenarioError, match="t.toml: load.ramp_s: expected 0 with load.prefix_cache"):
        scenario_from_dict(raw, source="t.toml")


def test_cache_prompt_named_on_a_server_that_is_not_llamacpp_says_it_was_not_confirmed(tmp_path):
    # The README said a method named outright that the server lacks stops the run (exit 3). cache_prompt is sent as
    # asked (a llama.cpp behind a proxy that passes only /v1 has no /props to show): the run says so.
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with FakeServer(Behaviour()) as server:
        summary, _ = _run(tmp_path, server, probes, cache_reset="cache_prompt")
    assert summary.prefix_cache["method"] == "cache_prompt"
    why = summary.prefix_cache["why"]
    assert why.startswith('load.cache_reset = "cache_prompt", sent as asked though GET /props answered 404')


class _Pattern(FakeServer):
    """No cache at all; answers by arrival: (marker rounds of 3) round 0's and round 1's cold answers differ from
    their agreeing warm ones, round 2's cold and second warm answers differ from its first warm one."""

    odd = {0: " x", 3: " x", 6: " z", 8: " y"}

    def _answer(self, body, prompt, state):
        return super()._answer(body, prompt, state) + self.odd.get(len(self.requests) - 1, "")


def test_diagnose_counts_a_marker_round_whose_warm_answers_disagree_as_unstable_only(tmp_path):
    # diagnose's cold_differs_rounds is "rounds whose cold answer leaves warm ones that agree": round 2's warm
    # answers disagree, so it is unstable, not cold-differs too (it was counted as both: 3 of 3 rounds).
    from kevload.guide.diagnose import cache_rounds

    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with _Pattern(Behaviour()) as server:
        summary, _ = _run(tmp_path, server, probes, samples=6)
    (c,) = summary.prefix_cache["probes"]
    assert (c["rounds"], c["equal_rounds"], c["warm_unstable_rounds"], c["cache_effect"]) == (3, 0, 1, True)
    assert cache_rounds(summary.prefix_cache["probes"]) == (3, 2, 1)


def test_diagnose_counts_no_unstable_warm_round_where_the_warm_answers_all_agree(tmp_path):
    # Same input every round (a reset), one odd cold answer: the warm answers all agree, so no round is "warm
    # unstable" (it was counted as one); the cold answer that left them is the one cold-differs round.
    from kevload.guide.diagnose import cache_rounds

    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with _Glitch(Behaviour(reset_endpoint="/reset_prefix_cache")) as server:
        summary, _ = _run(tmp_path, server, probes, samples=6)
    (c,) = summary.prefix_cache["probes"]
    assert (c["warm"]["distinct"], c["cold"]["distinct"], c["cache_effect"]) == (1, 2, None)
    assert cache_rounds(summary.prefix_cache["probes"]) == (3, 1, 0)


def test_a_marker_run_against_its_baseline_sees_no_change_on_an_unchanged_server(tmp_path):
    # Under the marker each run's rounds carry its own run id, so their inputs, and the answers, differ from the
    # baseline's: --baseline called every answer "never seen in the baseline: the model or server changed".
    from kevload.outputs.baseline import compare_to_baseline

    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with FakeServer(Behaviour()) as server:
        before, _ = _run(tmp_path / "a", server, probes)
        now, _ = _run(tmp_path / "b", server, probes)
    assert before.prefix_cache["method"] == now.prefix_cache["method"] == "marker"
    assert [c for c in compare_to_baseline(now, before) if c.regression] == []


def test_a_case_built_from_a_cold_warm_run_is_rerun_cold_and_warm(tmp_path):
    # The case kept the cell's cold and warm answers (two outputs: "unstable") but not how they were made: its rerun
    # sent the probe warm every time and called the unchanged server "unstable→stable".
    from kevload.guide.cases import build_cases, read_cases, rerun_cases

    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with FakeServer(Behaviour(warm_differs=True, reset_endpoint="/reset_prefix_cache")) as server:
        _run(tmp_path, server, probes)
        build_cases([tmp_path / "run"], tmp_path / "cases.jsonl")
        (case,) = read_cases(tmp_path / "cases.jsonl")
        assert case["verdict"] == "unstable"
        (result,) = asyncio.run(rerun_cases([case], url=server.url, model="fake", times=4, out=tmp_path / "rerun",
                                            log=lambda _: None))
    assert result["transition"] == "unchanged", result


def test_a_named_reset_the_server_lacks_stops_the_run_before_it_sends_anything(tmp_path):
    # The README: it "stops the run before it sends anything". The logprobs check went first.
    import pytest

    from kevload.load.prefixcache import CacheResetError

    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with FakeServer(Behaviour()) as server, pytest.raises(CacheResetError):
        _run(tmp_path, server, probes, cache_reset="flush_cache")
    assert (server.checks, server.requests) == (0, [])


def test_diagnose_keeps_the_users_cache_prompt_false_and_blames_no_cache(tmp_path):
    # The user's requests say cache_prompt: false and their answers are stable. The cache step picked llama.cpp's
    # cache_prompt method, sent its warm samples cache_prompt: true over the user's false, and the verdict was
    # "cache", next "disable prompt caching": what the user already does.
    from click.testing import CliRunner

    from kevload.cli import main

    with FakeServer(Behaviour(warm_differs=True, props=True, cached_tokens="timings")) as server:
        CliRunner().invoke(main, ["diagnose", "--url", server.url, "--model", "fake", "--prompt", "a robot",
                                  "--params", '{"temperature": 0, "cache_prompt": false}', "--samples", "4",
                                  "--json", str(tmp_path / "d.json"), "--out", str(tmp_path / "d")])
    assert all(body.get("cache_prompt") is False for body in server.requests
               if "a robot" in body["messages"][-1]["content"])
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["verdict"] != "cache" and d["findings"]["cache_effect"] is not True


def test_params_that_set_cache_prompt_are_sent_as_written_under_auto(tmp_path):
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with FakeServer(Behaviour(props=True)) as server:
        raw = {"target": {"base_url": server.url, "model": "fake"}, "params": {"temperature": 0, "cache_prompt": True},
               "load": {"prefix_cache": "cold_warm", "samples": 4}, "probes": probes}
        result = asyncio.run(run_scenario(scenario_from_dict(raw, source="t.toml"), tmp_path / "run"))
    assert all(body["cache_prompt"] is True for body in server.requests)
    assert result.summary.prefix_cache["method"] == "marker"
    assert "[params] sets cache_prompt itself" in result.summary.prefix_cache["why"]


class _SaysOnlyWarm(FakeServer):
    """Its cache keeps nothing; it says what it reused on every other answer only (the warm samples'): 0 tokens."""

    calls = 0

    def _cache_account(self, cached):
        self.calls += 1
        return super()._cache_account(cached) if self.calls % 2 else {}  # the first call: the logprobs check


def test_a_warm_sample_the_server_says_reused_nothing_is_not_claimed_warm(tmp_path):
    # The cold answers said nothing, so the rounds were compared on kevload's word although the server said each
    # warm sample reused 0 prompt tokens: "cold = warm in every round; no cache effect" of a cache that was off.
    from tests.load.test_prefix_cache import _Forgetful

    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with _SaysOnlyWarm(Behaviour(reset_endpoint="/reset_prefix_cache", cached_tokens="usage")) as server:
        server.seen_prompts = _Forgetful()
        summary, records = _run(tmp_path, server, probes)
    assert [r.cached_tokens for r in records] == [None, 0] * 4
    (c,) = summary.prefix_cache["probes"]
    assert (c["rounds"], c["contradicted"], c["cache_effect"]) == (0, 4, None)
