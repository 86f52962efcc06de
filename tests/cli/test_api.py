"""The Python API importable from ``kevload``: each documented name is the object its module defines, and
``import kevload`` loads none of them until asked (``kevload --help`` stays quick)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import kevload


@pytest.mark.parametrize("name", sorted(kevload._API))
def test_each_public_name_is_the_object_its_module_defines(name):
    assert getattr(kevload, name) is getattr(importlib.import_module(kevload._API[name]), name)
    assert name in dir(kevload) and name in kevload.__doc__


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="'nothing_here'"):
        kevload.nothing_here  # noqa: B018


def test_importing_kevload_loads_none_of_its_packages():
    code = "import sys, kevload; print(sorted(m for m in sys.modules if m.startswith('kevload.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_a_scenario_loaded_through_the_api_is_the_scenario_type():
    path = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.toml"
    scenario = kevload.load_scenario(path, ['target.base_url="http://127.0.0.1:9/v1"'])
    assert isinstance(scenario, kevload.Scenario) and scenario.target.base_url == "http://127.0.0.1:9/v1"
