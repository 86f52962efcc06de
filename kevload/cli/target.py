"""`kevload target start|stop|status`: the built-in real targets on 127.0.0.1."""

from __future__ import annotations

import shlex
import sys
from typing import Any

import click

from kevload.cli.common import F
from kevload.errors import InputError
from kevload.exits import ExitCode
from kevload.servers.targets import NAMES, TargetSettings


@click.group()
def target() -> None:
    """Built-in real targets on 127.0.0.1: llama.cpp's llama-server, transformers serve and vLLM
    (CPU)."""


# `target start`'s options: each a setting of the built-in targets (TargetSettings), as --target-set
# names them.
_TARGET_OPTIONS = [
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
    click.option("--threads", type=click.IntRange(min=1), help="CPU threads (default: all cores)."),
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
    click.option("--seed", type=int, help="Server-wide default seed (vLLM: its engine's seed)."),
    click.option(
        "--gguf", type=click.Path(dir_okay=False, exists=True), help="Your own GGUF model file."
    ),
    click.option("--port", type=click.IntRange(1, 65535), help="Port (default: a free one)."),
]


def _target_options(func: F) -> F:
    """`target start`'s options, in the order --help lists them."""
    for option in reversed(_TARGET_OPTIONS):
        func = option(func)
    return func


@target.command("start")
@click.argument("name", type=click.Choice(NAMES))
@_target_options
def target_start(name: str, **options: Any) -> None:
    """Build/install NAME once, start it and print the model name to send and its base URL (the last
    line)."""
    from kevload.servers.targets import save_state, served_facts, start_target, status_target

    current = status_target(name)
    if current and current["running"]:
        raise InputError(
            f"{name} is already running at {current['url']} (pid {current['pid']}); "
            f"`kevload target stop {name}` first"
        )
    settings = TargetSettings.from_options(options)
    running = start_target(name, settings, log=lambda m: click.echo(m, err=True))
    save_state(running, served_facts(running, settings))
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
