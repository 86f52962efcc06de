"""End to end: ``kevload compare --target NAME=llamacpp:slots=1`` starts the built-in target with
its settings for the comparison, sends it the scenario beside a server given by URL, and stops it
after. What the real servers answer is not expected of them: only that both were asked every item
and the comparison was made of their records."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest

from kevload.servers.processes import pid_alive
from kevload.servers.targets import running_target
from tests.conftest import run_cli, write_scenario

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def llamacpp():
    with running_target("llamacpp", slots=2, log=lambda message: None) as target:
        yield target
    assert not pid_alive(target.pid)


def test_compare_starts_a_builtin_target_beside_a_url_and_stops_it(tmp_path, llamacpp):
    probes = [
        {"id": f"p{i}", "prompt": f"Name {i + 1} colours.", "max_tokens": 12} for i in range(2)
    ]
    path = write_scenario(
        tmp_path / "s.toml",
        llamacpp.url,
        probes=probes,
        params={"temperature": 0, "seed": 1},
        target={"model": llamacpp.model, "timeout": 120},
        concurrency=[1, 2],
        samples=2,
    )
    code, output = run_cli(
        "compare", path, "--url", f"old={llamacpp.url}", "--target", "new=llamacpp:slots=1",
        "--out", tmp_path / "cmp",
    )  # fmt: skip
    assert code in (0, 1), output
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [lv["items"] for lv in doc["candidates"][0]["levels"]] == [2, 2]
    started = json.loads((tmp_path / "cmp" / "compare-run.json").read_text())["targets"][1]
    assert started["name"] == "new" and started["base_url"] != llamacpp.url
    # Its run says which target it was and with what settings; the other is a URL, no claim.
    server = json.loads((tmp_path / "cmp" / "new" / "run.json").read_text())["server"]
    assert server["target"] == "llamacpp" and server["settings"] == {"slots": 1}
    assert "server" not in json.loads((tmp_path / "cmp" / "old" / "run.json").read_text())
    # Stopped once the comparison ended: nothing listens on its port any more.
    port = urlsplit(started["base_url"]).port
    with socket.socket() as probe, pytest.raises(OSError):
        probe.settimeout(2)
        probe.connect(("127.0.0.1", port))
