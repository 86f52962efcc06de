"""How every output escapes what it cannot show as it is.

Probe ids, scenario names and a server's outputs may hold any character JSON and TOML carry. Control
characters (C0 but tab and newline, DEL, C1) act on a terminal (ESC starts a sequence) and mean
nothing in a report, so every output spells them as their JSON escape, ``\\u001b``; XML 1.0 forbids
most of C0 even escaped, and its parsers refuse U+FFFE, U+FFFF and lone surrogates too. A Markdown
table cell escapes what would end it or pass through as HTML (``markdown_cell``)."""

from __future__ import annotations

import re

_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _spelled(match: re.Match[str]) -> str:
    return f"\\u{ord(match[0]):04x}"


def visible(text: str) -> str:
    """``text`` with each control character but tab and newline spelled as its JSON escape
    (``\\u001b``)."""
    return _CONTROLS.sub(_spelled, text)


def xml_text(text: str) -> str:
    """``text`` with each character XML 1.0 cannot carry, even as a character reference, spelled
    ``\\u0001`` (the ``<``, ``&`` and quotes that it can carry are the XML writer's to escape)."""
    return _NOT_XML.sub(_spelled, text)


_MARKDOWN = re.compile(r"[\\|<&\r\n]")


_MARKDOWN_SPELLED = {
    "\\": "\\\\",
    "|": "\\|",
    "<": "&lt;",
    "&": "&amp;",
    "\r": "\\u000d",
    "\n": "\\u000a",
}


# A code span as CommonMark reads one: a run of backticks, and the next run of the same length.
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)


_IN_CODE = re.compile(r"[|\r\n]")


def markdown_cell(text: str) -> str:
    """``text`` as one cell of a Markdown table (or one line of a list): a ``|`` would end the cell
    and a line break the row, so they are escaped, as are ``\\`` (which would escape what follows)
    and ``<`` and ``&`` (raw HTML and entities, which a Markdown renderer passes through); control
    characters spelled as in ``visible``. Inside a code span only ``|`` and line breaks are: there
    ``&lt;`` would show as written, not as ``<``."""
    spelled, end = [], 0
    # A span holding a backslash is escaped whole, as before: in a code span "\\" shows as written,
    # and a backslash before an escaped "|" would turn it back into the cell's end.
    for span in (m for m in _CODE_SPAN.finditer(text) if "\\" not in m[0]):
        spelled.append(_MARKDOWN.sub(lambda m: _MARKDOWN_SPELLED[m[0]], text[end : span.start()]))
        spelled.append(_IN_CODE.sub(lambda m: _MARKDOWN_SPELLED[m[0]], span[0]))
        end = span.end()
    spelled.append(_MARKDOWN.sub(lambda m: _MARKDOWN_SPELLED[m[0]], text[end:]))
    return visible("".join(spelled))
