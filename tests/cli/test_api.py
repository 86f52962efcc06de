"""The Python API importable from ``kevload``: each documented name is the object its module
defines, and ``import kevload`` loads none of them until asked (``kevload --help`` stays quick)."""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import kevload
from tests.conftest import write_scenario


@pytest.mark.parametrize("name", sorted(kevload._API))
def test_each_public_name_is_the_object_its_module_defines(name):
    assert getattr(kevload, name) is getattr(importlib.import_module(kevload._API[name]), name)
    assert name in dir(kevload) and name in kevload.__doc__


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="'nothing_here'"):
        kevload.nothing_here  # noqa: B018


def test_importing_kevload_loads_none_of_its_packages():
    code = "import sys, kevload; print(sorted(m for m in sys.modules if m.startswith('kevload.')))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_scenario_loaded_through_the_api_is_the_scenario_type():
    path = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.toml"
    scenario = kevload.load_scenario(path, ['target.base_url="http://127.0.0.1:9/v1"'])
    assert (
        isinstance(scenario, kevload.Scenario)
        and scenario.target.base_url == "http://127.0.0.1:9/v1"
    )


def test_a_summary_read_back_equals_the_one_the_run_made(tmp_path, server):
    """Sequence fields are tuples in memory; read from JSON, those a run writes only sometimes
    (default None) were left as lists, and the two summaries compared unequal."""
    server.behaviour.drift_at = 2  # drift: the optional per-cell and per-run lists are written
    scenario = kevload.load_scenario(
        write_scenario(tmp_path / "s.toml", server.url, samples=4, concurrency=[1, 2])
    )
    result = asyncio.run(kevload.run_scenario(scenario, tmp_path / "run"))
    again = kevload.read_summary(tmp_path / "run" / "summary.json")
    assert again == result.summary
    assert not [k for k, v in vars(again).items() if isinstance(v, list)]


def test_the_api_takes_each_path_as_a_str_or_a_path(tmp_path, server):
    scenario = kevload.load_scenario(
        str(write_scenario(tmp_path / "s.toml", server.url, samples=2))
    )
    result = asyncio.run(
        kevload.run_scenario(scenario, str(tmp_path / "run"))
    )  # before: AttributeError on .mkdir
    assert result.run_dir == tmp_path / "run" and result.summary.verdict == "deterministic"
    assert kevload.read_summary(str(tmp_path / "run" / "summary.json")) == result.summary
    assert kevload.RunDir.open(str(tmp_path / "run")).summary() == result.summary
    options = kevload.DiagnoseOptions(
        url=server.url,
        model="m",
        probe=kevload.Probe(id="p", prompt="hi"),
        params={},
        samples=3,
        max_concurrency=2,
        out=str(tmp_path / "diag"),
    )
    diagnosis = asyncio.run(kevload.diagnose(options, log=lambda _: None))
    assert (
        diagnosis.verdict == "stable"
        and (tmp_path / "diag" / "baseline" / "summary.json").is_file()
    )
