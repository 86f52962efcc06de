"""Command line: parse, call, print, choose the exit code. No logic lives here."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kevload import __version__, aio
from kevload.engine import finish_run, run_scenario
from kevload.report import FORMATS, render, verdict_line
from kevload.scenario import ScenarioError, load_scenario
from kevload.store import RunDirError, open_run_dir, read_json
from kevload.targets.cache import ProvisionError

EXIT_OK, EXIT_DRIFT, EXIT_USAGE, EXIT_TARGET = 0, 1, 2, 3
_EXIT_FOR_VERDICT = {"deterministic": EXIT_OK, "nondeterministic": EXIT_DRIFT, "target_failed": EXIT_TARGET}

stderr = Console(stderr=True)


class UserError(click.ClickException):
    """A mistake in what the user gave us: one line on stderr, exit 2, no traceback."""

    exit_code = EXIT_USAGE

    def show(self, file=None) -> None:
        click.echo(f"kevload: error: {self.message}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kevload")
def main() -> None:
    """Load-test an OpenAI-compatible LLM server and find out whether the same input gives the same output."""


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a scenario key; VALUE is TOML (e.g. --set 'load.concurrency=[1,4]').")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Run directory (default results/<run-id>).")
@click.option("--quiet", is_flag=True, help="No progress bar and no table; only the verdict line.")
def run(scenario: Path, overrides: tuple[str, ...], out: Path | None, quiet: bool) -> None:
    """Run SCENARIO and print the uniqueness matrix. Exit 0 stable, 1 drift, 2 bad input, 3 target failed."""
    sc = _guard(lambda: load_scenario(scenario, list(overrides)))
    _guard(sc.api_key)
    total = len(sc.probes) * len(sc.load.concurrency) * sc.load.samples
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=stderr, disable=quiet, transient=True)
    with progress:
        task = progress.add_task(f"{sc.name}", total=total)

        def on_record(record) -> None:
            if record.role == "probe":
                progress.update(task, advance=1, description=f"{record.probe} c={record.concurrency}")

        result, signum = _guard(lambda: aio.run(lambda stop: run_scenario(sc, out, on_record=on_record, stop=stop)))
    _print_summary(result.summary, quiet)
    stderr.print(f"records: {result.run_dir / 'records.jsonl'} ({result.records} requests, {result.state})")
    if signum is not None:
        sys.exit(aio.EXIT_FOR_SIGNAL[signum])
    sys.exit(_EXIT_FOR_VERDICT[result.summary["verdict"]])


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write to a file.")
def report(run_dir: Path, fmt: str, output: Path | None) -> None:
    """Recompute a run's summary from its records (no server needed) and render it."""
    _guard(lambda: open_run_dir(run_dir))
    summary = _guard(lambda: finish_run(run_dir, meta=read_json(run_dir / "run.json")))
    if output is None:
        text = render(summary, fmt, Console())
        if text is not None:
            click.echo(text)
    else:
        with output.open("w", encoding="utf-8") as handle:
            text = render(summary, fmt, Console(file=handle, width=120))
            if text is not None:
                handle.write(text + "\n")
    sys.exit(_EXIT_FOR_VERDICT[summary["verdict"]])


def _print_summary(summary: dict, quiet: bool) -> None:
    if quiet:
        click.echo(verdict_line(summary))
    else:
        render(summary, "table", Console())


def _guard(action):
    """Turn the project's own user-facing errors into one clean line and exit 2."""
    try:
        return action()
    except (ScenarioError, RunDirError, ProvisionError) as exc:
        raise UserError(str(exc)) from None
