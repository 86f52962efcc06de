"""How every output escapes what it cannot show as it is.

Probe ids, scenario names and a server's outputs may hold any character JSON and TOML carry. Control characters
(C0 but tab and newline, DEL, C1) act on a terminal (ESC starts a sequence) and mean nothing in a report, so every
output spells them as their JSON escape, ``\\u001b``; XML 1.0 forbids most of C0 even escaped, and its parsers
refuse U+FFFE, U+FFFF and lone surrogates too."""

from __future__ import annotations

import re

_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _spelled(match: re.Match[str]) -> str:
    return f"\\u{ord(match[0]):04x}"


def visible(text: str) -> str:
    """``text`` with each control character but tab and newline spelled as its JSON escape (``\\u001b``)."""
    return _CONTROLS.sub(_spelled, text)


def xml_text(text: str) -> str:
    """``text`` with each character XML 1.0 cannot carry, even as a character reference, spelled ``\\u0001``
    (the ``<``, ``&`` and quotes that it can carry are the XML writer's to escape)."""
    return _NOT_XML.sub(_spelled, text)
