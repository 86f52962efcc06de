"""The engine's pieces: the retry policy, the stop condition, and a bug in one sender that surfaces
as itself from the record stream (the level's task group cancels the other senders, unrecorded)."""

from __future__ import annotations

import asyncio

import pytest

from kevload.inputs.scenario import load_scenario
from kevload.load import engine
from kevload.load.sender import RetryPolicy, Sender
from kevload.wire.answer import Outcome
from kevload.wire.client import Client
from tests.conftest import write_scenario


def test_retry_policy_honours_retry_after_and_backs_off_exponentially():
    policy = RetryPolicy(retries=3)
    refused = Outcome(status="http_429", t_send=0.0, t_last_byte=0.0)
    assert [policy.delay(refused, n) for n in range(4)] == [
        0.2,
        0.4,
        0.8,
        None,
    ]  # then the answer is final
    later = Outcome(status="http_503", t_send=0.0, t_last_byte=0.0, retry_after=60.0)
    assert policy.delay(later, 0) == 10.0  # the server's word, never past max_s
    assert policy.delay(Outcome(status="http_500", t_send=0.0, t_last_byte=0.0), 0) is None


def test_error_share_stops_only_past_the_minimum_and_the_share():
    rule = engine.ErrorShare(limit=0.5)
    assert not any(rule.note(False) for _ in range(engine._ABORT_MIN_ERRORS - 1))
    assert rule.note(False)  # the 20th error, every probe failed
    clean = engine.ErrorShare(limit=0.5)
    assert not any(clean.note(ok) for ok in [True] * 30 + [False] * 25)  # 25 of 55: under half
    assert [clean.note(False) for _ in range(6)] == [False] * 5 + [
        True
    ]  # 30 of 60 is half; 31 of 61 is over


def test_a_bug_in_one_sender_surfaces_as_itself(tmp_path, server, monkeypatch):
    server.behaviour.latency = 0.05
    scenario = load_scenario(
        write_scenario(tmp_path / "s.toml", server.url, concurrency=[3], samples=6)
    )
    real = Sender.send
    calls = 0

    async def buggy(self, *args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 5:
            raise ZeroDivisionError("a bug in the sender")
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(Sender, "send", buggy)

    async def collect():
        async with Client(scenario.target, None) as client:
            return [r async for r in engine.run(scenario, client, run_id="bug")]

    with pytest.raises(ZeroDivisionError, match="a bug in the sender"):
        asyncio.run(collect())
