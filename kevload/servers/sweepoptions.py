"""What ``kevload sweep``'s options mean together: which server each setting runs against
(--server-cmd or --target), what --reference's gate options need, and where the settings run (here,
or with --ray as Ray tasks)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kevload.errors import InputError

if TYPE_CHECKING:
    from kevload.servers.sweepgrid import Grid


def check_servers(grid: Grid, server_cmd: str | None, builtin: str | None) -> None:
    """One way to start each setting's server, and one where --grid has server axes."""
    if server_cmd is not None and builtin is not None:
        raise InputError("give one of --server-cmd or --target, not both")
    if grid.server and server_cmd is None and builtin is None:
        raise InputError("server axes in --grid need exactly one of --server-cmd or --target")


def check_gate_options(*, alpha: float, min_agreement: str | None, fail_on: str) -> None:
    """Without --reference there is no gate: its options, given, would be dropped without a word."""
    if min_agreement is not None or fail_on != "drift" or alpha != 0.05:
        raise InputError("--alpha, --min-agreement and --fail-on: only with --reference")


@contextlib.contextmanager
def ray_sweep(address: str | None, resources: str | None, server_cmd: str | None) -> Iterator[Any]:
    """With --ray: connected to the cluster for the sweep, the runner that sends each server setting
    there; without it, None (the sweep runs here)."""
    if address is None:
        if resources is not None:
            raise InputError("--resources: only with --ray")
        yield None
        return
    if server_cmd is None:
        # Settings sharing one target would load it at the same time: no level would keep its
        # "exactly c in flight", and the matrix would not be the sequential sweep's.
        raise InputError(
            "--ray needs --server-cmd: each setting's task starts its own server on its node; "
            "settings sharing one target would load it at the same time"
        )
    from kevload.load.cluster import connect
    from kevload.servers.raysweep import parse_resources, ray_rows

    wanted = parse_resources(resources or "{}")
    with connect(address) as ray:
        yield functools.partial(ray_rows, ray, wanted)
