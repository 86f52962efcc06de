"""`kevload sweep`: one scenario across server settings (restarting the server) and scenario keys,
run in this process (``raysweep`` runs the server settings as Ray tasks)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kevload.errors import ScenarioError, ServerError
from kevload.inputs.scenario import Scenario, load_scenario
from kevload.load.runs import run_scenario
from kevload.servers.processes import (
    free_port,
    log_tail,
    start_server,
    stop_when_gone,
    trouble,
    wait_ready,
)
from kevload.servers.sweepfile import (
    Judge,
    failed_row,
    not_run_row,
    server_failed,
    setting_row,
    write_sweep,
)
from kevload.servers.sweepgrid import (
    Grid,
    _fill,
    check_axes_used,
    check_server_cmd,
    combinations,
    label,
    server_argv,
)

# --ready-timeout's default for --server-cmd (a built-in target has its own).
READY_TIMEOUT_S = 300.0
STOPPED = "the sweep was stopped (SIGINT or SIGTERM) before this setting ran"


async def run_sweep(
    scenario_path: Path,
    overrides: list[str],
    grid: Grid,
    *,
    out: Path,
    server_cmd: str | None = None,
    builtin: str | None = None,
    ready_url: str | None = None,
    ready_timeout: float | None = None,
    stop: asyncio.Event | None = None,
    log: Callable[[str], None] = print,
    elsewhere: Callable[..., Awaitable[list[dict[str, Any]]]] | None = None,
    judge: Judge | None = None,
) -> dict[str, Any]:
    """Run every server setting × scenario setting; the server is stopped after each, however it
    ends.

    Every setting gets a row: a server that does not start (not ready within ``ready_timeout``,
    None: 300 s or the built-in target's own) fails its setting's rows and the sweep goes on; one
    that exited or stopped answering its readiness URL by the end of a run fails that row, and its
    setting's later rows are ``not_run``; a sweep stopped or ended by an error has a ``not_run`` row
    for each setting it did not reach.

    ``elsewhere`` runs the server settings instead of this loop, from the loaded scenario, and
    returns the rows (``kevload.servers.raysweep``: side by side on a Ray cluster); the checks
    before and the matrix after are shared. ``judge`` (``sweepref.judge``, with --reference) pairs
    each setting with its reference setting once every setting has its row.
    """
    stop = stop or asyncio.Event()
    # A bad scenario, overrides or grid fail before any server starts.
    base = load_scenario(scenario_path, overrides)
    _check_grid(base, grid, server_cmd=server_cmd, builtin=builtin, ready_url=ready_url)
    if elsewhere is not None:
        done = await elsewhere(
            base,
            grid,
            out=out,
            server_cmd=server_cmd,
            ready_url=ready_url,
            ready_timeout=ready_timeout,
            stop=stop,
            log=log,
        )
        return write_sweep(out, grid, done, complete=not stop.is_set(), unrun=STOPPED, judge=judge)
    sweeping = _Sweeping(base, out, grid, server_cmd, builtin, ready_url, ready_timeout, stop, log)
    return await _sweep_here(sweeping, judge)


async def _sweep_here(sweeping: _Sweeping, judge: Judge | None) -> dict[str, Any]:
    """The sweep in this process: each server setting in turn, its server stopped after it."""
    progress = _Progress()
    grid, out, stop = sweeping.grid, sweeping.out, sweeping.stop
    try:
        for server_setting in combinations(grid.server):
            if stop.is_set() or not await _server_setting(sweeping, server_setting, progress):
                break
    except Exception as exc:
        # Anything else ends the sweep (a server command that cannot run would fail every setting);
        # the settings that ran (minutes each on a real server) keep their rows, the others say why
        # they have none.
        unrun = f"the sweep ended at {progress.at}: {_first_line(exc)}"
        write_sweep(out, grid, progress.rows, complete=False, unrun=unrun)
        raise
    return write_sweep(
        out, grid, progress.rows, complete=not stop.is_set(), unrun=STOPPED, judge=judge
    )


def _check_grid(
    base: Scenario,
    grid: Grid,
    *,
    server_cmd: str | None,
    builtin: str | None,
    ready_url: str | None,
) -> None:
    """Every setting of the grid checked before any server starts: each scenario setting applied to
    the scenario, --server-cmd and --ready-url against the axes, or each target setting against
    the built-in target."""
    for combo in combinations(grid.scenario):
        base.with_settings(combo, source="--grid")
    if ready_url is not None and server_cmd is None:
        raise ScenarioError(
            "--ready-url: only with --server-cmd (a --target is waited for at its own health URL)"
        )
    if server_cmd is not None:
        check_server_cmd(server_cmd, ready_url, list(grid.server))
    if builtin is not None:
        from kevload.servers.targets import TargetSettings, refuse_missing_settings

        for setting in combinations(grid.server):
            TargetSettings.from_options(setting)
        check_axes_used(builtin, grid.server)
        for setting in combinations(grid.server):
            refuse_missing_settings(builtin, TargetSettings.from_options(setting))


@dataclass(frozen=True)
class _Sweeping:
    """A sweep run in this process: its scenario, where its runs and server logs go, the scenario
    settings each server runs, and how each server starts."""

    base: Scenario
    out: Path
    grid: Grid
    server_cmd: str | None
    builtin: str | None
    ready_url: str | None
    ready_timeout: float | None
    stop: asyncio.Event
    log: Callable[[str], None]

    @functools.cached_property
    def dirs(self) -> dict[str, str]:
        """Each setting's run directory, by its label."""
        return self.grid.run_dirs()

    @functools.cached_property
    def logs(self) -> dict[str, str]:
        """Each server setting's log file, by its label."""
        return self.grid.server_logs()

    @functools.cached_property
    def combos(self) -> list[dict[str, Any]]:
        """The scenario settings each server runs."""
        return combinations(self.grid.scenario)


@dataclass
class _Progress:
    """The rows made so far and the setting reached: a sweep ended by an error keeps the one and
    names the other."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    at: str = ""


async def _server_setting(
    sweeping: _Sweeping, server_setting: dict[str, Any], progress: _Progress
) -> bool:
    """One server setting's rows: its server started and each scenario setting run against it; a
    server that does not start fails its rows. False: the sweep was stopped while it started."""
    progress.at = label(server_setting)
    sweeping.log(f"server {progress.at}: starting …")
    started = False
    try:
        async with _server(server_setting, sweeping) as up:
            started = True
            if up is None:  # stopped while the server was starting
                return False
            await _scenario_settings(sweeping, server_setting, up, progress)
    except ServerError as exc:
        if started:
            raise
        # One setting's server may not start (say, too large a batch for the memory): the others
        # still can.
        sweeping.log(f"  the server of {label(server_setting)} did not start: {exc}")
        progress.rows += [failed_row(server_setting, combo, str(exc)) for combo in sweeping.combos]
    return True


async def _scenario_settings(
    sweeping: _Sweeping, server_setting: dict[str, Any], up: _Up, progress: _Progress
) -> None:
    """Each scenario setting run against one server; one its server did not last fails, and the
    setting's later ones are not run."""
    combos = sweeping.combos
    for index, combo in enumerate(combos):
        if sweeping.stop.is_set():
            break
        progress.at = name = label({**server_setting, **combo})
        scenario = sweeping.base.with_settings(up.sets, source="sweep").with_settings(
            combo, source="--grid"
        )
        sweeping.log(f"  running {name} …")
        result = await run_scenario(
            scenario, sweeping.out / sweeping.dirs[name], stop=sweeping.stop
        )
        row = setting_row(name, server_setting, combo, result.run_dir, result.summary)
        failure = await asyncio.to_thread(up.failure)
        if failure is None:
            progress.rows.append(row)
            continue
        # However its run went, the setting's answers came from a server that did not last it.
        where = f"(its log: {up.log_path})"
        progress.rows.append(server_failed(row, f"the server {failure} during the run {where}"))
        sweeping.log(
            f"  the server of {label(server_setting)} {failure} during the run; "
            f"the end of its log:\n"
            f"{log_tail(up.log_path) if up.log_path else ''}"
        )
        # The rest of this setting's scenario keys would only fail: each keeps its row, saying why.
        progress.rows += [
            not_run_row(server_setting, later, f"the server {failure} during {name} {where}")
            for later in combos[index + 1 :]
        ]
        break


@dataclass(frozen=True)
class _Up:
    """A server started for one setting: the scenario settings that point at it, and why it no
    longer serves (``servers.trouble``; None while it does)."""

    sets: dict[str, Any]
    failure: Callable[[], str | None]
    log_path: Path | None


@contextlib.asynccontextmanager
async def _server(setting: dict[str, Any], sweeping: _Sweeping) -> AsyncIterator[_Up | None]:
    """Start the server for one setting (None: stopped while starting); it is stopped when the block
    ends, however it ends, a cancel during its start included. A server that exits while in use has
    the rest of its process group stopped at once, so the requests sent to it fail at once."""
    if sweeping.builtin is not None:
        async with _builtin_server(setting, sweeping) as up:
            yield up
    elif sweeping.server_cmd is None:
        yield _Up({}, lambda: None, None)  # only scenario keys are swept: the target stays as it is
    else:
        async with _command_server(setting, sweeping.server_cmd, sweeping) as up:
            yield up


@contextlib.asynccontextmanager
async def _builtin_server(
    setting: dict[str, Any], sweeping: _Sweeping
) -> AsyncIterator[_Up | None]:
    """A built-in target started with one setting (``servers.targets.serving``)."""
    from kevload.servers.targets import TargetSettings, serving

    assert sweeping.builtin is not None
    async with serving(
        sweeping.builtin,
        TargetSettings.from_options(setting),
        log=sweeping.log,
        stop=sweeping.stop,
        ready_timeout=sweeping.ready_timeout,
    ) as target:
        yield (
            None
            if target is None
            else _Up(
                {"target.base_url": target.url, "target.model": target.model},
                functools.partial(trouble, target.pid, f"http://127.0.0.1:{target.port}/health"),
                target.log_path,
            )
        )


@contextlib.asynccontextmanager
async def _command_server(
    setting: dict[str, Any], server_cmd: str, sweeping: _Sweeping
) -> AsyncIterator[_Up | None]:
    """--server-cmd with one setting's values and a free port, waited for at its readiness URL."""
    port = free_port()
    values = {**setting, "port": port}
    argv = server_argv(server_cmd, values)
    try:
        server = start_server(argv, sweeping.out / sweeping.logs[label(setting)])
    except OSError as exc:
        raise ScenarioError(
            f"--server-cmd: cannot run {argv[0]!r}: {exc.strerror or exc}"
        ) from None
    watch = None
    try:
        url = _fill(sweeping.ready_url or "http://127.0.0.1:{port}/health", values)
        # The pid is known here, in this task, before the wait starts: the finally below stops the
        # server even when this task is cancelled while the thread still polls (that thread then
        # sees it gone and ends).
        timeout = sweeping.ready_timeout or READY_TIMEOUT_S
        wait = functools.partial(
            wait_ready, server, url, timeout=timeout, cancelled=sweeping.stop.is_set
        )
        future = asyncio.get_running_loop().run_in_executor(None, wait)
        future.add_done_callback(_retrieve)
        ready = await future
        watch = asyncio.ensure_future(stop_when_gone(server.pid))
        up = _Up(
            {"target.base_url": f"http://127.0.0.1:{port}/v1"},
            functools.partial(trouble, server.pid, url),
            server.log_path,
        )
        yield up if ready else None
    finally:
        if watch is not None:
            watch.cancel()
        server.stop()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Consume the readiness thread's outcome when nobody awaits it any more (its awaiter was
    cancelled)."""
    if not future.cancelled():
        future.exception()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
