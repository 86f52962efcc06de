"""The scenario's rules come from its dataclass fields: every field is checked the same way in a
file, through ``Scenario.with_setting`` and in a scenario built in code, and the cases below are
generated from the fields, so a new field with a rule is covered without a new test."""

from __future__ import annotations

import ast
import json
import math
import types
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest

import kevload.servers.sweep
from kevload.inputs.probe import Probe, key_of, rule_of
from kevload.inputs.scenario import (
    ScenarioError,
    build_scenario,
    load_scenario,
    scenario_from_dict,
    validate,
)
from kevload.inputs.scenariokeys import Load, Ramp, Slo, Target
from tests.conftest import run_cli, write_scenario

# Where each dataclass's table sits in a scenario file. The base has a ramp and a stream, so every
# table exists and every single bad value below is the only thing wrong.
WHERE = {
    Target: ("target",),
    Probe: ("probes", 0),
    Slo: ("load", "slo"),
    Ramp: ("load", "ramp"),
    Load: ("load",),
}
BASE = {
    "target": {"base_url": "http://127.0.0.1:9/v1", "model": "m"},
    "load": {"stream": True, "ramp": {"from": 1, "to": 4, "step": 1}},
    "probes": [{"id": "a", "prompt": "x"}],
}


def _at(cls: type, key: str, value: Any) -> dict[str, Any]:
    """BASE with ``value`` at ``key`` of ``cls``'s table."""
    raw = json.loads(json.dumps(BASE))
    node = raw
    for part in WHERE[cls]:
        node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
    node[key] = value
    return raw


def _dotted(cls: type, key: str) -> str:
    return (
        "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in WHERE[cls]).lstrip(".")
        + f".{key}"
    )


def _bare(hint: Any) -> Any:
    if get_origin(hint) in (Union, types.UnionType):
        (hint,) = [a for a in get_args(hint) if a is not type(None)]
    return hint


def _fields(kind) -> list[tuple[type, Any, Any]]:
    return [
        (cls, f, _bare(get_type_hints(cls)[f.name]))
        for cls in WHERE
        for f in fields(cls)
        if kind(f, cls)
    ]


def _file_error(raw: dict[str, Any]) -> str:
    with pytest.raises(ScenarioError) as caught:
        scenario_from_dict(raw, source="t.toml")
    return str(caught.value)


def _code_error(cls: type, key: str, value: Any) -> str:
    """The same value set on a valid scenario in code: the setter, or (probes are no setting) a
    replaced probe."""
    good = scenario_from_dict(json.loads(json.dumps(BASE)), source="t.toml")
    with pytest.raises(ScenarioError) as caught:
        if cls is Probe:
            field_name = next(f.name for f in fields(Probe) if key_of(f) == key)
            validate(replace(good, probes=(replace(good.probes[0], **{field_name: value}),)))
        else:
            good.with_setting(_dotted(cls, key), value)
    return str(caught.value)


LITERALS = _fields(lambda f, cls: get_origin(_bare(get_type_hints(cls)[f.name])) is Literal)


def test_the_closed_word_sets_are_literal_fields():
    assert {_dotted(cls, key_of(f)) for cls, f, _ in LITERALS} >= {
        "target.api",
        "load.mode",
        "load.arrival",
        "load.logprobs",
        "load.ramp.of",
    }


@pytest.mark.parametrize(
    ("cls", "f", "hint"), LITERALS, ids=[_dotted(c, key_of(f)) for c, f, _ in LITERALS]
)
def test_a_word_outside_a_literal_names_the_key_and_the_words(cls, f, hint):
    key = _dotted(cls, key_of(f))
    message = _file_error(_at(cls, key_of(f), "bogus"))
    assert message.startswith(f"t.toml: {key}: expected ") and message.endswith("got 'bogus'"), (
        message
    )
    for word in get_args(hint):  # each allowed word, spelled as TOML spells it
        assert (json.dumps(word) if isinstance(word, bool) else word) in message, (word, message)
    assert len(message.splitlines()) == 1
    assert _code_error(cls, key_of(f), "bogus") == message


def _outside(f, hint) -> list[Any]:
    """Values just outside the field's bounds (for a list, one bad item), and an empty one where one
    is refused."""
    rule, whole = rule_of(f), (get_args(hint)[0] if get_origin(hint) is tuple else hint) is int
    values = []
    if rule.min is not None:
        values.append(rule.min - (1 if whole else 0.5))
    if rule.above is not None:
        values.append(rule.above)
    if rule.max is not None:
        values.append(rule.max + (1 if whole else 0.5))
    if rule.below is not None:
        values.append(rule.below)
    if not whole and any(
        bound is not None for bound in (rule.min, rule.above, rule.max, rule.below)
    ):
        values.append(math.nan)  # fails every comparison, so every bound refuses it
        if rule.max is not None:
            values.append(math.inf)
    values = [[v] for v in values] if get_origin(hint) is tuple else values
    if rule.nonempty:
        values.append([] if get_origin(hint) is tuple else "")
    return values


BOUNDED = [
    (cls, f, value) for cls, f, hint in _fields(lambda f, cls: True) for value in _outside(f, hint)
]


def test_the_bounds_are_field_metadata():
    assert {_dotted(cls, key_of(f)) for cls, f, _ in BOUNDED} >= {
        "load.concurrency",
        "load.samples",
        "load.max_error_share",
        "load.workers",
        "load.until_bound",
        "load.slo.e2e_ms",
        "load.ramp.factor",
        "target.timeout",
        "probes[0].max_tokens",
        "probes[0].id",
    }


# Numbers whose upper bound is not in their field's rule, and where it is checked instead.
CHECKED_ELSEWHERE = {
    "load.ramp.from",
    "load.ramp.to",
    "load.ramp.step",
}  # _ramp: by the kind of level they are


def test_every_number_has_an_upper_bound():
    """A number without one can ask for anything: 10⁸ slots, a needle of a terabyte, a seed JSON
    cannot hold."""
    numbers = [
        (cls, f)
        for cls, f, hint in _fields(lambda f, cls: True)
        if (get_args(hint)[0] if get_origin(hint) is tuple else hint) in (int, float)
    ]
    unbounded = {
        _dotted(cls, key_of(f))
        for cls, f in numbers
        if rule_of(f).max is None and rule_of(f).below is None
    }
    assert unbounded == CHECKED_ELSEWHERE


@pytest.mark.parametrize(
    ("cls", "f", "value"), BOUNDED, ids=[f"{_dotted(c, key_of(f))}={v!r}" for c, f, v in BOUNDED]
)
def test_a_value_outside_its_bounds_names_key_and_expectation(cls, f, value):
    key = _dotted(cls, key_of(f))
    message = _file_error(_at(cls, key_of(f), value))
    assert message.startswith(f"t.toml: {key}: expected {rule_of(f).expected}, got "), message
    assert _code_error(cls, key_of(f), value) == message


UNKNOWN = [(cls, key_of(f)) for cls in WHERE for f in fields(cls)]


@pytest.mark.parametrize(("cls", "key"), UNKNOWN, ids=[_dotted(c, k) for c, k in UNKNOWN])
def test_a_misspelt_key_gets_did_you_mean(cls, key):
    dotted = _dotted(cls, key)
    message = _file_error(_at(cls, key + "x", 1))
    assert message.startswith(f"t.toml: {dotted}x: unknown key (did you mean {key}?)"), message
    if cls is not Probe:
        assert _code_error(cls, key + "x", 1) == message


def test_a_wrong_kind_is_the_same_message_from_file_and_code():
    for key, value in (
        ("load.samples", "eight"),
        ("load.stream", 3),
        ("load.rate", [True]),
        ("target.headers", {"X": 1}),
        ("load.slo", 500),
    ):
        table, name = key.rsplit(".", 1)
        cls = Target if table == "target" else Load
        message = _file_error(_at(cls, name, value))
        assert message.startswith(f"t.toml: {key}: expected "), message
        assert _code_error(cls, name, value) == message


def test_a_rule_between_fields_holds_for_code_too():
    good = scenario_from_dict(json.loads(json.dumps(BASE)), source="t.toml")
    with pytest.raises(
        ScenarioError, match=r"^t\.toml: load\.ramp and load\.concurrency: give one of them"
    ):
        good.with_setting("load.concurrency", [2, 8])
    with pytest.raises(
        ScenarioError,
        match=r"^--grid: load\.until_bound: expected levels that end on their samples",
    ):
        good.with_settings({"load.ramp.every_s": 5, "load.until_bound": 0.05}, source="--grid")
    # A changed ramp is expanded again; keys that only make sense together may be set together.
    wider = good.with_settings({"load.ramp.from": 8, "load.ramp.to": 32, "load.ramp.step": 8})
    assert wider.load.concurrency == (8, 16, 24, 32) and wider.raw["load"]["ramp"]["to"] == 32
    with pytest.raises(
        ScenarioError, match=r"^code: load\.workers: expected an integer from 1 to 1,024"
    ):
        build_scenario(
            Target("http://127.0.0.1:9/v1", "m"), [Probe("a", "x")], load=Load(workers=0)
        )


def test_a_scenario_built_in_code_reads_back_from_its_raw_table():
    # run.json keeps ``raw``; --resume reads it back: it must give the same scenario.
    built = build_scenario(
        Target("http://127.0.0.1:9/v1", "m", api="completions", timeout=5, headers={"X-Env": "a"}),
        [
            Probe("p", prompt="hi", max_tokens=9),
            Probe("c", messages=[{"role": "user", "content": "yo"}]),
        ],
        load=Load(
            mode="prefix",
            stream=True,
            slo=Slo(ttft_ms=100),
            min_slo_attainment=0.9,
            logprobs=False,
            ramp=Ramp("rate", 1, 8, factor=2, every_s=3),
            arrival="poisson",
        ),
        params={"seed": 1},
        name="n",
        source="s",
    )
    assert built.load.rate == (1.0, 2.0, 4.0, 8.0) and built.load.duration == 3.0
    assert built.probes[1].messages == ({"role": "user", "content": "yo"},)
    assert scenario_from_dict(json.loads(json.dumps(built.raw)), source="s", name="n") == built


def test_sweep_settings_equal_the_same_values_written_in_the_file(tmp_path, server, monkeypatch):
    (tmp_path / "prompts.jsonl").write_text(
        "".join(
            json.dumps({"id": f"q{i}", "prompt": f"Question number {i}?"}) + "\n" for i in range(12)
        )
    )
    probes = [{"dataset": "prompts.jsonl", "count": 2}]
    path = write_scenario(
        tmp_path / "s.toml", server.url, probes=probes, concurrency=[1], samples=2
    )
    seen = []
    real = kevload.servers.sweep.run_scenario

    async def recording(scenario, run_dir, **kwargs):
        seen.append(scenario)
        return await real(scenario, run_dir, **kwargs)

    monkeypatch.setattr(kevload.servers.sweep, "run_scenario", recording)
    code, output = run_cli(
        "sweep",
        path,
        "--grid",
        "load.dataset_seed=3,4",
        "--grid",
        "params.seed=7",
        "--grid",
        "load.slo.e2e_ms=60000",
        "--grid",
        "load.mode=single,mixed",
        "--out",
        tmp_path / "sweep",
    )
    assert code == 0, output
    assert len(seen) == 4
    # The dataset's lines depend on the seed: each setting read them again, as loading its file
    # does.
    assert {p.id for p in seen[0].probes} != {p.id for p in seen[2].probes}
    for scenario, (seed, mode) in zip(
        seen, [(3, "single"), (3, "mixed"), (4, "single"), (4, "mixed")], strict=True
    ):
        write_scenario(
            path,
            server.url,
            probes=probes,
            params={"temperature": 0, "seed": 7},
            concurrency=[1],
            samples=2,
            dataset_seed=seed,
            slo={"e2e_ms": 60000},
            mode=mode,
        )
        assert scenario == load_scenario(path)


# Calls that build a scenario from TOML text or a raw table, and where each may be made: the user's
# file and
# --set text (load.invocation, for `kevload run`), a resumed run's table from run.json with the
# user's --set text
# (resuming.resumed_scenario), the
# sweep's and demo's one read of their scenario file, the grid's values (user text).
# demo/steps.py reads two files: the demo scenario and the graded set's (scenarios/graded.toml);
# overrides.py reads one --set value as TOML (toml_value); rollout.py, a comparison's one read of
# its scenario file.
ALLOWED = {
    "load_scenario": {"invocation.py": 1, "sweep.py": 1, "steps.py": 2, "rollout.py": 1},
    "scenario_from_dict": {"resuming.py": 1},
    "apply_override": {"resuming.py": 1},
    "tomllib.loads": {"sweep.py": 1, "overrides.py": 1},
}


def test_no_module_formats_toml_to_build_a_scenario():
    """Scenarios in code are built from objects: a file is read once, settings go through
    with_settings."""
    found: dict[tuple[str, str], int] = {}
    for path in sorted((Path(__file__).parents[2] / "kevload").rglob("*.py")):
        if path.name == "scenario.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name in ALLOWED:
                    found[name, path.name] = found.get((name, path.name), 0) + 1
                    if name == "load_scenario" and path.name != "invocation.py":
                        # One argument, or the user's own --set list: no override text made here.
                        assert len(node.args) == 1 or isinstance(node.args[1], ast.Name), (
                            path.name,
                            ast.unparse(node),
                        )
    over = {k: n for k, n in found.items() if n > ALLOWED[k[0]].get(k[1], 0)}
    assert over == {}
