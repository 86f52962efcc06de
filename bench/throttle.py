"""The design card's ``asyncio-throttle`` against the open loop's own schedule: lateness and CPU per
send.

The open loop (and a trace replay) sends each request at a given moment; kevload keeps that moment
against one fixed start (``loops.sleep_until``). ``asyncio_throttle.Throttler`` limits how many
acquisitions fall in a sliding window instead, polling every ``retry_interval`` (10 ms by default).
Both are driven here at one rate, with no request behind the send (the limiter alone is measured),
in the configurations a rate limit can take: one send per 1/rate seconds (with the default 10 ms
poll, and with one a tenth of that period), and ``rate`` sends per second. Lateness is each send's
time minus its due time ``start + k/rate``; a negative one is a send made early (a burst the window
allowed). A constant rate is all a limiter can be asked for: a trace's or Poisson arrivals'
irregular moments are beyond it whatever its poll.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import uvloop
from asyncio_throttle import Throttler

from kevload.load.loops import sleep_until


async def _kevload(rate: float, n: int) -> list[float]:
    never = asyncio.get_running_loop().create_future()
    start = time.perf_counter() + 0.01
    late = []
    for k in range(n):
        due = start + k / rate
        await sleep_until(due, never)
        late.append(time.perf_counter() - due)
    return late


async def _throttled(throttler: Throttler, rate: float, n: int) -> list[float]:
    start = None
    late = []
    for k in range(n):
        await throttler.acquire()
        now = time.perf_counter()
        start = now if start is None else start
        late.append(now - (start + k / rate))
    return late


def measure(rate: float = 200.0, n: int = 400, repeats: int = 3) -> dict:
    """Per limiter: lateness p50/p99/max (ms), the share sent early, the rate achieved and CPU ms
    per 1,000 sends, each the median of ``repeats`` runs (alternating the limiters, as the rest of
    the bench does)."""
    limiters = {
        "kevload": lambda: _kevload(rate, n),
        "throttle(1 per 1/rate)": lambda: _throttled(Throttler(1, period=1 / rate), rate, n),
        # Its default poll (10 ms) is longer than the period at 200/s: polled at a tenth of the
        # period, it can keep up.
        "throttle(… 1/10 poll)": lambda: _throttled(
            Throttler(1, period=1 / rate, retry_interval=0.1 / rate), rate, n
        ),
        "throttle(rate per 1 s)": lambda: _throttled(Throttler(int(rate), period=1.0), rate, n),
    }
    runs: dict[str, list[dict]] = {name: [] for name in limiters}
    for _ in range(repeats):
        for name, make in limiters.items():
            cpu, wall = time.process_time(), time.perf_counter()
            late = sorted(uvloop.run(make()))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            runs[name].append(
                {
                    "p50": late[len(late) // 2] * 1e3,
                    "p99": late[int(0.99 * (len(late) - 1))] * 1e3,
                    "max": late[-1] * 1e3,
                    "early": sum(x < -1e-4 for x in late) / n,
                    "rate": n / wall,
                    "cpu_ms_per_1k": cpu * 1e3 * 1000 / n,
                }
            )
    return {
        "rate": rate,
        "sends": n,
        "repeats": repeats,
        "limiters": {
            name: {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}
            for name, rows in runs.items()
        },
    }


def print_throttle(result: dict) -> None:
    print(
        f"\nlimiter at {result['rate']:.0f} sends/s ({result['sends']} sends × "
        f"{result['repeats']}, no request "
        "behind them): lateness against the schedule"
    )
    print(
        f"{'limiter':24} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'early':>7} {'sends/s':>8} "
        f"{'CPU ms/1k':>10}"
    )
    for name, row in result["limiters"].items():
        print(
            f"{name:24} {row['p50']:9.3f} {row['p99']:9.3f} {row['max']:9.3f} {row['early']:7.1%} "
            f"{row['rate']:8.1f} {row['cpu_ms_per_1k']:10.1f}"
        )
