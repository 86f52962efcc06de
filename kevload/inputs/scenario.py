"""Scenarios: frozen dataclasses whose fields carry their own rules, read from TOML or built in code.

The rules live on the fields: the type says the kind (``Literal`` for a closed set of words) and
``field(metadata=rule(...))`` the bounds and the words of the message. One generic reader checks a
TOML table against them (unknown keys with did-you-mean, wrong kind, word not allowed, out of bounds);
``validate`` applies the same field rules to every object plus the rules between fields, for a file
and for a scenario built in code alike; ``Scenario.with_setting`` changes one dotted key the same way.
Every error is one line naming the source, the key and what was expected.
"""

from __future__ import annotations

import copy
import difflib
import functools
import math
import os
import re
import tomllib
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, NoReturn, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

from kevload.errors import ScenarioError
from kevload.inputs.conversation import BadTurns, parse_turns
from kevload.inputs.datasets import Dataset, read_dataset
from kevload.inputs.gradeworker import DEFAULT_TIMEOUT
from kevload.inputs.grading import BadGrading, checked
from kevload.inputs.probe import Probe, Rule, first_bad_message, key_of, rule, rule_of
from kevload.inputs.trace import (
    MAX_SPEEDUP,
    MAX_TRACE_SECONDS,
    MAX_TRACE_TOKENS,
    TraceDataset,
    read_trace,
    trace_of,
)
from kevload.inputs.wordsets import shortened

Mode = Literal["single", "mixed", "prefix", "needle"]
Arrival = Literal["constant", "poisson"]
Api = Literal["chat", "completions"]
RampOf = Literal["concurrency", "rate"]
TraceFormat = Literal["auto", "mooncake", "burstgpt"]
Logprobs = Literal["auto", True, False]
PrefixCache = Literal["off", "cold_warm"]
CacheReset = Literal["auto", "reset_prefix_cache", "flush_cache", "cache_prompt", "marker"]
MODES: tuple[str, ...] = get_args(Mode)
ARRIVALS: tuple[str, ...] = get_args(Arrival)
APIS: tuple[str, ...] = get_args(Api)
# Bounds that need the first token's time, which only a streamed answer shows.
STREAMED_BOUNDS = ("ttft_ms", "itl_ms", "tpot_ms")
SLO_BOUNDS = (*STREAMED_BOUNDS, "e2e_ms")
MAX_RAMP_LEVELS = 1000  # each level is a cell run in turn: more than this is a typo, not a test
# Every number's bound: far beyond any real test, far below what hurts the machine kevload runs on
# (docs/running.md:
# Bounds). A level's slots, a needle's text and the worker processes are allocated in proportion to
# them.
MAX_CONCURRENCY = 100_000  # requests in flight at one level, all workers together
MAX_RATE = 100_000  # open-loop requests per second
MAX_SAMPLES = 10_000_000  # requests of one kind per cell: samples, warm-ups, max_samples
MAX_SECONDS = 7 * 86_400  # any time in seconds (a week); SLO bounds in milliseconds are finite
MAX_CHARS = 4_000_000  # characters of a needle or a prefix (about a million tokens)
MAX_WORKERS = (
    1024  # worker processes or Ray actors of one run (without Ray, 4 a core: kevload.load.workers)
)
MAX_RETRIES = 100  # retries of one 429/503 (each waits up to 10 s)
SEED_BOUNDS = {
    "min": -(2**63),
    "max": 2**63 - 1,
}  # what TOML and run.json (JSON) carry as an integer
# kevload sets this header itself, unique per request, so records join the server's logs: never the
# user's.
REQUEST_ID_HEADER = "X-Request-Id"
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
METRICS_OFF = ("", "off")  # target.metrics_url values that read no metrics
BASE_URL_EXPECTED = "an http:// or https:// URL such as http://127.0.0.1:8000/v1"
METRICS_URL_EXPECTED = (
    '"auto", "off" (or "") or an http:// or https:// URL of Prometheus text, without user:password@'
)


@dataclass(frozen=True)
class Target:
    base_url: str
    model: str
    api: Api = "chat"
    timeout: float = rule(
        60.0, above=0, max=MAX_SECONDS, expected=f"seconds > 0, at most {MAX_SECONDS:,}"
    )
    api_key_env: str | None = None
    headers: dict[str, str] = rule(factory=dict, expected="a table of string values")
    # A longer answer is cut: status too_large.
    max_response_bytes: int = rule(
        8 * 2**20, min=1, max=2**30, expected="an integer from 1 to 2**30 (bytes)"
    )
    # A request still running after this long is cut: timeout (0: no limit).
    max_seconds: float = rule(
        0.0, min=0, max=MAX_SECONDS, expected=f"seconds from 0 to {MAX_SECONDS:,} (0: no limit)"
    )
    # Where the server's own view is read during the run (kevload.records.servermetrics): "auto" is
    # the base URL's
    # origin + /metrics, "" or "off" reads nothing.
    metrics_url: str = rule("auto", expected=METRICS_URL_EXPECTED)


_MS = {"above": 0, "below": math.inf, "expected": "a number of milliseconds > 0"}


@dataclass(frozen=True)
class Slo:
    """Per-request latency bounds in milliseconds (None: not bounded). A request meets the SLO when it
    is ok and within every given bound; ``itl_ms`` and ``tpot_ms`` bound the request's mean gap, the
    quantities the latency table reports."""

    ttft_ms: float | None = rule(None, **_MS)
    itl_ms: float | None = rule(None, **_MS)
    tpot_ms: float | None = rule(None, **_MS)
    e2e_ms: float | None = rule(None, **_MS)

    def bounds(self) -> dict[str, float]:
        """The given bounds only, by name: ``{"ttft_ms": 500.0, "e2e_ms": 10000.0}``."""
        return {name: getattr(self, name) for name in SLO_BOUNDS if getattr(self, name) is not None}


@dataclass(frozen=True)
class Ramp:
    """A stepped ramp (``load.ramp``): levels of concurrency or of rate from ``start`` to ``to``, ``step``
    apart or each ``factor`` times the one before, ``to`` always the last; each level is a cell lasting
    ``every_s`` seconds (None: until ``load.samples``). Expanded by ``validate`` into ``load.concurrency``
    or ``load.rate`` (and ``load.duration``), so the engine sees ordinary levels.

    ``start``, ``to`` and ``step`` are levels, whose kind depends on ``of`` (whole for concurrency): they
    are checked by ``_ramp``, not by their field rules alone."""

    of: RampOf
    start: float = rule(key="from")  # TOML ``from`` (a Python keyword)
    to: float = rule()
    step: float | None = None
    factor: float | None = rule(
        None,
        above=1,
        below=math.inf,
        expected="a number > 1 (each level that many times the one before)",
    )
    every_s: float | None = rule(
        None,
        above=0,
        max=MAX_SECONDS,
        expected=f"seconds > 0 per level, at most "
        f"{MAX_SECONDS:,} (none: each level runs until load.samples)",
    )

    def levels(self) -> tuple[float, ...]:
        values: list[float] = []
        while True:
            k = len(values)
            if self.step:
                value = self.start + k * self.step
            else:
                assert self.factor is not None  # a ramp has a step or a factor (_ramp)
                value = self.start * self.factor**k
            if value > self.to * (
                1 + 1e-9
            ):  # a float step landing a hair past ``to`` still lands on it
                break
            values.append(value)
        if not math.isclose(values[-1], self.to, rel_tol=1e-9):
            values.append(self.to)
        if self.of == "concurrency":
            # Half up, not Python's half-to-even: 2.5 in flight rounds the way a reader expects, to
            # 3.
            return tuple(sorted({math.floor(v + 0.5) for v in values}))
        return tuple(sorted({round(float(v), 6) for v in values}))


@dataclass(frozen=True)
class Load:
    mode: Mode = "single"
    concurrency: tuple[int, ...] = rule(
        (1,),
        min=1,
        max=MAX_CONCURRENCY,
        nonempty=True,
        expected=f"a non-empty list of integers from 1 to {MAX_CONCURRENCY:,}",
    )
    samples: int = rule(8, min=1, max=MAX_SAMPLES, expected=f"an integer from 1 to {MAX_SAMPLES:,}")
    stream: bool = False
    nonce: bool = True
    max_error_share: float = rule(0.1, min=0, max=1, expected="a share between 0 and 1")
    companions: str = "builtin"
    prefix_lengths: tuple[int, ...] = rule(
        (16, 64, 256, 1024),
        min=1,
        max=MAX_CHARS,
        expected=f"a list of integers from 1 to {MAX_CHARS:,} (characters)",
    )
    needle_length: int = rule(
        2000, min=1, max=MAX_CHARS, expected=f"an integer from 1 to {MAX_CHARS:,} (characters)"
    )
    warmup: int = rule(0, min=0, max=MAX_SAMPLES, expected=f"an integer from 0 to {MAX_SAMPLES:,}")
    seed: int = rule(0, **SEED_BOUNDS, expected="a 64-bit integer")
    # Open loop: requests/s levels, instead of closed-loop concurrency.
    rate: tuple[float, ...] = rule(
        (),
        above=0,
        max=MAX_RATE,
        expected=f"a list of numbers > 0, at most {MAX_RATE:,} (requests per second)",
    )
    arrival: Arrival = "constant"
    max_in_flight: int = rule(
        0,
        min=0,
        max=MAX_CONCURRENCY,  # open loop cap on requests in flight
        expected=f"an integer from 0 to {MAX_CONCURRENCY:,} (0: no cap)",
    )
    # Seconds per level, closed or open loop (0: until the samples are sent).
    duration: float = rule(
        0.0,
        min=0,
        max=MAX_SECONDS,
        expected=f"seconds from 0 to {MAX_SECONDS:,} (0: until the samples are sent)",
    )
    # Retries of 429/503 (none: a retry hides evidence).
    retries: int = rule(0, min=0, max=MAX_RETRIES, expected=f"an integer from 0 to {MAX_RETRIES}")
    dataset_seed: int = rule(
        0, **SEED_BOUNDS, expected="a 64-bit integer"
    )  # which JSONL lines (--dataset-seed)
    companion_count: int = rule(
        0,
        min=0,
        max=MAX_SAMPLES,  # lines from a companions file
        expected=f"an integer from 0 to {MAX_SAMPLES:,} (0: every line)",
    )
    slo: Slo | None = None  # per-request latency bounds: slo_attainment and goodput per cell
    # A probe cell below this share fails (JUnit, exit 1).
    min_slo_attainment: float | None = rule(None, min=0, max=1, expected="a share between 0 and 1")
    # A graded probe cell whose answers are graded good less often than this fails (exit 1;
    # kevload.compare.graded).
    min_good_share: float | None = rule(None, min=0, max=1, expected="a share between 0 and 1")
    # Seconds one answer's grading may take (kevload.inputs.gradeworker); past it the answer is
    # grade_failed.
    grade_timeout: float = rule(
        DEFAULT_TIMEOUT, above=0, max=MAX_SECONDS, expected=f"seconds > 0, at most {MAX_SECONDS:,}"
    )
    logprobs: Logprobs = rule(
        "auto", expected='"auto", true or false'
    )  # true, false, "auto" (if one check finds them)
    ramp: Ramp | None = None  # a stepped ramp, expanded into concurrency or rate (and duration)
    # Seconds at each level's load before its sends count (a timed warm-up).
    ramp_s: float = rule(
        0.0, min=0, max=MAX_SECONDS, expected=f"seconds from 0 to {MAX_SECONDS:,} (0: no ramp-up)"
    )
    # Sample each cell until drift or a 95 % drift-rate bound this low (1e-6 takes about 3 million
    # samples) …
    until_bound: float | None = rule(
        None,
        min=1e-6,
        below=1,
        expected="a share from 0.000001 to below 1, e.g. 0.05 (a 5 % bound on the drift rate)",
    )
    # … but never more counted probe samples per cell than this.
    max_samples: int = rule(
        1000, min=1, max=MAX_SAMPLES, expected=f"an integer from 1 to {MAX_SAMPLES:,}"
    )
    workers: int = rule(
        1,
        min=1,
        max=MAX_WORKERS,  # kevload.load.workers
        expected=f"an integer from 1 to {MAX_WORKERS:,} (processes sharing each level)",
    )
    # Trace replay (kevload.inputs.trace): a Mooncake JSONL or BurstGPT CSV file of arrivals,
    # relative to the scenario
    # file;
    # one open-loop level per speed-up, after the closed-loop levels (load.concurrency: c=1, the
    # serial reference).
    trace: str = ""
    trace_format: TraceFormat = "auto"
    trace_speedup: tuple[float, ...] = rule(
        (1.0,),
        above=0,
        max=MAX_SPEEDUP,
        nonempty=True,
        expected=f"a non-empty list of numbers > 0, at most {MAX_SPEEDUP:,} "
        "(the trace's time divided by it)",
    )
    trace_max_requests: int = rule(
        0,
        min=0,
        max=MAX_SAMPLES,
        expected=f"an integer from 0 to {MAX_SAMPLES:,} (the trace's first lines; 0: all)",
    )
    # Mooncake's hash_ids blocks: tokens each (words of the synthetic prompt).
    trace_block_tokens: int = rule(
        512,
        min=1,
        max=MAX_TRACE_TOKENS,
        expected=f"an integer from 1 to {MAX_TRACE_TOKENS:,} (tokens a hash_ids block)",
    )
    # [from, to]: the part of the trace replayed, in seconds after its first line (none: all of it).
    trace_window_s: tuple[float, ...] = rule(
        (),
        min=0,
        max=MAX_TRACE_SECONDS,
        expected=f"[from, to], seconds after the trace's first line, from 0 to "
        f"{MAX_TRACE_SECONDS:,}",
    )
    # The model's tokenizer.json, relative to the scenario file: the prompts use only the words it
    # makes one token.
    trace_tokenizer: str = ""
    # Each probe sample cold, then warm (kevload.load.prefixcache), and how cold is made.
    prefix_cache: PrefixCache = "off"
    cache_reset: CacheReset = "auto"
    # Companions the client abandons mid-answer (kevload.load.cancel): this share of them, seeded by
    # load.seed, cut
    # after so many seconds or so many streamed chunks, whichever comes first.
    cancel_share: float = rule(0.0, min=0, max=1, expected="a share between 0 and 1")
    cancel_after_s: float | None = rule(
        None, above=0, max=MAX_SECONDS, expected=f"seconds above 0, at most {MAX_SECONDS:,}"
    )
    cancel_after_tokens: int | None = rule(
        None,
        min=1,
        max=MAX_SAMPLES,
        expected=f"an integer from 1 to {MAX_SAMPLES:,} (streamed chunks)",
    )


_DEFAULT_LOAD = Load()
_LOAD_FIELDS = {f.name: f for f in fields(Load)}
_PROBE_FIELDS = {f.name: f for f in fields(Probe)}


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
        """This scenario with the dotted ``key`` (``load.concurrency``, ``params.seed``) set to ``value``."""
        return self.with_settings({key: value}, source=source)

    def with_settings(self, settings: Mapping[str, Any], *, source: str | None = None) -> Scenario:
        """This scenario with each dotted key set to its value as if written in the file: each field's rule
        converts and checks its value, ``validate`` then checks the whole once (keys that only make sense
        together may be set together), and ``raw`` records them. Errors name ``source`` (default: the
        scenario's file) and the key."""
        fail = _Failer(source or self.source)
        scenario = self
        for key, value in settings.items():
            scenario = _set_key(scenario, key, value, fail)
        if DATASET_KEYS & set(settings) and "probes" in self.raw:
            # Which lines the JSONL files contribute depends on these keys: read them again, as a
            # file's load does.
            probes, datasets = _probes_and_datasets(
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
    """The quickstart scenario, its one probe asking ``prompt`` (id "prompt") when given, ``overrides`` applied
    as a file's are. Its target is the file's: the caller sets the server's with ``with_settings``."""
    raw = {
        key: copy.deepcopy(table) for key, table in QUICKSTART.items()
    }  # the caller's to change, not ours
    if prompt is not None:
        raw["probes"][0].update(id="prompt", prompt=prompt)
    for override in overrides:
        apply_override(raw, override)
    return scenario_from_dict(raw, source="quickstart", name="quickstart")


def apply_override(raw: dict[str, Any], override: str, source: str = "--set") -> None:
    """Apply one ``KEY=VALUE`` (VALUE read as TOML, a bare word taken as a string) to ``raw``: user text
    from the command line, applied before the first validation so it meets the rules a file does."""
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
    """A value typed on the command line, read as TOML (``4``, ``true``, ``[1, 4]``); a bare word is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def scenario_from_dict(raw: dict[str, Any], *, source: str, name: str = "scenario") -> Scenario:
    """Read an already parsed scenario table (a file's, or run.json's on --resume) and validate it."""
    fail = _Failer(source)
    _known(raw, "", {"name", "target", "probes", "params", "load"}, fail)
    target = read_table(
        Target, _table(raw, "target", fail, required=True), where="target", source=source
    )
    probes_raw = raw.get("probes")
    if not isinstance(probes_raw, list) or not probes_raw:
        fail("probes", "at least one [[probes]] table", probes_raw)
    params = _table(raw, "params", fail)
    load = read_table(Load, _table(raw, "load", fail), where="load", source=source)
    probes, datasets = _probes_and_datasets(fail, probes_raw, load, source)
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
    load: Load = _DEFAULT_LOAD,
    params: Mapping[str, Any] | None = None,
    name: str = "scenario",
    source: str = "code",
) -> Scenario:
    """A scenario built in code, validated as a file is (a companions file read as a file's is); its
    ``raw`` (what run.json keeps as asked) is written from the objects: the fields that differ from their
    defaults, under their TOML keys."""
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
        "target": _as_table(target),
        "params": scenario.params,
        "load": _as_table(load),
        "probes": [_as_table(p) for p in scenario.probes],
    }
    scenario = validate(replace(scenario, raw=raw))
    _, datasets = _probes_and_datasets(
        _Failer(source), [], scenario.load, source
    )  # a companions file, if any
    return replace(scenario, datasets=datasets)


def read_table(cls: type, table: Mapping[str, Any], *, where: str, source: str) -> Any:
    """One dataclass from its TOML table by its field rules (a case file's [load] table, for one)."""
    return _build(cls, table, where, _Failer(source))


def validate(scenario: Scenario, *, source: str | None = None) -> Scenario:
    """The scenario with every field checked by its rule, then the rules between fields; ramps expanded,
    levels sorted. The same for a file and for a scenario built in code; errors name ``source``."""
    fail = _Failer(source or scenario.source)
    target = _recheck(scenario.target, "target", fail)
    _check_url(fail, "target.base_url", target.base_url, BASE_URL_EXPECTED)
    _check_metrics_url(fail, target.metrics_url)
    for header in target.headers:
        if header.lower() == REQUEST_ID_HEADER.lower():
            # Refused, not overridden: one fixed value on every request would join nothing. The
            # value,
            # like every header value, stays out of the message.
            raise ScenarioError(
                f"{fail.source}: target.headers.{header}: expected no {REQUEST_ID_HEADER} header "
                "(kevload sends its own, unique per request, and records it as request_id)"
            )
    params = scenario.params
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
    if not scenario.probes:
        fail("probes", "at least one [[probes]] table", list(scenario.probes))
    base = Path(
        scenario.source
    ).parent  # a schema file or a python grader is found from the scenario's directory
    probes = tuple(_probe(fail, p, f"probes[{i}]", base) for i, p in enumerate(scenario.probes))
    ids = [p.id for p in probes]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        fail("probes.id", "unique ids", duplicates)
    load = _load(fail, _recheck(scenario.load, "load", fail))
    if load.min_good_share is not None and not any(p.grade for p in probes):
        fail(
            "load.min_good_share",
            "probes with expected or grade beside it (the answers to grade)",
            load.min_good_share,
        )
    _conversations(fail, probes, scenario.datasets, load)
    if (
        trace := trace_of(scenario.datasets)
    ) is not None:  # a setting changed after the trace was read (a sweep's)
        _fits_trace(fail, load, trace)
    return replace(scenario, target=target, probes=probes, load=load)


def _conversations(
    fail: _Failer, probes: tuple[Probe, ...], datasets: tuple[Dataset, ...], load: Load
) -> None:
    """What a conversation runs with: one process (a turn's claim is held from its first turn to its last,
    which worker processes would have to share), and for probes closed-loop levels sampled to a count."""
    talks = any(p.turns for p in probes)
    if load.workers > 1 and (talks or any(item.turns for d in datasets for item in d.items)):
        fail(
            "load.workers",
            "1 with conversations among the probes or companions (a conversation runs in one "
            "process)",
            load.workers,
        )
    if talks and load.rate:
        fail(
            "load.rate",
            "no rate with conversation probes (a conversation sample runs in a closed-loop slot: "
            "use load.concurrency)",
            list(load.rate),
        )
    if talks and load.prefix_cache != "off":
        fail(
            "load.prefix_cache",
            '"off" with conversation probes (a conversation\'s later turns are warm by its '
            "own earlier ones)",
            load.prefix_cache,
        )
    if talks and load.trace:
        fail(
            "load.trace",
            "no trace with conversation probes (a replay sends its probes open loop, a "
            "conversation "
            "sample runs in a closed-loop slot)",
            load.trace,
        )
    if talks and load.until_bound is not None:
        fail(
            "load.until_bound",
            "no bound with conversation probes (sample them to load.samples)",
            load.until_bound,
        )


def _load(fail: _Failer, load: Load) -> Load:
    """The rules between [load]'s keys, on a load whose every field already meets its own rule."""
    if load.ramp is not None:
        load = _ramped(fail, load)
    if load.workers > 1 and load.until_bound is not None:
        # The stop rule holds every answer against the serial one; workers share counts, not
        # answers.
        fail(
            "load.workers",
            "1 with load.until_bound (sampling until a bound runs in one process)",
            load.workers,
        )
    if 0 < load.max_in_flight < load.workers:
        fail(
            "load.max_in_flight",
            f"0 or at least load.workers ({load.workers}): each worker holds a share of the cap",
            load.max_in_flight,
        )
    if load.slo is not None:
        if not load.slo.bounds():
            fail("load.slo", f"at least one of {', '.join(SLO_BOUNDS)}", load.slo.bounds())
        for key, value in load.slo.bounds().items():
            if key in STREAMED_BOUNDS and not load.stream:
                # Refused rather than guessed: without streaming the first token arrives with the
                # whole
                # answer, so TTFT would only restate e2e and ITL/TPOT would not be measured at all.
                fail(
                    f"load.slo.{key}",
                    "load.stream = true beside it (only a streamed answer shows its first "
                    "token's time)",
                    value,
                )
    if load.min_slo_attainment is not None and load.slo is None:
        fail(
            "load.min_slo_attainment",
            "a load.slo table beside it (the bounds to attain)",
            load.min_slo_attainment,
        )
    if load.until_bound is not None:
        if load.rate:
            # A rate level promises a schedule that does not depend on the answers; stopping on them
            # would break it.
            fail(
                "load.until_bound",
                "closed-loop levels only (load.concurrency): a load.rate level sends on a "
                "schedule, not until a claim is strong; remove one of them",
                load.until_bound,
            )
        if load.duration:
            fail(
                "load.until_bound",
                "levels that end on their samples, not on a clock: load.duration (or "
                "load.ramp.every_s) is set too; remove one of them",
                load.until_bound,
            )
        if load.max_samples < load.samples:
            fail(
                "load.max_samples", f"an integer >= load.samples ({load.samples})", load.max_samples
            )
    if load.cancel_share and load.cancel_after_s is None and load.cancel_after_tokens is None:
        fail(
            "load.cancel_share",
            "load.cancel_after_s or load.cancel_after_tokens beside it (when to cut)",
            load.cancel_share,
        )
    if load.cancel_after_tokens is not None and not load.stream:
        # Without streaming nothing arrives before the whole answer: there is no token to count.
        fail(
            "load.cancel_after_tokens",
            "load.stream = true beside it (only a streamed answer arrives token by token)",
            load.cancel_after_tokens,
        )
    if load.cancel_share and load.mode == "single":
        fail(
            "load.cancel_share",
            'a mode with companions ("mixed", "prefix" or "needle"): only companions are cancelled',
            load.cancel_share,
        )
    if load.trace:
        _traced(fail, load)
    elif load.trace_tokenizer:
        fail(
            "load.trace_tokenizer",
            "load.trace beside it (the tokenizer fits a replay's prompts)",
            load.trace_tokenizer,
        )
    elif load.trace_window_s:
        fail(
            "load.trace_window_s",
            "load.trace beside it (the window is a part of a trace)",
            list(load.trace_window_s),
        )
    if load.prefix_cache == "cold_warm":
        _cold_warm(fail, load)
    return replace(
        load,
        concurrency=tuple(sorted(set(load.concurrency))),
        rate=tuple(sorted(set(load.rate))),
        trace_speedup=tuple(sorted(set(load.trace_speedup))),
    )


def _traced(fail: _Failer, load: Load) -> None:
    """A trace sets its levels' arrivals, companions and length: the keys that would set them too are refused."""
    expected = "{} with load.trace (the trace {})"
    if load.rate:
        fail(
            "load.rate",
            expected.format("no rates", "sets the open-loop levels: give load.trace_speedup"),
            list(load.rate),
        )
    if load.mode != "single":
        fail("load.mode", expected.format('"single"', "supplies the companions"), load.mode)
    if load.arrival != "constant":
        fail("load.arrival", expected.format('"constant"', "sets the arrival times"), load.arrival)
    if load.duration:
        # A stepped ramp's every_s sets it too.
        fail(
            "load.duration",
            "0 with load.trace, nor load.ramp.every_s (the trace level lasts the trace's span)",
            load.duration,
        )
    if load.until_bound is not None:
        fail(
            "load.until_bound",
            expected.format("none", "level sends on a schedule"),
            load.until_bound,
        )


def _cold_warm(fail: _Failer, load: Load) -> None:
    """Cold and warm are compared serially, one round after another: under batching a difference could be the
    batch's, a warm-up would warm the cache, and a round needs both its samples."""
    for key, value, expected in (
        (
            "load.concurrency",
            load.concurrency,
            '[1] with load.prefix_cache = "cold_warm" (cold and warm are compared serially)',
        ),
        ("load.mode", load.mode, '"single" with load.prefix_cache = "cold_warm"'),
        ("load.rate", load.rate, 'none with load.prefix_cache = "cold_warm"'),
        (
            "load.warmup",
            load.warmup,
            '0 with load.prefix_cache = "cold_warm" (a warm-up would warm the cache)',
        ),
        (
            "load.duration",
            load.duration,
            '0 with load.prefix_cache = "cold_warm", nor load.ramp.every_s (a round '
            "needs both samples)",
        ),
        (
            "load.ramp_s",
            load.ramp_s,
            '0 with load.prefix_cache = "cold_warm" (a ramp-up\'s sends would warm the cache)',
        ),
        ("load.until_bound", load.until_bound, 'none with load.prefix_cache = "cold_warm"'),
        ("load.workers", load.workers, '1 with load.prefix_cache = "cold_warm"'),
        (
            "load.trace",
            load.trace,
            'none with load.prefix_cache = "cold_warm" (a replay is load, cold and '
            "warm are compared serially)",
        ),
    ):
        if value != getattr(_DEFAULT_LOAD, key[5:]):
            fail(key, expected, list(value) if isinstance(value, tuple) else value)
    if load.samples % 2:
        fail(
            "load.samples",
            'an even number with load.prefix_cache = "cold_warm" (each round: one cold '
            "sample, one warm)",
            load.samples,
        )


def _fits_trace(fail: _Failer, load: Load, trace: TraceDataset) -> None:
    """The keys that depend on the trace read: its levels' keys (rates) and the ramp its probes come after."""
    rates = [trace.rate(speedup) for speedup in load.trace_speedup]
    if 0 in rates or len(set(rates)) < len(rates):
        fail(
            "load.trace_speedup",
            "speed-ups whose replays' rates differ at 6 decimals (r=…/s keys the level)",
            [f"r={rate:g}/s" for rate in rates],
        )
    # The probes are spread over the replay past the ramp, where they count.
    if load.ramp_s >= (shortest := trace.span / max(load.trace_speedup)):
        fail(
            "load.ramp_s",
            f"less than the replay's span at the largest load.trace_speedup ({shortest:g} s)",
            load.ramp_s,
        )


def _json_numbers(value: Any, key: str, fail: _Failer) -> None:
    """Every number in ``value`` is one a JSON body carries: finite (JSON has no inf or nan, which would be
    sent as null) and an integer within 64 bits."""
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


def _ramped(fail: _Failer, load: Load) -> Load:
    """The ramp's levels (and every_s) written into the load; a level or a length given beside it is a
    contradiction, unless it is the ramp's own (``validate`` runs again on what it returned)."""
    ramp = load.ramp
    assert ramp is not None  # called for a load with a ramp
    levels = ramp.levels()
    own: dict[str, Any] = (
        {"concurrency": tuple(int(x) for x in levels)}
        if ramp.of == "concurrency"
        else {"rate": levels}
    )
    for (
        name,
        value,
    ) in own.items():  # the levels meet the rule of the key they fill (rates are rounded to 1e-6)
        _value(value, _hints(Load)[name], rule_of(_LOAD_FIELDS[name]), "load.ramp", fail)
    for clash in ("concurrency", "rate"):
        value = getattr(load, clash)
        if value not in (getattr(_DEFAULT_LOAD, clash), own.get(clash)):
            raise ScenarioError(
                f"{fail.source}: load.ramp and load.{clash}: give one of them (the ramp sets the "
                "levels)"
            )
    if ramp.every_s is not None and load.duration not in (_DEFAULT_LOAD.duration, ramp.every_s):
        raise ScenarioError(
            f"{fail.source}: load.ramp.every_s and load.duration: give one of them (the ramp sets "
            "the seconds per level)"
        )
    return replace(load, **own, duration=ramp.every_s or load.duration)


def _unramped(load: Load) -> Load:
    """The load as it was before ``_ramped``: what a changed ramp is expanded from again."""
    if load.ramp is None:
        return load
    derived = (
        {"concurrency": _DEFAULT_LOAD.concurrency}
        if load.ramp.of == "concurrency"
        else {"rate": ()}
    )
    return replace(
        load, **derived, duration=_DEFAULT_LOAD.duration if load.ramp.every_s else load.duration
    )


def _probe(fail: _Failer, probe: Probe, where: str, base: Path) -> Probe:
    probe = _recheck(probe, where, fail)
    given = [k for k in ("prompt", "messages", "turns") if getattr(probe, k) is not None]
    if len(given) != 1:
        fail(where, "exactly one of prompt, messages or turns", given)
    if probe.turns is not None:
        _with_turns({"turns": list(probe.turns)}, where, fail)
    elif probe.system is not None:
        fail(
            f"{where}.system",
            "turns beside it (a system message opens a conversation)",
            probe.system,
        )
    bad = first_bad_message(probe.messages or ())
    if bad is not None:
        fail(
            f"{where}.messages[{bad}]",
            "a table with string role and content",
            (probe.messages or ())[bad],
        )
    return _graded(fail, probe, where, base)


def _graded(fail: _Failer, probe: Probe, where: str, base: Path) -> Probe:
    """The probe with its grading keys checked (``grading.checked``) and in normal form: the grade named (picked
    from ``expected`` when not given), a schema file read into ``expected``."""
    try:
        graded = checked(probe.expected, probe.grade, probe.grade_tolerance, base)
    except BadGrading as bad:
        fail(f"{where}.{bad.key}", bad.expected, bad.got)
    if graded is None:
        return probe
    if probe.turns is not None:
        # A conversation's output is its whole transcript: no one answer to judge.
        fail(f"{where}.grade", "no grading on a conversation probe (turns)", graded.grade)
    return replace(
        probe, expected=graded.expected, grade=graded.grade, grade_tolerance=graded.tolerance
    )


def _with_turns(table: dict[str, Any], where: str, fail: _Failer) -> dict[str, Any]:
    """A probe table with its ``turns`` read as ``Turn``s (``conversation.parse_turns``'s rule, which names the
    bad turn), so the field's own rule only has to check their kind."""
    if "turns" not in table:
        return table
    try:
        return {**table, "turns": parse_turns(table["turns"])}
    except BadTurns as bad:
        fail(f"{where}.{bad.key}", bad.expected, bad.got)


def _probes_and_datasets(
    fail: _Failer, items: list[Any], load: Load, source: str
) -> tuple[tuple[Probe, ...], tuple[Dataset, ...]]:
    """Inline probes and ``[[probes]] dataset = ...`` entries in their order; companion files too, when used.

    Files are read here, before anything is sent, so a bad line fails first and the run records the
    exact bytes (by hash) it used. Relative paths are relative to the scenario file.
    """
    base = Path(source).parent
    probes: list[Probe] = []
    datasets = []
    for i, item in enumerate(items):
        where = f"probes[{i}]"
        if not isinstance(item, dict):
            fail(where, "a table with id and prompt or messages", item)
        if "dataset" not in item:
            probes.append(_build(Probe, _with_turns(item, where, fail), where, fail))
            continue
        _known(item, where, {"dataset", "count", "max_tokens"}, fail)
        count = item.get("count", 0)
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            fail(f"{where}.count", "an integer >= 0 (0: every line)", count)
        max_tokens = _value(
            item.get("max_tokens", 64),
            int,
            rule_of(_PROBE_FIELDS["max_tokens"]),
            f"{where}.max_tokens",
            fail,
        )
        if not isinstance(item["dataset"], str) or not item["dataset"]:
            fail(f"{where}.dataset", "the path of a JSONL file", item["dataset"])
        dataset = read_dataset(
            base / item["dataset"],
            role="probe",
            what=f"{where}.dataset",
            seed=load.dataset_seed,
            count=count,
            count_key=f"{where}.count",
            max_tokens=max_tokens,
        )
        datasets.append(dataset)
        probes.extend(dataset.items)
    if load.trace:
        trace = read_trace(
            base / load.trace,
            what="load.trace",
            trace_format=load.trace_format,
            seed=load.dataset_seed,
            max_requests=load.trace_max_requests,
            block_tokens=load.trace_block_tokens,
            window=_window(fail, load),
            tokenizer=base / load.trace_tokenizer if load.trace_tokenizer else None,
            tokenizer_what="load.trace_tokenizer",
        )
        _fits_trace(fail, load, trace)
        datasets.append(trace)
    if load.mode == "mixed" and load.companions != "builtin":
        datasets.append(
            read_dataset(
                base / load.companions,
                role="companion",
                what="load.companions",
                seed=load.dataset_seed,
                count=load.companion_count,
                count_key="load.companion_count",
            )
        )
    return tuple(probes), tuple(datasets)


def _window(fail: _Failer, load: Load) -> tuple[float, float] | None:
    """``load.trace_window_s`` as the trace is read with it, checked first: it decides which lines are replayed."""
    if not load.trace_window_s:
        return None
    if len(load.trace_window_s) != 2 or load.trace_window_s[0] >= load.trace_window_s[1]:
        fail(
            "load.trace_window_s",
            "[from, to], two numbers of seconds after the trace's first line, from < to",
            list(load.trace_window_s),
        )
    start, end = load.trace_window_s
    return start, end


class _Failer:
    """Raises the one-line error: ``<source>: <key>: expected <what>, got <value>``."""

    def __init__(self, source: str):
        self.source = source

    def __call__(self, key: str, expected: str, got: Any) -> NoReturn:
        raise ScenarioError(f"{self.source}: {key}: expected {expected}, got {_show(got)}")


def _known(table: Mapping[str, Any], where: str, allowed: set[str], fail: _Failer) -> None:
    for key in table:
        if key not in allowed:
            full = f"{where}.{key}" if where else key
            hint = difflib.get_close_matches(key, sorted(allowed), n=1)
            maybe = f" (did you mean {hint[0]}?)" if hint else ""
            raise ScenarioError(
                f"{fail.source}: {full}: unknown key{maybe}; expected one of "
                f"{', '.join(sorted(allowed))}"
            )


def _table(
    raw: Mapping[str, Any], key: str, fail: _Failer, required: bool = False
) -> dict[str, Any]:
    value = raw.get(key)
    if value is None:
        if required:
            fail(key, f"a [{key}] table", None)
        return {}
    if not isinstance(value, dict):
        fail(key, f"a [{key}] table", value)
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _build(cls: type, table: Mapping[str, Any], where: str, fail: _Failer) -> Any:
    """``cls`` from a TOML table: keys known, required ones given, each value through its field's rule."""
    if cls is Ramp:
        return _ramp(fail, table, where)
    by_key = {key_of(f): f for f in fields(cls)}
    _known(table, where, set(by_key), fail)
    values = {}
    for key, f in by_key.items():
        if key in table:
            values[f.name] = _value(
                table[key], _hints(cls)[f.name], rule_of(f), f"{where}.{key}", fail
            )
        elif f.default is MISSING and f.default_factory is MISSING:
            fail(f"{where}.{key}", rule_of(f).expected or _kind(_hints(cls)[f.name]), None)
    return cls(**values)


def _recheck(obj: Any, where: str, fail: _Failer) -> Any:
    """``obj`` (built in code or read) with each field through its rule again: the same checks a file gets,
    and the same normal form (tuples, floats)."""
    if isinstance(obj, Ramp):
        return _ramp(fail, {key_of(f): getattr(obj, f.name) for f in fields(Ramp)}, where)
    return replace(
        obj,
        **{
            f.name: _value(
                getattr(obj, f.name),
                # A class is hashable: mypy checks an instance's __hash__ against functools.cache.
                _hints(type(obj))[f.name],  # type: ignore[arg-type]
                rule_of(f),
                f"{where}.{key_of(f)}",
                fail,
            )
            for f in fields(obj)
        },
    )


_BAD = object()


def _value(value: Any, hint: Any, rule: Rule, key: str, fail: _Failer) -> Any:
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
            return _recheck(value, key, fail)
        if not isinstance(value, dict):
            fail(key, rule.expected or "a table", value)
        return _build(hint, value, key, fail)
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
    """``value`` as a ``hint`` (bool, int, float, str, dict[str, X]), or ``_BAD``; an int is a float too."""
    if (
        hint is Any
    ):  # a probe's expected answer: any TOML value, checked by its grader's rule (kevload.inputs.grading)
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


def _ramp(fail: _Failer, table: Mapping[str, Any], where: str) -> Ramp:
    """``load.ramp`` checked key by key: its levels' kind depends on ``of`` (whole for concurrency), so
    from, to and step are checked here beside the rules of the other fields."""
    _known(table, where, {key_of(f) for f in fields(Ramp)}, fail)
    by_key = {key_of(f): f for f in fields(Ramp)}
    of = _value(table.get("of", "concurrency"), RampOf, Rule(), f"{where}.of", fail)
    whole = of == "concurrency"
    kind = (
        f"an integer from 1 to {MAX_CONCURRENCY:,}"
        if whole
        else f"a number > 0, at most {MAX_RATE:,} (requests per second)"
    )

    def level(key: str, expected: str) -> float | None:
        value = table.get(key)
        if value is None:
            return None
        number = (
            not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
        )
        if not number or not (
            isinstance(value, int) and 1 <= value <= MAX_CONCURRENCY
            if whole
            else 0 < value <= MAX_RATE
        ):
            fail(f"{where}.{key}", expected, value)
        checked: float = value  # a number, checked above
        return checked

    start, to = level("from", kind), level("to", kind)
    if start is None:
        fail(f"{where}.from", kind, None)
    if to is None:
        fail(f"{where}.to", kind, None)
    if to < start:
        fail(f"{where}.to", f"a level >= {where}.from ({start})", to)
    step = level("step", kind.replace("(requests per second)", "(added per level)"))
    factor, every_s = (
        _value(table.get(k), float | None, rule_of(by_key[k]), f"{where}.{k}", fail)
        for k in ("factor", "every_s")
    )
    if (step is None) == (factor is None):
        fail(
            where,
            "exactly one of step (levels step apart) or factor (each level factor times the last)",
            sorted(k for k in table if k in ("step", "factor") and table[k] is not None),
        )
    if step:
        count = (to - start) / step
    else:
        assert factor is not None  # exactly one of step and factor, checked above
        count = math.log(to / start) / math.log(factor)
    if count + 1 > MAX_RAMP_LEVELS:
        fail(
            where,
            f"at most {MAX_RAMP_LEVELS} levels (a larger step or factor)",
            math.floor(count) + 1,
        )
    return Ramp(of=of, start=start, to=to, step=step, factor=factor, every_s=every_s)


def _set_key(scenario: Scenario, key: str, value: Any, fail: _Failer) -> Scenario:
    """``scenario`` with one dotted key set through its field's rule (not yet validated as a whole)."""
    parts = key.split(".")
    if not all(parts):
        fail(key, "a dotted key such as load.concurrency", key)
    head, rest = parts[0], parts[1:]
    if head == "params":
        params = _with_path(scenario.params, rest, value, "params", fail) if rest else value
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
            obj = _unramped(obj)  # the ramp changes: validate expands its levels again
        scenario = replace(scenario, **{head: _set_path(obj, rest, value, head, fail)})
    elif head in ("target", "load", "probes"):
        fail(
            key,
            f"a key inside [{head}], such as load.samples"
            if head != "probes"
            else "probes written in the scenario file (a setting changes one key)",
            value,
        )
    else:
        _known({head: value}, "", {"name", "params", "target", "load"}, fail)
    return replace(scenario, raw=_with_path(scenario.raw, parts, value, "", fail))


def _set_path(obj: Any, parts: list[str], value: Any, where: str, fail: _Failer) -> Any:
    """``obj`` (a dataclass) with the field at ``parts`` set to ``value`` through its rule."""
    by_key = {key_of(f): f for f in fields(obj)}
    head, rest = parts[0], parts[1:]
    _known({head: value}, where, set(by_key), fail)
    f = by_key[head]
    if isinstance(obj, Ramp):
        # Checked as a whole when validated: the kind of its levels depends on ``of``, which may be
        # set too.
        return replace(obj, **{f.name: value})
    # A class is hashable: mypy checks an instance's __hash__ against functools.cache.
    hint, key = _hints(type(obj))[f.name], f"{where}.{head}"  # type: ignore[arg-type]
    current = getattr(obj, f.name)
    if rest and is_dataclass(current):
        new = _set_path(current, rest, value, key, fail)
    elif rest and (current is None or isinstance(current, dict)):
        new = _value(_with_path(current or {}, rest, value, key, fail), hint, rule_of(f), key, fail)
    elif rest:
        fail(key, "a table (to set a key inside it)", current)
    else:
        new = _value(value, hint, rule_of(f), key, fail)
    return replace(obj, **{f.name: new})


def _with_path(
    table: Mapping[str, Any], parts: list[str], value: Any, where: str, fail: _Failer
) -> dict[str, Any]:
    """A copy of ``table`` with ``value`` at the dotted ``parts`` (tables on the way made or copied)."""
    head = parts[0]
    key = f"{where}.{head}" if where else head
    if len(parts) == 1:
        return {**table, head: list(value) if isinstance(value, tuple) else value}
    child = table.get(head, {})
    if not isinstance(child, dict):
        fail(key, "a table (to set a key inside it)", child)
    return {**table, head: _with_path(child, parts[1:], value, key, fail)}


def _as_table(obj: Any) -> dict[str, Any]:
    """The fields of ``obj`` that differ from their defaults, under their TOML keys, as TOML values."""
    out = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if value != default or default is MISSING:
            out[key_of(f)] = (
                _as_table(value)
                if is_dataclass(value)
                else [
                    dict(x) if isinstance(x, dict) else _as_table(x) if is_dataclass(x) else x
                    for x in value
                ]
                if isinstance(value, tuple)
                else value
            )
    return out


def check_base_url(url: str, source: str) -> None:
    """``url`` as target.base_url takes it, or a ScenarioError naming ``source`` (an option such as ``--url``) and
    the key: for a command that gives a server's URL outside a scenario, refused as a scenario's would be."""
    _check_url(_Failer(source), "target.base_url", url, BASE_URL_EXPECTED)


def url_problem(url: str) -> str | None:
    """Why ``url`` is no http(s) URL that can be sent to as written, in a few words; None when it is one. Checked
    whole at load, so a bad one is bad input there: a port out of range or an open IPv6 bracket would raise in the
    client mid-run, and a blank (a copy-pasted trailing space) would go raw into the request line."""
    if any(ord(ch) <= 0x20 or ord(ch) >= 0x7F for ch in url):
        return "no spaces, control or non-ASCII characters: percent-encode them, a host as punycode (xn--…)"
    try:
        parsed = urlsplit(url)
        port = parsed.port
    except ValueError as exc:
        if "IPv6" in str(exc):
            return "an IPv6 host in closed brackets, e.g. http://[::1]:8000/v1"
        if "Port" in str(exc):
            return "a port from 1 to 65535"
        return str(exc)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return "a host after http:// or https://"
    if port == 0:
        return "a port from 1 to 65535"
    return None


def _check_url(fail: _Failer, key: str, url: str, expected: str) -> None:
    problem = url_problem(url)
    if problem is not None:
        fail(key, f"{expected} ({problem})", shown_url(url))


def shown_url(url: str) -> str:
    """``url`` as a message quotes it, any ``user:password@`` shown as ``***@``: a password never goes into a
    message. Read without urlsplit, which raises on the very URLs shown here."""
    rest = url.partition("://")[2]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    userinfo, at, _ = authority.rpartition("@")
    return url.replace(userinfo + at, "***@", 1) if at else url


def _check_metrics_url(fail: _Failer, url: str) -> None:
    if url == "auto" or url in METRICS_OFF:
        return
    _check_url(fail, "target.metrics_url", url, METRICS_URL_EXPECTED)
    if "@" in urlsplit(url).netloc:
        # The metrics are read without credentials; one written here would land in run.json.
        fail("target.metrics_url", METRICS_URL_EXPECTED, shown_url(url))


def _show(value: Any) -> str:
    if value is None:
        return "nothing"
    return shortened(repr(value), 80, "...")
