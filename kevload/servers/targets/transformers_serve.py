"""Hugging Face ``transformers serve`` with continuous batching, in its own virtualenv under the
cache."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kevload.errors import ProvisionError
from kevload.servers.targets.base import HOST, Launch, Log, TargetSettings
from kevload.servers.targets.cache import build_once, cache_root, run_logged
from kevload.servers.targets.model import default_gguf, gguf_identity

VERSION = "5.24.0"
TORCH = "2.13.0"
# torch pinned exactly: an unpinned torch resolves to a multi-GB CUDA build.
_REQUIREMENTS = [f"torch=={TORCH}", f"transformers[serving]=={VERSION}", "gguf==0.19.0"]

_CONVERT = r"""
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
# The GGUF's quantization is dequantized on load; saving the config would claim otherwise.
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.hf_quantizer = None
model.is_quantized = False
model.save_pretrained(out)
tokenizer.save_pretrained(out)
"""


def command(settings: TargetSettings, port: int, log: Log) -> Launch:
    """Install transformers and convert the model on first use, then the command line that serves
    it."""
    gguf = settings.model_file()
    venv = environment(log)
    return launch(venv, model_dir(gguf if settings.gguf else None, log), settings, port)


def launch(venv: Path, model: Path, s: TargetSettings, port: int) -> Launch:
    """The command line alone, from the settings: no installing, no files touched."""
    argv = [
        str(venv / "venv" / "bin" / "transformers"),
        "serve",
        str(model),
        "--host",
        HOST,
        "--port",
        str(port),
        "--device",
        "cpu",
        "--dtype",
        s.dtype,
        "--log-level",
        "warning",
    ]
    if s.batching:
        # A fixed cache size: sizing from "free memory" breaks on CPU hosts with much RAM.
        argv += [
            "--continuous-batching",
            "--cb-num-blocks",
            "64",
            "--cb-max-batch-tokens",
            "256",
            "--cb-max-memory-percent",
            "0.5",
        ]
    if s.seed is not None:
        argv += ["--default-seed", str(s.seed)]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": str(s.thread_count()),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    }
    return Launch(argv=(*argv, *s.extra_args), env=env, model=str(model), ready_timeout=300.0)


def environment(log: Callable[[str], None] = print) -> Path:
    """The virtualenv with transformers and torch, installed on first use."""
    dest = cache_root() / "targets" / "transformers" / f"{VERSION}-torch{TORCH}"
    build_once(dest, lambda root: _install(root, log), log=log)
    return dest


def python_in(env: Path) -> Path:
    return env / "venv" / "bin" / "python"


def model_dir(gguf: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """A transformers model directory converted once from the GGUF file (the bundled SmolLM2 by
    default)."""
    gguf = gguf or default_gguf()
    env = environment(log)
    dest = cache_root() / "models" / f"hf-{gguf_identity(gguf)}"
    build_once(dest, lambda root: _convert(env, gguf, root, log), log=log)
    return dest


def _install(root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    venv = root / "venv"
    run_logged(
        [sys.executable, "-m", "venv", str(venv)], log=log, what="create transformers virtualenv"
    )
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ]
    run_logged(
        pip + _REQUIREMENTS, log=log, what=f"install transformers {VERSION} and torch {TORCH} (CPU)"
    )
    check = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import torch, transformers; print(torch.__version__)",
        ],
        capture_output=True,
        text=True,
    )
    if check.returncode != 0 or not check.stdout.startswith(TORCH):
        raise ProvisionError(f"transformers virtualenv is broken: {check.stderr.strip()[-500:]}")
    return {"target": "transformers", "version": VERSION, "torch": TORCH}


def _convert(env: Path, gguf: Path, root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    run_logged(
        [str(python_in(env)), "-c", _CONVERT, str(gguf.parent), gguf.name, str(root)],
        log=log,
        what=f"convert {gguf.name} to a transformers model",
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    if not (root / "config.json").is_file():
        raise ProvisionError(f"conversion of {gguf} wrote no config.json")
    return {"gguf": str(gguf), "identity": gguf_identity(gguf)}
