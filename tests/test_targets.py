"""The built-in targets' shape, and `kevload demo` under Ctrl-C, without building a real server.

A stand-in target (the fake server as its own process) goes through the same start/wait/stop path
as llama.cpp and transformers do, so what these tests show about processes holds for them too.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from pathlib import Path

import pytest

import kevload.targets as targets
from kevload.servers import pid_alive
from kevload.targets import TargetSettings, llamacpp, transformers_serve
from kevload.targets.base import Launch
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent


def test_all_names_only_what_exists():
    assert len(targets.__all__) == len(set(targets.__all__))
    missing = [name for name in targets.__all__ if not hasattr(targets, name)]
    assert missing == []


def test_every_builtin_target_owns_its_command():
    assert targets.NAMES == ("llamacpp", "transformers")
    assert dict(targets.COMMANDS) == {"llamacpp": llamacpp.command, "transformers": transformers_serve.command}


def test_llamacpp_command_line_follows_the_settings():
    gguf = Path("/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    plain = llamacpp.launch(Path("/bin/llama-server"), gguf, TargetSettings(slots=2, threads=3), 8123)
    assert plain.argv == ("/bin/llama-server", "-m", str(gguf), "--host", "127.0.0.1", "--port", "8123",
                          "--alias", "SmolLM2-135M-Instruct", "--metrics", "--parallel", "2", "--ctx-size", "4096",
                          "--threads", "3", "--cont-batching", "--cache-prompt")
    assert plain.model == "SmolLM2-135M-Instruct"
    own = llamacpp.launch(Path("/b"), Path("/m/mine.gguf"), TargetSettings(
        gguf="/m/mine.gguf", batching=False, cache_prompt=False, seed=7, ctx_size=512, extra_args=("--x",)), 1)
    assert own.model == "mine"
    assert own.argv[own.argv.index("--ctx-size") + 1] == "512"
    assert own.argv[-5:] == ("--no-cont-batching", "--no-cache-prompt", "--seed", "7", "--x")


def test_transformers_command_line_follows_the_settings():
    on = transformers_serve.launch(Path("/env"), Path("/model"), TargetSettings(threads=2, seed=5), 9000)
    assert on.argv[:3] == ("/env/venv/bin/transformers", "serve", "/model")
    assert "--continuous-batching" in on.argv and on.argv[-2:] == ("--default-seed", "5")
    assert on.env["HF_HUB_OFFLINE"] == "1" and on.env["OMP_NUM_THREADS"] == "2"
    assert on.model == "/model"
    off = transformers_serve.launch(Path("/env"), Path("/model"), TargetSettings(batching=False, dtype="float32"), 1)
    assert "--continuous-batching" not in off.argv
    assert off.argv[off.argv.index("--dtype") + 1] == "float32"


def test_launch_never_prints_the_environment():
    launch = Launch(argv=("x",), env={"OPENAI_API_KEY": "sk-secret"}, model="m", ready_timeout=1)
    assert "sk-secret" not in repr(launch)


def _fake_command():
    """The fake server as a target process; its pid is the process group the target's stop ends."""

    def command(settings: TargetSettings, port: int, log) -> Launch:
        argv = (sys.executable, "-m", "tests.fakeserver", "--port", str(port), "--latency", "0.3")
        return Launch(argv=argv, env={**os.environ, "PYTHONPATH": str(ROOT)}, model="fake", ready_timeout=30)

    return command


def _never_ready(marker: Path):
    """A target that spawns but never answers: the demo is stuck waiting for it to get ready."""

    def command(settings: TargetSettings, port: int, log) -> Launch:
        code = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
        return Launch(argv=(sys.executable, "-c", code), env=dict(os.environ), model="fake", ready_timeout=300)

    return command


def _interrupt_when(ready, done: threading.Event) -> threading.Thread:
    """SIGINT this process once ``ready()`` holds, as a user's Ctrl-C would; polls, never waits on a clock."""

    def watch() -> None:
        while not done.is_set():
            if ready():
                os.kill(os.getpid(), signal.SIGINT)
                return
            done.wait(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _records(tmp_path: Path) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in tmp_path.glob("results/demo-*/*/records.jsonl"))


def test_demo_ctrl_c_exits_130_with_what_was_collected(tmp_path, monkeypatch):
    spawned: list[int] = []
    monkeypatch.setitem(targets.COMMANDS, "llamacpp", _fake_command())
    ports: list[int] = []
    real_start = targets.start_target

    def start(name, settings=None, **kw):
        target = real_start(name, settings, **kw)
        ports.append(target.port)
        spawned.append(target.pid)
        return target

    monkeypatch.setattr("kevload.demo.start_target", start)
    monkeypatch.chdir(tmp_path)
    done = threading.Event()
    watcher = _interrupt_when(lambda: _records(tmp_path) >= 3, done)
    try:
        code, output = run_cli("demo", "--targets", "llamacpp", "--samples", "4")
    finally:
        done.set()
        watcher.join(5)
    assert code == 130, output
    assert "llama.cpp: distinct outputs" in output and "stopped" in output
    assert spawned and not any(pid_alive(pid) for pid in spawned)
    for port in ports:
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass


def test_demo_ctrl_c_while_a_target_starts_stops_it(tmp_path, monkeypatch):
    marker = tmp_path / "spawned.pid"
    monkeypatch.setitem(targets.COMMANDS, "llamacpp", _never_ready(marker))
    monkeypatch.chdir(tmp_path)
    done = threading.Event()
    watcher = _interrupt_when(lambda: marker.is_file() and marker.read_text(), done)
    try:
        code, output = run_cli("demo", "--targets", "llamacpp", "--samples", "2")
    finally:
        done.set()
        watcher.join(5)
    assert code == 130, output
    assert not pid_alive(int(marker.read_text()))
