"""`kevload report`: a run's summary recomputed from its records and rendered; sweeps and
comparisons too."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from kevload.cli.common import (
    emit,
    indented_json,
    metrics_path,
    show_comparison,
    trust_graders_option,
    write_metrics,
)
from kevload.errors import InputError
from kevload.load.finishing import finish_run
from kevload.outputs import exitcode
from kevload.outputs.escaping import markdown_cell
from kevload.outputs.terminal import FORMATS, render
from kevload.records.rundir import RunDir
from kevload.records.summary import RunSummary


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write to a file."
)
@click.option(
    "--metrics",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=lambda _c, _p, v: metrics_path(v),
    help="Also write the cells as Prometheus text here.",
)
@click.option(
    "--request",
    "request_id",
    metavar="ID",
    help="Print only the record of the request sent with this X-Request-Id, as JSON.",
)
@trust_graders_option
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
    1 drift (or a cell under an SLO or load.min_good_share), 2 bad input or a grader that failed,
    3 target failed or evidence short. A sweep's report exits 0; a comparison's, with its gate's
    code."""
    if (run_dir / "compare-run.json").is_file():
        from kevload.servers.rollout import finish

        if request_id is not None:
            raise InputError(
                f"--request: not for a comparison ({run_dir}); give one of its run directories"
            )
        outcome = finish(run_dir, None, trust_graders=trust_graders)
        show_comparison(outcome, fmt, output, None, metrics)
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
        emit(orjson.dumps(record, option=orjson.OPT_INDENT_2).decode(), output)
        return
    run.run_id()  # refuses a directory holding two runs
    meta = run.meta()
    summary = finish_run(run_dir, meta=meta, trust_graders=trust_graders)
    _render_run(run, summary, meta, fmt, output)
    if metrics is not None:
        write_metrics(metrics, summary, run_dir)
    sys.exit(exitcode.for_summary(summary))


def _render_run(
    run: RunDir, summary: RunSummary, meta: dict[str, Any], fmt: str, output: Path | None
) -> None:
    """The summary in ``fmt``, on stdout or into --output; the table and Markdown end with where it
    ran."""
    if fmt == "html":
        from kevload.outputs.html import run_report

        emit(run_report(summary, meta, run.records()), output)
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


def _echo_where(meta: dict[str, Any], fmt: str, echo: Callable[[str], Any]) -> None:
    """The table and the Markdown end with where the run ran (run.json's machine and server); JSON
    is the summary alone."""
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
        "json": indented_json,
        "table": sweep_markdown,
    }
    emit(renderers[fmt](sweep), output)
