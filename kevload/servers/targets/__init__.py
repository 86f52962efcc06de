"""Built-in real targets (llama.cpp server, transformers serve, vLLM): provision, start on
127.0.0.1, stop.

``async with local_target("llamacpp", slots=4) as url:`` gives a base URL for the duration of the
block.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from kevload.errors import ProvisionError, ServerError
from kevload.load.eventloop import until_stopped
from kevload.records.machine import SERVED
from kevload.servers.processes import (
    free_port,
    log_tail,
    pid_alive,
    start_server,
    stop_group,
    stop_when_gone,
    trouble,
    wait_ready,
)
from kevload.servers.targets import llamacpp, transformers_serve, vllm
from kevload.servers.targets.base import HOST, Command, Launch, TargetSettings
from kevload.servers.targets.cache import cache_root, heartbeat
from kevload.servers.targets.engine import engine_facts

# Each built-in target owns its command line; this package only starts, waits for and stops them.
COMMANDS: dict[str, Command] = {
    "llamacpp": llamacpp.command,
    "transformers": transformers_serve.command,
    "vllm": vllm.command,
}
NAMES = tuple(COMMANDS)
# Each target's command line alone, from its settings (no installing): what tells which settings it
# has.
LAUNCHES = {
    "llamacpp": llamacpp.launch,
    "transformers": transformers_serve.launch,
    "vllm": vllm.launch,
}
# Two values of each setting that give two command lines on a target that has it. Threads are on
# every target
# (vLLM binds them to cores, the same two on a one-core machine); the model file and the port are
# not in launch.
_PROBES: dict[str, tuple[Any, Any]] = {
    "slots": (1, 2),
    "ctx_size": (64, 128),
    "batching": (True, False),
    "cache_prompt": (True, False),
    "dtype": ("float32", "bfloat16"),
    "seed": (None, 1),
    "enforce_eager": (False, True),
    "max_model_len": (16, 32),
}

__all__ = [
    "COMMANDS",
    "LAUNCHES",
    "NAMES",
    "Launch",
    "ProvisionError",
    "RunningTarget",
    "ServerError",
    "TargetSettings",
    "forget_state",
    "launch_key",
    "local_target",
    "on_target",
    "refuse_missing_settings",
    "running_target",
    "save_state",
    "served_facts",
    "serving",
    "settings_of",
    "start_target",
    "started_targets",
    "status_target",
    "stop_target",
]

_T = TypeVar("_T")


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

    def failure(self) -> ServerError | None:
        """None while the target still serves; otherwise which target, what went wrong and how its
        log ends."""
        reason = trouble(self.pid, f"http://{HOST}:{self.port}/health")
        if reason is None:
            return None
        return ServerError(
            f"{self.name} (pid {self.pid}) {reason} while in use; the end of its log "
            f"{self.log_path}:\n{log_tail(self.log_path)}"
        )


def launch_key(
    name: str, settings: TargetSettings
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...], str]:
    """What starting ``name`` with ``settings`` runs: its command line, environment and model
    name."""
    made = LAUNCHES[name](Path("/venv"), Path("/model"), settings, 1)
    return made.argv, tuple(sorted(made.env.items())), made.model


# Settings every target has: the ones _PROBES cannot tell apart by the command line alone.
_EVERY_TARGET = ("threads", "gguf", "port", "extra_args")


def settings_of(name: str) -> tuple[str, ...]:
    """The settings ``name`` has, in TargetSettings' order: those that change its command line, and
    the ones every target has."""
    default = TargetSettings()
    return tuple(
        f.name
        for f in fields(TargetSettings)
        if f.name in _EVERY_TARGET
        or (
            f.name in _PROBES
            and len({launch_key(name, replace(default, **{f.name: v})) for v in _PROBES[f.name]})
            > 1
        )
    )


def refuse_missing_settings(name: str, settings: TargetSettings) -> None:
    """A setting given (not its default) that ``name`` does not have is refused: dropped silently,
    it would be in the run's record and a sweep's row labels, never in the server."""
    default = TargetSettings()
    have = settings_of(name)
    for field_name in _PROBES:
        if getattr(settings, field_name) != getattr(default, field_name) and field_name not in have:
            named = ", ".join(f for f in have if f in _PROBES)
            raise ProvisionError(
                f"{name} has no setting {field_name} (its settings: {named}, threads, gguf, port, "
                "extra_args)"
            )


def start_target(
    name: str,
    settings: TargetSettings | None = None,
    *,
    log: Callable[[str], None] = print,
    on_spawn: Callable[[RunningTarget], None] | None = None,
    ready_timeout: float | None = None,
) -> RunningTarget:
    """Provision (first time only), start and wait until the target answers (within
    ``ready_timeout`` seconds; None: the target's own bound); the process outlives this call.

    ``on_spawn`` learns of the process as soon as it exists, before the wait for readiness: a caller
    that must stop early (Ctrl-C) can stop it, which also ends the wait.
    """
    settings = settings or TargetSettings()
    if name not in COMMANDS:
        raise ProvisionError(f"unknown target {name!r}; expected one of {', '.join(NAMES)}")
    refuse_missing_settings(name, settings)
    port = settings.port or free_port(HOST)
    launch = COMMANDS[name](settings, port, log)
    log_path = _state_dir() / f"{name}-{port}.log"
    log_path.unlink(missing_ok=True)
    server = start_server(list(launch.argv), log_path, env=launch.env)
    url = f"http://{HOST}:{port}/v1"
    target = RunningTarget(
        name=name,
        url=url,
        pid=server.pid,
        port=port,
        model=launch.model,
        settings=settings,
        log_path=log_path,
        argv=launch.argv,
    )
    if on_spawn is not None:
        on_spawn(target)
    log(f"waiting for {name} on {url} …")
    with heartbeat(log, f"waiting for {name} to load its model"):
        wait_ready(
            server,
            f"http://{HOST}:{port}/health",
            timeout=ready_timeout or launch.ready_timeout,
            extra_check=lambda: _warm_up(url, launch.model),
        )
    return target


def stop_target(target: RunningTarget | int) -> None:
    stop_group(target.pid if isinstance(target, RunningTarget) else target)


@contextlib.contextmanager
def running_target(
    name: str, log: Callable[[str], None] = print, **options: Any
) -> Iterator[RunningTarget]:
    """Synchronous form for tests and scripts: the target is stopped when the block ends, however it
    ends."""
    target = start_target(name, TargetSettings.from_options(options), log=log)
    try:
        yield target
    finally:
        stop_target(target)


@contextlib.asynccontextmanager
async def local_target(
    name: str, log: Callable[[str], None] = print, **options: Any
) -> AsyncIterator[str]:
    """``async with local_target("llamacpp", slots=4) as url``: a base URL while the block runs."""
    async with serving(
        name, TargetSettings.from_options(options), log=log, stop=asyncio.Event()
    ) as target:
        assert target is not None  # a stop event nobody sets
        yield target.url


@contextlib.asynccontextmanager
async def serving(
    name: str,
    settings: TargetSettings,
    *,
    log: Callable[[str], None],
    stop: asyncio.Event,
    ready_timeout: float | None = None,
) -> AsyncIterator[RunningTarget | None]:
    """A target for the block (None if ``stop`` came first), stopped when the block ends, however it
    ends.

    Starting blocks (provisioning, then polling for readiness), so it runs in a thread. Stopping the
    spawned process is what ends that wait early: whichever of the thread (``on_spawn``) and this
    coroutine sees both the process and the stop request (or this task's cancel) stops it. While the
    block runs, a process that exits has the rest of its group stopped at once (``stop_when_gone``):
    requests then fail at once, and ``target.failure()`` says so.
    """
    spawned: list[RunningTarget] = []
    abandoned = threading.Event()

    def on_spawn(target: RunningTarget) -> None:
        spawned.append(target)
        if stop.is_set() or abandoned.is_set():
            stop_target(target)

    start = asyncio.ensure_future(
        asyncio.to_thread(
            start_target, name, settings, log=log, on_spawn=on_spawn, ready_timeout=ready_timeout
        )
    )
    try:
        await until_stopped(asyncio.shield(start), stop)
    except asyncio.CancelledError:
        await _abandon(start, spawned, abandoned)
        raise
    if stop.is_set():
        await _abandon(start, spawned, abandoned)
        yield None
        return
    target = start.result()
    watch = asyncio.ensure_future(stop_when_gone(target.pid))
    try:
        # What serves the block, for the run.json of each run sent to its URL (records.machine).
        facts = await asyncio.to_thread(served_facts, target, settings)
        served = SERVED.set({**SERVED.get(), target.url: facts})
        try:
            yield target
        finally:
            SERVED.reset(served)
    finally:
        watch.cancel()
        await asyncio.to_thread(stop_target, target)


async def on_target(
    name: str,
    settings: TargetSettings,
    work: Callable[[RunningTarget], Awaitable[_T]],
    *,
    log: Callable[[str], None],
    stop: asyncio.Event,
) -> tuple[_T | None, ServerError | None]:
    """``work(target)`` with the built-in target running (``--target`` of run, diagnose, cases
    rerun).

    Returns its result (None when stopped while the target started) and, when the target stopped
    serving before ``work`` was done, the error to report once the result is shown.
    """
    async with serving(name, settings, log=log, stop=stop) as target:
        if target is None:
            return None, None
        result = await work(target)
        return result, await asyncio.to_thread(target.failure)


async def _abandon(
    start: asyncio.Future[RunningTarget], spawned: list[RunningTarget], abandoned: threading.Event
) -> None:
    """Stop whatever the start spawned (or will) and wait for its thread to end: a thread cannot be
    interrupted."""
    abandoned.set()
    for target in list(spawned):
        await asyncio.to_thread(stop_target, target)
    with contextlib.suppress(
        Exception
    ):  # the start fails once its server is gone: that was the point
        await asyncio.to_thread(stop_target, await start)


# --- the state that `kevload target start|status|stop` keep between invocations ---


def served_facts(target: RunningTarget, settings: TargetSettings) -> dict[str, Any]:
    """What serves ``target``, as run.json's ``server`` keeps it: the engine and its version
    (``engine_facts``) and the settings it was started with that are not the defaults."""
    facts = engine_facts(target.name, target.argv, f"llama-cpp-python {llamacpp.VERSION}")
    return {**facts, "settings": settings.changed()}


def save_state(target: RunningTarget, server: dict[str, Any] | None = None) -> Path:
    """``kevload target start``'s record of ``target`` (``server``: its ``served_facts``), read by
    ``status_target``, ``target stop`` and ``started_targets``."""
    path = _state_dir() / f"{target.name}.json"
    doc = {**target.to_json(), **({"server": server} if server else {})}
    path.write_text(json.dumps(doc, indent=2))
    return path


def started_targets() -> dict[str, dict[str, Any]]:
    """What serves each base URL a live ``kevload target start`` target listens on: so a run sent
    there with ``--url`` (another process) records its ``server`` as a run of ``--target`` does."""
    found: dict[str, dict[str, Any]] = {}
    if not (cache_root() / "run").is_dir():  # nothing was ever started: create nothing
        return found
    for name in NAMES:
        try:
            doc = status_target(name)
            if doc is not None and doc["running"] and isinstance(doc.get("server"), dict):
                found[str(doc["url"])] = doc["server"]
        except (OSError, ValueError, KeyError, TypeError):
            # A state file cut short or edited by hand names no server; the run goes on without.
            continue
    return found


def status_target(name: str) -> dict[str, Any] | None:
    """The recorded state of a target started by ``kevload target start``, with ``running`` checked
    live."""
    path = _state_dir() / f"{name}.json"
    if not path.is_file():
        return None
    doc: dict[str, Any] = json.loads(path.read_text())
    doc["running"] = pid_alive(doc["pid"])
    return doc


def forget_state(name: str) -> None:
    (_state_dir() / f"{name}.json").unlink(missing_ok=True)


def _state_dir() -> Path:
    path = cache_root() / "run"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _warm_up(url: str, model: str) -> None:
    """One tiny request: some servers answer /health before the model can serve (lazy load,
    first-call setup)."""
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "temperature": 0,
        }
    ).encode()
    request = urllib.request.Request(
        f"{url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
