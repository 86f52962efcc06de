"""kevload: load-test OpenAI-compatible LLM servers and find out whether the same input gives the
same output.

The Python API, importable from ``kevload`` itself::

    import asyncio
    import kevload

    scenario = kevload.load_scenario(
        "scenarios/quickstart.toml", ['target.base_url="http://127.0.0.1:8080/v1"']
    )
    # a RunSummary, also written to summary.json
    summary = asyncio.run(kevload.run_scenario(scenario)).summary
    # 0 held, 1 drift, 3 inconclusive
    raise SystemExit(kevload.exitcode.for_run(summary))

- scenarios: ``load_scenario`` (a TOML file and ``key=value`` overrides), ``build_scenario`` (in
  code, from a ``Target``, ``Probe``\\ s and a ``Load``), ``Scenario`` (frozen; ``with_settings``
  for a typed change);
- running: ``run_scenario`` (records and ``summary.json`` in a run directory, resumable),
  ``diagnose`` with ``DiagnoseOptions`` (the guide's steps);
- reading: ``RunDir`` (a run directory: records, run.json, summary.json), ``read_summary``,
  ``summarize`` (records folded into a ``RunSummary`` again), ``RunSummary`` and ``CellSummary``
  (frozen, ``to_json``);
- outcomes: ``ExitCode`` and ``exitcode`` (each command's result as one code), the error tree
  ``KevloadError`` → ``InputError`` (exit 2: ``ScenarioError``, ``RunDirError``) and
  ``TargetError`` (exit 3: ``ServerError``).

Every path argument (a scenario file, a run directory, a summary, ``DiagnoseOptions``' files) is a
str or a Path. Each name is imported on first use: ``import kevload`` (and so ``kevload --help``)
loads none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # what __getattr__ serves, as a type checker reads it (tests/test_public_api.py)
    from kevload.compare.summarizing import summarize
    from kevload.errors import (
        InputError,
        KevloadError,
        RunDirError,
        ScenarioError,
        ServerError,
        TargetError,
    )
    from kevload.exits import ExitCode
    from kevload.guide.diagnose import DiagnoseOptions, diagnose
    from kevload.inputs.probe import Probe
    from kevload.inputs.scenario import Scenario, build_scenario, load_scenario
    from kevload.inputs.scenariokeys import Load, Target
    from kevload.load.runs import run_scenario
    from kevload.outputs import exitcode
    from kevload.records.rundir import RunDir, read_summary
    from kevload.records.summary import CellSummary, RunSummary

# name → the module that defines it (imported on first use, so `import kevload.errors` stays cheap)
_API = {
    "Scenario": "kevload.inputs.scenario",
    "Target": "kevload.inputs.scenariokeys",
    "Load": "kevload.inputs.scenariokeys",
    "load_scenario": "kevload.inputs.scenario",
    "build_scenario": "kevload.inputs.scenario",
    "Probe": "kevload.inputs.probe",
    "run_scenario": "kevload.load.runs",
    "diagnose": "kevload.guide.diagnose",
    "DiagnoseOptions": "kevload.guide.diagnose",
    "RunDir": "kevload.records.rundir",
    "read_summary": "kevload.records.rundir",
    "summarize": "kevload.compare.summarizing",
    "RunSummary": "kevload.records.summary",
    "CellSummary": "kevload.records.summary",
    "ExitCode": "kevload.exits",
    "KevloadError": "kevload.errors",
    "InputError": "kevload.errors",
    "ScenarioError": "kevload.errors",
    "RunDirError": "kevload.errors",
    "TargetError": "kevload.errors",
    "ServerError": "kevload.errors",
}
# Written out, not built from _API: a type checker and ruff read a literal list only.
__all__ = [
    "__version__",
    "exitcode",
    "Scenario",
    "Target",
    "Load",
    "load_scenario",
    "build_scenario",
    "Probe",
    "run_scenario",
    "diagnose",
    "DiagnoseOptions",
    "RunDir",
    "read_summary",
    "summarize",
    "RunSummary",
    "CellSummary",
    "ExitCode",
    "KevloadError",
    "InputError",
    "ScenarioError",
    "RunDirError",
    "TargetError",
    "ServerError",
]


def __getattr__(name: str) -> Any:
    if name == "exitcode":
        return importlib.import_module("kevload.outputs.exitcode")
    if name not in _API:
        raise AttributeError(f"module 'kevload' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
