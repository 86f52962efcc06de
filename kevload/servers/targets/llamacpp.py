"""llama.cpp's ``llama-server``, built once from the sources vendored in llama-cpp-python's
sdist."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kevload.errors import ProvisionError
from kevload.servers.targets.base import HOST, Launch, Log, TargetSettings
from kevload.servers.targets.cache import (
    build_once,
    cache_root,
    pip_download,
    run_logged,
)
from kevload.servers.targets.model import MODEL_NAME

VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_VENDOR = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"

# CPU only, one static binary, nothing fetched at build time (no curl, no prebuilt web UI).
_CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DGGML_NATIVE=ON",
    # -march=native turns on AMX where the CPU lists it, but a VM or sandbox may not grant the tile
    # state: the
    # server then dies at its first matrix product (ldtilecfg). Without AMX it runs on AVX-512 or
    # AVX2 anyway.
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
]
# The flags are part of the cache's name: a binary built with other flags is never reused for these.
BUILD = f"{VERSION}-{hashlib.sha256(' '.join(_CMAKE_FLAGS).encode()).hexdigest()[:8]}"


def command(settings: TargetSettings, port: int, log: Log) -> Launch:
    """Build ``llama-server`` on first use, then the command line that serves the model on
    ``port``."""
    gguf = settings.model_file()  # a missing model file is named before any build starts
    return launch(server_binary(log), gguf, settings, port)


def launch(binary: Path, gguf: Path, s: TargetSettings, port: int) -> Launch:
    """The command line alone, from the settings: no building, no files touched."""
    slots = max(s.slots, 1)
    # The bundled model answers to its own name; a user's GGUF to its file name.
    model = gguf.stem if s.gguf else MODEL_NAME
    # --metrics: the server's own view of each level (running and deferred requests) is sampled from
    # /metrics.
    argv = [
        str(binary),
        "-m",
        str(gguf),
        "--host",
        HOST,
        "--port",
        str(port),
        "--alias",
        model,
        "--metrics",
        "--parallel",
        str(slots),
        "--ctx-size",
        str(s.ctx_size or 2048 * slots),
        "--threads",
        str(s.thread_count()),
        "--cont-batching" if s.batching else "--no-cont-batching",
        "--cache-prompt" if s.cache_prompt else "--no-cache-prompt",
    ]
    if s.seed is not None:
        argv += ["--seed", str(s.seed)]
    return Launch(
        argv=(*argv, *s.extra_args), env=dict(os.environ), model=model, ready_timeout=180.0
    )


def server_binary(log: Callable[[str], None] = print) -> Path:
    """Path to a working ``llama-server``, building it on first use (about 11 minutes on 2
    cores)."""
    dest = cache_root() / "targets" / "llamacpp" / BUILD
    build_once(dest, lambda root: _build(root, log), log=log)
    return dest / "bin" / "llama-server"


def _build(root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    if shutil.which("cmake") is None:
        raise ProvisionError(
            "cmake is not installed (Debian: apt-get install cmake build-essential)"
        )
    sdist = pip_download(
        f"llama-cpp-python=={VERSION}", SDIST_SHA256, root / "download", sdist=True, log=log
    )
    src = root / "src"
    log("extracting vendor/llama.cpp …")
    with tarfile.open(sdist) as archive:
        members = []
        for member in archive.getmembers():
            if member.name.startswith(_VENDOR):
                member.name = member.name[len(_VENDOR) :]
                members.append(member)
        archive.extractall(src, members=members, filter="data")
    build = root / "build"
    jobs = str(os.cpu_count() or 2)
    run_logged(
        ["cmake", "-S", str(src), "-B", str(build), *_CMAKE_FLAGS], log=log, what="cmake configure"
    )
    run_logged(
        ["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs],
        log=log,
        what=f"build llama-server with {jobs} jobs (about 11 minutes on 2 cores)",
    )
    (root / "bin").mkdir()
    shutil.copy2(build / "bin" / "llama-server", root / "bin" / "llama-server")
    shutil.rmtree(build)
    shutil.rmtree(src)
    shutil.rmtree(root / "download")
    return {
        "target": "llamacpp",
        "version": VERSION,
        "sdist_sha256": SDIST_SHA256,
        "cmake_flags": _CMAKE_FLAGS,
    }
