"""`kevload run`: a scenario (or the quickstart) run, its matrix printed, exit with the run's
code."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kevload import exits
from kevload.cli.common import (
    Finite,
    exit_if_signalled,
    metrics_path,
    on_target,
    on_target_options,
    share,
    stderr,
    target_settings,
    trust_graders_option,
    write_metrics,
)
from kevload.cli.shorthands import as_overrides, refuse_set_twice, set_keys
from kevload.inputs.scenario import Scenario
from kevload.inputs.scenariokeys import MAX_RETRIES, MAX_WORKERS
from kevload.load.invocation import (
    RunGiven,
    check_fail_on,
    check_ray_target,
    pick_scenario,
    refuse_taken,
    samples_expected,
)
from kevload.load.runs import RunResult, run_scenario
from kevload.outputs import exitcode, gradedview
from kevload.outputs.escaping import visible
from kevload.outputs.terminal import render
from kevload.outputs.verdict import slo_line, verdict_line
from kevload.records.rundir import RunDir
from kevload.records.store import Record
from kevload.records.summary import RunSummary, level_label
from kevload.servers.targets import TargetSettings


@click.command(
    help="Run SCENARIO (or, with --url and --model, the quickstart scenario) and print the "
    "uniqueness matrix.\n\n"
    + "\n\n".join(
        f"Exit {int(code)}: {words.replace('`', '')}." for code, words in exits.RUN_EXITS.items()
    )
)
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option(
    "--url",
    help="Instead of SCENARIO: run the quickstart scenario against this base URL, e.g. "
    "http://127.0.0.1:8000/v1 (with --model).",
)
@click.option("--model", help="With --url: the model name to send.")
@click.option(
    "--prompt", help="With --url or --target and no SCENARIO: the quickstart probe's prompt."
)
@click.option(
    "--resume",
    type=click.Path(file_okay=False, path_type=Path),
    help="Finish the samples an interrupted run did not get to, with its own scenario.",
)
@trust_graders_option
@click.option(
    "--retries",
    type=click.IntRange(min=0, max=MAX_RETRIES),
    help="Retry 429/503 up to N times (Retry-After honoured).",
)
@click.option(
    "--dataset-seed",
    type=int,
    help="Which lines JSONL probe/companion datasets contribute "
    "(load.dataset_seed); recorded in run.json with each file's sha256.",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a scenario key; VALUE is TOML (e.g. --set 'load.concurrency=[1,4]').",
)
@click.option(
    "--until-bound",
    metavar="SHARE",
    help="Sample each cell until drift is seen or the 95% bound on "
    "its drift rate is this low (5% or 0.05; load.until_bound), at most load.max_samples.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=MAX_WORKERS),
    help="Worker processes sharing each level (load.workers).",
)
@click.option(
    "--ray",
    "ray_address",
    metavar="ADDRESS",
    help="Run the workers as actors of a Ray cluster: 'auto' "
    "(the one this host belongs to), host:port, or 'local' (started here for the run); needs "
    "pip install 'kevload[ray]'.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Run directory (default results/<run-id>); one that holds a run is refused.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Let --out replace the run already in it (its records are removed).",
)
@click.option(
    "--quiet",
    is_flag=True,
    help="No progress bar and no table; only the verdict line and a line for "
    "each other reason the exit code is not 0.",
)
@click.option(
    "--baseline",
    type=click.Path(exists=True, path_type=Path),
    help="An earlier run dir or summary.json: new drift, unseen outputs, slower latency, or "
    "drift in a "
    "cell the baseline lacks or whose input changed exit 1.",
)
@click.option(
    "--max-latency-regression",
    type=Finite(min=0),
    default=0.2,
    show_default=True,
    help="With --baseline: allowed relative growth of p50 e2e/TTFT latency.",
)
@click.option(
    "--verbose",
    is_flag=True,
    help="With --baseline: also a line per cell whose p50 e2e/TTFT latency grew beyond "
    "--max-latency-regression (the gate reads the whole run's ratio and its interval).",
)
@click.option(
    "--junit", type=click.Path(dir_okay=False, path_type=Path), help="Write JUnit XML here."
)
@click.option(
    "--metrics",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=lambda _c, _p, v: metrics_path(v),
    help="Write the cells as Prometheus text here (node_exporter textfile collector, Pushgateway).",
)
@click.option(
    "--fail-on",
    type=click.Choice(["drift", "latent", "bad"]),
    default="drift",
    show_default=True,
    help="latent: latent drift (the serial text, other per-token logprobs) exits 1 too, and a cell "
    "where some ok samples came without logprobs exits 3 (inconclusive). bad: only answers load "
    "made worse exit 1 (graded probes: a good serial answer graded bad under load, or accuracy "
    "falling significantly); drift whose answers stay good exits 0.",
)
@on_target_options
def run(
    scenario: Path | None,
    url: str | None,
    model: str | None,
    prompt: str | None,
    resume: Path | None,
    trust_graders: bool,
    retries: int | None,
    overrides: tuple[str, ...],
    out: Path | None,
    overwrite: bool,
    quiet: bool,
    baseline: Path | None,
    max_latency_regression: float,
    verbose: bool,
    junit: Path | None,
    metrics: Path | None,
    dataset_seed: int | None,
    fail_on: Literal["drift", "latent", "bad"],  # click.Choice
    until_bound: str | None,
    workers: int | None,
    ray_address: str | None,
    builtin: str | None,
    target_sets: tuple[str, ...],
) -> None:
    from kevload.outputs.baseline import load_baseline

    shorthands: dict[str, object] = {
        "--url": url,
        "--model": model,
        "--prompt": prompt,
        "--target": builtin,
        "--retries": retries,
        "--dataset-seed": dataset_seed,
        "--until-bound": until_bound,
        "--workers": workers,
    }
    overrides = _with_shorthands(overrides, shorthands)
    settings = target_settings(builtin, target_sets)
    check_ray_target(builtin, ray_address)
    given = RunGiven(scenario, resume, url, model, prompt, builtin, out, overwrite)
    sc = pick_scenario(given, list(overrides), trust_graders=trust_graders)
    check_fail_on(fail_on, sc)
    refuse_taken(given)
    reference = load_baseline(baseline) if baseline is not None else None
    sending = _Sending(sc, resume or out, resume is not None, overwrite, ray_address)
    result, signum, exited = _run_shown(sending, builtin, settings, quiet)
    if result is None:  # stopped while --target's server started: nothing was sent
        exit_if_signalled(signum)
    _print_summary(result.summary, quiet)
    _print_records(result, resumed=resume is not None)
    _write_files(result, junit, metrics, fail_on)
    exit_if_signalled(signum)
    if exited is not None:
        raise exited
    _exit(result, reference, baseline, (max_latency_regression, verbose), fail_on)


def _with_shorthands(overrides: tuple[str, ...], shorthands: dict[str, object]) -> tuple[str, ...]:
    """The --set overrides and, after them, the shorthands given (--retries N as load.retries=N),
    once no two of them set one key."""
    refuse_set_twice(set_keys(overrides), shorthands)
    until_bound = shorthands["--until-bound"]
    if isinstance(until_bound, str):
        shorthands = {**shorthands, "--until-bound": share(until_bound, "--until-bound")}
    return (*overrides, *as_overrides(shorthands))


@dataclass(frozen=True)
class _Sending:
    """What ``run_scenario`` is given besides the target: the scenario, where, and how."""

    sc: Scenario
    out: Path | None
    resume: bool
    overwrite: bool
    ray: str | None


def _run_shown(
    sending: _Sending, builtin: str | None, settings: TargetSettings | None, quiet: bool
) -> tuple[Any, int | None, Any]:
    """The run, with --target's server up for it and a progress bar on stderr (none when quiet)."""
    sc = sending.sc
    # Plain text, not markup: a probe id such as "a[/b]" would stop the run with rich's MarkupError.
    progress = Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        disable=quiet,
        transient=True,
    )
    with progress:
        task = progress.add_task(visible(sc.name), total=samples_expected(sc))

        def on_record(record: Record) -> None:
            if record.role == "probe" and record.is_sample:
                label = level_label(record.concurrency, record.rate)
                progress.update(task, advance=1, description=f"{visible(record.probe)} {label}")

        def work(url: str | None, model: str | None, stop: asyncio.Event) -> Any:
            started = (
                sc
                if url is None
                else sc.with_settings(
                    {"target.base_url": url, "target.model": model}, source="--target"
                )
            )
            return run_scenario(
                started,
                sending.out,
                on_record=on_record,
                stop=stop,
                resume=sending.resume,
                overwrite=sending.overwrite,
                ray=sending.ray,
            )

        return on_target(builtin, settings, work, quiet)


def _print_records(result: RunResult, *, resumed: bool) -> None:
    """Where the records are and how many requests the run sent (a resume's part of it beside
    it)."""
    run_files = RunDir(result.run_dir)
    files = ", ".join(str(p) for p in run_files.record_files()) or str(run_files.records_jsonl)
    # The run's own count, as run.json and summary.json say it; a resume's part of it beside it.
    part = f", {result.records} sent by this --resume" if resumed else ""
    stderr.print(
        f"records: {files} ({result.summary.requests_sent} requests{part}, {result.state})"
    )


def _write_files(result: RunResult, junit: Path | None, metrics: Path | None, fail_on: str) -> None:
    """--junit and --metrics, written from the run's summary."""
    if junit is not None:
        from kevload.outputs.junit import junit_xml

        junit.write_text(junit_xml(result.summary, fail_on=fail_on), encoding="utf-8")
    if metrics is not None:
        write_metrics(metrics, result.summary, result.run_dir)


def _exit(
    result: RunResult,
    reference: Any,
    baseline: Path | None,
    latency: tuple[float, bool],
    fail_on: Literal["drift", "latent", "bad"],
) -> None:
    """The run's own code; with --baseline (``reference``), its gate's lines printed and its
    code. ``latency``: --max-latency-regression and --verbose."""
    from kevload.outputs.baseline import judge

    if reference is None:
        sys.exit(exitcode.for_run(result.summary, fail_on=fail_on))
    max_latency_regression, verbose = latency
    lines, code = judge(
        result.summary,
        reference,
        name=str(baseline),
        max_latency_regression=max_latency_regression,
        fail_on=fail_on,
        run_dir=result.run_dir,
        baseline_path=baseline,
        verbose=verbose,
    )
    for line in lines:
        click.echo(line)
    sys.exit(code)


def _print_summary(summary: RunSummary, quiet: bool) -> None:
    """The table; quiet, the verdict line and one line for each other reason the run can exit
    non-zero (the SLO, answers load turned bad, load.min_good_share, a grader that failed), in the
    table's words: a CI log that shows a failed job shows why."""
    if quiet:
        lines = [
            verdict_line(summary),
            *([slo_line(summary)] if summary.slo else []),
            *gradedview.turned_bad_lines(summary),
            *gradedview.gate_lines(summary),
        ]
        for line in lines:
            click.echo(visible(line))
    else:
        render(summary, "table", Console())
