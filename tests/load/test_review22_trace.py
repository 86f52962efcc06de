"""Review of trace replay (#22 item 4): what kevload said about a trace that was not true, each against a crafted
server or trace file whose truth is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kevload.records.store import read_records
from tests.conftest import load_summary, run_cli, write_scenario
from tests.inputs.test_trace import BURST, mooncake


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def traced_run(tmp_path: Path, url: str, **load) -> Path:
    scenario = write_scenario(tmp_path / "s.toml", url, concurrency=[1],
                              trace=str(mooncake(tmp_path / "t.jsonl", BURST)), **load)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code in (0, 1), output
    return tmp_path / "run"


def test_a_trace_cells_case_reruns_the_trace(tmp_path, server):
    """A case built from a trace level that drifted was rerun as the probe alone at the replay's mean rate, with no
    trace behind it: the drift went away and `cases rerun` said `unstable→stable`, a fix that never happened."""
    server.behaviour.latency = 0.3
    server.behaviour.drift_at = 3
    traced_run(tmp_path, server.url, samples=2, trace_speedup=[2])
    cases_path = tmp_path / "cases.jsonl"
    assert run_cli("cases", "build", tmp_path / "run", "-o", cases_path)[0] == 0
    case = next(c for c in read(cases_path) if c["params"]["concurrency"] == 0)
    assert case["verdict"] == "unstable" and case["load"]["trace_speedup"] == [2]
    assert Path(case["load"]["trace"]) == (tmp_path / "t.jsonl").resolve()
    after = tmp_path / "after.jsonl"
    code, output = run_cli("cases", "rerun", cases_path, "--url", server.url, "--model", "fake", "--times", "2",
                           "-o", after, "--out", tmp_path / "reruns")
    row = next(r for r in read(after) if r["id"] == case["id"])
    assert row["transition"] == "unchanged" and row["verdict_after"] == "unstable", output
    assert f"{case['id']}: mode=single r=2.5/s" in output
    rerun_records = list(read_records(Path(row["rerun_dir"]) / "records.jsonl"))
    assert sum(r["role"] == "companion" for r in rerun_records) == len(BURST)  # the trace was replayed


def test_cases_build_of_a_stable_trace_run(tmp_path, server):
    """A stable trace run's cells (the serial c=1 and the trace's r=…) made `cases build` end in a TypeError, and a
    drifting one noted the serial cell `unstable only at concurrency ≥ 0`."""
    traced_run(tmp_path, server.url, samples=2, trace_speedup=[2])
    cases_path = tmp_path / "cases.jsonl"
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", cases_path)
    assert code == 0 and "Traceback" not in output, output
    assert {c["note"] for c in read(cases_path)} == {"stable at level c=1, r=2.5/s (n=2)"}

    server.behaviour.latency = 0.3
    server.behaviour.drift_at = 3
    drifted = tmp_path / "drifted"
    drifted.mkdir()
    traced_run(drifted, server.url, samples=2, trace_speedup=[2])
    run_cli("cases", "build", drifted / "run", "-o", drifted / "cases.jsonl")
    assert {c["note"] for c in read(drifted / "cases.jsonl")} == {"unstable only at level ≥ r=2.5/s"}


def test_ramp_s_keeps_every_probe_of_a_trace_level(tmp_path, server):
    """With load.ramp_s the probes the trace put inside the ramp were sent but never counted: the cell had fewer
    samples than asked and the summary said `short … (no errors: the run was cut short)` of a complete run."""
    run = traced_run(tmp_path, server.url, samples=4, trace_speedup=[2], ramp_s=1)
    summary = load_summary(run)
    (cell,) = [c for c in summary["cells"] if c["role"] == "probe" and c["rate"] is not None]
    assert cell["ok"] == 4 and not cell["short"] and summary["short_cells"] == []
    traced = sorted((r for r in read_records(run / "records.jsonl") if r["rate"] is not None),
                    key=lambda r: r["t_scheduled"])
    start = traced[0]["t_scheduled"]
    probes = [r["t_scheduled"] - start for r in traced if r["role"] == "probe"]
    assert all(r["counted"] for r in traced if r["role"] == "probe")
    # The replay lasts 2 s at ×2; the probes spread over the second past the ramp.
    assert probes == pytest.approx([1 + (k + 0.5) / 4 for k in range(4)], abs=1e-9)


def test_a_ramp_as_long_as_the_replay_is_refused(tmp_path):
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1],
                              trace=str(mooncake(tmp_path / "t.jsonl", BURST)), trace_speedup=[1, 2], ramp_s=2)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and "load.ramp_s: expected less than the replay's span at the largest load.trace_speedup " \
        "(2 s)" in output and "Traceback" not in output, output


def test_burstgpt_failed_requests_are_skipped_and_counted(tmp_path, server):
    """BurstGPT's own files (BurstGPT_1.csv, _2.csv) hold failed requests as `Response tokens` 0: every line was
    refused there (exit 2), so the trace the README names could not be replayed."""
    trace = tmp_path / "burst.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "5,ChatGPT,12,3,15,Conversation log\n6,ChatGPT,40,0,40,Conversation log\n6.5,GPT-4,0,0,0,API log\n"
                     "7,ChatGPT,9,2,11,API log\n")
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=1, trace=str(trace),
                              trace_speedup=[4])
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    companions = sorted((r for r in read_records(tmp_path / "run" / "records.jsonl") if r["role"] == "companion"),
                        key=lambda r: r["t_scheduled"])
    assert [r["params"]["max_tokens"] for r in companions] == [3, 2]
    (dataset,) = json.loads((tmp_path / "run" / "run.json").read_text())["datasets"]
    assert dataset["count"] == 2 and dataset["failed"] == 2 and dataset["lines"] == 4


def test_a_replay_rate_that_rounds_to_nothing_is_refused(tmp_path):
    """A trace over centuries labelled its level `r=0/s` and waited for its first probe for ever; two speed-ups
    of the same rounded rate would share one cell."""
    mooncake(tmp_path / "t.jsonl", [(0, 5, 2, []), (10**13, 5, 2, [])])
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], trace="t.jsonl")
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and "load.trace_speedup: expected speed-ups whose replays' rates differ at 6 decimals " \
        "(r=…/s keys the level)" in output and "Traceback" not in output, output


def test_the_words_that_are_two_tokens_opening_a_prompt_are_the_readmes():
    """The README said every word is one token "with its leading space or without": 11 are two without one, so a
    prompt opening with one counts one more. Checked against SmolLM2's vocabulary where a run has cached it."""
    from kevload.inputs.trace import VOCABULARY
    from kevload.servers.targets.cache import cache_root

    found = sorted((cache_root() / "models").glob("*/tokenizer.json"))
    if not found:
        pytest.skip("no cached SmolLM2 tokenizer.json (the transformers target caches it)")
    vocab = json.loads(found[0].read_text())["model"]["vocab"]
    assert all("Ġ" + word in vocab for word in VOCABULARY)  # one token after a space (byte-level BPE's Ġ)
    alone = [word for word in VOCABULARY if word not in vocab]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"(`{' '.join(alone)}`)" in readme.replace("\n", " ")


def test_a_sweeps_setting_is_checked_against_the_trace(tmp_path):
    """`sweep --grid load.ramp_s=…` (Scenario.with_settings) set a ramp longer than the replay, or a speed-up whose
    rate rounds to 0, past the checks a file's own keys get: its probes fell before the ramp or never came."""
    from kevload.errors import ScenarioError
    from kevload.inputs.scenario import load_scenario

    mooncake(tmp_path / "t.jsonl", BURST)
    scenario = load_scenario(write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1],
                                            trace="t.jsonl"))
    with pytest.raises(ScenarioError, match="load.ramp_s: expected less than the replay's span"):
        scenario.with_settings({"load.ramp_s": 10})
    with pytest.raises(ScenarioError, match="load.trace_speedup: expected speed-ups whose replays' rates differ"):
        scenario.with_settings({"load.trace_speedup": [1e-12]})
    assert scenario.with_settings({"load.ramp_s": 1}).load.ramp_s == 1
