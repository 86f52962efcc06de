"""Scenario files (TOML) into validated, frozen dataclasses; every error names file, key and expectation."""

from __future__ import annotations

import difflib
import math
import os
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import orjson

from kevload.errors import ScenarioError

if TYPE_CHECKING:
    from kevload.datasets import Dataset

MODES = ("single", "mixed", "prefix", "needle")
ARRIVALS = ("constant", "poisson")
APIS = ("chat", "completions")
# Bounds that need the first token's time, which only a streamed answer shows.
STREAMED_BOUNDS = ("ttft_ms", "itl_ms", "tpot_ms")
SLO_BOUNDS = (*STREAMED_BOUNDS, "e2e_ms")
RAMP_OF = ("concurrency", "rate")
MAX_RAMP_LEVELS = 1000  # each level is a cell run in turn: more than this is a typo, not a test
# kevload sets this header itself, unique per request, so records join the server's logs: never the user's.
REQUEST_ID_HEADER = "X-Request-Id"


@dataclass(frozen=True)
class Target:
    base_url: str
    model: str
    api: str = "chat"
    timeout: float = 60.0
    api_key_env: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    max_response_bytes: int = 8 * 2**20   # a longer answer is cut: status too_large
    max_seconds: float = 0.0              # a request still running after this long is cut: timeout (0: no limit)


@dataclass(frozen=True)
class Probe:
    id: str
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    max_tokens: int = 64

    @property
    def text(self) -> str:
        """The part of the input that companions may share a prefix with: the last message's content."""
        if self.prompt is not None:
            return self.prompt
        assert self.messages is not None
        return self.messages[-1]["content"]

    def with_text(self, text: str, id: str) -> Probe:
        """The same input with ``text`` in place of ``self.text`` (earlier chat messages kept), as ``id``."""
        if self.prompt is not None:
            return replace(self, id=id, prompt=text)
        return replace(self, id=id, messages=(*self.messages[:-1], {**self.messages[-1], "content": text}))


@dataclass(frozen=True)
class Slo:
    """Per-request latency bounds in milliseconds (None: not bounded). A request meets the SLO when it
    is ok and within every given bound; ``itl_ms`` and ``tpot_ms`` bound the request's mean gap, the
    quantities the latency table reports."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def bounds(self) -> dict[str, float]:
        """The given bounds only, by name: ``{"ttft_ms": 500.0, "e2e_ms": 10000.0}``."""
        return {name: getattr(self, name) for name in SLO_BOUNDS if getattr(self, name) is not None}


@dataclass(frozen=True)
class Ramp:
    """A stepped ramp (``load.ramp``): levels of concurrency or of rate from ``start`` to ``to``, ``step``
    apart or each ``factor`` times the one before, ``to`` always the last; each level is a cell lasting
    ``every_s`` seconds (None: until ``load.samples``). Expanded at load into ``load.concurrency`` or
    ``load.rate`` (and ``load.duration``), so the engine sees ordinary levels."""

    of: str
    start: float                  # TOML ``from`` (a Python keyword)
    to: float
    step: float | None = None
    factor: float | None = None
    every_s: float | None = None

    def levels(self) -> tuple[float, ...]:
        values: list[float] = []
        while True:
            k = len(values)
            value = self.start + k * self.step if self.step else self.start * self.factor ** k
            if value > self.to * (1 + 1e-9):  # a float step landing a hair past ``to`` still lands on it
                break
            values.append(value)
        if not math.isclose(values[-1], self.to, rel_tol=1e-9):
            values.append(self.to)
        if self.of == "concurrency":
            # Half up, not Python's half-to-even: 2.5 in flight rounds the way a reader expects, to 3.
            return tuple(sorted({math.floor(v + 0.5) for v in values}))
        return tuple(sorted({round(float(v), 6) for v in values}))


@dataclass(frozen=True)
class Load:
    mode: str = "single"
    concurrency: tuple[int, ...] = (1,)
    samples: int = 8
    stream: bool = False
    nonce: bool = True
    max_error_share: float = 0.1
    companions: str = "builtin"
    prefix_lengths: tuple[int, ...] = (16, 64, 256, 1024)
    needle_length: int = 2000
    warmup: int = 0
    seed: int = 0
    rate: tuple[float, ...] = ()   # open loop: requests/s levels, instead of closed-loop concurrency
    arrival: str = "constant"      # constant | poisson
    max_in_flight: int = 0         # open loop cap on requests in flight (0: none)
    duration: float = 0.0          # seconds per level, closed or open loop (0: until the samples are sent)
    retries: int = 0               # retries of 429/503 (none by default: a retry hides evidence)
    dataset_seed: int = 0          # which lines JSONL datasets contribute (--dataset-seed)
    companion_count: int = 0       # lines chosen from a load.companions file (0: every line)
    slo: Slo | None = None         # per-request latency bounds: slo_attainment and goodput per cell
    min_slo_attainment: float | None = None  # a probe cell below this share fails (JUnit, exit 1)
    logprobs: str | bool = "auto"  # per-token logprobs: true, false, "auto" (if one check finds them)
    ramp: Ramp | None = None       # a stepped ramp, expanded into concurrency or rate (and duration)
    ramp_s: float = 0.0            # seconds at each level's load before its sends count (a timed warm-up)
    until_bound: float | None = None  # sample each cell until drift or a 95 % drift-rate bound this low
    max_samples: int = 1000           # … but never more counted probe samples per cell than this
    workers: int = 1               # processes sharing each level (kevload.workers)


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str
    target: Target
    probes: tuple[Probe, ...]
    params: dict[str, Any]
    load: Load
    raw: dict[str, Any]
    datasets: tuple[Dataset, ...] = ()  # JSONL files read for probes and companions: hashes, seed, lines chosen

    def api_key(self) -> str | None:
        """The key from the environment; only ever held in memory."""
        if self.target.api_key_env is None:
            return None
        key = os.environ.get(self.target.api_key_env)
        if not key:
            raise ScenarioError(
                f"{self.source}: target.api_key_env: environment variable {self.target.api_key_env} is not set"
            )
        return key


def iter_jsonl(path: Path, what: str) -> Iterator[tuple[int, Any]]:
    """(line number, object) for each non-blank line of a user's JSONL file, streamed.

    Errors name the file and line; ``what`` says which input it is (e.g. "load.companions").
    """
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ScenarioError(f"{path}: {what}: cannot read: {exc.strerror}") from None
    with handle:
        yield from parse_jsonl(handle, path, what)


def parse_jsonl(lines: Iterable[bytes], path: Path, what: str) -> Iterator[tuple[int, Any]]:
    """(line number, object) for each non-blank line; the first that is not JSON is an error naming it."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield number, orjson.loads(line)
        except orjson.JSONDecodeError:
            raise ScenarioError(f"{path}:{number}: {what}: expected one JSON object a line (JSONL)") from None


def load_scenario(path: str | Path, overrides: list[str] = ()) -> Scenario:
    """Read, override and validate a scenario file."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
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


def apply_override(raw: dict[str, Any], override: str, source: str = "--set") -> None:
    """Apply one ``KEY=VALUE`` (VALUE read as TOML, a bare word taken as a string) to ``raw``."""
    key, sep, value_text = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ScenarioError(f"--set {override!r}: expected KEY=VALUE, e.g. --set 'load.concurrency=[1,4]'")
    try:
        value = tomllib.loads(f"v = {value_text}")["v"]
    except tomllib.TOMLDecodeError:
        value = value_text
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ScenarioError(f"--set {key}: {part} is not a table")
        node = child
    node[parts[-1]] = value


def scenario_from_dict(raw: dict[str, Any], *, source: str, name: str = "scenario") -> Scenario:
    """Validate an already parsed scenario; the loader and programmatic callers share this."""
    v = _Validator(source)
    v.known(raw, "", {"name", "target", "probes", "params", "load"})
    target_raw = v.table(raw, "target", required=True)
    target = v.build(Target, target_raw, "target", _TARGET_RULES)
    _check_url(v, target.base_url)
    v.choice(target.api, "target.api", APIS)
    if target.timeout <= 0:
        v.fail("target.timeout", "a number of seconds > 0", target.timeout)
    if target.max_response_bytes < 1:
        v.fail("target.max_response_bytes", "an integer >= 1 (bytes)", target.max_response_bytes)
    if target.max_seconds < 0:
        v.fail("target.max_seconds", "seconds >= 0 (0: no limit)", target.max_seconds)
    for header in target.headers:
        if header.lower() == REQUEST_ID_HEADER.lower():
            # Refused, not overridden: one fixed value on every request would join nothing. The value,
            # like every header value, stays out of the message.
            raise ScenarioError(f"{source}: target.headers.{header}: expected no {REQUEST_ID_HEADER} header "
                                "(kevload sends its own, unique per request, and records it as request_id)")

    probes_raw = raw.get("probes")
    if not isinstance(probes_raw, list) or not probes_raw:
        v.fail("probes", "at least one [[probes]] table", probes_raw)
    params = v.table(raw, "params")
    for reserved in ("model", "prompt", "messages", "stream"):
        if reserved in params:
            v.fail(f"params.{reserved}", f"no {reserved} here (it is set by target/probes/load)", params[reserved])
    if "n" in params and (type(params["n"]) is not int or params["n"] != 1):
        # Several choices in one response are several answers; kevload compares one per request.
        v.fail("params.n", "1 or no n (one answer per request is compared; ask for more load.samples instead)",
               params["n"])

    load_table = v.table(raw, "load")
    load = v.build(Load, load_table, "load", _LOAD_RULES)
    if load.ramp is not None:
        ramp = _ramp(v, load.ramp, given=set(load_table))
        levels = ramp.levels()
        load = replace(load, ramp=ramp, duration=ramp.every_s or load.duration,
                       **({"concurrency": tuple(int(x) for x in levels)} if ramp.of == "concurrency"
                          else {"rate": levels}))
    if load.ramp_s < 0:
        v.fail("load.ramp_s", "seconds >= 0 (0: no ramp-up)", load.ramp_s)
    v.choice(load.mode, "load.mode", MODES)
    if not load.concurrency or any(c < 1 for c in load.concurrency):
        v.fail("load.concurrency", "a non-empty list of integers >= 1", list(load.concurrency))
    if load.samples < 1:
        v.fail("load.samples", "an integer >= 1", load.samples)
    if not 0 <= load.max_error_share <= 1:
        v.fail("load.max_error_share", "a share between 0 and 1", load.max_error_share)
    if load.warmup < 0:
        v.fail("load.warmup", "an integer >= 0", load.warmup)
    v.choice(load.arrival, "load.arrival", ARRIVALS)
    if load.max_in_flight < 0:
        v.fail("load.max_in_flight", "an integer >= 0 (0: no cap)", load.max_in_flight)
    if load.retries < 0:
        v.fail("load.retries", "an integer >= 0", load.retries)
    if load.duration < 0:
        v.fail("load.duration", "seconds >= 0 (0: until the samples are sent)", load.duration)
    if load.logprobs not in ("auto", True, False):
        v.fail("load.logprobs", '"auto", true or false', load.logprobs)
    if any(n < 1 for n in load.prefix_lengths):
        v.fail("load.prefix_lengths", "a list of integers >= 1", list(load.prefix_lengths))
    if load.workers < 1:
        v.fail("load.workers", "an integer >= 1 (processes sharing each level)", load.workers)
    elif load.workers > 1 and load.until_bound is not None:
        # The stop rule holds every answer against the serial one; workers share counts, not answers.
        v.fail("load.workers", "1 with load.until_bound (sampling until a bound runs in one process)", load.workers)
    elif 0 < load.max_in_flight < load.workers:
        v.fail("load.max_in_flight", f"0 or at least load.workers ({load.workers}): each worker holds a share of "
               "the cap", load.max_in_flight)
    if load.companion_count < 0:
        v.fail("load.companion_count", "an integer >= 0 (0: every line)", load.companion_count)
    if load.slo is not None:
        load = replace(load, slo=_slo(v, load.slo, load.stream))
    if load.min_slo_attainment is not None:
        if load.slo is None:
            v.fail("load.min_slo_attainment", "a load.slo table beside it (the bounds to attain)",
                   load.min_slo_attainment)
        if not 0 <= load.min_slo_attainment <= 1:
            v.fail("load.min_slo_attainment", "a share between 0 and 1", load.min_slo_attainment)
    if load.until_bound is not None:
        _until_bound(v, load)
    load = replace(load, concurrency=tuple(sorted(set(load.concurrency))), rate=tuple(sorted(set(load.rate))))
    probes, datasets = _probes_and_datasets(v, probes_raw, load)
    ids = [p.id for p in probes]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        v.fail("probes.id", "unique ids", duplicates)
    return Scenario(name=str(name), source=source, target=target, probes=probes, params=params, load=load, raw=raw,
                    datasets=datasets)


_TARGET_RULES: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "base_url": (str, True),
    "model": (str, True),
    "api": (str, False),
    "timeout": ((int, float), False),
    "api_key_env": (str, False),
    "headers": (dict, False),
    "max_response_bytes": (int, False),
    "max_seconds": ((int, float), False),
}

_LOAD_RULES: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "mode": (str, False),
    "concurrency": (list, False),
    "samples": (int, False),
    "stream": (bool, False),
    "nonce": (bool, False),
    "max_error_share": ((int, float), False),
    "companions": (str, False),
    "prefix_lengths": (list, False),
    "needle_length": (int, False),
    "warmup": (int, False),
    "seed": (int, False),
    "rate": (list, False),
    "arrival": (str, False),
    "max_in_flight": (int, False),
    "duration": ((int, float), False),
    "retries": (int, False),
    "dataset_seed": (int, False),
    "companion_count": (int, False),
    "slo": (dict, False),
    "min_slo_attainment": ((int, float), False),
    "logprobs": ((str, bool), False),
    "ramp": (dict, False),
    "ramp_s": ((int, float), False),
    "until_bound": ((int, float), False),
    "max_samples": (int, False),
    "workers": (int, False),
}

_LIST_OF_INT = {"load.concurrency", "load.prefix_lengths"}
_LIST_OF_NUMBER = {"load.rate"}


def _probes_and_datasets(v: _Validator, items: list[Any], load: Load) -> tuple[tuple[Probe, ...], tuple[Dataset, ...]]:
    """Inline probes and ``[[probes]] dataset = ...`` entries in their order; companion files too, when used.

    Files are read here, at validation, so a bad line fails before anything is sent and the run
    records the exact bytes (by hash) it used. Relative paths are relative to the scenario file.
    """
    from kevload.datasets import read_dataset  # datasets builds on this module's Probe and ScenarioError

    base = Path(v.source).parent
    probes: list[Probe] = []
    datasets = []
    for i, item in enumerate(items):
        where = f"probes[{i}]"
        if not (isinstance(item, dict) and "dataset" in item):
            probes.append(_probe(v, item, where))
            continue
        v.known(item, where, {"dataset", "count", "max_tokens"})
        count, max_tokens = item.get("count", 0), item.get("max_tokens", 64)
        for key, value, expected in (("count", count, 0), ("max_tokens", max_tokens, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < expected:
                v.fail(f"{where}.{key}", f"an integer >= {expected}" + (" (0: every line)" if not expected else ""),
                       value)
        if not isinstance(item["dataset"], str) or not item["dataset"]:
            v.fail(f"{where}.dataset", "the path of a JSONL file", item["dataset"])
        dataset = read_dataset(base / item["dataset"], role="probe", what=f"{where}.dataset", seed=load.dataset_seed,
                               count=count, count_key=f"{where}.count", max_tokens=max_tokens)
        datasets.append(dataset)
        probes.extend(dataset.items)
    if load.mode == "mixed" and load.companions != "builtin":
        datasets.append(read_dataset(base / load.companions, role="companion", what="load.companions",
                                     seed=load.dataset_seed, count=load.companion_count,
                                     count_key="load.companion_count"))
    return tuple(probes), tuple(datasets)


def _probe(v: _Validator, item: Any, where: str) -> Probe:
    if not isinstance(item, dict):
        v.fail(where, "a table with id and prompt or messages", item)
    v.known(item, where, {"id", "prompt", "messages", "max_tokens"})
    pid = item.get("id")
    if not isinstance(pid, str) or not pid:
        v.fail(f"{where}.id", "a non-empty string", pid)
    has_prompt, has_messages = "prompt" in item, "messages" in item
    if has_prompt == has_messages:
        v.fail(where, "exactly one of prompt or messages", sorted(k for k in item if k in ("prompt", "messages")))
    messages = None
    if has_prompt and not isinstance(item["prompt"], str):
        v.fail(f"{where}.prompt", "a string", item["prompt"])
    if has_messages:
        messages = _messages(v, item["messages"], f"{where}.messages")
    max_tokens = item.get("max_tokens", 64)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        v.fail(f"{where}.max_tokens", "an integer >= 1", max_tokens)
    return Probe(id=pid, prompt=item.get("prompt"), messages=messages, max_tokens=max_tokens)


def _until_bound(v: _Validator, load: Load) -> None:
    if not 0 < load.until_bound < 1:
        v.fail("load.until_bound", "a share between 0 and 1, e.g. 0.05 (a 5 % bound on the drift rate)",
               load.until_bound)
    if load.rate:
        # A rate level promises a schedule that does not depend on the answers; stopping on them would break it.
        v.fail("load.until_bound", "closed-loop levels only (load.concurrency): a load.rate level sends on a "
               "schedule, not until a claim is strong; remove one of them", load.until_bound)
    if load.duration:
        v.fail("load.until_bound", "levels that end on their samples, not on a clock: load.duration (or "
               "load.ramp.every_s) is set too; remove one of them", load.until_bound)
    if load.max_samples < load.samples:
        v.fail("load.max_samples", f"an integer >= load.samples ({load.samples})", load.max_samples)


def _slo(v: _Validator, table: dict[str, Any], stream: bool) -> Slo:
    v.known(table, "load.slo", set(SLO_BOUNDS))
    if not table:
        v.fail("load.slo", f"at least one of {', '.join(SLO_BOUNDS)}", table)
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            v.fail(f"load.slo.{key}", "a number of milliseconds > 0", value)
        if key in STREAMED_BOUNDS and not stream:
            # Refused rather than guessed: without streaming the first token arrives with the whole
            # answer, so TTFT would only restate e2e and ITL/TPOT would not be measured at all.
            v.fail(f"load.slo.{key}", "load.stream = true beside it (only a streamed answer shows its first "
                   "token's time)", value)
    return Slo(**{key: float(value) for key, value in table.items()})


def _ramp(v: _Validator, table: dict[str, Any], *, given: set[str]) -> Ramp:
    """``load.ramp`` checked key by key; ``given`` is the keys written in [load], for the conflicts."""
    v.known(table, "load.ramp", {"of", "from", "to", "step", "factor", "every_s"})
    of = table.get("of", "concurrency")
    if not isinstance(of, str):
        v.fail("load.ramp.of", f"one of {', '.join(RAMP_OF)}", of)
    v.choice(of, "load.ramp.of", RAMP_OF)
    # The ramp gives the levels (and every_s their length): a second source of either is a contradiction.
    for clash, sets in (("concurrency", "levels"), ("rate", "levels"), ("duration", "seconds per level")):
        if clash in given and (clash != "duration" or "every_s" in table):
            where = "load.ramp.every_s" if clash == "duration" else "load.ramp"
            raise ScenarioError(f"{v.source}: {where} and load.{clash}: give one of them (the ramp sets the {sets})")
    whole = of == "concurrency"
    kind = "an integer >= 1" if whole else "a number > 0 (requests per second)"

    def number(key: str, expected: str, ok) -> float | None:
        value = table.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not ok(value):
            v.fail(f"load.ramp.{key}", expected, value)
        return value

    def level(value: Any) -> bool:
        return value >= 1 and isinstance(value, int) if whole else value > 0

    start, to = (number(key, kind, level) for key in ("from", "to"))
    for key, value in (("from", start), ("to", to)):
        if value is None:
            v.fail(f"load.ramp.{key}", kind, None)
    if to < start:
        v.fail("load.ramp.to", f"a level >= load.ramp.from ({start})", to)
    step = number("step", kind.replace("(requests per second)", "(added per level)"), level)
    factor = number("factor", "a number > 1 (each level that many times the one before)", lambda x: x > 1)
    if (step is None) == (factor is None):
        v.fail("load.ramp", "exactly one of step (levels step apart) or factor (each level factor times the last)",
               sorted(k for k in table if k in ("step", "factor")))
    every_s = number("every_s", "seconds > 0 per level (none: each level runs until load.samples)", lambda x: x > 0)
    count = (to - start) / step if step else math.log(to / start) / math.log(factor)
    if count + 1 > MAX_RAMP_LEVELS:
        v.fail("load.ramp", f"at most {MAX_RAMP_LEVELS} levels (a larger step or factor)", math.floor(count) + 1)
    return Ramp(of=of, start=start, to=to, step=step, factor=factor,
                every_s=float(every_s) if every_s is not None else None)


def _messages(v: _Validator, value: Any, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        v.fail(where, "a non-empty list of {role, content} tables", value)
    for i, message in enumerate(value):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            v.fail(f"{where}[{i}]", "a table with string role and content", message)
    return tuple(dict(m) for m in value)


def _check_url(v: _Validator, url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        userinfo, at, _ = parsed.netloc.rpartition("@")
        shown = url.replace(userinfo + at, "***@", 1) if at else url  # a password never goes into a message
        v.fail("target.base_url", "an http:// or https:// URL such as http://127.0.0.1:8000/v1", shown)


class _Validator:
    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, expected: str, got: Any) -> None:
        raise ScenarioError(f"{self.source}: {key}: expected {expected}, got {_show(got)}")

    def known(self, table: dict[str, Any], where: str, allowed: set[str]) -> None:
        for key in table:
            if key not in allowed:
                full = f"{where}.{key}" if where else key
                hint = difflib.get_close_matches(key, sorted(allowed), n=1)
                maybe = f" (did you mean {hint[0]}?)" if hint else ""
                raise ScenarioError(
                    f"{self.source}: {full}: unknown key{maybe}; expected one of {', '.join(sorted(allowed))}"
                )

    def table(self, raw: dict[str, Any], key: str, required: bool = False) -> dict[str, Any]:
        value = raw.get(key)
        if value is None:
            if required:
                self.fail(key, f"a [{key}] table", None)
            return {}
        if not isinstance(value, dict):
            self.fail(key, f"a [{key}] table", value)
        return value

    def choice(self, value: str, key: str, choices: tuple[str, ...]) -> None:
        if value not in choices:
            hint = difflib.get_close_matches(value, choices, n=1)
            maybe = f" (did you mean {hint[0]}?)" if hint else ""
            self.fail(key, f"one of {', '.join(choices)}{maybe}", value)

    def build(self, cls: type, table: dict[str, Any], where: str,
              rules: dict[str, tuple[type | tuple[type, ...], bool]]):
        self.known(table, where, set(rules))
        values: dict[str, Any] = {}
        for key, (kind, required) in rules.items():
            full = f"{where}.{key}"
            if key not in table:
                if required:
                    self.fail(full, f"a {_kind_name(kind)}", None)
                continue
            value = table[key]
            bad_bool = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
            if bad_bool or not isinstance(value, kind):
                self.fail(full, f"a {_kind_name(kind)}", value)
            if full in _LIST_OF_INT:
                if not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
                    self.fail(full, "a list of integers", value)
                value = tuple(value)
            if full in _LIST_OF_NUMBER:
                if not all(isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in value):
                    self.fail(full, "a list of numbers > 0 (requests per second)", value)
                value = tuple(float(x) for x in value)
            if key == "headers" and not all(isinstance(x, str) for x in value.values()):
                self.fail(full, "a table of string values", value)
            values[key] = float(value) if kind == (int, float) else value
        return cls(**values)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "string", int: "integer", bool: "boolean (true/false)", list: "list", dict: "table"}
    if kind == (int, float):
        return "number"
    if isinstance(kind, tuple):
        return " or ".join(names[k] for k in kind)
    return names[kind]


def _show(value: Any) -> str:
    if value is None:
        return "nothing"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
