"""--resume: a stopped run finishes with nothing sent twice and nothing counted twice, a level
complete on disk is never sent again, and what was kept off the disk (a password in base_url) is
asked for, never replaced by its mask."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web

from kevload.records.store import read_records
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario
from tests.fakeserver import FakeServer


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]


def _start_run(tmp_path, server, samples=200):
    server.behaviour.latency = 0.05
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=samples)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kevload", "run", str(scenario), "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    records = out / "records.jsonl"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (
        not records.exists() or records.read_bytes().count(b"\n") < 5
    ):
        time.sleep(0.05)
    return proc, out


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_cleanly_and_resume_finishes(tmp_path, server, signum, code):
    proc, out = _start_run(tmp_path, server, samples=60)
    os.kill(proc.pid, signum)
    stdout, stderr = proc.communicate(timeout=20)
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["state"] == "interrupted"
    summary = load_summary(out)
    first = summary["requests"]
    assert 0 < first < 120 and first == sum(
        r["counted"] for r in read_records(out / "records.jsonl")
    )

    code, output = run_cli("run", "--resume", out, "--quiet")
    assert code == 0, output
    summary = load_summary(out)
    cells = cells_by_level(summary)
    assert cells[1]["ok"] == 60 and cells[2]["ok"] == 60  # both parts counted, nothing sent twice
    rows = list(read_records(out / "records.jsonl"))
    assert len({r["seq"] for r in rows}) == len(rows)
    # 120 counted samples; the ramp-up sends of each level start are on record too, not counted.
    assert sum(r["counted"] for r in rows) == 120
    assert len({r["run_id"] for r in rows}) == 1
    assert json.loads((out / "run.json").read_text())["state"] == "complete"


class _BasicAuth(FakeServer):
    """401 unless the request carries Basic user:s3cret-pw (what a base_url user:password@ stands
    for)."""

    def __init__(self):
        super().__init__()
        self.authorizations: list[str | None] = []

    async def _handle(self, request):
        self.authorizations.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Basic dXNlcjpzM2NyZXQtcHc=":
            return web.json_response({"error": "unauthorized"}, status=401)
        return await super()._handle(request)


def test_resume_of_a_run_with_url_credentials_never_sends_the_redacted_placeholder(tmp_path):
    """The docs: a user:password@ in base_url is written nowhere (***). Resuming such a run from
    run.json would send 'Basic ***:' and end 'target failed': it is refused (exit 2, one line) until
    the URL is given again, and then the real credential goes out."""
    with _BasicAuth() as server:
        url = server.url.replace("http://", "http://user:s3cret-pw@")
        scenario = write_scenario(tmp_path / "s.toml", url, concurrency=[1], samples=4)
        assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
        records = tmp_path / "run" / "records.jsonl"
        records.write_text(
            "".join(records.read_text().splitlines(keepends=True)[:2])
        )  # killed after 2 answers
        before = len(server.authorizations)
        code, output = run_cli("run", "--resume", tmp_path / "run", "--quiet")
        assert code == 2 and server.authorizations[before:] == [], (code, output)
        assert output.count("\n") == 1 and "target.base_url" in output and "s3cret" not in output, (
            output
        )
        code, output = run_cli(
            "run", "--resume", tmp_path / "run", "--quiet", "--set", f'target.base_url="{url}"'
        )
        sent = server.authorizations[before:]
    assert code == 0, output
    assert sent and all(a == "Basic dXNlcjpzM2NyZXQtcHc=" for a in sent)


def _cut_run(tmp_path: Path, server, probes: list[dict]) -> Path:
    """A finished run of ``probes`` at c=1, 4 samples, cut to its first two records as if killed."""
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, probes=probes, concurrency=[1], samples=4
    )
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    records = tmp_path / "run" / "records.jsonl"
    records.write_text("".join(records.read_text().splitlines(keepends=True)[:2]))
    return tmp_path / "run"


@pytest.mark.parametrize(
    ("change", "changed"),
    [
        ('probes=[{id="p1",prompt="Say something else.",expected="x"}]', "its input changed"),
        ('probes=[{id="p1",prompt="Say something.",expected="y"}]', "its grading changed"),
        ("params.temperature=0.5", "its params changed"),
        ('target.model="other"', "target.model would be 'other' where the run sent 'fake'"),
        ('target.api="completions"', "target.api would be 'completions'"),
        ("load.nonce=false", "load.nonce would be False where the run sent True"),
        ("load.stream=true", "load.stream would be True"),
        (
            'probes=[{id="p1",prompt="Say something.",expected="x"},{id="p2",prompt="q"}]',
            "the run had no such probe",
        ),
    ],
)
def test_resume_refuses_a_scenario_that_asks_or_grades_otherwise_than_the_run(
    tmp_path, server, change, changed
):
    """A cell holds the answers to one input judged one way: a --set on --resume that changes either
    would mix two inputs in a cell (drift the server never made) or grade half of it by another
    rule."""
    run = _cut_run(tmp_path, server, [{"id": "p1", "prompt": "Say something.", "expected": "x"}])
    before = len(server.requests)
    code, output = run_cli("run", "--resume", run, "--quiet", "--set", change)
    assert code == 2 and changed in output and "--resume" in output, output
    assert len(server.requests) == before


def test_resume_grades_by_the_scenario_not_by_a_grading_table_run_json_was_given(tmp_path, server):
    """run.json's grading table is data: a resume grades by its scenario's graders (checked as
    --resume checks them), so a python grader written into the table alone is never imported."""
    import sys

    run = _cut_run(tmp_path, server, [{"id": "p1", "prompt": "Say something.", "expected": "x"}])
    marker = tmp_path / "imported"
    (tmp_path / "kevload_test_table_only.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "def check(answer, probe, expected):\n    return True\n"
    )
    meta = json.loads((run / "run.json").read_text())
    meta["grading"] = {
        "p1": {
            "grade": "python:kevload_test_table_only:check",
            "expected": None,
            "tolerance": 0,
            "dir": str(tmp_path),
        }
    }
    (run / "run.json").write_text(json.dumps(meta))
    code, output = run_cli("run", "--resume", run, "--quiet")
    assert not marker.exists() and "kevload_test_table_only" not in sys.modules
    summary = json.loads((run / "summary.json").read_text())
    assert (code, summary["cells"][0]["graded_bad"]) == (0, 4), (
        output
    )  # "x" by exact, as the scenario says
    assert json.loads((run / "run.json").read_text())["grading"]["p1"]["grade"] == "exact"


@pytest.mark.parametrize(
    "url", ["http://[::1/v1", "http://127.0.0.1:99999/v1", "http://127.0.0.1:8000/v1 "]
)
def test_resume_with_a_url_that_cannot_be_sent_to_is_refused_naming_the_key(tmp_path, server, url):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    code, output = run_cli(
        "run", "--resume", tmp_path / "run", "--quiet", "--set", f'target.base_url="{url}"'
    )
    assert code == 2 and "target.base_url" in output and "Traceback" not in output, output


def test_resume_of_a_duration_run_does_not_resend_completed_levels(tmp_path, server):
    """The docs: '`kevload run --resume DIR` finishes an interrupted one'. A run with load.duration
    killed in its second rate level is resumed: the first level, complete on disk, is sent again for
    its whole duration, and its cell then counts both (twice the requests, a duration spanning the
    gap)."""
    server.behaviour.latency = 0.01
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, rate=[8, 16], duration=1.0, samples=1
    )
    assert run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")[0] == 0
    records = tmp_path / "run" / "records.jsonl"
    lines = records.read_text().splitlines(keepends=True)
    first_level = [line for line in lines if json.loads(line)["rate"] == 8]
    records.write_text(
        "".join(first_level) + "".join(lines[len(first_level) : len(first_level) + 3])
    )
    sent_before = len(server.requests)
    run_cli("run", "--resume", tmp_path / "run", "--quiet")
    resent = [r for r in _rows(tmp_path / "run") if r["rate"] == 8]
    assert len(resent) == len(first_level), (
        len(resent),
        len(first_level),
        len(server.requests) - sent_before,
    )
