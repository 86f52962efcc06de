"""Running coroutines on uvloop, with SIGINT/SIGTERM turned into a stop request instead of a
traceback (each counted in ``compare.signals``, where the grading learns of it); and an awaitable
given up when the stop is requested."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import uvloop

from kevload.compare import signals
from kevload.exits import ExitCode

T = TypeVar("T")

# By signal number (a Signals is its int): what run and interrupts report.
EXIT_FOR_SIGNAL: dict[int, ExitCode] = {
    signal.SIGINT: ExitCode.INTERRUPTED,
    signal.SIGTERM: ExitCode.TERMINATED,
}


class SecondSignal(KeyboardInterrupt):
    """A second SIGINT or SIGTERM: kevload ends at once, with the signal's exit code (``cli`` maps
    it). A KeyboardInterrupt, so asyncio lets it through every task as it does Ctrl-C's, and
    ``finally`` blocks run."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """130 for Ctrl-C (a plain KeyboardInterrupt too), 143 for a second SIGTERM."""
    return EXIT_FOR_SIGNAL[getattr(interrupt, "signum", signal.SIGINT)]


def run(main: Callable[[asyncio.Event], Coroutine[Any, Any, T]]) -> tuple[T, int | None]:
    """Run ``main(stop)`` on uvloop; the first SIGINT/SIGTERM sets ``stop``, a second one of the
    same kind raises ``SecondSignal`` wherever the program is.

    Returns the coroutine's result and the signal number that stopped it, if any.
    """
    received: list[int] = []  # this run's, where ``signals`` counts the process's

    async def wrapper() -> T:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        # A Python-level handler, not loop.add_signal_handler: it runs at once, also while the loop
        # is busy in synchronous work (the summary's reduction), where a loop callback would only
        # run after ``main`` returned and the signal would be lost. A signal also wakes a loop
        # waiting for I/O (its wakeup fd).
        def on_signal(signum: int, _frame: Any) -> None:
            signal.signal(signum, on_second)
            received.append(signum)
            loop.call_soon_threadsafe(stop.set)
            signals.received(signum, first=True)  # raises Cut within signals.cut_short

        def on_second(signum: int, _frame: Any) -> None:
            signals.received(signum, first=False)
            raise SecondSignal(signum)

        previous = {signum: signal.signal(signum, on_signal) for signum in EXIT_FOR_SIGNAL}
        try:
            return await main(stop)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

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
