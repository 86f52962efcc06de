"""Records read back typed: the typed reader inverts the writer, and ``RunDir`` is how a run is
read."""

from __future__ import annotations

import math

import orjson
import pytest

from kevload.errors import RunDirError
from kevload.records.rundir import RunDir
from kevload.records.store import Record, RecordWriter, read_typed, record_line


def record(seq: int, **changes) -> Record:
    values = dict(
        run_id="r",
        seq=seq,
        probe="p1",
        role="probe",
        mode="single",
        concurrency=2,
        rate=None,
        sample=seq,
        in_flight=1,
        counted=True,
        max_in_flight=2,
        status="ok",
        output="hi",
        sha256="ab",
        finish_reason="stop",
        prompt_tokens=3,
        completion_tokens=1,
        token_ids=[7],
        tokens=["hi"],
        logprobs=[-0.5],
        system_fingerprint=None,
        t_scheduled=None,
        t_send=1.0,
        t_first_byte=1.1,
        t_first_token=1.1,
        t_last_byte=1.2,
        chunks=1,
        max_gap=None,
        error=None,
        retries=0,
        params={"temperature": 0},
        request_id=f"r-{seq}",
    )
    return Record(**{**values, **changes})


def test_the_typed_reader_inverts_the_line_the_writer_writes(tmp_path):
    plain = record(
        0,
        reasoning="think",
        tool_calls=[{"name": "f", "arguments": "{}"}],
        worker=1,
        findings=["usage.completion_tokens: expected an integer, got '12'"],
    )
    spelled = record(1, logprobs=[-math.inf, -0.25, None], logprob_nonfinite=1)
    (tmp_path / "records.jsonl").write_bytes(record_line(plain) + record_line(spelled))
    assert list(RunDir(tmp_path).records()) == [plain, spelled]
    # The comparator takes them as written: spelled, as strict JSON has them.
    assert next(read_typed(tmp_path / "records.jsonl", len(record_line(plain)))).logprobs == [
        "-Infinity",
        -0.25,
        None,
    ]


def test_the_typed_reader_reads_an_older_line_and_leaves_unknown_keys_out(tmp_path):
    doc = orjson.loads(record_line(record(0)))
    for key in (
        "counted",
        "max_in_flight",
        "request_id",
        "worker",
        "findings",
        "cancel_planned",
        "cached_tokens",
    ):
        del doc[key]
    (tmp_path / "records.jsonl").write_bytes(
        orjson.dumps({**doc, "from_a_later_version": 1}) + b"\n"
    )
    (old,) = RunDir(tmp_path).records()
    assert (
        old.counted is True
        and old.max_in_flight is None
        and old.request_id is None
        and old.findings is None
    )
    assert old == record(0, max_in_flight=None, request_id=None)


def test_evidence_is_the_counted_ok_probe_answers(tmp_path):
    with RecordWriter(tmp_path / "records-0.jsonl") as writer:
        for seq, changes in enumerate(
            [
                {},
                {"status": "timeout"},
                {"counted": False},
                {"role": "warmup"},
                {"role": "companion", "probe": "companion:x"},
            ]
        ):
            writer.write(record(seq, **changes))
    run = RunDir.open(tmp_path)
    assert [r.seq for r in run.evidence()] == [0]
    assert [r.seq for r in run.records() if r.is_sample] == [0, 1, 4]
    assert run.find("r-3")["role"] == "warmup" and run.find("r-9") is None


def test_a_directory_without_records_is_no_run(tmp_path):
    with pytest.raises(RunDirError, match="not a kevload run directory"):
        RunDir.open(tmp_path)
    assert not RunDir(tmp_path).holds_run()


@pytest.mark.parametrize("line", [0, 1, 2])
@pytest.mark.parametrize("value", [[1], {"a": 1}, None, 5])
def test_a_record_whose_run_id_is_no_string_is_refused_naming_its_line(tmp_path, line, value):
    rows = [orjson.loads(record_line(record(seq))) for seq in range(3)]
    rows[line]["run_id"] = value
    path = tmp_path / "records.jsonl"
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    run = RunDir(tmp_path)
    # Before: an unhashable list or dict, or null sorted against the others' ids, raised a TypeError
    # (report: exit 1).
    assert run.run_id() == "r"
    with pytest.raises(
        RunDirError, match=rf"records.jsonl:{line + 1}: not a kevload record: .*\$\.run_id"
    ):
        list(run.records())


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from tests.conftest import run_cli, write_scenario
    from tests.fakeserver import FakeServer

    tmp = tmp_path_factory.mktemp("run")
    with FakeServer() as server:
        scenario = write_scenario(
            tmp / "s.toml",
            server.url,
            concurrency=[1, 2],
            samples=3,
            slo={"e2e_ms": 5000},
            probes=[
                {
                    "id": "p1",
                    "prompt": "Say.",
                    "max_tokens": 4,
                    "expected": "x",
                    "grade": "contains",
                }
            ],
        )
        code, output = run_cli("run", scenario, "--out", tmp / "run")
    assert code in (0, 1), output
    return tmp / "run"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (("load", "max_error_share"), "half"),
        (("load",), None),
        (("load", "samples"), "3"),
        (("load", "slo"), {"e2e": 5}),
        (("load", "concurrency"), "1,2"),
        (("probes",), [{"id": "p1"}]),
        (("parts",), [{"part": "0"}]),
        (("run_id",), 7),
        (("prefix_cache",), {"why": "no method"}),
        (("target", "model"), None),
        (("grading",), ["p1"]),
    ],
)
def test_an_edited_run_json_is_refused_by_report_naming_its_key(tmp_path, finished_run, key, value):
    import shutil

    from tests.conftest import run_cli

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    doc = orjson.loads((run / "run.json").read_bytes())
    table = doc
    for part in key[:-1]:
        table = table[part]
    table[key[-1]] = value
    (run / "run.json").write_bytes(orjson.dumps(doc))
    code, output = run_cli("report", run)
    assert code == 2, output
    assert "run.json" in output and key[-1] in output and "Traceback" not in output
