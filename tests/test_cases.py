"""Case sets: build from runs (append-only), rerun after a change, report transitions."""

from __future__ import annotations

import json

from tests.conftest import run_cli, write_scenario


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_build_rerun_transitions(tmp_path, server):
    server.behaviour.drift_at = 3
    server.behaviour.latency = 0.1
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=8)
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 1
    cases_path = tmp_path / "cases.jsonl"
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", cases_path)
    assert code == 0 and "2 cases added, 0 kept" in output
    cases = read(cases_path)
    by_level = {c["params"]["concurrency"]: c for c in cases}
    assert set(cases[0]) >= {"id", "input", "params", "outputs", "expected", "verdict", "note"}
    assert by_level[1]["verdict"] == "stable" and by_level[4]["verdict"] == "unstable"
    assert by_level[4]["note"] == "unstable only at concurrency ≥ 4"
    assert by_level[1]["input"] == "Say something." and by_level[1]["params"]["temperature"] == 0
    assert sum(o["count"] for o in by_level[4]["outputs"]) == 8

    # A person fills in `expected`; building again from the same run keeps it and adds nothing.
    by_level[1]["expected"] = by_level[1]["outputs"][0]["text"]
    cases_path.write_text("\n".join(json.dumps(c, ensure_ascii=False) for c in by_level.values()) + "\n")
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", cases_path)
    assert "0 cases added, 2 kept" in output
    assert read(cases_path)[0]["expected"] == by_level[1]["expected"]

    # The server is fixed: the unstable case becomes stable, the expected output still matches.
    server.behaviour.drift_at = None
    after = tmp_path / "after.jsonl"
    code, output = run_cli("cases", "rerun", cases_path, "--url", server.url, "--model", "fake", "--times", "5",
                           "-o", after, "--out", tmp_path / "reruns")
    assert code == 0, output
    assert "unstable→stable: 1" in output and "stable→unstable: 0" in output
    assert "matches expected" in output
    rows = {r["params"]["concurrency"]: r for r in read(after)}
    assert rows[4]["rerun_uniq"] == 1 and rows[4]["verdict_after"] == "stable"

    # A regression: the stable case now drifts.
    server.behaviour.always_drift = True
    code, output = run_cli("cases", "rerun", cases_path, "--url", server.url, "--model", "fake", "--times", "5",
                           "-o", after, "--out", tmp_path / "reruns-2")
    assert code == 1
    assert "stable→unstable: 1" in output
    assert "does not match expected" in output
