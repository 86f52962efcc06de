"""A trace level's schedule (``load.trace``, read by ``kevload.inputs.trace``): the trace's arrivals
on its own clock, the probe at fixed points among them."""

from __future__ import annotations

from collections.abc import Iterator

from kevload.inputs.trace import TraceDataset
from kevload.load.schedule import COMPANION, PROBE, OpenLoop, Send


class TraceLoop(OpenLoop):
    """A trace level: the trace's arrivals at their offsets ÷ ``speedup``, each a companion of its
    own prompt, and ``needed`` probes at fixed points, the k-th at (k + ½) ÷ ``needed`` of the
    replay's span past ``ramp_s``, so each probe lands inside the traffic rather than before its
    first request or after its last, and counts. As every open-loop level it keeps its schedule
    whatever the server does, and counts every send past ``ramp_s``."""

    def __init__(self, trace: TraceDataset, speedup: float, *, needed: int, ramp_s: float = 0.0):
        super().__init__(trace.rate(speedup), needed=needed, companions=True, ramp_s=ramp_s)
        self.trace = trace
        self.speedup = speedup

    def __iter__(self) -> Iterator[Send]:
        # Past load.ramp_s (shorter than the replay, kevload.inputs.loadrules checks), where every
        # send counts.
        span = self.trace.span / self.speedup - self.ramp_s
        probes = [self.ramp_s + span * (k + 0.5) / self.needed for k in range(self.needed)]
        arrivals = self.trace.requests
        i = k = 0
        while i < len(arrivals) or k < len(probes):
            due = arrivals[i].offset / self.speedup if i < len(arrivals) else float("inf")
            # A probe due at the same moment as an arrival goes first: the arrival then joins its
            # batch.
            if k < len(probes) and probes[k] <= due:
                yield Send(PROBE, probes[k])
                k += 1
            else:
                yield Send(COMPANION, due, self.trace.probe_for(i))
                i += 1
