"""Trace replay (load.trace): the trace's clock kept in the records, its lengths as the server sees
them, its hash ids as shared prefixes, the probe's drift found where the trace crowds the server,
bad traces refused by file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kevload.errors import ScenarioError
from kevload.inputs.scenario import load_scenario
from kevload.inputs.trace import VOCABULARY, TraceRequest, prompt_text
from kevload.records.store import read_records
from tests.conftest import load_summary, run_cli, write_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def mooncake(path: Path, rows: list[tuple[int, int, int, list[int]]]) -> Path:
    """A Mooncake JSONL trace: (timestamp ms, input_length, output_length, hash_ids) a line."""
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h})
            + "\n"
            for t, i, o, h in rows
        )
    )
    return path


def replay(tmp_path: Path, url: str, trace: Path, **load) -> tuple[list[dict], dict]:
    scenario = write_scenario(tmp_path / "s.toml", url, concurrency=[1], trace=str(trace), **load)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code in (0, 1), output
    return list(read_records(tmp_path / "run" / "records.jsonl")), load_summary(tmp_path / "run")


# A burst of three requests at 1 s (where the first of two probes lands: span 4 s, probes at ¼ and ¾
# of it) and a quiet stretch at 3 s (where the second lands).
BURST = [(0, 8, 4, []), (1000, 8, 4, []), (1000, 8, 4, []), (1000, 8, 4, []), (4000, 8, 4, [])]


def test_offsets_lengths_and_probe_points_are_the_traces(tmp_path, server):
    rows = [
        (0, 40, 8, [0, 1, 7]),
        (250, 45, 12, [0, 1, 8]),
        (700, 20, 16, [2]),
        (700, 33, 4, []),
        (2000, 100, 24, [0, 1, 9, 10, 11, 12, 13]),
    ]
    records, summary = replay(
        tmp_path,
        server.url,
        mooncake(tmp_path / "t.jsonl", rows),
        samples=4,
        trace_speedup=[4],
        trace_block_tokens=16,
    )
    traced = sorted((r for r in records if r["rate"] is not None), key=lambda r: r["t_scheduled"])
    start = traced[0]["t_scheduled"]
    companions = [r for r in traced if r["role"] == "companion"]
    # Each arrival at its trace time ÷ 4, from one start: checkable in the records alone.
    assert [r["t_scheduled"] - start for r in companions] == pytest.approx(
        [t / 1000 / 4 for t, *_ in rows], abs=1e-9
    )
    assert [r["params"]["max_tokens"] for r in companions] == [o for _, _, o, _ in rows]
    probes = [r["t_scheduled"] - start for r in traced if r["role"] == "probe"]
    assert probes == pytest.approx(
        [0.5 * (k + 0.5) / 4 for k in range(4)], abs=1e-9
    )  # span 2 s ÷ 4 = 0.5 s
    assert all(r["t_send"] >= r["t_scheduled"] for r in traced)
    # The server sees each prompt at its input length (a word a token) and the shared hash ids as a
    # shared prefix.
    sent = {b["messages"][-1]["content"] for b in server.requests}
    prompts = [next(p for p in sent if len(p.split()) == i) for _, i, _, _ in rows]
    words = [p.split() for p in prompts]
    assert words[0][:32] == words[1][:32] and words[0][32:] != words[1][32:40]
    assert words[4][:32] == words[0][:32] and words[2][:16] != words[0][:16]
    # The level's rate is the replay's mean rate: 5 requests over 2 s ÷ 4.
    trace_cells = [c for c in summary["cells"] if c["role"] == "probe" and c["rate"] is not None]
    assert [c["rate"] for c in trace_cells] == [10.0] and trace_cells[0]["latency"]["lateness"][
        "n"
    ] == 4
    assert summary["missing_cells"] == []  # run.json's trace gives the same level the engine ran
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    (dataset,) = meta["datasets"]
    assert (
        dataset["format"] == "mooncake" and dataset["count"] == 5 and len(dataset["sha256"]) == 64
    )


@pytest.mark.parametrize("drift_at, drifts", [(3, True), (5, False)])
def test_probe_drift_where_the_trace_crowds_the_server(tmp_path, server, drift_at, drifts):
    server.behaviour.latency = 0.3
    server.behaviour.drift_at = drift_at  # outputs vary once this many requests run together
    records, summary = replay(
        tmp_path, server.url, mooncake(tmp_path / "t.jsonl", BURST), samples=2, trace_speedup=[2]
    )
    serial = {r["sha256"] for r in records if r["role"] == "probe" and r["concurrency"] == 1}
    assert len(serial) == 1
    probes = sorted(
        (r for r in records if r["role"] == "probe" and r["rate"] is not None),
        key=lambda r: r["t_scheduled"],
    )
    # The burst's probe ran with its three arrivals (four at once); the quiet one alone.
    assert [r["sha256"] in serial for r in probes] == [not drifts, True]
    assert bool(summary["drift_cells"]) == drifts
    if drifts:
        assert summary["drift_cells"] == ["p1@single/r=2.5/s"]  # 5 requests over 4 s ÷ 2


def test_burstgpt_csv(tmp_path, server):
    trace = tmp_path / "burst.csv"
    trace.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,12,3,15,Conversation log\n5.5,GPT-4,30,7,37,API log\n\n7,ChatGPT,9,2,11,API "
        "log\n"
    )
    records, summary = replay(tmp_path, server.url, trace, samples=1, trace_speedup=[2])
    companions = sorted(
        (r for r in records if r["role"] == "companion"), key=lambda r: r["t_scheduled"]
    )
    start = companions[0]["t_scheduled"]
    assert [r["t_scheduled"] - start for r in companions] == pytest.approx([0, 0.25, 1.0], abs=1e-9)
    assert [r["params"]["max_tokens"] for r in companions] == [3, 7, 2]
    lengths = sorted(len(b["messages"][-1]["content"].split()) for b in server.requests)
    assert lengths == [2, 2, 9, 12, 30]  # the two probes ("Say something.") and the trace's three
    assert (
        json.loads((tmp_path / "run" / "run.json").read_text())["datasets"][0]["format"]
        == "burstgpt"
    )


def test_prompt_blocks_are_shared_by_hash_id_and_cut_to_length():
    a = prompt_text(TraceRequest(0, 50, 1, (3, 4), line=1), seed=0, block_tokens=20).split()
    b = prompt_text(TraceRequest(0, 30, 1, (3, 5), line=2), seed=0, block_tokens=20).split()
    c = prompt_text(TraceRequest(0, 30, 1, (3, 5), line=2), seed=1, block_tokens=20).split()
    assert (len(a), len(b)) == (50, 30)
    assert a[:20] == b[:20] and a[20:30] != b[20:30]  # block 3 shared, blocks 4 and 5 not
    assert (
        a[40:] != b[:10] and c[:20] != b[:20]
    )  # past the blocks, words of its own; another seed, other words


@pytest.mark.parametrize(
    "text, error",
    [
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
            '{"timestamp": 10, "input_length": 5}\n',
            "t.jsonl:2: load.trace: output_length: expected an integer from 1 to 10,000,000 "
            "(tokens), got nothing",
        ),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 2}\nnot json\n',
            "t.jsonl:2: load.trace: expected one JSON object a line (JSONL)",
        ),
        (
            '{"timestamp": 9, "input_length": 5, "output_length": 2}\n\n'
            '{"timestamp": 3, "input_length": 5, "output_length": 2}\n',
            "t.jsonl:3: load.trace: expected arrivals in time order, this one is earlier than "
            "line 1's",
        ),
        (
            '{"timestamp": -1, "input_length": 5, "output_length": 2}\n',
            "t.jsonl:1: load.trace: timestamp: expected milliseconds >= 0 (Mooncake's), got -1",
        ),
        (
            '{"timestamp": 0, "input_length": 0, "output_length": 2}\n',
            "t.jsonl:1: load.trace: input_length: expected an integer from 1 to 1,000,000 "
            "(tokens), got 0",
        ),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": ["a"]}\n',
            "t.jsonl:1: load.trace: hash_ids: expected a list of integers, got ['a']",
        ),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 2}\n',
            "t.jsonl: load.trace: expected at least two requests at different times",
        ),
        (
            "Timestamp,Model,Request tokens,Total tokens\n1,m,2,3\n",
            "t.jsonl:1: load.trace: expected a BurstGPT header with Timestamp, Request tokens, "
            "Response tokens (or Mooncake "
            "JSON lines), missing Response tokens",
        ),
        (
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log "
            "Type\n1,m,2,3,5,x\n2,m,two,3,5,x\n",
            "t.jsonl:3: load.trace: Request tokens: expected an integer from 1 to 1,000,000 "
            "(tokens), got 'two'",
        ),
        (
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log "
            "Type\n1,m,2,3,5,x\n2,m,4\n",
            "t.jsonl:3: load.trace: expected 6 columns as in the header, got 3",
        ),
    ],
)
def test_bad_trace_lines_exit_2_naming_file_and_line(tmp_path, text, error):
    (tmp_path / "t.jsonl").write_text(text)
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], trace="t.jsonl"
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and error in output and "Traceback" not in output, output
    assert output.count("\n") <= 2


@pytest.mark.parametrize(
    "load, error",
    [
        ({"rate": [2]}, "load.rate: expected no rates with load.trace"),
        ({"mode": "mixed"}, 'load.mode: expected "single" with load.trace'),
        ({"duration": 3}, "load.duration: expected 0 with load.trace"),
        (
            {"arrival": "poisson"},
            'load.arrival: expected "constant" with load.trace (the trace sets the arrival times)',
        ),
        ({"trace_speedup": [0]}, "load.trace_speedup: expected a non-empty list of numbers > 0"),
        ({"trace_format": "csv"}, "load.trace_format: expected one of auto, mooncake, burstgpt"),
        ({"trace": "missing.jsonl"}, "missing.jsonl: load.trace: cannot read"),
    ],
)
def test_keys_that_clash_with_a_trace(tmp_path, load, error):
    mooncake(tmp_path / "t.jsonl", BURST)
    scenario = write_scenario(
        tmp_path / "s.toml",
        "http://127.0.0.1:9/v1",
        concurrency=[1],
        **{"trace": "t.jsonl", **load},
    )
    with pytest.raises(ScenarioError, match=None) as failed:
        load_scenario(scenario)
    assert error in str(failed.value)


def test_shipped_scenario_reads_its_trace():
    scenario = load_scenario(SCENARIOS / "trace_replay.toml")
    (trace,) = scenario.datasets
    assert (
        trace.format == "mooncake"
        and trace.count == 24
        and scenario.load.trace_speedup == (1.0, 4.0)
    )
    # Hash ids 0 and 1 (the shared "system prompt") open every request: the prefix the server may
    # reuse.
    assert all(r.hash_ids[:2] == (0, 1) for r in trace.requests)


def test_workers_share_the_trace_each_arrival_sent_once(tmp_path, server):
    rows = [(t, 10 + t // 100, 4, [0]) for t in range(0, 1000, 100)]
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=2,
        workers=2,
        trace=str(mooncake(tmp_path / "t.jsonl", rows)),
        trace_speedup=[2],
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    records = [
        r
        for f in ("records-0.jsonl", "records-1.jsonl")
        for r in read_records(tmp_path / "run" / f)
    ]
    companions = sorted(
        (r for r in records if r["role"] == "companion"), key=lambda r: r["t_scheduled"]
    )
    assert [r["probe"] for r in companions] == [f"trace:{n}" for n in range(1, 11)]
    assert {r["worker"] for r in companions} == {0, 1}
    # One start for both workers: their records agree on the trace's clock to within a microsecond.
    start = companions[0]["t_scheduled"]
    assert [r["t_scheduled"] - start for r in companions] == pytest.approx(
        [t / 2000 for t, *_ in rows], abs=1e-6
    )


def test_resume_refuses_other_prompt_blocks_from_the_same_trace(tmp_path, server):
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=2,
        trace_speedup=[4],
        trace=str(mooncake(tmp_path / "t.jsonl", BURST)),
        trace_block_tokens=16,
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    # The same file and seed, other blocks: a resumed part's prompts would not share the first
    # part's prefixes.
    code, output = run_cli(
        "run", "--resume", tmp_path / "run", "--set", "load.trace_block_tokens=8"
    )
    assert code == 2 and "datasets: expected the inputs the run started with" in output, output
    assert "Traceback" not in output


def read_jsonl(path: Path) -> list[dict]:
    """A JSON Lines file's rows (a case set, a rerun's results)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def traced_run(tmp_path: Path, url: str, **load) -> Path:
    """``kevload run`` of ``BURST`` as a trace at c=1 (``load`` added): the run's directory."""
    scenario = write_scenario(
        tmp_path / "s.toml",
        url,
        concurrency=[1],
        trace=str(mooncake(tmp_path / "t.jsonl", BURST)),
        **load,
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code in (0, 1), output
    return tmp_path / "run"


def test_a_trace_cells_case_reruns_the_trace(tmp_path, server):
    """A case built from a trace level that drifted was rerun as the probe alone at the replay's
    mean rate, with no trace behind it: the drift went away and `cases rerun` said
    `unstable→stable`, a fix that never happened."""
    server.behaviour.latency = 0.3
    server.behaviour.drift_at = 3
    traced_run(tmp_path, server.url, samples=2, trace_speedup=[2])
    cases_path = tmp_path / "cases.jsonl"
    assert run_cli("cases", "build", tmp_path / "run", "-o", cases_path)[0] == 0
    case = next(c for c in read_jsonl(cases_path) if c["params"]["concurrency"] == 0)
    assert case["verdict"] == "unstable" and case["load"]["trace_speedup"] == [2]
    assert Path(case["load"]["trace"]) == (tmp_path / "t.jsonl").resolve()
    after = tmp_path / "after.jsonl"
    code, output = run_cli(
        "cases",
        "rerun",
        cases_path,
        "--url",
        server.url,
        "--model",
        "fake",
        "--times",
        "2",
        "-o",
        after,
        "--out",
        tmp_path / "reruns",
    )
    row = next(r for r in read_jsonl(after) if r["id"] == case["id"])
    assert row["transition"] == "unchanged" and row["verdict_after"] == "unstable", output
    assert f"{case['id']}: mode=single r=2.5/s" in output
    rerun_records = list(read_records(Path(row["rerun_dir"]) / "records.jsonl"))
    assert sum(r["role"] == "companion" for r in rerun_records) == len(
        BURST
    )  # the trace was replayed


def test_cases_build_of_a_stable_trace_run(tmp_path, server):
    """A stable trace run's cells (the serial c=1 and the trace's r=…) made `cases build` end in a
    TypeError, and a drifting one noted the serial cell `unstable only at concurrency ≥ 0`."""
    traced_run(tmp_path, server.url, samples=2, trace_speedup=[2])
    cases_path = tmp_path / "cases.jsonl"
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", cases_path)
    assert code == 0 and "Traceback" not in output, output
    assert {c["note"] for c in read_jsonl(cases_path)} == {"stable at level c=1, r=2.5/s (n=2)"}

    server.behaviour.latency = 0.3
    server.behaviour.drift_at = 3
    drifted = tmp_path / "drifted"
    drifted.mkdir()
    traced_run(drifted, server.url, samples=2, trace_speedup=[2])
    run_cli("cases", "build", drifted / "run", "-o", drifted / "cases.jsonl")
    assert {c["note"] for c in read_jsonl(drifted / "cases.jsonl")} == {
        "unstable only at level ≥ r=2.5/s"
    }


def test_ramp_s_keeps_every_probe_of_a_trace_level(tmp_path, server):
    """With load.ramp_s the probes the trace put inside the ramp were sent but never counted: the
    cell had fewer samples than asked and the summary said `short … (no errors: the run was cut
    short)` of a complete run."""
    run = traced_run(tmp_path, server.url, samples=4, trace_speedup=[2], ramp_s=1)
    summary = load_summary(run)
    (cell,) = [c for c in summary["cells"] if c["role"] == "probe" and c["rate"] is not None]
    assert cell["ok"] == 4 and not cell["short"] and summary["short_cells"] == []
    traced = sorted(
        (r for r in read_records(run / "records.jsonl") if r["rate"] is not None),
        key=lambda r: r["t_scheduled"],
    )
    start = traced[0]["t_scheduled"]
    probes = [r["t_scheduled"] - start for r in traced if r["role"] == "probe"]
    assert all(r["counted"] for r in traced if r["role"] == "probe")
    # The replay lasts 2 s at ×2; the probes spread over the second past the ramp.
    assert probes == pytest.approx([1 + (k + 0.5) / 4 for k in range(4)], abs=1e-9)


def test_a_ramp_as_long_as_the_replay_is_refused(tmp_path):
    scenario = write_scenario(
        tmp_path / "s.toml",
        "http://127.0.0.1:9/v1",
        concurrency=[1],
        trace=str(mooncake(tmp_path / "t.jsonl", BURST)),
        trace_speedup=[1, 2],
        ramp_s=2,
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert (
        code == 2
        and "load.ramp_s: expected less than the replay's span at the largest load.trace_speedup "
        "(2 s)"
        in output
        and "Traceback" not in output
    ), output


def test_burstgpt_failed_requests_are_skipped_and_counted(tmp_path, server):
    """BurstGPT's own files (BurstGPT_1.csv, _2.csv) hold failed requests as `Response tokens` 0:
    every line was refused there (exit 2), so the trace the docs name could not be replayed."""
    trace = tmp_path / "burst.csv"
    trace.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,12,3,15,Conversation log\n6,ChatGPT,40,0,40,Conversation "
        "log\n6.5,GPT-4,0,0,0,API log\n"
        "7,ChatGPT,9,2,11,API log\n"
    )
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=1,
        trace=str(trace),
        trace_speedup=[4],
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    companions = sorted(
        (r for r in read_records(tmp_path / "run" / "records.jsonl") if r["role"] == "companion"),
        key=lambda r: r["t_scheduled"],
    )
    assert [r["params"]["max_tokens"] for r in companions] == [3, 2]
    (dataset,) = json.loads((tmp_path / "run" / "run.json").read_text())["datasets"]
    assert dataset["count"] == 2 and dataset["failed"] == 2 and dataset["lines"] == 4


def test_a_replay_rate_that_rounds_to_nothing_is_refused(tmp_path):
    """A trace over centuries labelled its level `r=0/s` and waited for its first probe for ever;
    two speed-ups of the same rounded rate would share one cell."""
    mooncake(tmp_path / "t.jsonl", [(0, 5, 2, []), (10**13, 5, 2, [])])
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], trace="t.jsonl"
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert (
        code == 2
        and "load.trace_speedup: expected speed-ups whose replays' rates differ at 6 decimals "
        "(r=…/s keys the level)"
        in output
        and "Traceback" not in output
    ), output


@pytest.mark.e2e
def test_the_words_that_are_two_tokens_opening_a_prompt_are_the_docs():
    """docs/workloads.md says every word is one token after a space and 11 are two without one, so a
    prompt opening with one counts one more: checked against the built-in model's own vocabulary
    (converted once, cached)."""
    from kevload.servers.targets.transformers_serve import model_dir

    vocab = json.loads((model_dir(log=lambda _: None) / "tokenizer.json").read_text())["model"][
        "vocab"
    ]
    assert all(
        "Ġ" + word in vocab for word in VOCABULARY
    )  # one token after a space (byte-level BPE's Ġ)
    alone = [word for word in VOCABULARY if word not in vocab]
    page = (Path(__file__).resolve().parents[2] / "docs" / "workloads.md").read_text()
    assert f"(`{' '.join(alone)}`)" in page.replace("\n", " ")


def test_a_sweeps_setting_is_checked_against_the_trace(tmp_path):
    """`sweep --grid load.ramp_s=…` (Scenario.with_settings) set a ramp longer than the replay, or a
    speed-up whose rate rounds to 0, past the checks a file's own keys get: its probes fell before
    the ramp or never came."""
    mooncake(tmp_path / "t.jsonl", BURST)
    scenario = load_scenario(
        write_scenario(
            tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], trace="t.jsonl"
        )
    )
    with pytest.raises(ScenarioError, match="load.ramp_s: expected less than the replay's span"):
        scenario.with_settings({"load.ramp_s": 10})
    with pytest.raises(
        ScenarioError, match="load.trace_speedup: expected speed-ups whose replays' rates differ"
    ):
        scenario.with_settings({"load.trace_speedup": [1e-12]})
    assert scenario.with_settings({"load.ramp_s": 1}).load.ramp_s == 1
