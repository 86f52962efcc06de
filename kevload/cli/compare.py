"""`kevload compare`: two or more servers compared item by item under the same load."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from kevload.compare.gate import GateRules

from kevload.cli.common import (
    Finite,
    exit_if_signalled,
    metrics_path,
    share,
    show_comparison,
    stderr,
    trust_graders_option,
)
from kevload.errors import InputError
from kevload.records.store import default_run_dir
from kevload.servers.targets import NAMES


@click.command("compare")
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option(
    "--url", "urls", multiple=True, metavar="NAME=URL", help="A server to compare, by base URL."
)
@click.option(
    "--target",
    "builtins",
    multiple=True,
    metavar="NAME=BUILTIN[:KEY=VALUE,…]",
    help=f"A built-in target started for the comparison ({', '.join(NAMES)}), with settings as "
    "run's --target-set names them: one=llamacpp:slots=1,cache_prompt=false.",
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
    type=Finite(min=1e-6, max=0.5),
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
    type=Finite(min=0),
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
    callback=lambda _c, _p, v: metrics_path(v),
    help="Write the comparison as OpenMetrics text here.",
)
@click.option("--quiet", is_flag=True, help="Only the gate's findings and its exit line.")
@trust_graders_option
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
    from kevload.errors import TargetError
    from kevload.servers import rollout

    if resume is not None and (scenario is not None or out is not None):
        raise InputError("--resume DIR takes the scenario and directory of that comparison")
    rules = _gate_rules(alpha, min_agreement, fail_on, max_latency_regression)
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
        exit_if_signalled(signum)
        raise TargetError("compare: a --target did not start; no target was asked")
    show_comparison(outcome, "quiet" if quiet else "table", None, junit, metrics)
    stderr.print(f"compare: {outcome.out}/compare.json, .md, .html")
    exit_if_signalled(signum)
    sys.exit(outcome.result.code)


def _gate_rules(
    alpha: float, min_agreement: str | None, fail_on: str, max_latency_regression: float | None
) -> GateRules:
    """The gate's rules, from --alpha, --min-agreement, --fail-on and --max-latency-regression."""
    from kevload.compare.gate import GateRules

    rules = GateRules(
        alpha=alpha,
        min_agreement=None if min_agreement is None else share(min_agreement, "--min-agreement"),
        fail_on_bad=fail_on == "bad",
        max_latency_regression=max_latency_regression,
    )
    return rules
