"""`kevload sweep --ray`: each server setting is a Ray task on a node that has the asked resources.
The task starts the server there on 127.0.0.1, runs the setting's scenarios against it into a
node-local directory, stops the server however it ends, and returns that directory's files; the
driver writes them where the sequential sweep writes each run, so the matrix, `report` and baselines
read them unchanged.

Ray is never imported here: the driver passes the module in (``kevload.load.cluster.connect``), and
the task runs in a Ray worker, which has it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

from kevload.errors import InputError, KevloadError
from kevload.inputs.scenario import Scenario
from kevload.load.runs import refuse_existing, run_scenario
from kevload.records.rundir import RunDir
from kevload.servers.processes import free_port, start_server, trouble, wait_ready
from kevload.servers.sweep import READY_TIMEOUT_S
from kevload.servers.sweepfile import failed_row, not_run_row, server_failed, setting_row
from kevload.servers.sweepgrid import Grid, _fill, combinations, label, server_argv

READY_URL = "http://127.0.0.1:{port}/health"  # as the sequential sweep's default
POLL_S = 0.5  # how often a running task asks whether the sweep was stopped
# Ray's names for the amounts ray.remote takes as keywords; any other name is a custom resource.
KEYWORDS = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}
EXAMPLE = (
    """expected a JSON object of resource amounts, e.g. '{"GPU": 1}' or '{"CPU": 4, "slot": 1}'"""
)


def parse_resources(text: str) -> dict[str, float]:
    """``--resources`` JSON → resource amounts each setting's task needs on its node."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"--resources {text!r}: not JSON ({exc.msg}); {EXAMPLE}") from None
    if not isinstance(value, dict) or not all(
        isinstance(amount, int | float) and not isinstance(amount, bool) and amount >= 0
        for amount in value.values()
    ):
        raise InputError(f"--resources {text!r}: {EXAMPLE}")
    return {name: float(amount) for name, amount in value.items()}


def task_options(resources: dict[str, float]) -> dict[str, Any]:
    options: dict[str, Any] = {
        KEYWORDS[name]: amount for name, amount in resources.items() if name in KEYWORDS
    }
    custom = {name: amount for name, amount in resources.items() if name not in KEYWORDS}
    return {**options, "resources": custom} if custom else options


def check_capacity(ray: Any, resources: dict[str, float]) -> None:
    """Refuse, before anything starts, resources that no node of the cluster has: Ray would keep
    such a task pending forever. (A cluster that an autoscaler grows is judged by the nodes it has
    now.)"""
    wanted = {"CPU": 1.0, **resources}  # a Ray task takes one CPU unless told otherwise
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    if any(all(node.get(name, 0) >= amount for name, amount in wanted.items()) for node in nodes):
        return
    for name, amount in wanted.items():
        most = max((node.get(name, 0) for node in nodes), default=0)
        if most < amount:
            raise InputError(
                f"--resources: no node of the Ray cluster has {name}: {amount:g} (the most one "
                f"node "
                f"has: {most:g}); nothing was started"
            )
    raise InputError(
        f"--resources: no single node of the Ray cluster has all of {json.dumps(resources)}; "
        "nothing was started"
    )


class Gate:
    """The sweep's stop switch, a Ray actor: a task begins only while the sweep runs, and stopping
    tells the driver which tasks began, so it waits for exactly those to stop their server and
    cancels the rest."""

    def __init__(self) -> None:
        self.stopped = False
        self.begun: set[int] = set()

    def begin(self, index: int) -> bool:
        if not self.stopped:
            self.begun.add(index)
        return not self.stopped

    def stop(self) -> list[int]:
        self.stopped = True
        return sorted(self.begun)

    def is_stopped(self) -> bool:
        return self.stopped


async def ray_rows(
    ray: Any,
    resources: dict[str, float],
    base: Scenario,
    grid: Grid,
    *,
    out: Path,
    server_cmd: str | None,
    ready_url: str | None,
    ready_timeout: float | None,
    stop: asyncio.Event,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """The sweep's rows, each server setting run as a Ray task; in the grid's order, however they
    finish (a setting stopped before it began has none: the sweep gives it its ``not_run`` row)."""
    check_capacity(ray, resources)
    settings = combinations(grid.server)
    combos = combinations(grid.scenario)
    dirs, logs = grid.run_dirs(), grid.server_logs()
    runs = _setting_runs(base, settings, combos)
    for name, _ in (run for setting_runs in runs for run in setting_runs):
        refuse_existing(out / dirs[name], hint="give the sweep a fresh --out")
    gate = ray.remote(num_cpus=0)(Gate).remote()
    task = ray.remote(run_setting).options(
        max_retries=0, **task_options(resources)
    )  # cluster.connect ships kevload
    refs = [
        task.remote(
            i, setting, runs[i], server_cmd, ready_url, ready_timeout or READY_TIMEOUT_S, gate
        )
        for i, setting in enumerate(settings)
    ]
    written = functools.partial(_rows, out, dirs, logs, combos, log=log)
    log(
        f"{len(refs)} server setting(s) sent to the Ray cluster, each on a node with "
        f"{json.dumps(resources) if resources else 'one CPU'} free …"
    )
    rows = await _gathered(ray, refs, gate, stop, lambda i, outcome: written(settings[i], outcome))
    return [row for i in sorted(rows) for row in rows[i]]


def _setting_runs(
    base: Scenario, settings: list[dict[str, Any]], combos: list[dict[str, Any]]
) -> list[list[tuple[str, Scenario]]]:
    """Each server setting's runs, named as the sweep names them: one per scenario combination."""
    # Scenarios are built here, datasets included: the nodes need neither the scenario file nor its
    # datasets.
    return [
        [
            (label({**setting, **combo}), base.with_settings(combo, source="--grid"))
            for combo in combos
        ]
        for setting in settings
    ]


_Written = Callable[[int, dict[str, Any]], list[dict[str, Any]]]  # a setting's task outcome → rows


async def _gathered(
    ray: Any, refs: list[Any], gate: Any, stop: asyncio.Event, written: _Written
) -> dict[int, list[dict[str, Any]]]:
    """Each setting's rows, written as its task ends, by its index; at a stop (or a failure here),
    what ``_stopped`` leaves."""
    waiting = {asyncio.wrap_future(ref.future()): i for i, ref in enumerate(refs)}
    rows: dict[int, list[dict[str, Any]]] = {}
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while waiting and not stop.is_set():
            done, _ = await asyncio.wait([*waiting, stopped], return_when=asyncio.FIRST_COMPLETED)
            for future in done - {stopped}:
                i = waiting.pop(future)
                rows[i] = written(i, _outcome(future))
    finally:
        stopped.cancel()
        if (
            waiting
        ):  # stopped (or failed here): no setting begins any more; those running stop and return
            rows.update(await _stopped(ray, refs, gate, waiting, written))
    return rows


async def _stopped(
    ray: Any,
    refs: list[Any],
    gate: Any,
    waiting: dict[asyncio.Future[dict[str, Any]], int],
    written: _Written,
) -> dict[int, list[dict[str, Any]]]:
    """The rows of the settings whose tasks began before the gate closed, once each has stopped its
    server; the tasks of the others are cancelled (their settings get no rows here)."""
    begun = set(await asyncio.wrap_future(gate.stop.remote().future()))
    for future, i in waiting.items():
        if i not in begun:
            ray.cancel(refs[i])
            future.add_done_callback(_outcome)  # its TaskCancelledError, read so nobody warns of it
    rows: dict[int, list[dict[str, Any]]] = {}
    for future, i in waiting.items():
        if i in begun:
            await asyncio.wait([future])
            rows[i] = written(i, _outcome(future))
    return rows


def _outcome(future: asyncio.Future[dict[str, Any]]) -> dict[str, Any]:
    """A task's result; a task that died (its worker or node lost) fails its setting like a server
    that did."""
    # Ray's errors for a lost task are many: any of them fails only this setting.
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001
        return {"error": f"the Ray task failed: {_first_line(exc)}", "runs": []}


def _rows(
    out: Path,
    dirs: dict[str, str],
    logs: dict[str, str],
    combos: list[dict[str, Any]],
    setting: dict[str, Any],
    outcome: dict[str, Any],
    *,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Write what the task returned into the sweep directory and make its rows, by the sequential
    sweep's rules: a failed run, or a server that did not start, a failed row; a server that failed
    by the end of a run fails that row, and the setting's later runs are ``not_run``."""
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / logs[label(setting)]
    if "server_log" in outcome:
        log_path.write_bytes(outcome["server_log"])
    node = outcome.get("node")
    where = f" on {node['host']} (node {node['id'][:8]})" if node else ""
    by_name = {run["name"]: run for run in outcome["runs"]}
    rows = []
    gone = None  # why the server could no longer serve, and during which run
    for combo in combos:
        name = label({**setting, **combo})
        run = by_name.get(name)
        if gone is not None:
            row = not_run_row(setting, combo, gone)
        elif run is None and not outcome.get("error"):
            continue  # stopped before this run began: the sweep gives it its not_run row
        else:
            run_dir = out / dirs[name]
            for relative, data in (run or {}).get("files", {}).items():
                (run_dir / relative).parent.mkdir(parents=True, exist_ok=True)
                (run_dir / relative).write_bytes(data)
            error = (run or {}).get("error") or (None if run else outcome["error"])
            if error is not None:
                row = {
                    **failed_row(setting, combo, error),
                    "run": str(run_dir) if (run or {}).get("files") else None,
                }
            else:
                row = setting_row(name, setting, combo, run_dir, RunDir(run_dir).summary())
            if run is not None and run.get("server") is not None:
                row = server_failed(
                    row, f"the server {run['server']} during the run (its log: {log_path})"
                )
                gone = f"the server {run['server']} during {name} (its log: {log_path})"
        row = {**row, **({"node": node} if node else {}), **({"ran": run["ran"]} if run else {})}
        log(
            f"  {name}{where}: {row['verdict_line']}"
            + ("" if not row.get("error") else "\n" + row["error"])
        )
        rows.append(row)
    return rows


def run_setting(
    index: int,
    setting: dict[str, Any],
    runs: list[tuple[str, Scenario]],
    server_cmd: str,
    ready_url: str | None,
    ready_timeout: float,
    gate: Any,
) -> dict[str, Any]:
    """The Ray task (runs on the node): one server setting, its scenarios in order, the server
    stopped at the end however it ends; returns the runs' files, the server's log and where it
    ran."""
    import ray

    node = {"id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname()}
    if not ray.get(gate.begin.remote(index)):
        return {"node": node, "runs": []}  # the sweep was stopped before this setting began
    with (
        tempfile.TemporaryDirectory(prefix="kevload-sweep-") as tmp,
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
    ):
        outcome = runner.run(
            _on_node(setting, runs, server_cmd, ready_url, ready_timeout, gate, Path(tmp))
        )
        log = Path(tmp) / "server.log"
        return {**outcome, "node": node, "server_log": log.read_bytes() if log.is_file() else b""}


async def _on_node(
    setting: dict[str, Any],
    runs: list[tuple[str, Scenario]],
    server_cmd: str,
    ready_url: str | None,
    ready_timeout: float,
    gate: Any,
    tmp: Path,
) -> dict[str, Any]:
    stop = asyncio.Event()
    watch = asyncio.ensure_future(_watch(gate, stop))
    done: list[dict[str, Any]] = []
    try:
        port = free_port()
        values = {**setting, "port": port}
        argv = server_argv(server_cmd, values)
        try:
            server = start_server(argv, tmp / "server.log")
        except OSError as exc:
            raise InputError(
                f"--server-cmd: cannot run {argv[0]!r}: {exc.strerror or exc}"
            ) from None
        try:
            url = _fill(ready_url or READY_URL, values)
            wait = functools.partial(
                wait_ready, server, url, timeout=ready_timeout, cancelled=stop.is_set
            )
            if not await asyncio.get_running_loop().run_in_executor(None, wait):
                return {"runs": done}  # stopped while the server was starting
            for k, (name, scenario) in enumerate(runs):
                if stop.is_set():
                    break
                pointed = _pointed_at(scenario, f"http://127.0.0.1:{port}/v1")
                done.append(await _run(name, pointed, tmp / f"run-{k}", stop))
                # As in the sequential sweep: a server gone by the end of a run fails it, and ends
                # the setting.
                done[-1]["server"] = await asyncio.to_thread(trouble, server.pid, url)
                if done[-1]["server"] is not None:
                    break
        finally:
            server.stop()
    except KevloadError as exc:  # the server did not start: every run of this setting fails
        return {"runs": done, "error": str(exc)}
    finally:
        watch.cancel()
    return {"runs": done}


async def _run(name: str, scenario: Scenario, run_dir: Path, stop: asyncio.Event) -> dict[str, Any]:
    """One scenario run on the node (its files go back under the driver's name for it, so here it is
    numbered); a run that fails is a failed row, and the next run still gets its turn."""
    started = time.time()
    error = None
    # Any failure of one run fails only its row, with its message.
    try:
        await run_scenario(scenario, run_dir, stop=stop)
    except Exception as exc:  # noqa: BLE001
        error = (
            f"the run failed: {_first_line(exc)}" if not isinstance(exc, KevloadError) else str(exc)
        )
    files = (
        {
            str(p.relative_to(run_dir)): p.read_bytes()
            for p in sorted(run_dir.rglob("*"))
            if p.is_file()
        }
        if run_dir.is_dir()
        else {}
    )
    return {"name": name, "files": files, "ran": [started, time.time()], "error": error}


async def _watch(gate: Any, stop: asyncio.Event) -> None:
    while not await asyncio.wrap_future(gate.is_stopped.remote().future()):
        await asyncio.sleep(POLL_S)
    stop.set()


def _pointed_at(scenario: Scenario, base_url: str) -> Scenario:
    """The scenario against the node's server, set as a typed key: no file on the driver's machine
    is reread."""
    return scenario.with_settings({"target.base_url": base_url}, source="sweep")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
