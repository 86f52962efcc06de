"""End to end on the built-in llama.cpp target: a live three-turn conversation at c=1 and c=2, each
turn asked with the answers the server actually gave, every counted turn at full load, and the turn
where a conversation first left the serial one (or none) as an independent parse of the same
requests finds it (whether llama.cpp holds under batching is this CPU's to say, not the test's)."""

from __future__ import annotations

import pytest

from kevload.inputs.conversation import history_sha256
from kevload.records.store import read_records
from kevload.servers.processes import pid_alive
from kevload.servers.targets import running_target
from tests.conftest import load_summary, run_cli, write_scenario
from tests.rawclient import answer_of
from tests.recording_proxy import RecordingProxy

pytestmark = pytest.mark.e2e

TURNS = ["Suggest one city to visit in Italy.", "What is one dish to eat there?", "And one museum?"]


@pytest.fixture(scope="module")
def llamacpp():
    with running_target("llamacpp", slots=2, log=lambda message: None) as target:
        yield target
    assert not pid_alive(target.pid)


def test_live_conversation_on_llamacpp(tmp_path, llamacpp):
    probe = {
        "id": "trip",
        "system": "You are a concise travel assistant.",
        "turns": TURNS,
        "max_tokens": 16,
    }
    with RecordingProxy(llamacpp.url.removesuffix("/v1")) as proxy:
        scenario = write_scenario(
            tmp_path / "s.toml",
            proxy.url,
            probes=[probe],
            params={"temperature": 0, "seed": 1},
            target={"model": llamacpp.model, "timeout": 120},
            concurrency=[1, 2],
            samples=2,
        )
        code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
        answers = {body.get("user"): answer_of(raw).text for body, raw in proxy.exchanges}
    summary = load_summary(tmp_path / "run")
    records = [r for r in read_records(tmp_path / "run" / "records.jsonl") if r["role"] == "probe"]
    # Each counted conversation's answers, turn by turn, as the raw bodies hold them.
    said: dict[int, list[tuple[str, ...]]] = {1: [], 2: []}
    for r in records:
        if r["turn"] == 2 and r["counted"]:
            chain = sorted(
                (t for t in records if t["conversation"] == r["conversation"]),
                key=lambda t: t["turn"],
            )
            nonces = [f"kevload-{t['run_id']}-{t['seq']}" for t in chain]
            said[r["concurrency"]].append(tuple(answers[n] for n in nonces))
    serial = max(said[1], key=said[1].count)
    first = {
        c: min(
            (next((k for k in range(3) if chat[k] != serial[k]), 3) for chat in chats), default=3
        )
        for c, chats in said.items()
    }
    expected = [[None if first[c] == 3 else first[c] for c in (1, 2)]]
    assert summary["matrix"]["first_divergent_turn"] == expected, (said, summary["matrix"])
    assert code == (1 if expected != [[None, None]] else 0), output
    by_conversation: dict[str, dict[int, dict]] = {}
    for r in records:
        by_conversation.setdefault(r["conversation"], {})[r["turn"]] = r
    checked = 0
    for turns in by_conversation.values():
        if len(turns) != 3 or not turns[2]["counted"]:
            continue
        checked += 1
        for k in (1, 2):
            # The history of turn k holds what turn k - 1 was actually answered, as the record of it
            # says.
            assert turns[k]["history"][-2] == {
                "role": "assistant",
                "content": turns[k - 1]["output"],
            }
            assert turns[k]["history_sha256"] == history_sha256(turns[k]["history"])
            assert turns[k]["in_flight"] == turns[2]["concurrency"] - 1
    assert checked == 4  # load.samples counted conversations at each of the two levels
