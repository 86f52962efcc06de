"""The guide's step 5: case sets built from runs, rerun after every change, compared before/after."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson

from kevload.runs import run_scenario
from kevload.scenario import ScenarioError, iter_jsonl, scenario_from_dict
from kevload.store import RUN, SUMMARY, default_run_dir, open_run_dir, read_json, read_records

CASE_FIELDS = ("id", "input", "params", "outputs", "expected", "verdict", "note")


def build_cases(run_dirs: list[Path], cases_path: Path) -> tuple[int, int]:
    """Append one case per probe × level of each run; cases already in the file are never touched.

    Returns (added, kept).
    """
    existing = read_cases(cases_path) if cases_path.exists() else []
    known = {case["id"] for case in existing}
    added = []
    for run_dir in run_dirs:
        for case in cases_from_run(open_run_dir(run_dir)):
            if case["id"] not in known:
                known.add(case["id"])
                added.append(case)
    with cases_path.open("ab") as handle:
        for case in added:
            handle.write(orjson.dumps(case) + b"\n")
    return len(added), len(existing)


def cases_from_run(run_dir: Path) -> list[dict[str, Any]]:
    meta = read_json(run_dir / RUN)
    summary = read_json(run_dir / SUMMARY)
    scenario = meta["scenario"]
    probes = {p["id"]: p for p in scenario.get("probes", [])}
    params = scenario.get("params", {})
    outputs: dict[tuple[str, int], dict[str, int]] = {}
    for r in read_records(run_dir / "records.jsonl"):
        if r["role"] == "probe" and r["status"] == "ok" and r.get("counted", True):
            cell = outputs.setdefault((r["probe"], r["concurrency"]), {})
            cell[r["output"]] = cell.get(r["output"], 0) + 1
    cells = [c for c in summary["cells"] if c["role"] == "probe" and c["probe"] in probes]
    cases = []
    for c in cells:
        probe = probes[c["probe"]]
        case_input = probe.get("prompt", probe.get("messages"))
        case_params = {**params, "max_tokens": probe.get("max_tokens", 64), "mode": c["mode"],
                       "concurrency": c["concurrency"]}
        texts = outputs.get((c["probe"], c["concurrency"]), {})
        cases.append({
            "id": f"{c['probe']}-{_digest(case_input, case_params)}",
            "input": case_input,
            "params": case_params,
            "outputs": [{"text": t, "count": n} for t, n in sorted(texts.items(), key=lambda kv: -kv[1])],
            "expected": None,
            "verdict": "unstable" if c["drift"] else "stable",
            "note": _note(c, [x for x in cells if x["probe"] == c["probe"] and x["mode"] == c["mode"]]),
            "source_run": str(run_dir),
        })
    return cases


def read_cases(path: Path) -> list[dict[str, Any]]:
    cases = []
    for number, case in iter_jsonl(path, "case set"):
        missing = [f for f in ("id", "input", "params", "verdict") if not isinstance(case, dict) or f not in case]
        if missing:
            raise ScenarioError(f"{path}:{number}: case lacks {', '.join(missing)}")
        cases.append(case)
    return cases


async def rerun_cases(cases: list[dict[str, Any]], *, url: str, model: str, times: int, api: str = "chat",
                      timeout: float = 60.0, out: Path | None = None, log=print) -> list[dict[str, Any]]:
    """Rerun each case ``times`` times at its recorded params and concurrency; returns cases with the results."""
    out = out or default_run_dir("cases-rerun")
    results = []
    for case in cases:
        params = dict(case["params"])
        level = int(params.pop("concurrency", 1))
        mode = params.pop("mode", "single")
        max_tokens = params.pop("max_tokens", 64)
        probe = {"id": "case", "max_tokens": max_tokens}
        probe["prompt" if isinstance(case["input"], str) else "messages"] = case["input"]
        raw = {"target": {"base_url": url, "model": model, "api": api, "timeout": timeout}, "params": params,
               "load": {"mode": mode, "concurrency": [level], "samples": times, "max_error_share": 0.5},
               "probes": [probe]}
        log(f"rerun {case['id']} (c={level}, {mode}) …")
        run_dir = out / case["id"]
        result = await run_scenario(scenario_from_dict(raw, source=f"case {case['id']}"), run_dir)
        cell = next(c for c in result.summary["cells"] if c["role"] == "probe")
        texts = {r["output"] for r in read_records(run_dir / "records.jsonl")
                 if r["status"] == "ok" and r.get("counted", True)}
        after = {**case, "rerun_uniq": cell["distinct"], "rerun_ok": cell["ok"],
                 "verdict_after": "stable" if cell["distinct"] == 1 else "unstable", "rerun_dir": str(run_dir)}
        if case.get("expected") is not None:
            after["matches_expected"] = texts == {case["expected"]}
        results.append(after)
    return results


def transitions(results: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"unstable→stable": [], "stable→unstable": [], "unchanged": []}
    for r in results:
        before, after = r["verdict"], r["verdict_after"]
        key = "unchanged" if before == after else f"{before}→{after}"
        out[key].append(r["id"])
    return out


def _note(cell: dict[str, Any], row: list[dict[str, Any]]) -> str:
    unstable = sorted(c["concurrency"] for c in row if c["drift"])
    levels = sorted(c["concurrency"] for c in row)
    if not unstable:
        return f"stable at concurrency {', '.join(map(str, levels))} (n={cell['ok']})"
    if unstable == levels:
        return "unstable at every concurrency level, serial included"
    if unstable == [lv for lv in levels if lv >= unstable[0]]:
        return f"unstable only at concurrency ≥ {unstable[0]}"
    return f"unstable at concurrency {', '.join(map(str, unstable))}"


def _digest(case_input: Any, params: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps([case_input, params], option=orjson.OPT_SORT_KEYS)).hexdigest()[:10]
