"""The built-in targets' shape, without building a real server."""

from __future__ import annotations

from pathlib import Path

import kevload.targets as targets
from kevload.targets import TargetSettings, llamacpp, transformers_serve
from kevload.targets.base import Launch


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
                          "--alias", "SmolLM2-135M-Instruct", "--parallel", "2", "--ctx-size", "4096",
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
