"""`kevload diagnose`: the guide's steps against a server, and which layer the problem is in."""

from __future__ import annotations

import asyncio
import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from kevload.guide.diagnose import DiagnoseOptions

from kevload.cli.common import (
    Finite,
    exit_if_signalled,
    log_line,
    on_target,
    on_target_options,
    share,
    target_settings,
)
from kevload.guide.decision import MIN_OK
from kevload.inputs.probe import MAX_TOKENS
from kevload.inputs.scenariokeys import APIS, MAX_CONCURRENCY, MAX_SAMPLES, MAX_SECONDS
from kevload.inputs.urls import check_base_url
from kevload.load.invocation import url_or_target
from kevload.outputs import exitcode


@click.command("diagnose")
@click.option("--url", help="Base URL, e.g. http://127.0.0.1:8000/v1 (or --target).")
@click.option("--model", help="The model name to send (or --target).")
@click.option("--prompt", help="The input that misbehaves.")
@click.option(
    "--messages",
    "messages_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSON file with a chat messages list, instead of --prompt.",
)
@click.option(
    "--params",
    "params_json",
    default="{}",
    help="Current request params as JSON (what production sends).",
)
@click.option(
    "--max-tokens", type=click.IntRange(min=1, max=MAX_TOKENS), default=48, show_default=True
)
@click.option(
    "--samples",
    type=click.IntRange(min=MIN_OK, max=MAX_SAMPLES),
    default=6,
    show_default=True,
    help=f"Samples per step (at least {MIN_OK}: fewer ok ones leave a step nothing to conclude).",
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=2, max=MAX_CONCURRENCY),
    default=4,
    show_default=True,
)
@click.option("--api", type=click.Choice(APIS), default="chat", show_default=True)
@click.option("--timeout", type=Finite(min=0.1, max=MAX_SECONDS), default=60.0, show_default=True)
@click.option("--api-key-env", help="Environment variable holding the API key.")
@click.option(
    "--online",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Live inputs (JSONL).",
)
@click.option(
    "--train",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Training set (JSONL).",
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the diagnosis here.",
)
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), help="Directory for the step runs."
)
@click.option("--all", "run_all", is_flag=True, help="Run every step even after a cause is found.")
@click.option(
    "--until-bound",
    metavar="SHARE",
    help="In the fixed and concurrency steps, sample each cell until "
    "drift is seen or the 95% bound on its drift rate is this low (5% or 0.05), at most "
    "--max-samples.",
)
@click.option(
    "--max-samples",
    type=click.IntRange(min=2, max=MAX_SAMPLES),
    default=1000,
    show_default=True,
    help="With --until-bound: the most probe samples per cell.",
)
@click.option(
    "--expected",
    "expected_text",
    metavar="ANSWER",
    help="What a good answer is: each step says how many "
    "answers were good and bad beside its distinct count. Read as JSON where it is a number, list "
    "or "
    'object (42, ["a","b"]), else as text.',
)
@click.option(
    "--grade",
    help="How answers are graded (exact, contains, regex, one_of, number, choice, json, "
    "json_schema, python:module:function); default: picked from --expected's kind.",
)
@click.option(
    "--grade-tolerance", type=float, help="With --grade number: how far the answer's number may be."
)
@on_target_options
def diagnose_command(**given: Any) -> None:
    """Walk the guide's steps against a server and say which layer the problem is in."""
    import orjson

    from kevload.guide.diagnose import check_options
    from kevload.guide.diagnoseinput import check_one_input, check_sets
    from kevload.guide.diagnosistext import diagnosis_text

    url, model, builtin = given["url"], given["model"], given["builtin"]
    check_one_input(given["prompt"], given["messages_file"])
    url_or_target(url, model, builtin)
    if url is not None:
        check_base_url(url, "--url")
    settings = target_settings(builtin, given["target_sets"])
    check_sets(given["online"], given["train"])
    options = _options(given)
    check_options(options)
    result, signum, exited = on_target(builtin, settings, functools.partial(_diagnose, options))
    if result is None:
        exit_if_signalled(signum)
    click.echo(diagnosis_text(result.to_json()))
    if given["json_out"] is not None:
        given["json_out"].write_bytes(orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2))
    exit_if_signalled(signum)
    if exited is not None:
        raise exited
    sys.exit(exitcode.for_diagnosis(target_failed=result.target_failed, verdict=result.verdict))


def _options(given: dict[str, Any]) -> DiagnoseOptions:
    """The diagnosis' options from the command's: the probe, the params, the steps' settings. With
    --target the URL is the started server's; a placeholder meanwhile lets the options be checked
    first."""
    from kevload.guide.diagnose import DiagnoseOptions
    from kevload.guide.diagnoseinput import (
        diagnosed_probe,
        expected_grading,
        given_messages,
        request_params,
    )

    params = request_params(given["params_json"])
    messages = given_messages(given["messages_file"])
    graded = expected_grading(given["expected_text"], given["grade"], given["grade_tolerance"])
    until_bound = given["until_bound"]
    return DiagnoseOptions(
        url=given["url"] or "http://127.0.0.1:1/v1",
        model=given["model"] or "",
        probe=diagnosed_probe(given["prompt"], messages, given["max_tokens"], graded),
        params=params,
        api=given["api"],
        samples=given["samples"],
        max_concurrency=given["max_concurrency"],
        timeout=given["timeout"],
        api_key_env=given["api_key_env"],
        run_all=given["run_all"],
        online=given["online"],
        train=given["train"],
        out=given["out"],
        until_bound=None if until_bound is None else share(until_bound, "--until-bound"),
        max_samples=given["max_samples"],
    )


def _diagnose(
    options: DiagnoseOptions, url: str | None, model: str | None, stop: asyncio.Event
) -> Any:
    """The diagnosis, against --target's started server where one is (its URL and model)."""
    import dataclasses

    from kevload.guide.diagnose import diagnose

    given = (
        options
        if url is None
        else dataclasses.replace(options, url=url, model=model or options.model)
    )
    return diagnose(given, log=log_line, stop=stop)
