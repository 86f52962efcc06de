"""``kevload compare`` against crafted servers whose truth is known: a rebuild, a new version with
planted wrong and reworded answers and a latency factor, answers wrong only under load, a candidate
that dies mid-run, conversations, rates, a stopped comparison resumed, bad usage."""

from __future__ import annotations

import asyncio
import json
import re
import sys

import pytest

from kevload.inputs.scenario import load_scenario
from kevload.load import comparing
from kevload.servers import rollout
from kevload.servers.targets import TargetSettings
from tests.conftest import run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

SUMS = 10


def sums() -> list[dict]:
    return [{"id": f"sum{i}", "prompt": f"What is {i}+2?", "expected": i + 2} for i in range(SUMS)]


def right(prompt: str, overlap: int) -> str:
    return f"The answer is {_total(prompt)}."


def _total(prompt: str) -> int:
    a, b = re.findall(r"\d+", prompt)[:2]
    return int(a) + int(b)


@pytest.fixture
def servers():
    with (
        FakeServer(Behaviour(answer_for=right)) as old,
        FakeServer(Behaviour(answer_for=right)) as new,
    ):
        yield old, new


def _compare(tmp_path, old, new, *args: str, probes=None, **load) -> tuple[int, str]:
    path = write_scenario(
        tmp_path / "s.toml", old.url, probes=probes or sums(), **{"samples": 3, **load}
    )
    return run_cli(
        "compare", path, "--url", f"old={old.url}", "--url", f"new={new.url}",
        "--out", tmp_path / "cmp", *args,
    )  # fmt: skip


def _doc(tmp_path) -> dict:
    return json.loads((tmp_path / "cmp" / "compare.json").read_text())


def test_a_rebuild_passes_and_every_target_is_a_run_directory(tmp_path, servers):
    code, output = _compare(
        tmp_path, *servers, "--metrics", tmp_path / "m.prom", concurrency=[1, 2]
    )
    assert code == 0, output
    metrics = (tmp_path / "m.prom").read_text()
    labels = 'reference="old",candidate="new",mode="single",level="c=2"'
    assert f"kevload_compare_agreement_ratio{{{labels}}} 1.0" in metrics
    assert metrics.endswith("# EOF\n")
    doc = _doc(tmp_path)
    assert doc["reference"] == "old" and [c["name"] for c in doc["candidates"]] == ["new"]
    levels = doc["candidates"][0]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    for level in levels:
        assert level["items"] == SUMS and level["agreement"] == 1.0
        assert level["good_to_bad"] == 0 and level["accuracy_candidate"] == 1.0
        assert level["agreement_ci95"][1] == 1.0 and level["latency_p50_ratio"] is not None
    assert all(len(line) <= 80 for line in output.splitlines())
    # Each target's records are an ordinary run: report reads it, and the comparison is recomputed.
    assert run_cli("report", tmp_path / "cmp" / "new", "--format", "json")[0] == 0
    code, again = run_cli("report", tmp_path / "cmp")
    assert code == 0 and "reference: old" in again
    assert json.loads((tmp_path / "cmp" / "old" / "run.json").read_text())["state"] == "complete"
    # In turns: the reference at c=1, the candidate at c=1, then both at c=2 in that order.
    turns = sorted(
        (record["t_send"], name, record["concurrency"])
        for name in ("old", "new")
        for record in map(json.loads, (tmp_path / "cmp" / name / "records.jsonl").open())
    )
    order = [turn[1:] for i, turn in enumerate(turns) if i == 0 or turn[1:] != turns[i - 1][1:]]
    assert order == [("old", 1), ("new", 1), ("old", 2), ("new", 2)]


def test_a_new_version_with_planted_wrong_and_reworded_items_is_counted_exactly(tmp_path, servers):
    old, new = servers
    old.behaviour.latency = 0.02
    new.behaviour.latency = 0.06  # three times slower

    def planted(prompt: str, overlap: int) -> str:
        i = _total(prompt) - 2
        return (
            f"The answer is {i + 3}."
            if i < 6
            else f"It is {i + 2}."
            if i < 8
            else f"The answer is {i + 2}."
        )

    new.behaviour.answer_for = planted
    code, output = _compare(
        tmp_path, old, new, "--junit", tmp_path / "j.xml", concurrency=[1], samples=4
    )
    assert code == 1, output
    (level,) = _doc(tmp_path)["candidates"][0]["levels"]
    assert level["classes"]["good_to_bad"] == 6 and level["classes"]["reworded_good"] == 2
    assert level["good_to_bad"] == 6 and level["bad_to_good"] == 0 and level["mcnemar_p"] == 0.03125
    assert level["accuracy_reference"] == 1.0 and level["accuracy_candidate"] == 0.4
    assert level["agreement"] == 0.2
    low, high = level["latency_p50_ratio_ci95"]
    assert low < 3 < high * 1.05, level["latency_p50_ratio_ci95"]
    assert "6 good→bad" in output
    assert 'failures="1"' in (tmp_path / "j.xml").read_text()


def test_answers_wrong_only_under_load_part_at_c4_alone(tmp_path, servers):
    old, new = servers
    for server in servers:
        server.behaviour.latency = 0.1  # every counted c=4 sample meets others at the server
    new.behaviour.answer_for = lambda p, overlap: right(p, 1) if overlap < 2 else "Too busy."
    code, output = _compare(tmp_path, old, new, concurrency=[1, 4], samples=4, probes=sums()[:8])
    assert code == 1, output
    serial, loaded = _doc(tmp_path)["candidates"][0]["levels"]
    assert serial["agreement"] == 1.0 and serial["good_to_bad"] == 0
    assert loaded["agreement"] == 0.0 and loaded["good_to_bad"] == 8
    assert loaded["accuracy_candidate"] == 0.0


def test_a_candidate_that_dies_mid_run_exits_3_and_the_reference_run_is_whole(tmp_path, servers):
    old, new = servers
    new.behaviour.faults = [None] * 6 + ["http_500"] * 1000
    code, output = _compare(tmp_path, old, new, concurrency=[1, 2])
    assert code == 3, output
    ref = json.loads((tmp_path / "cmp" / "old" / "run.json").read_text())
    assert ref["state"] == "complete"
    summary = json.loads((tmp_path / "cmp" / "old" / "summary.json").read_text())
    assert summary["verdict"] == "deterministic"


def test_conversations_are_compared_by_their_whole_transcript(tmp_path, servers):
    old, new = servers
    new.behaviour.answer_for = lambda p, overlap: "Another answer."
    probe = {"id": "talk", "turns": ["What is 1+2?", "And 2+2?"], "max_tokens": 16}
    code, output = _compare(tmp_path, old, new, concurrency=[1], probes=[probe])
    assert code == 1, output
    (level,) = _doc(tmp_path)["candidates"][0]["levels"]
    assert level["items"] == 1 and level["classes"]["different"] == 1


def test_rates_are_compared_rate_by_rate(tmp_path, servers):
    code, output = _compare(tmp_path, *servers, rate=[20.0], duration=0.5, samples=2)
    assert code == 0, output
    (level,) = _doc(tmp_path)["candidates"][0]["levels"]
    assert level["rate"] == 20.0 and "concurrency" not in level and level["agreement"] == 1.0


def test_a_stopped_comparison_resumes_where_it_stopped(tmp_path, servers):
    old, new = servers
    path = write_scenario(
        tmp_path / "s.toml", old.url, probes=sums()[:3], concurrency=[1, 2], samples=3
    )
    scenario = load_scenario(path)
    targets = [
        comparing.Target("old", scenario),
        comparing.Target("new", scenario.with_settings({"target.base_url": new.url})),
    ]
    out = tmp_path / "cmp"

    async def stopped() -> None:
        stop = asyncio.Event()
        seen = []

        def on_record(name: str, record) -> None:
            seen.append(name)
            if len(seen) == 12:  # the reference's c=1 and part of the candidate's
                stop.set()

        await comparing.run_comparison(
            targets, out, reference="old", stop=stop, on_record=on_record
        )

    asyncio.run(stopped())
    assert (
        not (out / "new" / "records.jsonl").is_file()
        or len((out / "new" / "records.jsonl").read_text().splitlines()) < 2 * 3 * 3
    )
    code, output = run_cli("compare", "--resume", out)
    assert code == 0, output
    levels = _doc(tmp_path)["candidates"][0]["levels"]
    assert [lv["items"] for lv in levels] == [3, 3] and all(lv["agreement"] == 1.0 for lv in levels)


def test_a_level_neither_side_sent_is_evidence_short_not_a_pass(tmp_path, servers):
    # Both runs ended complete without their c=2 records (a stop between two turns can do it):
    # nothing pairs c=2, and report must not pass what was never compared.
    code, output = _compare(tmp_path, *servers, probes=sums()[:2], concurrency=[1, 2], samples=2)
    assert code == 0, output
    for name in ("old", "new"):
        records = tmp_path / "cmp" / name / "records.jsonl"
        kept = [x for x in records.read_text().splitlines() if '"concurrency":1,' in x]
        assert kept and len(kept) < len(records.read_text().splitlines())
        records.write_text("\n".join(kept) + "\n")
        (tmp_path / "cmp" / name / "summary.json").unlink(missing_ok=True)
    code, output = run_cli("report", tmp_path / "cmp")
    assert code == 3, output
    assert "new: run ended partial" in output and "old: run ended partial" in output
    assert "new: no record at c=2: the run never sent them" in " ".join(output.split())


def test_a_built_in_targets_settings_are_read_from_its_spec():
    given = rollout.given(
        ["a=http://127.0.0.1:9/v1"], ["b=llamacpp:slots=1, cache_prompt=false"], []
    )
    assert given.targets == [("a", "http://127.0.0.1:9/v1", False), ("b", "llamacpp", True)]
    assert given.settings == {"b": TargetSettings(slots=1, cache_prompt=False)}
    assert given.settings["b"].changed() == {"slots": 1, "cache_prompt": False}
    assert rollout.given([], ["c=vllm"], []).settings == {"c": TargetSettings()}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "a=http://127.0.0.1:9/v1"], "at least two targets"),
        (["--url", "a=http://127.0.0.1:9/v1", "--url", "a=http://127.0.0.1:8/v1"], "given twice"),
        (
            [
                "--url",
                "a=http://127.0.0.1:9/v1",
                "--url",
                "b=http://127.0.0.1:8/v1",
                "--reference",
                "c",
            ],
            "--reference 'c'",
        ),
        (["--url", "http://127.0.0.1:9/v1", "--url", "b=http://127.0.0.1:8/v1"], "NAME=VALUE"),
        (["--url", "a=http://127.0.0.1:9/v1", "--target", "b=nosuch"], "expected a built-in"),
        (
            ["--url", "a=http://127.0.0.1:9/v1", "--target", "b=llamacpp:nosuch=1"],
            "--target b=llamacpp:nosuch=1: unknown target setting 'nosuch'",
        ),
        (
            ["--url", "a=http://127.0.0.1:9/v1", "--target", "b=llamacpp:slots"],
            "expected KEY=VALUE settings, got 'slots'",
        ),
    ],
)
def test_bad_usage_exits_2_naming_the_option(tmp_path, args, message):
    path = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    code, output = run_cli("compare", path, "--out", tmp_path / "cmp", *args)
    assert code == 2 and message in output, output
    assert not (tmp_path / "cmp").exists()


def test_three_targets_give_each_candidate_and_the_n_by_n_matrix(tmp_path, servers):
    old, new = servers
    with FakeServer(Behaviour(answer_for=lambda p, o: "Something else.")) as other:
        path = write_scenario(
            tmp_path / "s.toml", old.url, probes=sums()[:4], concurrency=[1], samples=2
        )
        code, output = run_cli(
            "compare", path, "--url", f"a={old.url}", "--url", f"b={new.url}",
            "--url", f"c={other.url}", "--out", tmp_path / "cmp", "--quiet", "--fail-on", "bad",
        )  # fmt: skip
    assert code == 1, output
    doc = _doc(tmp_path)
    assert [c["name"] for c in doc["candidates"]] == ["b", "c"]
    (matrix,) = doc["matrix"]
    assert matrix["targets"] == ["a", "b", "c"]
    assert matrix["agreement"] == [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    # 4 of 4 flipped is no significant change (McNemar p 0.125), so --fail-on bad is what fails c;
    # --quiet prints the findings and the exit line, only c's.
    assert "c single/c=1: answers made wrong: 4 good→bad (--fail-on bad)" in output, output
    assert "b single" not in output


def test_logprobs_that_move_under_the_same_text_are_latent(tmp_path, servers):
    old, new = servers
    new.behaviour.version = "v2"  # the same texts (answer_for), other per-token logprobs
    code, output = _compare(tmp_path, old, new, concurrency=[1], probes=sums()[:4])
    assert code == 0, output  # latent items are reported, not gated
    (level,) = _doc(tmp_path)["candidates"][0]["levels"]
    assert level["latent"] == 4 and level["classes"]["latent"] == 4 and level["agreement"] == 1.0
    assert level["latent_first_token"] == 0 and level["latent_max_logprob_diff"] > 0


def test_a_saved_reference_run_stands_for_a_server_that_no_longer_runs(tmp_path, servers):
    old, new = servers
    path = write_scenario(
        tmp_path / "s.toml", old.url, probes=sums()[:4], concurrency=[1], samples=2
    )
    assert run_cli("run", path, "--out", tmp_path / "saved", "--quiet")[0] == 0
    code, output = run_cli(
        "compare", path, "--reference-run", tmp_path / "saved", "--reference", "old",
        "--url", f"new={new.url}", "--out", tmp_path / "cmp",
    )  # fmt: skip
    assert code == 0, output
    doc = _doc(tmp_path)
    assert doc["reference"] == "old" and doc["candidates"][0]["levels"][0]["agreement"] == 1.0
    assert any("saved run" in note for note in doc["notes"])
    assert not (tmp_path / "cmp" / "old").exists()  # the saved run was read, not run again
    code, markdown = run_cli("report", tmp_path / "cmp", "--format", "markdown")
    assert code == 0 and "| new | single/c=1 | 4 | 100%" in markdown, markdown


def test_together_runs_every_target_in_the_same_window(tmp_path, servers):
    for server in servers:
        server.behaviour.latency = 0.05
    code, output = _compare(
        tmp_path, *servers, "--together", concurrency=[1], samples=3, probes=sums()[:3]
    )
    assert code == 0, output
    spans = {}
    for name in ("old", "new"):
        lines = (tmp_path / "cmp" / name / "records.jsonl").read_text().splitlines()
        sends = [json.loads(line)["t_send"] for line in lines]
        spans[name] = (min(sends), max(sends))
    # Both ran at once: each started before the other ended.
    assert spans["old"][0] < spans["new"][1] and spans["new"][0] < spans["old"][1]
    assert "--together" in " ".join(_doc(tmp_path)["notes"])


def test_the_html_page_marks_where_each_parted_item_leaves_the_reference(tmp_path, servers):
    old, new = servers
    new.behaviour.answer_for = lambda p, o: right(p, 1).replace("answer", "<b>sum</b>")
    code, output = _compare(tmp_path, old, new, concurrency=[1], samples=2, probes=sums()[:2])
    assert code == 0, output  # reworded and still right: no graded item turned bad
    page = (tmp_path / "cmp" / "compare.html").read_text()
    # Escaped, and marked from the first char that differs ("The " is shared).
    assert "<pre>The <mark>answer is 2.</mark></pre>" in page
    assert "<pre>The <mark>&lt;b&gt;sum&lt;/b&gt; is 2.</mark></pre>" in page
    code, again = run_cli("report", tmp_path / "cmp", "--format", "html")
    assert code == 0 and again.strip() == page.strip()


def test_a_model_named_for_one_target_is_sent_to_it_alone(tmp_path, servers):
    code, output = _compare(
        tmp_path, *servers, "--model", "new=other-model", concurrency=[1], samples=1,
        probes=sums()[:1],
    )  # fmt: skip
    assert code == 0, output
    sent = {
        name: json.loads((tmp_path / "cmp" / name / "run.json").read_text())["target"]["model"]
        for name in ("old", "new")
    }
    assert sent == {"old": "fake", "new": "other-model"}


def test_goodput_under_the_slo_is_given_per_target_where_one_is_set(tmp_path, servers):
    old, new = servers
    old.behaviour.latency, new.behaviour.latency = 0.01, 0.2
    code, output = _compare(
        tmp_path, old, new, concurrency=[1], samples=3, probes=sums()[:2], slo={"e2e_ms": 100}
    )
    assert code == 0, output
    (level,) = _doc(tmp_path)["candidates"][0]["levels"]
    assert level["reference_load"]["goodput"] > 0 and level["candidate_load"]["goodput"] == 0


def test_a_saved_reference_runs_python_graders_are_imported_only_when_trusted(
    tmp_path, monkeypatch, servers
):
    from tests.compare.test_graded import _python_graded_run

    old, new = servers
    monkeypatch.chdir(tmp_path)
    saved = _python_graded_run(tmp_path, old, "kevload_test_compare_saved")
    new.behaviour.answer_for = old.behaviour.answer_for
    args = ["compare", "suite/s.toml", "--reference-run", saved, "--url", f"new={new.url}"]
    code, output = run_cli(*args, "--out", "refused")
    assert code == 2 and "--trust-graders" in output, output
    assert not (tmp_path / "refused" / "new").exists()  # refused before anything was sent
    code, output = run_cli(*args, "--out", "trusted", "--trust-graders")
    assert code == 0, output
    (level,) = json.loads((tmp_path / "trusted" / "compare.json").read_text())["candidates"][0][
        "levels"
    ]
    assert level["graded"] == level["items"] > 0 and level["accuracy_reference"] == 1.0


@pytest.mark.parametrize("name", ["compare.json", "compare-run.json", "gate.json", "Compare.md"])
def test_a_target_named_like_one_of_the_comparisons_files_gets_a_directory_of_its_own(
    tmp_path, servers, name
):
    old, new = servers
    path = write_scenario(tmp_path / "s.toml", old.url, probes=sums()[:2], concurrency=[1])
    code, output = run_cli(
        "compare", path, "--url", f"{name}={old.url}", "--url", f"new={new.url}",
        "--out", tmp_path / "cmp",
    )  # fmt: skip
    assert code == 0, output
    assert _doc(tmp_path)["reference"] == name
    manifest = json.loads((tmp_path / "cmp" / "compare-run.json").read_text())
    (run_dir,) = [t["run_dir"] for t in manifest["targets"] if t["name"] == name]
    assert run_dir.startswith(f"{name}-") and (tmp_path / "cmp" / run_dir / "run.json").is_file()


def test_a_comparison_against_a_saved_run_resumes_with_its_own_scenario(
    tmp_path, monkeypatch, servers
):
    from tests.compare.test_graded import _python_graded_run, sum_probes

    old, new = servers
    monkeypatch.chdir(tmp_path)
    # The saved run grades by a python grader; the comparison's own scenario by `expected`.
    saved = _python_graded_run(tmp_path, old, "kevload_test_compare_resumed")
    new.behaviour.answer_for = old.behaviour.answer_for
    probes = [{k: v for k, v in p.items() if k != "grade"} for p in sum_probes()]
    write_scenario(tmp_path / "own.toml", new.url, probes=probes, samples=2, concurrency=[1])
    args = ["--reference-run", saved, "--url", f"new={new.url}", "--trust-graders"]
    code, output = run_cli("compare", "own.toml", *args, "--out", "cmp")
    assert code == 0, output
    code, output = run_cli("compare", "--resume", "cmp", "--trust-graders")
    assert code == 0, output
    # Without --trust-graders the saved run's grader is refused, and never imported to be refused.
    sys.modules.pop("kevload_test_compare_resumed", None)
    code, output = run_cli("compare", "--resume", "cmp")
    assert code == 2 and "--trust-graders" in output, output
    assert "kevload_test_compare_resumed" not in sys.modules


def test_a_saved_reference_run_that_was_asked_otherwise_is_refused(tmp_path, servers):
    old, new = servers
    # The same ids, other questions: sum0 asks 0+5 in the saved run and 0+2 in the scenario.
    other = [{**p, "prompt": p["prompt"].replace("+2", "+5")} for p in sums()[:4]]
    saved = write_scenario(tmp_path / "saved.toml", old.url, probes=other, concurrency=[1])
    assert run_cli("run", saved, "--out", tmp_path / "saved", "--quiet")[0] == 0
    path = write_scenario(tmp_path / "s.toml", old.url, probes=sums()[:4], concurrency=[1])
    code, output = run_cli(
        "compare", path, "--reference-run", tmp_path / "saved", "--url", f"new={new.url}",
        "--out", tmp_path / "cmp",
    )  # fmt: skip
    assert code == 2 and "probe 'sum0' was asked otherwise" in output, output
    assert not (tmp_path / "cmp").exists()


def test_the_table_fits_80_columns_where_names_and_answers_are_wide_characters(tmp_path, servers):
    from rich.cells import cell_len

    old, new = servers
    old.behaviour.answer_for = lambda p, o: "答案是" * 30
    new.behaviour.answer_for = lambda p, o: "答案不是" * 30
    probes = [{"id": "问题" * 20, "prompt": "一加一等于几？"}]
    path = write_scenario(tmp_path / "s.toml", old.url, probes=probes, concurrency=[1], samples=2)
    code, output = run_cli(
        "compare", path, "--url", f"{'旧服务器' * 10}={old.url}",
        "--url", f"{'新服务器' * 10}={new.url}", "--out", tmp_path / "cmp",
    )  # fmt: skip
    assert code == 1, output
    # The table, from its first line to the gate's: a loaded machine's warnings on stderr (a
    # /metrics poll unanswered) are kevload's log, not the table.
    lines = output.splitlines()
    lines = lines[lines.index(next(x for x in lines if x.startswith("reference: "))) :]
    lines = lines[: lines.index(next(x for x in lines if x.startswith("gate: exit"))) + 1]
    assert all(cell_len(line) <= 80 for line in lines), [x for x in lines if cell_len(x) > 80]
    row = next(line for line in lines if line.startswith("新服务器"))
    assert cell_len(row[: row.index(" c=1")]) == 13  # the name's column, as wide as the header's


@pytest.mark.parametrize("cache_reset", ["marker", "auto"])
def test_a_prefix_cache_scenario_whose_cold_samples_may_be_marked_is_refused(
    tmp_path, servers, cache_reset
):
    # A marker opens each probe with its run's id: two identical servers would be asked two
    # different inputs and read as answering differently.
    old, new = servers
    code, output = _compare(
        tmp_path,
        old,
        new,
        concurrency=[1],
        samples=2,
        prefix_cache="cold_warm",
        cache_reset=cache_reset,
    )
    assert code == 2 and "load.cache_reset" in output, output
    assert not (tmp_path / "cmp").exists()
