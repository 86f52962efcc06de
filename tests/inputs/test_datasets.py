"""Probes and companions from JSONL datasets: chosen by a seed, hashed into run.json, every line
checked."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kevload.inputs.datasets import sample
from kevload.inputs.probe import Probe
from kevload.inputs.scenario import load_scenario
from kevload.records.store import read_records
from tests.conftest import run_cli, write_scenario

LOAD = {
    "mode": "mixed",
    "concurrency": [1, 2],
    "samples": 2,
    "companions": "chats.jsonl",
    "companion_count": 4,
}


def _datasets(tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_text(
        "".join(
            json.dumps({"id": f"q{i}", "prompt": f"Question number {i}?"}) + "\n" for i in range(20)
        )
    )
    (tmp_path / "chats.jsonl").write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"Chat {i}"}], "max_tokens": 8})
            + "\n"
            for i in range(10)
        )
    )


def _scenario(tmp_path: Path, url: str, **load) -> Path:
    return write_scenario(
        tmp_path / "s.toml",
        url,
        probes=[{"dataset": "prompts.jsonl", "count": 3}],
        **{**LOAD, **load},
    )


def _run(tmp_path: Path, scenario: Path, name: str, *args: str) -> tuple[dict, list[dict]]:
    code, output = run_cli("run", scenario, "--out", tmp_path / name, "--quiet", *args)
    assert code == 0, output
    meta = json.loads((tmp_path / name / "run.json").read_text())
    return meta, list(read_records(tmp_path / name / "records.jsonl"))


def _probe_ids(records: list[dict]) -> set[str]:
    return {r["probe"] for r in records if r["role"] == "probe"}


def test_same_seed_same_inputs_and_hashes(tmp_path, server):
    _datasets(tmp_path)
    scenario = _scenario(tmp_path, server.url)
    first, first_records = _run(tmp_path, scenario, "a", "--dataset-seed", "7")
    second, second_records = _run(tmp_path, scenario, "b", "--dataset-seed", "7")
    assert first["datasets"] == second["datasets"]
    by_role = {d["role"]: d for d in first["datasets"]}
    assert by_role["probe"] == {
        "role": "probe",
        "path": str(tmp_path / "prompts.jsonl"),
        "lines": 20,
        "count": 3,
        "seed": 7,
        "sha256": hashlib.sha256((tmp_path / "prompts.jsonl").read_bytes()).hexdigest(),
    }
    assert by_role["companion"]["count"] == 4 and by_role["companion"]["lines"] == 10
    assert (
        by_role["companion"]["sha256"]
        == hashlib.sha256((tmp_path / "chats.jsonl").read_bytes()).hexdigest()
    )
    assert len(_probe_ids(first_records)) == 3 and _probe_ids(first_records) == _probe_ids(
        second_records
    )
    # What the server got as probes is the text of the chosen lines.
    prompts = {m["content"] for body in server.requests for m in body["messages"]}
    assert {f"Question number {pid[1:]}?" for pid in _probe_ids(first_records)} <= prompts
    # Companions come only from the four chosen chat lines, the same four each time.
    pool = load_scenario(scenario, ["load.dataset_seed=7"]).datasets[1].items
    sent = {r["probe"] for r in first_records + second_records if r["role"] == "companion"}
    assert sent and sent <= {item.id for item in pool}
    assert pool == load_scenario(scenario, ["load.dataset_seed=7"]).datasets[1].items


def test_another_seed_chooses_other_lines(tmp_path, server):
    _datasets(tmp_path)
    scenario = _scenario(tmp_path, server.url)
    seven = load_scenario(scenario, ["load.dataset_seed=7"])
    eight = load_scenario(scenario, ["load.dataset_seed=8"])
    assert [p.id for p in seven.probes] != [p.id for p in eight.probes]
    assert seven.datasets[1].items != eight.datasets[1].items
    meta, records = _run(tmp_path, scenario, "eight", "--dataset-seed", "8")
    assert _probe_ids(records) == {p.id for p in eight.probes}
    assert {d["seed"] for d in meta["datasets"]} == {8}


def test_dataset_seed_in_the_scenario_and_the_default(tmp_path, server):
    _datasets(tmp_path)
    in_file = load_scenario(_scenario(tmp_path, server.url, dataset_seed=8))
    assert [p.id for p in in_file.probes] == [
        p.id for p in load_scenario(_scenario(tmp_path, server.url), ["load.dataset_seed=8"]).probes
    ]
    everything = load_scenario(
        write_scenario(
            tmp_path / "all.toml",
            server.url,
            probes=[{"dataset": "prompts.jsonl", "max_tokens": 5}],
        )
    )
    assert [p.id for p in everything.probes] == [f"q{i}" for i in range(20)]
    assert {p.max_tokens for p in everything.probes} == {5}


def test_a_changed_file_changes_the_recorded_hash(tmp_path, server):
    _datasets(tmp_path)
    scenario = _scenario(tmp_path, server.url)
    before, _ = _run(tmp_path, scenario, "before")
    with (tmp_path / "chats.jsonl").open("a") as handle:
        handle.write(json.dumps({"prompt": "One more line."}) + "\n")
    after, _ = _run(tmp_path, scenario, "after")
    old, new = ({d["role"]: d["sha256"] for d in meta["datasets"]} for meta in (before, after))
    assert old["probe"] == new["probe"] and old["companion"] != new["companion"]


def test_resume_refuses_a_changed_dataset(tmp_path, server):
    _datasets(tmp_path)
    _run(tmp_path, _scenario(tmp_path, server.url), "run")
    (tmp_path / "prompts.jsonl").write_text(
        (tmp_path / "prompts.jsonl").read_text().replace("number 3", "no. 3")
    )
    code, output = run_cli("run", "--resume", tmp_path / "run")
    assert code == 2 and "datasets: expected the inputs the run started with" in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("where", "line", "expected"),
    [
        (
            "prompts.jsonl",
            "{not json",
            "prompts.jsonl:3: probes[0].dataset: expected one JSON object a line",
        ),
        (
            "prompts.jsonl",
            '{"id": "x"}',
            "prompts.jsonl:3: probes[0].dataset: expected an object with prompt",
        ),
        (
            "prompts.jsonl",
            '{"prompt": "a", "messages": []}',
            "prompts.jsonl:3: probes[0].dataset: expected exactly one",
        ),
        (
            "prompts.jsonl",
            '{"prompt": "a", "max_tokens": 0}',
            "prompts.jsonl:3: probes[0].dataset: max_tokens",
        ),
        ("chats.jsonl", "[1, 2]", "chats.jsonl:3: load.companions: expected an object with prompt"),
    ],
)
def test_a_bad_line_exits_2_naming_file_and_line(tmp_path, server, where, line, expected):
    _datasets(tmp_path)
    lines = (tmp_path / where).read_text().splitlines()
    lines[2] = line
    (tmp_path / where).write_text("\n".join(lines) + "\n")
    code, output = run_cli(
        "run", _scenario(tmp_path, server.url), "--out", tmp_path / "r", "--quiet"
    )
    assert code == 2 and expected in output and "Traceback" not in output
    assert not (tmp_path / "r").exists() and server.requests == []


@pytest.mark.parametrize(
    ("probes", "load", "expected"),
    [
        ([{"dataset": "missing.jsonl"}], {}, "missing.jsonl: probes[0].dataset: cannot read"),
        ([{"dataset": "prompts.jsonl", "count": 21}], {}, "probes[0].count: expected at most 20"),
        (
            [{"dataset": "prompts.jsonl", "count": -1}],
            {},
            "probes[0].count: expected an integer >= 0",
        ),
        ([{"dataset": "prompts.jsonl", "prompt": "x"}], {}, "probes[0].prompt: unknown key"),
        (
            [{"dataset": "prompts.jsonl"}],
            {"companion_count": 11},
            "load.companion_count: expected at most 10",
        ),
        (
            [{"dataset": "prompts.jsonl"}, {"id": "q1", "prompt": "again"}],
            {},
            "probes.id: expected unique ids",
        ),
    ],
)
def test_bad_dataset_settings_exit_2(tmp_path, server, probes, load, expected):
    _datasets(tmp_path)
    scenario = write_scenario(tmp_path / "s.toml", server.url, probes=probes, **{**LOAD, **load})
    code, output = run_cli("run", scenario, "--quiet")
    assert code == 2 and expected in output, output


def test_sample_is_a_seeded_prefix_in_file_order():
    assert sample(5, 0, 1) == (0, 1, 2, 3, 4) and sample(5, 9, 1) == (0, 1, 2, 3, 4)
    three, six = sample(100, 3, 42), sample(100, 6, 42)
    assert list(three) == sorted(three) and set(three) <= set(six)
    assert three == sample(100, 3, 42) and three != sample(100, 3, 43)
    # Appending lines keeps an old line chosen unless a new one ranks lower: the choice is stable.
    assert set(sample(120, 3, 42)) - set(three) <= set(range(100, 120))


BOM = "\ufeff"  # what an editor on Windows writes before the first line of a UTF-8 file


def test_a_byte_order_mark_opens_a_dataset_or_companion_file(tmp_path, server):
    _datasets(tmp_path)
    for name in ("prompts.jsonl", "chats.jsonl"):
        (tmp_path / name).write_text(BOM + (tmp_path / name).read_text(), encoding="utf-8")
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, probes=[{"dataset": "prompts.jsonl"}], **LOAD
    )
    loaded = load_scenario(scenario)
    # The first line is read as written: the mark is no part of it.
    assert len(loaded.probes) == 20 and loaded.probes[0] == Probe(
        id="q0", prompt="Question number 0?"
    )
    assert [d.lines for d in loaded.datasets] == [20, 10]
    assert {p.messages[0]["content"] for p in loaded.datasets[1].items} <= {
        f"Chat {i}" for i in range(10)
    }
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output


def test_a_byte_order_mark_past_the_start_is_no_json(tmp_path, server):
    _datasets(tmp_path)
    lines = (tmp_path / "prompts.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "prompts.jsonl").write_text(lines[0] + BOM + "".join(lines[1:]), encoding="utf-8")
    code, output = run_cli("run", _scenario(tmp_path, server.url), "--out", tmp_path / "run")
    assert (
        code == 2
        and "prompts.jsonl:2: probes[0].dataset: expected one JSON object a line" in output
    )


def test_companion_line_with_bad_messages_is_refused_before_anything_is_sent(tmp_path, server):
    """The docs: 'Every line is checked before anything is sent (a bad one: exit 2 naming
    file:line)'. A companion line whose messages lack `content` passed the check; with api =
    "completions" the companion slot died on it and the probe slot then sent uncounted copies
    forever (the run hung, about 20 requests a second, no record counted)."""
    (tmp_path / "companions.jsonl").write_text(
        '{"prompt": "fine"}\n{"messages": [{"role": "user"}]}\n'
    )
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1, 2],
        samples=2,
        mode="mixed",
        companions="companions.jsonl",
        target={"api": "completions"},
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 2, output
    assert "companions.jsonl:2" in output and "Traceback" not in output
    assert not server.requests
