"""Scenarios: what a run sends, read from TOML or built in code, validated once: ``Scenario`` and
the ways to one.

A scenario's keys are frozen dataclasses whose fields carry their own rules
(``kevload.inputs.scenariokeys``), read from their TOML tables by one generic reader
(``kevload.inputs.fieldrules``: unknown keys with did-you-mean, wrong kind, word not allowed, out of
bounds). ``validate`` applies the same field rules to every object plus the rules between fields
(``loadrules``, ``probetables``, ``urls``), for a file and for a scenario built in code alike;
``Scenario.with_setting`` changes one dotted key the same way (``overrides``). Every error is one
line naming the source, the key and what was expected.
"""

from __future__ import annotations

import copy
import math
import os
import tomllib
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kevload.errors import ScenarioError
from kevload.inputs.datasets import Dataset
from kevload.inputs.fieldrules import Failer, as_table, build, known_keys, recheck, subtable
from kevload.inputs.loadrules import checked_load, conversation_rules, fits_trace
from kevload.inputs.overrides import apply_override, set_path, unramped, with_path
from kevload.inputs.probe import Probe
from kevload.inputs.probetables import checked_probes, probes_and_datasets
from kevload.inputs.scenariokeys import DEFAULT_LOAD, REQUEST_ID_HEADER, Load, Target
from kevload.inputs.trace import trace_of
from kevload.inputs.urls import BASE_URL_EXPECTED, check_metrics_url, check_url

# Load keys that decide which lines the JSONL datasets contribute: setting one reads the files
# again.
DATASET_KEYS = frozenset(
    {
        "load.mode",
        "load.companions",
        "load.companion_count",
        "load.dataset_seed",
        "load.trace",
        "load.trace_format",
        "load.trace_max_requests",
        "load.trace_block_tokens",
        "load.trace_window_s",
        "load.trace_tokenizer",
    }
)


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str
    target: Target
    probes: tuple[Probe, ...]
    params: dict[str, Any]
    load: Load
    raw: dict[
        str, Any
    ]  # the tables as written (settings applied): run.json keeps it, --resume reads it again
    datasets: tuple[
        Dataset, ...
    ] = ()  # JSONL files read for probes and companions: hashes, seed, lines chosen

    def api_key(self) -> str | None:
        """The key from the environment; only ever held in memory."""
        if self.target.api_key_env is None:
            return None
        key = os.environ.get(self.target.api_key_env)
        if not key:
            raise ScenarioError(
                f"{self.source}: target.api_key_env: environment variable "
                f"{self.target.api_key_env} is not set"
            )
        return key

    def with_setting(self, key: str, value: Any, *, source: str | None = None) -> Scenario:
        """This scenario with the dotted ``key`` (``load.concurrency``, ``params.seed``) set to
        ``value``."""
        return self.with_settings({key: value}, source=source)

    def with_settings(self, settings: Mapping[str, Any], *, source: str | None = None) -> Scenario:
        """This scenario with each dotted key set to its value as if written in the file: each
        field's rule converts and checks its value, ``validate`` then checks the whole once (keys
        that only make sense together may be set together), and ``raw`` records them. Errors name
        ``source`` (default: the scenario's file) and the key."""
        fail = Failer(source or self.source)
        scenario = self
        for key, value in settings.items():
            scenario = _set_key(scenario, key, value, fail)
        if DATASET_KEYS & set(settings) and "probes" in self.raw:
            # Which lines the JSONL files contribute depends on these keys: read them again, as a
            # file's load does.
            probes, datasets = probes_and_datasets(
                fail, self.raw["probes"], scenario.load, self.source
            )
            scenario = replace(scenario, probes=probes, datasets=datasets)
        return validate(scenario, source=source)


def load_scenario(path: str | Path, overrides: Sequence[str] = ()) -> Scenario:
    """Read, override and validate a scenario file."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(
            encoding="utf-8-sig"
        )  # a byte order mark opening the file is no TOML statement
    except FileNotFoundError:
        raise ScenarioError(f"{source}: no such scenario file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{source}: cannot read scenario file: {exc}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: not valid TOML: {exc}") from None
    for override in overrides:
        apply_override(raw, override, source)
    return scenario_from_dict(raw, source=source, name=raw.get("name", path.stem))


# scenarios/quickstart.toml's tables (a test keeps the two equal), here so that an installed kevload
# has them:
# `kevload run --url URL --model NAME` runs this, a first command with no file and no TOML quoting.
QUICKSTART: Mapping[str, Any] = types.MappingProxyType(
    {
        "target": {"base_url": "http://127.0.0.1:8080/v1", "model": "SmolLM2-135M-Instruct"},
        "params": {"temperature": 0},
        "load": {"concurrency": [1, 4], "samples": 8},
        "probes": [
            {
                "id": "capital",
                "prompt": "What is the capital of France? Answer in one sentence.",
                "max_tokens": 32,
            }
        ],
    }
)


def quickstart_scenario(prompt: str | None = None, overrides: Sequence[str] = ()) -> Scenario:
    """The quickstart scenario, its one probe asking ``prompt`` (id "prompt") when given,
    ``overrides`` applied as a file's are. Its target is the file's: the caller sets the server's
    with ``with_settings``."""
    raw = {
        key: copy.deepcopy(table) for key, table in QUICKSTART.items()
    }  # the caller's to change, not ours
    if prompt is not None:
        raw["probes"][0].update(id="prompt", prompt=prompt)
    for override in overrides:
        apply_override(raw, override)
    return scenario_from_dict(raw, source="quickstart", name="quickstart")


def scenario_from_dict(raw: dict[str, Any], *, source: str, name: str = "scenario") -> Scenario:
    """Read an already parsed scenario table (a file's, or run.json's on --resume) and validate
    it."""
    fail = Failer(source)
    known_keys(raw, "", {"name", "target", "probes", "params", "load"}, fail)
    target = build(Target, subtable(raw, "target", fail, required=True), "target", fail)
    probes_raw = raw.get("probes")
    if not isinstance(probes_raw, list) or not probes_raw:
        fail("probes", "at least one [[probes]] table", probes_raw)
    params = subtable(raw, "params", fail)
    load = build(Load, subtable(raw, "load", fail), "load", fail)
    probes, datasets = probes_and_datasets(fail, probes_raw, load, source)
    return validate(
        Scenario(
            name=str(name),
            source=source,
            target=target,
            probes=probes,
            params=params,
            load=load,
            raw=raw,
            datasets=datasets,
        )
    )


def build_scenario(
    target: Target,
    probes: Iterable[Probe],
    *,
    load: Load = DEFAULT_LOAD,
    params: Mapping[str, Any] | None = None,
    name: str = "scenario",
    source: str = "code",
) -> Scenario:
    """A scenario built in code, validated as a file is (a companions file read as a file's is); its
    ``raw`` (what run.json keeps as asked) is written from the objects: the fields that differ from
    their defaults, under their TOML keys."""
    scenario = Scenario(
        name=name,
        source=source,
        target=target,
        probes=tuple(probes),
        params=dict(params or {}),
        load=load,
        raw={},
    )
    raw = {
        "target": as_table(target),
        "params": scenario.params,
        "load": as_table(load),
        "probes": [as_table(p) for p in scenario.probes],
    }
    scenario = validate(replace(scenario, raw=raw))
    _, datasets = probes_and_datasets(
        Failer(source), [], scenario.load, source
    )  # a companions file, if any
    return replace(scenario, datasets=datasets)


def validate(scenario: Scenario, *, source: str | None = None) -> Scenario:
    """The scenario with every field checked by its rule, then the rules between fields; ramps
    expanded, levels sorted. The same for a file and for a scenario built in code; errors name
    ``source``."""
    fail = Failer(source or scenario.source)
    target = _checked_target(fail, scenario.target)
    _check_params(fail, scenario.params)
    probes = checked_probes(fail, scenario.probes, scenario.source)
    load = checked_load(fail, recheck(scenario.load, "load", fail))
    if load.min_good_share is not None and not any(p.grade for p in probes):
        fail(
            "load.min_good_share",
            "probes with expected or grade beside it (the answers to grade)",
            load.min_good_share,
        )
    conversation_rules(fail, probes, scenario.datasets, load)
    if (
        trace := trace_of(scenario.datasets)
    ) is not None:  # a setting changed after the trace was read (a sweep's)
        fits_trace(fail, load, trace)
    return replace(scenario, target=target, probes=probes, load=load)


def _checked_target(fail: Failer, target: Target) -> Target:
    """[target] by its field rules, its URLs whole, and no request id header of the user's."""
    target = recheck(target, "target", fail)
    check_url(fail, "target.base_url", target.base_url, BASE_URL_EXPECTED)
    check_metrics_url(fail, target.metrics_url)
    for header in target.headers:
        if header.lower() == REQUEST_ID_HEADER.lower():
            # Refused, not overridden: one fixed value on every request would join nothing. The
            # value, like every header value, stays out of the message.
            raise ScenarioError(
                f"{fail.source}: target.headers.{header}: expected no {REQUEST_ID_HEADER} header "
                "(kevload sends its own, unique per request, and records it as request_id)"
            )
    return target


def _check_params(fail: Failer, params: Any) -> None:
    """[params]: a table of what the body carries, without what target, probes and load set."""
    if not isinstance(params, dict):
        fail("params", "a [params] table", params)
    for reserved in ("model", "prompt", "messages", "stream"):
        if reserved in params:
            fail(
                f"params.{reserved}",
                f"no {reserved} here (it is set by target/probes/load)",
                params[reserved],
            )
    _json_numbers(params, "params", fail)
    if "n" in params and (type(params["n"]) is not int or params["n"] != 1):
        # Several choices in one response are several answers; kevload compares one per request.
        fail(
            "params.n",
            "1 or no n (one answer per request is compared; ask for more load.samples instead)",
            params["n"],
        )


def _json_numbers(value: Any, key: str, fail: Failer) -> None:
    """Every number in ``value`` is one a JSON body carries: finite (JSON has no inf or nan, which
    would be sent as null) and an integer within 64 bits."""
    if isinstance(value, dict):
        for name, item in value.items():
            _json_numbers(item, f"{key}.{name}", fail)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _json_numbers(item, f"{key}[{i}]", fail)
    elif isinstance(value, float) and not math.isfinite(value):
        fail(key, "a finite number (JSON has no inf or nan)", value)
    elif isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        fail(key, "an integer within 64 bits", value)


def _set_key(scenario: Scenario, key: str, value: Any, fail: Failer) -> Scenario:
    """``scenario`` with one dotted key set through its field's rule (not yet validated as a
    whole)."""
    parts = key.split(".")
    if not all(parts):
        fail(key, "a dotted key such as load.concurrency", key)
    head, rest = parts[0], parts[1:]
    if head == "params":
        params = with_path(scenario.params, rest, value, "params", fail) if rest else value
        if not isinstance(params, dict):
            fail("params", "a [params] table", params)
        scenario = replace(
            scenario, params=dict(params)
        )  # a copy: the caller's table stays the caller's
    elif head == "name" and not rest:
        scenario = replace(scenario, name=str(value))
    elif head in ("target", "load") and rest:
        obj = getattr(scenario, head)
        if head == "load" and rest[0] == "ramp":
            obj = unramped(obj)  # the ramp changes: validate expands its levels again
        scenario = replace(scenario, **{head: set_path(obj, rest, value, head, fail)})
    elif head in ("target", "load", "probes"):
        fail(
            key,
            f"a key inside [{head}], such as load.samples"
            if head != "probes"
            else "probes written in the scenario file (a setting changes one key)",
            value,
        )
    else:
        known_keys({head: value}, "", {"name", "params", "target", "load"}, fail)
    return replace(scenario, raw=with_path(scenario.raw, parts, value, "", fail))
