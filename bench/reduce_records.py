"""Time the comparator alone: records.jsonl → summary (matrices), as `kevload report` does it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from kevload.compare import reduce_records, summarize
from kevload.store import read_records

start = time.perf_counter()
summary = summarize(reduce_records(read_records(Path(sys.argv[1]))))
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "cells": len(summary["cells"]), "requests": summary["requests"]}))
