"""`kevload sweep --ray`: server settings as Ray tasks on a real local cluster, the same matrix as
the sequential sweep, a failed setting failing only its rows, Ctrl-C keeping finished rows and
leaving no server."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kevload.servers.processes import pid_alive
from tests.conftest import run_cli, write_scenario
from tests.raycluster import ray_cluster
from tests.servers.test_sweep import sick_server

ROOT = Path(__file__).resolve().parents[2]
# The fake server from any working directory: a Ray task does not run in this checkout.
SERVE = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.fakeserver import main; main()"
FAKE = f"{sys.executable} -c {shlex.quote(SERVE)} --port {{port}} --latency 0.02"
# Set before the cluster starts, so its workers have it; KEVLOAD_RAY_DRIVER_ONLY is set later, on
# the driver only.
NODE_KEY = "KEVLOAD_RAY_NODE_KEY"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", NODE_KEY)}
    os.environ.update({"RAY_AUTH_MODE": "disabled", NODE_KEY: "fake-key"})
    try:
        with ray_cluster(tmp_path_factory.mktemp("ray"), nodes=1, cpus=2) as address:
            yield address
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _cells(sweep: dict) -> list[tuple]:
    """What the matrix says, without timings or paths."""
    return [
        (
            r["setting"],
            r["server"],
            r["scenario"],
            r["verdict"],
            [
                (c["probe"], c["mode"], c["level"], c["ok"], c["distinct"], c["drift"], c["errors"])
                for c in r["cells"]
            ],
        )
        for r in sweep["rows"]
    ]


def test_ray_sweep_gives_the_sequential_matrix(tmp_path, cluster):
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1, 4], samples=4
    )
    grid = ["--grid", "drift=3,99", "--grid", "load.stream=false,true"]
    cmd = FAKE + " --drift-at {drift}"
    code_seq, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, *grid, "--out", tmp_path / "seq"
    )
    assert code_seq == 1, output
    code_ray, output = run_cli(
        "sweep",
        scenario,
        "--server-cmd",
        cmd,
        *grid,
        "--out",
        tmp_path / "ray",
        "--ray",
        cluster,
        "--resources",
        '{"CPU": 1}',
    )
    assert code_ray == code_seq, output
    seq = json.loads((tmp_path / "seq" / "sweep.json").read_text())
    ray = json.loads((tmp_path / "ray" / "sweep.json").read_text())
    assert _cells(ray) == _cells(seq)
    assert ray["levels"] == seq["levels"] == ["c=1", "c=4"] and ray["complete"]
    drift = {r["setting"]: {c["level"]: c["drift"] for c in r["cells"]} for r in ray["rows"]}
    assert drift["drift=3,load.stream=False"] == {
        "c=1": False,
        "c=4": True,
    }  # the matrix says something
    assert drift["drift=99,load.stream=True"] == {"c=1": False, "c=4": False}

    # The markdown too, but for requests/s and latencies.
    def rates(path):
        return re.sub(r" · ([0-9.]+/s|p50 [0-9]+ ms)", "", (path / "sweep.md").read_text())

    assert rates(tmp_path / "ray") == rates(tmp_path / "seq")
    # Each run where the sequential sweep puts it, complete, readable by `report`; each row says
    # where it ran.
    for row in ray["rows"]:
        run = Path(row["run"])
        assert run.parent == tmp_path / "ray"
        assert {"records.jsonl", "run.json", "summary.json"} <= {p.name for p in run.iterdir()}
        assert json.loads((run / "run.json").read_text())["target"]["base_url"].startswith(
            "http://127.0.0.1:"
        )
        assert row["node"]["host"] == socket.gethostname() and len(row["node"]["id"]) == 56
        code, text = run_cli("report", run, "--format", "markdown")
        assert (code, "c=4" in text) == (
            run_cli("report", tmp_path / "seq" / run.name, "--format", "json")[0],
            True,
        )
    assert sorted(p.name for p in (tmp_path / "ray").glob("server-*.log")) == sorted(
        p.name for p in (tmp_path / "seq").glob("server-*.log")
    )


def test_a_failed_setting_fails_only_its_rows(tmp_path, cluster, monkeypatch):
    # drift=oops: the server exits at start (argparse wants an int). KEVLOAD_RAY_DRIVER_ONLY: the
    # key is not on the node, so that run fails there; the setting's next run still gets its turn on
    # the same server.
    monkeypatch.setenv("KEVLOAD_RAY_DRIVER_ONLY", "fake-key")
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1, 2], samples=2
    )
    code, output = run_cli(
        "sweep",
        scenario,
        "--server-cmd",
        FAKE + " --drift-at {drift}",
        "--grid",
        "drift=oops,99",
        "--grid",
        f"target.api_key_env=KEVLOAD_RAY_DRIVER_ONLY,{NODE_KEY}",
        "--out",
        tmp_path / "sw",
        "--ray",
        cluster,
    )
    assert code == 3, output
    assert "Traceback" not in output
    sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    rows = {r["setting"]: r for r in sweep["rows"]}
    assert list(rows) == [
        f"drift=oops,target.api_key_env={key}" for key in ("KEVLOAD_RAY_DRIVER_ONLY", NODE_KEY)
    ] + [f"drift=99,target.api_key_env={key}" for key in ("KEVLOAD_RAY_DRIVER_ONLY", NODE_KEY)]
    for key in ("KEVLOAD_RAY_DRIVER_ONLY", NODE_KEY):
        failed = rows[f"drift=oops,target.api_key_env={key}"]
        assert (
            failed["verdict"] == "target_failed" and failed["cells"] == [] and failed["run"] is None
        )
        assert (
            failed["error"].startswith("server exited while starting")
            and "invalid int value" in failed["error"]
        )
    missing = rows["drift=99,target.api_key_env=KEVLOAD_RAY_DRIVER_ONLY"]
    assert missing["verdict"] == "target_failed" and missing["cells"] == []
    assert "environment variable KEVLOAD_RAY_DRIVER_ONLY is not set" in missing["error"]
    ok = rows[f"drift=99,target.api_key_env={NODE_KEY}"]
    assert ok["verdict"] == "deterministic" and [c["ok"] for c in ok["cells"]] == [2, 2]
    md = (tmp_path / "sw" / "sweep.md").read_text()
    assert (
        f"| drift=oops,target.api_key_env={NODE_KEY} | failed: server exited while starting" in md
    )
    assert "invalid int value" in (tmp_path / "sw" / "server-drift=oops.log").read_text()


def test_a_server_failed_by_the_end_of_a_run_or_never_ready_fails_as_in_the_sequential_sweep(
    tmp_path, cluster
):
    # n=R: the server exits right after its first run's last answer; n=-1: it never gets ready (2 s
    # allowed).
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=4
    )
    cmd, requests = sick_server(tmp_path, scenario)
    grid = [
        "--grid",
        f"n={requests},-1,100000",
        "--grid",
        "load.samples=4,2",
        "--ready-timeout",
        "2",
    ]
    code_seq, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, *grid, "--out", tmp_path / "seq"
    )
    code_ray, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, *grid, "--out", tmp_path / "ray", "--ray", cluster
    )
    assert code_ray == code_seq == 3, output
    rows = json.loads((tmp_path / "ray" / "sweep.json").read_text())["rows"]
    seq = json.loads((tmp_path / "seq" / "sweep.json").read_text())["rows"]
    verdicts = [(r["setting"], r["verdict"], r.get("run_verdict")) for r in rows]
    assert verdicts == [(r["setting"], r["verdict"], r.get("run_verdict")) for r in seq]
    assert verdicts == [
        (f"n={requests},load.samples=4", "target_failed", "deterministic"),
        (f"n={requests},load.samples=2", "not_run", None),
        ("n=-1,load.samples=4", "target_failed", None),
        ("n=-1,load.samples=2", "target_failed", None),
        ("n=100000,load.samples=4", "deterministic", None),
        ("n=100000,load.samples=2", "deterministic", None),
    ]
    assert rows[0]["error"].startswith("the server exited during the run")
    assert rows[1]["reason"].startswith(f"the server exited during n={requests},load.samples=4")
    assert (
        rows[2]["error"].startswith("server not ready at http://127.0.0.1:")
        and "after 2 s" in rows[2]["error"]
    )


def test_resources_no_node_has_are_refused_before_anything_starts(tmp_path, cluster):
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=2
    )
    started = time.monotonic()
    code, output = run_cli(
        "sweep",
        scenario,
        "--server-cmd",
        FAKE + " --drift-at {drift}",
        "--grid",
        "drift=3",
        "--out",
        tmp_path / "sw",
        "--ray",
        cluster,
        "--resources",
        '{"GPU": 1}',
    )
    assert code == 2 and "Traceback" not in output
    assert "--resources: no node of the Ray cluster has GPU: 1 (the most one node has: 0)" in output
    assert time.monotonic() - started < 60  # not a task pending forever
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ray", "auto", "--resources", "{GPU: 1}"], "--resources '{GPU: 1}': not JSON"),
        (
            ["--ray", "auto", "--resources", '{"GPU": "one"}'],
            "expected a JSON object of resource amounts",
        ),
        (["--resources", '{"GPU": 1}'], "--resources: only with --ray"),
    ],
)
def test_bad_resources_are_named(tmp_path, args, message):
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    code, output = run_cli(
        "sweep", scenario, "--server-cmd", FAKE + " --drift-at {drift}", "--grid", "drift=3", *args
    )
    assert code == 2 and message in output and output.count("\n") == 1


@pytest.mark.parametrize(
    "args", [["--grid", "load.mode=single,mixed"], ["--target", "llamacpp", "--grid", "slots=1,2"]]
)
def test_ray_without_a_server_cmd_is_refused(tmp_path, args):
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    code, output = run_cli("sweep", scenario, *args, "--ray", "auto")
    assert code == 2 and "--ray needs --server-cmd" in output


def _script(path: Path, body: str) -> Path:
    path.write_text(
        textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
    """)
        + textwrap.dedent(body)
    )
    return path


def test_ctrl_c_keeps_finished_rows_and_stops_every_server(tmp_path, cluster):
    # kind=fast serves at once; kind=hang never gets ready, so Ctrl-C lands while its task waits for
    # it. Both run under a shell, as launch scripts do: the server is a grandchild, which only
    # stopping its group ends (Ray, killing a task's worker, ends the worker's children only).
    pid_file = tmp_path / "hang.pid"
    script = _script(
        tmp_path / "srv.py",
        f"""
        port, kind = sys.argv[1:3]
        if kind == "hang":
            Path({str(pid_file)!r}).write_text(str(os.getpid()))
            time.sleep(300)
        from tests.fakeserver import main
        sys.argv = [sys.argv[0], "--port", port, "--latency", "0.01"]
        main()
    """,
    )
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=2
    )
    cmd = f"sh -c '{sys.executable} {script} {{port}} {{kind}}; exit $?'"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kevload",
            "sweep",
            str(scenario),
            "--server-cmd",
            cmd,
            "--grid",
            "kind=fast,hang",
            "--out",
            str(tmp_path / "sw"),
            "--ray",
            cluster,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    hang_pid = None
    try:
        lines = []
        for line in proc.stderr:  # progress: the fast setting's verdict line says its row is in
            lines.append(line)
            if line.strip().startswith("kind=fast"):
                break
        assert lines and lines[-1].strip().startswith("kind=fast"), "".join(lines)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (pid_file.exists() and pid_file.read_text()):
            time.sleep(0.1)
        hang_pid = int(pid_file.read_text())
        assert pid_alive(hang_pid)
        os.kill(proc.pid, signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
        assert proc.returncode == 130, rest
        assert "Traceback" not in rest
        assert not pid_alive(
            hang_pid
        )  # its task stopped it before the driver let go of the cluster
        sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
        assert [(r["setting"], r["verdict"]) for r in sweep["rows"]] == [
            ("kind=fast", "deterministic"),
            ("kind=hang", "not_run"),
        ]
        assert (
            sweep["rows"][1]["reason"].startswith("the sweep was stopped") and not sweep["complete"]
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if hang_pid is not None and pid_alive(hang_pid):
            os.kill(hang_pid, signal.SIGKILL)  # not a group leader: the shell is


@pytest.mark.e2e
def test_two_nodes_run_two_settings_side_by_side(tmp_path, tmp_path_factory, monkeypatch):
    # Each server gets ready only once the other one runs too: settings run one after another would
    # never get there (the script gives up after 90 s), so two ok rows prove they ran at the same
    # time.
    script = _script(
        tmp_path / "srv.py",
        f"""
        port, name = sys.argv[1:3]
        Path({str(tmp_path)!r}, "up-" + name).touch()
        deadline = time.monotonic() + 90
        while len(list(Path({str(tmp_path)!r}).glob("up-*"))) < 2:
            if time.monotonic() > deadline:
                sys.exit("the other setting's server never started")
            time.sleep(0.1)
        from tests.fakeserver import main
        sys.argv = [sys.argv[0], "--port", port, "--latency", "0.02"]
        main()
    """,
    )
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1, 2], samples=4
    )
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    # A short temp dir: Ray's sockets live under it, and a Unix socket path has at most 107 bytes.
    with ray_cluster(
        tmp_path_factory.mktemp("ray"), nodes=2, cpus=1, resources=[{"slot": 1}, {"slot": 1}]
    ) as address:
        code, output = run_cli(
            "sweep",
            scenario,
            "--server-cmd",
            f"{sys.executable} {script} {{port}} {{name}}",
            "--grid",
            "name=a,b",
            "--out",
            tmp_path / "sw",
            "--ray",
            address,
            "--resources",
            '{"slot": 1}',
        )
    assert code == 0, output
    rows = json.loads((tmp_path / "sw" / "sweep.json").read_text())["rows"]
    assert [r["verdict"] for r in rows] == ["deterministic", "deterministic"]
    assert rows[0]["node"]["id"] != rows[1]["node"]["id"]  # one slot a node: one setting each
    # The servers overlapped (the gate above); the short runs themselves need not, one node may
    # start later.
    assert all(start < end for start, end in (r["ran"] for r in rows))
