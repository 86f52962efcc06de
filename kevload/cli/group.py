"""The ``kevload`` click group: the one place kevload's own errors become a message and an exit
code."""

from __future__ import annotations

from typing import Any

import click

from kevload import __version__
from kevload.errors import KevloadError
from kevload.load import eventloop


class _Main(click.Group):
    """The one place kevload's own errors become a message and an exit code (errors.py): every
    command, option callback and nested group runs inside this invoke. A Ctrl-C that reaches it (a
    second one, or one outside a run's loop) exits 130, a second SIGTERM 143: never click's
    "Aborted!" and 1, the drift code."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if name in _SENDING:
            from kevload.records.machine import SERVED
            from kevload.servers.targets import started_targets

            # Targets `kevload target start` left running: a run sent to one by --url names it
            # (beside any this process serves already). Only commands that send pay for the look.
            ctx.meta[_SERVED] = SERVED.set({**started_targets(), **SERVED.get()})
        return name, command, rest

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KevloadError as exc:
            click.echo(f"kevload: error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            click.echo("kevload: stopped at once; what was written so far is kept", err=True)
            ctx.exit(eventloop.exit_code(exc))
        finally:
            if (served := ctx.meta.pop(_SERVED, None)) is not None:
                from kevload.records.machine import SERVED

                SERVED.reset(served)


# The commands that send requests, and the key under which the context holds what they were told
# serves where.
_SENDING = frozenset({"run", "diagnose", "cases", "compare", "sweep"})
_SERVED = "kevload.served"


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kevload")
def main() -> None:
    """Load-test an OpenAI-compatible LLM server and find out whether the same input gives the same
    output."""
