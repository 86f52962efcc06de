"""The demo's summary lines say what the cells hold, and nothing the cells do not."""

from __future__ import annotations

from kevload.demo import headline, logprob_line, sweep_lines
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


def test_sweep_lines_say_what_each_setting_keeps_and_what_it_costs():
    latency = {"e2e": {"p50": 9.46}}
    sweep = {"rows": [
        {"setting": "max_num_seqs=1", "cells": [
            cell(1, logprob_samples=8, logprob_bitwise=True, latent_drift=False, requests_per_s=0.4),
            cell(4, logprob_samples=8, logprob_bitwise=True, latent_drift=False, requests_per_s=0.41,
                 latency=latency)]},
        {"setting": "max_num_seqs=4", "cells": [
            cell(4, logprob_samples=8, logprob_bitwise=False, latent_drift=True, logprob_max_abs_diff=0.132,
                 requests_per_s=1.25),
            cell(1, logprob_samples=8, logprob_bitwise=True, latent_drift=False)]},
        {"setting": "max_num_seqs=8", "cells": [cell(2, distinct=3, drift=True), cell(4, distinct=2, drift=True)]},
        {"setting": "no logprobs", "cells": [cell(1), cell(2)]},
        {"setting": "failed to start", "cells": []}]}
    assert sweep_lines(sweep) == [
        "max_num_seqs=1: logprobs bitwise equal to serial at c=1,4; at c=4 0.41 req/s, p50 9.5 s (8 samples per cell)",
        "max_num_seqs=4: the serial text everywhere, other logprobs at c=4 (largest |difference| 0.132); "
        "at c=4 1.25 req/s (8 samples per cell)",
        "max_num_seqs=8: text drifts at c=2,4; at c=4 0.00 req/s (8 samples per cell)",
        "no logprobs: the serial text at c=1,2; at c=2 0.00 req/s (8 samples per cell)"]


def test_a_sweep_line_never_speaks_for_a_setting_whose_server_died():
    # Its server died at c=4: nothing answered there, the requests failed at once. No "serial text at c=1,4", no
    # throughput of failures: the line says the setting failed and why.
    sweep = {"rows": [{"setting": "max_num_seqs=2", "error": "the server exited during the run (its log: x.log)",
                       "cells": [cell(1, requests_per_s=0.8),
                                 cell(4, ok=0, distinct=0, requests_per_s=873.4, errors={"connect": 8})]},
                      {"setting": "max_num_seqs=4", "cells": [cell(4, ok=4, requests_per_s=2.0, errors={"timeout": 4},
                                                                  short=True, asked=8)]}]}
    assert sweep_lines(sweep) == [
        "max_num_seqs=2: failed: the server exited during the run (its log: x.log)",
        "max_num_seqs=4: the serial text at c=4; at c=4 1.00 req/s (4 samples per cell)"]  # answered ones only
