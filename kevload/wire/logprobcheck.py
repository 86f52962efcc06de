"""Whether a run's requests ask for logprobs (``load.logprobs``): the one check request, and what
``run.json`` records of it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from kevload.errors import TargetError
from kevload.inputs.probe import Probe
from kevload.inputs.scenario import Scenario
from kevload.wire.answer import Outcome
from kevload.wire.client import Client, build_body
from kevload.wire.models import REFUSAL_STATUSES, refusal_message, served_models

T = TypeVar("T")


# The ``user`` field of the one request that checks whether a server returns logprobs, so logs (and
# the test server) can tell it from the run's own requests.
LOGPROBS_CHECK_USER = "kevload-logprobs-check"
# An ok answer without logprobs may still come from a server that returns them: llama.cpp sends a
# token that ends inside a UTF-8 character as text ("\ufffd") with no logprob entry, and a sampler
# may pick the end token first. So the check is sent again, this many times in all, before it says
# the server returns none.
LOGPROBS_CHECK_TRIES = 3


def logprob_fields(api: str) -> dict[str, Any]:
    """The request fields that ask for the chosen token's logprob at every position.

    Chat also gets ``top_logprobs: 1``: without it llama.cpp's server sends 20 alternatives per
    token (and none with 0), bytes that kevload would parse and drop.
    """
    return {"logprobs": True, "top_logprobs": 1} if api == "chat" else {"logprobs": 1}


async def ask_for_logprobs(
    scenario: Scenario,
    api_key: str | None,
    warn: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> tuple[Scenario, dict[str, Any]]:
    """Decide once per run whether its requests ask for logprobs (``load.logprobs``).

    Returns the scenario to run (its params with the logprob fields when they are asked for) and
    what ``run.json`` records under ``logprobs``: ``asked`` (the setting), ``available`` (what the
    one check request found; None when nothing was checked) and ``why``. ``auto`` sends that check —
    a two-token request on a prompt of its own, so no cache is warmed for a probe — and when the
    answer carries no logprobs (transformers serve ignores the field) or the check fails, says so
    once through ``warn`` (stderr by default) and leaves the run to compare text only. A
    ``[params]`` that sets ``logprobs`` or ``top_logprobs`` itself is sent as written, unchecked. A
    ``stop`` cuts the check at once (its answer would decide nothing the stopped run still sends):
    nothing checked, and ``why`` says so. A check refused with http 400/404 by a server whose
    ``/models`` lists other models than the scenario's raises ``TargetError`` naming both, before
    the run sends anything."""
    asked = scenario.load.logprobs
    info: dict[str, Any] = {"asked": asked, "available": None, "why": None}
    if "logprobs" in scenario.params or "top_logprobs" in scenario.params:
        info["why"] = "[params] sets logprobs itself; sent as written"
        return scenario, info
    if asked is False:
        info["why"] = "load.logprobs = false"
        return scenario, info
    fields = logprob_fields(scenario.target.api)
    with_logprobs = replace(scenario, params={**scenario.params, **fields})
    if asked is True:
        info["why"] = "load.logprobs = true: asked for without a check"
        return with_logprobs, info
    outcome, answers = await _check(with_logprobs, api_key, stop)
    if outcome is None:
        info["why"] = "the run was stopped before the check answered"
        return scenario, info
    if outcome.status == "ok" and _has_logprobs(outcome):
        info["available"] = True
        return with_logprobs, info
    if outcome.status == "ok" and not any(a.output or a.completion_tokens for a in answers):
        # No answer held a token, so none said whether logprobs come: ask for them; the cells
        # say where samples came without (logprobs_missing).
        tries = LOGPROBS_CHECK_TRIES
        info["why"] = f"the check's {tries} answers held no token: asked for without proof"
        return with_logprobs, info
    if outcome.status in REFUSAL_STATUSES:
        await _refuse_unserved(scenario, api_key, outcome)
    why = (
        "the server returned no per-token logprobs"
        if outcome.status == "ok"
        else f"the check request failed ({outcome.status}: {outcome.error})"
    )
    info.update(available=False, why=why)
    _say(f"kevload: logprobs: {why}; comparing output text only", scenario.target.base_url, warn)
    return scenario, info


async def _check(
    with_logprobs: Scenario, api_key: str | None, stop: asyncio.Event | None
) -> tuple[Outcome | None, list[Outcome]]:
    """The check request sent (``LOGPROBS_CHECK_TRIES`` times at most) until an answer has logprobs
    or one is no answer: the last outcome (None: stopped first), and the ok answers without logprobs
    before it."""
    check = Probe(id="logprobs-check", prompt="Say hi.", max_tokens=2)
    body = build_body(
        with_logprobs.target,
        check,
        with_logprobs.params,
        stream=with_logprobs.load.stream,
        nonce=LOGPROBS_CHECK_USER,
    )
    answers: list[Outcome] = []
    async with Client(with_logprobs.target, api_key) as client:
        for _ in range(LOGPROBS_CHECK_TRIES):
            outcome = await unless_stopped(client.send(body), stop)
            if outcome is None or outcome.status != "ok" or _has_logprobs(outcome):
                break
            answers.append(outcome)
    return outcome, answers


async def _refuse_unserved(scenario: Scenario, api_key: str | None, refused: Outcome) -> None:
    """Every request of the run would be refused alike: ``TargetError`` says which model, and which
    the server serves, where its ``/models`` lists others."""
    served = await served_models(scenario.target, api_key)
    if served and scenario.target.model not in served:
        raise TargetError(
            refusal_message(scenario.target.model, refused.status, refused.error, served)
        )


def _say(message: str, base_url: str, warn: Callable[[str], None] | None) -> None:
    """``message`` through ``warn``; without one, on stderr once per server and message."""
    if warn is not None:
        warn(message)
    elif (base_url, message) not in _SAID:
        # A command that runs several steps against one server (demo, diagnose, sweep, cases rerun)
        # checks before each: the same words six times said nothing new. run.json still has them.
        _SAID.add((base_url, message))
        _to_stderr(message)


def _has_logprobs(outcome: Outcome) -> bool:
    return any(x is not None for x in outcome.logprobs or ())


async def unless_stopped(awaitable: Awaitable[T], stop: asyncio.Event | None) -> T | None:
    """``awaitable``'s result, or None when ``stop`` is set first: then it is cancelled (a request's
    connection closed) before this returns."""
    task = asyncio.ensure_future(awaitable)
    if stop is None:
        return await task
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return None if task.cancelled() else task.result()


# What ask_for_logprobs said on stderr in this process, by server: said once per server.
_SAID: set[tuple[str, str]] = set()


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr)
