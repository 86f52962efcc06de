"""A Ray cluster on this host for tests: a head and optional extra nodes, each `ray start --block`
with its own temp dir, stopped with SIGTERM; afterwards no process of the cluster may remain."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
_START_S = 60.0


@contextmanager
def ray_cluster(
    tmp: Path, *, nodes: int = 1, cpus: int = 1, resources: list[dict] | None = None
) -> Iterator[str]:
    """Yields the head's address; ``resources[i]`` are node i's custom resources (node 0 is the
    head)."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []
    dirs = []
    try:
        for node in range(nodes):
            temp = tmp / f"ray{node}"
            dirs.append(str(temp))
            where = (
                ["--head", "--port", str(port), "--include-dashboard", "false"]
                if node == 0
                else ["--address", address]
            )
            extra = (resources or [])[node] if node < len(resources or []) else {}
            # The process owns the log until it ends.
            log = open(tmp / f"ray{node}.log", "wb")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [
                        RAY,
                        "start",
                        "--block",
                        *where,
                        "--node-ip-address",
                        "127.0.0.1",
                        "--num-cpus",
                        str(cpus),
                        "--temp-dir",
                        str(temp),
                        "--disable-usage-stats",
                        "--resources",
                        json.dumps(extra),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, "RAY_AUTH_MODE": "disabled"},
                )
            )
            _wait_for_nodes(address, node + 1, procs, tmp)
        yield address
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        _assert_gone(dirs)


def ray_processes(markers: list[str]) -> list[str]:
    """Command lines of live processes that mention any of ``markers`` (a cluster's temp dirs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(") ", 1)[1][:1]
        except OSError:
            continue
        if state != "Z" and any(marker in cmdline for marker in markers):
            found.append(f"{entry.name}: {cmdline[:160]}")
    return found


def _assert_gone(dirs: list[str]) -> None:
    deadline = time.monotonic() + 15
    while (left := ray_processes(dirs)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, "Ray processes left behind:\n" + "\n".join(left)


def _wait_for_nodes(address: str, count: int, procs: list[subprocess.Popen], tmp: Path) -> None:
    probe = (
        "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
        "print(sum(1 for n in ray.nodes() if n['Alive']))"
    )
    deadline = time.monotonic() + _START_S
    while time.monotonic() < deadline:
        for node, proc in enumerate(procs):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"ray node {node} exited: {(tmp / f'ray{node}.log').read_text()[-2000:]}"
                )
        done = subprocess.run(
            [sys.executable, "-c", probe, address],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        )
        if done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(1)
    raise RuntimeError(f"ray cluster at {address} did not reach {count} nodes in {_START_S:.0f} s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
