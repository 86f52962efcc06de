"""The guide's decision tree: the findings and the verdict of `kevload diagnose`, pure functions of
the `Evidence` its steps measured, so every verdict, finding and ordering can be checked without a
server."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from kevload.compare.stats import drift_upper_bound, samples_for_bound
from kevload.guide.evidence import DataResult, Evidence, StepResult
from kevload.outputs.celltext import counts_text
from kevload.records.summary import position_label

# In the guide's order: the first cause found is the verdict, later ones are listed as also found.
Cause = Literal[
    "stable", "sampling", "crosstalk", "cache", "server_nondeterministic", "data", "inconclusive"
]
VERDICTS: tuple[Cause, ...] = get_args(Cause)
# Fewer ok samples than this in a step and nothing can be concluded from it (--samples' least)
MIN_OK = 3
_TARGET_BOUND = 0.01
# Steps that must all have run before "no cause found" may be called stable.
_CONFIG_STEPS = ("baseline", "fixed", "cache", "concurrency_single", "concurrency_mixed")
_SEED_HELPS_NOT = "Fixing the seed will not help on this server"


@dataclass(frozen=True)
class Findings:
    """Facts about the server that hold whatever the verdict; None where they could not be
    measured."""

    seed_honoured: bool | None = None
    greedy_at_temperature_0: bool | None = None
    temperature_honoured: bool | None = None
    cache_effect: bool | None = None
    cache_off_converges: bool | None = None
    # The text holds at c>1 but the logprobs do not, while serial logprobs agree: batching already
    # moves the numerics. None where no concurrency step compared logprobs.
    latent_crosstalk: bool | None = None

    def to_json(self) -> dict[str, bool | None]:
        doc = {
            "seed_honoured": self.seed_honoured,
            "greedy_at_temperature_0": self.greedy_at_temperature_0,
            "temperature_honoured": self.temperature_honoured,
            "cache_effect": self.cache_effect,
        }
        if self.cache_off_converges is not None:
            doc["cache_off_converges"] = self.cache_off_converges
        if self.latent_crosstalk is not None:
            doc["latent_crosstalk"] = self.latent_crosstalk
        return doc


@dataclass(frozen=True)
class Diagnosis:
    verdict: Cause
    reason: str
    next_step: str
    findings: Findings = Findings()
    steps: tuple[StepResult | DataResult, ...] = ()
    runs: tuple[str, ...] = ()
    causes: tuple[dict[str, str], ...] = ()  # every cause found, in the guide's order
    dropped_fields: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # findings a user should hear about whatever the verdict
    # What a stable verdict rests on: "logprobs_bitwise" when the fixed and both concurrency steps
    # compared per-token logprobs in every cell and found them bitwise equal to serial, else "text"
    # (output hashes).
    evidence: str = "text"
    target_failed: bool = False
    done: bool = False  # no further step can change the verdict (measuring stops here)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "next": self.next_step,
            "steps": [s.to_json() for s in self.steps],
            "findings": self.findings.to_json(),
            "runs": list(self.runs),
            "causes": [dict(c) for c in self.causes],
            "dropped_fields": list(self.dropped_fields),
            "notes": list(self.notes),
            "evidence": self.evidence,
        }


def findings(evidence: Evidence) -> Findings:
    """The findings the randomness and cache steps measured."""
    greedy = _varies(evidence.step("greedy"))
    cache_off = _cache_effect(evidence.step("cache_off"))
    return Findings(
        seed_honoured=_seed_honoured(evidence),
        greedy_at_temperature_0=None if greedy is None else not greedy,
        temperature_honoured=_varies(evidence.step("temperature")),
        cache_effect=_cache_effect(evidence.step("cache")),
        cache_off_converges=None if cache_off is None else not cache_off,
        latent_crosstalk=_latent_crosstalk(evidence),
    )


def _latent_crosstalk(evidence: Evidence) -> bool | None:
    """Latent drift at c>1 in a concurrency step, with the serial logprobs of the fixed step and of
    that step's c=1 cell bitwise stable (a serially wobbling server is no crosstalk, as for the
    text)."""
    steps = [
        s
        for s in (evidence.step("concurrency_single"), evidence.step("concurrency_mixed"))
        if s is not None and s.logprob_bitwise is not None
    ]
    if not steps:
        return None
    fixed = evidence.step("fixed")
    serial_stable = fixed is None or fixed.logprob_bitwise is not False
    return serial_stable and any(
        s.latent_cells and not any(_is_serial(c) for c in s.latent_cells) for s in steps
    )


def _is_serial(cell: str) -> bool:
    return cell.endswith("/c=1")


def _evidence(evidence: Evidence) -> str:
    """What one output everywhere rests on: logprobs bitwise equal in every compared step, or the
    text."""
    steps = [evidence.step(k) for k in ("fixed", "concurrency_single", "concurrency_mixed")]
    return "logprobs_bitwise" if all(s is not None and s.logprob_bitwise for s in steps) else "text"


def decide(evidence: Evidence, run_all: bool = False) -> Diagnosis:
    """The guide's decision tree over what was measured so far.

    Causes are looked for in the guide's order (sampling; cache or a nondeterministic server;
    crosstalk; data); the first is the verdict. ``done`` says measuring may stop: the evidence is
    unusable, or a cause is found and ``run_all`` is off.
    """
    found = findings(evidence)
    unusable = _unusable(evidence)
    causes = [] if unusable is not None else _causes(evidence, found)
    verdict: Cause
    if unusable is not None:
        verdict, (reason, next_step) = "inconclusive", unusable
    else:
        verdict, reason, next_step = _verdict(evidence, found, causes)
    notes = list(_notes(evidence, found))
    serialized = _serialized_text(evidence)
    if serialized and verdict == "stable":
        # What one output under concurrency rests on: the server never batched, so no crosstalk
        # could show.
        reason += f"; {serialized}"
        next_step += (
            "; to test batching, raise the server's batch limit (max_num_seqs, --parallel) "
            "and rerun"
        )
    elif serialized:
        notes.insert(0, serialized)
    return Diagnosis(
        verdict=verdict,
        reason=reason,
        next_step=next_step,
        findings=found,
        steps=evidence.steps + ((evidence.data,) if evidence.data is not None else ()),
        runs=evidence.runs,
        causes=tuple(causes),
        dropped_fields=evidence.dropped_fields,
        notes=tuple(notes),
        evidence=_evidence(evidence),
        target_failed=any(s.target_failed for s in evidence.steps),
        done=unusable is not None or (bool(causes) and not run_all),
    )


def _verdict(
    evidence: Evidence, found: Findings, causes: list[dict[str, str]]
) -> tuple[Cause, str, str]:
    """(verdict, reason, next step) from usable evidence: the first cause found, else stable once
    every configuration step ran, else inconclusive until they have."""
    missing = [k for k in _CONFIG_STEPS if evidence.step(k) is None]
    verdict: Cause
    if causes:
        verdict, reason, next_step = (
            cast(Cause, causes[0]["verdict"]),  # _cause wrote it from a Cause
            causes[0]["reason"],
            causes[0]["next"],
        )
    elif missing:
        verdict, reason = (
            "inconclusive",
            f"no cause found yet; not measured: {', '.join(missing)}",
        )
        next_step = "run the remaining steps"
    else:
        verdict, (reason, next_step) = "stable", _stable(evidence)
    if verdict != "inconclusive" and found.temperature_honoured and found.seed_honoured is not True:
        next_step += f". {_SEED_HELPS_NOT}: {_seed_why_not(evidence)}"
    return verdict, reason, next_step


def samples_needed(ok: int, samples: int, want: int = MIN_OK) -> int | None:
    """Samples per step for ``want`` ok ones at the success share seen (ok of samples); None if none
    was ok."""
    if ok <= 0:
        return None
    return max(math.ceil(want * samples / ok), samples)


def _varies(step: StepResult | None) -> bool | None:
    """Did repeating the step's request give more than one output? None with fewer than two ok
    answers."""
    if step is None or step.ok < 2:
        return None
    return step.distinct > 1


def _seed_honoured(evidence: Evidence) -> bool | None:
    if "seed" in evidence.dropped_fields:
        return False
    repeat = evidence.step("seed_repeat")
    varies = _varies(repeat)
    if varies is None or repeat is None:
        return None
    if varies:
        return False
    # Repeats agree; if different seeds agree too, the seed has no visible effect: unmeasurable
    # here.
    return True if (repeat.different_seeds_distinct or 0) > 1 else None


def _cache_effect(step: StepResult | None) -> bool | None:
    if step is None or not step.compared_rounds:
        return None
    if step.cache_method is not None:
        return (
            step.cache_effect
        )  # the run's own word: null where the answers vary anyway, not "no effect"
    cold, warm = step.cold_differs_rounds or 0, step.warm_unstable_rounds or 0
    # A cold answer that differs only as often as warm answers disagree anyway is noise, not the
    # cache.
    return cold > 0 and cold >= warm


def _unusable(evidence: Evidence) -> tuple[str, str] | None:
    """(reason, next step) when too many errors or too few samples leave nothing to conclude."""
    failed = next((s for s in evidence.steps if s.target_failed), None)
    if failed is not None:
        errors = counts_text(failed.errors)
        return (
            f"the target failed in step {failed.key} ({failed.ok} ok of {failed.samples}, errors "
            f"{errors})",
            f"fix the errors ({errors}) and rerun",
        )
    weak = [
        s
        for s in (evidence.step("baseline"), evidence.step("fixed"))
        if s is not None and s.ok < MIN_OK
    ]
    if not weak:
        return None
    step = min(weak, key=lambda s: s.ok)
    need = samples_needed(step.ok, step.samples)
    reason = (
        f"too few samples: {step.ok} ok of {step.samples} in step {step.key}, {MIN_OK} at least "
        "are needed"
    )
    if need is None:
        return reason, f"fix the errors ({counts_text(step.errors)}): no call succeeded"
    return reason, (
        f"raise --samples to {need} ({need - step.samples} more per step)"
        + (f" or fix the errors ({counts_text(step.errors)})" if step.errors else "")
    )


def _causes(evidence: Evidence, found: Findings) -> list[dict[str, str]]:
    """Every cause the evidence shows, in the guide's order."""
    causes = [
        cause
        for cause in (
            _sampling_cause(evidence, found),
            _serial_cause(evidence, found),
            _crosstalk_cause(evidence),
        )
        if cause is not None
    ]
    # Data is the cause only when the config layer is clean.
    data = None if causes else _data_cause(evidence)
    return causes if data is None else [data]


def _sampling_cause(evidence: Evidence, found: Findings) -> dict[str, str] | None:
    baseline, fixed = evidence.step("baseline"), evidence.step("fixed")
    # Variation only in the very first call is the cache's signature, not sampling's: the cache step
    # decides.
    if (
        baseline is None
        or fixed is None
        or (baseline.distinct_after_first or 0) <= 1
        or fixed.distinct != 1
    ):
        return None
    return _cause(
        "sampling",
        "outputs vary with the current params and converge once every randomness field is fixed",
        _sampling_next(found),
    )


def _serial_cause(evidence: Evidence, found: Findings) -> dict[str, str] | None:
    """A cache, or a nondeterministic server: with fixed params drifting serially, only the cache
    step tells them apart."""
    fixed, cache = evidence.step("fixed"), evidence.step("cache")
    if cache is None or fixed is None:
        return None
    if fixed.distinct > 1 and found.cache_effect:
        return _cause(
            "cache",
            "fixed-param serial outputs vary and the cold answer differs from warm ones",
            _CACHE_NEXT,
        )
    if fixed.distinct > 1:
        return _cause(
            "server_nondeterministic",
            "outputs vary serially with every randomness field fixed and no cache effect shown",
            "the server itself is nondeterministic: check its "
            "deterministic-inference settings, kernels and version",
        )
    if found.cache_effect:
        return _cause(
            "cache",
            "the first (cold) answer to a prompt differs from the warm ones",
            _CACHE_NEXT,
        )
    return None


def _crosstalk_cause(evidence: Evidence) -> dict[str, str] | None:
    fixed = evidence.step("fixed")
    concurrent = [
        s for s in (evidence.step("concurrency_single"), evidence.step("concurrency_mixed")) if s
    ]
    where = [cell for s in concurrent for cell in s.drift_cells]
    # Crosstalk needs a stable serial reference: a server drifting serially drifts at every level.
    if not where or fixed is None or fixed.distinct != 1:
        return None
    return _cause(
        "crosstalk",
        f"fixed params are stable serially but drift concurrently ({', '.join(where)})",
        "lower the max batch size or turn continuous batching off "
        "(and the prefix cache), then rerun this diagnosis",
    )


def _data_cause(evidence: Evidence) -> dict[str, str] | None:
    if evidence.data is None or not evidence.data.outside:
        return None
    return _cause(
        "data",
        "the config layer is clean but the probe lies outside the training "
        "distribution (" + "; ".join(evidence.data.reasons) + ")",
        "compare the live inputs with the training set (kevload coverage) and add such cases",
    )


_CACHE_NEXT = "disable prompt caching (cache_prompt=false / the server's prefix cache)"


def _cause(verdict: Cause, reason: str, next_step: str) -> dict[str, str]:
    return {"verdict": verdict, "reason": reason, "next": next_step}


def _sampling_next(found: Findings) -> str:
    greedy = (
        "set temperature 0"
        if found.greedy_at_temperature_0 is not False
        else "send the fixed step's params (temperature 0 alone still samples on this server)"
    )
    if found.seed_honoured:
        return f"fix the seed (this server honours it) or {greedy}"
    if found.temperature_honoured:
        return greedy  # decide() adds why the seed will not help
    return f"fix the seed (and check it is honoured) or {greedy}"


def _seed_why_not(evidence: Evidence) -> str:
    if "seed" in evidence.dropped_fields:
        return "it rejects the seed field"
    repeat = evidence.step("seed_repeat")
    if repeat is not None and repeat.ok >= 2 and repeat.distinct > 1:
        return f"one seed repeated gave {repeat.distinct} outputs in {repeat.ok} calls"
    if repeat is not None and repeat.different_seeds_distinct is not None:
        return "different seeds gave the same output, so the seed has no visible effect"
    return "whether it honours a seed could not be measured (too few ok answers)"


def _stable(evidence: Evidence) -> tuple[str, str]:
    checked = [
        s for s in evidence.steps if s.key in ("fixed", "concurrency_single", "concurrency_mixed")
    ]
    n = min((s.ok for s in checked), default=0)
    need = samples_for_bound(_TARGET_BOUND)
    return (
        f"one output in every step (n={n} per cell: drift rate < {drift_upper_bound(n):.0%} at 95% "
        f"confidence)",
        f"for a bound below {_TARGET_BOUND:.0%} per cell run {need} samples per cell (--samples "
        f"{need}, "
        f"or --until-bound {_TARGET_BOUND:.0%}), {max(need - n, 0)} more than now",
    )


def _serialized_text(evidence: Evidence) -> str | None:
    """Where crosstalk is absent (no concurrency step drifts) and the server ran ≤ 1 request at a
    time at a level of c > 1: that level was serialized by the server, so its one output says
    nothing about batching."""
    steps = [
        s
        for s in (evidence.step("concurrency_single"), evidence.step("concurrency_mixed"))
        if s is not None
    ]
    cells = [c for s in steps for c in s.serialized_cells]
    if not cells or any(s.drift for s in steps):
        return None
    return (
        f"the server ran ≤ 1 request at a time at {', '.join(cells)} while the others waited in "
        f"its queue "
        "(its /metrics): those levels were serialized by the server, not batched"
    )


def _notes(evidence: Evidence, found: Findings) -> Iterable[str]:
    if found.latent_crosstalk:
        latent = [
            s
            for s in (evidence.step("concurrency_single"), evidence.step("concurrency_mixed"))
            if s is not None and s.latent_cells
        ]
        cells = ", ".join(c for s in latent for c in s.latent_cells)
        first = min(s.latent_from for s in latent if s.latent_from is not None)
        yield (
            "latent crosstalk: under concurrency the text stays the serial one but the per-token "
            "logprobs "
            f"differ ({cells}; from {position_label(token=first)}) while serial logprobs agree — "
            f"batching already "
            "changes the numerics, and a longer answer or another prompt can flip a token"
        )
    step = evidence.step("temperature")
    if found.temperature_honoured is False and step is not None:
        yield (
            f"the server ignores temperature: at temperature {step.params['temperature']} without "
            f"a seed it "
            f"gave one output in {step.ok} calls (always greedy, or a temperature too low to vary) "
            f"— "
            "whoever sends temperature > 0 to sample is not sampling"
        )
