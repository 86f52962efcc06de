"""load.prefix_cache = "cold_warm" against crafted servers whose cache is known: a cache effect is
named where the server's warm answers differ from its cold ones and nowhere else, cold is made
the way the run says, and the server's own account of what it cached decides which rounds are
claimed."""

from __future__ import annotations

import asyncio
import json
from xml.etree import ElementTree as ET

import pytest
from click.testing import CliRunner

from kevload.cli import main
from kevload.errors import InputError, ScenarioError
from kevload.guide.cases import build_cases, read_cases
from kevload.guide.evidence import cache_rounds
from kevload.guide.rerun import rerun_cases
from kevload.inputs.scenario import scenario_from_dict
from kevload.load import prefixcache
from kevload.load.prefixcache import CacheResetError
from kevload.load.runs import run_scenario
from kevload.outputs.baseline import compare_to_baseline
from kevload.outputs.footnotes import cache_lines
from kevload.outputs.html import run_report
from kevload.outputs.markdown import markdown
from kevload.records.rundir import RunDir
from kevload.records.summary import RunSummary
from kevload.wire.answer import _Accumulator
from kevload.wire.decoding import _STRICT
from tests.fakeserver import Behaviour, FakeServer


def scenario(url: str, params: dict | None = None, **load):
    raw = {
        "target": {"base_url": url, "model": "fake"},
        "params": params or {"temperature": 0},
        "load": {"prefix_cache": "cold_warm", "samples": 8, **load},
        "probes": [{"id": "p1", "prompt": "tell me a long story about a robot", "max_tokens": 12}],
    }
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
    server, summary, meta, records = run(
        tmp_path,
        Behaviour(warm_differs=True, reset_endpoint="/reset_prefix_cache", cached_tokens="usage"),
    )
    assert meta["prefix_cache"]["method"] == "reset_prefix_cache"
    assert summary.prefix_cache["method"] == "reset_prefix_cache"
    # One reset while "auto" looked for it, then one before each of the 4 cold samples.
    assert server.resets == 1 + 4
    probes = [r for r in records if r.role == "probe"]
    assert [r.cache for r in probes] == ["cold", "warm"] * 4
    assert [r.cached_tokens for r in probes] == [
        0,
        8,
    ] * 4  # the server's own account, kept per record
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
    server, summary, meta, records = run(
        tmp_path, Behaviour(reset_endpoint="/flush_cache", cached_tokens="usage")
    )
    assert meta["prefix_cache"]["method"] == "flush_cache"
    c = only(summary)
    assert (c["rounds"], c["equal_rounds"], c["cache_effect"]) == (4, 4, False)
    assert summary.verdict == "deterministic"
    assert "cold = warm in every round; no cache effect" in "\n".join(cache_lines(summary))


def test_llamacpp_cold_is_cache_prompt_false_and_warm_cache_prompt_true(tmp_path):
    server, summary, meta, records = run(
        tmp_path, Behaviour(warm_differs=True, props=True, cached_tokens="timings")
    )
    assert meta["prefix_cache"]["method"] == "cache_prompt"
    assert [body["cache_prompt"] for body in server.requests] == [False, True] * 4
    assert server.resets == 0
    assert [r.cached_tokens for r in records if r.role == "probe"] == [
        0,
        8,
    ] * 4  # llama.cpp's timings.cache_n
    assert only(summary)["cache_effect"] is True


def test_without_a_reset_a_fresh_marker_per_round_compares_the_same_input(tmp_path):
    server, summary, meta, records = run(tmp_path, Behaviour(warm_differs=True))
    assert meta["prefix_cache"]["method"] == "marker"
    assert "POST /reset_prefix_cache answered 404" in meta["prefix_cache"]["why"]
    assert meta["probes"] == [
        f"p1@r{k}" for k in range(4)
    ]  # each round its own input, its own cell
    for k in range(4):
        marker = f"[round {k} of p1 in {meta['run_id']}] "
        prompts = {
            b["messages"][-1]["content"]
            for b in server.requests
            if b["messages"][-1]["content"].startswith(marker)
        }
        assert len(prompts) == 1  # cold and warm of one round: the same input
    assert len(server.requests) == 4 * 3  # cold, warm, warm
    c = only(summary)
    assert c["probe"] == "p1" and (c["rounds"], c["equal_rounds"], c["cache_effect"]) == (
        4,
        0,
        True,
    )
    assert (
        c["cold"]["distinct"] is None
    )  # across rounds the inputs differ: no distinct count is claimed
    assert summary.verdict == "nondeterministic"


@pytest.mark.parametrize("reset", [None, "/reset_prefix_cache"])
def test_no_false_cache_effect_on_a_server_that_varies_anyway(tmp_path, reset):
    # Sampling without a seed: cold differs from warm, but warm answers differ among themselves as
    # much.
    _, summary, _, _ = run(
        tmp_path, Behaviour(sampling=True, reset_endpoint=reset), {"temperature": 0.8}
    )
    c = only(summary)
    assert c["equal_rounds"] < c["rounds"] and c["cache_effect"] is None
    assert "no claim about the cache" in "\n".join(cache_lines(summary))


def test_no_cache_effect_on_a_plain_server_by_marker(tmp_path):
    _, summary, meta, _ = run(tmp_path, Behaviour())
    c = only(summary)
    assert meta["prefix_cache"]["method"] == "marker" and c["cache_effect"] is False
    assert summary.verdict == "deterministic"


def test_a_reset_that_lies_is_caught_by_the_servers_own_account(tmp_path):
    server, summary, meta, records = run(
        tmp_path,
        Behaviour(
            warm_differs=True,
            reset_endpoint="/reset_prefix_cache",
            reset_lies=True,
            cached_tokens="usage",
        ),
    )
    c = only(summary)
    # Only the very first cold sample was cold; after that the server says "cold" ones came from its
    # cache.
    assert [r.cached_tokens for r in records if r.cache == "cold"] == [0, 8, 8, 8]
    assert (c["rounds"], c["contradicted"], c["confirmed"]) == (1, 3, 1)
    assert "3 rounds left out" in "\n".join(cache_lines(summary))


def test_a_reset_failing_mid_run_is_kevloads_error_not_a_drifted_cell(tmp_path):
    behaviour = Behaviour(reset_endpoint="/reset_prefix_cache", reset_fails_after=3)
    with (
        FakeServer(behaviour) as server,
        pytest.raises(CacheResetError, match="reset failed mid-run"),
    ):
        asyncio.run(run_scenario(scenario(server.url), tmp_path / "run"))
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["state"] == "aborted"
    assert (
        len(server.requests) == 2 * 2
    )  # two rounds sent; the third cold sample was never sent warm


def test_an_explicit_reset_the_server_lacks_is_refused(tmp_path):
    with (
        FakeServer(Behaviour()) as server,
        pytest.raises(CacheResetError, match="load.cache_reset = 'flush_cache'"),
    ):
        asyncio.run(run_scenario(scenario(server.url, cache_reset="flush_cache"), tmp_path / "run"))
    assert server.requests == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("load", "key"),
    [
        ({"concurrency": [1, 4]}, "load.concurrency"),
        ({"samples": 7}, "load.samples"),
        ({"warmup": 1}, "load.warmup"),
        ({"mode": "mixed"}, "load.mode"),
        ({"rate": [2.0]}, "load.rate"),
        ({"workers": 2}, "load.workers"),
        ({"cache_reset": "sometimes"}, "load.cache_reset"),
        ({"until_bound": 0.05}, "load.until_bound"),
    ],
)
def test_bad_cold_warm_loads_are_refused_naming_the_key(load, key):
    with pytest.raises(ScenarioError, match=f"test.toml: {key}: expected"):
        scenario("http://127.0.0.1:9/v1", **load)


def test_bad_input_exits_2_with_one_line(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(
        '[target]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
        '[load]\nprefix_cache = "cold_warm"\nconcurrency = [1, 2]\n'
        '[[probes]]\nid = "p"\nprompt = "x"\nmax_tokens = 2\n'
    )
    result = CliRunner().invoke(main, ["run", str(path)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"kevload: error: {path}: load.concurrency: expected [1] with "
        'load.prefix_cache = "cold_warm" (cold and warm are compared serially), got [1, 2]'
    ]


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"usage": {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 32}}}, 32),
        ({"timings": {"cache_n": 12, "prompt_n": 3}}, 12),
        ({"usage": {"prompt_tokens": 40, "prompt_tokens_details": None}}, None),
        ({"usage": {"prompt_tokens": 40}}, None),
    ],
)
def test_the_client_reads_what_the_server_says_it_cached(doc, expected):
    acc = _Accumulator()
    acc.take_extras(_STRICT.decode(json.dumps(doc)), None)
    assert acc.finish("stop", complete=True, t_send=0.0, t_last_byte=1.0).cached_tokens == expected


def test_streamed_answers_carry_the_cached_tokens_too(tmp_path):
    _, summary, _, records = run(
        tmp_path,
        Behaviour(warm_differs=True, reset_endpoint="/reset_prefix_cache", cached_tokens="usage"),
        stream=True,
    )
    assert [r.cached_tokens for r in records if r.role == "probe"] == [0, 8] * 4
    assert only(summary)["confirmed"] == 4


def _comparison(rounds, equal, effect, warm_distinct, unstable=0):
    return {
        "rounds": rounds,
        "equal_rounds": equal,
        "cache_effect": effect,
        "warm_unstable_rounds": unstable,
        "cold_differs_rounds": rounds - equal if effect else 0,
        "warm": {"distinct": warm_distinct},
    }


@pytest.mark.parametrize(
    ("comparisons", "counts"),
    [
        (
            [_comparison(3, 0, True, 1)],
            (3, 3, 0),
        ),  # reset: warm answers agree, every cold one leaves them
        (
            [_comparison(3, 1, None, 3)],
            (3, 0, 2),
        ),  # reset: warm answers vary anyway: unstable, never cold-differs
        ([_comparison(3, 3, False, 1)], (3, 0, 0)),
        ([_comparison(3, 1, True, None, unstable=0)], (3, 2, 0)),  # marker: per round
        ([_comparison(3, 2, None, None, unstable=2)], (3, 0, 2)),
        ([_comparison(0, 0, False, None)], (0, 0, 0)),
    ],
)
def test_diagnose_reads_a_cache_steps_rounds(comparisons, counts):
    assert cache_rounds(comparisons) == counts


def test_diagnose_cache_step_uses_the_servers_reset_and_says_so(tmp_path):
    behaviour = Behaviour(
        cold_differs=True, reset_endpoint="/reset_prefix_cache", cached_tokens="usage"
    )
    with FakeServer(behaviour) as server:
        result = CliRunner().invoke(
            main,
            [
                "diagnose",
                "--url",
                server.url,
                "--model",
                "fake",
                "--prompt",
                "a robot",
                "--params",
                '{"temperature": 0}',
                "--samples",
                "4",
                "--json",
                str(tmp_path / "d.json"),
                "--out",
                str(tmp_path / "d"),
            ],
        )
    d = json.loads((tmp_path / "d.json").read_text())
    steps = {s["step"]: s for s in d["steps"]}
    assert steps["cache"]["cache_method"] == "reset_prefix_cache"
    assert (
        "(cold by reset_prefix_cache)" in steps["cache"]["title"]
        and "(cold by reset_prefix_cache)" in result.output
    )
    assert (steps["cache"]["compared_rounds"], steps["cache"]["cold_differs_rounds"]) == (3, 3)
    assert server.resets >= 3
    assert d["verdict"] == "cache" and d["findings"]["cache_effect"] is True
    # The check without the cache: cache_prompt: false on every request, fresh prompts.
    assert d["findings"]["cache_off_converges"] is True


def test_the_marker_opens_the_whole_input_so_a_shared_system_message_is_not_cached(tmp_path):
    raw = {
        "target": {"base_url": "http://127.0.0.1:9/v1", "model": "fake"},
        "load": {"prefix_cache": "cold_warm", "samples": 4, "cache_reset": "marker"},
        "probes": [
            {
                "id": "p",
                "max_tokens": 4,
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "A fact."},
                ],
            }
        ],
    }
    marked = prefixcache.marked_rounds(scenario_from_dict(raw, source="t.toml"), "RUN")
    assert [p.id for p in marked.probes] == ["p@r0", "p@r1"] and marked.load.samples == 3
    assert [p.messages[0]["content"] for p in marked.probes] == [
        "[round 0 of p in RUN] Be brief.",
        "[round 1 of p in RUN] Be brief.",
    ]
    assert all(p.messages[1]["content"] == "A fact." for p in marked.probes)


def test_ray_is_refused_before_any_cluster_is_reached(tmp_path):
    with pytest.raises(
        InputError, match="--ray: load.prefix_cache sends its rounds in one process"
    ):
        asyncio.run(
            run_scenario(scenario("http://127.0.0.1:9/v1"), tmp_path / "run", ray="127.0.0.1:1")
        )
    assert not (tmp_path / "run").exists()


_SGLANG_FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting "
    "requests, the operation will not be performed.)\n"
)
_LONG_NO = json.dumps({"success": False, "pad": "x" * 2000})


@pytest.mark.parametrize(
    ("status", "body", "ok"),
    [
        (200, '{"success": true}', True),
        (200, '{"success": false}', False),
        (200, "Cache flushed.", True),
        (200, _SGLANG_FLUSHED, True),
        (200, "", True),
        (200, '{"success": true, "error": null}', True),
        (400, "pending requests", False),
        (404, "Not Found", False),
        # A "no" is read whole, whatever its length: cut, it would no longer parse.
        (200, _LONG_NO, False),
        (200, _LONG_NO[:150], False),
        # Typed: success must be the JSON true, the answer a JSON object; other text is no reset.
        (200, '{"success": "true"}', False),
        (200, '{"success": 1}', False),
        (200, '{"success": null}', False),
        (200, "[true]", False),
        (200, "true", False),
        (200, '"Cache flushed."', False),
        (200, '{"error": "engine busy"}', False),
        (200, "False", False),
        (200, "pending requests", False),
        (200, "{" * 5000, False),
        (200, " " * (70 << 10), False),
    ],
)
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


@pytest.mark.parametrize(
    "behaviour",
    [
        Behaviour(warm_differs=True, reset_endpoint="/reset_prefix_cache", cached_tokens="usage"),
        Behaviour(warm_differs=True),
    ],
    ids=["reset", "marker"],
)
def test_a_resumed_run_keeps_its_method_and_its_rounds(tmp_path, behaviour):
    with FakeServer(behaviour) as server:
        asyncio.run(run_scenario(scenario(server.url), tmp_path / "run"))
        meta = json.loads((tmp_path / "run" / "run.json").read_text())
        records = tmp_path / "run" / "records.jsonl"
        kept = 3  # a run killed after its second round's cold sample (reset) / first round (marker)
        records.write_text("".join(records.read_text().splitlines(keepends=True)[:kept]))
        resets, sent = server.resets, len(server.requests)
        code = (
            CliRunner()
            .invoke(main, ["run", "--resume", str(tmp_path / "run"), "--quiet"])
            .exit_code
        )
        after = json.loads((tmp_path / "run" / "run.json").read_text())
    assert code == 1
    assert after["prefix_cache"] == meta["prefix_cache"] and after["probes"] == meta["probes"]
    rows = list(RunDir(tmp_path / "run").records())
    c = RunSummary.from_json(
        json.loads((tmp_path / "run" / "summary.json").read_text())
    ).prefix_cache["probes"][0]
    assert (c["rounds"], c["cache_effect"]) == (4, True)
    if meta["prefix_cache"]["method"] == "reset_prefix_cache":
        assert [r.cache for r in rows] == ["cold", "warm"] * 4
        assert (
            server.resets - resets == 2
        )  # before samples 4 and 6: the resume asks for no method again
        assert len(server.requests) - sent == 5
    else:
        assert [(r.probe, r.cache) for r in rows][kept:] == [
            (f"p1@r{k}", s) for k in (1, 2, 3) for s in ("cold", "warm", "warm")
        ]
        assert len(server.requests) - sent == 9


@pytest.mark.parametrize(
    ("url", "root"),
    [
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
        ("http://u:p@127.0.0.1:8000/v1?x=1", "http://127.0.0.1:8000"),
        ("http://[::1]:8000/v1", "http://[::1]:8000"),
        ("https://host/api/v1", "https://host"),
    ],
)
def test_resets_go_to_the_servers_root(url, root):
    assert prefixcache.origin(url) == root


def test_a_server_with_its_cache_off_has_no_round_claimed_warm(tmp_path):
    # It answers the reset, but every answer says nothing came from its cache: no warm sample is
    # claimed.
    behaviour = Behaviour(
        warm_differs=True, reset_endpoint="/reset_prefix_cache", cached_tokens="usage"
    )
    with FakeServer(behaviour) as server:
        server.seen_prompts = _Forgetful()
        asyncio.run(run_scenario(scenario(server.url), tmp_path / "run"))
    summary = RunSummary.from_json(json.loads((tmp_path / "run" / "summary.json").read_text()))
    c = only(summary)
    assert (c["rounds"], c["contradicted"], c["cache_effect"]) == (0, 4, None)
    assert cache_lines(summary)[1] == (
        "  p1: no round compared: in 4 the server said the warm sample reused no more "
        "prompt tokens than the cold one (is its prefix cache on?)"
    )


class _Forgetful(set):
    """A cache that keeps nothing."""

    def add(self, item: object) -> None:
        pass


def test_the_cli_says_a_failed_reset_in_one_line_and_exits_3(tmp_path):
    path = tmp_path / "s.toml"
    with FakeServer(Behaviour(reset_endpoint="/flush_cache", reset_fails_after=2)) as server:
        path.write_text(
            f'[target]\nbase_url = "{server.url}"\nmodel = "m"\n'
            '[load]\nprefix_cache = "cold_warm"\nsamples = 4\n'
            '[[probes]]\nid = "p"\nprompt = "x"\nmax_tokens = 2\n'
        )
        result = CliRunner().invoke(
            main, ["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]
        )
    assert result.exit_code == 3
    assert result.output.strip().splitlines()[-1] == (
        "kevload: error: prefix cache reset failed mid-run: POST "
        "/flush_cache answered 500; the next sample could not be made "
        "cold (load.cache_reset)"
    )
    assert "Traceback" not in result.output


class _LongRefusal(FakeServer):
    """A vLLM whose resets after the first ``ok`` are refused with a long answer (blocks held, and
    much said)."""

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
    behaviour = Behaviour(
        warm_differs=True, reset_endpoint="/reset_prefix_cache", cached_tokens="usage"
    )
    with _LongRefusal(behaviour, ok=2) as server:
        path.write_text(
            f'[target]\nbase_url = "{server.url}"\nmodel = "m"\n'
            '[load]\nprefix_cache = "cold_warm"\nsamples = 8\n'
            '[[probes]]\nid = "p"\nprompt = "x"\nmax_tokens = 2\n'
        )
        result = CliRunner().invoke(
            main, ["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]
        )
    assert result.exit_code == 3, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith(
        "kevload: error: prefix cache reset failed mid-run: POST /reset_prefix_cache answered 200 "
    )
    assert (
        f"… ({len(_LONG_NO)} characters)" in line
    )  # the line is shortened; the answer was judged whole
    assert json.loads((tmp_path / "run" / "run.json").read_text())["state"] == "aborted"
    assert (
        len(server.requests) == 2
    )  # one round (cold, warm); no "cold" sample sent after the refusal


@pytest.mark.parametrize("cache_reset", ["auto", "reset_prefix_cache"])
def test_a_long_refused_reset_is_never_picked(tmp_path, cache_reset):
    behaviour = Behaviour(reset_endpoint="/reset_prefix_cache")
    if cache_reset == "auto":
        with _LongRefusal(behaviour, ok=0) as server:
            asyncio.run(
                run_scenario(scenario(server.url, cache_reset=cache_reset), tmp_path / "run")
            )
        meta = json.loads((tmp_path / "run" / "run.json").read_text())
        assert meta["prefix_cache"]["method"] == "marker"
        assert "POST /reset_prefix_cache answered 200 " in meta["prefix_cache"]["why"]
    else:
        with (
            _LongRefusal(behaviour, ok=0) as server,
            pytest.raises(CacheResetError, match="has no such reset"),
        ):
            asyncio.run(
                run_scenario(scenario(server.url, cache_reset=cache_reset), tmp_path / "run")
            )
        assert server.requests == []


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (
            200,
            b'{"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1}',
            "answered llama.cpp's props",
        ),
        (
            200,
            b'{"default_generation_settings": "yes"}',
            "default_generation_settings is a JSON string",
        ),
        (
            200,
            b'{"default_generation_settings": null}',
            "default_generation_settings is a JSON null",
        ),
        (200, b'["default_generation_settings"]', "JSON array"),
        (200, b'{"total_slots": 1}', "without default_generation_settings"),
        (200, b"\xff\xfe not json", "not JSON"),
        (200, b"[" * 5000, "not JSON"),
        (200, None, "over 4 MiB"),
        (404, b"", "answered 404"),
    ],
)
def test_props_are_read_typed(status, body, said):
    ok, why = prefixcache.props_answer(status, body)
    assert ok is (said == "answered llama.cpp's props")
    assert said in why and (
        ok or why.endswith("not llama.cpp's props") or "not llama.cpp's props:" in why
    )


def test_props_of_the_wrong_shape_fall_back_to_the_marker(tmp_path):
    class _OddProps(FakeServer):
        async def _props(self, request):
            from aiohttp import web

            return web.json_response({"default_generation_settings": ["n_ctx", 2048]})

    with _OddProps(Behaviour()) as server:
        asyncio.run(run_scenario(scenario(server.url), tmp_path / "run"))
    why = json.loads((tmp_path / "run" / "run.json").read_text())["prefix_cache"]["why"]
    assert (
        "GET /props answered 200 whose default_generation_settings is a JSON array, not "
        "llama.cpp's props" in why
    )


def test_each_marker_round_of_a_graded_probe_is_graded_by_its_probes_grader(tmp_path):
    raw = {
        "target": {"base_url": "", "model": "fake"},
        "params": {"temperature": 0},
        "load": {"prefix_cache": "cold_warm", "samples": 4},
        "probes": [
            {
                "id": "p1",
                "prompt": "tell a story",
                "max_tokens": 12,
                "expected": "^zzz",
                "grade": "regex",
            }
        ],
    }
    with FakeServer(Behaviour()) as server:
        raw["target"]["base_url"] = server.url
        result = asyncio.run(
            run_scenario(scenario_from_dict(raw, source="test.toml"), tmp_path / "run")
        )
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["prefix_cache"]["method"] == "marker" and sorted(meta["grading"]) == [
        "p1@r0",
        "p1@r1",
    ]
    cells = result.summary.probe_cells()
    assert {c.probe for c in cells} == {"p1@r0", "p1@r1"}
    assert all(
        (c.graded_good, c.graded_bad) == (0, c.ok) and c.ok for c in cells
    )  # no answer opens with zzz


def run_probes(tmp_path, server: FakeServer, probes: list[dict], **load):
    """A cold_warm run of ``probes`` against ``server``, 8 samples unless ``load`` says: its summary
    and records."""
    raw = {
        "target": {"base_url": server.url, "model": "fake"},
        "params": {"temperature": 0},
        "load": {"prefix_cache": "cold_warm", "samples": 8, **load},
        "probes": probes,
    }
    result = asyncio.run(
        run_scenario(scenario_from_dict(raw, source="test.toml"), tmp_path / "run")
    )
    records = list(RunDir(tmp_path / "run").records())
    return result.summary, records


def test_a_marker_is_new_for_every_probe_not_only_every_round(tmp_path):
    # Two probes with the same input at two lengths. The marker named the round and the run only, so
    # the second probe's "cold" sample was the first probe's input again, served from the cache, and
    # its rounds said "cold = warm in every round; no cache effect" of a server whose cached answers
    # all differ from computed ones.
    probes = [
        {"id": "short", "prompt": "tell me a story about a robot", "max_tokens": 4},
        {"id": "long", "prompt": "tell me a story about a robot", "max_tokens": 12},
    ]
    with FakeServer(Behaviour(warm_differs=True)) as server:
        summary, records = run_probes(tmp_path, server, probes)
    by_probe = {c["probe"]: c for c in summary.prefix_cache["probes"]}
    assert summary.prefix_cache["method"] == "marker"
    assert {p: (c["equal_rounds"], c["cache_effect"]) for p, c in by_probe.items()} == {
        "short": (0, True),
        "long": (0, True),
    }
    assert "no cache effect" not in "\n".join(cache_lines(summary))
    # No cold sample's input was sent before it.
    sent: set[str] = set()
    for body, r in zip(server.requests, [r for r in records if r.role == "probe"], strict=True):
        assert r.cache == "warm" or body["messages"][-1]["content"] not in sent, r.probe
        sent.add(body["messages"][-1]["content"])


def test_markers_differ_across_probes_from_their_opening(tmp_path):
    raw = {
        "target": {"base_url": "http://127.0.0.1:9/v1", "model": "fake"},
        "load": {"prefix_cache": "cold_warm", "samples": 4, "cache_reset": "marker"},
        "probes": [
            {
                "id": pid,
                "max_tokens": 4,
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": ask},
                ],
            }
            for pid, ask in (("a", "A fact."), ("b", "Another fact."))
        ],
    }
    marked = prefixcache.marked_rounds(scenario_from_dict(raw, source="t.toml"), "RUN")
    firsts = [p.messages[0]["content"] for p in marked.probes]
    assert (
        len(set(firsts)) == len(firsts) == 4
    )  # a system message shared by both probes is cached by neither


class _Glitch(FakeServer):
    """No cache effect at all; one answer, the third request's (a cold sample), differs: a server
    that varies anyway."""

    def _answer(self, body, prompt, state):
        text = super()._answer(body, prompt, state)
        return text + " glitch" if len(self.requests) == 3 else text


def test_one_cold_answer_that_differs_from_the_other_cold_ones_is_no_cache_effect(tmp_path):
    # Every round sends the same input after a reset, so the cold answers answer one question in one
    # state: when they disagree among themselves the server varies anyway, and a differing cold
    # answer says nothing of the cache.
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with _Glitch(Behaviour(reset_endpoint="/reset_prefix_cache", cached_tokens="usage")) as server:
        summary, _ = run_probes(tmp_path, server, probes)
    (c,) = summary.prefix_cache["probes"]
    assert (c["rounds"], c["equal_rounds"], c["cold"]["distinct"], c["warm"]["distinct"]) == (
        4,
        3,
        2,
        1,
    )
    assert c["cache_effect"] is None
    line = cache_lines(summary)[1]
    assert "cache effect" not in line.replace("no claim about the cache", "")
    assert "cold answers vary among themselves" in line


def test_diagnose_makes_no_cache_claim_where_its_run_makes_none(tmp_path):
    # The docs: diagnose's cache_effect "is the runs' cache_effect". On a server whose answers vary
    # serially with every randomness field fixed, the cache step's run says null (warm answers vary
    # too: no claim about the cache); diagnose said false, "no cache effect", a claim its run did
    # not make.
    with FakeServer(
        Behaviour(always_drift=True, reset_endpoint="/reset_prefix_cache", cached_tokens="usage")
    ) as s:
        CliRunner().invoke(
            main,
            [
                "diagnose",
                "--url",
                s.url,
                "--model",
                "fake",
                "--prompt",
                "a robot",
                "--params",
                '{"temperature": 0}',
                "--samples",
                "4",
                "--json",
                str(tmp_path / "d.json"),
                "--out",
                str(tmp_path / "d"),
            ],
        )
    d = json.loads((tmp_path / "d.json").read_text())
    step = next(s for s in d["steps"] if s["step"] == "cache")
    run = RunSummary.from_json(json.loads((tmp_path / "d" / "cache" / "summary.json").read_text()))
    (c,) = run.prefix_cache["probes"]
    assert c["cache_effect"] is None and step["compared_rounds"] == 3
    assert d["findings"]["cache_effect"] is c["cache_effect"]
    assert d["verdict"] == "server_nondeterministic"


class _WebUi(FakeServer):
    """No reset of any kind; like a server with a web UI, it answers every unknown path with its
    HTML page, 200."""

    async def _reset(self, request):
        from aiohttp import web

        return web.Response(
            text="<!doctype html><html><body>Chat UI</body></html>", content_type="text/html"
        )


def test_an_html_page_answering_the_reset_is_no_reset(tmp_path):
    # "auto" took the page's 200 for a reset: the run said "cold made by reset_prefix_cache" and
    # every cold sample after the first was served from the cache.
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with _WebUi(Behaviour(warm_differs=True)) as server:
        summary, records = run_probes(tmp_path, server, probes)
    assert summary.prefix_cache["method"] == "marker"
    assert "POST /reset_prefix_cache answered 200 with an HTML page" in summary.prefix_cache["why"]
    (c,) = summary.prefix_cache["probes"]
    assert (c["rounds"], c["equal_rounds"], c["cache_effect"]) == (4, 0, True)


def test_a_ramp_up_is_refused_with_cold_warm(tmp_path):
    # A ramp-up's uncounted sends came first: under the marker each round's counted "cold" sample
    # was its input's fourth send, served from the cache, and a server whose cached answers all
    # differ was called deterministic.
    raw = {
        "target": {"base_url": "http://127.0.0.1:9/v1", "model": "fake"},
        "load": {
            "prefix_cache": "cold_warm",
            "samples": 4,
            "cache_reset": "marker",
            "ramp_s": 0.12,
        },
        "probes": [{"id": "a", "prompt": "story one", "max_tokens": 4}],
    }
    with pytest.raises(
        ScenarioError, match="t.toml: load.ramp_s: expected 0 with load.prefix_cache"
    ):
        scenario_from_dict(raw, source="t.toml")


def test_cache_prompt_named_on_a_server_that_is_not_llamacpp_says_it_was_not_confirmed(tmp_path):
    # The docs said a method named outright that the server lacks stops the run (exit 3).
    # cache_prompt is sent as asked (a llama.cpp behind a proxy that passes only /v1 has no /props
    # to show): the run says so.
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with FakeServer(Behaviour()) as server:
        summary, _ = run_probes(tmp_path, server, probes, cache_reset="cache_prompt")
    assert summary.prefix_cache["method"] == "cache_prompt"
    why = summary.prefix_cache["why"]
    assert why.startswith(
        'load.cache_reset = "cache_prompt", sent as asked though GET /props answered 404'
    )


class _Pattern(FakeServer):
    """No cache at all; answers by arrival: (marker rounds of 3) round 0's and round 1's cold
    answers differ from their agreeing warm ones, round 2's cold and second warm answers differ from
    its first warm one."""

    odd = {0: " x", 3: " x", 6: " z", 8: " y"}

    def _answer(self, body, prompt, state):
        return super()._answer(body, prompt, state) + self.odd.get(len(self.requests) - 1, "")


def test_diagnose_counts_a_marker_round_whose_warm_answers_disagree_as_unstable_only(tmp_path):
    # diagnose's cold_differs_rounds is "rounds whose cold answer leaves warm ones that agree":
    # round 2's warm answers disagree, so it is unstable, not cold-differs too (it was counted as
    # both: 3 of 3 rounds).
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with _Pattern(Behaviour()) as server:
        summary, _ = run_probes(tmp_path, server, probes, samples=6)
    (c,) = summary.prefix_cache["probes"]
    assert (c["rounds"], c["equal_rounds"], c["warm_unstable_rounds"], c["cache_effect"]) == (
        3,
        0,
        1,
        True,
    )
    assert cache_rounds(summary.prefix_cache["probes"]) == (3, 2, 1)


def test_diagnose_counts_no_unstable_warm_round_where_the_warm_answers_all_agree(tmp_path):
    # Same input every round (a reset), one odd cold answer: the warm answers all agree, so no round
    # is "warm unstable" (it was counted as one); the cold answer that left them is the one
    # cold-differs round.
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with _Glitch(Behaviour(reset_endpoint="/reset_prefix_cache")) as server:
        summary, _ = run_probes(tmp_path, server, probes, samples=6)
    (c,) = summary.prefix_cache["probes"]
    assert (c["warm"]["distinct"], c["cold"]["distinct"], c["cache_effect"]) == (1, 2, None)
    assert cache_rounds(summary.prefix_cache["probes"]) == (3, 1, 0)


def test_a_marker_run_against_its_baseline_sees_no_change_on_an_unchanged_server(tmp_path):
    # Under the marker each run's rounds carry its own run id, so their inputs, and the answers,
    # differ from the baseline's: --baseline called every answer "never seen in the baseline: the
    # model or server changed".
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with FakeServer(Behaviour()) as server:
        before, _ = run_probes(tmp_path / "a", server, probes)
        now, _ = run_probes(tmp_path / "b", server, probes)
    assert before.prefix_cache["method"] == now.prefix_cache["method"] == "marker"
    assert [c for c in compare_to_baseline(now, before) if c.regression] == []


def test_a_case_built_from_a_cold_warm_run_is_rerun_cold_and_warm(tmp_path):
    # The case kept the cell's cold and warm answers (two outputs: "unstable") but not how they were
    # made: its rerun sent the probe warm every time and called the unchanged server
    # "unstable→stable".
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with FakeServer(Behaviour(warm_differs=True, reset_endpoint="/reset_prefix_cache")) as server:
        run_probes(tmp_path, server, probes)
        build_cases([tmp_path / "run"], tmp_path / "cases.jsonl")
        (case,) = read_cases(tmp_path / "cases.jsonl")
        assert case["verdict"] == "unstable"
        (result,) = asyncio.run(
            rerun_cases(
                [case],
                url=server.url,
                model="fake",
                times=4,
                out=tmp_path / "rerun",
                log=lambda _: None,
            )
        )
    assert result["transition"] == "unchanged", result


def test_a_named_reset_the_server_lacks_stops_the_run_before_it_sends_anything(tmp_path):
    # The docs: it "stops the run before it sends anything". The logprobs check went first.
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with FakeServer(Behaviour()) as server, pytest.raises(CacheResetError):
        run_probes(tmp_path, server, probes, cache_reset="flush_cache")
    assert (server.checks, server.requests) == (0, [])


def test_diagnose_keeps_the_users_cache_prompt_false_and_blames_no_cache(tmp_path):
    # The user's requests say cache_prompt: false and their answers are stable. The cache step
    # picked llama.cpp's cache_prompt method, sent its warm samples cache_prompt: true over the
    # user's false, and the verdict was "cache", next "disable prompt caching": what the user
    # already does.
    with FakeServer(Behaviour(warm_differs=True, props=True, cached_tokens="timings")) as server:
        CliRunner().invoke(
            main,
            [
                "diagnose",
                "--url",
                server.url,
                "--model",
                "fake",
                "--prompt",
                "a robot",
                "--params",
                '{"temperature": 0, "cache_prompt": false}',
                "--samples",
                "4",
                "--json",
                str(tmp_path / "d.json"),
                "--out",
                str(tmp_path / "d"),
            ],
        )
    assert all(
        body.get("cache_prompt") is False
        for body in server.requests
        if "a robot" in body["messages"][-1]["content"]
    )
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["verdict"] != "cache" and d["findings"]["cache_effect"] is not True


def test_params_that_set_cache_prompt_are_sent_as_written_under_auto(tmp_path):
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with FakeServer(Behaviour(props=True)) as server:
        raw = {
            "target": {"base_url": server.url, "model": "fake"},
            "params": {"temperature": 0, "cache_prompt": True},
            "load": {"prefix_cache": "cold_warm", "samples": 4},
            "probes": probes,
        }
        result = asyncio.run(
            run_scenario(scenario_from_dict(raw, source="t.toml"), tmp_path / "run")
        )
    assert all(body["cache_prompt"] is True for body in server.requests)
    assert result.summary.prefix_cache["method"] == "marker"
    assert "[params] sets cache_prompt itself" in result.summary.prefix_cache["why"]


class _SaysOnlyWarm(FakeServer):
    """Its cache keeps nothing; it says what it reused on every other answer only (the warm
    samples'): 0 tokens."""

    calls = 0

    def _cache_account(self, cached):
        self.calls += 1
        return (
            super()._cache_account(cached) if self.calls % 2 else {}
        )  # the first call: the logprobs check


def test_a_warm_sample_the_server_says_reused_nothing_is_not_claimed_warm(tmp_path):
    # The cold answers said nothing, so the rounds were compared on kevload's word although the
    # server said each warm sample reused 0 prompt tokens: "cold = warm in every round; no cache
    # effect" of a cache that was off.
    probes = [{"id": "p1", "prompt": "tell me a story about a robot", "max_tokens": 12}]
    with _SaysOnlyWarm(
        Behaviour(reset_endpoint="/reset_prefix_cache", cached_tokens="usage")
    ) as server:
        server.seen_prompts = _Forgetful()
        summary, records = run_probes(tmp_path, server, probes)
    assert [r.cached_tokens for r in records] == [None, 0] * 4
    (c,) = summary.prefix_cache["probes"]
    assert (c["rounds"], c["contradicted"], c["cache_effect"]) == (0, 4, None)


def test_warm_answers_turned_bad_against_a_baseline_are_a_regression_unless_it_had_them(
    tmp_path, server
):
    from tests.conftest import run_cli, write_scenario

    server.behaviour.reset_endpoint = "/reset_prefix_cache"
    probe = {"id": "p1", "prompt": "tell me a story", "grade": "regex"}
    probe["expected"] = r"\A(?!.*warmcache)"  # good: no "warmcache" (the warm answers' mark)
    path = write_scenario(
        tmp_path / "s.toml", server.url, probes=[probe], concurrency=[1], samples=8,
        prefix_cache="cold_warm",
    )  # fmt: skip
    assert run_cli("run", path, "--out", tmp_path / "good")[0] == 0  # warm answers as cold ones
    server.behaviour.warm_differs = True
    code, out = run_cli(
        "run", path, "--out", tmp_path / "bad", "--baseline", tmp_path / "good", "--fail-on", "bad"
    )
    assert code == 1, out
    assert "REGRESSION warm_turned_bad p1: the warm prefix cache turned its answer bad" in out
    code, page = run_cli("report", tmp_path / "bad", "--format", "html")
    assert code == 1 and "the warm cache turned 4 answers bad" in page  # the page says it too
    # Against a baseline whose warm answers turned bad too, it is no news.
    code, out = run_cli(
        "run", path, "--out", tmp_path / "again", "--baseline", tmp_path / "bad",
        "--fail-on", "bad",
    )  # fmt: skip
    assert "warm_turned_bad" not in out, out


@pytest.mark.parametrize("reset", ["/reset_prefix_cache", None], ids=["reset", "marker"])
def test_warm_answers_graded_bad_where_cold_ones_are_good_fail_fail_on_bad(tmp_path, server, reset):
    """Every cold answer right, every warm one wrong: each round is a serial sample (the cells see a
    mixed serial grade and count no flip), so before, --fail-on bad passed it (exit 0). Paired round
    by round: 4 flips."""
    from tests.conftest import run_cli, write_scenario

    server.behaviour.warm_differs = True
    server.behaviour.reset_endpoint = reset
    # Good: no "warmcache" in the answer (the fake server's warm answers carry it).
    probe = {
        "id": "p1",
        "prompt": "tell me a story",
        "grade": "regex",
        "expected": r"\A(?!.*warmcache)",
    }
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        probes=[probe],
        concurrency=[1],
        samples=8,
        prefix_cache="cold_warm",
    )
    junit = tmp_path / "junit.xml"
    code, out = run_cli(
        "run", path, "--out", tmp_path / "run", "--fail-on", "bad", "--junit", junit
    )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    (case,) = [c for c in ET.parse(junit).iter("testcase") if c.get("classname").endswith("cache")]
    assert case.get("name") == "p1" and case.find("failure").get("type") == "warm_bad"
    c = only(RunSummary.from_json(summary))
    warm = 4 if reset else 8  # the marker method's rounds have two warm answers each
    assert (c["warm_good_to_bad"], c["warm_bad_to_good"]) == (warm, 0)
    assert summary["warm_bad_probes"] == ["p1"]
    assert code == 1, out
    assert f"the warm cache turned {warm} answers bad" in out
    # The reverse: every warm answer right, every cold one wrong, is no failure of --fail-on bad.
    probe["expected"] = "warmcache"
    write_scenario(
        tmp_path / "s2.toml",
        server.url,
        probes=[probe],
        concurrency=[1],
        samples=8,
        prefix_cache="cold_warm",
    )
    code, out = run_cli("run", tmp_path / "s2.toml", "--out", tmp_path / "run2", "--fail-on", "bad")
    c = only(RunSummary.from_json(json.loads((tmp_path / "run2" / "summary.json").read_text())))
    assert (c["warm_good_to_bad"], c["warm_bad_to_good"], code) == (0, warm, 0)
