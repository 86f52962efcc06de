"""The compared output is the whole answer: reasoning, content and tool calls; failed answers are
typed.

Servers answer as vLLM and SGLang do: reasoning in ``reasoning_content`` or ``reasoning`` beside the
content, tool calls in the message or streamed as deltas by index, ``finish_reason: "abort"`` /
``"error"``, SSE ``event: error``, error objects in place of an answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json

import orjson
import pytest

from kevload.records.store import answer_text, read_records
from kevload.wire.answer import read_stream, read_whole
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario


@pytest.fixture(params=["lean", "aiohttp"])
def backend(request, monkeypatch):
    monkeypatch.setenv("KEVLOAD_HTTP", request.param)
    return request.param


def whole(doc, api="chat"):
    return asyncio.run(read_whole(orjson.dumps(doc), "application/json", api, 0.0, 0.0))


def stream(*events: bytes, api="chat"):
    async def body():
        for event in events:
            yield event

    async def read():
        return b""

    return asyncio.run(read_stream(body(), read, "text/event-stream", api, 0.0, 0.0))


def data(doc) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def delta(**fields) -> bytes:
    return data({"choices": [{"index": 0, "delta": fields}]})


def finish(reason="stop") -> bytes:
    return data({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})


# --- the compared text ---


def test_plain_answer_text_is_the_content_so_old_hashes_stay():
    assert answer_text("Hello world") == "Hello world"
    assert answer_text("Hello", reasoning="", tool_calls=[]) == "Hello"
    assert answer_text(None) == ""


def test_answer_text_keeps_every_part_apart():
    text = answer_text(
        "Paris.", "Capital of France?", [{"name": "lookup", "arguments": '{"q": 1}'}]
    )
    assert text == (
        "<reasoning>\nCapital of France?\n</reasoning>\nParis."
        '\n<tool_call name="lookup">\n{"q": 1}\n</tool_call>'
    )
    # The same words in another field are another answer.
    assert answer_text("ab", "x") != answer_text("xab") != answer_text("b", "xa")


# --- reading one response ---


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_whole_reasoning_is_kept_and_compared(field):
    out = whole(
        {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "42", field: "Think."},
                }
            ]
        }
    )
    assert (out.status, out.output, out.reasoning, out.tool_calls) == ("ok", "42", "Think.", None)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_streamed_reasoning_is_kept(field):
    out = stream(
        delta(role="assistant"),
        delta(**{field: "Thi"}),
        delta(**{field: "nk."}),
        delta(content="42"),
        finish(),
        b"data: [DONE]\n\n",
    )
    assert (out.status, out.output, out.reasoning) == ("ok", "42", "Think.")
    assert out.chunks == 3  # reasoning pieces are generated tokens too (TTFT, inter-token gaps)


def test_whole_tool_calls_are_an_answer_without_their_ids():
    call = {
        "id": "call-9f2",
        "type": "function",
        "function": {"name": "get", "arguments": '{"city": "Oslo"}'},
    }
    out = whole(
        {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                }
            ]
        }
    )
    assert (out.status, out.output) == ("ok", "")
    assert out.tool_calls == [{"name": "get", "arguments": '{"city": "Oslo"}'}]


def test_object_arguments_are_compared_in_one_spelling():
    def answer(arguments):
        call = {"type": "function", "function": {"name": "get", "arguments": arguments}}
        return whole(
            {
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {"content": None, "tool_calls": [call]},
                    }
                ]
            }
        ).tool_calls

    assert (
        answer({"b": 1, "a": 2})
        == answer({"a": 2, "b": 1})
        == [{"name": "get", "arguments": '{"a":2,"b":1}'}]
    )


def test_streamed_tool_calls_are_joined_by_index():
    out = stream(
        delta(
            tool_calls=[
                {
                    "index": 0,
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "a", "arguments": ""},
                }
            ]
        ),
        delta(
            tool_calls=[
                {
                    "index": 1,
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "b", "arguments": "{"},
                }
            ]
        ),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"x"'}}]),
        delta(tool_calls=[{"index": 1, "function": {"name": None, "arguments": "}"}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": ": 1}"}}]),
        finish("tool_calls"),
        b"data: [DONE]\n\n",
    )
    assert out.status == "ok"
    assert out.tool_calls == [
        {"name": "a", "arguments": '{"x": 1}'},
        {"name": "b", "arguments": "{}"},
    ]


def test_other_choices_never_mix_into_choice_zero():
    out = stream(
        data({"choices": [{"index": 1, "delta": {"content": "B"}}]}),
        delta(content="A"),
        data({"choices": [{"index": 1, "delta": {"content": "B"}, "finish_reason": "stop"}]}),
        finish(),
        b"data: [DONE]\n\n",
    )
    assert (out.status, out.output) == ("ok", "A")


def test_an_empty_answer_needs_a_finish_reason():
    assert (
        whole(
            {"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": ""}}]}
        ).status
        == "ok"
    )
    assert whole({"choices": [{"index": 0, "message": {"content": None}}]}).status == "malformed"
    assert stream(finish(), b"data: [DONE]\n\n").status == "ok"
    assert stream(delta(role="assistant"), b"data: [DONE]\n\n").status == "malformed"


@pytest.mark.parametrize(("reason", "status"), [("abort", "aborted"), ("error", "server_error")])
def test_failed_finishes_are_failures(reason, status):
    out = whole(
        {"choices": [{"index": 0, "finish_reason": reason, "message": {"content": "partial"}}]}
    )
    assert (out.status, out.error) == (status, f"finish_reason {reason!r}")
    assert stream(delta(content="partial"), finish(reason), b"data: [DONE]\n\n").status == status


@pytest.mark.parametrize(
    "doc", [{"error": {"message": "boom"}}, {"object": "error", "message": "boom", "code": 500}]
)
def test_error_objects_are_server_errors(doc):
    assert whole(doc).status == "server_error"
    assert (
        stream(delta(content="x"), data(doc), finish(), b"data: [DONE]\n\n").status
        == "server_error"
    )


@pytest.mark.parametrize(
    "event",
    [
        b'event: error\ndata: {"error": "boom"}\n\n',
        b"event: error\ndata: {}\n\n",
        b"event: error\ndata: overloaded\n\n",
        b"event: error\n\n",
    ],
)
def test_error_events_are_server_errors(event):
    out = stream(delta(content="x"), event, finish(), b"data: [DONE]\n\n")
    assert out.status == "server_error"


# --- whole runs against a server that answers like vLLM / SGLang ---


def _run(tmp_path, server, *, stream, samples=4, **load):
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=samples, stream=stream, **load
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    return (
        code,
        output,
        load_summary(tmp_path / "run"),
        list(read_records(tmp_path / "run" / "records.jsonl")),
    )


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
@pytest.mark.parametrize("streamed", [False, True])
def test_reasoning_that_varies_is_drift(tmp_path, server, backend, streamed, field):
    server.behaviour.reasoning_field = field
    server.behaviour.reasoning_varies = True
    code, output, summary, records = _run(tmp_path, server, stream=streamed)
    assert code == 1, output
    assert cells_by_level(summary)[1]["distinct"] == 4
    probes = [r for r in records if r["role"] == "probe"]
    assert len({r["output"] for r in probes}) == 1, "the content alone does not vary"
    assert len({r["reasoning"] for r in probes}) == len(probes)


@pytest.mark.parametrize("streamed", [False, True])
def test_steady_reasoning_is_one_output(tmp_path, server, streamed):
    server.behaviour.reasoning_field = "reasoning_content"
    code, output, summary, records = _run(tmp_path, server, stream=streamed)
    assert code == 0, output
    assert [c["distinct"] for c in cells_by_level(summary).values()] == [1, 1]
    r = records[0]
    assert r["reasoning"].startswith("The user wants words")
    assert (
        r["sha256"] == hashlib.sha256(answer_text(r["output"], r["reasoning"]).encode()).hexdigest()
    )
    assert r["sha256"] != hashlib.sha256(r["output"].encode()).hexdigest()


def test_plain_answers_hash_as_before(tmp_path, server):
    code, output, _, records = _run(tmp_path, server, stream=True)
    assert code == 0, output
    assert all(r["sha256"] == hashlib.sha256(r["output"].encode()).hexdigest() for r in records)
    assert all(r["reasoning"] is None and r["tool_calls"] is None for r in records)


@pytest.mark.parametrize("vary", [False, True])
@pytest.mark.parametrize("streamed", [False, True])
def test_tool_calls_are_compared(tmp_path, server, backend, streamed, vary):
    server.behaviour.tool_calls = 2
    server.behaviour.tool_args_vary = vary
    code, output, summary, records = _run(tmp_path, server, stream=streamed)
    assert {r["status"] for r in records} == {"ok"}
    assert code == (1 if vary else 0), output
    assert cells_by_level(summary)[1]["distinct"] == (4 if vary else 1)
    calls = records[0]["tool_calls"]
    assert [c["name"] for c in calls] == ["lookup_0", "lookup_1"]
    assert [json.loads(c["arguments"])["page"] for c in calls] == [0, 1]
    assert records[0]["output"] == "" and records[0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("n", [2, 0, "2"])
def test_n_other_than_one_is_refused(tmp_path, server, n):
    scenario = write_scenario(tmp_path / "s.toml", server.url, params={"temperature": 0, "n": n})
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 2
    assert len(output.strip().splitlines()) == 1 and "params.n: expected 1" in output
    assert not server.requests


def test_n_of_one_is_fine(tmp_path, server):
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        params={"temperature": 0, "n": 1},
        concurrency=[1],
        samples=2,
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output


WHOLE_FAILURES = {
    "finish_abort": "aborted",
    "finish_error": "server_error",
    "error_object": "server_error",
}
STREAM_FAILURES = {
    **WHOLE_FAILURES,
    "error_event": "server_error",
    "error_event_bare": "server_error",
}


@pytest.mark.parametrize("streamed", [False, True])
def test_failed_answers_are_counted_not_compared(tmp_path, server, backend, streamed):
    table = STREAM_FAILURES if streamed else WHOLE_FAILURES
    server.behaviour.faults = [None, *table, None]
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1],
        samples=len(table) + 2,
        stream=streamed,
        max_error_share=1.0,
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    cell = cells_by_level(load_summary(tmp_path / "run"))[1]
    expected: dict[str, int] = {}
    for status in table.values():
        expected[status] = expected.get(status, 0) + 1
    assert cell["errors"] == expected
    assert (cell["ok"], cell["distinct"]) == (2, 1)
    # Two ok answers of the samples asked: one output, yet too few to claim determinism.
    assert code == 3 and "inconclusive" in output, output


def test_case_outputs_are_whole_answers(tmp_path, server):
    server.behaviour.reasoning_field = "reasoning_content"
    server.behaviour.reasoning_varies = True
    assert _run(tmp_path, server, stream=False)[0] == 1
    code, output = run_cli("cases", "build", tmp_path / "run", "-o", tmp_path / "cases.jsonl")
    assert code == 0, output
    cases = [json.loads(line) for line in (tmp_path / "cases.jsonl").read_text().splitlines()]
    serial = next(c for c in cases if c["params"]["concurrency"] == 1)
    assert len(serial["outputs"]) == 4
    assert all(o["text"].startswith("<reasoning>\n") for o in serial["outputs"])


# --- which field is the answer: decided by the API the probe used ---


def test_a_chat_answer_carrying_text_too_is_read_by_its_message():
    doc = {
        "choices": [
            {"index": 0, "text": "wrong", "message": {"content": "right"}, "finish_reason": "stop"}
        ]
    }
    assert whole(doc).output == "right"
    assert whole(doc, api="completions").output == "wrong"
    chunk = data({"choices": [{"index": 0, "text": "wrong", "delta": {"content": "right"}}]})
    assert stream(chunk, finish()).output == "right"


def test_a_chat_answer_in_completions_shape_alone_is_still_read():
    doc = {"choices": [{"index": 0, "text": "only text", "finish_reason": "stop"}]}
    assert whole(doc).output == "only text"
    chunk = data({"choices": [{"index": 0, "text": "only text"}]})
    assert stream(chunk, finish()).output == "only text"


def test_a_graded_chat_probe_is_graded_by_the_message_whatever_text_the_choice_carries(
    tmp_path, server
):
    server.behaviour.answer_for = lambda prompt, overlap: "Paris"
    server.behaviour.chat_text = "London"  # before: hashed and graded, every answer bad
    probes = [{"id": "p", "prompt": "Capital of France?", "expected": "Paris"}]
    path = write_scenario(tmp_path / "s.toml", server.url, probes=probes, samples=2)
    code, out = run_cli("run", path, "--out", tmp_path / "run", "--quiet", "--fail-on", "bad")
    cells = load_summary(tmp_path / "run")["cells"]
    assert code == 0, out
    assert [(c["graded_good"], c["graded_bad"]) for c in cells] == [(2, 0), (2, 0)]
