"""Incremental Server-Sent Events parser: bytes in as they arrive, complete events out."""

from __future__ import annotations


class SSEError(ValueError):
    """The byte stream is not a readable event stream (for example, not UTF-8)."""


# One finished event: (type, data); the type is "message" unless an ``event:`` field named another.
# A plain tuple, not a NamedTuple: it is built once per streamed token, and a NamedTuple costs more.
Event = tuple[str, str]


class SSEParser:
    """Feed raw chunks in any split; get back each finished event.

    Follows the WHATWG rules that matter for OpenAI-style streams: lines end in LF, CRLF or CR;
    lines starting with ':' are comments (keep-alives); several ``data:`` lines in one event are
    joined with LF; an ``event:`` field names the event's type; an event ends at a blank line (one
    the stream ends without is dropped, so the end of a stream needs no call of its own). Other
    fields (id, retry) are ignored. One deliberate difference from the spec: an event that names a
    type but has no data is still delivered (as the OpenAI SDKs do), because a bare ``event: error``
    still means the stream failed.
    """

    __slots__ = ("_buffer", "_data", "_event", "_pending_cr")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] | None = None
        self._event: str | None = None
        self._pending_cr = False

    def feed(self, chunk: bytes) -> list[Event]:
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._pending_cr = False
        buffer = self._buffer + chunk if self._buffer else chunk
        if b"\r" in buffer:
            # A CR at the very end may be the first half of a CRLF split across reads.
            self._pending_cr = buffer.endswith(b"\r")
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()
        events: list[Event] = []
        for line in lines:
            self._line(line, events)
        return events

    def _line(self, line: bytes, events: list[Event]) -> None:
        if not line:
            if self._data is not None or self._event is not None:
                data = "\n".join(self._data) if self._data is not None else ""
                events.append((self._event or "message", data))
                self._data = None
                self._event = None
            return
        if line[0] == 0x3A:  # ':' comment / keep-alive
            return
        name, sep, value = line.partition(b":")
        if name != b"data" and name != b"event":
            return  # id, retry and unknown fields
        if sep and value.startswith(b" "):
            value = value[1:]
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SSEError(f"event {name.decode()} is not UTF-8: {exc}") from None
        if name == b"event":
            self._event = text
        elif self._data is None:
            self._data = [text]
        else:
            self._data.append(text)
