"""Records read typed, with their ranges: a records file either summarizes or is refused naming its
line (exit 2), a run whose server sent a count of the wrong type still ends summarized and in a
final state, and records of an older version still read."""

from __future__ import annotations

import json
import shutil

import orjson
import pytest

from kevload.load import finishing
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer


class _Counts(FakeServer):
    """Answers whole, with ``usage.completion_tokens`` replaced by ``value`` (stream and non-stream
    alike)."""

    def __init__(self, value: object):
        super().__init__(Behaviour(latency=0.0))
        self.value = value

    def _cache_account(self, cached: int) -> dict:
        return {"usage": {"completion_tokens": self.value}}


@pytest.fixture(scope="module")
def healthy_run(tmp_path_factory):
    """A small run of a healthy server, summarized: the files a report reads."""
    tmp = tmp_path_factory.mktemp("healthy")
    with FakeServer(Behaviour(latency=0.0)) as server:
        scenario = write_scenario(tmp / "s.toml", server.url, concurrency=[1, 2], samples=3)
        code, output = run_cli("run", scenario, "--out", tmp / "run", "--quiet")
    assert code == 0, output
    return tmp / "run"


@pytest.mark.parametrize("value", ['"12"', "[3]", "-5", "10000000000000000000000000000000", "1e9"])
def test_a_records_file_with_an_impossible_count_is_refused_naming_its_line(
    tmp_path, healthy_run, value
):
    run = shutil.copytree(healthy_run, tmp_path / "run")
    lines = (run / "records.jsonl").read_bytes().splitlines(keepends=True)
    assert b'"completion_tokens":' in lines[1]
    lines[1] = lines[1].replace(
        b'"completion_tokens":', b'"completion_tokens":' + value.encode() + b',"was":', 1
    )
    (run / "records.jsonl").write_bytes(b"".join(lines))
    code, output = run_cli("report", run, "--format", "json")
    assert code == 2, (
        output
    )  # before: a TypeError's traceback (string, list) or a negative tokens/s (-5)
    assert (
        f"{run / 'records.jsonl'}:2: not a kevload record" in output
        and "$.completion_tokens" in output
    )
    assert "Traceback" not in output


def test_a_torn_last_line_is_still_skipped(tmp_path, healthy_run):
    run = shutil.copytree(healthy_run, tmp_path / "run")
    whole = load_summary(run)
    with (run / "records.jsonl").open("ab") as handle:
        handle.write(
            b'{"run_id":"' + whole["run_id"].encode() + b'","seq":99,"probe":"p1","role":"pro'
        )
    code, output = run_cli("report", run, "--format", "json")
    assert code == 0, output
    assert json.loads(output)["cells"] == whole["cells"]


def test_records_of_an_older_version_still_summarize_alike(tmp_path, healthy_run):
    run = shutil.copytree(healthy_run, tmp_path / "run")
    # A record as written before these fields existed (counted was the default then: every record
    # was counted).
    later = (
        "counted",
        "max_in_flight",
        "reasoning",
        "tool_calls",
        "reconnects",
        "request_id",
        "worker",
        "logprob_nonfinite",
        "turn",
        "turns",
        "conversation",
        "history",
        "history_sha256",
        "conversation_sha256",
        "cache",
        "cached_tokens",
        "cancel_planned",
        "findings",
    )
    rows = [orjson.loads(line) for line in (run / "records.jsonl").read_bytes().splitlines()]
    rows = [
        {**{k: v for k, v in row.items() if k not in later}, "a_later_field": [1]}
        for row in rows
        if row["counted"]
    ]
    (run / "records.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    code, output = run_cli("report", run, "--format", "json")
    assert code == 0, output
    cells = cells_by_level(json.loads(output))
    assert {level: (cell["ok"], cell["distinct"]) for level, cell in cells.items()} == {
        1: (3, 1),
        2: (3, 1),
    }


@pytest.mark.parametrize("value", ["12", [3], -5, 10**31])
@pytest.mark.parametrize("stream", [False, True])
def test_a_count_of_the_wrong_type_never_costs_the_run_its_summary(tmp_path, value, stream):
    with _Counts(value) as server:
        scenario = write_scenario(
            tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=3, stream=stream
        )
        code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    # Before: every record written, then a TypeError (or tokens/s of a negative count): exit 1,
    # run.json "running".
    assert code not in (1,) and "Traceback" not in output, output
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["state"] == "complete"
    summary = load_summary(tmp_path / "run")
    assert summary["state"] == "complete"
    for cell in cells_by_level(summary).values():
        # The count is kept off every number: no tokens where the server's count was none.
        assert cell["ok"] == 3 and not cell.get("output_tokens")
    rows = [
        orjson.loads(line)
        for line in (tmp_path / "run" / "records.jsonl").read_bytes().splitlines()
    ]
    probes = [r for r in rows if r["role"] == "probe"]
    assert all(
        r["completion_tokens"] is None and any("completion_tokens" in f for f in r["findings"])
        for r in probes
    )
    code, output = run_cli("report", tmp_path / "run", "--format", "json")
    assert code not in (1, 2) and json.loads(output)["cells"] == summary["cells"]


def test_a_run_whose_summary_fails_still_ends_in_its_final_state_and_never_exits_1(
    tmp_path, monkeypatch
):
    def broken(*args, **kwargs):
        raise TypeError("unsupported operand type(s) for +=: 'int' and 'str'")

    monkeypatch.setattr(finishing, "summarize", broken)
    with FakeServer(Behaviour(latency=0.0)) as server:
        scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
        code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    # Before: the TypeError's traceback, exit 1 (which a CI gate reads as nondeterminism), run.json
    # left "running".
    assert code == 3, output
    assert "could not be summarized: TypeError: unsupported operand" in output
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (
        meta["state"] == "complete"
        and meta["ended_at"]
        and meta["parts"][-1]["state"] == "complete"
    )


@pytest.mark.parametrize(
    "edit, named",
    [
        ({"t_send": -1e308, "t_last_byte": 1e308}, "$.t_send"),
        ({"t_first_token": 1e300}, "$.t_first_token"),
        ({"turns": 2, "turn": 0, "conversation": "c", "history": None}, "history"),
        ({"turns": 2, "turn": 2, "conversation": "c", "history": []}, "turn"),
    ],
)
def test_a_record_that_no_run_writes_is_refused_naming_its_line(tmp_path, healthy_run, edit, named):
    # Times so far apart that their difference is no number, or a conversation turn without what
    # every turn records:
    # no run writes either, and neither may reach the comparator's arithmetic.
    run = shutil.copytree(healthy_run, tmp_path / "run")
    rows = [orjson.loads(line) for line in (run / "records.jsonl").read_bytes().splitlines()]
    rows[1].update(edit)
    (run / "records.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    code, output = run_cli("report", run, "--format", "json")
    assert code == 2, (
        output
    )  # before: a ValueError (an infinite latency binned) or a TypeError traceback, exit 1
    assert f"{run / 'records.jsonl'}:2: not a kevload record" in output and named in output, output
    assert "Traceback" not in output
