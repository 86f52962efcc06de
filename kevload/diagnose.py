"""`kevload diagnose`: the guide's five steps as stored runs, ending in one verdict with its evidence."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kevload.client import Client, build_body
from kevload.runs import run_scenario
from kevload.scenario import Probe, Scenario, scenario_from_dict
from kevload.stats import drift_upper_bound, samples_for_bound
from kevload.store import default_run_dir, read_records

VERDICTS = ("stable", "sampling", "crosstalk", "cache", "server_nondeterministic", "data", "inconclusive")
# Field → value that removes its randomness; only the ones the server accepts are kept.
FIXING_FIELDS: dict[str, Any] = {"temperature": 0, "top_p": 1, "top_k": 1, "seed": 1234, "do_sample": False}
SEEDS = (1234, 987654, 55555)
_MIN_OK = 3  # fewer ok samples than this in a step and nothing can be concluded from it
_TARGET_BOUND = 0.01


@dataclass(frozen=True)
class DiagnoseOptions:
    url: str
    model: str
    probe: Probe
    params: dict[str, Any]
    api: str = "chat"
    samples: int = 6
    max_concurrency: int = 4
    timeout: float = 60.0
    api_key_env: str | None = None
    run_all: bool = False
    online: Path | None = None
    train: Path | None = None
    out: Path | None = None


@dataclass
class Diagnosis:
    verdict: str = "inconclusive"
    reason: str = ""
    next_step: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)
    findings: dict[str, Any] = field(default_factory=lambda: {
        "seed_honoured": None, "greedy_at_temperature_0": None, "cache_effect": None})
    runs: list[str] = field(default_factory=list)
    causes: list[dict[str, str]] = field(default_factory=list)  # every cause found, in the guide's order
    dropped_fields: list[str] = field(default_factory=list)
    target_failed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reason": self.reason, "next": self.next_step, "steps": self.steps,
                "findings": self.findings, "runs": self.runs, "causes": self.causes,
                "dropped_fields": self.dropped_fields}


def check_options(options: DiagnoseOptions) -> None:
    """Fail before sending anything if the URL or the key variable is wrong (ScenarioError)."""
    _Diagnoser(options, lambda message: None)._scenario({}, [1], 1).api_key()


async def diagnose(options: DiagnoseOptions, log: Callable[[str], None] = print) -> Diagnosis:
    return await _Diagnoser(options, log).run()


class _Diagnoser:
    def __init__(self, options: DiagnoseOptions, log: Callable[[str], None]):
        self.o = options
        self.log = log
        self.d = Diagnosis()
        self.out = options.out or default_run_dir("diagnose")

    async def run(self) -> Diagnosis:
        o, d = self.o, self.d
        baseline = await self._step("baseline", "1 repeat baseline (current params, serial, nonce on)",
                                    o.params, [1], o.samples)
        fixed_params = await self._fixed_params()
        fixed = await self._step("fixed", "2 randomness fixed (serial)", fixed_params, [1], o.samples)
        await self._randomness_findings()
        if self._unusable(baseline, fixed):
            return d
        # Variation only in the very first call is the cache's signature, not sampling's: the cache step decides.
        if baseline["distinct_after_first"] > 1 and fixed["distinct"] == 1:
            self._found("sampling", "outputs vary with the current params and converge once every randomness "
                        "field is fixed", "fix the seed (and check it is honoured) or set temperature 0")
            if not o.run_all:
                return self._finish()
        await self._cache_step(fixed_params)
        if fixed["distinct"] > 1:
            if d.findings["cache_effect"]:
                self._found("cache", "fixed-param serial outputs vary and the cold answer differs from warm ones",
                            "disable prompt caching (cache_prompt=false / the server's prefix cache)")
            else:
                self._found("server_nondeterministic", "outputs vary serially with every randomness field fixed "
                            "and no cache effect", "the server itself is nondeterministic: check its "
                            "deterministic-inference settings, kernels and version")
            if not o.run_all:
                return self._finish()
        elif d.findings["cache_effect"]:
            self._found("cache", "the first (cold) answer to a prompt differs from the warm ones",
                        "disable prompt caching (cache_prompt=false / the server's prefix cache)")
            if not o.run_all:
                return self._finish()
        await self._concurrency_step(fixed_params)
        await self._data_step()
        return self._finish()

    # --- steps ---

    async def _step(self, key: str, title: str, params: dict[str, Any], levels: list[int], samples: int, *,
                    mode: str = "single", probes: list[Probe] | None = None) -> dict[str, Any]:
        self.log(f"{title} …")
        summary, run_dir = await self._run(key, params, levels, samples, mode=mode, probes=probes)
        probe_cells = [c for c in summary["cells"] if c["role"] == "probe"]
        ok = min((c["ok"] for c in probe_cells), default=0)
        step = {
            "step": key, "title": title, "params": params, "mode": mode, "levels": levels,
            "samples": samples, "ok": ok, "errors": summary["errors_by_type"],
            "distinct": max((c["distinct"] for c in probe_cells), default=0),
            "drift": bool(summary["drift_cells"]), "drift_cells": summary["drift_cells"],
            "drift_rate_upper_95": None if summary["drift_cells"] or not ok else round(drift_upper_bound(ok), 4),
            "run": str(run_dir),
        }
        if summary["verdict"] == "target_failed":
            self.d.target_failed = True
        if key == "baseline":
            step["differing_calls"], step["distinct_after_first"] = self._differing_calls(run_dir)
        self.d.steps.append(step)
        return step

    async def _fixed_params(self) -> dict[str, Any]:
        """The user's params with every randomness field fixed, minus the fields the server rejects."""
        fixed = {**self.o.params, **FIXING_FIELDS}
        scenario = self._scenario({}, [1], 1)
        probe = Probe(id="fieldcheck", prompt="hi", max_tokens=1)
        async with Client(scenario.target, scenario.api_key()) as client:
            for name, value in FIXING_FIELDS.items():
                body = build_body(scenario.target, probe, {name: value}, stream=False, nonce=None)
                outcome = await client.send(body)
                if outcome.status.startswith("http_4"):
                    self.d.dropped_fields.append(name)
                    self.log(f"  the server rejects {name!r} ({outcome.status}): dropped")
        return {k: v for k, v in fixed.items() if k not in self.d.dropped_fields}

    async def _randomness_findings(self) -> None:
        n = max(self.o.samples // 2, 2)
        base = {k: v for k, v in self.o.params.items() if k not in FIXING_FIELDS}
        greedy = await self._step("greedy", "2a temperature 0 without seed (greedy?)", {**base, "temperature": 0},
                                  [1], n)
        if greedy["ok"] >= 2:
            self.d.findings["greedy_at_temperature_0"] = greedy["distinct"] == 1
        if "seed" in self.d.dropped_fields:
            self.d.findings["seed_honoured"] = False
            return
        temperature = max(float(self.o.params.get("temperature", 0) or 0), 0.8)
        same = await self._step("seed_repeat", "2b one fixed seed repeated at temperature > 0",
                                {**base, "temperature": temperature, "seed": SEEDS[0]}, [1], n)
        if same["ok"] < 2:
            return
        if same["distinct"] > 1:
            self.d.findings["seed_honoured"] = False
            return
        seeded_outputs = set()
        for seed in SEEDS:
            summary, run_dir = await self._run(f"seed_{seed}", {**base, "temperature": temperature, "seed": seed},
                                               [1], 1)
            seeded_outputs |= {r["sha256"] for r in read_records(run_dir / "records.jsonl") if r["status"] == "ok"}
        # Repeats agree; if different seeds also agree, the seed has no visible effect: unmeasurable here.
        self.d.findings["seed_honoured"] = True if len(seeded_outputs) > 1 else None
        self.d.steps[-1]["different_seeds_distinct"] = len(seeded_outputs)

    async def _cache_step(self, fixed_params: dict[str, Any]) -> None:
        rounds, warm = 3, 3
        effect = await self._cold_warm("cache", "3 cache: cold vs warm answers to fresh prompts", fixed_params,
                                       rounds, warm)
        self.d.findings["cache_effect"] = effect
        if effect and "cache_prompt" not in fixed_params:
            off = await self._cold_warm("cache_off", "3a cache: same with cache_prompt=false",
                                        {**fixed_params, "cache_prompt": False}, rounds, warm)
            self.d.findings["cache_off_converges"] = off is False

    async def _cold_warm(self, key: str, title: str, params: dict[str, Any], rounds: int, warm: int) -> bool | None:
        # A fresh marker per round keeps the prompt out of any cache; the first answer is the cold one.
        probes = [_variant(self.o.probe, f"[{secrets.token_hex(4)}] ") for _ in range(rounds)]
        step = await self._step(key, title, params, [1], 1 + warm, probes=probes)
        if step["step"] != key:
            return None
        rows: dict[str, list[tuple[int, str]]] = {}
        for r in read_records(Path(step["run"]) / "records.jsonl"):
            if r["status"] == "ok" and r["role"] == "probe":
                rows.setdefault(r["probe"], []).append((r["sample"], r["sha256"]))
        cold_differs, warm_unstable = 0, 0
        for samples in rows.values():
            samples.sort()
            if len(samples) < 2:
                continue
            warm_set = {h for _, h in samples[1:]}
            if len(warm_set) > 1:
                warm_unstable += 1
            elif samples[0][1] not in warm_set:
                cold_differs += 1
        step["cold_differs_rounds"] = cold_differs
        step["warm_unstable_rounds"] = warm_unstable
        if not rows:
            return None
        return cold_differs > 0 and cold_differs >= warm_unstable

    async def _concurrency_step(self, fixed_params: dict[str, Any]) -> None:
        levels = _levels(self.o.max_concurrency)
        single = await self._step("concurrency_single", f"4 concurrency {levels}, single", fixed_params, levels,
                                  self.o.samples)
        mixed = await self._step("concurrency_mixed", f"4 concurrency {levels}, mixed with companions",
                                 fixed_params, levels, self.o.samples, mode="mixed")
        if single["drift"] or mixed["drift"]:
            where = ", ".join(single["drift_cells"] + mixed["drift_cells"])
            self._found("crosstalk", f"fixed params are stable serially but drift concurrently ({where})",
                        "lower the max batch size or turn continuous batching off (and the prefix cache), then "
                        "rerun this diagnosis")

    async def _data_step(self) -> None:
        if self.o.online is None or self.o.train is None:
            return
        from kevload.coverage import probe_coverage

        self.log("5 data: is the probe inside the training distribution? …")
        result = probe_coverage(self.o.probe.text, self.o.online, self.o.train)
        self.d.steps.append({"step": "data", "title": "5 training-data coverage", **result})
        if result["outside"] and not self._cause_found():
            self._found("data", "the config layer is clean but the probe lies outside the training distribution ("
                        + "; ".join(result["reasons"]) + ")",
                        "compare the live inputs with the training set (kevload coverage) and add such cases")

    # --- helpers ---

    def _unusable(self, *steps: dict[str, Any]) -> bool:
        if self.d.target_failed or any(s["ok"] < _MIN_OK for s in steps):
            have = min(s["ok"] for s in steps)
            self.d.verdict = "inconclusive"
            self.d.reason = (f"too many errors or too few samples: {have} ok in the weakest step, "
                             f"{_MIN_OK} at least are needed")
            self.d.next_step = f"fix the errors ({self.d.steps[0]['errors']}) or raise --samples by {_MIN_OK - have}"
            return True
        return False

    def _found(self, verdict: str, reason: str, next_step: str) -> None:
        self.d.causes.append({"verdict": verdict, "reason": reason, "next": next_step})
        if not self._cause_found():
            self.d.verdict, self.d.reason, self.d.next_step = verdict, reason, next_step

    def _cause_found(self) -> bool:
        return self.d.verdict not in ("inconclusive", "stable")

    def _finish(self) -> Diagnosis:
        if not self._cause_found():
            checked = [s for s in self.d.steps if s["step"] in ("fixed", "concurrency_single", "concurrency_mixed")]
            n = min((s["ok"] for s in checked), default=0)
            need = samples_for_bound(_TARGET_BOUND)
            self.d.verdict = "stable"
            self.d.reason = (f"one output in every step (n={n} per cell: drift rate < {drift_upper_bound(n):.0%} "
                             f"at 95% confidence)")
            self.d.next_step = (f"for a bound below {_TARGET_BOUND:.0%} per cell run {need} samples per cell "
                                f"(--samples {need}), {max(need - n, 0)} more than now")
        return self.d

    def _differing_calls(self, run_dir: Path) -> tuple[list[int], int]:
        """Which calls (by sample index) differ from the most common output, and distinct outputs after call 0."""
        rows = [r for r in read_records(run_dir / "records.jsonl") if r["status"] == "ok" and r["role"] == "probe"]
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["sha256"]] = counts.get(r["sha256"], 0) + 1
        if not counts:
            return [], 0
        modal = max(counts, key=counts.get)
        later = {r["sha256"] for r in rows if r["sample"] > 0}
        return [r["sample"] for r in rows if r["sha256"] != modal], len(later)

    def _scenario(self, params: dict[str, Any], levels: list[int], samples: int, *, mode: str = "single",
                  probes: list[Probe] | None = None) -> Scenario:
        target = {"base_url": self.o.url, "model": self.o.model, "api": self.o.api, "timeout": self.o.timeout}
        if self.o.api_key_env:
            target["api_key_env"] = self.o.api_key_env
        raw = {
            "target": target,
            "params": params,
            "load": {"mode": mode, "concurrency": levels, "samples": samples, "max_error_share": 0.2},
            "probes": [_probe_table(p) for p in (probes or [self.o.probe])],
        }
        return scenario_from_dict(raw, source="diagnose", name="diagnose")

    async def _run(self, key: str, params: dict[str, Any], levels: list[int], samples: int, *,
                   mode: str = "single", probes: list[Probe] | None = None) -> tuple[dict[str, Any], Path]:
        run_dir = self.out / key
        result = await run_scenario(self._scenario(params, levels, samples, mode=mode, probes=probes), run_dir)
        self.d.runs.append(str(run_dir))
        return result.summary, run_dir


def _levels(max_concurrency: int) -> list[int]:
    levels, c = [], 1
    while c < max_concurrency:
        levels.append(c)
        c *= 2
    return levels + [max_concurrency]


def _variant(probe: Probe, marker: str) -> Probe:
    if probe.prompt is not None:
        return Probe(id=f"cold{marker.strip('[] ')}", prompt=marker + probe.prompt, max_tokens=probe.max_tokens)
    last = {**probe.messages[-1], "content": marker + probe.messages[-1]["content"]}
    return Probe(id=f"cold{marker.strip('[] ')}", messages=probe.messages[:-1] + (last,), max_tokens=probe.max_tokens)


def _probe_table(probe: Probe) -> dict[str, Any]:
    table: dict[str, Any] = {"id": probe.id, "max_tokens": probe.max_tokens}
    if probe.prompt is not None:
        table["prompt"] = probe.prompt
    else:
        table["messages"] = [dict(m) for m in probe.messages]
    return table

