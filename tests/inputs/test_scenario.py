"""Bad scenarios give exit 2 and one line naming the file, the key and what was expected."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kevload.inputs.scenario import ScenarioError, load_scenario, scenario_from_dict
from tests.conftest import run_cli, write_scenario

GOOD = {
    "target": {"base_url": "http://127.0.0.1:9/v1", "model": "m"},
    "probes": [{"id": "a", "prompt": "x"}],
}


def test_quickstart_and_examples_load():
    from pathlib import Path

    files = sorted((Path(__file__).parents[2] / "scenarios").glob("*.toml"))
    assert len(files) >= 3
    for path in files:
        scenario = load_scenario(path)
        assert scenario.probes and scenario.load.concurrency


def test_overrides_are_toml_values(tmp_path):
    path = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    sc = load_scenario(
        path, ["load.concurrency=[1,4,2]", 'target.model="x"', "params.seed=3", "load.mode=mixed"]
    )
    assert sc.load.concurrency == (1, 2, 4)
    assert sc.target.model == "x"
    assert sc.params["seed"] == 3
    assert sc.load.mode == "mixed"


@pytest.mark.parametrize(
    ("change", "key", "expected"),
    [
        ("load.concurency=[1]", "load.concurency", "did you mean concurrency"),
        ("load.concurrency=[]", "load.concurrency", "non-empty list"),
        ("load.concurrency=[0, 2]", "load.concurrency", "from 1 to 100,000"),
        ("load.samples=0", "load.samples", "from 1 to 10,000,000"),
        ("load.samples=true", "load.samples", "integer"),
        ("load.mode=mixd", "load.mode", "did you mean mixed"),
        ("target.api=chatt", "target.api", "one of chat, completions"),
        ('target.base_url="ftp://x"', "target.base_url", "http://"),
        ("target.timeout=-1", "target.timeout", "> 0"),
        ("load.stream=3", "load.stream", "boolean"),
        ("params.model=1", "params.model", "set by target"),
    ],
)
def test_bad_values_name_the_key(tmp_path, change, key, expected):
    path = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    code, output = run_cli("run", path, "--set", change)
    assert code == 2
    assert str(path) in output and key in output and expected in output
    assert "Traceback" not in output
    assert len(output.strip().splitlines()) == 1


def test_malformed_toml(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[target\nbase_url = 1")
    code, output = run_cli("run", path)
    assert code == 2 and "bad.toml: not valid TOML" in output


def test_a_byte_order_mark_opens_a_scenario_file(tmp_path):
    path = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    plain = load_scenario(path)
    path.write_text(
        "\ufeff" + path.read_text(), encoding="utf-8"
    )  # as an editor on Windows saves it
    assert load_scenario(path) == plain


def test_missing_file(tmp_path):
    code, output = run_cli("run", tmp_path / "nope.toml")
    assert code == 2 and "nope.toml: no such scenario file" in output


def test_missing_api_key_env(tmp_path, monkeypatch):
    monkeypatch.delenv("KEVLOAD_TEST_KEY", raising=False)
    path = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", target={"api_key_env": "KEVLOAD_TEST_KEY"}
    )
    code, output = run_cli("run", path)
    assert code == 2 and "KEVLOAD_TEST_KEY is not set" in output


def test_probe_needs_prompt_or_messages():
    with pytest.raises(
        ScenarioError, match=r"probes\[0\]: expected exactly one of prompt, messages or turns"
    ):
        scenario_from_dict({**GOOD, "probes": [{"id": "a"}]}, source="t.toml")


def test_bad_companion_file(tmp_path, server):
    bad = tmp_path / "companions.jsonl"
    bad.write_text("not json\n")
    path = write_scenario(tmp_path / "s.toml", server.url, mode="mixed", companions=str(bad))
    code, output = run_cli("run", path, "--out", tmp_path / "run")
    assert code == 2 and "companions.jsonl:1" in output and "JSONL" in output


toml_scalars = st.one_of(
    st.integers(), st.booleans(), st.text(max_size=8), st.floats(allow_nan=False)
)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["target", "probes", "params", "load", "name", "x"]), toml_values
    )
)
def test_loader_fails_only_with_its_own_error(raw):
    with contextlib.suppress(ScenarioError):
        scenario_from_dict(raw, source="fuzz.toml")


def test_probe_with_text_keeps_the_input_shape():
    from kevload.inputs.probe import Probe

    plain = Probe(id="p", prompt="abc", max_tokens=9).with_text("xyz", "q")
    assert plain == Probe(id="q", prompt="xyz", max_tokens=9)
    chat = Probe(
        id="p", messages=({"role": "system", "content": "s"}, {"role": "user", "content": "u"})
    )
    assert chat.with_text("v", "c").messages == (
        {"role": "system", "content": "s"},
        {"role": "user", "content": "v"},
    )
    assert chat.messages[-1]["content"] == "u"  # the original is untouched
