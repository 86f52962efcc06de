"""The SIGINT/SIGTERM this process received (the event-loop runner, ``load.eventloop``, counts
them), and the step one cuts short at once (``cut_short``: the summary's grading), where a stop
request would wait for it. A leaf, so the grading in ``compare`` reads what the runner above it
writes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class Cut(KeyboardInterrupt):
    """A SIGINT or SIGTERM that came while ``cut_short`` held: the step stops where it is. A
    KeyboardInterrupt, so no ``except Exception`` between the signal and the step swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


# Every SIGINT/SIGTERM the runner received in this process, in order; and whether one raises ``Cut``
# now. Module state: signal handlers run in the main thread, between any two bytecodes, where no
# argument reaches them.
_received: list[int] = []
_cutting: list[bool] = [False]


def received(signum: int, *, first: bool) -> None:
    """The runner's handler got ``signum``: counted; the first of a run raises ``Cut`` within
    ``cut_short``."""
    _received.append(signum)
    if first and _cutting[0]:
        raise Cut(signum)


def signals_so_far() -> int:
    """How many SIGINT/SIGTERM the runner received in this process: a step compares it with the
    count it began at."""
    return len(_received)


def signal_since(count: int) -> int | None:
    """The first signal the runner received after the ``count``-th (``signals_so_far``), or None."""
    return _received[count] if len(_received) > count else None


@contextlib.contextmanager
def cut_short() -> Iterator[None]:
    """Within: the first SIGINT/SIGTERM under the runner raises ``Cut`` as well as requesting the
    stop (a second one raises ``SecondSignal`` as always). For synchronous work of unknown length (a
    user's grader) that a stop request, seen by the event loop only after it, would not end."""
    before = _cutting[0]
    _cutting[0] = True
    try:
        yield
    finally:
        _cutting[0] = before
