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
from kevload.targets import NAMES, TargetSettings
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


@main.group()
def target() -> None:
    """Built-in real targets on 127.0.0.1: llama.cpp's llama-server and transformers serve."""


def _target_options(func):
    options = [
        click.option("--slots", type=click.IntRange(min=1), default=4, show_default=True,
                     help="Parallel slots (llama.cpp --parallel)."),
        click.option("--ctx-size", type=click.IntRange(min=64), help="Context size (llama.cpp; default 2048 × slots)."),
        click.option("--threads", type=click.IntRange(min=1), help="CPU threads (default: all cores)."),
        click.option("--batching/--no-batching", default=True, show_default=True,
                     help="Continuous batching on or off."),
        click.option("--cache-prompt/--no-cache-prompt", default=True, show_default=True,
                     help="Prompt (KV) cache reuse (llama.cpp)."),
        click.option("--dtype", default="bfloat16", show_default=True, help="Weights dtype (transformers)."),
        click.option("--seed", type=int, help="Server-wide default seed."),
        click.option("--gguf", type=click.Path(dir_okay=False, exists=True), help="Your own GGUF model file."),
        click.option("--port", type=click.IntRange(1, 65535), help="Port (default: a free one)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@target.command("start")
@click.argument("name", type=click.Choice(NAMES))
@_target_options
def target_start(name: str, **options) -> None:
    """Build/install NAME once, start it and print its base URL as the last line."""
    from kevload.targets import ServerError, save_state, start_target, status_target

    current = status_target(name)
    if current and current["running"]:
        raise UserError(f"{name} is already running at {current['url']} (pid {current['pid']}); "
                        f"`kevload target stop {name}` first")
    settings = TargetSettings.from_options(options)
    try:
        running = _guard(lambda: start_target(name, settings, log=lambda m: click.echo(m, err=True)))
    except ServerError as exc:
        click.echo(f"kevload: error: {exc}", err=True)
        sys.exit(EXIT_TARGET)
    save_state(running)
    click.echo(f"{name} pid {running.pid}, log {running.log_path}", err=True)
    click.echo(running.url)


@target.command("stop")
@click.argument("name", type=click.Choice(NAMES))
def target_stop(name: str) -> None:
    """Stop NAME's whole process group."""
    from kevload.targets import forget_state, status_target, stop_target

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
    """Pid, port, model and settings of NAME, if it was started here."""
    from kevload.targets import status_target

    current = status_target(name)
    if current is None or not current["running"]:
        click.echo(f"{name}: not running")
        sys.exit(EXIT_TARGET)
    settings = ", ".join(f"{k}={v}" for k, v in current["settings"].items() if v not in (None, [], ()))
    click.echo(f"{name}: running, pid {current['pid']}, port {current['port']}, url {current['url']}\n"
               f"model: {current['model']}\nsettings: {settings}\nlog: {current['log_path']}")


@main.command()
@click.option("--targets", default="llamacpp,transformers", show_default=True,
              help="Comma-separated built-in targets to run the demo against.")
@click.option("--samples", type=click.IntRange(min=2), default=8, show_default=True)
def demo(targets: str, samples: int) -> None:
    """The guide's first three steps against the built-in real targets, matrices side by side."""
    from kevload.demo import run_demo

    names = [t.strip() for t in targets.split(",") if t.strip()]
    bad = [n for n in names if n not in NAMES]
    if bad:
        raise UserError(f"--targets: unknown target {bad[0]!r}; expected some of {', '.join(NAMES)}")
    sys.exit(_guard(lambda: run_demo(names, samples=samples, console=Console())))
