"""SSE edge cases: events split anywhere, CRLF, multi-line data, comments, event types, [DONE]."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kevload.wire.sse import SSEError, SSEParser

STREAM = (
    b": keep-alive\r\n\r\n"
    b'data: {"a": 1}\r\n\r\n'
    b"event: message\nid: 7\ndata: line one\ndata: line two\n\n"
    b"data:no-space\r\r"
    b'event: error\r\ndata: {"error": "boom"}\r\n\r\n'
    b"event:error\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    ("message", '{"a": 1}'),
    ("message", "line one\nline two"),
    ("message", "no-space"),
    ("error", '{"error": "boom"}'),
    ("error", ""),
    ("message", "[DONE]"),
]


def feed_all(chunks):
    parser = SSEParser()
    events = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events  # an event not closed by a blank line at the end is dropped, as the spec says


def test_whole_stream():
    assert feed_all([STREAM]) == EXPECTED


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13])
def test_split_into_fixed_reads(size):
    chunks = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    assert feed_all(chunks) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=20))
def test_split_anywhere(cuts):
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert feed_all(chunks) == EXPECTED


def test_unterminated_event_is_dropped():
    assert feed_all([b'data: {"partial": true}']) == []


def test_comment_only_stream_has_no_events():
    assert feed_all([b": ping\n\n: ping\n\n"]) == []


@given(st.lists(st.binary(max_size=64), max_size=10))
def test_never_crashes_except_with_its_own_error(chunks):
    try:
        events = feed_all(chunks)
    except SSEError:
        return
    assert all(isinstance(name, str) and isinstance(data, str) for name, data in events)


def test_event_type_belongs_to_its_event_only():
    events = feed_all([b"event: error\ndata: x\n\ndata: y\n\n"])
    assert events == [("error", "x"), ("message", "y")]


def test_empty_event_field_means_message():
    assert feed_all([b"event:\ndata: z\n\n"]) == [("message", "z")]
