"""MkDocs hook: the scenario keys' reference (docs/reference/scenario.md), rendered at build time
from the scenario dataclasses' own fields, their types and the rules in their metadata, so the page
cannot drift from what `kevload run` accepts; and `kevload run`'s exit codes in docs/nightly.md,
from kevload.exits.RUN_EXITS."""

from __future__ import annotations

import importlib
import inspect
import json
import math
import re
import types
from dataclasses import MISSING, Field, fields, is_dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

# The one place the scenario's modules are named: the tables below are reached from them, the field
# rules (key_of, rule_of) from the probe's.
KEYS_MODULE = "kevload.inputs.scenariokeys"
RULES_MODULE = "kevload.inputs.probe"
MARKER = "<!-- scenario-keys -->"
# The TOML tables, in the order a scenario file writes them; a dataclass inside one is a table of
# its own.
TABLES = (
    ("target", KEYS_MODULE, "Target"),
    ("[[probes]]", RULES_MODULE, "Probe"),
    ("load", KEYS_MODULE, "Load"),
)


# `kevload run`'s exit codes, in kevload.exits.RUN_EXITS' words (the README's table holds the
# same).
RUN_EXITS_MARKER = "<!-- run-exit-codes -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    if RUN_EXITS_MARKER in markdown:
        markdown = markdown.replace(RUN_EXITS_MARKER, run_exits())
    return markdown.replace(MARKER, scenario_keys()) if MARKER in markdown else markdown


def run_exits() -> str:
    exits = importlib.import_module("kevload.exits").RUN_EXITS
    return "\n".join(f"- `{int(code)}`: {words}" for code, words in exits.items())


def scenario_keys() -> str:
    rules = importlib.import_module(RULES_MODULE)
    return "\n".join(
        _table(name, getattr(importlib.import_module(module), cls), rules)
        for name, module, cls in TABLES
    )


def _table(name: str, cls: type, module: types.ModuleType, note: str = "") -> str:
    hints, notes = get_type_hints(cls), _comments(cls)
    rows, nested = [], []
    for f in fields(cls):
        inner = _unwrap(hints[f.name])
        if is_dataclass(inner):  # load.slo, load.ramp: a table of their own, after this one
            nested.append(
                _table(f"{name}.{module.key_of(f)}", inner, module, notes.get(f.name, ""))
            )
            continue
        rule = module.rule_of(f)
        rows.append(
            f"| `{module.key_of(f)}` | {_type(hints[f.name])} | {_default(f)} | {_bounds(rule)} | "
            f"{_cell(rule.expected)} | {_cell(notes.get(f.name, ''))} |"
        )
    head = [
        f"## `{name}`",
        "",
        *([note, ""] if note else []),
        "| key | type | default | bounds | accepted (the error's words) | note |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    return "\n".join([*head, *rows, "", *nested])


def _unwrap(hint: Any) -> Any:
    """``X | None`` as X."""
    if get_origin(hint) in (Union, types.UnionType):
        rest = [a for a in get_args(hint) if a is not type(None)]
        return rest[0] if len(rest) == 1 else hint
    return hint


_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", Any: "any"}


def _type(hint: Any) -> str:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return " · ".join(f"`{json.dumps(a)}`" for a in args)
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return " or ".join(_type(a) for a in rest) + (", optional" if len(rest) < len(args) else "")
    if origin is tuple:
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"table of {_type(args[1])}"
    return _NAMES.get(hint, getattr(hint, "__name__", str(hint)))


def _default(f: Field) -> str:
    if f.default is MISSING and f.default_factory is MISSING:
        return "required"
    value = f.default if f.default is not MISSING else f.default_factory()
    if value is None:
        return "none"
    return f"`{json.dumps(list(value) if isinstance(value, tuple) else value)}`"


def _bounds(rule: Any) -> str:
    said = [
        f"{sign} {_number(v)}"
        for sign, v in (("≥", rule.min), (">", rule.above), ("≤", rule.max), ("<", rule.below))
        if v is not None and not math.isinf(v)
    ]
    return ", ".join((["non-empty"] if rule.nonempty else []) + said)


def _number(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:g}"


def _comments(cls: type) -> dict[str, str]:
    """Each field's comment in the source: the comment lines just above it and the one after it on
    its line."""
    notes, above = {}, []
    for line in inspect.getsource(cls).splitlines():
        if line.strip().startswith("#"):
            above.append(line.strip().lstrip("#").strip())
        elif m := re.match(r"    (\w+): ", line):
            after = line.split("  # ", 1)[1].strip() if "  # " in line else ""
            notes[m.group(1)] = " ".join(above + [after]).strip()
            above = []
        else:
            above = []
    return notes


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
