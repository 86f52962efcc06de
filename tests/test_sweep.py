"""Sweeps: restart a server per setting, sweep scenario keys without restarts, one matrix out."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import run_cli, write_scenario


def test_sweep_server_setting_and_scenario_key(tmp_path):
    # A fake server process that drifts once `drift_at` requests overlap: the swept setting.
    cmd = f"{sys.executable} -m tests.fakeserver --port {{port}} --drift-at {{drift}}"
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1, 4], samples=8)
    out = tmp_path / "sweep"
    code, output = run_cli("sweep", scenario, "--server-cmd", cmd, "--grid", "drift=3,99",
                           "--grid", "load.mode=single,mixed", "--out", out)
    assert code == 1, output
    sweep = json.loads((out / "sweep.json").read_text())
    assert [r["setting"] for r in sweep["rows"]] == ["drift=3,load.mode=single", "drift=3,load.mode=mixed",
                                                     "drift=99,load.mode=single", "drift=99,load.mode=mixed"]
    drift = {r["setting"]: {c["level"]: c["drift"] for c in r["cells"]} for r in sweep["rows"]}
    assert drift["drift=3,load.mode=single"] == {"c=1": False, "c=4": True}
    assert drift["drift=99,load.mode=single"] == {"c=1": False, "c=4": False}
    assert sweep["levels"] == ["c=1", "c=4"]
    md = (out / "sweep.md").read_text()
    assert "| drift=3,load.mode=single | p1 (single) |" in md and "DRIFT" in md and "/s" in md
    # Two server settings → two server logs: it was restarted, not reused.
    assert len(list(out.glob("server-*.log"))) == 2


def test_scenario_keys_only_need_no_server(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=4)
    code, output = run_cli("sweep", scenario, "--grid", "load.stream=true,false", "--out", tmp_path / "sw")
    assert code == 0, output
    assert len(json.loads((tmp_path / "sw" / "sweep.json").read_text())["rows"]) == 2


def test_bad_grid(tmp_path):
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    code, output = run_cli("sweep", scenario, "--grid", "slots")
    assert code == 2 and "--grid 'slots': expected NAME=V1,V2" in output
    code, output = run_cli("sweep", scenario, "--grid", "slots=1,2")
    assert code == 2 and "--server-cmd or --target" in output


@pytest.mark.e2e
def test_sweep_builtin_llamacpp_slots(tmp_path):
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1, 2], samples=4,
                              probes=[{"id": "p1", "prompt": "Name a colour.", "max_tokens": 8}])
    code, output = run_cli("sweep", scenario, "--target", "llamacpp", "--grid", "slots=1,2", "--out", tmp_path / "sw")
    assert code == 0, output
    sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert [r["server"] for r in sweep["rows"]] == [{"slots": 1}, {"slots": 2}]
    assert all(c["distinct"] == 1 and c["ok"] == 4 for r in sweep["rows"] for c in r["cells"])
