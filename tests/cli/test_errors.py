"""One error tree: every kind of kevload error, raised anywhere under any command, reaches the user
as ``kevload: error: <message>`` and its exit code, from the one handler in ``cli.main``."""

from __future__ import annotations

import sys

import pytest

import kevload.servers.targets
from kevload.errors import (
    InputError,
    KevloadError,
    ProvisionError,
    RunDirError,
    ScenarioError,
    ServerError,
    TargetError,
)
from tests.conftest import run_cli, write_scenario


def one_line(output: str) -> str:
    """The whole output, which must be exactly one error line and no traceback."""
    lines = output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in output, output
    assert lines[0].startswith("kevload: error: "), output
    return lines[0]


def test_the_tree_gives_each_kind_its_exit_code():
    assert [cls.exit_code for cls in (ScenarioError, RunDirError, ProvisionError)] == [2, 2, 2]
    assert ServerError.exit_code == 3
    assert issubclass(ScenarioError, InputError) and issubclass(ServerError, TargetError)
    assert issubclass(InputError, KevloadError) and issubclass(TargetError, KevloadError)
    assert issubclass(ScenarioError, ValueError)  # callers that caught ValueError before still do


def test_scenario_error_exits_2_in_one_line(tmp_path):
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurency=[1])
    code, output = run_cli("run", scenario)
    assert code == 2
    assert "load.concurency" in one_line(output) and "concurrency" in output  # did-you-mean kept


def test_run_dir_error_exits_2_in_one_line(tmp_path):
    code, output = run_cli("report", tmp_path)
    assert code == 2
    assert (
        one_line(output)
        == f"kevload: error: {tmp_path}: not a kevload run directory (no records.jsonl)"
    )


def test_option_error_exits_2_in_one_line():
    code, output = run_cli("run")
    assert (code, one_line(output)) == (
        2,
        "kevload: error: missing SCENARIO (or --url URL --model NAME, or --resume RUN_DIR)",
    )


def test_grid_error_exits_2_in_one_line(tmp_path):
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    code, output = run_cli("sweep", scenario, "--grid", "slots")
    assert code == 2 and "--grid 'slots': expected NAME=V1,V2" in one_line(output)


def test_provision_error_in_a_nested_group_exits_2_in_one_line(monkeypatch):
    """`target start` is a command of a group inside the main group: the same handler covers it."""

    def failing_start(*_args, **_kwargs):
        raise ProvisionError("llamacpp: cmake failed (see ~/.cache/kevload/build.log)")

    monkeypatch.setattr(kevload.servers.targets, "status_target", lambda _name: None)
    monkeypatch.setattr(kevload.servers.targets, "start_target", failing_start)
    code, output = run_cli("target", "start", "llamacpp")
    assert (code, one_line(output)) == (
        2,
        "kevload: error: llamacpp: cmake failed (see ~/.cache/kevload/build.log)",
    )


def test_target_error_exits_3_with_the_server_log_under_its_line(tmp_path):
    """A server that dies while starting is the target failing (3), not bad input; its log follows
    the line."""
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    # The message is made when it runs, so it is in the server's output, not in its command
    # line.
    died = (
        f"{sys.executable} -c "
        '\'import sys; print("no such " + "model"); sys.exit(1)\' {port} {slots}'
    )
    code, output = run_cli(
        "sweep", scenario, "--server-cmd", died, "--grid", "slots=1", "--out", tmp_path / "sw"
    )
    assert code == 3, output
    assert "Traceback" not in output
    # The setting fails (the sweep goes on to any other): its row says why, the server's own words
    # under it.
    assert "| slots=1 | failed: server exited while starting" in output, output
    assert "no such model" in output


@pytest.mark.parametrize(
    "error",
    [
        ScenarioError("a.toml: load.samples: expected an integer >= 1, got 0"),
        ServerError("server not ready at http://127.0.0.1:1/health after 1 s"),
    ],
)
def test_any_kevload_error_from_deep_inside_a_command_is_handled(monkeypatch, tmp_path, error):
    import kevload.load.invocation

    def raising(*_args, **_kwargs):
        raise error

    monkeypatch.setattr(kevload.load.invocation, "load_scenario", raising)
    code, output = run_cli("run", tmp_path / "any.toml")
    assert (code, one_line(output)) == (error.exit_code, f"kevload: error: {error}")
