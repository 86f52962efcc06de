"""Graded answers against servers whose truth is known: flips good→bad and bad→good counted exactly,
drift whose answers stay good told apart from answers load made bad, accuracy per level with the
exact McNemar test, the gates (--fail-on bad, load.min_good_share), a grader that raises, and every
graded figure recomputed by `kevload report`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from kevload.compare.graded import accuracy
from kevload.compare.stats import mcnemar_exact
from kevload.outputs.terminal import render
from kevload.records.summary import CellSummary, RunSummary
from tests.conftest import load_summary, run_cli, write_scenario

SUMS = [(a, 3) for a in range(6)]  # probes s0 … s5: "What is a + 3?"
WRONG_UNDER_LOAD = {
    "s0",
    "s2",
    "s4",
}  # a even: the crafted server adds one when others are in flight


def sums_server(prompt: str, overlap: int) -> str:
    """Right serially, in a sentence; under load (another request at the server) the bare number,
    one too many for an even a: the known subset load makes wrong."""
    a, b = map(int, re.findall(r"\d+", prompt))
    if overlap < 2:
        return f"The sum is {a + b}."
    return str(a + b + (a % 2 == 0))


def sum_probes(**extra) -> list[dict]:
    return [
        {"id": f"s{a}", "prompt": f"What is {a} + {b}?", "expected": a + b, **extra}
        for a, b in SUMS
    ]


def _run(
    tmp_path: Path, server, answer, *args, out: str = "run", samples: int = 4, **load
) -> tuple[int, str, dict]:
    server.behaviour.latency = 0.1  # every counted c=4 sample meets others at the server
    server.behaviour.answer_for = answer
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        probes=load.pop("probes", sum_probes()),
        samples=samples,
        **load,
    )
    code, output = run_cli("run", path, "--out", tmp_path / out, "--quiet", *args)
    return code, output, load_summary(tmp_path / out)


def test_server_wrong_under_load_for_a_known_subset_gives_the_exact_flips(tmp_path, server):
    code, out, summary = _run(tmp_path, server, sums_server)
    cells = {(c["probe"], c["concurrency"]): c for c in summary["cells"]}
    for a, _ in SUMS:
        serial, loaded = cells[(f"s{a}", 1)], cells[(f"s{a}", 4)]
        assert (serial["graded_good"], serial["graded_bad"], serial["serial_grade"]) == (
            4,
            0,
            "good",
        )
        assert (
            serial["flips_good_to_bad"] is None
        )  # the serial cell is the reference, not compared with itself
        wrong = f"s{a}" in WRONG_UNDER_LOAD
        assert (loaded["graded_good"], loaded["graded_bad"]) == ((0, 4) if wrong else (4, 0))
        assert (loaded["flips_good_to_bad"], loaded["flips_bad_to_good"]) == (
            (4, 0) if wrong else (0, 0)
        )
        if wrong:
            assert (
                loaded["flip_answer"] == str(a + 4)
                and loaded["flip_serial_answer"] == f"The sum is {a + 3}."
            )
    assert sorted(summary["bad_cells"]) == sorted(f"{p}@single/c=4" for p in WRONG_UNDER_LOAD)
    serial_level, loaded_level = summary["accuracy"]
    assert serial_level | {"ci95": None} == {
        "mode": "single",
        "concurrency": 1,
        "n": 6,
        "good": 6,
        "accuracy": 1.0,
        "ci95": None,
        "paired": None,
        "good_to_bad": None,
        "bad_to_good": None,
        "mcnemar_p": None,
        "fell": False,
    }
    assert (loaded_level["n"], loaded_level["good"], loaded_level["accuracy"]) == (6, 3, 0.5)
    assert (loaded_level["good_to_bad"], loaded_level["bad_to_good"], loaded_level["paired"]) == (
        3,
        0,
        6,
    )
    assert (
        loaded_level["mcnemar_p"] == 0.25 and loaded_level["fell"] is False
    )  # 3 of 6 probes: not significant
    assert loaded_level["ci95"] == pytest.approx([0.187616, 0.812384])
    assert code == 1  # drift, as always without --fail-on bad
    assert (
        run_cli(
            "run", tmp_path / "s.toml", "--out", tmp_path / "run2", "--quiet", "--fail-on", "bad"
        )[0]
        == 1
    )


def test_wording_that_changes_under_load_while_the_answer_stays_right_is_drift_with_no_flip(
    tmp_path, server
):
    def reworded(prompt: str, overlap: int) -> str:
        a, b = map(int, re.findall(r"\d+", prompt))
        return f"The sum is {a + b}." if overlap < 2 else f"{a} plus {b} makes {a + b}"

    code, out, summary = _run(tmp_path, server, reworded)
    assert code == 1 and summary["drift_cells"]  # the text drifted …
    loaded = [c for c in summary["cells"] if c["concurrency"] == 4]
    assert all(
        c["drift"] and c["graded_bad"] == 0 and c["flips_good_to_bad"] == 0 for c in loaded
    )  # … no answer
    assert summary["bad_cells"] == [] and summary["accuracy"][1]["good_to_bad"] == 0
    code, out, _ = _run(tmp_path, server, reworded, "--fail-on", "bad", out="again")
    assert code == 0, out
    text = _table(RunSummary.from_json(summary))
    assert "s0 (single) c=4: drift, every answer still good (4 good, 0 bad)" in text
    assert "1 all≠serial ✓" in text


def test_a_server_wrong_serially_and_right_under_load_flips_bad_to_good(tmp_path, server):
    def better_under_load(prompt: str, overlap: int) -> str:
        a, b = map(int, re.findall(r"\d+", prompt))
        return str(a + b + (overlap < 2 and a < 2))  # s0, s1 wrong serially only

    code, _, summary = _run(tmp_path, server, better_under_load, "--fail-on", "bad")
    flips = {
        c["probe"]: (c["flips_good_to_bad"], c["flips_bad_to_good"])
        for c in summary["cells"]
        if c["concurrency"] == 4
    }
    assert flips == {
        "s0": (0, 4),
        "s1": (0, 4),
        "s2": (0, 0),
        "s3": (0, 0),
        "s4": (0, 0),
        "s5": (0, 0),
    }
    assert summary["accuracy"][1]["bad_to_good"] == 2 and summary["accuracy"][1]["good_to_bad"] == 0
    assert code == 0  # answers got better: no failure under --fail-on bad


def test_fail_on_bad_cannot_judge_a_probe_with_mixed_serial_answers_and_min_good_share_gates_it(
    tmp_path, server
):
    """docs/graded.md: no flip is counted against a mixed serial cell, so --fail-on bad passes a
    probe gone from 2 good of 4 serially to 0 of 4 under load; load.min_good_share fails it."""
    import itertools

    turns = itertools.count()

    def mixed_then_wrong(prompt: str, overlap: int) -> str:
        return ("42" if next(turns) % 2 == 0 else "43") if overlap < 2 else "43"

    probes = [{"id": "m", "prompt": "What is 40 + 2?", "expected": 42}]
    code, out, summary = _run(
        tmp_path, server, mixed_then_wrong, "--fail-on", "bad", probes=probes, out="bad"
    )
    cells = {c["concurrency"]: c for c in summary["cells"]}
    assert (cells[1]["graded_good"], cells[1]["graded_bad"], cells[1]["serial_grade"]) == (
        2,
        2,
        "mixed",
    )
    assert (cells[4]["graded_good"], cells[4]["graded_bad"], cells[4]["flips_good_to_bad"]) == (
        0,
        4,
        None,
    )
    assert code == 0, out
    code, out, _ = _run(
        tmp_path,
        server,
        mixed_then_wrong,
        "--fail-on",
        "bad",
        probes=probes,
        out="share",
        min_good_share=0.4,
    )
    assert code == 1 and "min_good_share" in out, out


def test_min_good_share_gates_a_cell_whose_answers_are_too_often_bad(tmp_path, server):
    code, _, summary = _run(
        tmp_path, server, sums_server, min_good_share=0.75, concurrency=[1], out="serial"
    )
    assert code == 0 and summary["good_share_failed_cells"] == []
    code, _, summary = _run(tmp_path, server, sums_server, min_good_share=0.75, out="loaded")
    assert code == 1
    assert sorted(summary["good_share_failed_cells"]) == sorted(
        f"{p}@single/c=4" for p in WRONG_UNDER_LOAD
    )


def test_a_grader_that_raises_is_named_with_its_probe_exits_2_and_report_grades_again_once_fixed(
    tmp_path, server
):
    graders = tmp_path / "kevload_test_graders_raise.py"
    graders.write_text("def check(answer, probe, expected):\n    return int(answer) == expected\n")
    probes = sum_probes(grade="python:kevload_test_graders_raise:check")
    code, out, summary = _run(tmp_path, server, sums_server, probes=probes)
    assert code == 2
    assert summary["grade_errors"] and summary["grade_errors"][0].startswith(
        "probe 's0': python:kevload_test_graders_raise:check raised ValueError: "
    )
    serial = next(c for c in summary["cells"] if c["probe"] == "s0" and c["concurrency"] == 1)
    assert (serial["graded_good"], serial["graded_bad"], serial["grade_failed"]) == (0, 0, 4)
    assert "Traceback" not in out
    # The records stay: a fixed grader grades them again, without the server. (A new name: the
    # module is cached.)
    graders.write_text(
        "def check(answer, probe, expected):\n    return answer.split()[-1].rstrip('.') == "
        "str(int(expected))\n"
    )
    import sys

    sys.modules.pop("kevload_test_graders_raise", None)
    code, out = run_cli("report", tmp_path / "run", "--format", "json", "--trust-graders")
    fixed = json.loads(out)
    assert code == 1 and not fixed["grade_errors"]
    assert fixed["accuracy"][1]["good_to_bad"] == 3


GRADER = (
    "def check(answer, probe, expected):\n"
    "    return answer.split()[-1].rstrip('.') == str(int(expected))\n"
)


def _python_graded_run(tmp_path: Path, server, module: str, *, dataset: bool = False) -> Path:
    """A run started from ``tmp_path`` of ``suite/s.toml`` (a relative path), its probes graded by
    ``python:MODULE:check`` written beside the scenario, or beside its dataset
    ``suite/data/items.jsonl``; the module is then forgotten, as by a new process."""
    import sys

    suite = tmp_path / "suite"
    grader_dir = suite / "data" if dataset else suite
    grader_dir.mkdir(parents=True)
    (grader_dir / f"{module}.py").write_text(GRADER)
    server.behaviour.answer_for = sums_server
    probes = sum_probes(grade=f"python:{module}:check")
    if dataset:
        (grader_dir / "items.jsonl").write_text("".join(json.dumps(p) + "\n" for p in probes))
        probes = [{"dataset": "data/items.jsonl"}]
    write_scenario(suite / "s.toml", server.url, probes=probes, samples=2, concurrency=[1])
    code, output = run_cli("run", "suite/s.toml", "--out", "run", "--quiet")
    assert code == 0, output
    sys.modules.pop(module, None)
    return tmp_path / "run"


@pytest.mark.parametrize(
    "dataset", [False, True], ids=["beside-the-scenario", "beside-the-dataset"]
)
def test_report_with_trust_graders_finds_a_python_grader_where_the_run_found_it_from_any_directory(
    tmp_path, server, monkeypatch, dataset
):
    monkeypatch.chdir(tmp_path)
    module = f"kevload_test_home_{'dataset' if dataset else 'scenario'}"
    run = _python_graded_run(tmp_path, server, module, dataset=dataset)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out = run_cli("report", run, "--format", "json", "--trust-graders")
    assert code == 0, out
    assert (
        json.loads(out)["accuracy"][0]["good"]
        == len(SUMS)
        == load_summary(run)["accuracy"][0]["good"]
    )


def test_report_imports_no_code_a_run_directory_names_without_trust_graders(
    tmp_path, server, monkeypatch
):
    """A run directory is data (a CI artifact, a colleague's upload): one whose run.json names a
    module in the run directory itself, with no scenario to find it from, must not get it imported
    by `kevload report`."""
    import sys

    monkeypatch.chdir(tmp_path)
    run = _python_graded_run(tmp_path, server, "kevload_test_honest")
    marker = tmp_path / "imported"
    (run / "kevload_test_planted.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "def check(answer, probe, expected):\n    return True\n"
    )
    meta = json.loads((run / "run.json").read_text())
    meta.pop("scenario_source")
    meta["grading"] = {
        p: {"grade": "python:kevload_test_planted:check", "expected": None, "tolerance": 0}
        for p in meta["grading"]
    }
    (run / "run.json").write_text(json.dumps(meta))
    code, out = run_cli("report", run)
    assert code == 2 and "--trust-graders" in out and "Traceback" not in out
    code, out = run_cli(
        "report", run, "--trust-graders"
    )  # nor from the run directory when trusted: never there
    assert code == 2 and "No module named 'kevload_test_planted'" in out
    assert not marker.exists() and "kevload_test_planted" not in sys.modules
    code, out = run_cli("run", "--resume", run)  # resuming it would import it too
    assert code == 2 and "--trust-graders" in out and not marker.exists()


def test_report_recomputes_every_graded_figure_the_run_wrote(tmp_path, server):
    _, _, summary = _run(tmp_path, server, sums_server)
    code, out = run_cli("report", tmp_path / "run", "--format", "json")
    again = json.loads(out)
    graded = (
        "graded_good",
        "graded_bad",
        "grade_failed",
        "good_share",
        "good_share_ci95",
        "serial_grade",
        "flips_good_to_bad",
        "flips_bad_to_good",
        "flip_answer",
        "flip_serial_answer",
    )
    assert [{k: c.get(k) for k in graded} for c in again["cells"]] == [
        {k: c.get(k) for k in graded} for c in summary["cells"]
    ]
    for key in (
        "accuracy",
        "bad_cells",
        "accuracy_fell_levels",
        "good_share_failed_cells",
        "grade_errors",
    ):
        assert again[key] == summary[key], key


def test_resume_mid_dataset_grades_no_answer_twice(tmp_path, server):
    data = tmp_path / "sums.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": f"s{a}", "prompt": f"What is {a} + {b}?", "expected": a + b}) + "\n"
            for a, b in SUMS
        )
    )
    code, _, whole = _run(tmp_path, server, sums_server, probes=[{"dataset": "sums.jsonl"}])
    records = tmp_path / "run" / "records.jsonl"
    lines = records.read_text().splitlines(keepends=True)
    records.write_text("".join(lines[: len(lines) // 2]))  # killed halfway through the dataset
    code, out = run_cli("run", "--resume", tmp_path / "run", "--quiet")
    resumed = load_summary(tmp_path / "run")
    assert code == 1, out
    for before, after in zip(whole["cells"], resumed["cells"], strict=True):
        assert (
            after["graded_good"] + after["graded_bad"] == after["ok"] == 4
        )  # each sample graded once
        assert (after["graded_good"], after["graded_bad"], after["flips_good_to_bad"]) == (
            before["graded_good"],
            before["graded_bad"],
            before["flips_good_to_bad"],
        )
    assert resumed["accuracy"] == whole["accuracy"]


def test_fail_on_bad_needs_graded_probes(tmp_path, server):
    path = write_scenario(tmp_path / "s.toml", server.url)
    code, out = run_cli("run", path, "--fail-on", "bad")
    assert (
        code == 2
        and "--fail-on bad: expected probes with expected or grade" in out
        and server.requests == []
    )


@pytest.mark.parametrize(
    ("to_bad", "to_good", "p"),
    [
        (0, 0, 1.0),
        (1, 3, 0.625),
        (0, 5, 0.0625),
        (0, 6, 0.03125),
        (10, 2, 0.03857421875),
        (3, 3, 1.0),
        (25, 0, 2 / 2**25),
    ],
)
def test_exact_mcnemar_against_known_values(to_bad, to_good, p):
    # Two-sided binomial test of the discordant pairs (R: binom.test(min, n)$p.value).
    assert mcnemar_exact(to_bad, to_good) == pytest.approx(p)
    assert mcnemar_exact(to_good, to_bad) == pytest.approx(p)


def _cell(probe: str, concurrency: int, good: int, bad: int, **extra) -> CellSummary:
    return CellSummary(
        probe=probe,
        role="probe",
        mode="single",
        concurrency=concurrency,
        reference_level="c=1",
        ok=good + bad,
        graded_good=good,
        graded_bad=bad,
        grade_failed=0,
        **extra,
    )


def test_accuracy_pairs_probes_and_a_probe_with_one_bad_answer_is_bad():
    cells = [
        _cell("a", 1, 4, 0),
        _cell("a", 8, 3, 1),  # good → bad (one bad answer of four)
        _cell("b", 1, 2, 2),
        _cell("b", 8, 4, 0),  # mixed serially (bad) → good
        _cell("c", 1, 0, 4),
        _cell("c", 8, 0, 4),  # bad, stays bad
        _cell("d", 1, 4, 0),
    ]  # no loaded cell: unpaired
    serial, loaded = accuracy(cells)
    assert (serial["n"], serial["good"], serial["mcnemar_p"]) == (4, 2, None)
    assert (
        loaded["n"],
        loaded["good"],
        loaded["paired"],
        loaded["good_to_bad"],
        loaded["bad_to_good"],
    ) == (3, 1, 3, 1, 1)
    assert loaded["mcnemar_p"] == 1.0 and not loaded["fell"]


def test_accuracy_falls_significantly_with_many_probes_turned_bad():
    cells = [
        c
        for i in range(30)
        for c in (_cell(f"p{i}", 1, 1, 0), _cell(f"p{i}", 4, 0 if i < 8 else 1, 1 if i < 8 else 0))
    ]
    loaded = accuracy(cells)[1]
    assert (loaded["good_to_bad"], loaded["bad_to_good"]) == (8, 0)
    assert loaded["mcnemar_p"] == pytest.approx(2 / 2**8) and loaded["fell"]


def _table(summary: RunSummary) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    render(summary, "table", console)
    return console.export_text()


def test_a_graded_dataset_of_many_probes_prints_the_accuracy_table_not_the_matrix():
    cells = tuple(
        c
        for i in range(30)
        for c in (
            _cell(f"p{i}", 1, 1, 0, serial_grade="good"),
            _cell(f"p{i}", 4, 1, 0, serial_grade="good", flips_good_to_bad=0, flips_bad_to_good=0),
        )
    )
    summary = RunSummary(
        verdict="deterministic",
        cells=cells,
        accuracy=tuple(accuracy(cells)),
        bad_cells=(),
        accuracy_fell_levels=(),
        good_share_failed_cells=(),
        grade_errors=(),
    )
    text = _table(summary)
    assert "graded answers per level" in text and "single/c=4" in text
    assert re.search(r"30/30 +100\.0%", text)
    assert "distinct outputs per probe × level" not in text and "p17 (single)" not in text
    few = RunSummary(
        verdict="deterministic",
        cells=cells[:4],
        accuracy=tuple(accuracy(cells[:4])),
        bad_cells=(),
        accuracy_fell_levels=(),
        good_share_failed_cells=(),
        grade_errors=(),
    )
    assert "distinct outputs per probe × level" in _table(
        few
    ) and "graded answers per level" in _table(few)


def test_the_shipped_graded_set_is_what_its_seed_makes_and_every_item_grades_its_own_answer_good():
    from kevload.inputs.gradedset import items, jsonl
    from kevload.inputs.grading import checked
    from kevload.inputs.scenario import load_scenario

    scenarios = Path(__file__).resolve().parents[2] / "scenarios"
    assert (scenarios / "graded.jsonl").read_bytes() == jsonl()  # `make graded-set` is up to date
    probes = load_scenario(scenarios / "graded.toml").probes
    assert len(probes) == 50 and all(p.grade for p in probes)
    assert {p.id.split("-")[1] for p in probes} == {"en", "zh"}
    for item in items():
        grading = checked(item["expected"], item["grade"], None, scenarios)
        right = json.dumps(item["expected"]) if item["grade"] == "json" else str(item["expected"])
        assert grading.good(right, item["id"]), item
        assert not grading.good("I do not know.", item["id"]), item


def test_openmetrics_carry_the_graded_figures(tmp_path, server):
    from prometheus_client.parser import text_string_to_metric_families

    from kevload.outputs.metrics import metrics_text

    _, _, summary = _run(tmp_path, server, sums_server)
    text = metrics_text(RunSummary.from_json(summary), {})
    values = {
        (s.name, s.labels.get("probe"), s.labels.get("level")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert values[("kevload_cell_flips_good_to_bad_samples", "s0", "c=4")] == 4
    assert values[("kevload_cell_graded_good_samples", "s1", "c=4")] == 4
    assert values[("kevload_level_accuracy_ratio", None, "single/c=4")] == 0.5
    assert values[("kevload_level_good_to_bad_probes", None, "single/c=4")] == 3
    assert values[("kevload_level_mcnemar_p", None, "single/c=4")] == 0.25
    assert (
        "kevload_level_mcnemar_p",
        None,
        "single/c=1",
    ) not in values  # serial: no test against itself


def test_a_baseline_keeps_the_graded_gates_a_grader_that_raises_and_min_good_share(
    tmp_path, server
):
    # A baseline takes away only the drift it had too: what the run's own gates say about its
    # answers stays.
    graders = tmp_path / "kevload_test_graders_baseline.py"
    graders.write_text("def check(answer, probe, expected):\n    return int(answer) == expected\n")
    probes = sum_probes(grade="python:kevload_test_graders_baseline:check")
    assert _run(tmp_path, server, sums_server, probes=probes, concurrency=[1], out="raised")[0] == 2
    code, out, _ = _run(
        tmp_path,
        server,
        sums_server,
        "--baseline",
        tmp_path / "raised",
        probes=probes,
        concurrency=[1],
        out="raised-again",
    )
    assert code == 2, (
        out
    )  # before: 0 ("0 regression(s)"), although every answer of the run went ungraded
    assert _run(tmp_path, server, sums_server, min_good_share=0.75, out="loaded")[0] == 1
    code, out, summary = _run(
        tmp_path,
        server,
        sums_server,
        "--baseline",
        tmp_path / "loaded",
        min_good_share=0.75,
        out="loaded-again",
    )
    assert summary["good_share_failed_cells"] and "0 regression(s)" in out
    assert code == 1, (
        out
    )  # before: 0, the cells under load.min_good_share passed as the SLO's never do


def _junit_cases(xml: str) -> tuple[dict, dict]:
    import xmlschema

    schema = xmlschema.XMLSchema(Path(__file__).parents[1] / "data" / "junit.xsd")
    schema.validate(xml)
    doc = schema.to_dict(xml)
    return doc, {(c["@classname"], c["@name"]): c for c in doc["testsuite"][0]["testcase"]}


def test_junit_under_fail_on_bad_passes_drift_whose_answers_stay_good_and_fails_answers_turned_bad(
    tmp_path, server
):
    from kevload.outputs.junit import junit_xml

    def reworded_or_wrong(
        prompt: str, overlap: int
    ) -> str:  # s0 turns wrong under load, the rest only reworded
        a, b = map(int, re.findall(r"\d+", prompt))
        return f"The sum is {a + b}." if overlap < 2 else f"{a} plus {b} makes {a + b + (a == 0)}"

    _, _, summary = _run(tmp_path, server, reworded_or_wrong)
    summary = RunSummary.from_json(summary)
    doc, cases = _junit_cases(junit_xml(summary, fail_on="bad"))
    assert doc["@failures"] == 1 and doc["@tests"] == 12 + 2  # probe cells, then one case per level
    failure = cases[("kevload.s0.single", "c=4")]["failure"][0]
    assert (
        failure["@type"] == "bad_answers" and failure["@message"] == "4 answers good→bad under load"
    )
    assert (
        "graded 0 good, 4 bad" in failure["$"]
        and "against serial (all good): 4 good→bad, 0 bad→good" in failure["$"]
        and "e.g. '0 plus 3 makes 4' where serial answered 'The sum is 3.'" in failure["$"]
    )
    stayed = cases[("kevload.s1.single", "c=4")]
    assert "failure" not in stayed
    assert "no answer turned bad by load" in stayed["system-out"][0]
    assert (
        "graded 4 good, 0 bad, good share 100.0% [51.0%, 100.0%]; against serial (all good): 0 "
        "good→bad" in stayed["system-out"][0]
    )
    assert (
        "the serial reference (answers good)"
        in cases[("kevload.s1.single", "c=1")]["system-out"][0]
    )
    loaded = cases[("kevload.accuracy.single", "c=4")]
    assert "failure" not in loaded  # 1 of 6 probes: not significant
    assert loaded["system-out"][0] == (
        "single/c=4: accuracy 83.3% [43.6%, 97.0%] (5 of 6 probes good); against "
        "serial over 6 paired probes: 1 good→bad, 0 bad→good, McNemar p 1"
    )
    # Without --fail-on bad every drifted cell fails, the graded figures said inside.
    doc, cases = _junit_cases(junit_xml(summary))
    assert doc["@failures"] == 6
    assert cases[("kevload.s1.single", "c=4")]["failure"][0]["@type"] == "nondeterminism"
    assert "0 good→bad" in cases[("kevload.s1.single", "c=4")]["failure"][0]["$"]


def test_junit_fails_a_level_whose_accuracy_fell_and_a_cell_under_min_good_share():
    from kevload.outputs.junit import junit_xml

    def serial(i: int) -> CellSummary:  # p29's serial answers are mixed: 3 good, 1 bad
        good, bad = (3, 1) if i == 29 else (4, 0)
        return _cell(
            f"p{i}",
            1,
            good,
            bad,
            serial_grade="mixed" if bad else "good",
            good_share=good / 4,
            good_share_ci95=[0.3, 1.0],
            distinct=1 + bad,
            drift_rate_upper_95=0.5,
        )

    def loaded(i: int) -> CellSummary:  # p0 … p7 turned bad under load
        turned = i < 8
        return _cell(
            f"p{i}",
            4,
            0 if turned else 4,
            4 if turned else 0,
            serial_grade="mixed" if i == 29 else "good",
            good_share=0.0 if turned else 1.0,
            good_share_ci95=[0.0, 0.5] if turned else [0.5, 1.0],
            flips_good_to_bad=None if i == 29 else 4 if turned else 0,
            flips_bad_to_good=None if i == 29 else 0,
            drift=turned,
            distinct=1,
            drift_rate_upper_95=0.5,
            flip_answer="<b>wrong</b>\x1b" if turned else None,
            flip_serial_answer="right" if turned else None,
        )

    cells = tuple(c for i in range(30) for c in (serial(i), loaded(i)))
    summary = RunSummary(
        verdict="nondeterministic",
        cells=cells,
        accuracy=tuple(accuracy(cells)),
        bad_cells=tuple(f"p{i}@single/c=4" for i in range(8)),
        accuracy_fell_levels=("single/c=4",),
        min_good_share=0.8,
        good_share_failed_cells=("p0@single/c=4", "p29@single/c=1"),
        grade_errors=(),
    )
    doc, cases = _junit_cases(junit_xml(summary, fail_on="bad"))
    fell = cases[("kevload.accuracy.single", "c=4")]["failure"][0]
    assert fell["@type"] == "accuracy_fell"
    assert (
        f"8 good→bad, 1 bad→good, McNemar p {mcnemar_exact(8, 1):.3g} (fell significantly)"
        in fell["$"]
    )
    turned = cases[("kevload.p0.single", "c=4")]["failure"][0]
    assert (
        turned["@type"] == "bad_answers"
        and "under load.min_good_share 80.0%: good share 0.0%" in turned["$"]
    )
    assert (
        "e.g. '<b>wrong</b>\\u001b' where serial answered 'right'" in turned["$"]
    )  # the server's text, spelled
    gate = cases[("kevload.p29.single", "c=1")]["failure"][0]
    assert gate["@type"] == "good_share" and gate["@message"] == "good share 75.0% under 80.0%"
    assert "serial reference (answers mixed)" in gate["$"]
    assert (
        "serial answers mixed good and bad, so no flip is counted"
        in cases[("kevload.p29.single", "c=4")]["system-out"][0]
    )
    assert doc["@failures"] == 8 + 1 + 1  # the cells turned bad, the gate, the level


def test_the_html_report_shows_accuracy_per_level_and_each_cells_flips_with_server_text_escaped(
    tmp_path, server
):
    import html as markup

    def wrong_in_markup(
        prompt: str, overlap: int
    ) -> str:  # even a: wrong under load, in markup a page must not run
        a, b = map(int, re.findall(r"\d+", prompt))
        return f"The sum is {a + b}." if overlap < 2 or a % 2 else f"<script>x</script> {a + b + 1}"

    _run(tmp_path, server, wrong_in_markup)
    code, _ = run_cli("report", tmp_path / "run", "--format", "html", "-o", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert code == 1 and "<script>" not in page
    section = page[page.index("<h2>Good or bad: graded answers</h2>") :]
    levels = section[: section.index("</table>")]
    assert (
        "<td>single/c=4</td><td>6</td><td>3 good, 50.0% [18.8, "
        "81.2]</td><td>3</td><td>0</td><td>0.25</td>" in levels
    )
    row = re.search(
        r"<tr><td><span>s0</span> <span>\(single\) c=4</span></td>(.*?)</tr>", section
    ).group(1)
    assert row == (
        "<td>0</td><td>4</td><td>0.0% [0.0%, 49.0%]</td><td>good</td><td>4</td><td>0</td>"
        f"<td class=answer><pre>{markup.escape('<script>x</script> 4')}</pre></td>"
        "<td class=answer><pre>The sum is 3.</pre></td>"
    )
    assert re.search(
        r"<tr><td><span>s1</span> <span>\(single\) c=4</span></td><td>4</td><td>0</td>"
        r"<td>100.0% \[51.0%, 100.0%\]</td>"
        r"<td>good</td><td>0</td><td>0</td>",
        section,
    )


def _reworded(prompt: str, overlap: int, wrong: bool = False) -> str:
    """Right serially; under load reworded, and one too many for an even a when ``wrong``."""
    a, b = map(int, re.findall(r"\d+", prompt))
    return (
        f"The sum is {a + b}."
        if overlap < 2
        else f"{a} plus {b} makes {a + b + (wrong and a % 2 == 0)}"
    )


def test_baseline_reports_accuracy_lost_where_drift_it_already_had_turns_answers_bad(
    tmp_path, server
):
    # Last night c=4 drifted already, every answer right: the drift is no news, answers turned wrong
    # are.
    code, _, _ = _run(tmp_path, server, _reworded, out="last")
    assert code == 1
    code, out, _ = _run(
        tmp_path,
        server,
        lambda p, o: _reworded(p, o, wrong=True),
        "--baseline",
        tmp_path / "last",
        out="tonight",
    )
    regressions = [line for line in out.splitlines() if line.startswith("REGRESSION")]
    assert regressions == [
        "REGRESSION accuracy_lost single/c=4: accuracy 100.0% → 50.0% over 6 probes graded in "
        "both (6 → 3 good): 3 good→bad, 0 bad→good against the baseline, McNemar p 0.25"
    ], out
    assert code == 1
    # The other way round it is an improvement, and the run passes against its baseline.
    code, out, _ = _run(
        tmp_path, server, _reworded, "--baseline", tmp_path / "tonight", out="fixed"
    )
    assert (
        "improved accuracy_gained single/c=4: accuracy 50.0% → 100.0% over 6 probes graded in both "
        "(3 → 6 good):"
        " 0 good→bad, 3 bad→good" in out
    )
    assert code == 0 and "REGRESSION" not in out, out


def test_under_fail_on_bad_a_baseline_fails_new_drift_only_where_answers_turned_bad(
    tmp_path, server
):
    # Last night every level gave one answer. Tonight c=4 is reworded: new drift, every answer still
    # right — the gate "fail only when answers get worse" passes it, baseline or not; wrong answers
    # under load fail it.
    code, _, _ = _run(tmp_path, server, lambda p, o: _reworded(p, 0), out="last")
    assert code == 0
    code, out, _ = _run(
        tmp_path,
        server,
        _reworded,
        "--baseline",
        tmp_path / "last",
        "--fail-on",
        "bad",
        out="reworded",
    )
    assert code == 0 and "REGRESSION" not in out, out
    assert "note new_drift s0@single/c=4" in out  # said, not failed
    code, out, _ = _run(
        tmp_path, server, _reworded, "--baseline", tmp_path / "last", out="reworded-drift"
    )
    assert (
        code == 1 and "REGRESSION new_drift s0@single/c=4" in out
    )  # the default gate still fails drift
    code, out, _ = _run(
        tmp_path,
        server,
        lambda p, o: _reworded(p, o, wrong=True),
        "--baseline",
        tmp_path / "last",
        "--fail-on",
        "bad",
        out="wrong",
    )
    regressed = {
        line.split()[2].rstrip(":")
        for line in out.splitlines()
        if line.startswith("REGRESSION new_drift")
    }
    assert code == 1 and regressed == {f"s{a}@single/c=4" for a, _ in SUMS if a % 2 == 0}, out
