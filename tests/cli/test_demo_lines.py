"""The demo's summary lines say what the cells hold, and nothing the cells do not."""

from __future__ import annotations

from kevload.demo.lines import headline, logprob_line, sweep_lines
from kevload.records.summary import RunSummary


def cell(concurrency: int, **fields) -> dict:
    return {
        "probe": "p",
        "mode": "single",
        "role": "probe",
        "concurrency": concurrency,
        "ok": 8,
        "distinct": 1,
        "drift": False,
        "first_divergence_chars": None,
        "last_divergence_chars": None,
        **fields,
    }


def steps(*cells: dict, verdict: str = "deterministic") -> list[tuple[str, dict]]:
    return [
        ("2 fixed params, single", RunSummary.from_json({"verdict": verdict, "cells": list(cells)}))
    ]


def test_logprob_line_bitwise_everywhere():
    line = logprob_line(
        "llama.cpp",
        steps(
            cell(1, logprob_samples=8, logprob_bitwise=True),
            cell(4, logprob_samples=8, logprob_bitwise=True),
        ),
    )
    assert (
        line == "llama.cpp logprobs: bitwise equal to serial in all 2 fixed-param cells "
        "(c=1,4; 16 samples compared)"
    )


def test_logprob_line_names_the_cells_that_differ():
    line = logprob_line(
        "x",
        steps(
            cell(1, logprob_samples=8, logprob_bitwise=True),
            cell(
                2,
                logprob_samples=8,
                logprob_bitwise=False,
                logprob_max_abs_diff=0.0123,
                first_logprob_divergence_token=7,
            ),
            cell(
                4,
                logprob_samples=8,
                logprob_bitwise=False,
                logprob_max_abs_diff=0.5,
                first_logprob_divergence_token=3,
            ),
        ),
    )
    assert line == (
        "x logprobs: 2 of 3 fixed-param cells differ from serial (c=2,4), from token 3 (0-based), "
        "largest |difference| 0.5; 24 samples compared"
    )


def test_logprob_line_without_logprobs_says_text_only():
    assert (
        logprob_line("t", steps(cell(1, logprob_samples=0), cell(4)))
        == "t logprobs: none returned, outputs compared as text only"
    )


def test_inconclusive_batching_off_step_is_not_called_drift():
    drifting = cell(4, distinct=3, drift=True, first_divergence_chars=5, last_divergence_chars=9)
    shown = [
        *steps(cell(1), drifting, verdict="nondeterministic"),
        (
            "2 … batching off",
            RunSummary.from_json({"verdict": "inconclusive", "cells": [cell(1), cell(4)]}),
        ),
    ]
    assert headline("t", shown).endswith("; batching off: inconclusive")


def test_sweep_lines_say_what_each_setting_keeps_and_what_it_costs():
    latency = {"e2e": {"p50": 9.46}}
    sweep = {
        "rows": [
            {
                "setting": "max_num_seqs=1",
                "cells": [
                    cell(
                        1,
                        logprob_samples=8,
                        logprob_bitwise=True,
                        latent_drift=False,
                        requests_per_s=0.4,
                    ),
                    cell(
                        4,
                        logprob_samples=8,
                        logprob_bitwise=True,
                        latent_drift=False,
                        requests_per_s=0.41,
                        latency=latency,
                    ),
                ],
            },
            {
                "setting": "max_num_seqs=4",
                "cells": [
                    cell(
                        4,
                        logprob_samples=8,
                        logprob_bitwise=False,
                        latent_drift=True,
                        logprob_max_abs_diff=0.132,
                        requests_per_s=1.25,
                    ),
                    cell(1, logprob_samples=8, logprob_bitwise=True, latent_drift=False),
                ],
            },
            {
                "setting": "max_num_seqs=8",
                "cells": [cell(2, distinct=3, drift=True), cell(4, distinct=2, drift=True)],
            },
            {"setting": "no logprobs", "cells": [cell(1), cell(2)]},
            {"setting": "failed to start", "cells": []},
        ]
    }
    assert sweep_lines(sweep) == [
        "max_num_seqs=1: logprobs bitwise equal to serial at c=1,4; at c=4 0.41 req/s, p50 9.5 s "
        "(8 samples per cell)",
        "max_num_seqs=4: the serial text everywhere, other logprobs at c=4 (largest |difference| "
        "0.132); "
        "at c=4 1.25 req/s (8 samples per cell)",
        "max_num_seqs=8: text drifts at c=2,4; at c=4 0.00 req/s (8 samples per cell)",
        "no logprobs: the serial text at c=1,2; at c=2 0.00 req/s (8 samples per cell)",
    ]


def test_a_sweep_line_never_speaks_for_a_setting_whose_server_died():
    # Its server died at c=4: nothing answered there, the requests failed at once. No "serial text
    # at c=1,4", no throughput of failures: the line says the setting failed and why.
    sweep = {
        "rows": [
            {
                "setting": "max_num_seqs=2",
                "error": "the server exited during the run (its log: x.log)",
                "cells": [
                    cell(1, requests_per_s=0.8),
                    cell(4, ok=0, distinct=0, requests_per_s=873.4, errors={"connect": 8}),
                ],
            },
            {
                "setting": "max_num_seqs=4",
                "cells": [
                    cell(4, ok=4, requests_per_s=2.0, errors={"timeout": 4}, short=True, asked=8)
                ],
            },
        ]
    }
    assert sweep_lines(sweep) == [
        "max_num_seqs=2: failed: the server exited during the run (its log: x.log)",
        "max_num_seqs=4: the serial text at c=4; at c=4 1.00 req/s (4 samples per cell)",
    ]  # answered ones only


def test_the_graded_step_runs_a_share_of_every_kind_in_both_languages_at_c1_and_c4():
    from kevload.demo.steps import GRADED_LEVELS, graded_scenario

    scenario = graded_scenario("http://127.0.0.1:9/v1", "m")
    kinds = {tuple(p.id.split("-")[:2]) for p in scenario.probes}
    assert len(scenario.probes) == 24 and all(p.grade for p in scenario.probes)
    assert kinds == {
        (k, lang) for k in ("sum", "count", "copy", "json", "choice") for lang in ("en", "zh")
    }
    assert scenario.load.concurrency == GRADED_LEVELS == (1, 4) and scenario.load.samples == 2
    assert scenario.target.base_url == "http://127.0.0.1:9/v1" and scenario.params == {
        "temperature": 0
    }


def test_the_graded_step_prints_accuracy_per_level_and_the_flips_of_a_server_whose_truth_is_known(
    tmp_path,
):
    import asyncio
    import io
    import re

    from rich.console import Console

    from kevload.demo.lines import graded_lines
    from kevload.demo.steps import run_graded
    from tests.fakeserver import Behaviour, FakeServer

    def sums_only(prompt: str, overlap: int) -> str:
        # Right on the English additions serially (sum-en-0: 9 + 2, sum-en-1: 14 + 23), one too many
        # under load; every other item answered with nothing it wants.
        found = re.match(r"What is (\d+) \+ (\d+)\?", prompt)
        if not found:
            return "I do not know."
        return str(int(found[1]) + int(found[2]) + (overlap >= 2))

    with FakeServer(Behaviour(latency=0.1, answer_for=sums_only)) as server:
        console = Console(file=io.StringIO())
        summary = asyncio.run(
            run_graded(server.url, "fake", tmp_path / "graded", console, asyncio.Event())
        ).summary
    assert graded_lines("llama.cpp", summary) == [
        "llama.cpp graded 24 items, single/c=1: accuracy 8.3% [2.3%, 25.8%] (2 of 24 probes good); "
        "the serial "
        "level, the reference",
        "llama.cpp graded 24 items, single/c=4: accuracy 0.0% [0.0%, 13.8%] (0 of 24 probes good); "
        "against serial "
        "over 24 paired probes: 2 good→bad, 0 bad→good, McNemar p 0.5",
        "llama.cpp graded: answers load turned bad: sum-en-0 (single) c=4, sum-en-1 (single) c=4",
    ]


def test_a_graded_step_whose_target_failed_says_so_and_nothing_else():
    summary = RunSummary.from_json(
        {"verdict": "target_failed", "cells": [], "errors_by_type": {"http_500": 4}}
    )
    from kevload.demo.lines import graded_lines

    assert graded_lines("vLLM", summary) == ["vLLM graded: target failed (http_500: 4)"]


def test_where_outputs_leave_the_serial_one_reads_as_a_point_or_a_window():
    def where(*drifting: dict) -> str:
        return headline("t", steps(cell(1), *drifting, verdict="nondeterministic")).split(", ", 1)[
            1
        ]

    assert (
        where(cell(4, distinct=2, drift=True, first_divergence_chars=7, last_divergence_chars=7))
        == "outputs leave the serial one at char 7 (0-based)"
    )
    # A cell whose last divergence is unknown says nothing about the window's end: not "between char
    # 7 and 0".
    assert (
        where(
            cell(2, distinct=2, drift=True, first_divergence_chars=7),
            cell(4, distinct=2, drift=True, first_divergence_chars=9, last_divergence_chars=None),
        )
        == "outputs leave the serial one at char 7 (0-based)"
    )
    assert (
        where(
            cell(2, distinct=2, drift=True, first_divergence_chars=7, last_divergence_chars=12),
            cell(4, distinct=3, drift=True, first_divergence_chars=9, last_divergence_chars=31),
        )
        == "outputs leave the serial one between char 7 and 31 (0-based)"
    )


def test_logprob_line_gives_no_size_of_0_for_cells_whose_tokens_differ():
    line = logprob_line(
        "x",
        steps(
            cell(1, logprob_samples=8, logprob_bitwise=True),
            cell(
                4,
                logprob_samples=8,
                logprob_bitwise=False,
                logprob_max_abs_diff=0.0,
                first_logprob_divergence_token=5,
                first_divergence_tokens=5,
            ),
        ),
    )
    assert (
        line
        == "x logprobs: 1 of 2 fixed-param cells differ from serial (c=4), from token 5 (0-based); "
        "16 samples compared"
    )


def test_the_demos_sweep_writes_a_row_for_every_setting_even_one_whose_server_never_started(
    tmp_path, monkeypatch
):
    import asyncio
    import contextlib
    import json

    from rich.console import Console

    from kevload.demo import steps

    @contextlib.asynccontextmanager
    async def never_ready(*args, **kwargs):
        yield None  # as `serving` does when the server fails to start

    monkeypatch.setattr(steps, "serving", never_ready)
    step2 = RunSummary.from_json({"verdict": "deterministic", "cells": [cell(1), cell(4)]})
    sweep = asyncio.run(
        steps.run_sweep(
            "vllm",
            step2,
            8,
            tmp_path,
            Console(file=None, quiet=True),
            asyncio.Event(),
            [],
            steps.Pace(120),
        )
    )
    written = json.loads((tmp_path / "vllm-sweep" / "sweep.json").read_text())
    assert written == sweep
    assert [(row["setting"], row["verdict"]) for row in sweep["rows"]] == [
        ("max_num_seqs=1", "not_run"),
        ("max_num_seqs=2", "not_run"),
        ("max_num_seqs=4", "deterministic"),
    ]


def test_a_steps_timeout_follows_the_servers_serial_pace_above_its_floor():
    from kevload.demo.steps import Pace

    assert Pace(120).timeout(4) == 120  # nothing measured yet: the floor
    assert Pace(120, serial_s=5.0).timeout(4) == 120  # 2 × 5 s × 4 = 40 s: the floor
    assert Pace(120, serial_s=20.0).timeout(4) == 160  # a slow machine: 2 × 20 s × 4
    assert Pace(120, serial_s=20.0).timeout(1) == 120
    assert Pace(10, serial_s=20.0).timeout(4, max_tokens=48) == 240  # 1.5 × the story's 32 tokens


def test_a_target_that_does_not_start_is_its_closing_line_and_the_others_still_run(
    monkeypatch, tmp_path
):
    from tests.fakeserver import Behaviour, FakeServer

    with FakeServer(Behaviour(latency=0.01)) as server:
        code, printed = _demo_against(
            server,
            ["transformers", "llamacpp"],
            monkeypatch,
            tmp_path,
            floor=10,
            not_starting=frozenset({"transformers"}),
        )
    closing = printed.split("in short\n", 1)[1].splitlines()
    assert code == 3, printed
    assert closing[0] == "transformers: did not start: transformers exited during startup (exit 1)"
    assert closing[1].startswith("llama.cpp: fixed params stable under batching; graded accuracy")
    assert closing[2] == "exit 3: a target failed a step (said above)"
    assert (tmp_path / "llamacpp-graded" / "summary.json").is_file()
    assert "engines compared" not in printed  # one engine answered: nothing to compare


def test_a_restart_that_fails_keeps_what_the_target_answered_before(monkeypatch, tmp_path):
    from tests.fakeserver import Behaviour, FakeServer

    # It drifts once two requests overlap: the demo reruns it with batching off, a restart.
    with FakeServer(Behaviour(latency=0.05, drift_at=2)) as server:
        code, printed = _demo_against(
            server,
            ["transformers"],
            monkeypatch,
            tmp_path,
            floor=10,
            not_restarting=frozenset({"transformers"}),  # its batching-off rerun
        )
    closing = printed.split("in short\n", 1)[1].splitlines()
    assert code == 3, printed
    assert closing[0].startswith("transformers: fixed params drift at c=2,4; graded")
    assert closing[0].endswith(
        "; then a restart failed: transformers exited during startup (exit 1)"
    ), closing
    assert "transformers: distinct outputs" in printed  # its matrix is still shown


def _demo_against(
    server,
    names,
    monkeypatch,
    out_dir,
    *,
    floor: float,
    slow_graded: frozenset[str] = frozenset(),
    items: int = 1,
    not_starting: frozenset[str] = frozenset(),
    not_restarting: frozenset[str] = frozenset(),
):
    """run_demo with `serving` giving a crafted server for every target (``server``, or a dict of
    them by target name), the graded step on ``items`` items of the demo's share, diagnose left
    out: the demo's own steps, timeouts and closing lines, in seconds."""
    import asyncio
    import contextlib
    import io
    import types

    from rich.console import Console

    from kevload import demo
    from kevload.demo import agreement, steps

    servers = server if isinstance(server, dict) else {n: server for n in names}

    starts: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def crafted(name, settings, **kwargs):
        starts[name] = starts.get(name, 0) + 1
        if name in not_starting or (name in not_restarting and starts[name] > 1):
            from kevload.errors import ServerError

            raise ServerError(f"{name} exited during startup (exit 1)\nits log's last lines")
        url = servers[name].url
        yield types.SimpleNamespace(name=name, url=url, model="m", failure=lambda: None)

    async def no_diagnose(*args, **kwargs) -> None:
        return None

    real_graded = steps.run_graded
    real_probes = steps.graded_probes

    async def graded(url, model, run_dir, console, stop, pace=None):
        name = run_dir.name.split("-")[0]
        # Every graded answer held past any timeout the demo could give: a target that times out.
        servers[name].behaviour.on_arrival = (lambda i, n: 30.0) if name in slow_graded else None
        return await real_graded(url, model, run_dir, console, stop, pace)

    monkeypatch.setattr(steps, "serving", crafted)
    monkeypatch.setattr(agreement, "serving", crafted)
    monkeypatch.setattr(steps, "_diagnose", no_diagnose)
    monkeypatch.setattr(steps, "run_graded", graded)
    monkeypatch.setattr(steps, "graded_probes", lambda probes: real_probes(probes)[:items])
    out = io.StringIO()
    code = asyncio.run(
        demo.run_demo(
            names,
            samples=2,
            console=Console(file=out, width=200),
            stop=asyncio.Event(),
            out=out_dir,
            timeout_floor=floor,
        )
    )
    return code, out.getvalue()


def test_the_demo_ends_with_a_line_per_target_naming_the_step_that_timed_out_and_why(
    monkeypatch, tmp_path
):
    from tests.fakeserver import Behaviour, FakeServer

    with FakeServer(Behaviour(latency=0.05)) as server:
        code, printed = _demo_against(
            server,
            ["llamacpp", "transformers"],
            monkeypatch,
            tmp_path,
            floor=1,
            slow_graded=frozenset({"transformers"}),
        )
    closing = printed.split("in short\n", 1)[1].splitlines()
    assert code == 3
    assert closing[0].startswith(
        "llama.cpp: fixed params stable under batching; graded accuracy "
    ), closing
    assert closing[1:] == [
        "transformers graded: 4 requests timed out after 1 s — the machine may be too slow; "
        "rerun with `kevload demo --targets transformers --timeout 2`",
        "exit 3: a target failed a step (said above)",
    ]
    assert "transformers graded: target failed (timeout: 4)" in printed


def test_a_slow_server_is_given_time_by_its_serial_pace_not_failed_by_the_floor(
    monkeypatch, tmp_path
):
    import json

    from tests.fakeserver import Behaviour, FakeServer

    # 0.4 s alone, 0.4 s more per request beside it: 1.6 s at c=4, past a 1 s floor; step 1's
    # serial pace gives c=4 2 × 0.4 × 4 = 3.2 s, rounded up to 4.
    with FakeServer(Behaviour(latency=0.4, latency_per_overlap=0.4)) as server:
        code, printed = _demo_against(server, ["llamacpp"], monkeypatch, tmp_path, floor=1)
    run_json = json.loads((tmp_path / "llamacpp-step2" / "run.json").read_text())
    assert code == 0, printed
    assert run_json["scenario"]["target"]["timeout"] == 4
    assert printed.split("in short\n", 1)[1].splitlines()[-1] == ("exit 0: every step was answered")


def test_the_demo_compares_the_engines_item_by_item_and_counts_a_candidates_wrong_sums_exactly(
    monkeypatch, tmp_path
):
    import json
    from pathlib import Path

    from tests.fakeserver import Behaviour, FakeServer

    graded = Path(__file__).parents[2] / "scenarios" / "graded.jsonl"
    expected = {}
    for line in graded.read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        expected[item["prompt"]] = (item["id"], str(item["expected"]))
    # The demo's first six graded items are the sums sum-{en,zh}-{0,1,2}; llama.cpp answers two of
    # them one too high at every level, the others answer every one right.
    wrong = {"sum-en-0", "sum-zh-1"}

    def answers(planted: set[str]):
        def answer(prompt: str, overlap: int) -> str:
            if prompt not in expected:
                return "A robot painted."
            item, right = expected[prompt]
            return str(int(right) + 1) if item in planted else right

        return answer

    names = ["llamacpp", "transformers", "vllm"]
    with (
        FakeServer(Behaviour(latency=0.02, answer_for=answers(wrong))) as quantized,
        FakeServer(Behaviour(latency=0.02, answer_for=answers(set()))) as full,
        FakeServer(Behaviour(latency=0.02, answer_for=answers(set()))) as other,
    ):
        servers = {"llamacpp": quantized, "transformers": full, "vllm": other}
        code, printed = _demo_against(servers, names, monkeypatch, tmp_path, floor=5, items=6)
    assert code == 0, printed
    shown = printed.split("the engines compared item by item (kevload compare)\n", 1)[1]
    assert shown.splitlines()[:12] == [
        "agreement, c=1            transformers     llama.cpp          vLLM",
        "  transformers                    100%           67%          100%",
        "  llama.cpp                        67%          100%           67%",
        "  vLLM                            100%           67%          100%",
        "agreement, c=4            transformers     llama.cpp          vLLM",
        "  transformers                    100%           67%          100%",
        "  llama.cpp                        67%          100%           67%",
        "  vLLM                            100%           67%          100%",
        "transformers graded accuracy: 100.0% at c=1, 100.0% at c=4",
        "llama.cpp graded accuracy: 66.7% at c=1, 66.7% at c=4",
        "vLLM graded accuracy: 100.0% at c=1, 100.0% at c=4",
        f"compare: {tmp_path / 'compare'}/compare.json, .md, .html",
    ]
    written = json.loads((tmp_path / "compare" / "compare.json").read_text())
    assert written["reference"] == "transformers"
    closing = printed.split("in short\n", 1)[1].splitlines()
    assert closing[-2:] == [
        "engines compared, same text as transformers on: llama.cpp 4 of 6 at c=1, 4 of 6 at c=4; "
        "vLLM 6 of 6 at c=1, 6 of 6 at c=4",
        "exit 0: every step was answered",
    ]
