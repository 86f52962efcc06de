"""What several commands share: the stderr console, the option types and decorators (--target,
--trust-graders), a command's work run with --target's server up, and how a result is written, shown
and exited with."""

from __future__ import annotations

import asyncio
import math
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console

from kevload.errors import InputError
from kevload.load import eventloop
from kevload.outputs.escaping import visible
from kevload.records.rundir import RunDir
from kevload.records.summary import RunSummary
from kevload.servers.targets import NAMES, TargetSettings

if TYPE_CHECKING:
    from kevload.compare.rollout import Comparison


stderr = Console(stderr=True)
# A click command, as its option decorators take and return it.
F = TypeVar("F", bound=Callable[..., Any])


def log_line(message: str) -> None:
    """A progress line on stderr, as written: an id or a prompt in it may hold control characters or
    rich markup."""
    stderr.print(visible(message), markup=False, highlight=False)


class Finite(click.FloatRange):
    """A FloatRange that refuses nan too, which passes every bound's comparison (and so would pass
    click's)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def on_target_options(func: F) -> F:
    """``--target NAME`` and ``--target-set KEY=VALUE``: a built-in target started for one
    command."""
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


def target_settings(builtin: str | None, target_sets: tuple[str, ...]) -> TargetSettings | None:
    if builtin is None:
        if target_sets:
            raise InputError("--target-set: only with --target NAME")
        return None
    return TargetSettings.from_pairs(
        target_sets,
        lambda spec: f"--target-set {spec!r}: expected KEY=VALUE, e.g. --target-set max_num_seqs=1",
    )


trust_graders_option = click.option(
    "--trust-graders",
    is_flag=True,
    help="Import the python: graders the run directory or case file names (from the directory "
    "the run found them "
    "in). Without it they are refused: that file is data, and may come from anywhere.",
)


def on_target(
    builtin: str | None,
    settings: TargetSettings | None,
    work: Callable[[str | None, str | None, asyncio.Event], Coroutine[Any, Any, Any]],
    quiet: bool = False,
) -> tuple[Any, int | None, Any]:
    """``work(url, model, stop)`` under ``eventloop.run``, with ``--target``'s server running for it
    when one is given (its URL and model; None and None otherwise). Returns the result (None when
    stopped while the target started), the signal as ``eventloop.run`` does, and the error to raise
    once the result is shown when the target stopped serving meanwhile (exit 3; None otherwise)."""
    if builtin is None:
        result, signum = eventloop.run(lambda stop: work(None, None, stop))
        return result, signum, None
    from kevload.servers.targets import on_target

    assert settings is not None  # target_settings makes them with --target
    log = (lambda m: None) if quiet else (lambda m: stderr.print(m, style="dim"))
    (result, exited), signum = eventloop.run(
        lambda stop: on_target(
            builtin, settings, lambda t: work(t.url, t.model, stop), log=log, stop=stop
        )
    )
    return result, signum, exited


def emit(text: str, output: Path | None) -> None:
    if output is None:
        click.echo(text)
    else:
        output.write_text(text, encoding="utf-8")
        stderr.print(f"wrote {output}")


def share(text: str, option: str) -> float:
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


def metrics_path(path: Path | None) -> Path | None:
    """Checked before anything runs: a nightly job should not learn of a typo in the path after
    hours of load."""
    if path is not None and not (path.parent.is_dir() and os.access(path.parent, os.W_OK)):
        raise InputError(f"--metrics {path}: expected a file in an existing, writable directory")
    return path


def write_metrics(path: Path, summary: RunSummary, run_dir: Path) -> None:
    from kevload.outputs.metrics import write_metrics

    try:
        write_metrics(path, summary, RunDir(run_dir).meta())
    except OSError as exc:
        raise InputError(f"--metrics {path}: cannot write ({exc.strerror or exc})") from None
    stderr.print(f"metrics: {path}")


def exit_if_signalled(signum: int | None) -> None:
    """A run stopped by SIGINT/SIGTERM exits 130/143 once what it collected is written."""
    if signum is not None:
        sys.exit(eventloop.EXIT_FOR_SIGNAL[signum])


def show_comparison(
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
        emit(renderers[fmt](outcome.comparison, outcome.result), output)
    if junit is not None:
        junit.write_text(shown.junit_xml(outcome.comparison, outcome.result), encoding="utf-8")
    if metrics is not None:
        metrics.write_text(shown.metrics_text(outcome.comparison), encoding="utf-8")


def _comparison_json(comparison: Comparison, _result: object) -> str:
    return indented_json(comparison.to_json())


def indented_json(value: Any) -> str:
    import orjson

    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
