"""kevload as a real subprocess in its own process group, bounded by a kill timer (and a memory
limit where asked): a stop, a hang or a runaway allocation under test can never outlive the test or
take the machine down."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def cli(*setup: str) -> str:
    """``python -c`` code that runs kevload's CLI (its arguments from the command line) after
    ``setup``."""
    return "; ".join(
        ("import os, sys", *setup, "from kevload.cli import main", "main(sys.argv[1:])")
    )


# The parallel reduction forced (any records file is "large", four processes): the path a run with
# records over
# 32 MiB takes, without writing 32 MiB.
PARALLEL_REDUCTION = cli(
    "from kevload.compare import reader", "reader._PARALLEL_BYTES = 1", "os.cpu_count = lambda: 4"
)
# Starting any process fails at once: a test of a bound on worker processes cannot start thousands
# of them.
NO_START = (
    "import multiprocessing.process as mp",
    "mp.BaseProcess.start = lambda self: sys.exit('started a process')",
)
NO_PROCESSES = cli(*NO_START)


@dataclass
class Ended:
    code: int
    stdout: str
    stderr: str
    left: list[str]  # processes of its group still alive when it ended (pid: cmdline), then killed


class Kevload:
    """``kevload ARGS`` (or ``python -c CODE ARGS``) started in a new session, so its pid is its
    group's id."""

    def __init__(
        self,
        *args: object,
        code: str | None = None,
        memory_mb: int | None = None,
        cwd: Path | None = None,
    ):
        argv = [sys.executable, "-c", code] if code else [sys.executable, "-m", "kevload"]
        limit = None if memory_mb is None else memory_mb << 20
        self.proc = subprocess.Popen(
            [*argv, *(str(a) for a in args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            cwd=cwd,
            preexec_fn=None if limit is None else lambda: _limit_memory(limit),
        )
        self.pgid = self.proc.pid

    def signal(self, signum: int, *, group: bool = False) -> float:
        """Send ``signum`` to kevload (or to its whole group, as a CI's timeout does); returns when
        (monotonic)."""
        at = time.monotonic()
        if group:
            os.killpg(self.pgid, signum)
        else:
            os.kill(self.proc.pid, signum)
        return at

    def wait_for(self, ready: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.end(timeout=1)
                raise AssertionError(
                    f"not ready in {timeout:g} s (exit code {self.proc.returncode})"
                )
            time.sleep(0.01)

    def children(self) -> list[int]:
        """Pids of kevload's live child processes."""
        return [pid for pid, ppid, _, _ in processes() if ppid == self.proc.pid]

    def end(self, timeout: float) -> Ended:
        """Wait for kevload to exit, at most ``timeout`` seconds; then kill whatever is left of its
        group."""
        try:
            stdout, stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.pgid, signal.SIGKILL)
            stdout, stderr = self.proc.communicate()
            raise AssertionError(
                f"still running after {timeout:g} s, killed; stderr:\n{stderr[-2000:]}"
            ) from None
        # multiprocessing's resource tracker ends when it sees kevload's end: a moment, not a
        # leftover.
        deadline = time.monotonic() + 2.0
        while (left := group_members(self.pgid)) and time.monotonic() < deadline:
            time.sleep(0.02)
        if left:
            os.killpg(self.pgid, signal.SIGKILL)
        return Ended(self.proc.returncode, stdout, stderr, left)

    def __enter__(self) -> Kevload:
        return self

    def __exit__(self, *exc: object) -> None:
        if group_members(self.pgid) or self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
            self.proc.wait(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            pipe.close()


def group_members(pgid: int) -> list[str]:
    """Live (not zombie) processes of process group ``pgid``, as ``pid: cmdline``."""
    return [f"{pid}: {cmdline}" for pid, _, group, cmdline in processes() if group == pgid]


def processes() -> list[tuple[int, int, int, str]]:
    """Live (not zombie) processes of this host as (pid, parent pid, process group, the start of the
    cmdline)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
            )
        except OSError:
            continue
        # Fields after the command's name, which is in parentheses and may hold spaces.
        state, ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if state != "Z":
            found.append((int(entry.name), int(ppid), int(pgrp), cmdline))
    return found


def _limit_memory(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def holder(parent: int, path: Path) -> int:
    """The child of ``parent`` that has ``path`` open (a worker and its records file)."""
    for pid, ppid, _, _ in processes():
        if ppid == parent:
            with contextlib.suppress(OSError):
                if any(
                    os.path.realpath(fd) == str(path.resolve())
                    for fd in Path(f"/proc/{pid}/fd").iterdir()
                ):
                    return pid
    raise AssertionError(f"no child of {parent} has {path} open")
