"""kevload driven as a user would drive it (a scenario, a run directory, every record written),
reporting its own throughput and its RSS along the way."""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import uvloop

from kevload.inputs.scenario import scenario_from_dict
from kevload.load.runs import run_scenario
from kevload.records.rundir import RunDir


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 2**20


async def main(
    base_url: str,
    concurrency: int,
    requests: int,
    stream: bool,
    rate: float | None,
    rss_at: int,
    workers: int = 1,
    ray: str | None = None,
) -> dict:
    load = {
        "concurrency": [concurrency],
        "samples": requests,
        "stream": stream,
        "max_error_share": 0.01,
        "workers": workers,
    }
    if rate:
        load.update(rate=[rate], concurrency=[1])
    raw = {
        "target": {"base_url": base_url, "model": "bench", "timeout": 10},
        "params": {"temperature": 0},
        "load": load,
        "probes": [{"id": "bench", "prompt": "hi", "max_tokens": 20}],
    }
    scenario = scenario_from_dict(raw, source="bench")
    marks: dict[str, float] = {}
    count = 0

    def on_record(record) -> None:
        nonlocal count
        count += 1
        if count == rss_at:
            marks["rss_at_mark_mb"] = rss_mb()

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = await run_scenario(scenario, Path(tmp) / "run", on_record=on_record, ray=ray)
        seconds = time.perf_counter() - start
        rss_end = rss_mb()  # the run's own, before the times below are read back
        lines = ok = 0
        spans: dict[int, list[tuple[float, float]]] = {}  # per worker: (send, last byte)
        for path in RunDir(
            Path(tmp) / "run"
        ).record_files():  # records.jsonl, or one file per worker
            with open(path, "rb") as records:
                for line in records:
                    lines += 1
                    ok += b'"status":"ok"' in line
                    record = orjson.loads(line)
                    spans.setdefault(record.get("worker") or 0, []).append(
                        (record["t_send"], record["t_last_byte"])
                    )
        ray_meta = json.loads((Path(tmp) / "run" / "run.json").read_text()).get("ray")
    cell = result.summary.cells[0]
    everything = np.array([span for worker in spans.values() for span in worker])
    in_run = float(everything[:, 1].max() - everything[:, 0].min())
    # Every request sent is one record; the summary counts those sent at full load (ramp-up and tail
    # are not).
    return {
        "requests": lines,
        "ok": ok,
        "counted": result.summary.requests,
        "seconds": seconds,
        "in_run_seconds": in_run,
        "answer_to_next_send_s": answer_to_next_send(spans),
        "coordinator_calls": ray_meta[0].get("coordinator_calls") if ray_meta else None,
        "full_load_share": cell.full_load_share,
        "samples_never_full": cell.samples_never_full,
        "records_written": lines,
        "distinct": cell.distinct,
        "rss_end_mb": rss_end,
        "lateness": cell.latency.get("lateness"),
        "loop": loop_name(),
        **marks,
    }


def answer_to_next_send(spans: dict[int, list[tuple[float, float]]]) -> float | None:
    """Median, over every answer, of the time to its worker's next send: with one slot per worker (c
    = workers), each slot's step from its answer to its resend (with more slots another one's send
    may come first)."""
    gaps = []
    for worker in spans.values():
        rows = np.array(worker)
        sends = np.sort(rows[:, 0])
        nexts = np.searchsorted(sends, rows[:, 1], "left")
        found = nexts < len(sends)
        gaps.append(sends[nexts[found]] - rows[found, 1])
    joined = np.concatenate(gaps) if gaps else np.array([])
    return float(np.median(joined)) if len(joined) else None


def loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop this client really ran on, for the bench to check."""
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("base_url")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--rate", type=float)
    parser.add_argument("--rss-at", type=int, default=20000)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--ray", help="run the workers as actors of this Ray cluster (local, auto, host:port)"
    )
    args = parser.parse_args()
    run = uvloop.run if args.loop == "uvloop" else asyncio.run
    out = run(
        main(
            args.base_url,
            args.concurrency,
            args.requests,
            args.stream,
            args.rate,
            args.rss_at,
            args.workers,
            args.ray,
        )
    )
    print(json.dumps(out))
