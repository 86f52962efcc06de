"""The rules between a scenario's [load] keys, and between [load] and its probes, on values that
already meet their own field rules; each refusal names the key and what would go with it."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from kevload.errors import ScenarioError
from kevload.inputs.datasets import Dataset
from kevload.inputs.fieldrules import Failer, hints, read_value
from kevload.inputs.probe import Probe, rule_of
from kevload.inputs.scenariokeys import DEFAULT_LOAD, SLO_BOUNDS, STREAMED_BOUNDS, Load
from kevload.inputs.trace import TraceDataset

_LOAD_FIELDS = {f.name: f for f in fields(Load)}


def checked_load(fail: Failer, load: Load) -> Load:
    """The rules between [load]'s keys, on a load whose every field already meets its own rule; the
    ramp expanded, the levels sorted."""
    if load.ramp is not None:
        load = _ramped(fail, load)
    _workers(fail, load)
    _slo(fail, load)
    if load.until_bound is not None:
        _until_bound(fail, load)
    _cancel(fail, load)
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


def _workers(fail: Failer, load: Load) -> None:
    """What worker processes share: counts and the in-flight cap, not answers."""
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


def _slo(fail: Failer, load: Load) -> None:
    """An SLO bounds something measured: a streamed answer's first token; a required attainment, an
    SLO."""
    if load.slo is not None:
        if not load.slo.bounds():
            fail("load.slo", f"at least one of {', '.join(SLO_BOUNDS)}", load.slo.bounds())
        for key, value in load.slo.bounds().items():
            if key in STREAMED_BOUNDS and not load.stream:
                # Refused rather than guessed: without streaming the first token arrives with the
                # whole answer, so TTFT would only restate e2e and ITL/TPOT would not be measured at
                # all.
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


def _until_bound(fail: Failer, load: Load) -> None:
    """Sampling until a bound: closed-loop levels that end on their samples, and room for more of
    them."""
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
        fail("load.max_samples", f"an integer >= load.samples ({load.samples})", load.max_samples)


def _cancel(fail: Failer, load: Load) -> None:
    """Cancelling companions: when to cut, something to count when cut by tokens, and companions to
    cut."""
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


def _traced(fail: Failer, load: Load) -> None:
    """A trace sets its levels' arrivals, companions and length: the keys that would set them too
    are refused."""
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


def _cold_warm(fail: Failer, load: Load) -> None:
    """Cold and warm are compared serially, one round after another: under batching a difference
    could be the batch's, a warm-up would warm the cache, and a round needs both its samples."""
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
        if value != getattr(DEFAULT_LOAD, key[5:]):
            fail(key, expected, list(value) if isinstance(value, tuple) else value)
    if load.samples % 2:
        fail(
            "load.samples",
            'an even number with load.prefix_cache = "cold_warm" (each round: one cold '
            "sample, one warm)",
            load.samples,
        )


def fits_trace(fail: Failer, load: Load, trace: TraceDataset) -> None:
    """The keys that depend on the trace read: its levels' keys (rates) and the ramp its probes come
    after."""
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


def _ramped(fail: Failer, load: Load) -> Load:
    """The ramp's levels (and every_s) written into the load; a level or a length given beside it is
    a contradiction, unless it is the ramp's own (``validate`` runs again on what it returned)."""
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
        read_value(value, hints(Load)[name], rule_of(_LOAD_FIELDS[name]), "load.ramp", fail)
    for clash in ("concurrency", "rate"):
        value = getattr(load, clash)
        if value not in (getattr(DEFAULT_LOAD, clash), own.get(clash)):
            raise ScenarioError(
                f"{fail.source}: load.ramp and load.{clash}: give one of them (the ramp sets the "
                "levels)"
            )
    if ramp.every_s is not None and load.duration not in (DEFAULT_LOAD.duration, ramp.every_s):
        raise ScenarioError(
            f"{fail.source}: load.ramp.every_s and load.duration: give one of them (the ramp sets "
            "the seconds per level)"
        )
    return replace(load, **own, duration=ramp.every_s or load.duration)


def conversation_rules(
    fail: Failer, probes: tuple[Probe, ...], datasets: tuple[Dataset, ...], load: Load
) -> None:
    """What a conversation runs with: one process (a turn's claim is held from its first turn to its
    last, which worker processes would have to share), and for probes closed-loop levels sampled to
    a count."""
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
