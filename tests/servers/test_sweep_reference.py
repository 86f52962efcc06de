"""``kevload sweep --reference AXIS=VALUE``: each setting's answers paired item by item with its
reference setting's, against a crafted server whose wrong answers are planted (tests.servers.
sumserver: ``--wrong N`` answers exactly the first N of the sums one too high)."""

from __future__ import annotations

import json
import re
import sys

from kevload.outputs.sweephtml import chart_points
from tests.conftest import run_cli, write_scenario

SUMS = 10
CMD = f"{sys.executable} -m tests.servers.sumserver --port {{port}} --wrong {{wrong}}"


def sums() -> list[dict]:
    return [{"id": f"sum{i}", "prompt": f"What is {i}+2?", "expected": i + 2} for i in range(SUMS)]


def _sweep(tmp_path, *args: str) -> tuple[int, str, dict]:
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", probes=sums(), concurrency=[1, 2], samples=2
    )
    out = tmp_path / "sweep"
    code, output = run_cli("sweep", scenario, "--server-cmd", CMD, "--out", out, *args)
    doc = json.loads((out / "sweep.json").read_text()) if (out / "sweep.json").is_file() else {}
    return code, output, doc


def test_items_made_wrong_are_counted_exactly_and_4_of_10_is_no_significant_loss(tmp_path):
    code, output, doc = _sweep(tmp_path, "--grid", "wrong=0,4", "--reference", "wrong=0")
    assert code == 0, output
    rows = {row["setting"]: row for row in doc["rows"]}
    against = rows["wrong=4"]["against_reference"]
    assert against["reference"] == "wrong=0"
    assert [lv["level"] for lv in against["levels"]] == ["c=1", "c=2"]
    for level in against["levels"]:
        assert level["items"] == SUMS and level["good_to_bad"] == 4 and level["bad_to_good"] == 0
        assert level["agreement"] == 0.6 and level["accuracy_reference"] == 1.0
        assert level["accuracy_candidate"] == 0.6 and level["latent"] == 0
        assert level["mcnemar_p"] == 0.125  # exact: 2 × 0.5⁴
        assert level["agreement_ci95"][0] < 0.6 < level["agreement_ci95"][1]
        assert level["latency_p50_ratio"] is not None
    assert rows["wrong=0"]["accuracy"] == {"c=1": 1.0, "c=2": 1.0}
    assert rows["wrong=4"]["accuracy"] == {"c=1": 0.6, "c=2": 0.6}
    # 4 good→bad against none is p 0.125: not significant at α 0.05, so the gate holds, as
    # compare's does (--fail-on bad fails it: the next tests).
    assert doc["reference"]["code"] == 0 and doc["reference"]["findings"] == []


def test_n_items_wrong_fail_by_mcnemar_and_the_terminal_table_fits_80_columns(tmp_path):
    code, output, doc = _sweep(tmp_path, "--grid", "wrong=0,8,10", "--reference", "wrong=0")
    assert code == 1, output
    rows = {row["setting"]: row for row in doc["rows"]}
    for name, wrong in (("wrong=8", 8), ("wrong=10", 10)):
        for level in rows[name]["against_reference"]["levels"]:
            assert (level["good_to_bad"], level["bad_to_good"]) == (wrong, 0)
            assert level["accuracy_candidate"] == (SUMS - wrong) / SUMS
    findings = doc["reference"]["findings"]
    # α 0.05 shared over 2 settings × 2 levels: 8 of 10 (p 0.0078) and 10 of 10 (p 0.002) both fail.
    assert doc["reference"]["alpha_per_test"] == 0.0125
    assert sum("wrong=8 single/" in f and "8 good→bad" in f for f in findings) == 2
    assert sum("wrong=10 single/" in f and "10 good→bad" in f for f in findings) == 2
    table = output[output.index("against the reference wrong=0") :]
    assert all(len(line) <= 80 for line in table.splitlines()), table
    assert re.search(r"^wrong=8 +c=1 +20% \(\d+–\d+\) +0 +100% → 20% +8/0 +0\.0078 ", table, re.M)
    assert "wrong=0 (reference): c=1 100% · c=2 100%" in table
    assert "\nagainst the reference: exit 1\n" in table
    md = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "| wrong=10 | wrong=0 | c=2 | 10 | 0% (0–28) | 0 | 100% → 0% | 10/0 |" in md


def test_fail_on_bad_fails_any_item_made_wrong(tmp_path):
    code, output, doc = _sweep(
        tmp_path, "--grid", "wrong=0,1", "--reference", "wrong=0", "--fail-on", "bad"
    )
    assert code == 1, output
    assert doc["reference"]["findings"] == [
        f"wrong=1 single/c={c}: answers made wrong: 1 good→bad (--fail-on bad)" for c in (1, 2)
    ]
    assert doc["reference"]["rules"] == {"alpha": 0.05, "min_agreement": None, "fail_on_bad": True}


def test_ungraded_items_fail_on_a_new_text_unless_min_agreement_allows_it(tmp_path):
    # The same sums without expected answers: one item's text changes, nothing says it is wrong.
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=2,
        probes=[{k: v for k, v in probe.items() if k != "expected"} for probe in sums()],
    )  # fmt: skip
    for extra, code_wanted in (((), 1), (("--min-agreement", "85%"), 0)):
        out = tmp_path / f"sweep{code_wanted}"
        code, output = run_cli(
            "sweep", scenario, "--server-cmd", CMD, "--grid", "wrong=0,1", "--out", out,
            "--reference", "wrong=0", *extra,
        )  # fmt: skip
        assert code == code_wanted, output
        doc = json.loads((out / "sweep.json").read_text())
        (level,) = doc["rows"][1]["against_reference"]["levels"]
        assert level["ungraded"] == SUMS and level["graded"] == 0 and level["new_texts"] == 2
        assert level["agreement"] == 0.9 and "accuracy" not in doc["rows"][1]
    assert "ungraded answers differ: 2 sample(s)" in doc_findings(tmp_path / "sweep1")


def doc_findings(out) -> str:
    return "\n".join(json.loads((out / "sweep.json").read_text())["reference"]["findings"])


def test_a_setting_identical_to_the_reference_holds(tmp_path):
    # Two settings of one server that answer alike: --latency is the axis, the answers never move.
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", probes=sums(), concurrency=[1, 2], samples=2
    )
    cmd = f"{sys.executable} -m tests.servers.sumserver --port {{port}} --latency {{lat}}"
    out = tmp_path / "sweep"
    code, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, "--grid", "lat=0.01,0.02", "--out", out,
        "--reference", "lat=0.02",
    )  # fmt: skip
    assert code == 0, output
    doc = json.loads((out / "sweep.json").read_text())
    (level1, level2) = doc["rows"][0]["against_reference"]["levels"]
    for level in (level1, level2):
        assert level["agreement"] == 1.0 and level["good_to_bad"] == level["bad_to_good"] == 0
        assert level["accuracy_reference"] == level["accuracy_candidate"] == 1.0
    assert doc["rows"][0]["against_reference"]["reference"] == "lat=0.02"
    assert doc["reference"] == {**doc["reference"], "findings": [], "code": 0}
    assert "against the reference: exit 0" in output


def test_an_unknown_reference_axis_or_value_is_named_and_nothing_starts(tmp_path):
    for spec, named in (
        ("slots=1", "--reference slots: not a --grid axis (axes: wrong)"),
        ("wrong=3", "--reference wrong=3: wrong is swept over 0, 4, not 3"),
        ("wrong", "--reference 'wrong': expected AXIS=VALUE"),
    ):
        code, output, doc = _sweep(tmp_path, "--grid", "wrong=0,4", "--reference", spec)
        assert code == 2 and named in output, output
        assert not doc and not list(tmp_path.glob("sweep/server-*.log"))
    code, output, _ = _sweep(tmp_path, "--grid", "wrong=0,4", "--fail-on", "bad")
    assert code == 2 and "only with --reference" in output


def test_an_axis_that_sets_the_levels_cannot_be_the_reference(tmp_path):
    code, output, _ = _sweep(
        tmp_path, "--grid", "wrong=0", "--grid", "load.mode=single,mixed",
        "--reference", "load.mode=single",
    )  # fmt: skip
    assert code == 2 and "--reference load.mode: this axis sets the levels" in output, output


def test_each_setting_is_held_against_the_reference_with_its_other_axes(tmp_path):
    code, output, doc = _sweep(
        tmp_path, "--grid", "wrong=0,8", "--grid", "load.stream=true,false",
        "--reference", "wrong=0",
    )  # fmt: skip
    assert code == 1, output
    refs = {r["setting"]: r["against_reference"]["reference"] for r in doc["rows"]}
    assert refs == {
        "wrong=0,load.stream=True": "wrong=0,load.stream=True",
        "wrong=0,load.stream=False": "wrong=0,load.stream=False",
        "wrong=8,load.stream=True": "wrong=0,load.stream=True",
        "wrong=8,load.stream=False": "wrong=0,load.stream=False",
    }
    assert doc["reference"]["alpha_per_test"] == 0.0125  # 2 settings compared × 2 levels
    # Names too long for the table's column stand whole on a line of their own, not cut alike.
    table = output[output.index("against the reference wrong=0") :]
    assert all(len(line) <= 80 for line in table.splitlines()), table
    assert re.search(
        r"^wrong=8,load\.stream=False against wrong=0,load\.stream=False:\n {15}c=1 +20% ",
        table,
        re.M,
    ), table


def test_the_sweep_page_shows_the_figures_and_the_price_of_holding(tmp_path):
    code, output, doc = _sweep(tmp_path, "--grid", "wrong=0,8", "--reference", "wrong=0")
    assert code == 1, output
    page_path = tmp_path / "sweep.html"
    assert run_cli("report", tmp_path / "sweep", "--format", "html", "-o", page_path)[0] == 0
    page = page_path.read_text()
    assert "<pre>" not in page  # the grid as a list, not raw JSON
    assert "<li>wrong = 0, 8 (server)</li>" in page
    assert "Against the reference wrong=0: exit 1</h2>" in page
    against = page.split("<table id=against>", 1)[1].split("</table>", 1)[0]
    assert (
        "<tr><td>wrong=8</td><td>wrong=0</td><td>c=1</td><td>10</td><td>20% (" in against
        and "<td>100% → 20%</td><td>8/0</td><td>0.0078</td>" in against
    )
    accuracy = page.split("<table id=accuracy>", 1)[1].split("</table>", 1)[0]
    assert "<td>wrong=0 (reference)</td><td>c=1 100%</td><td>c=2 100%</td>" in accuracy
    assert "<td>wrong=8</td><td>c=1 20%</td><td>c=2 20%</td>" in accuracy
    # The matrix cells say what sweep.md's do: distinct outputs, answers/s and p50.
    assert re.search(r"<td class=cell [^>]*>1 ≡ · [\d.]+/s · p50 \d+ ms</td>", page)
    # The chart: a dot per setting × level, the reference at full agreement, the other at 20 %.
    svg = re.search(r"<svg id=price .*?</svg>", page, re.S)
    assert svg is not None and "<script" not in page and "http" not in svg[0]
    points = {(s, lv): a for s, lv, a, _ in chart_points(doc)}
    assert points == {("wrong=0", "c=1"): 1.0, ("wrong=0", "c=2"): 1.0,
                      ("wrong=8", "c=1"): 0.2, ("wrong=8", "c=2"): 0.2}  # fmt: skip
    assert svg[0].count("<circle") == 4
    assert "<title>wrong=8 c=1: 20% agree, " in svg[0]


def test_a_reference_setting_whose_server_fails_pairs_nothing_and_the_sweep_exits_3(tmp_path):
    # --wrong x: the server's own argument parser refuses it, so that setting's server never starts.
    code, output, doc = _sweep(tmp_path, "--grid", "wrong=x,4", "--reference", "wrong=x")
    assert code == 3, output
    rows = {row["setting"]: row for row in doc["rows"]}
    assert rows["wrong=x"]["verdict"] == "target_failed"
    assert rows["wrong=4"]["against_reference"] == {"reference": "wrong=x", "levels": []}
    assert "accuracy" not in rows["wrong=4"] and doc["reference"]["findings"] == []


def test_report_of_an_edited_reference_in_sweep_json_exits_2_naming_the_key(tmp_path):
    code, output, doc = _sweep(tmp_path, "--grid", "wrong=0,4", "--reference", "wrong=0")
    assert code == 0, output
    path = tmp_path / "sweep" / "sweep.json"
    for edit, named in (
        (lambda d: d["rows"][1]["against_reference"]["levels"][0].pop("latent"), "`latent`"),
        (lambda d: d["rows"][1]["against_reference"].update(levels=3), "against_reference.levels"),
        (lambda d: d["reference"].update(findings=None), "$.reference.findings"),
        (lambda d: d["rows"][0].update(accuracy=[1]), "$.rows[0].accuracy"),
    ):
        edited = json.loads(json.dumps(doc))
        edit(edited)
        path.write_text(json.dumps(edited))
        for fmt in ("markdown", "html"):
            code, output = run_cli("report", tmp_path / "sweep", "--format", fmt)
            assert code == 2 and "not a kevload sweep.json" in output and named in output, output
