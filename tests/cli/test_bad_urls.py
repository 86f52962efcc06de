"""A URL that cannot be sent to as written is bad input wherever it is given: exit 2 before anything
is sent, one line naming the option or the file and key, and what was expected. Never a traceback
mid-run (exit 1, the drift code), and never a request line the server refuses (a copy-pasted
trailing blank sent raw: http_400, exit 3)."""

from __future__ import annotations

import json

import pytest

from kevload.inputs.urls import url_problem
from tests.conftest import run_cli, write_scenario

PORT = "a port from 1 to 65535"
# {url} is the fake server's base URL: a good one spoiled by one character, so only that character
# is at fault.
BAD = [
    ("http://127.0.0.1:99999/v1", PORT),
    ("http://127.0.0.1:0/v1", PORT),
    ("http://127.0.0.1:8x/v1", PORT),
    ("http://[::1/v1", "an IPv6 host in closed brackets"),
    ("{url} ", "no spaces"),
    ("{url}\n", "no spaces"),
    (" {url}", "no spaces"),
    ("{url}é", "non-ASCII"),
    ("http:///v1", "a host after http:// or https://"),
]


def _bad(url, server):
    return url.format(url=server.url)


def _refused(code, output, server, where, expected):
    assert code == 2, output
    assert where in output and expected in output and "Traceback" not in output, output
    assert len(output.strip().splitlines()) == 1, output
    assert server.requests == []


@pytest.mark.parametrize(("url", "expected"), BAD)
def test_run_url_refuses_it_naming_the_option(tmp_path, server, url, expected):
    code, output = run_cli(
        "run", "--url", _bad(url, server), "--model", "m", "--out", tmp_path / "run"
    )
    _refused(
        code,
        output,
        server,
        "--url: target.base_url: expected an http:// or https:// URL",
        expected,
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("url", "expected"), BAD)
def test_a_scenario_file_or_set_refuses_it_naming_the_file_and_key(tmp_path, server, url, expected):
    good = write_scenario(tmp_path / "good.toml", server.url)
    code, output = run_cli(
        "run",
        good,
        "--set",
        f"target.base_url={json.dumps(_bad(url, server))}",
        "--out",
        tmp_path / "run",
    )
    _refused(code, output, server, f"{good}: target.base_url: expected", expected)
    bad = write_scenario(tmp_path / "bad.toml", _bad(url, server))
    code, output = run_cli("run", bad, "--out", tmp_path / "run")
    _refused(code, output, server, f"{bad}: target.base_url: expected", expected)


@pytest.mark.parametrize(("url", "expected"), BAD)
def test_diagnose_and_cases_rerun_refuse_it_naming_url(tmp_path, server, url, expected):
    code, output = run_cli(
        "diagnose",
        "--url",
        _bad(url, server),
        "--model",
        "m",
        "--prompt",
        "hi",
        "--out",
        tmp_path / "diag",
    )
    _refused(code, output, server, "--url: target.base_url: expected", expected)
    cases = tmp_path / "cases.jsonl"
    cases.write_text('{"id": "x", "input": "hi", "params": {}, "verdict": "stable"}\n')
    code, output = run_cli(
        "cases",
        "rerun",
        cases,
        "--url",
        _bad(url, server),
        "--model",
        "m",
        "-o",
        tmp_path / "rerun.jsonl",
        "--out",
        tmp_path / "reruns",
    )
    _refused(code, output, server, "--url: target.base_url: expected", expected)


@pytest.mark.parametrize(
    ("url", "expected"), [*BAD, ("http://me:secret@127.0.0.1:99999/metrics", PORT)]
)
def test_a_metrics_url_is_refused_likewise_without_its_password(tmp_path, server, url, expected):
    scenario = write_scenario(tmp_path / "s.toml", server.url)
    code, output = run_cli(
        "run",
        scenario,
        "--set",
        f"target.metrics_url={json.dumps(_bad(url, server))}",
        "--out",
        tmp_path / "run",
    )
    _refused(code, output, server, f"{scenario}: target.metrics_url: expected", expected)
    assert "secret" not in output


def test_a_password_in_a_refused_base_url_stays_out_of_the_message(tmp_path, server):
    code, output = run_cli("run", "--url", "http://me:secret@[::1/v1", "--model", "m")
    _refused(code, output, server, "--url: target.base_url", "IPv6")
    assert "secret" not in output and "***@" in output


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/v1",
        "https://[::1]:8443/v1",
        "http://h:/v1",
        "http://user:pw@h/v1?api-version=2024-02-01",
    ],
)
def test_urls_that_can_be_sent_to_pass(url):
    assert url_problem(url.format(port=65535)) is None


def test_sweep_refuses_a_bad_ready_url_and_one_it_would_not_use(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url)
    base = ["sweep", scenario, "--grid", "load.samples=2", "--out", tmp_path / "sweep"]
    code, output = run_cli(
        *base, "--server-cmd", "true {port}", "--ready-url", "http://127.0.0.1:{port}0000/health"
    )
    _refused(code, output, server, "--ready-url: expected an http:// or https:// URL", PORT)
    # Without --server-cmd nothing is waited for: the URL would be dropped without a word.
    code, output = run_cli(*base, "--ready-url", "http://127.0.0.1:8000/health")
    _refused(code, output, server, "--ready-url: only with --server-cmd", "")
    assert not (tmp_path / "sweep").exists()


def test_a_ray_address_with_a_port_out_of_range_is_bad_usage(tmp_path, server):
    pytest.importorskip("ray")
    code, output = run_cli(
        "run",
        "--url",
        server.url,
        "--model",
        "m",
        "--ray",
        "127.0.0.1:99999",
        "--out",
        tmp_path / "run",
    )
    _refused(
        code,
        output,
        server,
        "--ray 127.0.0.1:99999: expected 'local', 'auto' or a cluster address",
        PORT,
    )
