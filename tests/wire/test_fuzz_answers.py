"""Generated server answers, of every JSON type and split at any byte, never break kevload.

Most examples go straight to the answer's reading (``kevload.wire.answer``: ``read_whole``,
``read_stream``): it returns an outcome for every body, and a stream cut anywhere reads as the same
stream whole. Fewer examples are served whole runs by one in-process server whose answer is set
per example: each ends with an exit code that means what it says (the same answer every time is
never nondeterminism), a final state, a summary.json, and ``kevload report`` equal to it.

/metrics pages and reset answers are decoded in servermetrics.py and prefixcache.py; their
boundaries get the same treatment there (``metrics_pages`` and ``reset_answers`` below are the
strategies to feed them).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from dataclasses import fields, replace

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kevload.wire.answer import Outcome, read_stream, read_whole
from kevload.wire.decoding import COUNT_CAP, LOGPROB_SLACK
from tests.conftest import load_summary, run_cli, write_scenario

STATUSES = {"ok", "malformed", "server_error", "aborted", "truncated"}

# Every JSON type, numbers beyond 64 bits and non-finite ones (json.dumps writes NaN, Infinity)
# included.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
counts = st.integers(min_value=-5, max_value=2**40) | json_values
usages = json_values | st.dictionaries(
    st.sampled_from(
        ["prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"]
    ),
    counts | st.fixed_dictionaries({"cached_tokens": counts}),
    max_size=4,
)
entries = st.fixed_dictionaries(
    {},
    optional={
        "token": st.text(max_size=4) | json_values,
        "logprob": st.floats() | json_values,
        "id": counts,
    },
)
logprobs = (
    json_values
    | st.fixed_dictionaries({"content": st.lists(entries | json_values, max_size=4)})
    | st.fixed_dictionaries(
        {
            "tokens": st.lists(st.text(max_size=3), max_size=4),
            "token_logprobs": st.lists(st.floats() | json_values, max_size=4) | json_values,
        }
    )
)
texts = st.text(max_size=16) | json_values
finish_reasons = st.sampled_from(["stop", "length", "abort", "error", "", None]) | json_values


@st.composite
def choices(draw, stream: bool):
    choice = draw(
        st.fixed_dictionaries(
            {"index": st.just(0) | json_values},
            optional={
                "finish_reason": finish_reasons,
                "logprobs": logprobs,
                "token_ids": st.lists(counts, max_size=3) | json_values,
                "text": texts,
            },
        )
    )
    part = "delta" if stream else "message"
    if draw(st.booleans()):
        choice[part] = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "content": texts,
                    "reasoning_content": texts,
                    "reasoning": texts,
                    "tool_calls": json_values
                    | st.lists(
                        st.fixed_dictionaries(
                            {},
                            optional={
                                "index": json_values,
                                "function": json_values
                                | st.fixed_dictionaries(
                                    {}, optional={"name": texts, "arguments": texts}
                                ),
                            },
                        ),
                        max_size=2,
                    ),
                },
            )
        )
    else:
        choice[part] = draw(json_values)
    return choice


@st.composite
def answers(draw, stream: bool = False):
    """An answer document, near the OpenAI shape (any field may hold any JSON value) or anything at
    all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    return draw(
        st.fixed_dictionaries(
            {"choices": st.lists(choices(stream), max_size=2) | json_values},
            optional={
                "usage": usages,
                "timings": json_values | st.fixed_dictionaries({"cache_n": counts}),
                "system_fingerprint": texts,
                "tokens": st.lists(counts, max_size=3) | json_values,
                "error": json_values,
                "object": st.just("error") | json_values,
            },
        )
    )


def encoded(doc) -> bytes:
    return json.dumps(doc).encode()


@st.composite
def streams(draw):
    """An SSE body: events of answers, garbage, comments, error events, [DONE] or not."""
    events = draw(
        st.lists(
            answers(stream=True).map(lambda d: b"data: " + encoded(d) + b"\n\n")
            | st.binary(max_size=12)
            | st.sampled_from([b": keep-alive\n\n", b"event: error\ndata: x\n\n", b"\r\n"]),
            max_size=6,
        )
    )
    if draw(st.booleans()):
        events.append(b"data: [DONE]\n\n")
    return b"".join(events)


metrics_pages = st.text(max_size=200)  # for servermetrics' parser
reset_answers = st.binary(max_size=200) | json_values.map(encoded)  # for prefixcache's reset


def drive(coroutine):
    """The decoding coroutines await only their body iterator, which never suspends here: run them
    without a loop."""
    try:
        while True:
            coroutine.send(None)
    except StopIteration as stop:
        return stop.value


def check(outcome: Outcome) -> None:
    """What every outcome holds, whatever the server sent."""
    assert isinstance(outcome, Outcome)
    assert outcome.status in STATUSES, outcome
    for count in (outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens):
        assert count is None or (type(count) is int and 0 <= count < COUNT_CAP), outcome
    assert outcome.completion_tokens is None or outcome.completion_tokens <= 64
    for token in outcome.token_ids or ():
        assert type(token) is int and 0 <= token < COUNT_CAP
    for value in outcome.logprobs or ():
        assert value is None or (
            type(value) is float and (value <= LOGPROB_SLACK or not math.isfinite(value))
        )
    assert outcome.system_fingerprint is None or isinstance(outcome.system_fingerprint, str)
    assert outcome.finish_reason is None or isinstance(outcome.finish_reason, str)
    assert all(isinstance(f, str) and len(f) < 300 for f in outcome.findings or ())
    if outcome.status == "ok":
        assert isinstance(outcome.output, str)


def _timeless(outcome: Outcome) -> Outcome:
    return replace(
        outcome,
        **{f.name: None for f in fields(Outcome) if f.name.startswith("t_") or f.name == "max_gap"},
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=answers(), api=st.sampled_from(["chat", "completions"]))
def test_every_whole_answer_decodes_to_an_outcome(doc, api):
    check(drive(read_whole(encoded(doc), "application/json", api, 0.0, 0.0, token_limit=64)))


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=64))
def test_every_body_of_bytes_decodes_to_an_outcome(raw):
    check(drive(read_whole(raw, "application/json", "chat", 0.0, 0.0, token_limit=64)))


async def _read(body: bytes, cuts: list[int], api: str) -> Outcome:
    bounds = [0, *sorted(set(cuts)), len(body)]

    async def pieces():
        for start, end in zip(bounds, bounds[1:], strict=False):
            if end > start:
                yield body[start:end]

    async def rest():
        return b""

    return await read_stream(pieces(), rest, "text/event-stream", api, 0.0, 0.0, token_limit=64)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), api=st.sampled_from(["chat", "completions"]))
def test_a_stream_split_at_any_byte_reads_as_the_stream_whole(data, api):
    body = data.draw(streams())
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=8))
    whole = drive(_read(body, [], api))
    split = drive(_read(body, cuts, api))
    check(whole)
    assert _timeless(split) == _timeless(whole)


# --- whole runs against one in-process server, its answer set per example ---


class _Server:
    """Serves ``answer`` (body bytes, content type) to every completion request, on 127.0.0.1."""

    def __init__(self) -> None:
        self.answer = (b"", "application/json")
        self.loop = asyncio.new_event_loop()
        self.port = 0

    async def _handle(self, request: web.Request) -> web.Response:
        await request.read()
        body, content_type = self.answer
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    def __enter__(self) -> _Server:
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self._start())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        assert started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def served():
    with _Server() as server:
        yield server


@st.composite
def served_answers(draw):
    """Half of them a good answer but for its usage (any JSON value in any count), half anything."""
    stream = draw(st.booleans())
    if draw(st.booleans()):
        usage = draw(
            usages
            | st.fixed_dictionaries({"prompt_tokens": counts, "completion_tokens": json_values})
        )
        if not stream:
            return (
                False,
                encoded(
                    {
                        "choices": [
                            {"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}
                        ],
                        "usage": usage,
                    }
                ),
                "application/json",
            )
        events = [
            {"choices": [{"index": 0, "delta": {"content": "hi"}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": usage},
        ]
        return (
            True,
            b"".join(b"data: " + encoded(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n",
            "text/event-stream",
        )
    if stream:
        return True, draw(streams()), "text/event-stream"
    return (
        False,
        encoded(draw(answers())),
        draw(st.sampled_from(["application/json"] * 4 + ["text/html"])),
    )


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(answer=served_answers())
def test_a_run_against_any_answer_ends_with_a_summary_the_report_repeats(
    served, tmp_path_factory, answer
):
    stream, body, content_type = answer
    served.answer = (body, content_type)
    tmp = tmp_path_factory.mktemp("fuzz")
    scenario = write_scenario(
        tmp / "s.toml",
        f"http://127.0.0.1:{served.port}/v1",
        concurrency=[1],
        samples=2,
        stream=stream,
        logprobs=False,
    )
    code, output = run_cli("run", scenario, "--out", tmp / "run", "--quiet")
    # The same answer every time is no nondeterminism: held (0) or the target failed (3), nothing
    # else.
    assert code in (0, 3), output
    assert json.loads((tmp / "run" / "run.json").read_text())["state"] != "running"
    summary = load_summary(tmp / "run")
    code, report = run_cli("report", tmp / "run", "--format", "json")
    assert code in (0, 3) and json.loads(report) == summary, report[-400:]
