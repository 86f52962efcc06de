"""The field-rule reader: a frozen dataclass built from its TOML table, or one built in code
checked, by its fields' types and rules (``probe.Rule``); every error one line naming the key."""

from __future__ import annotations

import difflib
import functools
import types
from collections.abc import Mapping
from dataclasses import MISSING, fields, is_dataclass, replace
from typing import (
    Any,
    Literal,
    NoReturn,
    Protocol,
    TypeGuard,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from kevload.errors import ScenarioError
from kevload.inputs.probe import Rule, key_of, rule_of
from kevload.inputs.wordsets import shortened


class Failer:
    """Raises the one-line error: ``<source>: <key>: expected <what>, got <value>``."""

    def __init__(self, source: str):
        self.source = source

    def __call__(self, key: str, expected: str, got: Any) -> NoReturn:
        raise ScenarioError(f"{self.source}: {key}: expected {expected}, got {shown(got)}")


def read_table(cls: type, table: Mapping[str, Any], *, where: str, source: str) -> Any:
    """One dataclass from its TOML table by its field rules (a case file's [load] table, for
    one)."""
    return build(cls, table, where, Failer(source))


def known_keys(table: Mapping[str, Any], where: str, allowed: set[str], fail: Failer) -> None:
    for key in table:
        if key not in allowed:
            full = f"{where}.{key}" if where else key
            hint = difflib.get_close_matches(key, sorted(allowed), n=1)
            maybe = f" (did you mean {hint[0]}?)" if hint else ""
            raise ScenarioError(
                f"{fail.source}: {full}: unknown key{maybe}; expected one of "
                f"{', '.join(sorted(allowed))}"
            )


def subtable(
    raw: Mapping[str, Any], key: str, fail: Failer, required: bool = False
) -> dict[str, Any]:
    value = raw.get(key)
    if value is None:
        if required:
            fail(key, f"a [{key}] table", None)
        return {}
    if not isinstance(value, dict):
        fail(key, f"a [{key}] table", value)
    return value


class ReadsItself(Protocol):
    """A dataclass whose fields are checked together, not one by one (``Ramp``)."""

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str, fail: Failer) -> Any: ...


def reads_itself(cls: type) -> TypeGuard[type[ReadsItself]]:
    """``cls`` checks its fields together, in its ``from_table(table, where, fail)``."""
    return hasattr(cls, "from_table")


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def build(cls: type, table: Mapping[str, Any], where: str, fail: Failer) -> Any:
    """``cls`` from a TOML table: keys known, required ones given, each value through its field's
    rule."""
    if reads_itself(cls):
        return cls.from_table(table, where, fail)
    by_key = {key_of(f): f for f in fields(cls)}
    known_keys(table, where, set(by_key), fail)
    values = {}
    for key, f in by_key.items():
        if key in table:
            values[f.name] = read_value(
                table[key], hints(cls)[f.name], rule_of(f), f"{where}.{key}", fail
            )
        elif f.default is MISSING and f.default_factory is MISSING:
            fail(f"{where}.{key}", rule_of(f).expected or _kind(hints(cls)[f.name]), None)
    return cls(**values)


def recheck(obj: Any, where: str, fail: Failer) -> Any:
    """``obj`` (built in code or read) with each field through its rule again: the same checks a
    file gets, and the same normal form (tuples, floats)."""
    if reads_itself(type(obj)):
        return obj.from_table({key_of(f): getattr(obj, f.name) for f in fields(obj)}, where, fail)
    return replace(
        obj,
        **{
            f.name: read_value(
                getattr(obj, f.name),
                # A class is hashable: mypy checks an instance's __hash__ against functools.cache.
                hints(type(obj))[f.name],  # type: ignore[arg-type]
                rule_of(f),
                f"{where}.{key_of(f)}",
                fail,
            )
            for f in fields(obj)
        },
    )


_BAD = object()


def read_value(value: Any, hint: Any, rule: Rule, key: str, fail: Failer) -> Any:
    """One value checked and converted by its type and rule; a failure names ``key``."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):  # X | None: the only unions the scenario's fields use
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = get_origin(hint), get_args(hint)
    expected = rule.expected or _kind(hint)
    if origin is Literal:
        # True == 1, so the kind is compared as well: 1 is not the word true.
        if not any(value == word and type(value) is type(word) for word in args):
            words = [w for w in args if isinstance(w, str)]
            close = difflib.get_close_matches(value, words, n=1) if isinstance(value, str) else []
            fail(key, expected + (f" (did you mean {close[0]}?)" if close else ""), value)
        return value
    if isinstance(hint, type) and is_dataclass(hint):
        if isinstance(value, hint):
            return recheck(value, key, fail)
        if not isinstance(value, dict):
            fail(key, rule.expected or "a table", value)
        return build(hint, value, key, fail)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            fail(key, expected, value)
        items = tuple(_scalar(x, args[0]) for x in value)
        if _BAD in items or not rule.holds(items):
            fail(key, expected, list(value) if isinstance(value, tuple) else value)
        return items
    converted = _scalar(value, hint)
    if converted is _BAD or not rule.holds(converted):
        fail(key, expected, value if converted is _BAD else converted)
    return converted


def _scalar(value: Any, hint: Any) -> Any:
    """``value`` as a ``hint`` (bool, int, float, str, dict[str, X]), or ``_BAD``; an int is a float
    too."""
    if (
        hint is Any
        # a probe's expected answer: any TOML value, checked by its grader's rule
        # (kevload.inputs.grading)
    ):
        return value
    if hint is bool:
        return value if isinstance(value, bool) else _BAD
    if isinstance(value, bool):
        return _BAD  # TOML's true is no number and no string
    if hint is float:
        return float(value) if isinstance(value, int | float) else _BAD
    if hint is int or hint is str:
        return value if isinstance(value, hint) else _BAD
    if isinstance(hint, type) and is_dataclass(
        hint
    ):  # an item of a list of tables, read into its dataclass before (a conversation's turns)
        return value if isinstance(value, hint) else _BAD
    if get_origin(hint) is dict:
        of = get_args(hint)[1]
        ok = isinstance(value, dict) and (
            of is Any or all(isinstance(x, of) for x in value.values())
        )
        return dict(value) if ok else _BAD
    raise TypeError(f"no rule reads a {hint}")  # a new field of a new type: teach _scalar first


def _kind(hint: Any) -> str:
    """A field's kind in the words of a message, for fields whose rule gives none."""
    if get_origin(hint) is Literal:
        return "one of " + ", ".join(str(w) for w in get_args(hint))
    if get_origin(hint) is tuple:
        return {int: "a list of integers", float: "a list of numbers"}.get(
            get_args(hint)[0], "a list"
        )
    if get_origin(hint) is dict or is_dataclass(hint):
        return "a table"
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean (true/false)"}[
        hint
    ]


def as_table(obj: Any) -> dict[str, Any]:
    """The fields of ``obj`` that differ from their defaults, under their TOML keys, as TOML
    values."""
    out = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if value != default or default is MISSING:
            out[key_of(f)] = (
                as_table(value)
                if is_dataclass(value)
                else [
                    dict(x) if isinstance(x, dict) else as_table(x) if is_dataclass(x) else x
                    for x in value
                ]
                if isinstance(value, tuple)
                else value
            )
    return out


def shown(value: Any) -> str:
    """A value as an error message quotes it: its repr, at most 80 characters; None as "nothing"."""
    if value is None:
        return "nothing"
    return shortened(repr(value), 80, "...")
