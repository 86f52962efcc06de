"""The demo's summary lines say what the cells hold, and nothing the cells do not."""

from __future__ import annotations

from kevload.demo import headline, logprob_line
from kevload.summary import RunSummary


def cell(concurrency: int, **fields) -> dict:
    return {"probe": "p", "mode": "single", "role": "probe", "concurrency": concurrency, "ok": 8, "distinct": 1,
            "drift": False, "first_divergence_chars": None, "last_divergence_chars": None, **fields}


def steps(*cells: dict, verdict: str = "deterministic") -> list[tuple[str, dict]]:
    return [("2 fixed params, single", RunSummary.from_json({"verdict": verdict, "cells": list(cells)}))]


def test_logprob_line_bitwise_everywhere():
    line = logprob_line("llama.cpp", steps(cell(1, logprob_samples=8, logprob_bitwise=True),
                                          cell(4, logprob_samples=8, logprob_bitwise=True)))
    assert line == "llama.cpp logprobs: bitwise equal to serial in all 2 fixed-param cells (c=1,4; 16 samples compared)"


def test_logprob_line_names_the_cells_that_differ():
    line = logprob_line("x", steps(cell(1, logprob_samples=8, logprob_bitwise=True),
                                   cell(2, logprob_samples=8, logprob_bitwise=False, logprob_max_abs_diff=0.0123,
                                        first_logprob_divergence_token=7),
                                   cell(4, logprob_samples=8, logprob_bitwise=False, logprob_max_abs_diff=0.5,
                                        first_logprob_divergence_token=3)))
    assert line == ("x logprobs: 2 of 3 fixed-param cells differ from serial (c=2,4), from token 3 (0-based), "
                    "largest |difference| 0.5; 24 samples compared")


def test_logprob_line_without_logprobs_says_text_only():
    assert logprob_line("t", steps(cell(1, logprob_samples=0), cell(4))) == \
        "t logprobs: none returned, outputs compared as text only"


def test_inconclusive_batching_off_step_is_not_called_drift():
    drifting = cell(4, distinct=3, drift=True, first_divergence_chars=5, last_divergence_chars=9)
    shown = [*steps(cell(1), drifting, verdict="nondeterministic"),
             ("2 … batching off", RunSummary.from_json({"verdict": "inconclusive", "cells": [cell(1), cell(4)]}))]
    assert headline("t", shown).endswith("; batching off: inconclusive")
