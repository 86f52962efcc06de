"""`kevload run --url URL --model NAME [--prompt TEXT]`: the quickstart scenario with no file and no
TOML quoting."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from kevload.inputs.scenario import QUICKSTART, quickstart_scenario
from tests.conftest import load_summary, run_cli, write_scenario

SCENARIOS = Path(__file__).parents[2] / "scenarios"


def test_the_built_in_quickstart_is_the_scenario_file():
    assert json.loads(json.dumps(dict(QUICKSTART))) == tomllib.loads(
        (SCENARIOS / "quickstart.toml").read_text()
    )


def test_a_url_and_a_model_run_the_quickstart_scenario_and_write_its_run(tmp_path, server):
    out = tmp_path / "run"
    code, output = run_cli(
        "run", "--url", server.url, "--model", "served-model", "--out", out, "--quiet"
    )
    assert code == 0, output
    meta = json.loads((out / "run.json").read_text())
    assert meta["scenario"]["target"] == {"base_url": server.url, "model": "served-model"}
    summary = load_summary(out)
    assert {(c["probe"], c["concurrency"]) for c in summary["cells"] if c["role"] == "probe"} == {
        ("capital", 1),
        ("capital", 4),
    }
    asked = [
        r
        for r in server.requests
        if r["messages"][-1]["content"] == QUICKSTART["probes"][0]["prompt"]
    ]
    assert len(asked) == len(server.requests) == summary["requests_sent"]
    assert {r["model"] for r in asked} == {"served-model"}


def test_a_prompt_replaces_the_quickstart_question_and_set_still_applies(tmp_path, server):
    out = tmp_path / "run"
    code, output = run_cli(
        "run",
        "--url",
        server.url,
        "--model",
        "m",
        "--prompt",
        "Name a prime.",
        "--set",
        "load.samples=3",
        "--out",
        out,
        "--quiet",
    )
    assert code == 0, output
    cells = [c for c in load_summary(out)["cells"] if c["role"] == "probe"]
    assert {c["probe"] for c in cells} == {"prompt"} and {c["asked"] for c in cells} == {3}
    assert {r["messages"][-1]["content"] for r in server.requests} == {"Name a prime."}


def test_the_quickstart_scenario_leaves_its_table_unchanged():
    quickstart_scenario("other", ["load.concurrency=[2]"])
    assert QUICKSTART["probes"][0]["id"] == "capital" and QUICKSTART["load"]["concurrency"] == [
        1,
        4,
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--url", "{url}"), "--url needs --model NAME"),
        (("--model", "m"), "--model needs --url URL"),
        (("--prompt", "hi"), "give --url and --model, or --target NAME"),
        (("{scenario}", "--url", "{url}", "--model", "m"), "--url: only without SCENARIO"),
        (("{scenario}", "--prompt", "hi"), "--prompt: only without SCENARIO"),
        (
            ("--resume", "{tmp}", "--url", "{url}", "--model", "m"),
            "give no SCENARIO, --out, --overwrite, --url",
        ),
        (
            ("--url", "ftp://127.0.0.1/v1", "--model", "m"),
            "--url: target.base_url: expected an http:// or https:// URL",
        ),
        (
            ("--url", "{url}", "--model", "m", "--target", "vllm"),
            "--target starts its own server: give no --url",
        ),
        ((), "missing SCENARIO (or --url URL --model NAME, or --resume RUN_DIR)"),
    ],
)
def test_quickstart_options_given_wrongly_are_bad_usage_naming_the_option(
    tmp_path, server, args, message
):
    scenario = write_scenario(tmp_path / "s.toml", server.url)
    given = [a.format(url=server.url, scenario=scenario, tmp=tmp_path) for a in args]
    code, output = run_cli("run", *given, "--out", tmp_path / "run")
    assert code == 2 and message in output, output
    assert "Traceback" not in output
    assert server.requests == [] and not (tmp_path / "run").exists()


def test_diagnose_names_the_missing_half_of_url_and_model(server):
    code, output = run_cli("diagnose", "--url", server.url, "--prompt", "hi")
    assert code == 2 and "--url needs --model NAME" in output, output
    assert server.requests == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ("--url", "{url}", "--model", "m", "--set", 'target.base_url="{url}"'),
            "--url and --set target.base_url both set target.base_url",
        ),
        (
            ("--url", "{url}", "--model", "m", "--set", 'target={{base_url="{url}", model="m"}}'),
            "--url and --set target both set target.base_url",
        ),
        (
            ("--url", "{url}", "--model", "m", "--set", 'target.model="other"'),
            "--model and --set target.model both set target.model",
        ),
        (
            (
                "--url",
                "{url}",
                "--model",
                "m",
                "--prompt",
                "x",
                "--set",
                'probes=[{{id="z", prompt="q"}}]',
            ),
            "--prompt and --set probes both set probes",
        ),
        (
            ("--target", "llamacpp", "--set", 'target.model="other"'),
            "--target and --set target.model both set",
        ),
        (
            ("{scenario}", "--retries", "2", "--set", "load.retries=3"),
            "--retries and --set load.retries both set",
        ),
        (
            ("{scenario}", "--dataset-seed", "2", "--set", "load.dataset_seed=3"),
            "--dataset-seed and --set load.dataset_seed both set",
        ),
        (
            ("{scenario}", "--until-bound", "5%", "--set", "load.until_bound=0.1"),
            "--until-bound and --set load.until_bound both set",
        ),
        (
            ("{scenario}", "--workers", "2", "--set", "load.workers=1"),
            "--workers and --set load.workers both set",
        ),
    ],
)
def test_an_option_and_a_set_of_the_same_key_are_bad_usage_naming_both(
    tmp_path, server, options, message
):
    # Before: the --set (or the option) was dropped without a word, and the run went elsewhere or
    # asked otherwise.
    scenario = write_scenario(tmp_path / "s.toml", server.url)
    given = [a.format(url=server.url, scenario=scenario) for a in options]
    code, output = run_cli("run", *given, "--out", tmp_path / "run")
    assert code == 2 and message in output, output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1
    assert server.requests == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ("--server-cmd", "true {port}", "--set", 'target.base_url="http://127.0.0.1:9/v1"'),
            "--server-cmd and --set target.base_url both set target.base_url",
        ),
        (
            (
                "--server-cmd",
                "true {port}",
                "--grid",
                "target.base_url=http://127.0.0.1:9/v1,http://127.0.0.1:10/v1",
            ),
            "--server-cmd and --grid target.base_url both set target.base_url",
        ),
        (
            ("--target", "llamacpp", "--grid", "target.model=a,b"),
            "--target and --grid target.model both set target.model",
        ),
    ],
)
def test_a_sweep_refuses_a_url_or_model_its_started_server_would_override(
    tmp_path, server, options, message
):
    scenario = write_scenario(tmp_path / "s.toml", server.url)
    grid = [] if "--grid" in options else ["--grid", "load.samples=2,3"]
    code, output = run_cli("sweep", scenario, *options, *grid, "--out", tmp_path / "sweep")
    assert code == 2 and message in output, output
    assert server.requests == [] and not (tmp_path / "sweep").exists()


SERVED = "/root/.cache/kevload/targets/transformers/model"


def test_a_model_the_server_does_not_serve_is_named_with_the_one_it_serves(tmp_path):
    # transformers serve serves its model by a cache path: `--model SmolLM2-135M-Instruct` was
    # refused with http_400, its reason only in a side line about logprobs.
    from tests.fakeserver import Behaviour, FakeServer

    out = tmp_path / "run"
    with FakeServer(Behaviour(served_model=SERVED)) as server:
        code, output = run_cli(
            "run", "--url", server.url, "--model", "SmolLM2-135M-Instruct", "--out", out
        )
        assert server.requests == []  # refused before the run sent anything
    assert code == 3
    assert (
        "kevload: error: the server does not serve model 'SmolLM2-135M-Instruct' (http_404: "
        in output
    )
    assert f"it serves '{SERVED}'; send that name (--model '{SERVED}', or target.model)" in output
    assert "logprobs" not in output and not out.exists()


def test_a_refusal_is_no_model_error_where_the_server_lists_the_model_asked_for(tmp_path):
    from tests.fakeserver import Behaviour, FakeServer

    # Refused with 404 though /v1/models lists the name sent: kevload cannot say the name is wrong,
    # so the run goes on and fails as a run whose every request failed.
    behaviour = Behaviour(served_model="other", listed_models=("m",))
    with FakeServer(behaviour) as server:
        code, output = run_cli(
            "run", "--url", server.url, "--model", "m", "--out", tmp_path / "run", "--quiet"
        )
    assert code == 3, output
    assert "does not serve" not in output and "http_404" in output
    assert (tmp_path / "run" / "records.jsonl").exists()
