"""Shared fixtures: the fake server, scenario files and a CLI runner."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from kevload.cli import main
from kevload.compare.cells import Reduction
from kevload.compare.reader import reduce_records
from kevload.records.store import Record
from kevload.records.summary import RunSummary
from kevload.servers.processes import pid_alive
from kevload.servers.targets.cache import cache_root
from tests.fakeserver import Behaviour, FakeServer

# Every process this session starts inherits this mark in its environment (targets are started with
# the caller's environment), so the stray check below finds this session's servers and no other
# session's.
SESSION_MARK = f"KEVLOAD_TEST_SESSION={uuid.uuid4().hex}"
os.environ["KEVLOAD_TEST_SESSION"] = SESSION_MARK.split("=", 1)[1]


@pytest.fixture(scope="session", autouse=True)
def no_stray_target_processes():
    """After the whole session no server this session started from kevload's cache may still run,
    pass or fail."""
    yield
    strays = []
    root = str(cache_root() / "targets")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (
                    (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
                ours = SESSION_MARK.encode() in (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if ours and root in cmdline and pid_alive(int(entry.name)):
                strays.append(f"{entry.name}: {cmdline[:120]}")
    assert not strays, "target processes left running:\n" + "\n".join(strays)


@pytest.fixture
def server():
    with FakeServer(Behaviour()) as fake:
        yield fake


# A crafted record's fields that its test is not about, as a record kevload writes would hold them.
_RECORD_FILLED = {
    "run_id": "r",
    "seq": 0,
    "probe": "p1",
    "role": "probe",
    "mode": "single",
    "concurrency": 1,
    "rate": None,
    "sample": 0,
    "in_flight": 0,
    "status": "ok",
    "output": None,
    "sha256": None,
    "finish_reason": None,
    "prompt_tokens": None,
    "completion_tokens": None,
    "token_ids": None,
    "tokens": None,
    "logprobs": None,
    "system_fingerprint": None,
    "t_scheduled": None,
    "t_send": 0.0,
    "t_first_byte": None,
    "t_first_token": None,
    "t_last_byte": 0.0,
    "chunks": 0,
    "max_gap": None,
    "error": None,
    "retries": 0,
    "params": {},
}


def filled(row: dict[str, Any]) -> dict[str, Any]:
    """A crafted record with every field a records file's line holds."""
    return {**_RECORD_FILLED, **row}


def reduce_rows(rows: Iterable[dict[str, Any]], **options: Any) -> Reduction:
    """Crafted records (their JSON objects, or a records file's as read) reduced as the comparator
    reduces a file: each filled in and checked as a line of one is (``store.RECORD_DECODER``), then
    folded."""
    return reduce_records((msgspec.convert(filled(row), Record) for row in rows), **options)


def crafted_times(seq: int, level: int) -> dict[str, float]:
    """Send and last-byte times for a crafted record: serial samples one after another, a level's
    samples all in flight together, as at full load (so the overlap check has nothing to flag)."""
    if level == 1:
        return {"t_send": seq * 0.1, "t_last_byte": seq * 0.1 + 0.05}
    return {"t_send": level * 100 + seq * 0.001, "t_last_byte": level * 100 + 50}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def write_scenario(
    path: Path,
    url: str,
    *,
    probes: list[dict] | None = None,
    params: dict | None = None,
    target: dict | None = None,
    **load: Any,
) -> Path:
    """A scenario file for ``url``; keyword arguments go to [load]."""
    probes = probes or [{"id": "p1", "prompt": "Say something.", "max_tokens": 16}]
    target = {"base_url": url, "model": "fake", "timeout": 5, **(target or {})}
    lines = ["[target]"] + [f"{k} = {toml_value(v)}" for k, v in target.items()]
    lines += ["", "[params]"] + [
        f"{k} = {toml_value(v)}" for k, v in (params or {"temperature": 0}).items()
    ]
    lines += ["", "[load]"] + [
        f"{k} = {toml_value(v)}" for k, v in {"concurrency": [1, 4], "samples": 8, **load}.items()
    ]
    for probe in probes:
        lines += ["", "[[probes]]"] + [f"{k} = {toml_value(v)}" for k, v in probe.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.output


def load_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def cells_by_level(
    summary: dict | RunSummary, probe: str = "p1", role: str = "probe"
) -> dict[int, Any]:
    """One probe's cells by concurrency: CellSummary objects from a RunSummary, dicts from
    summary.json."""
    if isinstance(summary, RunSummary):
        return {c.concurrency: c for c in summary.cells if c.probe == probe and c.role == role}
    return {
        c["concurrency"]: c for c in summary["cells"] if c["probe"] == probe and c["role"] == role
    }
