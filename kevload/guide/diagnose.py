"""`kevload diagnose`: the guide's steps as stored runs, ending in one verdict with its evidence.

Measuring is apart from deciding: `_Diagnoser` here sends the requests and reduces each step's run
to a `StepResult`, collected in an `Evidence` (`kevload.guide.evidence`); `findings` and `decide`
(`kevload.guide.decision`) are pure functions of that evidence and hold the guide's decision tree,
so every verdict, finding and ordering can be checked without a server.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from kevload.guide.decision import Diagnosis, decide, findings
from kevload.guide.evidence import (
    DataResult,
    Evidence,
    StepResult,
    cache_effect,
    cache_rounds,
    cold_warm_counts,
    differing_calls,
    logprob_bitwise,
)
from kevload.inputs.probe import Probe
from kevload.inputs.scenario import Scenario, build_scenario
from kevload.inputs.scenariokeys import Api, CacheReset, Load, Mode, Target
from kevload.load.runs import run_scenario
from kevload.outputs.celltext import logprob_gap_text
from kevload.records.rundir import RunDir
from kevload.records.store import default_run_dir
from kevload.records.summary import CellSummary, RunSummary
from kevload.wire.client import Client, build_body

# Field → value that removes its randomness; only the ones the server accepts are kept.
FIXING_FIELDS: dict[str, Any] = {
    "temperature": 0,
    "top_p": 1,
    "top_k": 1,
    "seed": 1234,
    "do_sample": False,
}
SEEDS = (1234, 987654, 55555)
# What the randomness findings sample at when the user's temperature is 0
SAMPLING_TEMPERATURE = 0.8
# Steps whose cells back a claim of determinism: --until-bound samples these until the claim is
# strong.
_UNTIL_STEPS = ("fixed", "concurrency_single", "concurrency_mixed")


@dataclass(frozen=True)
class DiagnoseOptions:
    """What ``diagnose`` is asked; ``online``, ``train`` and ``out`` may be given as str, and are
    held as Paths."""

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
    # Sample the _UNTIL_STEPS' cells until drift or this 95 % bound
    until_bound: float | None = None
    max_samples: int = 1000

    def __post_init__(self) -> None:
        for name in ("online", "train", "out"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))


def check_options(options: DiagnoseOptions) -> None:
    """Fail before sending anything if the URL or the key variable is wrong (ScenarioError)."""
    _scenario(options, {}, [1], options.samples, until=True).api_key()


async def diagnose(
    options: DiagnoseOptions, log: Callable[[str], None] = print, stop: asyncio.Event | None = None
) -> Diagnosis:
    """The diagnosis; a ``stop`` (Ctrl-C, SIGTERM) ends it after the step it interrupts, which is
    left out of the evidence (its run directory, state interrupted, is kept and listed)."""
    diagnoser = _Diagnoser(options, log, stop or asyncio.Event())
    try:
        return await diagnoser.run()
    except _Stopped:
        return diagnoser.decide()


class _Stopped(Exception):
    """A stop interrupted a step: measuring ends with the steps already complete."""


class _Diagnoser:
    """Runs the steps, each an ordinary run on disk, and asks `decide` where it needs to know
    whether to stop."""

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
        step = _with_grades(step, probe_cells)
        if key == "baseline":
            differing, after_first = differing_calls(_ok_probe_hashes(run_dir))
            step = replace(step, differing_calls=differing, distinct_after_first=after_first)
        return step

    def _add(self, step: StepResult) -> None:
        self.evidence = replace(self.evidence, steps=self.evidence.steps + (step,))

    async def _fixed_params(self) -> dict[str, Any]:
        """The user's params with every randomness field fixed, minus the fields the server
        rejects."""
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
        # differs from the later ones. A fresh marker per round keeps each prompt new; the server's
        # reset is not needed.
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
            # A step cut short is incomplete evidence: it could show a cause it does not have
            raise _Stopped
        if self.logprobs == "auto":
            available = RunDir(run_dir).meta().get("logprobs", {}).get("available")
            self.logprobs = self.logprobs if available is None else available
        self.evidence = replace(self.evidence, runs=self.evidence.runs + (str(run_dir),))
        return result.summary, run_dir


def _with_grades(step: StepResult, probe_cells: Iterable[CellSummary]) -> StepResult:
    """The step with its answers graded good and bad over its graded probe cells (none: as it
    was)."""
    graded = [c for c in probe_cells if c.graded_good is not None]
    if not graded:
        return step
    return replace(
        step,
        graded_good=sum(c.graded_good or 0 for c in graded),
        graded_bad=sum(c.graded_bad or 0 for c in graded),
        flips_good_to_bad=sum(c.flips_good_to_bad or 0 for c in graded),
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
