"""Start and stop a server under test as its own process group, and wait until it answers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kevload.errors import ServerError


@dataclass
class ServerProcess:
    """A started server. ``stop`` ends its whole process group, children included."""

    argv: list[str]
    pid: int
    log_path: Path
    _popen: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return pid_alive(self.pid)

    def stop(self, grace: float = 10.0) -> None:
        stop_group(self.pid, grace)
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=1)

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.log_path, lines)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def start_server(
    argv: list[str], log_path: Path, env: dict[str, str] | None = None
) -> ServerProcess:
    """Launch ``argv`` in a new session (so one signal reaches every process it spawns), logging to
    a file."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return ServerProcess(argv=argv, pid=popen.pid, log_path=log_path, _popen=popen)


# Readiness checks go to servers on this machine: never through an http_proxy from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def wait_ready(
    server: ServerProcess,
    url: str,
    *,
    timeout: float,
    extra_check: Callable[[], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> bool:
    """Poll ``url`` until it answers 200; fail fast if the process dies. Stops the server on
    failure.

    Returns False, with the server stopped, as soon as ``cancelled()`` is true (checked between
    polls).
    """
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    try:
        while time.monotonic() < deadline:
            if cancelled is not None and cancelled():
                server.stop()
                return False
            if not server.alive():
                raise ServerError(
                    f"server exited while starting ({' '.join(server.argv[:3])} "
                    f"…):\n{server.log_tail()}"
                )
            try:
                with _DIRECT.open(url, timeout=2) as response:
                    healthy = response.status == 200
                    last = f"HTTP {response.status}"
            except urllib.error.HTTPError as exc:
                healthy, last = False, f"HTTP {exc.code}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
                healthy, last = False, str(exc)
            if healthy:
                if extra_check is not None:
                    try:
                        extra_check()
                    except Exception as exc:
                        raise ServerError(
                            f"server at {url} is up but its first request failed ({exc}):\n"
                            f"{server.log_tail()}"
                        ) from None
                return True
            time.sleep(0.25)
        raise ServerError(
            f"server not ready at {url} after {timeout:.0f} s ({last}):\n{server.log_tail()}"
        )
    except BaseException:
        server.stop()
        raise


async def stop_when_gone(pid: int, every: float = 0.25) -> None:
    """Wait until the process ``pid`` has exited, then stop what is left of its group.

    A server's children can outlive it: vLLM's engine core and worker (3 GB) do when its API server
    is killed, and a child that inherited the listening socket would accept connections and never
    answer them. With the group gone nothing is left running and every request fails at once.
    """
    while pid_alive(pid):
        await asyncio.sleep(every)
    await asyncio.to_thread(stop_group, pid)


EXITING_S = 1.0  # how long a server that refused its readiness URL is given to be seen exiting


def trouble(pid: int, health_url: str) -> str | None:
    """Why a server that was ready can no longer serve, or None: its process exited, or it no longer
    answers ``health_url`` with 200 (vLLM's API server lives on for a moment after its engine died,
    answering 500)."""
    if not pid_alive(pid):
        return "exited"
    try:
        with _DIRECT.open(health_url, timeout=5) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        # A process on its way out closes its sockets before it is gone: the moment it takes to go
        # names it right.
        deadline = time.monotonic() + EXITING_S
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return "exited"
            time.sleep(0.02)
        return f"stopped answering {health_url} ({exc})"
    return None if status == 200 else f"stopped answering {health_url} (HTTP {status})"


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still "exists"; it is not running.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def stop_group(pid: int, grace: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _group_alive(pid):
                return
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # killpg(0) succeeds while zombies remain; look for a member that is really running.
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
