"""The server's own view of each level: its /metrics sampled during the run, kept on disk, read back
per cell.

The fake server's gauges are what it is doing (requests holding one of its places, requests in its
queue), so what a cell says the server ran can be checked against a server whose batch limit the
test sets."""

from __future__ import annotations

import asyncio
import json
import math
import time

import numpy as np
import orjson
import pytest
from aiohttp import web

from kevload.inputs.scenario import ScenarioError, load_scenario
from kevload.inputs.scenariokeys import Target
from kevload.load.runs import run_scenario
from kevload.records import servermetrics
from kevload.records.servermetrics import SAMPLES, Samples, cell_view, metrics_url, read_view
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

FIELDS = servermetrics.CELL_FIELDS
SERIALIZED = (
    "server ran ≤ 1 at a time, 3 waiting: the server's batch limit, not kevload, set the level"
)


def _run(tmp_path, server, name="run", *extra, **load):
    path = write_scenario(
        tmp_path / f"{name}.toml", server.url, **{"concurrency": [1, 4], "samples": 6, **load}
    )
    code, output = run_cli("run", path, "--out", tmp_path / name, *extra)
    return code, output, load_summary(tmp_path / name)


# --- reading a page ---

VLLM_PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 9.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.99
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 120.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 4.0
"""


def test_a_vllm_page_is_summed_over_its_engines():
    # Running and waiting add up across label sets; the KV share is the fullest engine's; a series
    # whose name only starts like a known one (waiting_by_reason) and the older spelling of a
    # present one are not read.
    assert read_view(VLLM_PAGE) == {
        "server": "vllm",
        "running": 4,
        "waiting": 2,
        "prefix_cache_hits": 120,
        "kv_cache_usage": 0.5,
    }
    older = VLLM_PAGE.replace("vllm:kv_cache_usage_perc", "vllm:other")
    assert read_view(older)["kv_cache_usage"] == 0.99


@pytest.mark.parametrize(
    ("page", "view"),
    [
        (
            "llamacpp:requests_processing 2\nllamacpp:requests_deferred "
            "5\nllamacpp:prompt_tokens_cached_total 30\n",
            {
                "server": "llamacpp",
                "running": 2,
                "waiting": 5,
                "prefix_cache_hits": 30,
                "kv_cache_usage": None,
            },
        ),
        (
            'sglang:num_running_reqs{model_name="m"} 7\nsglang:num_queue_reqs{model_name="m"} 1\n'
            'sglang:token_usage{model_name="m"} 0.3\n',
            {
                "server": "sglang",
                "running": 7,
                "waiting": 1,
                "prefix_cache_hits": None,
                "kv_cache_usage": 0.3,
            },
        ),
        (
            "tgi_batch_current_size 8\ntgi_queue_size 0\n",
            {
                "server": "tgi",
                "running": 8,
                "waiting": 0,
                "prefix_cache_hits": None,
                "kv_cache_usage": None,
            },
        ),
        (
            "llamacpp:requests_processing NaN\nllamacpp:requests_deferred 1\n",
            {
                "server": "llamacpp",
                "running": None,
                "waiting": 1,
                "prefix_cache_hits": None,
                "kv_cache_usage": None,
                "unfit": {
                    "running": "llamacpp:requests_processing = nan (a count, from 0 to 2^53)"
                },
            },
        ),
    ],
    ids=["llamacpp", "sglang", "tgi", "nan"],
)
def test_each_server_is_read_under_its_own_names(page, view):
    assert read_view(page) == view


def test_a_page_without_known_series_or_with_a_bad_value_is_no_view():
    assert read_view("<html><body>not here</body></html>") is None
    assert (
        read_view("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.5\n")
        is None
    )
    with pytest.raises(ValueError):
        read_view("vllm:num_requests_running 4requests\n")


def test_the_metrics_url_key():
    target = Target("http://user:pw@10.0.0.5:8000/v1?api-version=1", "m")
    assert (
        metrics_url(target) == "http://10.0.0.5:8000/metrics"
    )  # the origin, without the credentials
    for off in ("", "off"):
        assert metrics_url(Target("http://h/v1", "m", metrics_url=off)) is None
    assert (
        metrics_url(Target("http://h/v1", "m", metrics_url="http://h:9090/stats"))
        == "http://h:9090/stats"
    )


@pytest.mark.parametrize(
    "value", ["nope", "ftp://h/metrics", "http://", "http://me:secret@h/metrics"]
)
def test_a_bad_metrics_url_is_refused_naming_the_key(tmp_path, value):
    path = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", target={"metrics_url": value}
    )
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert message.startswith(f'{path}: target.metrics_url: expected "auto", "off"')
    assert "secret" not in message
    code, output = run_cli("run", path, "--out", tmp_path / "never")
    assert code == 2 and "target.metrics_url" in output and "Traceback" not in output
    assert not (tmp_path / "never").exists()


# --- a cell's window ---


def _samples(t, running, waiting=None, hits=None):
    def column(values):
        return np.array([math.nan] * len(t) if values is None else values, dtype=np.float64)

    return Samples(
        t=np.array(t, dtype=np.float64),
        rtt=np.zeros(len(t)),
        failed=np.array([]),
        running=column(running),
        waiting=column(waiting),
        prefix_cache_hits=column(hits),
        kv_cache_usage=column(None),
    )


def test_a_cell_reads_the_samples_inside_its_window_and_the_counter_across_it():
    samples = _samples(
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        running=[4, 1, 1, 0, 4, 4],
        waiting=[0, 3, 2, 0, 0, 0],
        hits=[0, 10, 30, 35, 60, 90],
    )
    view = cell_view(samples, 1.0, 3.0, 4)
    assert view == {
        "server_view": True,
        "server_samples": 3,
        "server_running_max": 1,
        "server_waiting_max": 3,
        "server_kv_cache_usage_max": None,
        "server_running_mean": 0.667,
        "server_prefix_cache_hits": 60 - 10 + 10,  # from the sample at t=0 (before) to t=3
        "server_note": SERIALIZED,
    }
    # Between two samples: none in the window, so nothing is claimed about it.
    assert cell_view(samples, 1.2, 1.8, 4) == {"server_view": True, "server_samples": 0}
    # A counter that drops mid-window (the server restarted) gives no increase rather than a
    # negative one.
    restarted = _samples([0.0, 1.0, 2.0], running=[1, 1, 1], hits=[50, 60, 3])
    assert "server_prefix_cache_hits" not in cell_view(restarted, 0.5, 1.5, 1)
    assert cell_view(None, 0.0, 1.0, 4) == {"server_view": False}


@pytest.mark.parametrize(
    ("concurrency", "running", "waiting", "note"),
    [
        (4, 1, 3, True),
        (4, 2, 2, True),
        (4, 4, 0, False),
        (4, 3, 0, False),
        (1, 1, 0, False),
        (4, 1, None, False),
    ],
)
def test_the_note_needs_fewer_running_than_the_level_and_some_waiting(
    concurrency, running, waiting, note
):
    text = servermetrics.server_note(concurrency, running, waiting)
    assert (text is not None) == note
    if note:
        assert text.startswith(f"server ran ≤ {running} at a time, {waiting} waiting")


# --- runs against servers built to be the ground truth ---


def test_a_serializing_server_says_it_set_the_level(tmp_path):
    # Batched, this server drifts (drift_at=2); it never batches (max_running=1): one output, and
    # the cell says why.
    with FakeServer(Behaviour(latency=0.12, drift_at=2, max_running=1, metrics="vllm")) as fake:
        code, output, summary = _run(tmp_path, fake)
    assert code == 0, output
    cells = cells_by_level(summary)
    assert cells[4]["distinct"] == 1
    assert cells[4]["server_running_max"] == 1 and cells[4]["server_waiting_max"] >= 1
    assert cells[4]["server_samples"] >= 3
    assert cells[4]["server_note"].startswith("server ran ≤ 1 at a time, ")
    assert cells[4]["server_note"].endswith(
        "waiting: the server's batch limit, not kevload, set the level"
    )
    assert cells[1]["server_running_max"] == 1 and cells[1]["server_note"] is None
    assert summary["server_limited_cells"] == ["p1@single/c=4"]
    # The counter moved by the prompt's words for each request with a prompt seen before: at least
    # the cell's own.
    assert cells[4]["server_prefix_cache_hits"] >= cells[4]["ok"] * 2
    assert f"p1 (single) c=4: {cells[4]['server_note']}" in " ".join(
        output.split()
    )  # the matrix footnote
    assert "the server's own view (its /metrics while the cell ran)" in " ".join(
        output.split()
    )  # and its table
    meta = json.loads((tmp_path / "run" / "run.json").read_text())["server_metrics"]
    assert meta["available"] is True and meta["server"] == "vllm" and meta["failed"] == 0
    assert meta["samples"] == sum(1 for _ in (tmp_path / "run" / SAMPLES).open()) >= 5
    code, markdown = run_cli("report", tmp_path / "run", "--format", "markdown")
    assert f"- p1 (single) c=4: {cells[4]['server_note']}" in markdown
    assert "| p1 (single) | c=4 |" in markdown.split("running max", 1)[1]
    html = tmp_path / "r.html"
    run_cli("report", tmp_path / "run", "--format", "html", "-o", html)
    page = html.read_text()
    assert "<h2>The server's own view</h2>" in page and "server ran ≤ 1 at a time" in page


@pytest.mark.parametrize("names", ["vllm", "llamacpp"])
def test_a_batching_server_runs_the_whole_level(tmp_path, names):
    with FakeServer(Behaviour(latency=0.3, metrics=names)) as fake:
        code, output, summary = _run(tmp_path, fake, samples=4)
    assert code == 0, output
    c4 = cells_by_level(summary)[4]
    # All four at once, as the vLLM page splits them over two engines: a reader that did not sum
    # would see 2.
    assert c4["server_running_max"] == 4 and c4["server_waiting_max"] == 0
    assert c4["server_note"] is None and summary["server_limited_cells"] == []
    assert c4["server_kv_cache_usage_max"] == (0.5 if names == "vllm" else None)


def test_a_server_without_metrics_loses_nothing(tmp_path, server):
    server.behaviour.drift_at = 2  # drifting, so the exit code has something to say
    code, output, summary = _run(tmp_path, server, "plain")
    off_code, off_output, off = _run(tmp_path, server, "off", target={"metrics_url": "off"})
    assert code == off_code == 1 and summary["verdict"] == off["verdict"] == "nondeterministic"
    for cell in summary["cells"]:
        # Every field there: no view, each value null.
        assert {k: cell[k] for k in FIELDS} == {**dict.fromkeys(FIELDS), "server_view": False}
    # A guessed URL that is not there is most servers without metrics: run.json says so, stderr does
    # not.
    assert "server metrics" not in output and "server metrics" not in off_output
    meta = json.loads((tmp_path / "plain" / "run.json").read_text())["server_metrics"]
    assert meta["available"] is False and meta["why"] == "HTTP 404"
    assert (
        json.loads((tmp_path / "off" / "run.json").read_text())["server_metrics"]["why"]
        == "target.metrics_url is off"
    )
    assert not (tmp_path / "plain" / SAMPLES).exists()
    assert server.metrics_polls == 1  # one read decided it; none after
    # A URL given on purpose that is not there is worth one line, said once however many runs ask.
    named = {"metrics_url": server.url.removesuffix("/v1") + "/metrics"}
    _, first, _ = _run(tmp_path, server, "named", target=named)
    _, second, _ = _run(tmp_path, server, "again", target=named)
    assert first.count("kevload: server metrics:") == 1 and "HTTP 404" in first
    assert "server metrics" not in second


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("garbage", "publishes none of the series"),
        ("malformed", "not Prometheus text"),
        ("hang", "no answer before the run ended"),
    ],
)
def test_a_broken_metrics_page_never_fails_or_holds_up_the_run(tmp_path, monkeypatch, kind, why):
    # A bound far longer than the run: had the run waited for the hanging read, it would take 60 s.
    monkeypatch.setattr(servermetrics, "TIMEOUT_S", 60.0)
    with FakeServer(Behaviour(latency=0.02, metrics=kind)) as fake:
        scenario = load_scenario(
            write_scenario(tmp_path / "s.toml", fake.url, concurrency=[1, 4], samples=4)
        )
        start = time.perf_counter()
        result = asyncio.run(run_scenario(scenario, tmp_path / "run"))
        elapsed = time.perf_counter() - start
    assert elapsed < 30, elapsed
    assert result.state == "complete" and result.summary.verdict == "deterministic"
    meta = json.loads((tmp_path / "run" / "run.json").read_text())["server_metrics"]
    assert meta["available"] is False and meta["why"].startswith(why), meta
    assert all(c.server_view is False for c in result.summary.cells)
    assert all(
        getattr(c, name) is None
        for c in result.summary.cells
        for name in FIELDS
        if name != "server_view"
    )


def test_report_recomputes_the_view_from_disk(tmp_path):
    with FakeServer(Behaviour(latency=0.1, max_running=1, metrics="llamacpp")) as fake:
        _, _, summary = _run(tmp_path, fake, samples=4)
    # The server is gone: the report has only the run directory.
    (tmp_path / "run" / "summary.json").unlink()
    code, _ = run_cli("report", tmp_path / "run", "--format", "json")
    assert code == 0
    again = load_summary(tmp_path / "run")
    assert [{k: c[k] for k in FIELDS} for c in again["cells"]] == [
        {k: c[k] for k in FIELDS} for c in summary["cells"]
    ]
    assert again["server_limited_cells"] == summary["server_limited_cells"] == ["p1@single/c=4"]
    # And it is the file that says so: a file claiming four at once everywhere takes the note away.
    path = tmp_path / "run" / SAMPLES
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    path.write_bytes(
        b"".join(orjson.dumps({**s, "running": 4, "waiting": 0}) + b"\n" for s in lines)
    )
    run_cli("report", tmp_path / "run", "--format", "json")
    edited = cells_by_level(load_summary(tmp_path / "run"))
    assert edited[4]["server_running_max"] == 4 and edited[4]["server_note"] is None


@pytest.mark.parametrize(
    "edit",
    [
        {"running": "abc"},
        {"running": [1]},
        {"running": True},
        {"waiting": -5},
        {"kv_cache_usage": 2},
        {"t": None},
        {"rtt_s": "x"},
        {"running": 1e30},
    ],
)
def test_a_samples_file_with_a_value_no_sampler_writes_is_refused_naming_its_line(tmp_path, edit):
    with FakeServer(Behaviour(latency=0.05, metrics="llamacpp")) as fake:
        code, output, _ = _run(tmp_path, fake, concurrency=[1, 2], samples=3)
    assert code == 0, output
    path = tmp_path / "run" / SAMPLES
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = orjson.dumps({**orjson.loads(lines[1]), **edit}) + b"\n"
    path.write_bytes(b"".join(lines))
    code, output = run_cli("report", tmp_path / "run", "--format", "json")
    # Before: a traceback (ValueError, TypeError) and exit 1, or a negative count taken as the
    # server's.
    assert code == 2, output
    assert f"{path}:2: not a kevload record" in output and f"$.{next(iter(edit))}" in output


def test_workers_stamp_the_samples_on_the_records_clock(tmp_path):
    # Records of a run with workers carry Unix times: the samples must too, or no sample falls in
    # any window.
    with FakeServer(Behaviour(latency=0.12, max_running=1, metrics="vllm")) as fake:
        code, output, summary = _run(tmp_path, fake, "run", "--workers", "2")
    assert code == 0, output
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["clock"]["records"] == "unix"
    c4 = cells_by_level(summary)[4]
    assert c4["server_samples"] >= 3 and c4["server_running_max"] == 1 and c4["server_note"]
    first = orjson.loads((tmp_path / "run" / SAMPLES).read_bytes().splitlines()[0])
    assert abs(first["t"] - time.time()) < 600


def test_sweep_rows_carry_the_server_view(tmp_path):
    with FakeServer(Behaviour(latency=0.12, max_running=1, metrics="vllm")) as fake:
        path = write_scenario(tmp_path / "s.toml", fake.url, concurrency=[1, 4], samples=4)
        code, output = run_cli(
            "sweep", path, "--grid", "load.stream=false,true", "--out", tmp_path / "sweep"
        )
    assert code == 0, output
    sweep = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    for row in sweep["rows"]:
        c4 = next(c for c in row["cells"] if c["level"] == "c=4")
        assert set(FIELDS) <= c4.keys()
        assert c4["server_running_max"] == 1 and c4["server_note"].startswith(
            "server ran ≤ 1 at a time"
        )
    assert "server ran ≤ 1" in (tmp_path / "sweep" / "sweep.md").read_text()


@pytest.mark.e2e
def test_llamacpp_says_what_it_ran(tmp_path):
    """The built-in llama.cpp (started with --metrics): 2 slots at c=4 run ≤ 2 at a time, the others
    deferred."""
    from kevload.servers.targets import running_target
    from tests.rawclient import assert_cells_agree, seen_in
    from tests.recording_proxy import RecordingProxy

    with (
        running_target("llamacpp", slots=2, log=lambda message: None) as target,
        RecordingProxy(target.url.removesuffix("/v1")) as proxy,
    ):
        path = write_scenario(
            tmp_path / "s.toml",
            proxy.url,
            target={"model": target.model, "timeout": 120},
            probes=[{"id": "p1", "prompt": "Count from one to twenty.", "max_tokens": 16}],
            concurrency=[1, 4],
            samples=4,
        )
        code, output = run_cli("run", path, "--out", tmp_path / "run", "--quiet")
        exchanges = list(proxy.exchanges)
    summary = load_summary(tmp_path / "run")
    cells = cells_by_level(summary)
    # Whether the answers held is the server's to say on this CPU: kevload says what they say.
    seen = seen_in(exchanges, tmp_path / "run")
    assert_cells_agree(cells, seen)
    assert code == (1 if seen.drift else 0), output
    assert (
        json.loads((tmp_path / "run" / "run.json").read_text())["server_metrics"]["server"]
        == "llamacpp"
    )
    assert all(cells[c]["server_samples"] >= 2 for c in (1, 4))
    assert cells[1]["server_running_max"] == 1 and cells[1]["server_waiting_max"] == 0
    assert cells[4]["server_running_max"] == 2 and cells[4]["server_waiting_max"] >= 1
    assert cells[4]["server_note"].startswith("server ran ≤ 2 at a time")
    assert cells[4]["server_prefix_cache_hits"] is not None


def test_a_counter_that_resets_inside_the_window_claims_no_increase():
    # The server restarted mid-cell (50 → 60, then from 0 up to 70): the cell served at least 10 +
    # 70 prompt tokens from the cache, yet its two ends say 70 − 50 = 20. Only a counter that never
    # drops is an increase.
    samples = _samples([0.0, 1.0, 2.0, 3.0, 4.0], running=[1, 1, 1, 1, 1], hits=[50, 60, 0, 5, 70])
    assert "server_prefix_cache_hits" not in cell_view(samples, 0.5, 3.5, 1)
    # A read that did not carry the counter says nothing about it: the reads around it still count.
    unpublished = _samples([0.0, 1.0, 2.0, 3.0], running=[1, 1, 1, 1], hits=[50, math.nan, 60, 75])
    assert cell_view(unpublished, 0.5, 2.5, 1)["server_prefix_cache_hits"] == 25


def test_a_read_answered_late_counts_for_no_cell_it_straddles(tmp_path):
    # A /metrics that answers late (held until the server is busy, at most 1.5 s) gives the numbers
    # of its answer. The read sent before the serial level is answered once c=4 runs: "4 running",
    # yet its midpoint, where the sample was stamped, lies inside the serial cell. At c=1 the server
    # never ran more than one request.
    fake = FakeServer(Behaviour(latency=0.2, metrics="vllm"))
    vllm_page = fake._metrics

    async def late(request):
        deadline = time.monotonic() + 1.5
        while len(fake._active) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return await vllm_page(request)

    fake._metrics = late
    with fake:
        code, output, summary = _run(tmp_path, fake, samples=4)
    assert code == 0, output
    cells = cells_by_level(summary)
    assert cells[1]["server_running_max"] in (None, 1), cells[1]["server_running_max"]
    assert cells[4]["server_running_max"] == 4 and cells[4]["server_samples"] >= 1


def test_another_models_series_on_the_page_are_not_this_servers(tmp_path):
    # One page for two models (a gateway, one vLLM per model): the other one is busy, six running
    # and three queued.
    # The target ("fake") batches the whole level and never queues: its cells must say so, not the
    # sum of both.
    fake = FakeServer(Behaviour(latency=0.2, metrics="vllm"))
    vllm_page = fake._metrics

    async def two_models(request):
        page = (await vllm_page(request)).text
        other = (
            'vllm:num_requests_running{engine="0",model_name="other"} 6.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="other"} 3.0\n'
        )
        return web.Response(text=page + other)

    fake._metrics = two_models
    with fake:
        code, output, summary = _run(tmp_path, fake, samples=4)
    assert code == 0, output
    cells = cells_by_level(summary)
    assert (cells[1]["server_running_max"], cells[1]["server_waiting_max"]) == (1, 0)
    assert (cells[4]["server_running_max"], cells[4]["server_waiting_max"]) == (4, 0)
    # A page that names no label set after the target's model (an alias, say) is summed whole, as
    # before.
    assert read_view(VLLM_PAGE, model="alias")["running"] == 4
    other = 'vllm:num_requests_running{engine="0",model_name="x"} 5.0\n'
    assert (
        read_view(VLLM_PAGE + other, model="m")["running"] == 4
        and read_view(VLLM_PAGE + other)["running"] == 9
    )


def _stepping_server(state: dict, lagging: bool = False) -> FakeServer:
    """A server that admits its queue at each scheduler step (every 0.3 s), all of it at once: four
    run together for 0.2 s, then the next four wait for the next step. Its /metrics fails (500)
    while two or more run, so the reads that succeed see only the queue: "0 running, 4 waiting".
    ``state["most"]``: the most it really ran at once.

    ``lagging``: its /metrics never fails but its gauges lag, set as each step begins, before it
    admits the queue: every read says "0 running" and counts the running requests as waiting."""
    fake = FakeServer(Behaviour(metrics="vllm"))
    state.update(running=0, waiting=0, most=0)

    async def stepping(request):
        body = await request.json()
        state["waiting"] += 1
        await asyncio.sleep(0.3 - time.monotonic() % 0.3)
        state["waiting"] -= 1
        state["running"] += 1
        state["most"] = max(state["most"], state["running"])
        try:
            await asyncio.sleep(0.2)
        finally:
            state["running"] -= 1
        return fake._whole(body, "same answer", True, None, None)

    async def busy_fails(request):
        if lagging:
            return web.Response(
                text=f"vllm:num_requests_running 0\n"
                f"vllm:num_requests_waiting {state['waiting'] + state['running']}\n"
            )
        if state["running"] >= 2:
            return web.Response(status=500, text="busy")
        return web.Response(
            text=f"vllm:num_requests_running {state['running']}\n"
            f"vllm:num_requests_waiting {state['waiting']}\n"
        )

    fake._handle, fake._metrics = stepping, busy_fails
    return fake


def test_a_level_whose_reads_failed_under_load_is_not_said_to_be_serialized(tmp_path):
    # It ran four at a time; the reads that would say so failed, and a cell whose reads failed
    # cannot say what the server never did.
    state: dict = {}
    with _stepping_server(state) as fake:
        code, output, summary = _run(tmp_path, fake, samples=8)
    assert code == 0, output
    assert state["most"] == 4
    c4 = cells_by_level(summary)[4]
    assert c4["server_note"] is None, c4["server_note"]
    assert summary["server_limited_cells"] == []


def test_reads_that_never_saw_the_server_run_anything_bound_nothing(tmp_path):
    # Every read says "0 running, 4 waiting" while the cell got its answers: the server ran them,
    # and the reads missed it. "Ran ≤ 0 at a time" is false on its face.
    state: dict = {}
    with _stepping_server(state, lagging=True) as fake:
        code, output, summary = _run(tmp_path, fake, samples=8)
    assert code == 0, output
    c4 = cells_by_level(summary)[4]
    assert state["most"] == 4 and c4["server_running_max"] == 0 and c4["ok"] == 8
    assert c4["server_note"] is None, c4["server_note"]


def test_a_sweep_cell_says_the_server_ran_at_most_n_only_where_that_is_known(tmp_path):
    # The same server in a sweep: its reads said "0 running" at c=4, yet it ran four at once.
    state: dict = {}
    with _stepping_server(state) as fake:
        path = write_scenario(tmp_path / "s.toml", fake.url, concurrency=[1, 4], samples=8)
        code, output = run_cli(
            "sweep", path, "--grid", "load.stream=false", "--out", tmp_path / "sweep"
        )
    assert code == 0, output
    assert state["most"] == 4
    row = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["rows"][0]
    c4 = next(c for c in row["cells"] if c["level"] == "c=4")
    assert c4["server_running_max"] < 4  # what the reads that succeeded said, kept as said
    row_line = next(
        line
        for line in (tmp_path / "sweep" / "sweep.md").read_text().splitlines()
        if line.startswith("| load.stream=False |")
    )
    c1_text, c4_text = row_line.split(" | ")[-2:]
    assert c4_text.endswith(f"server ran ≥ {c4['server_running_max']} |"), c4_text
    assert c1_text.endswith("server ran ≤ 1"), c1_text  # one at a time: kevload sent no more


def test_a_huge_metrics_page_never_stalls_the_requests_it_times(tmp_path):
    # A page with 60,000 label sets of a series kevload reads (a gateway's, say): ~1 s to parse.
    # Parsed on the event loop that stamps the answers, every answer waiting behind a parse took
    # that long too (p50 1.4 s). The server answers in 0.1 s; so must the run say it did.
    fake = FakeServer(Behaviour(latency=0.1, metrics="vllm"))
    vllm_page = fake._metrics
    crowd = "".join(
        f'vllm:num_requests_waiting{{engine="{i}",model_name="other"}} 0.0\n' for i in range(60000)
    )

    async def huge(request):
        page = (await vllm_page(request)).text
        return web.Response(text=page + crowd)

    fake._metrics = huge
    with fake:
        code, output, summary = _run(tmp_path, fake, concurrency=[1, 2], samples=24)
    assert code == 0, output
    for cell in summary["cells"]:
        assert cell["latency"]["e2e"]["p50"] < 0.3, cell["latency"]["e2e"]
    # The page is still read (as often as parsing it leaves the run nine tenths of the time), unless
    # the run ended before the first parse did, on a machine busy enough.
    meta = json.loads((tmp_path / "run" / "run.json").read_text())["server_metrics"]
    assert meta["available"] is True or meta["why"] == "no answer before the run ended", meta


# --- the page read by the format's grammar, its values by their ranges ---


@pytest.mark.parametrize("gap", ["\t", "  ", " \t ", "\t\t"])
def test_a_name_and_value_apart_by_any_blanks_are_read(gap):
    page = (
        f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{gap}3\n"
        f"  vllm:num_requests_waiting{gap}2{gap}1700000000000\n"
        f"vllm:num_requests_running_by_engine{gap}9\n"
    )  # only starts like a known name: not read
    assert read_view(page) == {
        "server": "vllm",
        "running": 3,
        "waiting": 2,
        "prefix_cache_hits": None,
        "kv_cache_usage": None,
    }


def test_a_label_value_with_a_unicode_line_break_stays_one_line():
    page = 'vllm:num_requests_running{model_name="m\u2028x\x85y"} 3\nvllm:num_requests_waiting 0\n'
    assert read_view(page)["running"] == 3


@pytest.mark.parametrize(
    ("line", "unfit"),
    [
        (
            "vllm:num_requests_running -3",
            {"running": "vllm:num_requests_running = -3.0 (a count, from 0 to 2^53)"},
        ),
        (
            "vllm:num_requests_running +Inf",
            {"running": "vllm:num_requests_running = inf (a count, from 0 to 2^53)"},
        ),
        (
            "vllm:num_requests_running 1e300",
            {"running": "vllm:num_requests_running = 1e+300 (a count, from 0 to 2^53)"},
        ),
        (
            'vllm:num_requests_running{engine="0"} 5\nvllm:num_requests_running{engine="1"} -2',
            {"running": "vllm:num_requests_running = -2.0 (a count, from 0 to 2^53)"},
        ),  # never summed into 3
        (
            "vllm:kv_cache_usage_perc 1.5\nvllm:num_requests_running 1",
            {"kv_cache_usage": "vllm:kv_cache_usage_perc = 1.5 (a share, from 0 to 1)"},
        ),
        (
            "vllm:prefix_cache_hits_total NaN\nvllm:num_requests_running 1",
            {"prefix_cache_hits": "vllm:prefix_cache_hits_total = nan (a counter, from 0 to 2^53)"},
        ),
    ],
)
def test_a_value_outside_its_range_is_no_number_and_says_what_came(line, unfit):
    view = read_view(line + "\nvllm:num_requests_waiting 0\n")
    assert view["server"] == "vllm" and view["unfit"] == unfit
    assert all(view[value] is None for value in unfit)
    orjson.dumps(view)  # what the sampler writes


class _TabbedVllm(FakeServer):
    """A vLLM whose /metrics separates each name from its value by a tab, as the exposition format
    allows, and whose first ``broken`` pages hold a running line that does not parse."""

    def __init__(self, behaviour: Behaviour, broken: int = 0, running: str | None = None):
        super().__init__(behaviour)
        self.broken, self.running = broken, running

    async def _metrics(self, request):
        self.metrics_polls += 1
        running = self.running or str(len(self._active))
        if self.metrics_polls <= self.broken:
            running += "requests"
        return web.Response(
            text=f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running\t{running}\n"
            f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting\t"
            f"{len(self._queue)}\n"
        )


def test_a_tab_separated_page_gives_the_servers_view(tmp_path):
    with _TabbedVllm(Behaviour(latency=0.3)) as fake:
        code, output, summary = _run(tmp_path, fake, samples=4)
    assert code == 0, output
    meta = json.loads((tmp_path / "run" / "run.json").read_text())["server_metrics"]
    assert meta["available"] is True and meta["server"] == "vllm", meta
    c4 = cells_by_level(summary)[4]
    assert (
        c4["server_view"] is True
        and c4["server_running_max"] == 4
        and c4["server_waiting_max"] == 0
    )


def test_pages_that_do_not_parse_at_first_leave_the_later_ones_read(tmp_path):
    with _TabbedVllm(Behaviour(latency=0.3), broken=2) as fake:
        code, output, summary = _run(tmp_path, fake, samples=4)
    assert code == 0, output
    meta = json.loads((tmp_path / "run" / "run.json").read_text())["server_metrics"]
    assert (
        meta["available"] is True
        and meta["failed"] == 2
        and meta["last_error"].startswith("not Prometheus")
    )
    lines = [orjson.loads(line) for line in (tmp_path / "run" / SAMPLES).read_bytes().splitlines()]
    assert [("error" in line) for line in lines[:3]] == [
        True,
        True,
        False,
    ]  # the failed reads kept, in order
    assert cells_by_level(summary)[4]["server_running_max"] == 4


def test_an_impossible_count_is_kept_as_a_finding_never_as_a_number(tmp_path):
    with _TabbedVllm(Behaviour(latency=0.1), running="-3") as fake:
        code, output, summary = _run(tmp_path, fake, samples=4)
    assert code == 0, output
    lines = [orjson.loads(line) for line in (tmp_path / "run" / SAMPLES).read_bytes().splitlines()]
    assert lines and all(line["running"] is None for line in lines)
    assert all(
        line["unfit"] == {"running": "vllm:num_requests_running = -3.0 (a count, from 0 to 2^53)"}
        for line in lines
    )
    for cell in summary["cells"]:
        assert cell["server_view"] is True and cell["server_running_max"] is None
        assert cell["server_waiting_max"] == 0
