"""Ray, imported only when asked for (``--ray ADDRESS``): connect to a cluster, or start one on this
host.

kevload itself never imports Ray at module level; everything that uses it goes through ``connect``,
which says how to install it when it is missing.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kevload.errors import InputError

LOCAL = "local"  # start a Ray instance on this machine for the run, stopped with it
# the cluster this machine already belongs to (RAY_ADDRESS or the one `ray start` left)
AUTO = "auto"
_REACH_S = 5.0


def import_ray(option: str = "--ray") -> Any:
    """The ``ray`` module, or an ``InputError`` naming the option and the extra that installs it."""
    try:
        import ray
    except ImportError as exc:
        raise InputError(
            f"{option} needs Ray, which is not installed: pip install 'kevload[ray]' ({exc})"
        ) from None
    return ray


@contextmanager
def connect(address: str, option: str = "--ray") -> Iterator[Any]:
    """Connected to the cluster at ``address`` (``local``, ``auto`` or ``host:port``) for the block;
    yields ``ray``.

    ``local`` starts a Ray instance with this machine's cores and stops it at the end; otherwise the
    cluster keeps running and only this driver disconnects.
    """
    ray = import_ray(option)
    if not address:
        raise InputError(f"{option}: expected 'local', 'auto' or a cluster address host:port")
    # This kevload travels with the job (py_modules): every node runs the driver's code, whatever
    # kevload it has installed, so the objects driver and actors pickle between them match.
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "configure_logging": False,
        "runtime_env": {"py_modules": [str(Path(__file__).resolve().parents[1])]},
    }
    if address == LOCAL:
        kwargs["num_cpus"] = os.cpu_count() or 1
    else:
        kwargs["address"] = address
        if address != AUTO:
            _reachable(address, option)  # ray.init retries an unreachable address for minutes
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise InputError(
            f"{option} {address}: cannot connect to a Ray cluster there ({_first_line(exc)})"
        ) from None
    finally:
        # ray.init installs a SIGTERM handler that exits at once; kevload's own (a stop that keeps
        # what was collected, exit 143) stays.
        if sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)
    try:
        yield ray
    finally:
        ray.shutdown()


def _reachable(address: str, option: str) -> None:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if (
        not host or not port.isdigit() or not 1 <= int(port) <= 65535
    ):  # socket raises OverflowError past 65535
        raise InputError(
            f"{option} {address}: expected 'local', 'auto' or a cluster address host:port "
            "(a port from 1 to 65535)"
        )
    try:
        socket.create_connection((host, int(port)), timeout=_REACH_S).close()
    except OSError as exc:
        raise InputError(
            f"{option} {address}: no Ray cluster answers there ({exc.strerror or exc})"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
