"""A value the server sends that does not fit its field (a count that is no count, a logprob above
0, a token id below 0) is a finding on the record and is dropped: never used as a number, never a
traceback, never exit 1."""

from __future__ import annotations

import asyncio
import json

import pytest

from kevload.records.rundir import RunDir
from kevload.wire.answer import read_stream, read_whole
from tests.conftest import load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer


def whole(doc, token_limit=None):
    raw = json.dumps(doc).encode()
    return asyncio.run(
        read_whole(raw, "application/json", "chat", 0.0, 0.0, token_limit=token_limit)
    )


def streamed(*docs, split=None):
    payload = (
        b"".join(b"data: " + json.dumps(d).encode() + b"\n\n" for d in docs) + b"data: [DONE]\n\n"
    )

    async def body():
        step = split or len(payload)
        for k in range(0, len(payload), step):
            yield payload[k : k + step]

    async def read():
        return b""

    return asyncio.run(read_stream(body(), read, "text/event-stream", "chat", 0.0, 0.0))


def answer(**extra):
    return {
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}
        ],
        **extra,
    }


WRONG_COUNTS = ["12", [12], -3, 10**30, 12.0, True, {"n": 1}, 2**31]


@pytest.mark.parametrize("value", WRONG_COUNTS, ids=repr)
def test_a_count_of_the_wrong_type_or_range_is_a_finding_and_dropped(value):
    outcome = whole(answer(usage={"prompt_tokens": 7, "completion_tokens": value}))
    assert outcome.status == "ok" and outcome.output == "hi"  # the text itself is fine
    assert outcome.completion_tokens is None and outcome.prompt_tokens == 7
    assert outcome.findings and outcome.findings[0].startswith(
        "usage.completion_tokens: expected an integer"
    ), outcome.findings
    shown = (
        float(value) if type(value) is int and value >= 2**64 else value
    )  # read as orjson reads it: a float
    assert repr(shown)[:20] in outcome.findings[0]


@pytest.mark.parametrize("value", WRONG_COUNTS, ids=repr)
def test_a_streamed_count_of_the_wrong_type_is_a_finding_too(value):
    outcome = streamed(
        {"choices": [{"index": 0, "delta": {"content": "hi"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": value}},
    )
    assert outcome.status == "ok" and outcome.completion_tokens is None
    assert len(outcome.findings) == 1 and "usage.completion_tokens" in outcome.findings[0]


def test_a_count_above_the_requests_max_tokens_is_impossible():
    assert whole(answer(usage={"completion_tokens": 16}), token_limit=16).findings is None
    outcome = whole(answer(usage={"completion_tokens": 17}), token_limit=16)
    assert outcome.completion_tokens is None
    assert outcome.findings == [
        "usage.completion_tokens: expected at most the request's max_tokens (16), got 17"
    ]


def test_counts_that_fit_are_read_as_sent_and_without_findings():
    outcome = whole(
        answer(
            usage={
                "prompt_tokens": 0,
                "completion_tokens": 2**31 - 1,
                "prompt_tokens_details": {"cached_tokens": 5},
            },
            system_fingerprint="fp",
        )
    )
    assert (outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens) == (
        0,
        2**31 - 1,
        5,
    )
    assert outcome.findings is None and outcome.system_fingerprint == "fp"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"usage": "twelve"}, "usage: expected an object"),
        (
            {"usage": {"prompt_tokens_details": {"cached_tokens": -1}}},
            "usage.prompt_tokens_details.cached_tokens",
        ),
        ({"timings": {"cache_n": "5"}}, "timings.cache_n"),
        ({"timings": [1]}, "timings: expected an object"),
        ({"system_fingerprint": 5}, "system_fingerprint: expected a string"),
        ({"tokens": [1, -2]}, "tokens: expected a list of token ids"),
    ],
)
def test_each_value_beside_the_text_that_does_not_fit_is_named(extra, field):
    outcome = whole(answer(**extra))
    assert (
        outcome.status == "ok"
        and outcome.cached_tokens is None
        and outcome.system_fingerprint is None
    )
    assert outcome.token_ids is None
    assert outcome.findings and outcome.findings[0].startswith(field), outcome.findings


def test_a_positive_logprob_is_impossible_and_dropped_at_its_position():
    doc = answer()
    doc["choices"][0]["logprobs"] = {
        "content": [
            {"token": "h", "logprob": -0.5},
            {"token": "i", "logprob": 0.7},
            {"token": "!", "logprob": "x"},
            {"token": "?", "logprob": 1e-7},
        ]
    }
    outcome = whole(doc)
    assert outcome.status == "ok" and outcome.tokens == ["h", "i", "!", "?"]
    # float32 rounding may put the top token a hair above 0; 0.7 and a string are no logprob
    assert outcome.logprobs == [-0.5, None, None, 1e-7]
    assert outcome.findings == [
        "logprobs: 2 values are no logprob (a number ≤ 0.001), the first 0.7"
    ]


def test_token_ids_below_zero_are_no_ids():
    doc = answer()
    doc["choices"][0]["logprobs"] = {"content": [{"token": "h", "logprob": -0.5, "id": -4}]}
    outcome = whole(doc)
    assert outcome.token_ids is None and outcome.logprobs == [-0.5]
    assert outcome.findings[0].startswith("logprobs.content[].id: expected a list of token ids")


def test_a_finding_every_chunk_repeats_is_said_once():
    chunk = {
        "choices": [{"index": 0, "delta": {"content": "a"}}],
        "usage": {"completion_tokens": "1"},
    }
    outcome = streamed(
        chunk, chunk, chunk, {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    )
    assert outcome.status == "ok" and outcome.output == "aaa" and len(outcome.findings) == 1


def test_text_and_finish_reason_of_the_wrong_type_stay_malformed():
    bad_text = answer()
    bad_text["choices"][0]["message"]["content"] = 5
    bad_finish = answer()
    bad_finish["choices"][0]["finish_reason"] = ["stop"]
    for doc in (bad_text, bad_finish):
        outcome = whole(doc)
        assert outcome.status == "malformed" and outcome.output is None, outcome
        assert "$.choices[0]" in outcome.error


class _Counts(FakeServer):
    """Every answer says its completion_tokens as ``value``, whole or streamed (the text is the
    usual one)."""

    value: object = None

    def _cache_account(self, cached):
        return {"usage": {"completion_tokens": self.value}}


@pytest.mark.parametrize(
    ("value", "stream"),
    [
        ("12", False),
        ([12], False),
        (-3, False),
        (10**30, False),
        (12.0, False),
        (-3, True),
        ("12", True),
    ],
    ids=repr,
)
def test_a_run_whose_server_miscounts_ends_complete_with_the_finding_on_record(
    tmp_path, value, stream
):
    server = _Counts(Behaviour(latency=0.01))
    server.value = value
    with server:
        scenario = write_scenario(
            tmp_path / "s.toml",
            server.url,
            concurrency=[1, 2],
            samples=3,
            stream=stream,
            logprobs=False,
        )
        code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output  # a deterministic server: the miscount is no nondeterminism
    assert "Traceback" not in output
    run = RunDir(tmp_path / "run")
    assert json.loads((tmp_path / "run" / "run.json").read_text())["state"] == "complete"
    records = [r for r in run.records() if r.role == "probe"]
    assert records and all(r.completion_tokens is None and r.findings for r in records)
    assert all(r.findings[0].startswith("usage.completion_tokens:") for r in records), records[
        0
    ].findings
    summary = load_summary(tmp_path / "run")
    for cell in summary["cells"]:
        assert cell["output_tokens"] == 0 and cell["output_tokens_per_s"] in (0, 0.0, None), cell
        assert cell["findings"] == cell["ok"] > 0
    code, report = run_cli("report", tmp_path / "run", "--format", "json")
    assert code == 0 and json.loads(report) == summary
