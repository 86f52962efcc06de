"""`kevload cases build|rerun`: the guide's regression suite of stable and unstable inputs."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from kevload.cli.common import (
    exit_if_signalled,
    log_line,
    on_target,
    on_target_options,
    target_settings,
    trust_graders_option,
)
from kevload.errors import InputError
from kevload.inputs.scenariokeys import APIS, MAX_SAMPLES, Api
from kevload.inputs.urls import check_base_url
from kevload.load.invocation import url_or_target
from kevload.outputs import exitcode
from kevload.outputs.escaping import visible
from kevload.records.store import json_bytes


@click.group()
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
    """Append one case per probe and setting from RUN_DIRS; existing cases are never dropped or
    rewritten."""
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
    help="Parent directory of the rerun runs (default results): each rerun makes "
    "OUT/cases-rerun-<id>/.",
)
@trust_graders_option
@on_target_options
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

    from kevload.guide.rerun import accept_changes, transitions

    url_or_target(url, model, builtin)
    if url is not None:
        check_base_url(url, "--url")
    settings = target_settings(builtin, target_sets)
    items = _cases_of(cases_file, target_name, trust_graders)
    rerun = _Rerun(items, url, model, times, api, out, cases_file)
    results, signum, exited = on_target(builtin, settings, rerun.run)
    if results is None:
        exit_if_signalled(signum)
    with output.open("wb") as handle:
        for r in results:
            handle.write(json_bytes(r) + b"\n")
    moves = transitions(results)
    _print_results(results, moves)
    if accept and moves["changed"]:
        updated = accept_changes(cases_file, results)
        click.echo(
            f"{cases_file}: accepted the new answers of {len(updated)} changed case(s); "
            "the old outputs are kept in their history"
        )
    exit_if_signalled(signum)
    if exited is not None:
        raise exited
    sys.exit(
        exitcode.for_rerun(
            moves,
            mismatched=[r["id"] for r in results if r.get("matches_expected") is False],
            accepted=accept,
            grader_failed=[r["id"] for r in results if r.get("grade_errors")],
        )
    )


def _cases_of(
    cases_file: Path, target_name: str | None, trust_graders: bool
) -> list[dict[str, Any]]:
    """The cases to rerun: all of the file's, or --target-name's (none of it is bad usage)."""
    from kevload.guide.cases import read_cases

    items = read_cases(cases_file, trust_graders=trust_graders)
    if target_name is not None:
        items = [c for c in items if (c.get("target") or {}).get("name") == target_name]
        if not items:
            raise InputError(f"{cases_file}: no case of target {target_name!r}")
    return items


@dataclass(frozen=True)
class _Rerun:
    """The rerun of the cases against --url and --model, or --target's started server (its own)."""

    items: list[dict[str, Any]]
    url: str | None
    model: str | None
    times: int
    api: Api
    out: Path | None
    cases_file: Path

    def run(self, started_url: str | None, started_model: str | None, stop: asyncio.Event) -> Any:
        from kevload.guide.rerun import rerun_cases

        to_url, to_model = started_url or self.url, started_model or self.model
        assert to_url is not None and to_model is not None  # one or the other: url_or_target
        return rerun_cases(
            self.items,
            url=to_url,
            model=to_model,
            times=self.times,
            api=self.api,
            out=self.out,
            stop=stop,
            log=log_line,
            base=self.cases_file.parent,
        )


_RECORDED = {
    True: "matches recorded",
    False: "NOT among recorded outputs",
    None: "nothing recorded",
}


def _print_results(results: list[dict[str, Any]], moves: dict[str, list[str]]) -> None:
    """A line per case (its load, distinct answers, verdict before and after), the moves between
    verdicts, and each case's expected output met or not, with its grader's failures."""
    from kevload.guide.rerun import describe_load

    for r in results:
        click.echo(
            visible(
                f"{r['id']}: {describe_load(r['rerun'])} → {r['rerun_uniq']} distinct of "
                f"{r['rerun_ok']}, "
                f"{r['verdict']}→{r['verdict_after']}, {_RECORDED[r['matches_recorded']]}"
            )
        )
    for key, ids in moves.items():
        click.echo(
            visible(
                f"{key}: {len(ids)}"
                + (f" ({', '.join(ids)})" if ids and key != "unchanged" else "")
            )
        )
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
            # It names the case: the rerun's probe is called by its id.
            click.echo(visible(f"grader failed: {error}"))
