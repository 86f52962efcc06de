"""Review of issue 22's conversations: false claims found with crafted servers, each a regression test."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tests.conftest import run_cli, write_scenario
from tests.fakeserver import FakeServer

TURNS = ["Name a colour.", "Why that one?", "Now a number.", "Thanks."]


class DriftsAtTurnOne(FakeServer):
    """Answers as the fake server does, except turn 1 (a request with two user messages): under load (another
    request overlapping it) it gets a random tail. Every other turn, given the same chat, answers the same."""

    def _answer(self, body: dict[str, Any], prompt: str, state: dict[str, Any]) -> str:
        text = super()._answer(body, prompt, state)
        if sum(m.get("role") == "user" for m in body.get("messages", ())) == 2 and state["max_overlap"] >= 2:
            return f"{text} {random.choice(('kilo', 'lima', 'mike'))}{random.random()}"
        return text


@pytest.mark.parametrize("role", ["probes[0].dataset", "load.companions"])
def test_a_line_with_turns_and_a_messages_that_is_no_list_is_an_error_not_a_traceback(tmp_path, role):
    (tmp_path / "talks.jsonl").write_text(json.dumps({"id": "x", "turns": ["a"], "messages": 3}) + "\n")
    load: dict[str, Any] = {}
    probes = [{"dataset": "talks.jsonl"}]
    if role == "load.companions":
        load = {"mode": "mixed", "companions": "talks.jsonl"}
        probes = [{"id": "p", "prompt": "hi"}]
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", probes=probes, **load)
    code, output = run_cli("run", scenario, "--out", tmp_path / "run")
    assert code == 2 and "Traceback" not in output, output
    assert f"{tmp_path / 'talks.jsonl'}:1: {role}: messages: expected" in output

