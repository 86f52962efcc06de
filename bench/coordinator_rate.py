"""How many calls one coordinator actor answers per second (``--ray local``): many callers at once,
as many actors would call it, each call awaited; prints one JSON line."""

from __future__ import annotations

import asyncio
import json
import time

from kevload.load.cluster import connect
from kevload.load.rayworkers import KevloadCoordinator

CALLERS, CALLS = 64, 200  # concurrent callers, calls each


async def _rate(coordinator) -> float:
    async def caller() -> None:
        for _ in range(CALLS):
            await coordinator.calls.remote()

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(CALLERS)))
    return CALLERS * CALLS / (time.perf_counter() - start)


def main() -> None:
    with connect("local") as ray:
        coordinator = ray.remote(KevloadCoordinator).options(num_cpus=0).remote(1)
        ray.get(coordinator.calls.remote())  # placed and warm
        rate = asyncio.run(_rate(coordinator))
    print(json.dumps({"calls_per_s": rate, "callers": CALLERS, "calls": CALLERS * CALLS}))


if __name__ == "__main__":
    main()
