"""Command line: parse, call, print, and exit with the code ``exitcode`` gives the result. No logic lives here."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import shlex
import sys
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kevload import __version__, aio, exitcode
from kevload.compare.stats import samples_for_bound
from kevload.errors import InputError, KevloadError
from kevload.exitcode import ExitCode
from kevload.guide.diagnose import MIN_OK
from kevload.inputs.grading import BadGrading, Grading, checked
from kevload.inputs.probe import MAX_TOKENS, read_messages
from kevload.inputs.scenario import (
    APIS,
    MAX_CONCURRENCY,
    MAX_RETRIES,
    MAX_SAMPLES,
    MAX_SECONDS,
    MAX_WORKERS,
    Api,
    check_base_url,
    load_scenario,
    quickstart_scenario,
    toml_value,
)
from kevload.load.finishing import finish_run
from kevload.load.resuming import resumed_scenario
from kevload.load.runs import refuse_existing, run_scenario
from kevload.outputs import gradedview
from kevload.outputs.escaping import visible
from kevload.outputs.report import FORMATS, markdown_cell, render, slo_line, verdict_line
from kevload.records.rundir import RunDir
from kevload.records.store import Record, default_run_dir, json_bytes
from kevload.servers.targets import NAMES, TargetSettings
from kevload.summary import RunSummary, level_label

if TYPE_CHECKING:
    from kevload.compare.rollout import Comparison

stderr = Console(stderr=True)


def _log_line(message: str) -> None:
    """A progress line on stderr, as written: an id or a prompt in it may hold control characters or rich markup."""
    stderr.print(visible(message), markup=False, highlight=False)


class _Finite(click.FloatRange):
    """A FloatRange that refuses nan too, which passes every bound's comparison (and so would pass click's)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class _Main(click.Group):
    """The one place kevload's own errors become a message and an exit code (errors.py): every command,
    option callback and nested group runs inside this invoke. A Ctrl-C that reaches it (a second one, or one
    outside a run's loop) exits 130, a second SIGTERM 143: never click's "Aborted!" and 1, the drift code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KevloadError as exc:
            click.echo(f"kevload: error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            click.echo("kevload: stopped at once; what was written so far is kept", err=True)
            ctx.exit(aio.exit_code(exc))


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kevload")
def main() -> None:
    """Load-test an OpenAI-compatible LLM server and find out whether the same input gives the same output."""


def _on_target_options(func):
    """``--target NAME`` and ``--target-set KEY=VALUE``: a built-in target started for one command."""
    func = click.option(
        "--target-set",
        "target_sets",
        multiple=True,
        metavar="KEY=VALUE",
        help="A setting of --target's server, VALUE as TOML (max_num_seqs=1, enforce_eager=true): "
        "the names of `kevload target start`'s options, with underscores.",
    )(func)
    return click.option(
        "--target",
        "builtin",
        type=click.Choice(NAMES),
        help="Start this built-in target on 127.0.0.1 for the command (its URL and model are "
        "the ones used) and stop it after; one that stops serving meanwhile is exit 3.",
    )(func)


def _target_settings(builtin: str | None, target_sets: tuple[str, ...]) -> TargetSettings | None:
    if builtin is None:
        if target_sets:
            raise InputError("--target-set: only with --target NAME")
        return None
    options = {}
    for spec in target_sets:
        key, sep, value = spec.partition("=")
        if not sep or not key.strip():
            raise InputError(
                f"--target-set {spec!r}: expected KEY=VALUE, e.g. --target-set max_num_seqs=1"
            )
        options[key.strip()] = toml_value(value)
    return TargetSettings.from_options(options)


def _url_or_target(url: str | None, model: str | None, builtin: str | None) -> None:
    """A server is given one way: --url and --model, or --target (which has its own)."""
    if builtin is None and (url is None) != (model is None):
        raise InputError(
            "--url needs --model NAME (the model name to send)"
            if model is None
            else "--model needs --url URL (the server's base URL)"
        )
    if builtin is None and url is None:
        raise InputError("give --url and --model, or --target NAME to start a built-in target")
    if builtin is not None and (url is not None or model is not None):
        raise InputError("--target starts its own server: give no --url or --model with it")


def _set_keys(overrides: tuple[str, ...]) -> list[tuple[str, str]]:
    """Each ``--set KEY=VALUE`` as (how it was given, KEY); a malformed one is refused where it is applied."""
    return [(f"--set {key}", key) for key in (o.partition("=")[0].strip() for o in overrides)]


def _refuse_set_twice(sets: list[tuple[str, str]], options: list[tuple[str, str]]) -> None:
    """An option that sets a scenario key (``options``: the option, the key) given with a --set or --grid of that key
    or of a table around or inside it (``sets``: how, the key) is bad usage: one of the two would be dropped without
    a word, the run sent somewhere or something else than the command line says."""
    for option, key in options:
        for how, other in sets:
            if other == key or key.startswith(other + ".") or other.startswith(key + "."):
                raise InputError(f"{option} and {how} both set {key}: give one of them")


def _quick_option(url: str | None, model: str | None, prompt: str | None) -> str | None:
    """The first of run's quickstart options given (--url, --model, --prompt), to name it; None when none is."""
    return next(
        (
            name
            for name, value in (("--url", url), ("--model", model), ("--prompt", prompt))
            if value is not None
        ),
        None,
    )


_trust_graders_option = click.option(
    "--trust-graders",
    is_flag=True,
    help="Import the python: graders the run directory or case file names (from the directory the run found them "
    "in). Without it they are refused: that file is data, and may come from anywhere.",
)


def _on_target(
    builtin: str | None,
    settings: TargetSettings | None,
    work: Callable[[str | None, str | None, asyncio.Event], Coroutine[Any, Any, Any]],
    quiet: bool = False,
) -> tuple[Any, int | None, Any]:
    """``work(url, model, stop)`` under ``aio.run``, with ``--target``'s server running for it when one is given
    (its URL and model; None and None otherwise). Returns the result (None when stopped while the target
    started), the signal as ``aio.run`` does, and the error to raise once the result is shown when the target
    stopped serving meanwhile (exit 3; None otherwise)."""
    if builtin is None:
        result, signum = aio.run(lambda stop: work(None, None, stop))
        return result, signum, None
    from kevload.servers.targets import on_target

    assert settings is not None  # _target_settings makes them with --target
    log = (lambda m: None) if quiet else (lambda m: stderr.print(m, style="dim"))
    (result, exited), signum = aio.run(
        lambda stop: on_target(
            builtin, settings, lambda t: work(t.url, t.model, stop), log=log, stop=stop
        )
    )
    return result, signum, exited


@main.command(
    help="Run SCENARIO (or, with --url and --model, the quickstart scenario) and print the "
    "uniqueness matrix.\n\n"
    + "\n\n".join(
        f"Exit {int(code)}: {words.replace('`', '')}." for code, words in exitcode.RUN_EXITS.items()
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
@_trust_graders_option
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
    help="An earlier run dir or summary.json: new drift, unseen outputs, slower latency, or drift in a "
    "cell the baseline lacks or whose input changed exit 1.",
)
@click.option(
    "--max-latency-regression",
    type=_Finite(min=0),
    default=0.2,
    show_default=True,
    help="With --baseline: allowed relative growth of p50 e2e/TTFT latency.",
)
@click.option(
    "--junit", type=click.Path(dir_okay=False, path_type=Path), help="Write JUnit XML here."
)
@click.option(
    "--metrics",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=lambda _c, _p, v: _metrics_path(v),
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
@_on_target_options
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
    from kevload.outputs.baseline import judge, load_baseline

    _refuse_set_twice(
        _set_keys(overrides),
        [
            (option, key)
            for option, key, value in (
                ("--url", "target.base_url", url),
                ("--model", "target.model", model),
                ("--prompt", "probes", prompt),
                ("--target", "target.base_url", builtin),
                ("--target", "target.model", builtin),
                ("--retries", "load.retries", retries),
                ("--dataset-seed", "load.dataset_seed", dataset_seed),
                ("--until-bound", "load.until_bound", until_bound),
                ("--workers", "load.workers", workers),
            )
            if value is not None
        ],
    )
    overrides = (*overrides, f"load.retries={retries}") if retries is not None else overrides
    overrides = (
        (*overrides, f"load.dataset_seed={dataset_seed}") if dataset_seed is not None else overrides
    )
    if until_bound is not None:
        overrides = (*overrides, f"load.until_bound={_share(until_bound, '--until-bound')!r}")
    overrides = (*overrides, f"load.workers={workers}") if workers is not None else overrides
    settings = _target_settings(builtin, target_sets)
    if builtin is not None and ray_address not in (None, "local"):
        raise InputError(
            "--target starts its server at 127.0.0.1 of this host, which Ray workers on other "
            "hosts "
            "cannot reach: start it with `kevload target start` and give its URL instead"
        )
    quick = _quick_option(url, model, prompt)
    if resume is not None:
        if scenario is not None or out is not None or overwrite or quick is not None:
            raise InputError(
                "--resume RUN_DIR takes the scenario and directory of that run; "
                "give no SCENARIO, --out, --overwrite, --url, --model or --prompt"
            )
        sc = resumed_scenario(resume, list(overrides), trust_graders=trust_graders)
        out = resume
    elif scenario is not None:
        if quick is not None:
            raise InputError(
                f"{quick}: only without SCENARIO (it sets the quickstart scenario's; a scenario "
                "file's target is changed with --set, e.g. --set target.model=NAME)"
            )
        sc = load_scenario(scenario, list(overrides))
    elif quick is None and builtin is None:
        raise InputError("missing SCENARIO (or --url URL --model NAME, or --resume RUN_DIR)")
    else:
        _url_or_target(url, model, builtin)
        sc = quickstart_scenario(prompt, list(overrides))
        if builtin is None:  # --target's URL and model are set once its server is up
            sc = sc.with_settings({"target.base_url": url}, source="--url")
            sc = sc.with_settings({"target.model": model}, source="--model")
    sc.api_key()
    if fail_on == "bad" and not any(p.grade for p in sc.probes):
        raise InputError(
            "--fail-on bad: expected probes with expected or grade (none of the scenario's "
            f"{len(sc.probes)} probes is graded)"
        )
    if resume is None and out is not None:
        refuse_existing(
            out,
            overwrite=overwrite,
            hint=f"--resume {out} finishes it, --overwrite starts it afresh",
        )
    reference = load_baseline(baseline) if baseline is not None else None
    # Sampling until a bound takes as many samples as the answers call for: the bar counts up to the
    # clean case.
    per_cell = (
        max(sc.load.samples, samples_for_bound(sc.load.until_bound))
        if sc.load.until_bound
        else sc.load.samples
    )
    levels = len(sc.load.rate or sc.load.concurrency) + (
        len(sc.load.trace_speedup) if sc.load.trace else 0
    )
    total = len(sc.probes) * levels * per_cell
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
        task = progress.add_task(visible(sc.name), total=total)

        def on_record(record: Record) -> None:
            if record.role == "probe" and record.is_sample:
                progress.update(
                    task,
                    advance=1,
                    description=f"{visible(record.probe)} {level_label(record.concurrency, record.rate)}",
                )

        def work(url: str | None, model: str | None, stop):
            started = (
                sc
                if url is None
                else sc.with_settings(
                    {"target.base_url": url, "target.model": model}, source="--target"
                )
            )
            return run_scenario(
                started,
                out,
                on_record=on_record,
                stop=stop,
                resume=resume is not None,
                overwrite=overwrite,
                ray=ray_address,
            )

        result, signum, exited = _on_target(builtin, settings, work, quiet)
    if result is None:  # stopped while --target's server started: nothing was sent
        _exit_if_signalled(signum)
    _print_summary(result.summary, quiet)
    run_files = RunDir(result.run_dir)
    files = ", ".join(str(p) for p in run_files.record_files()) or str(run_files.records_jsonl)
    # The run's own count, as run.json and summary.json say it; a resume's part of it beside it.
    part = f", {result.records} sent by this --resume" if resume is not None else ""
    stderr.print(
        f"records: {files} ({result.summary.requests_sent} requests{part}, {result.state})"
    )
    if junit is not None:
        from kevload.outputs.report import junit_xml

        junit.write_text(junit_xml(result.summary, fail_on=fail_on), encoding="utf-8")
    if metrics is not None:
        _write_metrics(metrics, result.summary, result.run_dir)
    _exit_if_signalled(signum)
    if exited is not None:
        raise exited
    if reference is None:
        sys.exit(exitcode.for_run(result.summary, fail_on=fail_on))
    lines, code = judge(
        result.summary,
        reference,
        name=str(baseline),
        max_latency_regression=max_latency_regression,
        fail_on=fail_on,
    )
    for line in lines:
        click.echo(line)
    sys.exit(code)


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write to a file."
)
@click.option(
    "--metrics",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=lambda _c, _p, v: _metrics_path(v),
    help="Also write the cells as Prometheus text here.",
)
@click.option(
    "--request",
    "request_id",
    metavar="ID",
    help="Print only the record of the request sent with this X-Request-Id, as JSON.",
)
@_trust_graders_option
def report(
    run_dir: Path,
    fmt: str,
    output: Path | None,
    metrics: Path | None,
    request_id: str | None,
    trust_graders: bool,
) -> None:
    """Recompute a run's summary from its records (no server needed) and render it; sweeps and
    comparisons too.

    Exits with the run's own code, as `kevload run` without --baseline and --fail-on would: 0 held,
    1 drift (or a cell under an SLO or load.min_good_share), 2 bad input or a grader that failed, 3
    target failed or evidence short. A sweep's report exits 0; a comparison's, with its gate's code."""
    if (run_dir / "compare-run.json").is_file():
        from kevload.servers.rollout import finish

        if request_id is not None:
            raise InputError(
                f"--request: not for a comparison ({run_dir}); give one of its run directories"
            )
        outcome = finish(run_dir, None, trust_graders=trust_graders)
        _show_comparison(outcome, fmt, output, None, metrics)
        sys.exit(outcome.result.code)
    if (run_dir / "sweep.json").is_file() and not RunDir(run_dir).record_files():
        for option, given in (("--metrics", metrics), ("--request", request_id)):
            if given is not None:
                raise InputError(f"{option}: {run_dir} is a sweep; give one of its run directories")
        _report_sweep(run_dir, fmt, output)
        return
    run = RunDir.open(run_dir)
    if request_id is not None:
        import orjson

        record = run.find(request_id)
        if record is None:
            raise InputError(f"--request {request_id}: no record in {run_dir} has that request_id")
        _emit(orjson.dumps(record, option=orjson.OPT_INDENT_2).decode(), output)
        return
    run.run_id()  # refuses a directory holding two runs
    meta = run.meta()
    summary = finish_run(run_dir, meta=meta, trust_graders=trust_graders)
    if fmt == "html":
        from kevload.outputs.html import run_report

        _emit(run_report(summary, meta, run.records()), output)
    elif output is None:
        text = render(summary, fmt, Console())
        if text is not None:
            click.echo(text)
        _echo_where(meta, fmt, click.echo)
    else:
        with output.open("w", encoding="utf-8") as handle:
            text = render(summary, fmt, Console(file=handle, width=120))
            if text is not None:
                handle.write(text + "\n")
            _echo_where(meta, fmt, lambda line: handle.write(line + "\n"))
    if metrics is not None:
        _write_metrics(metrics, summary, run_dir)
    sys.exit(exitcode.for_summary(summary))


def _echo_where(meta: dict[str, Any], fmt: str, echo: Callable[[str], Any]) -> None:
    """The table and the Markdown end with where the run ran (run.json's machine and server); JSON is the
    summary alone."""
    from kevload.records.machine import where_text

    where = where_text(meta)
    if where is not None and fmt != "json":
        echo(markdown_cell(where) if fmt == "markdown" else where)


def _report_sweep(sweep_dir: Path, fmt: str, output: Path | None) -> None:

    from kevload.outputs.sweephtml import sweep_report
    from kevload.servers.sweepfile import read_sweep, sweep_markdown

    sweep = read_sweep(sweep_dir / "sweep.json")
    renderers = {
        "html": sweep_report,
        "markdown": sweep_markdown,
        "json": _indented_json,
        "table": sweep_markdown,
    }
    _emit(renderers[fmt](sweep), output)


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        click.echo(text)
    else:
        output.write_text(text, encoding="utf-8")
        stderr.print(f"wrote {output}")


def _share(text: str, option: str) -> float:
    """``5%`` or ``0.05`` → 0.05; anything else, or a share outside (0, 1), is a usage error."""
    try:
        value = float(text[:-1]) / 100 if text.strip().endswith("%") else float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < 1:
        raise InputError(
            f"{option}: expected a share between 0 and 1 such as 5% or 0.05, got {text!r}"
        )
    return value


def _metrics_path(path: Path | None) -> Path | None:
    """Checked before anything runs: a nightly job should not learn of a typo in the path after hours of load."""
    if path is not None and not (path.parent.is_dir() and os.access(path.parent, os.W_OK)):
        raise InputError(f"--metrics {path}: expected a file in an existing, writable directory")
    return path


def _write_metrics(path: Path, summary: RunSummary, run_dir: Path) -> None:
    from kevload.outputs.metrics import write_metrics

    try:
        write_metrics(path, summary, RunDir(run_dir).meta())
    except OSError as exc:
        raise InputError(f"--metrics {path}: cannot write ({exc.strerror or exc})") from None
    stderr.print(f"metrics: {path}")


def _print_summary(summary: RunSummary, quiet: bool) -> None:
    """The table; quiet, the verdict line and one line for each other reason the run can exit non-zero (the SLO,
    answers load turned bad, load.min_good_share, a grader that failed), in the table's words: a CI log that shows
    a failed job shows why."""
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


def _exit_if_signalled(signum: int | None) -> None:
    """A run stopped by SIGINT/SIGTERM exits 130/143 once what it collected is written."""
    if signum is not None:
        sys.exit(aio.EXIT_FOR_SIGNAL[signum])


@main.group()
def target() -> None:
    """Built-in real targets on 127.0.0.1: llama.cpp's llama-server, transformers serve and vLLM (CPU)."""


def _target_options(func):
    options = [
        click.option(
            "--slots",
            "--max-num-seqs",
            "slots",
            type=click.IntRange(min=1),
            default=4,
            show_default=True,
            help="The most requests decoded together (llama.cpp --parallel, vLLM --max-num-seqs).",
        ),
        click.option(
            "--ctx-size",
            type=click.IntRange(min=64),
            help="Context size (llama.cpp; default 2048 × slots).",
        ),
        click.option(
            "--max-model-len",
            type=click.IntRange(min=16),
            help="Context length of one request (vLLM; default 2048).",
        ),
        click.option(
            "--threads", type=click.IntRange(min=1), help="CPU threads (default: all cores)."
        ),
        click.option(
            "--batching/--no-batching",
            default=True,
            show_default=True,
            help="Continuous batching on or off (vLLM: off is --max-num-seqs 1).",
        ),
        click.option(
            "--cache-prompt/--no-cache-prompt",
            "--prefix-caching/--no-prefix-caching",
            "cache_prompt",
            default=True,
            show_default=True,
            help="Reuse of a prompt's KV cache (llama.cpp --cache-prompt, vLLM prefix caching).",
        ),
        click.option(
            "--enforce-eager/--no-enforce-eager",
            default=False,
            show_default=True,
            help="vLLM: eager PyTorch, no torch.compile (starts in about 20 s; compiled: a minute with "
            "its compile cache, 2–3 the first time).",
        ),
        click.option(
            "--dtype",
            default="bfloat16",
            show_default=True,
            help="Weights dtype (transformers, vLLM).",
        ),
        click.option(
            "--seed", type=int, help="Server-wide default seed (vLLM: its engine's seed)."
        ),
        click.option(
            "--gguf", type=click.Path(dir_okay=False, exists=True), help="Your own GGUF model file."
        ),
        click.option("--port", type=click.IntRange(1, 65535), help="Port (default: a free one)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@target.command("start")
@click.argument("name", type=click.Choice(NAMES))
@_target_options
def target_start(name: str, **options) -> None:
    """Build/install NAME once, start it and print the model name to send and its base URL (the last
    line)."""
    from kevload.servers.targets import save_state, start_target, status_target

    current = status_target(name)
    if current and current["running"]:
        raise InputError(
            f"{name} is already running at {current['url']} (pid {current['pid']}); "
            f"`kevload target stop {name}` first"
        )
    settings = TargetSettings.from_options(options)
    running = start_target(name, settings, log=lambda m: click.echo(m, err=True))
    save_state(running)
    click.echo(f"{name} pid {running.pid}, log {running.log_path}", err=True)
    # The name the server answers to: for transformers a cache path, not SmolLM2-135M-Instruct.
    click.echo(
        f"model: {running.model} (kevload run --url {running.url} "
        f"--model {shlex.quote(running.model)} --prompt …)"
    )
    click.echo(running.url)


@target.command("stop")
@click.argument("name", type=click.Choice(NAMES))
def target_stop(name: str) -> None:
    """Stop NAME's whole process group."""
    from kevload.servers.targets import forget_state, status_target, stop_target

    current = status_target(name)
    if current is None:
        click.echo(f"{name} is not running")
        return
    stop_target(current["pid"])
    forget_state(name)
    click.echo(f"{name} stopped (pid {current['pid']})")


@target.command("status")
@click.argument("name", type=click.Choice(NAMES))
def target_status(name: str) -> None:
    """Pid, port, model and settings of NAME (those it has), if it was started here."""
    from kevload.servers.targets import settings_of, status_target

    current = status_target(name)
    if current is None or not current["running"]:
        click.echo(f"{name}: not running")
        sys.exit(ExitCode.TARGET)
    settings = ", ".join(
        f"{k}={v}"
        for k, v in current["settings"].items()
        if v not in (None, [], ()) and k in settings_of(name)
    )
    click.echo(
        f"{name}: running, pid {current['pid']}, port {current['port']}, url {current['url']}\n"
        f"model: {current['model']}\nsettings: {settings}\nlog: {current['log_path']}"
    )


@main.command()
@click.option(
    "--targets",
    default="llamacpp,transformers,vllm",
    show_default=True,
    help="Comma-separated built-in targets to run the demo against.",
)
@click.option(
    "--samples", type=click.IntRange(min=2, max=MAX_SAMPLES), default=8, show_default=True
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1, max=24 * 3600),
    default=120,
    show_default=True,
    help="The least request timeout of every step (s); a server slower than it is given more: "
    "2 × its slowest serial answer × the step's top level.",
)
def demo(targets: str, samples: int, timeout: float) -> None:
    """The guide's first three steps against the built-in real targets, matrices side by side, and vLLM's
    max-batch-size sweep. Ends with a line per target: what it found, or which step failed and why.
    Exit 0, or 3 when a target failed a step."""
    from kevload.demo import run_demo

    names = [t.strip() for t in targets.split(",") if t.strip()]
    bad = [n for n in names if n not in NAMES]
    if bad:
        raise InputError(
            f"--targets: unknown target {bad[0]!r}; expected some of {', '.join(NAMES)}"
        )
    code, signum = aio.run(
        lambda stop: run_demo(
            names, samples=samples, console=Console(), stop=stop, timeout_floor=timeout
        )
    )
    _exit_if_signalled(signum)
    sys.exit(code)


@main.command("diagnose")
@click.option("--url", help="Base URL, e.g. http://127.0.0.1:8000/v1 (or --target).")
@click.option("--model", help="The model name to send (or --target).")
@click.option("--prompt", help="The input that misbehaves.")
@click.option(
    "--messages",
    "messages_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSON file with a chat messages list, instead of --prompt.",
)
@click.option(
    "--params",
    "params_json",
    default="{}",
    help="Current request params as JSON (what production sends).",
)
@click.option(
    "--max-tokens", type=click.IntRange(min=1, max=MAX_TOKENS), default=48, show_default=True
)
@click.option(
    "--samples",
    type=click.IntRange(min=MIN_OK, max=MAX_SAMPLES),
    default=6,
    show_default=True,
    help=f"Samples per step (at least {MIN_OK}: fewer ok ones leave a step nothing to conclude).",
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=2, max=MAX_CONCURRENCY),
    default=4,
    show_default=True,
)
@click.option("--api", type=click.Choice(APIS), default="chat", show_default=True)
@click.option("--timeout", type=_Finite(min=0.1, max=MAX_SECONDS), default=60.0, show_default=True)
@click.option("--api-key-env", help="Environment variable holding the API key.")
@click.option(
    "--online",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Live inputs (JSONL).",
)
@click.option(
    "--train",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Training set (JSONL).",
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the diagnosis here.",
)
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), help="Directory for the step runs."
)
@click.option("--all", "run_all", is_flag=True, help="Run every step even after a cause is found.")
@click.option(
    "--until-bound",
    metavar="SHARE",
    help="In the fixed and concurrency steps, sample each cell until "
    "drift is seen or the 95% bound on its drift rate is this low (5% or 0.05), at most "
    "--max-samples.",
)
@click.option(
    "--max-samples",
    type=click.IntRange(min=2, max=MAX_SAMPLES),
    default=1000,
    show_default=True,
    help="With --until-bound: the most probe samples per cell.",
)
@click.option(
    "--expected",
    "expected_text",
    metavar="ANSWER",
    help="What a good answer is: each step says how many "
    "answers were good and bad beside its distinct count. Read as JSON where it is a number, list "
    "or "
    'object (42, ["a","b"]), else as text.',
)
@click.option(
    "--grade",
    help="How answers are graded (exact, contains, regex, one_of, number, choice, json, "
    "json_schema, python:module:function); default: picked from --expected's kind.",
)
@click.option(
    "--grade-tolerance", type=float, help="With --grade number: how far the answer's number may be."
)
@_on_target_options
def diagnose_command(
    url,
    model,
    prompt,
    messages_file,
    params_json,
    max_tokens,
    samples,
    max_concurrency,
    api,
    timeout,
    api_key_env,
    online,
    train,
    json_out,
    out,
    run_all,
    until_bound,
    max_samples,
    expected_text,
    grade,
    grade_tolerance,
    builtin,
    target_sets,
) -> None:
    """Walk the guide's steps against a server and say which layer the problem is in."""
    import dataclasses

    import orjson

    from kevload.guide.diagnose import DiagnoseOptions, check_options, diagnose
    from kevload.inputs.probe import Probe
    from kevload.outputs.report import diagnosis_text

    if (prompt is None) == (messages_file is None):
        raise InputError("give exactly one of --prompt TEXT or --messages FILE")
    _url_or_target(url, model, builtin)
    if url is not None:
        check_base_url(url, "--url")
    settings = _target_settings(builtin, target_sets)
    if (online is None) != (train is None):
        raise InputError("--online and --train go together")
    try:
        params = orjson.loads(params_json)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"--params: expected a JSON object, got {params_json!r} ({exc})") from None
    if not isinstance(params, dict):
        raise InputError(f"--params: expected a JSON object, got {params_json!r}")
    messages = None
    if messages_file is not None:
        messages = read_messages(messages_file, "--messages")
    graded = _cli_grading(expected_text, grade, grade_tolerance)
    probe = Probe(
        id="probe",
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens,
        **(
            {}
            if graded is None
            else {
                "expected": graded.expected,
                "grade": graded.grade,
                "grade_tolerance": graded.tolerance,
            }
        ),
    )
    # With --target the URL is the started server's; a placeholder meanwhile lets the options be
    # checked first.
    options = DiagnoseOptions(
        url=url or "http://127.0.0.1:1/v1",
        model=model or "",
        probe=probe,
        params=params,
        api=api,
        samples=samples,
        max_concurrency=max_concurrency,
        timeout=timeout,
        api_key_env=api_key_env,
        run_all=run_all,
        online=online,
        train=train,
        out=out,
        until_bound=None if until_bound is None else _share(until_bound, "--until-bound"),
        max_samples=max_samples,
    )
    check_options(options)

    def work(url: str | None, model: str | None, stop):
        given = (
            options
            if url is None
            else dataclasses.replace(options, url=url, model=model or options.model)
        )
        return diagnose(given, log=_log_line, stop=stop)

    result, signum, exited = _on_target(builtin, settings, work)
    if result is None:
        _exit_if_signalled(signum)
    click.echo(diagnosis_text(result.to_json()))
    if json_out is not None:
        json_out.write_bytes(orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2))
    _exit_if_signalled(signum)
    if exited is not None:
        raise exited
    sys.exit(exitcode.for_diagnosis(target_failed=result.target_failed, verdict=result.verdict))


def _cli_grading(
    expected_text: str | None, grade: str | None, tolerance: float | None
) -> Grading | None:
    """--expected/--grade/--grade-tolerance checked as a probe's keys are (``grading.checked``, a schema file or a
    python grader found from the working directory); None when neither is given. A bad one is exit 2 naming it."""
    from decimal import Decimal

    import msgspec

    expected: Any = expected_text
    if expected_text is not None:
        try:
            # msgspec: an integer of any size is read as that integer (orjson reads the float
            # near it).
            parsed = msgspec.json.decode(expected_text)
        except (msgspec.DecodeError, RecursionError):
            parsed = None
        # A number, list or object is meant as one (42 picks the number grader); anything else is
        # the text itself. A decimal number is the decimal written, not the float near it.
        if isinstance(parsed, float):
            expected = Decimal(expected_text.strip())
        elif isinstance(parsed, int | list | dict | str) and not isinstance(parsed, bool):
            expected = parsed
    try:
        return checked(expected, grade, tolerance, Path.cwd())
    except BadGrading as bad:
        raise InputError(
            f"--{bad.key.replace('_', '-')}: expected {bad.expected}, got {str(bad.got)[:80]!r}"
        ) from None


@main.command("coverage")
@click.argument("online", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("train", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the report here.",
)
@click.option(
    "--flag",
    "flag_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write each online input with its boundary-sample reasons (JSONL).",
)
@click.option(
    "--max-bad",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Bad lines (not JSON, torn, no input) skipped per file before the file is refused (exit 2).",
)
def coverage_command(
    online: Path, train: Path, json_out: Path | None, flag_out: Path | None, max_bad: int
) -> None:
    """Compare live inputs (ONLINE.jsonl) with the training set (TRAIN.jsonl): lengths, keywords, labels."""
    import orjson

    from kevload.guide.coverage import compare, flag_file, scan, segmenter
    from kevload.outputs.report import coverage_text

    seg = segmenter()
    online_side = scan(online, max_bad=max_bad, seg=seg)
    train_side = scan(train, max_bad=max_bad, seg=seg)
    result = compare(online_side, train_side)
    if flag_out is not None:
        result["flagged"] = flag_file(online, train_side, flag_out, max_bad=max_bad)
    click.echo(coverage_text(result))
    if json_out is not None:
        json_out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))


@main.group()
def cases() -> None:
    """Case sets: the guide's regression suite of stable and unstable inputs."""


@cases.command("build")
@click.argument(
    "run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path)
)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--target-name",
    help="Name the server these runs ran against (default: the base URL's host:port); "
    "give the same name in every environment whose URLs differ.",
)
def cases_build(run_dirs: tuple[Path, ...], output: Path, target_name: str | None) -> None:
    """Append one case per probe and setting from RUN_DIRS; existing cases are never dropped or rewritten."""
    from kevload.guide.cases import build_cases

    built = build_cases(list(run_dirs), output, target_name=target_name)
    click.echo(f"{output}: {built.new} new, {built.kept} kept, {len(built.skipped)} skipped")
    for skip in built.skipped:
        click.echo(visible(f"  skipped {skip.id} from {skip.run}: {skip.reason}"))


@cases.command("rerun")
@click.argument("cases_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--url", help="Base URL of the server to rerun on (or --target).")
@click.option("--model", help="The model name to send (or --target).")
@click.option("--times", type=click.IntRange(min=2, max=MAX_SAMPLES), default=5, show_default=True)
@click.option("--api", type=click.Choice(APIS), default="chat", show_default=True)
@click.option(
    "--target-name", help="Rerun only the cases of this target (as `cases build` named it)."
)
@click.option(
    "--accept-changes",
    "accept",
    is_flag=True,
    help="Record the new answers of changed cases as their outputs (the old ones stay in history).",
)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Parent directory of the rerun runs (default results): each rerun makes OUT/cases-rerun-<id>/.",
)
@_trust_graders_option
@_on_target_options
def cases_rerun(
    cases_file: Path,
    url: str | None,
    model: str | None,
    times: int,
    api: Api,  # click.Choice(APIS)
    target_name: str | None,
    accept: bool,
    output: Path,
    out: Path | None,
    trust_graders: bool,
    builtin: str | None,
    target_sets: tuple[str, ...],
) -> None:
    """Rerun every case under its recorded load and compare with its recorded outputs.

    Exit 1 if a stable case became unstable, a stable case now answers something else (`changed`,
    unless --accept-changes) or an `expected` output is not met; 3 if a case got no answer.
    """

    from kevload.guide.cases import (
        accept_changes,
        describe_load,
        read_cases,
        rerun_cases,
        transitions,
    )

    _url_or_target(url, model, builtin)
    if url is not None:
        check_base_url(url, "--url")
    settings = _target_settings(builtin, target_sets)
    items = read_cases(cases_file, trust_graders=trust_graders)
    if target_name is not None:
        items = [c for c in items if (c.get("target") or {}).get("name") == target_name]
        if not items:
            raise InputError(f"{cases_file}: no case of target {target_name!r}")

    def work(started_url: str | None, started_model: str | None, stop):
        to_url, to_model = started_url or url, started_model or model
        assert to_url is not None and to_model is not None  # one or the other: _url_or_target
        return rerun_cases(
            items,
            url=to_url,
            model=to_model,
            times=times,
            api=api,
            out=out,
            stop=stop,
            log=_log_line,
            base=cases_file.parent,
        )

    results, signum, exited = _on_target(builtin, settings, work)
    if results is None:
        _exit_if_signalled(signum)
    with output.open("wb") as handle:
        for r in results:
            handle.write(json_bytes(r) + b"\n")
    for r in results:
        recorded = {
            True: "matches recorded",
            False: "NOT among recorded outputs",
            None: "nothing recorded",
        }
        click.echo(
            visible(
                f"{r['id']}: {describe_load(r['rerun'])} → {r['rerun_uniq']} distinct of "
                f"{r['rerun_ok']}, "
                f"{r['verdict']}→{r['verdict_after']}, {recorded[r['matches_recorded']]}"
            )
        )
    moves = transitions(results)
    for key, ids in moves.items():
        click.echo(
            visible(
                f"{key}: {len(ids)}"
                + (f" ({', '.join(ids)})" if ids and key != "unchanged" else "")
            )
        )
    mismatched = [r["id"] for r in results if r.get("matches_expected") is False]
    for r in results:
        if "matches_expected" in r:
            graded = r["graded_after"]
            failed = f", {graded['failed']} not graded" if graded["failed"] else ""
            click.echo(
                visible(
                    f"{r['id']}: {'matches' if r['matches_expected'] else 'does not match'} "
                    f"expected "
                    f"({graded['good']} good, {graded['bad']} bad{failed} by grade "
                    f"{graded['grade']})"
                )
            )
        for error in r.get("grade_errors", ()):
            click.echo(
                visible(f"grader failed: {error}")
            )  # it names the case: the rerun's probe is called by its id
    if accept and moves["changed"]:
        updated = accept_changes(cases_file, results)
        click.echo(
            f"{cases_file}: accepted the new answers of {len(updated)} changed case(s); "
            "the old outputs are kept in their history"
        )
    _exit_if_signalled(signum)
    if exited is not None:
        raise exited
    sys.exit(
        exitcode.for_rerun(
            moves,
            mismatched=mismatched,
            accepted=accept,
            grader_failed=[r["id"] for r in results if r.get("grade_errors")],
        )
    )


@main.command("sweep")
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--server-cmd",
    help="Command that starts the server; it must contain {port} (a free port, which "
    "becomes target.base_url); other {NAME} placeholders are --grid axes.",
)
@click.option(
    "--target",
    "builtin",
    type=click.Choice(NAMES),
    help="Sweep a built-in target's settings instead.",
)
@click.option(
    "--grid",
    "grids",
    multiple=True,
    required=True,
    metavar="NAME=V1,V2",
    help="An axis: a server placeholder/setting (slots=1,2,4) or a scenario key (load.mode=single,mixed).",
)
@click.option("--ready-url", help="Readiness URL (default http://127.0.0.1:{port}/health).")
@click.option(
    "--ready-timeout",
    type=_Finite(min=1, max=MAX_SECONDS),
    metavar="SECONDS",
    help="How long each setting's server may take to answer its readiness URL with 200 before that "
    "setting fails and the sweep goes on (default 300 with --server-cmd; with --target the "
    "target's own: "
    "llamacpp 180, transformers 300, vllm 600).",
)
@click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Scenario override, as for run."
)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Sweep directory.")
@click.option(
    "--quiet", is_flag=True, help="No progress and no table; only one verdict line per setting."
)
@click.option(
    "--ray",
    "ray_address",
    metavar="ADDRESS",
    help="Run the server settings side by side as Ray tasks: "
    "'auto' (this machine's cluster), 'local' or host:port. Needs --server-cmd.",
)
@click.option(
    "--resources",
    metavar="JSON",
    help="What each setting's Ray task needs on its node, e.g. "
    """'{"GPU": 1}' (with --ray; default one CPU).""",
)
@click.option(
    "--reference",
    metavar="AXIS=VALUE",
    help="Compare each setting's answers item by item with the setting that has AXIS at VALUE "
    "(its other axes as its own), as compare does; exit 1 when one is worse.",
)
@click.option(
    "--alpha",
    type=_Finite(min=1e-6, max=0.5),
    default=0.05,
    show_default=True,
    help="With --reference: the gate's false alarm rate, shared out over settings × levels.",
)
@click.option(
    "--min-agreement",
    metavar="SHARE",
    help="With --reference: ungraded items pass while this share (95% or 0.95) agrees.",
)
@click.option(
    "--fail-on",
    type=click.Choice(["drift", "bad"]),
    default="drift",
    show_default=True,
    help="With --reference, bad: any graded item good on the reference and bad on a setting "
    "fails too.",
)
def sweep_command(
    scenario,
    server_cmd,
    builtin,
    grids,
    ready_url,
    ready_timeout,
    overrides,
    out,
    quiet,
    ray_address,
    resources,
    reference,
    alpha,
    min_agreement,
    fail_on,
) -> None:
    """Run SCENARIO for every setting in the grid and print one matrix: settings × levels."""
    from kevload.compare.gate import GateRules
    from kevload.outputs.sweepview import reference_table
    from kevload.servers import sweepref
    from kevload.servers.sweep import run_sweep
    from kevload.servers.sweepfile import sweep_markdown
    from kevload.servers.sweepgrid import Grid

    grid = Grid.parse(list(grids))
    judge = None
    if reference is not None:
        rules = GateRules(
            alpha=alpha,
            min_agreement=None
            if min_agreement is None
            else _share(min_agreement, "--min-agreement"),
            fail_on_bad=fail_on == "bad",
        )
        judge = functools.partial(
            sweepref.judge, reference=sweepref.Reference.parse(reference, grid), rules=rules
        )
    elif min_agreement is not None or fail_on != "drift" or alpha != 0.05:
        raise InputError("--alpha, --min-agreement and --fail-on: only with --reference")
    if server_cmd is not None and builtin is not None:
        raise InputError("give one of --server-cmd or --target, not both")
    # Each setting's started server is where its runs go: a URL or model set otherwise would be
    # dropped or win.
    _refuse_set_twice(
        [*_set_keys(overrides), *((f"--grid {name}", name) for name in grid.scenario)],
        [("--server-cmd", "target.base_url")]
        if server_cmd is not None
        else [("--target", "target.base_url"), ("--target", "target.model")]
        if builtin is not None
        else [],
    )
    if grid.server and server_cmd is None and builtin is None:
        raise InputError("server axes in --grid need exactly one of --server-cmd or --target")
    out = out or default_run_dir("sweep")
    log = (lambda m: None) if quiet else (lambda m: stderr.print(m))
    with _ray_sweep(ray_address, resources, server_cmd) as elsewhere:
        sweep, signum = aio.run(
            lambda stop: run_sweep(
                scenario,
                list(overrides),
                grid,
                out=out,
                server_cmd=server_cmd,
                builtin=builtin,
                ready_url=ready_url,
                ready_timeout=ready_timeout,
                stop=stop,
                log=log,
                elsewhere=elsewhere,
                judge=judge,
            )
        )
    against = sweep.get("reference")
    if quiet:
        for row in sweep["rows"]:
            click.echo(f"{row['setting']}: {row['verdict_line']}")
        for line in against["findings"] if against else []:
            click.echo(line)
    else:
        click.echo(sweep_markdown(sweep, reference=False))
        if against:
            click.echo(reference_table(sweep))
    stderr.print(f"sweep: {out}/sweep.json, {out}/sweep.md")
    _exit_if_signalled(signum)
    sys.exit(
        exitcode.for_sweep(
            (row["verdict"] for row in sweep["rows"]),
            ExitCode(against["code"]) if against else None,
        )
    )


@contextlib.contextmanager
def _ray_sweep(address: str | None, resources: str | None, server_cmd: str | None) -> Iterator[Any]:
    """With --ray: connected to the cluster for the sweep, the runner that sends each server setting there;
    without it, None (the sweep runs here)."""
    if address is None:
        if resources is not None:
            raise InputError("--resources: only with --ray")
        yield None
        return
    if server_cmd is None:
        # Settings sharing one target would load it at the same time: no level would keep its
        # "exactly c in
        # flight", and the matrix would not be the sequential sweep's.
        raise InputError(
            "--ray needs --server-cmd: each setting's task starts its own server on its node; "
            "settings sharing one target would load it at the same time"
        )
    from kevload.load.cluster import connect
    from kevload.servers.raysweep import parse_resources, ray_rows

    wanted = parse_resources(resources or "{}")
    with connect(address) as ray:
        yield functools.partial(ray_rows, ray, wanted)


@main.command("compare")
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option(
    "--url", "urls", multiple=True, metavar="NAME=URL", help="A server to compare, by base URL."
)
@click.option(
    "--target",
    "builtins",
    multiple=True,
    metavar="NAME=BUILTIN",
    help=f"A built-in target started for the comparison ({', '.join(NAMES)}).",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="[NAME=]MODEL",
    help="The model name to send: to every --url target, or NAME=MODEL to one.",
)
@click.option("--reference", help="The target the others are held against (default: the first).")
@click.option(
    "--reference-run",
    type=click.Path(file_okay=False, path_type=Path),
    help="A saved run of the reference (its server no longer runs): its records stand for it.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory: a run directory per target, compare.json (default results/compare-<time>).",
)
@click.option("--together", is_flag=True, help="Run every target at once (no shared hardware).")
@click.option(
    "--resume",
    type=click.Path(file_okay=False, path_type=Path),
    help="Finish a stopped comparison in this directory.",
)
@click.option(
    "--alpha",
    type=_Finite(min=1e-6, max=0.5),
    default=0.05,
    show_default=True,
    help="The gate's false alarm rate, shared out over candidates × levels.",
)
@click.option(
    "--min-agreement",
    metavar="SHARE",
    help="Ungraded items: pass while this share (95% or 0.95) agrees.",
)
@click.option(
    "--fail-on",
    type=click.Choice(["drift", "bad"]),
    default="drift",
    show_default=True,
    help="bad: any graded item good on the reference and bad on a candidate fails too.",
)
@click.option(
    "--max-latency-regression",
    type=_Finite(min=0),
    help="Fail when the p50 latency ratio's 95% interval lies wholly above 1 + R.",
)
@click.option(
    "--junit",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write JUnit XML here: a testcase per candidate × level.",
)
@click.option(
    "--metrics",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=lambda _c, _p, v: _metrics_path(v),
    help="Write the comparison as OpenMetrics text here.",
)
@click.option("--quiet", is_flag=True, help="Only the gate's findings and its exit line.")
@_trust_graders_option
def compare_command(
    scenario: Path | None,
    urls: tuple[str, ...],
    builtins: tuple[str, ...],
    models: tuple[str, ...],
    reference: str | None,
    reference_run: Path | None,
    out: Path | None,
    together: bool,
    resume: Path | None,
    alpha: float,
    min_agreement: str | None,
    fail_on: str,
    max_latency_regression: float | None,
    junit: Path | None,
    metrics: Path | None,
    quiet: bool,
    trust_graders: bool,
) -> None:
    """Compare two or more servers item by item under the same load (docs/compare.md). Exit 0 every
    candidate answers as the reference, 1 one is worse, 2 bad usage, 3 a target failed or the
    evidence is short."""
    from kevload.compare.gate import GateRules
    from kevload.errors import TargetError
    from kevload.servers import rollout

    if resume is not None and (scenario is not None or out is not None):
        raise InputError("--resume DIR takes the scenario and directory of that comparison")
    rules = GateRules(
        alpha=alpha,
        min_agreement=None if min_agreement is None else _share(min_agreement, "--min-agreement"),
        fail_on_bad=fail_on == "bad",
        max_latency_regression=max_latency_regression,
    )
    directory = resume or out or default_run_dir("compare")
    targets = (
        rollout.given_again(resume)
        if resume is not None and not urls and not builtins
        else rollout.given(urls, builtins, models)
    )
    outcome, signum = rollout.compare(
        scenario,
        targets,
        out=directory,
        reference=reference,
        together=together,
        resume=resume is not None,
        reference_run=reference_run,
        rules=rules,
        log=(lambda m: None) if quiet else (lambda m: stderr.print(m, style="dim")),
        trust_graders=trust_graders,
    )
    if outcome is None:  # stopped while a --target started: nothing was sent
        _exit_if_signalled(signum)
        raise TargetError("compare: a --target did not start; no target was asked")
    _show_comparison(outcome, "quiet" if quiet else "table", None, junit, metrics)
    stderr.print(f"compare: {outcome.out}/compare.json, .md, .html")
    _exit_if_signalled(signum)
    sys.exit(outcome.result.code)


def _show_comparison(
    outcome: Any, fmt: str, output: Path | None, junit: Path | None, metrics: Path | None
) -> None:

    from kevload.outputs import comparison as shown

    if fmt == "quiet":
        for line in outcome.result.lines:
            click.echo(visible(line))
        click.echo(f"gate: exit {int(outcome.result.code)}")
    else:
        renderers = {
            "table": shown.table,
            "markdown": shown.markdown,
            "html": shown.html_page,
            "json": _comparison_json,
        }
        _emit(renderers[fmt](outcome.comparison, outcome.result), output)
    if junit is not None:
        junit.write_text(shown.junit_xml(outcome.comparison, outcome.result), encoding="utf-8")
    if metrics is not None:
        metrics.write_text(shown.metrics_text(outcome.comparison), encoding="utf-8")


def _comparison_json(comparison: Comparison, _result: object) -> str:
    return _indented_json(comparison.to_json())


def _indented_json(value: Any) -> str:
    import orjson

    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
