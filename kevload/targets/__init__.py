"""Built-in real targets (llama.cpp server, transformers serve): provision, start on 127.0.0.1, stop.

``async with local_target("llamacpp", slots=4) as url:`` gives a base URL for the duration of the block.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from kevload.servers import ServerError, free_port, pid_alive, start_server, stop_group, wait_ready
from kevload.targets.cache import ProvisionError, cache_root
from kevload.targets.model import MODEL_NAME, default_gguf

NAMES = ("llamacpp", "transformers")
HOST = "127.0.0.1"

__all__ = ["NAMES", "ProvisionError", "RunningTarget", "ServerError", "TargetSettings", "forget_state",
           "local_target", "running_target", "save_state", "start_target", "status_target", "stop_target"]


@dataclass(frozen=True)
class TargetSettings:
    """What users tune and sweep. ``None`` means the server's own default."""

    slots: int = 4
    ctx_size: int | None = None
    threads: int | None = None
    batching: bool = True
    cache_prompt: bool = True
    dtype: str = "bfloat16"
    seed: int | None = None
    gguf: str | None = None
    port: int | None = None
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> TargetSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ProvisionError(f"unknown target setting {unknown[0]!r}; expected one of {', '.join(sorted(known))}")
        return cls(**options)


@dataclass(frozen=True)
class RunningTarget:
    name: str
    url: str
    pid: int
    port: int
    model: str
    settings: TargetSettings
    log_path: Path
    argv: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["log_path"] = str(self.log_path)
        return doc


def start_target(name: str, settings: TargetSettings | None = None, *,
                 log: Callable[[str], None] = print) -> RunningTarget:
    """Provision (first time only), start and wait until the target answers; the process outlives this call."""
    settings = settings or TargetSettings()
    if name not in NAMES:
        raise ProvisionError(f"unknown target {name!r}; expected one of {', '.join(NAMES)}")
    port = settings.port or free_port(HOST)
    argv, env, model, ready_timeout = _command(name, settings, port, log)
    log_path = _state_dir() / f"{name}-{port}.log"
    log_path.unlink(missing_ok=True)
    server = start_server(argv, log_path, env=env)
    url = f"http://{HOST}:{port}/v1"
    log(f"waiting for {name} on {url} …")
    wait_ready(server, f"http://{HOST}:{port}/health", timeout=ready_timeout,
               extra_check=lambda: _warm_up(url, model))
    return RunningTarget(name=name, url=url, pid=server.pid, port=port, model=model, settings=settings,
                         log_path=log_path, argv=tuple(argv))


def stop_target(target: RunningTarget | int) -> None:
    stop_group(target.pid if isinstance(target, RunningTarget) else target)


@contextlib.contextmanager
def running_target(name: str, log: Callable[[str], None] = print, **options: Any) -> Iterator[RunningTarget]:
    """Synchronous form for tests and scripts: the target is stopped when the block ends, however it ends."""
    target = start_target(name, TargetSettings.from_options(options), log=log)
    try:
        yield target
    finally:
        stop_target(target)


@contextlib.asynccontextmanager
async def local_target(name: str, log: Callable[[str], None] = print, **options: Any) -> AsyncIterator[str]:
    """``async with local_target("llamacpp", slots=4) as url``: a base URL while the block runs."""
    target = await asyncio.to_thread(start_target, name, TargetSettings.from_options(options), log=log)
    try:
        yield target.url
    finally:
        await asyncio.to_thread(stop_target, target)


# --- the state that `kevload target start|status|stop` keep between invocations ---

def save_state(target: RunningTarget) -> Path:
    path = _state_dir() / f"{target.name}.json"
    path.write_text(json.dumps(target.to_json(), indent=2))
    return path


def status_target(name: str) -> dict[str, Any] | None:
    """The recorded state of a target started by ``kevload target start``, with ``running`` checked live."""
    path = _state_dir() / f"{name}.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    doc["running"] = pid_alive(doc["pid"])
    return doc


def forget_state(name: str) -> None:
    (_state_dir() / f"{name}.json").unlink(missing_ok=True)


def _state_dir() -> Path:
    path = cache_root() / "run"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _command(name: str, s: TargetSettings, port: int,
             log: Callable[[str], None]) -> tuple[list[str], dict[str, str], str, float]:
    gguf = Path(s.gguf).expanduser().resolve() if s.gguf else default_gguf()
    if not gguf.is_file():
        raise ProvisionError(f"gguf: no such model file {gguf}")
    threads = s.threads or os.cpu_count() or 2
    env = dict(os.environ)
    if name == "llamacpp":
        from kevload.targets import llamacpp

        slots = max(s.slots, 1)
        argv = [str(llamacpp.server_binary(log)), "-m", str(gguf), "--host", HOST, "--port", str(port),
                "--alias", MODEL_NAME if not s.gguf else gguf.stem, "--parallel", str(slots),
                "--ctx-size", str(s.ctx_size or 2048 * slots), "--threads", str(threads),
                "--cont-batching" if s.batching else "--no-cont-batching",
                "--cache-prompt" if s.cache_prompt else "--no-cache-prompt"]
        if s.seed is not None:
            argv += ["--seed", str(s.seed)]
        return argv + list(s.extra_args), env, argv[argv.index("--alias") + 1], 180.0
    from kevload.targets import transformers_serve as tf

    venv = tf.environment(log)
    model = str(tf.model_dir(gguf if s.gguf else None, log))
    argv = [str(venv / "venv" / "bin" / "transformers"), "serve", model, "--host", HOST, "--port", str(port),
            "--device", "cpu", "--dtype", s.dtype, "--log-level", "warning"]
    if s.batching:
        # A fixed cache size: sizing from "free memory" breaks on CPU hosts with much RAM.
        argv += ["--continuous-batching", "--cb-num-blocks", "64", "--cb-max-batch-tokens", "256",
                 "--cb-max-memory-percent", "0.5"]
    if s.seed is not None:
        argv += ["--default-seed", str(s.seed)]
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS=str(threads),
               HF_HUB_DISABLE_TELEMETRY="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    return argv + list(s.extra_args), env, model, 300.0


def _warm_up(url: str, model: str) -> None:
    """One tiny request: some servers answer /health before the model can serve (lazy load, first-call setup)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                       "temperature": 0}).encode()
    request = urllib.request.Request(f"{url}/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()


__all__ += ["save_state", "forget_state", "ServerProcess"]
