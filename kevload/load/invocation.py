"""What a ``kevload run``'s options mean together: the scenario they pick (a file, the quickstart,
or an interrupted run's own), the rules they obey with one another, and how many samples the run
will take."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kevload.compare.stats import samples_for_bound
from kevload.errors import InputError
from kevload.inputs.scenario import Scenario, load_scenario, quickstart_scenario
from kevload.load.resuming import resumed_scenario
from kevload.load.runs import refuse_existing


@dataclass(frozen=True)
class RunGiven:
    """Where ``kevload run`` takes its scenario from: SCENARIO, --resume, or the quickstart's
    options (--url, --model, --prompt, or --target for the first two); and --out, --overwrite, which
    go with them."""

    scenario: Path | None = None
    resume: Path | None = None
    url: str | None = None
    model: str | None = None
    prompt: str | None = None
    builtin: str | None = None
    out: Path | None = None
    overwrite: bool = False

    def quick_option(self) -> str | None:
        """The first of the quickstart options given (--url, --model, --prompt), to name it; None
        when none is."""
        given = (("--url", self.url), ("--model", self.model), ("--prompt", self.prompt))
        return next((name for name, value in given if value is not None), None)


def url_or_target(url: str | None, model: str | None, builtin: str | None) -> None:
    """A server is given one way: --url and --model, or --target (which has its own)."""
    if builtin is None and (url is None) != (model is None):
        raise InputError(
            "--url needs --model NAME (the model name to send)"
            if model is None
            else "--model needs --url URL (the server's base URL)"
        )
    if builtin is None and url is None:
        raise InputError("give --url and --model, or --target NAME to start a built-in target")
    if builtin is not None and (url is not None or model is not None):
        raise InputError("--target starts its own server: give no --url or --model with it")


def check_ray_target(builtin: str | None, ray_address: str | None) -> None:
    """--target's server listens on this host only: Ray workers elsewhere could not reach it."""
    if builtin is not None and ray_address not in (None, "local"):
        raise InputError(
            "--target starts its server at 127.0.0.1 of this host, which Ray workers on other "
            "hosts "
            "cannot reach: start it with `kevload target start` and give its URL instead"
        )


def pick_scenario(given: RunGiven, overrides: list[str], *, trust_graders: bool) -> Scenario:
    """The scenario the options pick, its API key's variable checked: the interrupted run's
    (--resume), the file's (SCENARIO), or the quickstart's (--url and --model, or --target: its URL
    and model are set once its server is up)."""
    quick = given.quick_option()
    if given.resume is not None:
        if (
            given.scenario is not None
            or given.out is not None
            or given.overwrite
            or quick is not None
        ):
            raise InputError(
                "--resume RUN_DIR takes the scenario and directory of that run; "
                "give no SCENARIO, --out, --overwrite, --url, --model or --prompt"
            )
        sc = resumed_scenario(given.resume, overrides, trust_graders=trust_graders)
    elif given.scenario is not None:
        if quick is not None:
            raise InputError(
                f"{quick}: only without SCENARIO (it sets the quickstart scenario's; a scenario "
                "file's target is changed with --set, e.g. --set target.model=NAME)"
            )
        sc = load_scenario(given.scenario, overrides)
    elif quick is None and given.builtin is None:
        raise InputError("missing SCENARIO (or --url URL --model NAME, or --resume RUN_DIR)")
    else:
        url_or_target(given.url, given.model, given.builtin)
        sc = quickstart_scenario(given.prompt, overrides)
        if given.builtin is None:  # --target's URL and model are set once its server is up
            sc = sc.with_settings({"target.base_url": given.url}, source="--url")
            sc = sc.with_settings({"target.model": given.model}, source="--model")
    sc.api_key()
    return sc


def refuse_taken(given: RunGiven) -> None:
    """--out that holds a run already is refused unless --overwrite: a run's records are never
    mixed."""
    if given.resume is None and given.out is not None:
        refuse_existing(
            given.out,
            overwrite=given.overwrite,
            hint=f"--resume {given.out} finishes it, --overwrite starts it afresh",
        )


def check_fail_on(fail_on: str, sc: Scenario) -> None:
    """--fail-on bad judges graded answers: a scenario without a graded probe has none to judge."""
    if fail_on == "bad" and not any(p.grade for p in sc.probes):
        raise InputError(
            "--fail-on bad: expected probes with expected or grade (none of the scenario's "
            f"{len(sc.probes)} probes is graded)"
        )


def samples_expected(sc: Scenario) -> int:
    """The probe samples the run takes when every cell is clean: sampling until a bound takes as
    many as the answers call for, so a progress bar counts up to the clean case."""
    per_cell = (
        max(sc.load.samples, samples_for_bound(sc.load.until_bound))
        if sc.load.until_bound
        else sc.load.samples
    )
    levels = len(sc.load.rate or sc.load.concurrency) + (
        len(sc.load.trace_speedup) if sc.load.trace else 0
    )
    return len(sc.probes) * levels * per_cell
