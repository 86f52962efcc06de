"""`kevload demo`: the guide's first steps against the built-in real targets."""

from __future__ import annotations

import sys

import click
from rich.console import Console

from kevload.cli.common import exit_if_signalled
from kevload.errors import InputError
from kevload.inputs.scenariokeys import MAX_SAMPLES
from kevload.load import eventloop
from kevload.servers.targets import NAMES


@click.command()
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
    """The guide's first three steps against the built-in real targets, matrices side by side, and
    vLLM's max-batch-size sweep. Ends with a line per target: what it found, or which step failed
    and why. Exit 0, or 3 when a target failed a step."""
    from kevload.demo import run_demo

    names = [t.strip() for t in targets.split(",") if t.strip()]
    bad = [n for n in names if n not in NAMES]
    if bad:
        raise InputError(
            f"--targets: unknown target {bad[0]!r}; expected some of {', '.join(NAMES)}"
        )
    code, signum = eventloop.run(
        lambda stop: run_demo(
            names, samples=samples, console=Console(), stop=stop, timeout_floor=timeout
        )
    )
    exit_if_signalled(signum)
    sys.exit(code)
