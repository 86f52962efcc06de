"""The scenario's keys: [target] and [load] (with load.slo, load.ramp) as frozen dataclasses whose
fields carry their own rules (``probe.rule``), and the bounds those rules share."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from kevload.inputs.fieldrules import Failer, known_keys, read_value
from kevload.inputs.gradeworker import DEFAULT_TIMEOUT
from kevload.inputs.probe import Rule, key_of, rule, rule_of
from kevload.inputs.trace import MAX_SPEEDUP, MAX_TRACE_SECONDS, MAX_TRACE_TOKENS
from kevload.inputs.urls import METRICS_URL_EXPECTED

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
# worker processes or Ray actors of one run (without Ray, 4 a core: kevload.load.workers)
MAX_WORKERS = 1024
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
    # the base URL's origin + /metrics, "" or "off" reads nothing.
    metrics_url: str = rule("auto", expected=METRICS_URL_EXPECTED)


_MS = {"above": 0, "below": math.inf, "expected": "a number of milliseconds > 0"}


@dataclass(frozen=True)
class Slo:
    """Per-request latency bounds in milliseconds (None: not bounded). A request meets the SLO when
    it is ok and within every given bound; ``itl_ms`` and ``tpot_ms`` bound the request's mean gap,
    the quantities the latency table reports."""

    ttft_ms: float | None = rule(None, **_MS)
    itl_ms: float | None = rule(None, **_MS)
    tpot_ms: float | None = rule(None, **_MS)
    e2e_ms: float | None = rule(None, **_MS)

    def bounds(self) -> dict[str, float]:
        """The given bounds only, by name: ``{"ttft_ms": 500.0, "e2e_ms": 10000.0}``."""
        return {name: getattr(self, name) for name in SLO_BOUNDS if getattr(self, name) is not None}


@dataclass(frozen=True)
class Ramp:
    """A stepped ramp (``load.ramp``): levels of concurrency or of rate from ``start`` to ``to``,
    ``step`` apart or each ``factor`` times the one before, ``to`` always the last; each level is a
    cell lasting ``every_s`` seconds (None: until ``load.samples``). Expanded by ``validate`` into
    ``load.concurrency`` or ``load.rate`` (and ``load.duration``), so the engine sees ordinary
    levels.

    ``start``, ``to`` and ``step`` are levels, whose kind depends on ``of`` (whole for concurrency):
    they are checked by ``from_table``, not by their field rules alone."""

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
                assert self.factor is not None  # a ramp has a step or a factor (from_table)
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

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str, fail: Failer) -> Ramp:
        """``load.ramp`` checked key by key: its levels' kind depends on ``of`` (whole for
        concurrency), so from, to and step are checked here beside the rules of the other fields."""
        known_keys(table, where, {key_of(f) for f in fields(cls)}, fail)
        by_key = {key_of(f): f for f in fields(cls)}
        of = read_value(table.get("of", "concurrency"), RampOf, Rule(), f"{where}.of", fail)
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
                not isinstance(value, bool)
                and isinstance(value, int | float)
                and math.isfinite(value)
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
            read_value(table.get(k), float | None, rule_of(by_key[k]), f"{where}.{k}", fail)
            for k in ("factor", "every_s")
        )
        if (step is None) == (factor is None):
            fail(
                where,
                "exactly one of step (levels step apart) or factor (each level factor times the "
                "last)",
                sorted(k for k in table if k in ("step", "factor") and table[k] is not None),
            )
        _few_enough_levels(fail, where, start, to, step, factor)
        return cls(of=of, start=start, to=to, step=step, factor=factor, every_s=every_s)


def _few_enough_levels(
    fail: Failer, where: str, start: float, to: float, step: float | None, factor: float | None
) -> None:
    """A ramp of at most ``MAX_RAMP_LEVELS`` levels: each is a cell run in turn."""
    if step:
        count = (to - start) / step
    else:
        assert factor is not None  # exactly one of step and factor (Ramp.from_table)
        count = math.log(to / start) / math.log(factor)
    if count + 1 > MAX_RAMP_LEVELS:
        fail(
            where,
            f"at most {MAX_RAMP_LEVELS} levels (a larger step or factor)",
            math.floor(count) + 1,
        )


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
    # relative to the scenario file; one open-loop level per speed-up, after the closed-loop levels
    # (load.concurrency: c=1, the serial reference).
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
    # load.seed, cut after so many seconds or so many streamed chunks, whichever comes first.
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


DEFAULT_LOAD = Load()
