"""`kevload sweep`: a scenario run for every server setting of a grid, one matrix."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kevload.cli.common import Finite, exit_if_signalled, share, stderr
from kevload.cli.shorthands import refuse_set_twice, set_keys
from kevload.exits import ExitCode
from kevload.inputs.scenariokeys import MAX_SECONDS
from kevload.load import eventloop
from kevload.outputs import exitcode
from kevload.records.store import default_run_dir
from kevload.servers.sweepoptions import check_gate_options, check_servers, ray_sweep
from kevload.servers.targets import NAMES

if TYPE_CHECKING:
    from kevload.servers.sweepgrid import Grid


@click.command("sweep")
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
    help="An axis: a server placeholder/setting (slots=1,2,4) or a scenario key "
    "(load.mode=single,mixed).",
)
@click.option("--ready-url", help="Readiness URL (default http://127.0.0.1:{port}/health).")
@click.option(
    "--ready-timeout",
    type=Finite(min=1, max=MAX_SECONDS),
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
    type=Finite(min=1e-6, max=0.5),
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
    scenario: Path,
    server_cmd: str | None,
    builtin: str | None,
    grids: tuple[str, ...],
    ready_url: str | None,
    ready_timeout: float | None,
    overrides: tuple[str, ...],
    out: Path | None,
    quiet: bool,
    ray_address: str | None,
    resources: str | None,
    reference: str | None,
    alpha: float,
    min_agreement: str | None,
    fail_on: str,
) -> None:
    """Run SCENARIO for every setting in the grid and print one matrix: settings × levels."""
    from kevload.servers.sweep import run_sweep
    from kevload.servers.sweepgrid import Grid

    grid = Grid.parse(list(grids))
    judge = _reference_judge(grid, reference, alpha, min_agreement, fail_on)
    check_servers(grid, server_cmd, builtin)
    # Each setting's started server is where its runs go: a URL or model set otherwise would be
    # dropped or win.
    refuse_set_twice(
        [*set_keys(overrides), *((f"--grid {name}", name) for name in grid.scenario)],
        {"--server-cmd": server_cmd} if server_cmd is not None else {"--target": builtin},
    )
    out = out or default_run_dir("sweep")
    log = (lambda m: None) if quiet else (lambda m: stderr.print(m))
    with ray_sweep(ray_address, resources, server_cmd) as elsewhere:
        sweep, signum = eventloop.run(
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
    _print_sweep(sweep, quiet)
    stderr.print(f"sweep: {out}/sweep.json, {out}/sweep.md")
    exit_if_signalled(signum)
    sys.exit(_sweep_code(sweep))


def _sweep_code(sweep: dict[str, Any]) -> ExitCode:
    """The sweep's code, from its rows' verdicts and --reference's gate."""
    against = sweep.get("reference")
    return exitcode.for_sweep(
        (row["verdict"] for row in sweep["rows"]),
        ExitCode(against["code"]) if against else None,
    )


def _reference_judge(
    grid: Grid, reference: str | None, alpha: float, min_agreement: str | None, fail_on: str
) -> Any:
    """With --reference: what holds each setting against its reference setting, under --reference's
    gate; None without it."""
    from kevload.compare.gate import GateRules
    from kevload.servers import sweepref

    if reference is None:
        check_gate_options(alpha=alpha, min_agreement=min_agreement, fail_on=fail_on)
        return None
    rules = GateRules(
        alpha=alpha,
        min_agreement=None if min_agreement is None else share(min_agreement, "--min-agreement"),
        fail_on_bad=fail_on == "bad",
    )
    return functools.partial(
        sweepref.judge, reference=sweepref.Reference.parse(reference, grid), rules=rules
    )


def _print_sweep(sweep: dict[str, Any], quiet: bool) -> None:
    """The matrix (and the table against the reference setting); quiet, a verdict line per setting
    and the gate's findings."""
    from kevload.outputs.sweepview import reference_table
    from kevload.servers.sweepfile import sweep_markdown

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
