"""Changing a scenario's keys once written: ``--set KEY=VALUE`` on the TOML tables before they are
read, and one dotted key set on a built scenario through its field's rule (``with_setting``)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import fields, is_dataclass, replace
from typing import Any

from kevload.errors import ScenarioError
from kevload.inputs.fieldrules import Failer, hints, known_keys, read_value, reads_itself
from kevload.inputs.probe import key_of, rule_of
from kevload.inputs.scenariokeys import DEFAULT_LOAD, Load


def apply_override(raw: dict[str, Any], override: str, source: str = "--set") -> None:
    """Apply one ``KEY=VALUE`` (VALUE read as TOML, a bare word taken as a string) to ``raw``: user
    text from the command line, applied before the first validation so it meets the rules a file
    does."""
    key, sep, value_text = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ScenarioError(
            f"--set {override!r}: expected KEY=VALUE, e.g. --set 'load.concurrency=[1,4]'"
        )
    value = toml_value(value_text)
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ScenarioError(f"--set {key}: {part} is not a table")
        node = child
    node[parts[-1]] = value


def toml_value(text: str) -> Any:
    """A value typed on the command line, read as TOML (``4``, ``true``, ``[1, 4]``); a bare word is
    a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def set_path(obj: Any, parts: list[str], value: Any, where: str, fail: Failer) -> Any:
    """``obj`` (a dataclass) with the field at ``parts`` set to ``value`` through its rule."""
    by_key = {key_of(f): f for f in fields(obj)}
    head, rest = parts[0], parts[1:]
    known_keys({head: value}, where, set(by_key), fail)
    f = by_key[head]
    if reads_itself(type(obj)):
        # A ramp is checked as a whole when validated: the kind of its levels depends on ``of``,
        # which may be set too.
        return replace(obj, **{f.name: value})
    # A class is hashable: mypy checks an instance's __hash__ against functools.cache.
    hint, key = hints(type(obj))[f.name], f"{where}.{head}"  # type: ignore[arg-type]
    current = getattr(obj, f.name)
    if rest and is_dataclass(current):
        new = set_path(current, rest, value, key, fail)
    elif rest and (current is None or isinstance(current, dict)):
        new = read_value(
            with_path(current or {}, rest, value, key, fail), hint, rule_of(f), key, fail
        )
    elif rest:
        fail(key, "a table (to set a key inside it)", current)
    else:
        new = read_value(value, hint, rule_of(f), key, fail)
    return replace(obj, **{f.name: new})


def with_path(
    table: Mapping[str, Any], parts: list[str], value: Any, where: str, fail: Failer
) -> dict[str, Any]:
    """A copy of ``table`` with ``value`` at the dotted ``parts`` (tables on the way made or
    copied)."""
    head = parts[0]
    key = f"{where}.{head}" if where else head
    if len(parts) == 1:
        return {**table, head: list(value) if isinstance(value, tuple) else value}
    child = table.get(head, {})
    if not isinstance(child, dict):
        fail(key, "a table (to set a key inside it)", child)
    return {**table, head: with_path(child, parts[1:], value, key, fail)}


def unramped(load: Load) -> Load:
    """The load as it was before ``loadrules`` expanded its ramp: what a changed ramp is expanded
    from again."""
    if load.ramp is None:
        return load
    derived = (
        {"concurrency": DEFAULT_LOAD.concurrency} if load.ramp.of == "concurrency" else {"rate": ()}
    )
    return replace(
        load, **derived, duration=DEFAULT_LOAD.duration if load.ramp.every_s else load.duration
    )
