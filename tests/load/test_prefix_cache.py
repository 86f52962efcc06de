"""load.prefix_cache = "cold_warm" against crafted servers whose cache is known: a cache effect is named where the
server's warm answers differ from its cold ones and nowhere else, cold is made the way the run says, and the
server's own account of what it cached decides which rounds are claimed."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner

from kevload.cli import main
from kevload.errors import InputError, ScenarioError
from kevload.guide.diagnose import cache_rounds
from kevload.inputs.scenario import scenario_from_dict
from kevload.load import prefixcache
from kevload.load.prefixcache import CacheResetError
from kevload.load.runs import run_scenario
from kevload.outputs.html import run_report
from kevload.outputs.report import cache_lines, markdown
from kevload.records.rundir import RunDir
from kevload.summary import RunSummary
from kevload.wire.client import _STRICT, _Accumulator
from tests.fakeserver import Behaviour, FakeServer


def scenario(url: str, params: dict | None = None, **load):
    raw = {"target": {"base_url": url, "model": "fake"}, "params": params or {"temperature": 0},
           "load": {"prefix_cache": "cold_warm", "samples": 8, **load},
           "probes": [{"id": "p1", "prompt": "tell me a long story about a robot", "max_tokens": 12}]}
    return scenario_from_dict(raw, source="test.toml")


def run(tmp_path, behaviour: Behaviour, params: dict | None = None, **load):
    with FakeServer(behaviour) as server:
        result = asyncio.run(run_scenario(scenario(server.url, params, **load), tmp_path / "run"))
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    records = list(RunDir(tmp_path / "run").records())
    return server, result.summary, meta, records


def only(summary: RunSummary) -> dict:
    (probe,) = summary.prefix_cache["probes"]
    return probe


def test_vllm_reset_makes_each_cold_sample_cold_and_the_warm_drift_is_named(tmp_path):
    server, summary, meta, records = run(tmp_path, Behaviour(warm_differs=True, reset_endpoint="/reset_prefix_cache",
                                                             cached_tokens="usage"))
    assert meta["prefix_cache"]["method"] == "reset_prefix_cache"
    assert summary.prefix_cache["method"] == "reset_prefix_cache"
    # One reset while "auto" looked for it, then one before each of the 4 cold samples.
    assert server.resets == 1 + 4
    probes = [r for r in records if r.role == "probe"]
    assert [r.cache for r in probes] == ["cold", "warm"] * 4
    assert [r.cached_tokens for r in probes] == [0, 8] * 4  # the server's own account, kept per record
    assert {r.probe for r in probes} == {"p1"}  # the same input every round
    c = only(summary)
    assert (c["rounds"], c["equal_rounds"], c["cache_effect"], c["confirmed"]) == (4, 0, True, 4)
    assert (c["cold"]["distinct"], c["warm"]["distinct"]) == (1, 1)
    assert summary.verdict == "nondeterministic"  # same input, two outputs: the cell drifts
    text = markdown(summary)
    assert "cold made by reset_prefix_cache" in text and "cold ≠ warm in 4 of 4 rounds" in text
    assert "cache effect" in text and "server confirms 4" in text
    page = run_report(summary, meta, records)
    assert "<h2>Prefix cache, cold vs warm</h2>" in page and "cold ≠ warm in 4 of 4 rounds" in page


def test_a_server_whose_cache_changes_nothing_has_no_cache_effect(tmp_path):
    server, summary, meta, records = run(tmp_path, Behaviour(reset_endpoint="/flush_cache", cached_tokens="usage"))
    assert meta["prefix_cache"]["method"] == "flush_cache"
    c = only(summary)
    assert (c["rounds"], c["equal_rounds"], c["cache_effect"]) == (4, 4, False)
    assert summary.verdict == "deterministic"
    assert "cold = warm in every round; no cache effect" in "\n".join(cache_lines(summary))


def test_llamacpp_cold_is_cache_prompt_false_and_warm_cache_prompt_true(tmp_path):
    server, summary, meta, records = run(tmp_path, Behaviour(warm_differs=True, props=True, cached_tokens="timings"))
    assert meta["prefix_cache"]["method"] == "cache_prompt"
    assert [body["cache_prompt"] for body in server.requests] == [False, True] * 4
    assert server.resets == 0
    assert [r.cached_tokens for r in records if r.role == "probe"] == [0, 8] * 4  # llama.cpp's timings.cache_n
    assert only(summary)["cache_effect"] is True


def test_without_a_reset_a_fresh_marker_per_round_compares_the_same_input(tmp_path):
    server, summary, meta, records = run(tmp_path, Behaviour(warm_differs=True))
    assert meta["prefix_cache"]["method"] == "marker"
    assert "POST /reset_prefix_cache answered 404" in meta["prefix_cache"]["why"]
    assert meta["probes"] == [f"p1@r{k}" for k in range(4)]  # each round its own input, its own cell
    for k in range(4):
        marker = f"[round {k} of p1 in {meta['run_id']}] "
        prompts = {b["messages"][-1]["content"] for b in server.requests if b["messages"][-1]["content"].startswith(
            marker)}
        assert len(prompts) == 1  # cold and warm of one round: the same input
    assert len(server.requests) == 4 * 3  # cold, warm, warm
    c = only(summary)
    assert c["probe"] == "p1" and (c["rounds"], c["equal_rounds"], c["cache_effect"]) == (4, 0, True)
    assert c["cold"]["distinct"] is None  # across rounds the inputs differ: no distinct count is claimed
    assert summary.verdict == "nondeterministic"


@pytest.mark.parametrize("reset", [None, "/reset_prefix_cache"])
def test_no_false_cache_effect_on_a_server_that_varies_anyway(tmp_path, reset):
    # Sampling without a seed: cold differs from warm, but warm answers differ among themselves as much.
    _, summary, _, _ = run(tmp_path, Behaviour(sampling=True, reset_endpoint=reset), {"temperature": 0.8})
    c = only(summary)
    assert c["equal_rounds"] < c["rounds"] and c["cache_effect"] is None
    assert "no claim about the cache" in "\n".join(cache_lines(summary))


def test_no_cache_effect_on_a_plain_server_by_marker(tmp_path):
    _, summary, meta, _ = run(tmp_path, Behaviour())
    c = only(summary)
    assert meta["prefix_cache"]["method"] == "marker" and c["cache_effect"] is False
    assert summary.verdict == "deterministic"


def test_a_reset_that_lies_is_caught_by_the_servers_own_account(tmp_path):
    server, summary, meta, records = run(tmp_path, Behaviour(warm_differs=True, reset_endpoint="/reset_prefix_cache",
                                                             reset_lies=True, cached_tokens="usage"))
    c = only(summary)
    # Only the very first cold sample was cold; after that the server says "cold" ones came from its cache.
    assert [r.cached_tokens for r in records if r.cache == "cold"] == [0, 8, 8, 8]
    assert (c["rounds"], c["contradicted"], c["confirmed"]) == (1, 3, 1)
    assert "3 rounds left out" in "\n".join(cache_lines(summary))


def test_a_reset_failing_mid_run_is_kevloads_error_not_a_drifted_cell(tmp_path):
    behaviour = Behaviour(reset_endpoint="/reset_prefix_cache", reset_fails_after=3)
    with FakeServer(behaviour) as server, pytest.raises(CacheResetError, match="reset failed mid-run"):
        asyncio.run(run_scenario(scenario(server.url), tmp_path / "run"))
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["state"] == "aborted"
    assert len(server.requests) == 2 * 2  # two rounds sent; the third cold sample was never sent warm


def test_an_explicit_reset_the_server_lacks_is_refused(tmp_path):
    with FakeServer(Behaviour()) as server, pytest.raises(CacheResetError, match="load.cache_reset = 'flush_cache'"):
        asyncio.run(run_scenario(scenario(server.url, cache_reset="flush_cache"), tmp_path / "run"))
    assert server.requests == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize(("load", "key"), [
    ({"concurrency": [1, 4]}, "load.concurrency"), ({"samples": 7}, "load.samples"), ({"warmup": 1}, "load.warmup"),
    ({"mode": "mixed"}, "load.mode"), ({"rate": [2.0]}, "load.rate"), ({"workers": 2}, "load.workers"),
    ({"cache_reset": "sometimes"}, "load.cache_reset"), ({"until_bound": 0.05}, "load.until_bound")])
def test_bad_cold_warm_loads_are_refused_naming_the_key(load, key):
    with pytest.raises(ScenarioError, match=f"test.toml: {key}: expected"):
        scenario("http://127.0.0.1:9/v1", **load)


def test_bad_input_exits_2_with_one_line(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[target]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n[load]\nprefix_cache = "cold_warm"\n'
                    'concurrency = [1, 2]\n[[probes]]\nid = "p"\nprompt = "x"\nmax_tokens = 2\n')
    result = CliRunner().invoke(main, ["run", str(path)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f'kevload: error: {path}: load.concurrency: expected [1] with load.prefix_cache = "cold_warm" (cold and warm '
        'are compared serially), got [1, 2]']


@pytest.mark.parametrize(("doc", "expected"), [
    ({"usage": {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 32}}}, 32),
    ({"timings": {"cache_n": 12, "prompt_n": 3}}, 12),
    ({"usage": {"prompt_tokens": 40, "prompt_tokens_details": None}}, None),
    ({"usage": {"prompt_tokens": 40}}, None)])
def test_the_client_reads_what_the_server_says_it_cached(doc, expected):
    acc = _Accumulator()
    acc.take_extras(_STRICT.decode(json.dumps(doc)), None)
    assert acc.finish("stop", complete=True, t_send=0.0, t_last_byte=1.0).cached_tokens == expected


def test_streamed_answers_carry_the_cached_tokens_too(tmp_path):
    _, summary, _, records = run(tmp_path, Behaviour(warm_differs=True, reset_endpoint="/reset_prefix_cache",
                                                     cached_tokens="usage"), stream=True)
    assert [r.cached_tokens for r in records if r.role == "probe"] == [0, 8] * 4
    assert only(summary)["confirmed"] == 4


def _comparison(rounds, equal, effect, warm_distinct, unstable=0):
    return {"rounds": rounds, "equal_rounds": equal, "cache_effect": effect, "warm_unstable_rounds": unstable,
            "cold_differs_rounds": rounds - equal if effect else 0, "warm": {"distinct": warm_distinct}}


@pytest.mark.parametrize(("comparisons", "counts"), [
    ([_comparison(3, 0, True, 1)], (3, 3, 0)),  # reset: warm answers agree, every cold one leaves them
    ([_comparison(3, 1, None, 3)], (3, 0, 2)),  # reset: warm answers vary anyway: unstable, never cold-differs
    ([_comparison(3, 3, False, 1)], (3, 0, 0)),
    ([_comparison(3, 1, True, None, unstable=0)], (3, 2, 0)),  # marker: per round
    ([_comparison(3, 2, None, None, unstable=2)], (3, 0, 2)),
    ([_comparison(0, 0, False, None)], (0, 0, 0))])
def test_diagnose_reads_a_cache_steps_rounds(comparisons, counts):
    assert cache_rounds(comparisons) == counts


def test_diagnose_cache_step_uses_the_servers_reset_and_says_so(tmp_path):
    behaviour = Behaviour(cold_differs=True, reset_endpoint="/reset_prefix_cache", cached_tokens="usage")
    with FakeServer(behaviour) as server:
        result = CliRunner().invoke(main, ["diagnose", "--url", server.url, "--model", "fake", "--prompt", "a robot",
                                           "--params", '{"temperature": 0}', "--samples", "4",
                                           "--json", str(tmp_path / "d.json"), "--out", str(tmp_path / "d")])
    d = json.loads((tmp_path / "d.json").read_text())
    steps = {s["step"]: s for s in d["steps"]}
    assert steps["cache"]["cache_method"] == "reset_prefix_cache"
    assert "(cold by reset_prefix_cache)" in steps["cache"]["title"] and "(cold by reset_prefix_cache)" in result.output
    assert (steps["cache"]["compared_rounds"], steps["cache"]["cold_differs_rounds"]) == (3, 3)
    assert server.resets >= 3
    assert d["verdict"] == "cache" and d["findings"]["cache_effect"] is True
    # The check without the cache: cache_prompt: false on every request, fresh prompts.
    assert d["findings"]["cache_off_converges"] is True


def test_the_marker_opens_the_whole_input_so_a_shared_system_message_is_not_cached(tmp_path):
    raw = {"target": {"base_url": "http://127.0.0.1:9/v1", "model": "fake"},
           "load": {"prefix_cache": "cold_warm", "samples": 4, "cache_reset": "marker"},
           "probes": [{"id": "p", "max_tokens": 4, "messages": [{"role": "system", "content": "Be brief."},
                                                                 {"role": "user", "content": "A fact."}]}]}
    marked = prefixcache.marked_rounds(scenario_from_dict(raw, source="t.toml"), "RUN")
    assert [p.id for p in marked.probes] == ["p@r0", "p@r1"] and marked.load.samples == 3
    assert [p.messages[0]["content"] for p in marked.probes] == ["[round 0 of p in RUN] Be brief.",
                                                                 "[round 1 of p in RUN] Be brief."]
    assert all(p.messages[1]["content"] == "A fact." for p in marked.probes)


def test_ray_is_refused_before_any_cluster_is_reached(tmp_path):
    with pytest.raises(InputError, match="--ray: load.prefix_cache sends its rounds in one process"):
        asyncio.run(run_scenario(scenario("http://127.0.0.1:9/v1"), tmp_path / "run", ray="127.0.0.1:1"))
    assert not (tmp_path / "run").exists()


_SGLANG_FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
                   "requests, the operation will not be performed.)\n")
_LONG_NO = json.dumps({"success": False, "pad": "x" * 2000})


@pytest.mark.parametrize(("status", "body", "ok"), [
    (200, '{"success": true}', True), (200, '{"success": false}', False), (200, "Cache flushed.", True),
    (200, _SGLANG_FLUSHED, True), (200, "", True), (200, '{"success": true, "error": null}', True),
    (400, "pending requests", False), (404, "Not Found", False),
    # A "no" is read whole, whatever its length: cut, it would no longer parse.
    (200, _LONG_NO, False), (200, _LONG_NO[:150], False),
    # Typed: success must be the JSON true, the answer a JSON object; other text is no reset.
    (200, '{"success": "true"}', False), (200, '{"success": 1}', False), (200, '{"success": null}', False),
    (200, "[true]", False), (200, "true", False), (200, '"Cache flushed."', False),
    (200, '{"error": "engine busy"}', False), (200, "False", False), (200, "pending requests", False),
    (200, "{" * 5000, False), (200, " " * (70 << 10), False)])
def test_what_counts_as_a_reset(status, body, ok):
    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        return web.Response(status=status, text=body)

    async def check():
        app = web.Application()
        app.router.add_post("/reset_prefix_cache", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            return await prefixcache._post(f"http://127.0.0.1:{port}/reset_prefix_cache", {}, 5)
        finally:
            await runner.cleanup()

    assert asyncio.run(check())[0] is ok


@pytest.mark.parametrize("behaviour", [
    Behaviour(warm_differs=True, reset_endpoint="/reset_prefix_cache", cached_tokens="usage"),
    Behaviour(warm_differs=True)], ids=["reset", "marker"])
def test_a_resumed_run_keeps_its_method_and_its_rounds(tmp_path, behaviour):
    with FakeServer(behaviour) as server:
        asyncio.run(run_scenario(scenario(server.url), tmp_path / "run"))
        meta = json.loads((tmp_path / "run" / "run.json").read_text())
        records = tmp_path / "run" / "records.jsonl"
        kept = 3  # a run killed after its second round's cold sample (reset) / first round (marker)
        records.write_text("".join(records.read_text().splitlines(keepends=True)[:kept]))
        resets, sent = server.resets, len(server.requests)
        code = CliRunner().invoke(main, ["run", "--resume", str(tmp_path / "run"), "--quiet"]).exit_code
        after = json.loads((tmp_path / "run" / "run.json").read_text())
    assert code == 1
    assert after["prefix_cache"] == meta["prefix_cache"] and after["probes"] == meta["probes"]
    rows = list(RunDir(tmp_path / "run").records())
    c = RunSummary.from_json(json.loads((tmp_path / "run" / "summary.json").read_text())).prefix_cache["probes"][0]
    assert (c["rounds"], c["cache_effect"]) == (4, True)
    if meta["prefix_cache"]["method"] == "reset_prefix_cache":
        assert [r.cache for r in rows] == ["cold", "warm"] * 4
        assert server.resets - resets == 2  # before samples 4 and 6: the resume asks for no method again
        assert len(server.requests) - sent == 5
    else:
        assert [(r.probe, r.cache) for r in rows][kept:] == [(f"p1@r{k}", s) for k in (1, 2, 3)
                                                             for s in ("cold", "warm", "warm")]
        assert len(server.requests) - sent == 9


@pytest.mark.parametrize(("url", "root"), [
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"), ("http://u:p@127.0.0.1:8000/v1?x=1", "http://127.0.0.1:8000"),
    ("http://[::1]:8000/v1", "http://[::1]:8000"), ("https://host/api/v1", "https://host")])
def test_resets_go_to_the_servers_root(url, root):
    assert prefixcache.origin(url) == root


def test_a_server_with_its_cache_off_has_no_round_claimed_warm(tmp_path):
    # It answers the reset, but every answer says nothing came from its cache: no warm sample is claimed.
    behaviour = Behaviour(warm_differs=True, reset_endpoint="/reset_prefix_cache", cached_tokens="usage")
    with FakeServer(behaviour) as server:
        server.seen_prompts = _Forgetful()
        asyncio.run(run_scenario(scenario(server.url), tmp_path / "run"))
    summary = RunSummary.from_json(json.loads((tmp_path / "run" / "summary.json").read_text()))
    c = only(summary)
    assert (c["rounds"], c["contradicted"], c["cache_effect"]) == (0, 4, None)
    assert cache_lines(summary)[1] == ("  p1: no round compared: in 4 the server said the warm sample reused no more "
                                       "prompt tokens than the cold one (is its prefix cache on?)")


class _Forgetful(set):
    """A cache that keeps nothing."""

    def add(self, item: object) -> None:
        pass


def test_the_cli_says_a_failed_reset_in_one_line_and_exits_3(tmp_path):
    path = tmp_path / "s.toml"
    with FakeServer(Behaviour(reset_endpoint="/flush_cache", reset_fails_after=2)) as server:
        path.write_text(f'[target]\nbase_url = "{server.url}"\nmodel = "m"\n[load]\nprefix_cache = "cold_warm"\n'
                        'samples = 4\n[[probes]]\nid = "p"\nprompt = "x"\nmax_tokens = 2\n')
        result = CliRunner().invoke(main, ["run", str(path), "--out", str(tmp_path / "run"), "--quiet"])
    assert result.exit_code == 3
    assert result.output.strip().splitlines()[-1] == ("kevload: error: prefix cache reset failed mid-run: POST "
                                                      "/flush_cache answered 500; the next sample could not be made "
                                                      "cold (load.cache_reset)")
    assert "Traceback" not in result.output


class _LongRefusal(FakeServer):
    """A vLLM whose resets after the first ``ok`` are refused with a long answer (blocks held, and much said)."""

    def __init__(self, behaviour: Behaviour, ok: int):
        super().__init__(behaviour)
        self.ok = ok

    async def _reset(self, request):
        from aiohttp import web

        if self.resets < self.ok:
            return await super()._reset(request)
        return web.Response(text=_LONG_NO, content_type="application/json")


def test_a_long_refused_reset_mid_run_stops_it_with_exit_3(tmp_path):
    path = tmp_path / "s.toml"
    behaviour = Behaviour(warm_differs=True, reset_endpoint="/reset_prefix_cache", cached_tokens="usage")
    with _LongRefusal(behaviour, ok=2) as server:
        path.write_text(f'[target]\nbase_url = "{server.url}"\nmodel = "m"\n[load]\nprefix_cache = "cold_warm"\n'
                        'samples = 8\n[[probes]]\nid = "p"\nprompt = "x"\nmax_tokens = 2\n')
        result = CliRunner().invoke(main, ["run", str(path), "--out", str(tmp_path / "run"), "--quiet"])
    assert result.exit_code == 3, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("kevload: error: prefix cache reset failed mid-run: POST /reset_prefix_cache answered 200 ")
    assert f"… ({len(_LONG_NO)} characters)" in line  # the line is shortened; the answer was judged whole
    assert json.loads((tmp_path / "run" / "run.json").read_text())["state"] == "aborted"
    assert len(server.requests) == 2  # one round (cold, warm); no "cold" sample sent after the refusal


@pytest.mark.parametrize("cache_reset", ["auto", "reset_prefix_cache"])
def test_a_long_refused_reset_is_never_picked(tmp_path, cache_reset):
    behaviour = Behaviour(reset_endpoint="/reset_prefix_cache")
    if cache_reset == "auto":
        with _LongRefusal(behaviour, ok=0) as server:
            asyncio.run(run_scenario(scenario(server.url, cache_reset=cache_reset), tmp_path / "run"))
        meta = json.loads((tmp_path / "run" / "run.json").read_text())
        assert meta["prefix_cache"]["method"] == "marker"
        assert "POST /reset_prefix_cache answered 200 " in meta["prefix_cache"]["why"]
    else:
        with _LongRefusal(behaviour, ok=0) as server, pytest.raises(CacheResetError, match="has no such reset"):
            asyncio.run(run_scenario(scenario(server.url, cache_reset=cache_reset), tmp_path / "run"))
        assert server.requests == []


@pytest.mark.parametrize(("status", "body", "said"), [
    (200, b'{"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1}', "answered llama.cpp's props"),
    (200, b'{"default_generation_settings": "yes"}', "default_generation_settings is a JSON string"),
    (200, b'{"default_generation_settings": null}', "default_generation_settings is a JSON null"),
    (200, b'["default_generation_settings"]', "JSON array"),
    (200, b'{"total_slots": 1}', "without default_generation_settings"),
    (200, b"\xff\xfe not json", "not JSON"), (200, b"[" * 5000, "not JSON"), (200, None, "over 4 MiB"),
    (404, b"", "answered 404")])
def test_props_are_read_typed(status, body, said):
    ok, why = prefixcache.props_answer(status, body)
    assert ok is (said == "answered llama.cpp's props")
    assert said in why and (ok or why.endswith("not llama.cpp's props") or "not llama.cpp's props:" in why)


def test_props_of_the_wrong_shape_fall_back_to_the_marker(tmp_path):
    class _OddProps(FakeServer):
        async def _props(self, request):
            from aiohttp import web

            return web.json_response({"default_generation_settings": ["n_ctx", 2048]})

    with _OddProps(Behaviour()) as server:
        asyncio.run(run_scenario(scenario(server.url), tmp_path / "run"))
    why = json.loads((tmp_path / "run" / "run.json").read_text())["prefix_cache"]["why"]
    assert "GET /props answered 200 whose default_generation_settings is a JSON array, not llama.cpp's props" in why
