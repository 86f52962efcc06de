"""Running coroutines on uvloop, with SIGINT/SIGTERM turned into a stop request instead of a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")

EXIT_FOR_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143}


def run(main: Callable[[asyncio.Event], Coroutine[Any, Any, T]]) -> tuple[T, int | None]:
    """Run ``main(stop)`` on uvloop; the first SIGINT/SIGTERM sets ``stop``, a second one is left to Python.

    Returns the coroutine's result and the signal number that stopped it, if any.
    """
    received: list[int] = []

    async def wrapper() -> T:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal(signum: int) -> None:
            received.append(signum)
            stop.set()
            loop.remove_signal_handler(signum)

        for signum in EXIT_FOR_SIGNAL:
            loop.add_signal_handler(signum, on_signal, signum)
        try:
            return await main(stop)
        finally:
            for signum in EXIT_FOR_SIGNAL:
                loop.remove_signal_handler(signum)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(wrapper())
    return result, (received[0] if received else None)


async def until_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """The awaitable's result, or None if ``stop`` is set first (it is then cancelled)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    return task.result()
