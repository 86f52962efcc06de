"""Case sets: build from runs (append-only, per target), rerun under the recorded load, report
transitions."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from kevload.inputs.workload import BUILTIN_COMPANIONS
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

GUIDE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def rerun(cases_path, server, tmp_path, *extra):
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
        "4",
        "-o",
        after,
        "--out",
        tmp_path / "reruns",
        *extra,
    )
    return code, output, {r["id"]: r for r in read(after)}


def test_build_rerun_transitions(tmp_path, server):
    server.behaviour.drift_at = 3
    server.behaviour.latency = 0.1
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=8)
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 1
    cases_path = tmp_path / "cases.jsonl"
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", cases_path)
    assert code == 0 and "2 new, 0 kept, 0 skipped" in output
    cases = read(cases_path)
    by_level = {c["params"]["concurrency"]: c for c in cases}
    assert set(cases[0]) >= {"id", "input", "params", "outputs", "expected", "verdict", "note"}
    assert by_level[1]["verdict"] == "stable" and by_level[4]["verdict"] == "unstable"
    assert by_level[4]["note"] == "unstable only at concurrency ≥ 4"
    assert by_level[1]["input"] == "Say something." and by_level[1]["params"]["temperature"] == 0
    assert sum(o["count"] for o in by_level[4]["outputs"]) == 8

    # A person fills in `expected`; building again from the same run keeps it, adds nothing and says
    # why.
    by_level[1]["expected"] = by_level[1]["outputs"][0]["text"]
    cases_path.write_text(
        "\n".join(json.dumps(c, ensure_ascii=False) for c in by_level.values()) + "\n"
    )
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", cases_path)
    assert "0 new, 2 kept, 2 skipped" in output
    assert (
        output.count("same target, model, input, params and load") == 2 and "already in" in output
    )
    assert read(cases_path)[0]["expected"] == by_level[1]["expected"]

    # The server is fixed: the unstable case becomes stable, the expected output still matches.
    server.behaviour.drift_at = None
    code, output, rows = rerun(cases_path, server, tmp_path)
    assert code == 0, output
    assert "unstable→stable: 1" in output and "stable→unstable: 0" in output
    assert "matches expected" in output
    rows = {r["params"]["concurrency"]: r for r in rows.values()}
    assert rows[4]["rerun_uniq"] == 1 and rows[4]["verdict_after"] == "stable"

    # A regression: the stable case now drifts.
    server.behaviour.always_drift = True
    code, output, _ = rerun(cases_path, server, tmp_path)
    assert code == 1
    assert "stable→unstable: 1" in output
    assert "does not match expected" in output


def test_a_case_belongs_to_its_target(tmp_path):
    """The same prompt and params against another server are other cases, not duplicates dropped in
    silence."""
    with FakeServer(Behaviour()) as same_a, FakeServer(Behaviour(version="other-model")) as other:
        for name, srv in (("a1", same_a), ("a2", same_a), ("b", other)):
            scenario = write_scenario(
                tmp_path / f"{name}.toml", srv.url, concurrency=[1, 2], samples=3
            )
            assert run_cli("run", scenario, "--out", tmp_path / name, "--quiet")[0] == 0
        port_a = same_a.port
    cases_path = tmp_path / "cases.jsonl"
    code, output = run_cli("cases", "build", tmp_path / "a1", tmp_path / "b", "-o", cases_path)
    assert code == 0 and "4 new, 0 kept, 0 skipped" in output, output
    cases = read(cases_path)
    assert len({c["id"] for c in cases}) == 4
    assert {c["target"]["name"] for c in cases} == {
        f"127.0.0.1:{port_a}",
        f"127.0.0.1:{other.port}",
    }
    assert {c["target"]["model"] for c in cases} == {"fake"}

    # A second run against the same server (whose answers did not change) adds nothing, and says so.
    code, output = run_cli("cases", "build", tmp_path / "a2", "-o", cases_path)
    assert "0 new, 4 kept, 2 skipped" in output
    assert re.search(
        rf"skipped p1-\w+ from {re.escape(str(tmp_path / 'a2'))}: same target, model, input, "
        rf"params "
        rf"and load as the case from {re.escape(str(tmp_path / 'a1'))} \(already in",
        output,
    )

    # URLs differ between environments: one --target-name makes them one target.
    named = tmp_path / "named.jsonl"
    code, output = run_cli(
        "cases", "build", tmp_path / "a1", tmp_path / "b", "-o", named, "--target-name", "staging"
    )
    assert "2 new, 0 kept, 2 skipped" in output and output.count("given earlier in this build") == 2
    assert {c["target"]["name"] for c in read(named)} == {"staging"}


def test_rerun_notices_a_changed_answer_and_accepts_it(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=3)
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    cases_path = tmp_path / "cases.jsonl"
    run_cli("cases", "build", tmp_path / "run", "-o", cases_path)
    before = {c["id"]: c for c in read(cases_path)}

    # The same server, unchanged: every rerun answer is among the recorded ones.
    code, output, rows = rerun(cases_path, server, tmp_path)
    assert code == 0, output
    assert all(
        r["matches_recorded"] is True and r["transition"] == "unchanged" for r in rows.values()
    )
    assert "changed: 0" in output and "unchanged: 2" in output

    # A new model version answers something else, stably: `changed`, a regression.
    server.behaviour.version = "v2"
    code, output, rows = rerun(cases_path, server, tmp_path)
    assert code == 1, output
    assert "changed: 2" in output and "NOT among recorded outputs" in output
    assert all(
        r["verdict_after"] == "stable" and r["matches_recorded"] is False for r in rows.values()
    )
    assert read(cases_path) == list(
        before.values()
    )  # without --accept-changes the file is not touched

    # Accepted: the new answers become the outputs; the old ones stay in the history with their
    # date.
    code, output, rows = rerun(cases_path, server, tmp_path, "--accept-changes")
    assert code == 0, output
    assert "accepted the new answers of 2 changed case(s)" in output
    for case in read(cases_path):
        new_text = rows[case["id"]]["rerun_outputs"][0]["text"]
        assert case["outputs"] == [{"text": new_text, "count": 4}]
        old = before[case["id"]]
        assert (
            case["history"][0]["outputs"] == old["outputs"]
            and old["outputs"][0]["text"] != new_text
        )
        assert (
            case["history"][0]["recorded_at"] == old["recorded_at"]
            and case["history"][0]["replaced_at"]
        )
    code, output, rows = rerun(cases_path, server, tmp_path)
    assert code == 0 and "changed: 0" in output
    assert all(r["matches_recorded"] is True for r in rows.values())

    # The docs' cases section names every field kevload writes, beside the guide's names.
    section = (
        GUIDE_PAGE.read_text().split("Case sets, the regression suite", 1)[1].split("\n## ", 1)[0]
    )
    written = set().union(*(set(c) for c in read(cases_path)), *(set(r) for r in rows.values()))
    assert [k for k in sorted(written) if f"`{k}`" not in section] == []
    for guide_name in ("编号", "输入", "参数", "多次调用结果", "期望结果", "判定", "备注"):
        assert guide_name in section
    assert all(f"exit {code}" in section for code in (1, 2, 3))


def test_rerun_reproduces_mixed_load(tmp_path):
    """A case found unstable among mixed companions is rerun among the same companions, not
    alone."""
    behaviour = Behaviour(drift_when_mixed=True, latency=0.1)
    probes = [
        {"id": "p1", "prompt": "Say something.", "max_tokens": 16},
        {"id": "p2", "prompt": "Say something else.", "max_tokens": 16},
    ]
    with FakeServer(behaviour) as server:
        scenario = write_scenario(
            tmp_path / "s.toml",
            server.url,
            probes=probes,
            mode="mixed",
            concurrency=[3],
            samples=5,
            seed=7,
        )
        assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 1
        cases_path = tmp_path / "cases.jsonl"
        run_cli("cases", "build", tmp_path / "run", "-o", cases_path)
        cases = {c["input"]: c for c in read(cases_path)}
        p2 = cases["Say something else."]["id"]
        assert {c["verdict"] for c in cases.values()} == {"unstable"}
        assert cases["Say something else."]["load"] == {
            "mode": "mixed",
            "concurrency": 3,
            "samples": 5,
            "stream": False,
            "seed": 8,
            "companions": "builtin",
        }
        # The run's last companions, cancelled once its probes were done, finish on the server
        # first.
        time.sleep(0.3)
        server.requests.clear()

        # The server did not change: the cases stay unstable (rerun alone they would look fixed).
        code, output, rows = rerun(cases_path, server, tmp_path)
        assert code == 0, output
        assert "unchanged: 2" in output and "unstable→stable: 0" in output
        assert {r["verdict_after"] for r in rows.values()} == {"unstable"}
        companions = {text for _, text, _ in BUILTIN_COMPANIONS}
        assert any(r["messages"][-1]["content"] in companions for r in server.requests)
        assert f"{p2}: mode=mixed c=3 seed=8 companions=builtin samples=4 params=" in output
        assert rows[p2]["rerun"]["params"] == {"temperature": 0, "max_tokens": 16}
        # Same seed, same companion picks: the first one each companion worker sent matches the
        # run's.
        assert first_companions(Path(rows[p2]["rerun_dir"]), p2) == first_companions(
            tmp_path / "run", "p2"
        )

        # A new model version whose batches no longer drift: stable now, with answers never
        # recorded.
        time.sleep(0.3)
        server.behaviour.drift_when_mixed = False
        server.behaviour.version = "v2"
        code, output, rows = rerun(cases_path, server, tmp_path)
    assert code == 0 and "unstable→stable: 2" in output
    assert all(
        r["matches_recorded"] is False and r["rerun"]["mode"] == "mixed" for r in rows.values()
    )
    assert json.loads((Path(rows[p2]["rerun_dir"]) / "run.json").read_text())["load"]["seed"] == 8


def first_companions(run_dir: Path, probe: str) -> list[str]:
    """The first two companions of ``probe``'s top level (a rerun sends the serial level first): its
    two companion slots send right before the probe's."""
    records = sorted(
        (json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()),
        key=lambda r: r["seq"],
    )
    top = max(r["concurrency"] for r in records if r["role"] == "probe" and r["probe"] == probe)
    start = next(
        i
        for i, r in enumerate(records)
        if r["role"] == "probe" and r["probe"] == probe and r["concurrency"] == top
    )
    assert [r["role"] for r in records[start - 2 : start]] == ["companion", "companion"]
    return [r["probe"] for r in records[start - 2 : start]]


def test_build_from_a_run_json_whose_url_cannot_be_read_names_the_file_and_key(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    meta["target"]["base_url"] = "http://127.0.0.1:99999/v1"
    (tmp_path / "run" / "run.json").write_text(json.dumps(meta))
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", tmp_path / "cases.jsonl")
    assert (
        code == 2
        and "run.json: target.base_url: expected a URL" in output
        and "Traceback" not in output
    ), output


def test_rerun_spells_a_case_id_s_control_characters_as_json_escapes(tmp_path, server):
    cases_path = tmp_path / "cases.jsonl"
    case = {
        "id": "c\u001b[2J1",
        "input": "x",
        "params": {"temperature": 0},
        "outputs": [],
        "verdict": "stable",
        "expected": "nothing like it",
    }
    cases_path.write_text(json.dumps(case) + "\n")
    code, output, _ = rerun(cases_path, server, tmp_path)
    assert "\x1b" not in output and output.count("c\\u001b[2J1: ") == 2, output


def test_bad_case_file_exits_2(tmp_path, server):
    bad = tmp_path / "cases.jsonl"
    bad.write_text('{"id": "x", "input": "hi"}\n')
    code, output = run_cli(
        "cases", "rerun", bad, "--url", server.url, "--model", "fake", "-o", tmp_path / "a"
    )
    assert code == 2 and "cases.jsonl:1: case lacks params, verdict" in output


def test_rerun_target_filter_names_an_unknown_target(tmp_path, server):
    cases = tmp_path / "cases.jsonl"
    cases.write_text('{"id": "x", "input": "hi", "params": {}, "verdict": "stable"}\n')
    code, output = run_cli(
        "cases",
        "rerun",
        cases,
        "--url",
        server.url,
        "--model",
        "fake",
        "-o",
        tmp_path / "a",
        "--target-name",
        "nope",
    )
    assert code == 2 and "no case of target 'nope'" in output


def test_open_loop_case_is_rerun_at_its_rate(tmp_path, server):
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, rate=[20], samples=3, concurrency=[1]
    )
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    cases_path = tmp_path / "cases.jsonl"
    run_cli("cases", "build", tmp_path / "run", "-o", cases_path)
    (case,) = read(cases_path)
    assert case["load"]["rate"] == 20 and case["load"]["arrival"] == "constant"
    assert case["note"] == "stable at rate 20/s (n=3)"
    code, output, rows = rerun(cases_path, server, tmp_path)
    assert code == 0 and f"{case['id']}: mode=single r=20/s samples=4" in output, output
    assert json.loads((Path(rows[case["id"]]["rerun_dir"]) / "run.json").read_text())["load"][
        "rate"
    ] == [20.0]


def test_a_case_in_the_guides_own_format(tmp_path, server):
    """The guide's template (outputs as plain strings, concurrency in params) reruns and is compared
    too."""
    cases_path = tmp_path / "kev_cases.jsonl"
    cases_path.write_text(
        json.dumps(
            {
                "id": "s001",
                "input": "同一段固定输入",
                "params": {"temperature": 0, "top_p": 1, "seed": 42, "concurrency": 2},
                "outputs": ["第一次输出"],
                "expected": None,
                "verdict": "stable",
                "note": "",
            },
            ensure_ascii=False,
        )
        + "\n"
    )
    code, output, rows = rerun(cases_path, server, tmp_path)
    assert code == 1 and "changed: 1 (s001)" in output
    assert rows["s001"]["rerun"]["concurrency"] == 2 and rows["s001"]["matches_recorded"] is False
    assert server.requests[-1]["seed"] == 42


def test_cases_are_built_from_dataset_probes_and_say_what_they_skip(tmp_path, server):
    lines = [
        {"id": "d1", "prompt": "First line."},
        {"messages": [{"role": "user", "content": "Second line."}], "max_tokens": 9},
        {"id": "talk", "turns": [{"user": "Hi."}, {"user": "And then?"}]},
    ]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    probes = [
        {"id": "inline", "prompt": "Say something.", "max_tokens": 16},
        {"dataset": "prompts.jsonl"},
    ]
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, probes=probes, concurrency=[1], samples=2
    )
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    cases_path = tmp_path / "cases.jsonl"
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", cases_path)
    assert code == 0 and "3 new, 0 kept, 1 skipped" in output, output
    assert re.search(r"skipped talk-\w+ from .*: a conversation \(turns\)", output), output
    by_input = {json.dumps(c["input"]): c for c in read(cases_path)}
    assert by_input['"First line."']["params"]["max_tokens"] == 64
    assert (
        by_input[json.dumps([{"role": "user", "content": "Second line."}])]["params"]["max_tokens"]
        == 9
    )
    code, output, rows = rerun(cases_path, server, tmp_path)
    assert code == 0 and "unchanged: 3" in output, output

    # The file changed since the run: its lines are not what the run asked, so no case is made up
    # from them.
    (tmp_path / "prompts.jsonl").write_text(
        json.dumps({"id": "d1", "prompt": "Another line."}) + "\n"
    )
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", tmp_path / "other.jsonl")
    assert code == 0 and "0 new, 0 kept, 4 skipped" in output, output
    assert "skipped d1@single/c=1 from" in output
    assert "its probes come from a dataset that cannot be read as the run read it" in output


def test_a_run_whose_summary_lacks_a_key_every_summary_has_is_refused_naming_it(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    summary = tmp_path / "run" / "summary.json"
    doc = json.loads(summary.read_text())
    del doc["verdict"]
    summary.write_text(json.dumps(doc))
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", tmp_path / "cases.jsonl")
    assert code == 2, output  # before: a TypeError's traceback, exit 1
    assert f"{summary}: verdict: expected" in output and "missing" in output, output
    assert "Traceback" not in output and not (tmp_path / "cases.jsonl").exists()


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"verdict": "weird"}, "$.verdict"),
        ({"id": 5}, "$.id"),
        ({"input": None}, "$.input"),
        ({"outputs": {"a": 1}}, "$.outputs"),
        ({"outputs": [5]}, "$.outputs[0]"),
        ({"outputs": [{}]}, "$.outputs[0]"),
        ({"params": {"concurrency": "x"}}, "$.params.concurrency"),
        ({"load": {"concurrency": "x"}}, "$.load.concurrency"),
        ({"target": "x"}, "$.target"),
    ],
)
def test_a_case_of_the_wrong_types_exits_2_naming_its_line_and_key_before_anything_is_sent(
    tmp_path, server, change, key
):
    case = {
        "id": "x",
        "input": "hi",
        "params": {},
        "verdict": "stable",
        "outputs": [{"text": "a", "count": 1}],
    }
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps(case) + "\n" + json.dumps({**case, **change}) + "\n")
    code, output = run_cli(
        "cases",
        "rerun",
        path,
        "--url",
        server.url,
        "--model",
        "fake",
        "--times",
        "2",
        "-o",
        tmp_path / "after.jsonl",
        "--out",
        tmp_path / "reruns",
    )
    # Before: a traceback after every case was sent (a verdict no build writes, outputs [{}]) or
    # before (an id that is no text, a level that is no count), or exit 1 with outputs {"a": 1} read
    # as the recorded answer "a".
    assert code == 2, output
    assert f"{path}:2: case" in output and key in output, output
    assert server.requests == [] and not (tmp_path / "reruns").exists()


def test_each_case_is_rerun_in_a_directory_of_its_own_inside_out_whatever_its_probe_id(
    tmp_path, server
):
    # Probe ids may hold any character: a case id is the probe id and a digest of the case, and
    # names its rerun.
    ids = ["../../outside", "a/b", "a_b", "a\u0000b", ".."]
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=2,
        probes=[{"id": i, "prompt": "Say something.", "max_tokens": 8} for i in ids],
    )
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    cases_path = tmp_path / "cases.jsonl"
    assert run_cli("cases", "build", tmp_path / "run", "-o", cases_path)[0] == 0
    with cases_path.open("a") as handle:  # a case file's own id, which no build writes
        handle.write(json.dumps({**read(cases_path)[0], "id": ".."}) + "\n")
    # Before: ../../outside wrote its run two levels above OUT, a/b one level down, a NUL raised
    # ValueError, and ..
    # ran into OUT itself.
    code, _, after = rerun(cases_path, server, tmp_path)
    assert code == 0
    assert sorted(after) == sorted(case["id"] for case in read(cases_path))
    (rerun_out,) = (tmp_path / "reruns").iterdir()
    dirs = [Path(r["rerun_dir"]) for r in after.values()]
    assert len(set(dirs)) == len(dirs) and all(
        d.parent == rerun_out and (d / "summary.json").is_file() for d in dirs
    )
    assert (
        not (tmp_path / "outside").exists() and not (tmp_path / "reruns" / "records.jsonl").exists()
    )


def test_a_case_file_holding_one_id_twice_is_refused_naming_both_lines(tmp_path, server):
    case = {"id": "x", "input": "hi", "params": {}, "verdict": "stable"}
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps(case) + "\n" + json.dumps({**case, "input": "ho"}) + "\n")
    code, output = run_cli(
        "cases",
        "rerun",
        path,
        "--url",
        server.url,
        "--model",
        "fake",
        "-o",
        tmp_path / "a",
        "--out",
        tmp_path / "reruns",
    )
    assert code == 2, (
        output
    )  # before: the second rerun found the first one's directory (exit 2 after a case ran)
    assert f"{path}:2: case 'x': the id of line 1 too" in output and server.requests == []


def test_cases_from_a_graded_run_are_graded_on_rerun_by_their_grader_not_by_string_equality(
    tmp_path, server
):
    server.behaviour.latency = 0.1
    server.behaviour.answer_for = lambda prompt, overlap: "The sum is 5."
    probes = [{"id": "sum", "prompt": "What is 2 + 3?", "expected": 5}]
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, probes=probes, concurrency=[1, 4], samples=4
    )
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    cases_path = tmp_path / "cases.jsonl"
    assert run_cli("cases", "build", tmp_path / "run", "-o", cases_path)[0] == 0
    cases = read(cases_path)
    assert [(c["expected"], c["grade"]) for c in cases] == [
        (5.0, "number")
    ] * 2  # the run's grader, carried
    # Reworded serially (still right: another text, so no string equality would match it), wrong
    # under load.
    server.behaviour.answer_for = lambda prompt, overlap: "5" if overlap < 2 else "6"
    code, output, rows = rerun(cases_path, server, tmp_path)
    rows = {r["params"]["concurrency"]: r for r in rows.values()}
    assert rows[1]["matches_expected"] is True and rows[1]["matches_recorded"] is False
    assert rows[1]["graded_after"] == {"grade": "number", "good": 4, "bad": 0, "failed": 0}
    assert rows[4]["matches_expected"] is False
    assert rows[4]["graded_after"] == {"grade": "number", "good": 0, "bad": 4, "failed": 0}
    assert f"{rows[4]['id']}: does not match expected (0 good, 4 bad by grade number)" in output
    assert code == 1


def test_a_case_whose_grader_does_not_fit_is_refused_naming_its_line_and_key(tmp_path):
    cases_path = tmp_path / "cases.jsonl"
    case = {"id": "c1", "input": "x", "params": {}, "outputs": [], "verdict": "stable"}
    cases_path.write_text(
        json.dumps(case)
        + "\n"
        + json.dumps({**case, "id": "c2", "expected": "(", "grade": "regex"})
        + "\n"
    )
    code, output = run_cli(
        "cases",
        "rerun",
        cases_path,
        "--url",
        "http://127.0.0.1:9/v1",
        "--model",
        "m",
        "-o",
        tmp_path / "after.jsonl",
    )
    assert (
        code == 2
        and f"{cases_path}:2: case c2: expected: expected " in output
        and "Traceback" not in output
    )


def test_a_case_whose_python_grader_raises_is_bad_input_naming_the_case_not_a_mismatch(
    tmp_path, server
):
    # A grader that raises graded nothing: "does not match expected" (exit 1, drift to a CI) would
    # be a guess.
    (tmp_path / "kevload_test_case_grader.py").write_text(
        "def check(answer, probe, expected):\n    raise ValueError('no verdict')\n"
    )
    cases_path = tmp_path / "cases.jsonl"
    case = {
        "id": "c1",
        "input": "x",
        "params": {"temperature": 0},
        "outputs": [],
        "verdict": "stable",
        "expected": 5,
        "grade": "python:kevload_test_case_grader:check",
    }
    cases_path.write_text(json.dumps(case) + "\n")
    code, output, rows = rerun(cases_path, server, tmp_path, "--trust-graders")
    assert code == 2, output
    assert (
        "grader failed: probe 'c1': python:kevload_test_case_grader:check raised ValueError: no "
        "verdict" in output
    )
    assert rows["c1"]["graded_after"]["failed"] == 4 and "Traceback" not in output


def test_build_of_a_dataset_run_graded_by_python_names_its_grader_without_importing_it(
    tmp_path, server
):
    import sys

    marker = tmp_path / "imported"
    (tmp_path / "kevload_test_lines_grader.py").write_text(
        f"open({str(marker)!r}, 'a').write('x')\n"
        "def check(answer, probe, expected):\n    return True\n"
    )
    (tmp_path / "items.jsonl").write_text(
        json.dumps(
            {
                "id": "d1",
                "prompt": "Say something.",
                "grade": "python:kevload_test_lines_grader:check",
            }
        )
        + "\n"
    )
    write_scenario(
        tmp_path / "s.toml",
        server.url,
        probes=[{"dataset": "items.jsonl"}],
        concurrency=[1],
        samples=2,
    )
    assert run_cli("run", tmp_path / "s.toml", "--out", tmp_path / "run", "--quiet")[0] == 0
    sys.modules.pop("kevload_test_lines_grader")
    marker.unlink()
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", tmp_path / "cases.jsonl")
    assert code == 0 and "1 new" in output, output
    (case,) = read(tmp_path / "cases.jsonl")
    assert case["grade"] == "python:kevload_test_lines_grader:check" and case["grader_dir"] == str(
        tmp_path
    )
    assert not marker.exists()


def test_a_case_file_python_grader_is_imported_only_with_trust_graders_from_where_its_run_found_it(
    tmp_path, server, monkeypatch
):
    """A case file is data: its python grader is refused (nothing imported) without --trust-graders;
    with it, the grader is found where the run found it (the case keeps that directory), whatever
    directory the rerun runs in."""
    import sys

    suite = tmp_path / "suite"
    suite.mkdir()
    marker = tmp_path / "imported"
    (suite / "kevload_test_case_home.py").write_text(
        f"open({str(marker)!r}, 'a').write('x')\n"
        "def check(answer, probe, expected):\n    return True\n"
    )
    probes = [
        {
            "id": "p1",
            "prompt": "Say something.",
            "expected": 1,
            "grade": "python:kevload_test_case_home:check",
        }
    ]
    write_scenario(suite / "s.toml", server.url, probes=probes, concurrency=[1], samples=2)
    monkeypatch.chdir(tmp_path)
    assert run_cli("run", "suite/s.toml", "--out", "run", "--quiet")[0] == 0
    assert run_cli("cases", "build", "run", "-o", "cases.jsonl")[0] == 0
    sys.modules.pop("kevload_test_case_home")
    marker.unlink()
    (built,) = read(tmp_path / "cases.jsonl")
    assert built["grader_dir"] == str(suite)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, output = run_cli(
        "cases",
        "rerun",
        tmp_path / "cases.jsonl",
        "--url",
        server.url,
        "--model",
        "fake",
        "-o",
        tmp_path / "after.jsonl",
    )
    assert code == 2 and "--trust-graders" in output and "case file" in output
    assert not marker.exists() and "kevload_test_case_home" not in sys.modules
    code, output, rows = rerun(tmp_path / "cases.jsonl", server, tmp_path, "--trust-graders")
    assert code == 0, output
    assert rows[built["id"]]["graded_after"]["good"] == 4 and marker.exists()


def test_case_unstable_against_serial_stays_unstable_on_an_unchanged_server(tmp_path):
    """A server that gives one other answer whenever two requests overlap: the run's c=2 cell reads
    `1 all≠serial` (DRIFT, exit 1) and `cases build` records that case as unstable. `cases rerun`
    against the very same server sends the case at c=2 only, sees one distinct answer (the same
    batched one it recorded: `matches recorded`) and reported `unstable→stable`, exit 0: a fix that
    never happened. The rerun now sends the serial level too and judges the c=2 cell against it, as
    the run did."""
    with FakeServer(Behaviour(latency=0.1, drift_at=2, batched_variant=True)) as server:
        scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=4)
        assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 1
        c2 = cells_by_level(load_summary(tmp_path / "run"))[2]
        assert c2["drift"] and c2["distinct"] == 1 and not c2["agrees_with_serial"]
        cases = tmp_path / "cases.jsonl"
        assert run_cli("cases", "build", tmp_path / "run", "-o", cases)[0] == 0
        code, output = run_cli(
            "cases",
            "rerun",
            cases,
            "--url",
            server.url,
            "--model",
            "fake",
            "--times",
            "4",
            "-o",
            tmp_path / "after.jsonl",
            "--out",
            tmp_path / "reruns",
        )
    after = {
        json.loads(line)["params"]["concurrency"]: json.loads(line)
        for line in (tmp_path / "after.jsonl").read_text().splitlines()
    }
    assert after[2]["verdict"] == "unstable"
    assert after[2]["transition"] == "unchanged", output
