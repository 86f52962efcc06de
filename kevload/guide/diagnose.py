"""`kevload diagnose`: the guide's steps as stored runs, ending in one verdict with its evidence.

Measuring is apart from deciding: `_Diagnoser` sends the requests and reduces each step's run to a
`StepResult`, collected in an `Evidence`; `findings` and `decide` are pure functions of that
evidence and hold the guide's decision tree, so every verdict, finding and ordering can be checked
without a server.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast, get_args

from kevload.compare.stats import drift_upper_bound, samples_for_bound
from kevload.inputs.probe import Probe
from kevload.inputs.scenario import (
    Api,
    CacheReset,
    Load,
    Mode,
    Scenario,
    Target,
    build_scenario,
)
from kevload.load.runs import run_scenario
from kevload.outputs.celltext import counts_text, logprob_gap_text
from kevload.records.rundir import RunDir
from kevload.records.store import default_run_dir
from kevload.summary import CellSummary, RunSummary, position_label
from kevload.wire.client import Client, build_body

# In the guide's order: the first cause found is the verdict, later ones are listed as also found.
Cause = Literal[
    "stable", "sampling", "crosstalk", "cache", "server_nondeterministic", "data", "inconclusive"
]
VERDICTS: tuple[Cause, ...] = get_args(Cause)
# Field → value that removes its randomness; only the ones the server accepts are kept.
FIXING_FIELDS: dict[str, Any] = {
    "temperature": 0,
    "top_p": 1,
    "top_k": 1,
    "seed": 1234,
    "do_sample": False,
}
SEEDS = (1234, 987654, 55555)
SAMPLING_TEMPERATURE = (
    0.8  # what the randomness findings sample at when the user's temperature is 0
)
MIN_OK = 3  # fewer ok samples than this in a step and nothing can be concluded from it (--samples' least)
_TARGET_BOUND = 0.01
# Steps that must all have run before "no cause found" may be called stable.
_CONFIG_STEPS = ("baseline", "fixed", "cache", "concurrency_single", "concurrency_mixed")
_SEED_HELPS_NOT = "Fixing the seed will not help on this server"
# Steps whose cells back a claim of determinism: --until-bound samples these until the claim is
# strong.
_UNTIL_STEPS = ("fixed", "concurrency_single", "concurrency_mixed")


@dataclass(frozen=True)
class DiagnoseOptions:
    """What ``diagnose`` is asked; ``online``, ``train`` and ``out`` may be given as str, and are held as Paths."""

    url: str
    model: str
    probe: Probe
    params: dict[str, Any]
    api: Api = "chat"
    samples: int = 6
    max_concurrency: int = 4
    timeout: float = 60.0
    api_key_env: str | None = None
    run_all: bool = False
    online: Path | None = None
    train: Path | None = None
    out: Path | None = None
    until_bound: float | None = (
        None  # sample the _UNTIL_STEPS' cells until drift or this 95 % bound
    )
    max_samples: int = 1000

    def __post_init__(self) -> None:
        for name in ("online", "train", "out"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))


# --- what the steps measure ---


@dataclass(frozen=True)
class StepResult:
    """One step's run, reduced to what the decision needs and the report shows."""

    key: str
    title: str
    params: Mapping[str, Any]
    levels: tuple[int, ...]
    samples: int
    ok: int  # ok probe samples in the weakest probe cell
    distinct: int  # distinct probe outputs in the most varied probe cell
    errors: Mapping[str, int] = field(default_factory=dict)
    drift_cells: tuple[str, ...] = ()
    run: str = ""
    mode: str = "single"
    target_failed: bool = False
    # Measured by some steps only (None elsewhere).
    differing_calls: tuple[int, ...] | None = (
        None  # baseline: calls that differ from the most common output
    )
    distinct_after_first: int | None = (
        None  # baseline: distinct outputs once the first (cold) call is left out
    )
    different_seeds_distinct: int | None = (
        None  # seed_repeat: distinct outputs over SEEDS, one call each
    )
    compared_rounds: int | None = (
        None  # cache steps: fresh prompts with a cold and at least one warm answer
    )
    cold_differs_rounds: int | None = (
        None  # … whose warm answers agree and the cold one differs from them
    )
    warm_unstable_rounds: int | None = None  # … whose warm answers disagree among themselves
    # Per-token logprobs against the serial ones, where the server returned them: True when every
    # probe
    # cell compared them and all were bitwise equal, False when one differed, None when none was
    # compared.
    logprob_bitwise: bool | None = None
    latent_cells: tuple[str, ...] = ()  # cells with the serial text but other logprobs
    latent_from: int | None = None  # earliest token where a latent cell's logprobs differ
    # Cells whose logprobs cover only some ok samples ("logprobs in 2 of 6 at p@single/c=4: no
    # logprob claim").
    logprob_gaps: tuple[str, ...] = ()
    # Cells at c > 1 where the server's /metrics showed it running ≤ 1 request at a time while
    # others waited.
    serialized_cells: tuple[str, ...] = ()
    # Cache steps: how their cold samples were made (kevload.load.prefixcache: the server's reset,
    # cache_prompt, a
    # marker).
    cache_method: str | None = None
    # … and what its run said of the cache (summary.json prefix_cache cache_effect, over its
    # probes): the finding.
    cache_effect: bool | None = None
    # With --expected/--grade (kevload.compare.graded): the step's answers graded good and bad over
    # its probe cells, and
    # those graded bad where every serial answer was good.
    graded_good: int | None = None
    graded_bad: int | None = None
    flips_good_to_bad: int | None = None

    @property
    def drift(self) -> bool:
        return bool(self.drift_cells)

    @property
    def bound(self) -> float | None:
        """95 % upper bound on the drift rate; None once drift is seen or nothing came back ok."""
        return None if self.drift_cells or not self.ok else round(drift_upper_bound(self.ok), 4)

    def to_json(self) -> dict[str, Any]:
        doc = {
            "step": self.key,
            "title": self.title,
            "params": dict(self.params),
            "mode": self.mode,
            "levels": list(self.levels),
            "samples": self.samples,
            "ok": self.ok,
            "errors": dict(self.errors),
            "distinct": self.distinct,
            "drift": self.drift,
            "drift_cells": list(self.drift_cells),
            "drift_rate_upper_95": self.bound,
            "run": self.run,
        }
        extras = {
            "differing_calls": self.differing_calls,
            "distinct_after_first": self.distinct_after_first,
            "different_seeds_distinct": self.different_seeds_distinct,
            "compared_rounds": self.compared_rounds,
            "cold_differs_rounds": self.cold_differs_rounds,
            "warm_unstable_rounds": self.warm_unstable_rounds,
            "logprob_bitwise": self.logprob_bitwise,
            "latent_cells": self.latent_cells or None,
            "latent_from": self.latent_from,
            "logprob_gaps": self.logprob_gaps or None,
            "serialized_cells": self.serialized_cells or None,
            "cache_method": self.cache_method,
            "cache_effect": self.cache_effect,
            "graded_good": self.graded_good,
            "graded_bad": self.graded_bad,
            "flips_good_to_bad": self.flips_good_to_bad,
        }
        doc.update(
            {k: list(v) if isinstance(v, tuple) else v for k, v in extras.items() if v is not None}
        )
        return doc


@dataclass(frozen=True)
class DataResult:
    """Step 5: where the probe lies against the training set (kevload.guide.coverage.probe_coverage's answer)."""

    coverage: Mapping[str, Any]

    @property
    def outside(self) -> bool:
        return bool(self.coverage["outside"])

    @property
    def reasons(self) -> list[str]:
        return list(self.coverage["reasons"])

    def to_json(self) -> dict[str, Any]:
        return {"step": "data", "title": "5 training-data coverage", **self.coverage}


@dataclass(frozen=True)
class Evidence:
    """Everything measured so far, in the order it was measured."""

    steps: tuple[StepResult, ...] = ()
    dropped_fields: tuple[str, ...] = ()  # fixing fields the server rejected
    runs: tuple[str, ...] = ()  # every run directory, the seed runs that are no step included
    data: DataResult | None = None

    def step(self, key: str) -> StepResult | None:
        return next((s for s in self.steps if s.key == key), None)


@dataclass(frozen=True)
class Findings:
    """Facts about the server that hold whatever the verdict; None where they could not be measured."""

    seed_honoured: bool | None = None
    greedy_at_temperature_0: bool | None = None
    temperature_honoured: bool | None = None
    cache_effect: bool | None = None
    cache_off_converges: bool | None = None
    # The text holds at c>1 but the logprobs do not, while serial logprobs agree: batching already
    # moves
    # the numerics. None where no concurrency step compared logprobs.
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


# --- deciding ---


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
    # compared
    # per-token logprobs in every cell and found them bitwise equal to serial, else "text" (output
    # hashes).
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
    """Latent drift at c>1 in a concurrency step, with the serial logprobs of the fixed step and of that
    step's c=1 cell bitwise stable (a serially wobbling server is no crosstalk, as for the text)."""
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
    """What one output everywhere rests on: logprobs bitwise equal in every compared step, or the text."""
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
    causes: list[dict[str, str]] = []
    verdict: Cause
    if unusable is not None:
        verdict, (reason, next_step) = "inconclusive", unusable
    else:
        causes = _causes(evidence, found)
        missing = [k for k in _CONFIG_STEPS if evidence.step(k) is None]
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
        if (
            verdict != "inconclusive"
            and found.temperature_honoured
            and found.seed_honoured is not True
        ):
            next_step += f". {_SEED_HELPS_NOT}: {_seed_why_not(evidence)}"
    notes = list(_notes(evidence, found))
    serialized = _serialized_text(evidence)
    if serialized and verdict == "stable":
        # What one output under concurrency rests on: the server never batched, so no crosstalk
        # could show.
        reason += f"; {serialized}"
        next_step += "; to test batching, raise the server's batch limit (max_num_seqs, --parallel) and rerun"
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


def samples_needed(ok: int, samples: int, want: int = MIN_OK) -> int | None:
    """Samples per step for ``want`` ok ones at the success share seen (ok of samples); None if none was ok."""
    if ok <= 0:
        return None
    return max(math.ceil(want * samples / ok), samples)


def _varies(step: StepResult | None) -> bool | None:
    """Did repeating the step's request give more than one output? None with fewer than two ok answers."""
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
    reason = f"too few samples: {step.ok} ok of {step.samples} in step {step.key}, {MIN_OK} at least are needed"
    if need is None:
        return reason, f"fix the errors ({counts_text(step.errors)}): no call succeeded"
    return reason, (
        f"raise --samples to {need} ({need - step.samples} more per step)"
        + (f" or fix the errors ({counts_text(step.errors)})" if step.errors else "")
    )


def _causes(evidence: Evidence, found: Findings) -> list[dict[str, str]]:
    baseline, fixed, cache = (
        evidence.step("baseline"),
        evidence.step("fixed"),
        evidence.step("cache"),
    )
    causes: list[dict[str, str]] = []
    # Variation only in the very first call is the cache's signature, not sampling's: the cache step
    # decides.
    if (
        baseline is not None
        and fixed is not None
        and (baseline.distinct_after_first or 0) > 1
        and fixed.distinct == 1
    ):
        causes.append(
            _cause(
                "sampling",
                "outputs vary with the current params and converge once every "
                "randomness field is fixed",
                _sampling_next(found),
            )
        )
    # With fixed params drifting serially, only the cache step tells a cache from a nondeterministic
    # server.
    if cache is not None and fixed is not None:
        if fixed.distinct > 1 and found.cache_effect:
            causes.append(
                _cause(
                    "cache",
                    "fixed-param serial outputs vary and the cold answer differs from warm ones",
                    _CACHE_NEXT,
                )
            )
        elif fixed.distinct > 1:
            causes.append(
                _cause(
                    "server_nondeterministic",
                    "outputs vary serially with every randomness field "
                    "fixed and no cache effect shown",
                    "the server itself is nondeterministic: check its "
                    "deterministic-inference settings, kernels and version",
                )
            )
        elif found.cache_effect:
            causes.append(
                _cause(
                    "cache",
                    "the first (cold) answer to a prompt differs from the warm ones",
                    _CACHE_NEXT,
                )
            )
    concurrent = [
        s for s in (evidence.step("concurrency_single"), evidence.step("concurrency_mixed")) if s
    ]
    where = [cell for s in concurrent for cell in s.drift_cells]
    # Crosstalk needs a stable serial reference: a server drifting serially drifts at every level.
    if where and fixed is not None and fixed.distinct == 1:
        causes.append(
            _cause(
                "crosstalk",
                f"fixed params are stable serially but drift concurrently ({', '.join(where)})",
                "lower the max batch size or turn continuous batching off "
                "(and the prefix cache), then rerun this diagnosis",
            )
        )
    # Data is the cause only when the config layer is clean.
    if evidence.data is not None and evidence.data.outside and not causes:
        causes.append(
            _cause(
                "data",
                "the config layer is clean but the probe lies outside the training "
                "distribution (" + "; ".join(evidence.data.reasons) + ")",
                "compare the live inputs with the training set (kevload coverage) and add such "
                "cases",
            )
        )
    return causes


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
    """Where crosstalk is absent (no concurrency step drifts) and the server ran ≤ 1 request at a time at a
    level of c > 1: that level was serialized by the server, so its one output says nothing about batching."""
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


# --- measuring ---


def check_options(options: DiagnoseOptions) -> None:
    """Fail before sending anything if the URL or the key variable is wrong (ScenarioError)."""
    _scenario(options, {}, [1], options.samples, until=True).api_key()


async def diagnose(
    options: DiagnoseOptions, log: Callable[[str], None] = print, stop: asyncio.Event | None = None
) -> Diagnosis:
    """The diagnosis; a ``stop`` (Ctrl-C, SIGTERM) ends it after the step it interrupts, which is left out of
    the evidence (its run directory, state interrupted, is kept and listed)."""
    diagnoser = _Diagnoser(options, log, stop or asyncio.Event())
    try:
        return await diagnoser.run()
    except _Stopped:
        return diagnoser.decide()


class _Stopped(Exception):
    """A stop interrupted a step: measuring ends with the steps already complete."""


class _Diagnoser:
    """Runs the steps, each an ordinary run on disk, and asks `decide` where it needs to know whether to stop."""

    def __init__(self, options: DiagnoseOptions, log: Callable[[str], None], stop: asyncio.Event):
        self.o = options
        self.log = log
        self.stop = stop
        self.evidence = Evidence()
        # The first step's run checks once whether the server returns logprobs; the later steps
        # reuse the answer.
        self.logprobs: Literal["auto"] | bool = "auto"
        self.out = options.out or default_run_dir("diagnose")

    def decide(self) -> Diagnosis:
        return decide(self.evidence, self.o.run_all)

    async def run(self) -> Diagnosis:
        o = self.o
        self._add(
            await self._measure(
                "baseline",
                "1 repeat baseline (current params, serial, nonce on)",
                o.params,
                [1],
                o.samples,
            )
        )
        fixed_params = await self._fixed_params()
        self._add(
            await self._measure(
                "fixed", "2 randomness fixed (serial)", fixed_params, [1], o.samples
            )
        )
        await self._randomness_findings()
        if self.decide().done:
            return self.decide()
        await self._cache_step(fixed_params)
        if self.decide().done:
            return self.decide()
        await self._concurrency_step(fixed_params)
        if self.decide().done:
            return self.decide()
        self._data_step()
        return self.decide()

    # --- steps ---

    async def _measure(
        self,
        key: str,
        title: str,
        params: dict[str, Any],
        levels: list[int],
        samples: int,
        *,
        mode: Mode = "single",
        probes: list[Probe] | None = None,
        cache_reset: CacheReset | None = None,
    ) -> StepResult:
        self.log(f"{title} …")
        summary, run_dir = await self._run(
            key, params, levels, samples, mode=mode, probes=probes, cache_reset=cache_reset
        )
        probe_cells = summary.probe_cells()
        latent = [c for c in probe_cells if c.latent_drift]
        step = StepResult(
            key=key,
            title=title,
            params=params,
            mode=mode,
            levels=tuple(levels),
            samples=samples,
            ok=min((c.ok for c in probe_cells), default=0),
            distinct=max((c.distinct for c in probe_cells), default=0),
            errors=summary.errors_by_type,
            drift_cells=summary.drift_cells,
            run=str(run_dir),
            target_failed=summary.verdict == "target_failed",
            logprob_bitwise=logprob_bitwise(probe_cells),
            latent_cells=summary.latent_cells or (),
            latent_from=min(
                (t for c in latent if (t := c.first_logprob_divergence_token) is not None),
                default=None,
            ),
            logprob_gaps=tuple(logprob_gap_text(c, c.name) for c in probe_cells if c.logprob_gap),
            serialized_cells=tuple(
                c.name
                for c in probe_cells
                if c.server_note and c.server_running_max is not None and c.server_running_max <= 1
            ),
        )
        graded = [c for c in probe_cells if c.graded_good is not None]
        if graded:
            step = replace(
                step,
                graded_good=sum(c.graded_good or 0 for c in graded),
                graded_bad=sum(c.graded_bad or 0 for c in graded),
                flips_good_to_bad=sum(c.flips_good_to_bad or 0 for c in graded),
            )
        if key == "baseline":
            differing, after_first = differing_calls(_ok_probe_hashes(run_dir))
            step = replace(step, differing_calls=differing, distinct_after_first=after_first)
        return step

    def _add(self, step: StepResult) -> None:
        self.evidence = replace(self.evidence, steps=self.evidence.steps + (step,))

    async def _fixed_params(self) -> dict[str, Any]:
        """The user's params with every randomness field fixed, minus the fields the server rejects."""
        fixed = {**self.o.params, **FIXING_FIELDS}
        scenario = _scenario(self.o, {}, [1], 1)
        probe = Probe(id="fieldcheck", prompt="hi", max_tokens=1)
        dropped = []
        async with Client(scenario.target, scenario.api_key()) as client:
            for name, value in FIXING_FIELDS.items():
                if self.stop.is_set():
                    raise _Stopped
                body = build_body(scenario.target, probe, {name: value}, stream=False, nonce=None)
                outcome = await client.send(body)
                if outcome.status.startswith("http_4"):
                    dropped.append(name)
                    self.log(f"  the server rejects {name!r} ({outcome.status}): dropped")
        self.evidence = replace(self.evidence, dropped_fields=tuple(dropped))
        return {k: v for k, v in fixed.items() if k not in dropped}

    async def _randomness_findings(self) -> None:
        n = max(self.o.samples // 2, 2)
        base = {k: v for k, v in self.o.params.items() if k not in FIXING_FIELDS}
        user_temperature = float(self.o.params.get("temperature", 0) or 0)
        self._add(
            await self._measure(
                "greedy",
                "2a temperature 0 without seed (greedy?)",
                {**base, "temperature": 0},
                [1],
                n,
            )
        )
        if "seed" not in self.evidence.dropped_fields:
            await self._seed_steps(base, max(user_temperature, SAMPLING_TEMPERATURE), n)
        # The seed findings sample hot to see a seed's effect; this one asks about the user's own
        # temperature.
        temperature = user_temperature if user_temperature > 0 else SAMPLING_TEMPERATURE
        self._add(
            await self._measure(
                "temperature",
                f"2c temperature {temperature} without seed (sampling?)",
                {**base, "temperature": temperature},
                [1],
                n,
            )
        )

    async def _seed_steps(self, base: dict[str, Any], temperature: float, n: int) -> None:
        same = await self._measure(
            "seed_repeat",
            "2b one fixed seed repeated at temperature > 0",
            {**base, "temperature": temperature, "seed": SEEDS[0]},
            [1],
            n,
        )
        if same.ok >= 2 and same.distinct == 1:
            # Repeats agree: one call per other seed tells an honoured seed from one without effect.
            outputs: set[str | None] = set()
            for seed in SEEDS:
                _, run_dir = await self._run(
                    f"seed_{seed}", {**base, "temperature": temperature, "seed": seed}, [1], 1
                )
                outputs |= {sha for _, _, sha in _ok_probe_hashes(run_dir)}
            same = replace(same, different_seeds_distinct=len(outputs))
        self._add(same)

    async def _cache_step(self, fixed_params: dict[str, Any]) -> None:
        await self._cold_warm("cache", "3 cache: cold vs warm answers", fixed_params)
        if findings(self.evidence).cache_effect and "cache_prompt" not in fixed_params:
            await self._fresh_prompts(
                "cache_off",
                "3a cache: same with cache_prompt=false",
                {**fixed_params, "cache_prompt": False},
            )

    async def _cold_warm(
        self, key: str, title: str, params: dict[str, Any], rounds: int = 3
    ) -> None:
        # load.prefix_cache: the server's own reset where it has one, else cache_prompt or a fresh
        # marker per round
        # (cache_reset "auto"); rounds the server's cached_tokens contradict are not compared.
        step = await self._measure(key, title, params, [1], 2 * rounds, cache_reset="auto")
        cache = RunDir(Path(step.run)).summary().prefix_cache or {"method": None, "probes": []}
        compared, cold_differs, warm_unstable = cache_rounds(cache["probes"])
        self._add(
            replace(
                step,
                title=f"{title} (cold by {cache['method']})",
                compared_rounds=compared,
                cold_differs_rounds=cold_differs,
                warm_unstable_rounds=warm_unstable,
                cache_method=cache["method"],
                cache_effect=cache_effect(cache["probes"]),
            )
        )

    async def _fresh_prompts(
        self, key: str, title: str, params: dict[str, Any], rounds: int = 3, warm: int = 3
    ) -> None:
        # With the cache off nothing is warm: the question is only whether a prompt's first answer
        # differs from the
        # later ones. A fresh marker per round keeps each prompt new; the server's reset is not
        # needed.
        markers = [f"[{secrets.token_hex(4)}] " for _ in range(rounds)]
        probes = [
            self.o.probe.with_text(m + self.o.probe.text, f"cold{m.strip('[] ')}") for m in markers
        ]
        step = await self._measure(key, title, params, [1], 1 + warm, probes=probes)
        compared, cold_differs, warm_unstable = cold_warm_counts(_ok_probe_hashes(Path(step.run)))
        self._add(
            replace(
                step,
                compared_rounds=compared,
                cold_differs_rounds=cold_differs,
                warm_unstable_rounds=warm_unstable,
            )
        )

    async def _concurrency_step(self, fixed_params: dict[str, Any]) -> None:
        levels = _levels(self.o.max_concurrency)
        self._add(
            await self._measure(
                "concurrency_single",
                f"4 concurrency {levels}, single",
                fixed_params,
                levels,
                self.o.samples,
            )
        )
        self._add(
            await self._measure(
                "concurrency_mixed",
                f"4 concurrency {levels}, mixed with companions",
                fixed_params,
                levels,
                self.o.samples,
                mode="mixed",
            )
        )

    def _data_step(self) -> None:
        if self.o.online is None or self.o.train is None:
            return
        from kevload.guide.coverage import probe_coverage

        self.log("5 data: is the probe inside the training distribution? …")
        result = probe_coverage(self.o.probe.text, self.o.online, self.o.train)
        self.evidence = replace(self.evidence, data=DataResult(result))

    async def _run(
        self,
        key: str,
        params: dict[str, Any],
        levels: list[int],
        samples: int,
        *,
        mode: Mode = "single",
        probes: list[Probe] | None = None,
        cache_reset: CacheReset | None = None,
    ) -> tuple[RunSummary, Path]:
        run_dir = self.out / key
        scenario = _scenario(
            self.o,
            params,
            levels,
            samples,
            mode=mode,
            probes=probes,
            until=key in _UNTIL_STEPS,
            logprobs=self.logprobs,
            cache_reset=cache_reset,
        )
        result = await run_scenario(scenario, run_dir, stop=self.stop)
        if result.state == "interrupted":
            self.evidence = replace(self.evidence, runs=self.evidence.runs + (str(run_dir),))
            raise _Stopped  # a step cut short is incomplete evidence: it could show a cause it does not have
        if self.logprobs == "auto":
            available = RunDir(run_dir).meta().get("logprobs", {}).get("available")
            self.logprobs = self.logprobs if available is None else available
        self.evidence = replace(self.evidence, runs=self.evidence.runs + (str(run_dir),))
        return result.summary, run_dir


# --- reductions of a step's records (pure) ---


def differing_calls(rows: Iterable[tuple[str, int, str | None]]) -> tuple[tuple[int, ...], int]:
    """Calls (by sample index) whose output differs from the most common one, and distinct outputs after call 0.

    ``rows`` are (probe, sample, sha256) of the ok probe answers of one serial run.
    """
    rows = list(rows)
    counts: dict[str | None, int] = {}
    for _, _, sha in rows:
        counts[sha] = counts.get(sha, 0) + 1
    if not counts:
        return (), 0
    modal = max(counts, key=counts.__getitem__)
    later = {sha for _, sample, sha in rows if sample > 0}
    return tuple(sample for _, sample, sha in rows if sha != modal), len(later)


def logprob_bitwise(cells: Iterable[CellSummary]) -> bool | None:
    """True when every cell compared the logprobs of all its ok samples with serial and all were bitwise
    equal; False when compared ones differed in a cell; None when a cell (or every one) makes no claim."""
    cells = tuple(cells)
    if any(c.logprob_bitwise is False for c in cells):
        return False
    return True if cells and all(c.logprob_bitwise for c in cells) else None


def cold_warm_counts(rows: Iterable[tuple[str, int, str | None]]) -> tuple[int, int, int]:
    """(rounds compared, rounds whose cold answer differs from agreeing warm ones, rounds whose warm answers disagree).

    ``rows`` are (probe, sample, sha256); each probe is one fresh prompt, sample 0 its cold answer.
    """
    by_probe: dict[str, list[tuple[int, str | None]]] = {}
    for probe, sample, sha in rows:
        by_probe.setdefault(probe, []).append((sample, sha))
    compared = cold_differs = warm_unstable = 0
    for answers in by_probe.values():
        answers.sort()
        if len(answers) < 2 or answers[0][0] != 0:
            continue
        compared += 1
        warm = {sha for _, sha in answers[1:]}
        if len(warm) > 1:
            warm_unstable += 1
        elif answers[0][1] not in warm:
            cold_differs += 1
    return compared, cold_differs, warm_unstable


def cache_rounds(comparisons: Iterable[Mapping[str, Any]]) -> tuple[int, int, int]:
    """(rounds compared, rounds whose cold answer leaves warm ones that agree, rounds whose warm answers vary) from a
    cache step's ``summary.json`` ``prefix_cache`` probes (``compare.coldwarm.ColdWarm``). Where
    every round sends the same input (a server reset, cache_prompt) the warm answers' agreement is
    across rounds: a server whose warm answers vary anyway has each differing round counted
    unstable, not cold-differs."""
    compared = cold_differs = warm_unstable = 0
    for c in comparisons:
        compared += c["rounds"]
        cold_differs += c["cold_differs_rounds"]
        if c["warm"]["distinct"] is None:  # marker: per round
            warm_unstable += c["warm_unstable_rounds"]
        elif c["warm"]["distinct"] > 1:
            warm_unstable += c["rounds"] - c["equal_rounds"]
    return compared, cold_differs, warm_unstable


def cache_effect(comparisons: Iterable[Mapping[str, Any]]) -> bool | None:
    """A cache step's finding from its run's probes: an effect where one shows it, none where every one says none,
    else no claim (the run's null: answers that vary anyway, or nothing compared)."""
    effects = [c["cache_effect"] for c in comparisons]
    return (
        True if True in effects else False if effects and all(e is False for e in effects) else None
    )


def _ok_probe_hashes(run_dir: Path) -> list[tuple[str, int, str | None]]:
    return [(r.probe, r.sample, r.sha256) for r in RunDir(run_dir).evidence()]


def _scenario(
    options: DiagnoseOptions,
    params: dict[str, Any],
    levels: list[int],
    samples: int,
    *,
    mode: Mode = "single",
    probes: list[Probe] | None = None,
    until: bool = False,
    logprobs: Literal["auto"] | bool = "auto",
    cache_reset: CacheReset | None = None,
) -> Scenario:
    target = Target(
        base_url=options.url,
        model=options.model,
        api=options.api,
        timeout=options.timeout,
        api_key_env=options.api_key_env or None,
    )
    load = Load(
        mode=mode,
        concurrency=tuple(levels),
        samples=samples,
        max_error_share=0.2,
        logprobs=logprobs,
    )
    if cache_reset is not None:
        load = replace(load, prefix_cache="cold_warm", cache_reset=cache_reset)
    if until and options.until_bound is not None:
        load = replace(load, until_bound=options.until_bound, max_samples=options.max_samples)
    return build_scenario(
        target,
        probes or [options.probe],
        load=load,
        params=params,
        name="diagnose",
        source="diagnose",
    )


def _levels(max_concurrency: int) -> list[int]:
    levels, c = [], 1
    while c < max_concurrency:
        levels.append(c)
        c *= 2
    return levels + [max_concurrency]
