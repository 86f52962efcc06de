"""`make bench`: kevload's own overhead, measured side by side against a plain client and wrk.

Everything runs on 127.0.0.1 against nginx answering canned completions (a zero-cost server).
Client and server share this machine's cores, so every figure is a ratio measured in the same
run, alternating the clients (A B A B …), with absolute numbers for context.

The ``until-bound`` section (alone: ``--only until-bound``) asks the built-in real targets how many
probe requests ``--until-bound 5%`` takes: to name transformers' batching crosstalk, and to bound
llama.cpp's drift rate below 5 % per level. The ``server-metrics`` section (``--only
server-metrics``) measures what reading the server's own /metrics during a run costs the load. The
``throttle`` section (``--only throttle``) drives the design card's asyncio-throttle and the open
loop's own schedule at one rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
# per run measuring the step from an answer to the next send (one slot per worker)
STEP_REQUESTS = 2000
sys.path.insert(0, str(ROOT))

from kevload.servers.processes import free_port, start_server, stop_group, wait_ready  # noqa: E402

GUIDELLM_VENV = (
    Path(os.environ.get("KEVLOAD_CACHE", Path.home() / ".cache" / "kevload")) / "bench" / "guidellm"
)
WRK_LUA = (
    'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
    'wrk.body = \'{"model": "bench", "messages": [{"role": "user", "content": "hi"}], '
    '"max_tokens": 20}\'\n'
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--skip-long", action="store_true", help="skip the 200k-request and 1M-record runs"
    )
    parser.add_argument(
        "--only",
        choices=("until-bound", "scaling", "server-metrics", "throttle", "compare"),
        help="run only this section (until-bound: real targets; scaling: worker processes; "
        "server-metrics: what sampling /metrics costs; throttle: asyncio-throttle against "
        "the open loop's schedule; compare: a comparison's cost per request against a run's)",
    )
    args = parser.parse_args(argv)
    if args.only == "throttle":
        return _write({"machine": _machine(), "throttle": throttle(args.repeats)}, "throttle")
    if args.only == "server-metrics":
        results = {"machine": _machine(), "server_metrics": server_metrics_cost(args.repeats)}
        print_server_metrics(results["server_metrics"])
        return _write(results, "server-metrics")
    if args.only == "compare":
        with Endpoint() as endpoint:
            results = {"machine": _machine(), "compare": compare_cost(endpoint, args.repeats)}
        return _write(results, "compare")
    if args.only == "until-bound":
        return _write({"machine": _machine(), "until_bound": until_bound()}, "until-bound")
    if args.only == "scaling":
        with Endpoint() as endpoint:
            results = {
                "machine": _machine(),
                "concurrency": args.concurrency,
                "requests": args.requests,
                "scaling": scaling(endpoint, args),
            }
        print_scaling(results["scaling"])
        return _write(results, "scaling")
    with Endpoint() as endpoint:
        results = {
            "machine": _machine(),
            "concurrency": args.concurrency,
            "requests": args.requests,
            "throughput": throughput(endpoint, args),
            "schedule": schedule(endpoint),
            "scaling": scaling(endpoint, args),
            "compare": compare_cost(endpoint, args.repeats),
        }
        if not args.skip_long:
            results["flat_memory"] = flat_memory(endpoint)
    if not args.skip_long:
        results["comparator"] = comparator()
    print_table(results)
    print()
    print_scaling(results["scaling"])
    results["until_bound"] = until_bound()
    results["server_metrics"] = server_metrics_cost(args.repeats)
    print_server_metrics(results["server_metrics"])
    results["throttle"] = throttle(args.repeats)
    return _write(results)


def throttle(repeats: int) -> dict:
    """The design card's asyncio-throttle as the open loop's limiter, against kevload's schedule
    (about 8 s a repeat). Imported here: asyncio-throttle is measured, not a dependency (``make
    bench`` installs it)."""
    from bench.throttle import measure, print_throttle

    result = measure(repeats=repeats)
    print_throttle(result)
    return result


def compare_cost(endpoint: Endpoint, repeats: int) -> dict:
    """``kevload compare`` of two canned endpoints against a run of the same requests, alternated
    per round (bench/compare_cost.py)."""
    from bench.compare_cost import measure, print_compare

    result = measure(endpoint.plain, repeats=repeats)
    print_compare(result)
    return result


def _write(results: dict, suffix: str = "") -> int:
    out = ROOT / "results" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{time.strftime('%Y-%m-%d')}{'-' + suffix if suffix else ''}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"\nwritten: {path.relative_to(ROOT)}")
    return 0


def scaling(endpoint: Endpoint, args: argparse.Namespace) -> dict:
    """kevload in one process, on 2 (and 4, where the machine has the cores) worker processes, and
    as 2 Ray actors of a ``--ray local`` cluster, alternated per round; then the step from an answer
    to the next send with one slot per worker (c = workers), where each worker's next send is that
    slot's own.

    Each run gives its whole time (a Ray run's includes starting Ray, as a user's run does) and its
    in-run rate (records over first send to last answer: what the load was once it ran), and through
    Ray the coordinator's calls (one level a run).
    """
    counts = [1, 2] + ([4] if (os.cpu_count() or 1) >= 4 else [])
    setups = [(f"workers={n}", ["--workers", str(n)]) for n in counts] + [
        ("workers=2 ray local", ["--workers", "2", "--ray", "local"])
    ]
    rows: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        for stream in (False, True):
            url = endpoint.sse if stream else endpoint.plain
            mode = "stream" if stream else "non-stream"
            for name, extra in setups:
                run = run_kevload(url, args.requests, args.concurrency, stream, extra)
                rows.setdefault(f"{mode} c={args.concurrency} {name}", []).append(run)
        for workers, extra in (
            (1, []),
            (2, ["--workers", "2"]),
            (2, ["--workers", "2", "--ray", "local"]),
        ):
            name = (
                " ".join(["workers=2", *(["ray local"] if "--ray" in extra else [])])
                if workers == 2
                else "workers=1"
            )
            run = run_kevload(endpoint.plain, STEP_REQUESTS, workers, False, extra)
            rows.setdefault(f"non-stream c={workers} {name}", []).append(run)
    table = {key: _stats(samples) for key, samples in rows.items()}
    rates = [coordinator_rate() for _ in range(args.repeats)]
    return {
        **table,
        "coordinator calls/s": {
            "median": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
        },
    }


def coordinator_rate() -> float:
    """Calls one coordinator actor answers per second, 64 callers at once (Ray's start not
    included)."""
    out, *_ = measured(
        [sys.executable, str(BENCH / "coordinator_rate.py")],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return json.loads(out.strip().splitlines()[-1])["calls_per_s"]


def print_scaling(table: dict) -> None:
    print(
        "| mode | c | workers | req/s in run | req/s whole run | answer → next send (ms) | "
        "coordinator calls / level "
        "| full-load share (never full) | CPU s / 1000 req |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key, stats in table.items():
        if key == "coordinator calls/s":
            continue
        mode, rest = key.split(" c=", 1)
        c, workers = rest.split(" workers=", 1)
        if "error" in stats:
            print(f"| {mode} | {c} | {workers} | — {stats['error'][:70]} | | | | | |")
            continue
        step = f"{1000 * stats['step_median']:.3f}" if stats.get("step_median") is not None else "–"
        calls = f"{stats['calls_median']:g}" if stats.get("calls_median") is not None else "–"
        full = stats.get("full_load_share_min")
        full = f"{full:.1%} ({stats['samples_never_full_max']})" if full is not None else "–"
        print(
            f"| {mode} | {c} | {workers} | {stats['in_run_rps_median']:,.0f} "
            f"({stats['in_run_rps_min']:,.0f}–"
            f"{stats['in_run_rps_max']:,.0f}) | {stats['rps_median']:,.0f} | {step} | {calls} | "
            f"{full} "
            f"| {stats['cpu_per_1000']:.3f} |"
        )
    if "coordinator calls/s" in table:
        rate = table["coordinator calls/s"]
        print(
            f"\none coordinator actor: {rate['median']:,.0f} calls/s "
            f"({rate['min']:,.0f}–{rate['max']:,.0f}), "
            "64 callers at once"
        )


class Endpoint:
    """nginx with the canned endpoint, on a free port, stopped however the bench ends."""

    def __enter__(self) -> Endpoint:
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(nginx).exists():
            raise SystemExit("bench: nginx is not installed (Debian: apt-get install nginx wrk)")
        self.dir = Path(tempfile.mkdtemp(prefix="kevload-bench-"))
        self.port = free_port()
        conf = (
            (BENCH / "nginx.conf.template")
            .read_text()
            .replace("{prefix}", str(self.dir))
            .replace("{port}", str(self.port))
        )
        (self.dir / "nginx.conf").write_text(conf)
        self.server = start_server(
            [nginx, "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir), "-g", "daemon off;"],
            self.dir / "nginx.log",
        )
        wait_ready(self.server, f"http://127.0.0.1:{self.port}/health", timeout=20)
        self.plain = f"http://127.0.0.1:{self.port}/plain/v1"
        self.sse = f"http://127.0.0.1:{self.port}/sse/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        stop_group(self.server.pid)
        shutil.rmtree(self.dir, ignore_errors=True)


def measured(argv: list[str], env: dict[str, str] | None = None) -> tuple[str, float, float, float]:
    """Run a client process; its stdout, wall seconds, CPU seconds (user+sys) and peak RSS in MB.

    CPU comes from wait4 (this child alone). Peak RSS is the child's VmHWM, sampled while it runs:
    wait4's ru_maxrss would count the memory of this (forking) bench process too.
    """
    with tempfile.TemporaryFile() as errors, tempfile.TemporaryFile() as output:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=output, stderr=errors, env=env)
        peak = 0.0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, _vm_hwm_mb(proc.pid))
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            errors.seek(0)
            raise RuntimeError(
                f"{Path(argv[1] if len(argv) > 1 else argv[0]).name} failed ({proc.returncode}): "
                f"{errors.read().decode(errors='replace')[-800:]}"
            )
        output.seek(0)
        out = output.read().decode()
    return out, wall, usage.ru_utime + usage.ru_stime, peak


def _vm_hwm_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("VmHWM")) / 1024
    except (OSError, StopIteration):
        return 0.0


def run_reference(url: str, n: int, c: int, stream: bool, loop: str = "uvloop") -> dict:
    argv = [
        sys.executable,
        str(BENCH / "reference_client.py"),
        f"{url}/chat/completions",
        "--requests",
        str(n),
        "--concurrency",
        str(c),
        "--loop",
        loop,
    ] + (["--stream"] if stream else [])
    out, wall, cpu, rss = measured(argv)
    doc = json.loads(out)
    return {
        "loop": doc["loop"],
        "rps": doc["requests"] / doc["seconds"],
        "cpu_per_1000": 1000 * cpu / doc["requests"],
        "rss_mb": rss,
        "requests": doc["requests"],
    }


def run_kevload(
    url: str,
    n: int,
    c: int,
    stream: bool,
    extra: list[str] = (),
    loop: str = "uvloop",
    client: Path = BENCH / "kevload_client.py",
) -> dict:
    """kevload's run of ``n`` requests at ``c``; ``client``: the script that drives it (the smoke
    test's check of itself drives a deliberately slowed one)."""
    argv = [
        sys.executable,
        str(client),
        url,
        "--requests",
        str(n),
        "--concurrency",
        str(c),
        "--loop",
        loop,
        *extra,
    ] + (["--stream"] if stream else [])
    out, wall, cpu, rss = measured(argv, env={**os.environ, "PYTHONPATH": str(ROOT)})
    doc = json.loads(out)
    assert doc["records_written"] == doc["requests"] == doc["ok"], (
        doc
    )  # every request hashed and written
    return {
        "loop": doc["loop"],
        "rps": doc["requests"] / doc["seconds"],
        "in_run_rps": doc["requests"] / doc["in_run_seconds"],
        "step_s": doc["answer_to_next_send_s"],
        "coordinator_calls": doc["coordinator_calls"],
        "full_load_share": doc["full_load_share"],
        "samples_never_full": doc["samples_never_full"],
        "cpu_per_1000": 1000 * cpu / doc["requests"],
        "rss_mb": rss,
        "requests": doc["requests"],
        "raw": doc,
    }


def run_wrk(url: str, c: int, seconds: int = 4) -> dict:
    wrk = shutil.which("wrk")
    if wrk is None:
        return {"error": "wrk not installed"}
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_LUA)
    out, wall, cpu, rss = measured(
        [wrk, "-t1", f"-c{c}", f"-d{seconds}s", "-s", script.name, f"{url}/chat/completions"]
    )
    os.unlink(script.name)
    rps = float(
        next(line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec"))
    )
    return {"rps": rps, "cpu_per_1000": 1000 * cpu / (rps * seconds), "rss_mb": rss}


def run_guidellm(url: str, n: int, c: int) -> dict:
    binary = GUIDELLM_VENV / "bin" / "guidellm"
    if not binary.exists():
        return {"error": f"not installed at {GUIDELLM_VENV} (make bench installs it)"}
    models = sorted((GUIDELLM_VENV.parent.parent / "models").glob("hf-*"))
    if not models:
        return {"error": "needs a local tokenizer: run `make demo` once (it converts the model)"}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "guidellm.json"
        argv = [
            str(binary),
            "run",
            "--backend",
            f"kind=openai_http,target={url.removesuffix('/v1')},model={models[0]}",
            "--profile",
            f"kind=concurrent,streams={c}",
            "--constraint",
            f"kind=max_requests,count={n}",
            "--data",
            "kind=synthetic_text,prompt_tokens=16,output_tokens=20",
            "--disable-console",
            "--output",
            f"kind=json,path={report}",
        ]
        try:
            _, wall, cpu, rss = measured(argv, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        except RuntimeError as exc:
            return {"error": str(exc)[-300:]}
        doc = json.loads(report.read_text())["benchmarks"][0]
    return {"rps": n / doc["duration"], "cpu_per_1000": 1000 * cpu / n, "rss_mb": rss}


def throughput(endpoint: Endpoint, args: argparse.Namespace) -> dict:
    rows: dict[str, dict[str, list[dict]]] = {}
    for stream in (False, True):
        mode = "stream" if stream else "non-stream"
        url = endpoint.sse if stream else endpoint.plain
        for _ in range(args.repeats):
            # Alternate, so drift in machine load hits every client alike.
            for name, run in (
                ("wrk", lambda u=url: run_wrk(u, args.concurrency)),
                (
                    "reference",
                    lambda u=url, s=stream: run_reference(u, args.requests, args.concurrency, s),
                ),
                (
                    "kevload",
                    lambda u=url, s=stream: run_kevload(u, args.requests, args.concurrency, s),
                ),
                (
                    "guidellm",
                    lambda u=url: run_guidellm(u, min(args.requests, 3000), args.concurrency),
                ),
            ):
                rows.setdefault(mode, {}).setdefault(name, []).append(run())
    return {
        mode: {name: _stats(samples) for name, samples in by_client.items()}
        for mode, by_client in rows.items()
    }


def schedule(endpoint: Endpoint, rate: float = 500.0, n: int = 5000, repeats: int = 3) -> dict:
    p99s, p50s, maxes = [], [], []
    for _ in range(repeats):
        doc = run_kevload(endpoint.plain, n, 1, False, ["--rate", str(rate)])["raw"]
        late = doc["lateness"]
        p50s.append(late["p50"])
        p99s.append(late["p99"])
        maxes.append(late["max"])
    return {
        "rate": rate,
        "requests": n,
        "repeats": repeats,
        "lateness_p50_ms": _ms(p50s),
        "lateness_p99_ms": _ms(p99s),
        "lateness_max_ms": _ms(maxes),
    }


def flat_memory(endpoint: Endpoint, n: int = 200000, mark: int = 20000) -> dict:
    doc = run_kevload(endpoint.plain, n, 64, False, ["--rss-at", str(mark)])["raw"]
    return {
        "requests": doc["requests"],
        "records_written": doc["records_written"],
        "rss_at_20k_mb": doc["rss_at_mark_mb"],
        "rss_end_mb": doc["rss_end_mb"],
        "growth": doc["rss_end_mb"] / doc["rss_at_mark_mb"] - 1,
    }


def comparator(n: int = 1_000_000) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        records = Path(tmp) / "records.jsonl"
        subprocess.run(
            [sys.executable, str(BENCH / "make_records.py"), str(records), str(n)],
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        out, wall, cpu, rss = measured(
            [sys.executable, str(BENCH / "reduce_records.py"), str(records)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    return {"records": n, **json.loads(out)}


UNTIL_PROBE = {
    "id": "story",
    "prompt": "Write a short story about a robot learning to paint.",
    # Short answers: every request is CPU generation on cores the client shares.
    "max_tokens": 32,
}
# (target, mode, levels): transformers' continuous batching drifts under load, llama.cpp's slots did
# not.
UNTIL_RUNS = (
    ("transformers", "single", [1, 4]),
    ("transformers", "mixed", [1, 4]),
    ("llamacpp", "single", [1, 2, 4]),
)


def until_bound(bound: float = 0.05) -> list[dict]:
    """Per real target and mode, one run with load.until_bound: each cell's n, why it stopped, its
    bound, and every probe request sent (the uncounted ramp-up and tail copies included)."""
    from kevload.inputs.scenario import scenario_from_dict
    from kevload.load.runs import run_scenario
    from kevload.servers.targets import running_target

    out = ROOT / "results" / "bench" / f"until-bound-{time.strftime('%Y%m%d-%H%M%S')}"
    rows = []
    for name in dict.fromkeys(target for target, _, _ in UNTIL_RUNS):
        with running_target(
            name, log=lambda m: print(f"  {m}", file=sys.stderr), slots=4
        ) as target:
            for _, mode, levels in (run for run in UNTIL_RUNS if run[0] == name):
                raw = {
                    "target": {"base_url": target.url, "model": target.model, "timeout": 300},
                    "params": {"temperature": 0, "top_p": 1, "seed": 1234},
                    "load": {
                        "mode": mode,
                        "concurrency": levels,
                        "samples": 8,
                        "until_bound": bound,
                    },
                    "probes": [UNTIL_PROBE],
                }
                scenario = scenario_from_dict(
                    raw, source="bench", name=f"until-bound-{name}-{mode}"
                )
                start = time.perf_counter()
                result = asyncio.run(run_scenario(scenario, out / f"{name}-{mode}"))
                rows.append(
                    _until_row(
                        name, mode, result.run_dir, result.summary, time.perf_counter() - start
                    )
                )
                print_until([rows[-1]], bound)
    return rows


def _until_row(name: str, mode: str, run_dir: Path, summary, seconds: float) -> dict:
    """One until-bound run as the table shows it: each probe cell's counted n and claim, from its
    ``RunSummary``, beside every probe request its records show sent."""
    from kevload.records.rundir import RunDir

    sent: dict[int, int] = {}
    for r in RunDir(run_dir).records():
        if r.role == "probe":
            sent[r.concurrency] = sent.get(r.concurrency, 0) + 1
    cells = [
        {
            "concurrency": c.concurrency,
            "n": c.ok + sum(c.errors.values()),
            "ok": c.ok,
            "distinct": c.distinct,
            "stop_reason": c.stop_reason,
            "drift": c.drift,
            "drift_rate_upper_95": c.drift_rate_upper_95,
            "probe_requests": sent.get(c.concurrency, 0),
            # None where the server returned no logprobs to compare.
            "logprob_bitwise": c.logprob_bitwise,
        }
        for c in summary.cells
        if c.role == "probe"
    ]
    return {
        "target": name,
        "mode": mode,
        "verdict": summary.verdict,
        "seconds": round(seconds, 1),
        "probe_requests": sum(sent.values()),
        "run_dir": str(run_dir.relative_to(ROOT)),
        "cells": cells,
    }


def print_until(rows: list[dict], bound: float = 0.05) -> None:
    for row in rows:
        print(
            f"\n{row['target']} {row['mode']}, --until-bound {bound:.0%}: {row['verdict']}, "
            f"{row['probe_requests']} probe requests in {row['seconds']:.0f} s ({row['run_dir']})"
        )
        for c in row["cells"]:
            claim = (
                f"drift rate < {c['drift_rate_upper_95']:.2%}"
                if c["drift_rate_upper_95"] is not None
                else f"{c['distinct']} distinct"
            )
            bitwise = (
                "" if c["logprob_bitwise"] is None else f", logprob_bitwise {c['logprob_bitwise']}"
            )
            print(
                f"  c={c['concurrency']}: n={c['n']} counted ({c['probe_requests']} probe requests "
                f"sent), "
                f"stop {c['stop_reason']}, {claim}{bitwise}"
            )


# Seconds between reads of the server's /metrics, None: not read (target.metrics_url = "off").
METRICS_INTERVALS = (None, 0.25, 0.1)


def server_metrics_cost(rounds: int = 3) -> dict:
    """What the sampler costs: the driver's CPU per read of a vLLM-sized page (about 560 lines),
    filtered and parsed as a run does; llama.cpp's own CPU per /metrics read (idle, from /proc); and
    llama.cpp (4 slots, 2 threads) at c=4 with /metrics not read, read every 0.25 s and every 0.1 s,
    alternated per round (req/s and e2e p50 of the cell: wall-clock figures, as noisy as the
    machine)."""
    from kevload.inputs.scenario import scenario_from_dict
    from kevload.load.runs import run_scenario
    from kevload.records import servermetrics
    from kevload.servers.targets import running_target

    page = _vllm_sized_page()
    start, reads = time.process_time(), 200
    for _ in range(reads):
        servermetrics.read_view(page)
    parse_ms = (time.process_time() - start) / reads * 1000
    runs: dict[str, list[dict]] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_target("llamacpp", slots=4, log=lambda m: None) as target,
    ):
        server_ms = _server_cpu_ms_per_read(target.pid, target.url.removesuffix("/v1") + "/metrics")
        print(f"  llama.cpp: {server_ms:.3f} ms CPU per /metrics read", file=sys.stderr)
        for round_ in range(rounds):
            for interval in METRICS_INTERVALS:
                servermetrics.INTERVAL_S = interval or servermetrics.INTERVAL_S
                raw = {
                    "target": {
                        "base_url": target.url,
                        "model": target.model,
                        "timeout": 300,
                        "metrics_url": "auto" if interval else "off",
                    },
                    "params": {"temperature": 0, "seed": 1234},
                    "load": {"concurrency": [4], "samples": 16},
                    "probes": [UNTIL_PROBE],
                }
                scenario = scenario_from_dict(raw, source="bench", name="server-metrics")
                cell = asyncio.run(
                    run_scenario(scenario, Path(tmp) / f"{interval}-{round_}")
                ).summary.cells[0]
                name = "off" if interval is None else f"{interval:g} s"
                runs.setdefault(name, []).append(
                    {
                        "rps": cell.requests_per_s,
                        "e2e_p50_s": cell.latency["e2e"]["p50"],
                        "samples": cell.server_samples,
                    }
                )
                print(
                    f"  round {round_ + 1}, /metrics {name}: {cell.requests_per_s:.2f} req/s",
                    file=sys.stderr,
                )
    return {
        "parse_ms_per_read": round(parse_ms, 3),
        "page_bytes": len(page),
        "rounds": rounds,
        "llamacpp_cpu_ms_per_read": round(server_ms, 3),
        "llamacpp_c4": {
            name: {
                "rps_median": statistics.median(r["rps"] for r in rows),
                "rps": [r["rps"] for r in rows],
                "e2e_p50_median_s": statistics.median(r["e2e_p50_s"] for r in rows),
                "samples": [r["samples"] for r in rows],
            }
            for name, rows in runs.items()
        },
    }


def _server_cpu_ms_per_read(pid: int, url: str, reads: int = 2000) -> float:
    """The server process's CPU (user + system, all threads) per GET of ``url``, the server
    otherwise idle."""
    import urllib.request

    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def cpu_s() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before = cpu_s()
    for _ in range(reads):
        with direct.open(url, timeout=10) as response:
            response.read()
    return (cpu_s() - before) / reads * 1000


def _vllm_sized_page() -> str:
    """A /metrics page the size of vLLM's: a few dozen gauges and counters, 14 histograms of 25
    buckets."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    registry, labels = CollectorRegistry(), ["model_name", "engine"]
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        *(f"gauge_{i}" for i in range(12)),
    ):
        Gauge(f"vllm:{name}", "doc", labels, registry=registry).labels("m", "0").set(2)
    for i in range(10):
        Counter(f"vllm:counter_{i}", "doc", labels, registry=registry).labels("m", "0").inc(5)
    for i in range(14):
        Histogram(
            f"vllm:histogram_{i}",
            "doc",
            labels,
            buckets=[0.001 * 2**k for k in range(25)],
            registry=registry,
        ).labels("m", "0").observe(0.3)
    return generate_latest(registry).decode()


def print_server_metrics(cost: dict) -> None:
    print(
        f"\nserver metrics: the driver {cost['parse_ms_per_read']:.2f} ms CPU per read of a "
        f"{cost['page_bytes']:,}-byte page, llama.cpp {cost['llamacpp_cpu_ms_per_read']:.3f} ms "
        f"per read; "
        f"llama.cpp c=4, {cost['rounds']} rounds, median:"
    )
    for name, row in cost["llamacpp_c4"].items():
        print(
            f"  /metrics {name}: {row['rps_median']:.2f} req/s "
            f"({', '.join(f'{r:.2f}' for r in row['rps'])}), "
            f"e2e p50 {row['e2e_p50_median_s'] * 1000:.0f} ms, samples per cell {row['samples']}"
        )


def print_table(results: dict) -> None:
    print(
        f"\nkevload bench — client and server share {results['machine']['cores']} cores; "
        f"concurrency {results['concurrency']}, {results['requests']} requests a run; median "
        f"(min–max)"
    )
    # µs/req: wall time per request (1e6 / req/s), the client's and the server's together on the
    # shared cores; for kevload also in-run (first send to last answer, without start-up and
    # summary), the figure the ratio is held to.
    header = (
        f"{'mode':11} {'client':10} {'req/s':>24} {'µs/req':>7} {'in-run req/s':>13} {'µs/req':>7} "
        f"{'× reference':>20} {'× wrk':>8} {'CPU s/1k req':>13} {'peak RSS':>9}"
    )
    print(header)
    print("-" * len(header))
    for mode, by_client in results["throughput"].items():
        ref = by_client["reference"].get("rps_median")
        wrk = by_client.get("wrk", {}).get("rps_median")
        for name, s in by_client.items():
            if "error" in s:
                print(f"{mode:11} {name:10} {'— ' + s['error'][:70]}")
                continue
            span = f"{s['rps_median']:,.0f} ({s['rps_min']:,.0f}–{s['rps_max']:,.0f})"
            ratio = f"{s['rps_median'] / ref:.2f}" if ref else "-"
            vs_wrk = f"{s['rps_median'] / wrk:.3f}" if wrk else "-"
            rss = f"{s['rss_mb']:.0f} MB" if s.get("rss_mb") else "-"
            in_run = s.get("in_run_rps_median")
            in_run_cols = (
                f"{in_run:>13,.0f} {1e6 / in_run:>7.1f}" if in_run else f"{'-':>13} {'-':>7}"
            )
            ratio += f" ({in_run / ref:.2f} in-run)" if in_run and ref else ""
            print(
                f"{mode:11} {name:10} {span:>24} {1e6 / s['rps_median']:>7.1f} {in_run_cols} "
                f"{ratio:>20} "
                f"{vs_wrk:>8} {s['cpu_per_1000']:>13.3f} {rss:>9}"
            )
    sch = results["schedule"]
    print(
        f"\nschedule at {sch['rate']:.0f} req/s ({sch['requests']} requests × {sch['repeats']}): "
        f"lateness p50 "
        f"{sch['lateness_p50_ms']['median']:.3f} ms, p99 {sch['lateness_p99_ms']['median']:.3f} ms "
        f"(runs {sch['lateness_p99_ms']['min']:.3f}–{sch['lateness_p99_ms']['max']:.3f}), "
        f"max {sch['lateness_max_ms']['median']:.3f} ms"
    )
    if "flat_memory" in results:
        m = results["flat_memory"]
        print(
            f"memory over {m['requests']:,} requests: RSS {m['rss_at_20k_mb']:.1f} MB at 20,000, "
            f"{m['rss_end_mb']:.1f} MB at the end ({m['growth']:+.1%}); {m['records_written']:,} "
            f"records written"
        )
    if "comparator" in results:
        c = results["comparator"]
        print(
            f"comparator: {c['records']:,} records reduced to matrices in {c['seconds']:.2f} s, "
            f"peak RSS {c['rss_peak_mb']:.0f} MB + {c['worker_rss_peak_mb']:.0f} MB per reader "
            f"process "
            f"({os.cpu_count()} readers)"
        )


def _stats(samples: list[dict]) -> dict:
    errors = [s["error"] for s in samples if "error" in s]
    if errors:
        return {"error": errors[0]}
    rps = [s["rps"] for s in samples]
    rss = [s["rss_mb"] for s in samples if s.get("rss_mb")]
    in_run = [s["in_run_rps"] for s in samples if "in_run_rps" in s]
    steps = [s["step_s"] for s in samples if s.get("step_s") is not None]
    calls = [s["coordinator_calls"] for s in samples if s.get("coordinator_calls") is not None]
    return {
        **(
            {
                "in_run_rps_median": statistics.median(in_run),
                "in_run_rps_min": min(in_run),
                "in_run_rps_max": max(in_run),
            }
            if in_run
            else {}
        ),
        "step_median": statistics.median(steps) if steps else None,
        "calls_median": statistics.median(calls) if calls else None,
        # The promise, from the records: the lowest full-load share of any run, the most samples
        # never full.
        "full_load_share_min": min(
            (s["full_load_share"] for s in samples if s.get("full_load_share") is not None),
            default=None,
        ),
        # Only kevload's runs have records to say it; wrk's, the reference client's and GuideLLM's
        # rows say nothing.
        "samples_never_full_max": max(
            (s["samples_never_full"] or 0 for s in samples if "samples_never_full" in s),
            default=None,
        ),
        "rps_median": statistics.median(rps),
        "rps_min": min(rps),
        "rps_max": max(rps),
        "runs": len(rps),
        "cpu_per_1000": statistics.median(s["cpu_per_1000"] for s in samples),
        "rss_mb": max(rss) if rss else None,
    }


def _ms(values: list[float]) -> dict:
    return {
        "median": 1000 * statistics.median(values),
        "min": 1000 * min(values),
        "max": 1000 * max(values),
    }


def _machine() -> dict:
    return {
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "kernel": os.uname().release,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


if __name__ == "__main__":
    sys.exit(main())
