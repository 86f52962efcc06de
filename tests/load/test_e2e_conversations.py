"""End to end on the built-in llama.cpp target: a live three-turn conversation at c=1 and c=2, each turn asked with
the answers the server actually gave, every counted turn at full load, and the conversation the same at both levels
(llama.cpp holds under batching here, as tests/servers/test_e2e_targets.py shows for single prompts)."""

from __future__ import annotations

import pytest

from kevload.inputs.conversation import history_sha256
from kevload.records.store import read_records
from kevload.servers.processes import pid_alive
from kevload.servers.targets import running_target
from tests.conftest import load_summary, run_cli, write_scenario

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
    scenario = write_scenario(
        tmp_path / "s.toml",
        llamacpp.url,
        probes=[probe],
        params={"temperature": 0, "seed": 1},
        target={"model": llamacpp.model, "timeout": 120},
        concurrency=[1, 2],
        samples=2,
    )
    code, output = run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    assert code == 0, output
    summary = load_summary(tmp_path / "run")
    assert summary["matrix"]["first_divergent_turn"] == [[None, None]]
    assert all(
        t["same_history"] == 2 and t["differ"] == 0 for c in summary["cells"] for t in c["turns"]
    )
    records = [r for r in read_records(tmp_path / "run" / "records.jsonl") if r["role"] == "probe"]
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
