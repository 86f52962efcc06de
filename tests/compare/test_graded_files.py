"""A run directory (or a case file) names no file: a json_schema is graded from the schema run.json
keeps; a path put there is refused unread without --trust-graders, and no error quotes a file's text
(a CI artifact's run.json could name a local key file and print its start into the CI log)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli, write_scenario

SECRET = "SECRET-KEY-0123456789"
SCHEMA = {"type": "object", "required": ["name"]}


def _schema_run(tmp_path: Path, server) -> Path:
    """A run graded by a json_schema from a file beside the scenario (run.json keeps the schema
    itself)."""
    server.behaviour.answer_for = lambda prompt, overlap: '{"name": "x"}'
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    probes = [{"id": "p", "prompt": "JSON?", "grade": "json_schema", "expected": "schema.json"}]
    path = write_scenario(tmp_path / "s.toml", server.url, probes=probes, samples=2)
    code, out = run_cli("run", path, "--out", tmp_path / "run", "--quiet")
    assert code == 0, out
    return tmp_path / "run"


def _name_in_run_json(run: Path, expected: str) -> None:
    meta = json.loads((run / "run.json").read_text())
    meta["grading"]["p"]["expected"] = expected
    (run / "run.json").write_text(json.dumps(meta))


def test_run_json_keeps_the_schema_itself_and_report_grades_from_it_alone(tmp_path, server):
    run = _schema_run(tmp_path, server)
    assert json.loads((run / "run.json").read_text())["grading"]["p"]["expected"] == SCHEMA
    (tmp_path / "schema.json").unlink()
    code, out = run_cli("report", run, "--format", "json")
    assert code == 0 and json.loads(out)["cells"][0]["graded_good"] == 2


@pytest.mark.parametrize("where", ["absolute", "relative"])
def test_report_refuses_a_schema_path_in_run_json_unread_without_trust_graders(
    tmp_path, server, monkeypatch, where
):
    run = _schema_run(tmp_path, server)
    key = tmp_path / "key.json"
    key.write_text(json.dumps(SECRET))
    _name_in_run_json(run, str(key) if where == "absolute" else "../key.json")
    read: list[Path] = []
    original = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self) or original(self))
    code, out = run_cli("report", run)
    assert code == 2, out
    assert "grading.p.expected" in out and "--trust-graders" in out
    assert SECRET not in out and not any(p.name == "key.json" for p in read)


@pytest.mark.parametrize(
    "content",
    [json.dumps(SECRET), json.dumps({"type": SECRET}), json.dumps({"$ref": f"#/{SECRET}"})],
    ids=["no-object", "no-schema", "unresolved-reference"],
)
def test_no_error_quotes_the_text_of_a_schema_file_even_when_trusted(tmp_path, server, content):
    # Before: "got 'SECRET-KEY-…'" (the file's first 80 characters) in the error.
    run = _schema_run(tmp_path, server)
    (tmp_path / "key.json").write_text(content)
    _name_in_run_json(run, str(tmp_path / "key.json"))
    code, out = run_cli("report", run, "--trust-graders")
    assert code == 2 and "grading.p.expected" in out and "key.json" in out, out
    assert SECRET not in out
    # The scenario's own schema file is read at load, with the same care.
    probes = [{"id": "p", "prompt": "JSON?", "grade": "json_schema", "expected": "key.json"}]
    path = write_scenario(tmp_path / "s2.toml", server.url, probes=probes, samples=1)
    code, out = run_cli("run", path, "--out", tmp_path / "run2", "--quiet")
    assert code == 2 and "key.json" in out and SECRET not in out, out


def test_cases_rerun_refuses_a_schema_path_in_a_case_file_without_trust_graders(tmp_path, server):
    (tmp_path / "key.json").write_text(json.dumps({"type": SECRET}))
    case = {
        "id": "c",
        "input": "JSON?",
        "params": {"temperature": 0},
        "verdict": "stable",
        "grade": "json_schema",
        "expected": str(tmp_path / "key.json"),
    }
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps(case) + "\n")
    code, out = run_cli(
        "cases", "rerun", cases, "--url", server.url, "--model", "m", "-o", tmp_path / "o.jsonl"
    )
    assert code == 2 and "--trust-graders" in out and SECRET not in out, out
    assert len(server.requests) == 0
    assert not list(tmp_path.glob("cases-rerun-*"))
