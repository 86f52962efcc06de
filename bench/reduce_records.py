"""Time the comparator alone: records.jsonl → summary (matrices), as `kevload report` does it.

An optional second argument is an SLO as JSON (``'{"ttft_ms": 500, "e2e_ms": 10000}'``): each record
is then checked against its bounds too.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

from kevload.compare.reader import reduce_file
from kevload.compare.summarizing import summarize
from kevload.inputs.scenariokeys import Slo


def hwm_mb() -> float:
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmHWM")) / 1024


def main() -> None:
    slo = Slo(**json.loads(sys.argv[2])) if len(sys.argv) > 2 else None
    start = time.perf_counter()
    summary = summarize(reduce_file(Path(sys.argv[1]), slo=slo))
    seconds = time.perf_counter() - start
    # The reader's own peak plus the largest worker's (children report theirs through getrusage).
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cells": len(summary.cells),
                "requests": summary.requests,
                "rss_peak_mb": hwm_mb(),
                "worker_rss_peak_mb": workers,
            }
        )
    )


# The reduction's processes are spawned and import this file again: only the script's own run
# reduces.
if __name__ == "__main__":
    main()
