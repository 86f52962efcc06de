"""Sweeps: restart a server per setting, sweep scenario keys without restarts, one matrix out."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kevload.outputs.sweepview import sweep_cell_text
from kevload.records.store import read_records
from kevload.records.summary import row_cells
from kevload.servers.processes import pid_alive, stop_group
from kevload.servers.sweep import READY_TIMEOUT_S
from tests.conftest import run_cli, write_scenario


def test_sweep_server_setting_and_scenario_key(tmp_path):
    # A fake server process that drifts once `drift_at` requests overlap: the swept setting.
    cmd = f"{sys.executable} -m tests.fakeserver --port {{port}} --drift-at {{drift}}"
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1, 4], samples=8
    )
    out = tmp_path / "sweep"
    code, output = run_cli(
        "sweep",
        scenario,
        "--server-cmd",
        cmd,
        "--grid",
        "drift=3,99",
        "--grid",
        "load.mode=single,mixed",
        "--out",
        out,
    )
    assert code == 1, output
    sweep = json.loads((out / "sweep.json").read_text())
    assert [r["setting"] for r in sweep["rows"]] == [
        "drift=3,load.mode=single",
        "drift=3,load.mode=mixed",
        "drift=99,load.mode=single",
        "drift=99,load.mode=mixed",
    ]
    drift = {r["setting"]: {c["level"]: c["drift"] for c in r["cells"]} for r in sweep["rows"]}
    assert drift["drift=3,load.mode=single"] == {"c=1": False, "c=4": True}
    assert drift["drift=99,load.mode=single"] == {"c=1": False, "c=4": False}
    assert sweep["levels"] == ["c=1", "c=4"]
    md = (out / "sweep.md").read_text()
    assert "| drift=3,load.mode=single | p1 (single) |" in md and "DRIFT" in md and "/s" in md
    # Two server settings → two server logs: it was restarted, not reused.
    assert len(list(out.glob("server-*.log"))) == 2


def test_sweep_cells_carry_the_logprob_evidence_of_a_run(tmp_path):
    # The fake server's logprobs (not its text) move once `lp` requests overlap: the setting swept.
    cmd = (
        f"{sys.executable} -m tests.fakeserver --port {{port}} --latency 0.05 "
        "--logprob-drift-at {lp}"
    )
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1, 4], samples=6
    )
    out = tmp_path / "sweep"
    code, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, "--grid", "lp=3,99", "--out", out
    )
    assert code == 0, output  # latent drift is no failure unless asked (run --fail-on latent)
    rows = {row["setting"]: row for row in json.loads((out / "sweep.json").read_text())["rows"]}
    keys = (
        "logprob_samples",
        "logprob_bitwise",
        "logprob_max_abs_diff",
        "first_logprob_divergence_token",
        "latent_drift",
        "agrees_with_serial",
        "latency",
        "requests_per_s",
    )
    for row in rows.values():
        run_cells = {
            c["concurrency"]: c
            for c in json.loads((Path(row["run"]) / "summary.json").read_text())["cells"]
            if c["role"] == "probe"
        }
        for cell in row[
            "cells"
        ]:  # the same evidence, under the same names, as the run's own summary.json
            assert {k: cell[k] for k in keys} == {
                k: run_cells[cell["concurrency"]][k] for k in keys
            }
    cells = {name: {c["level"]: c for c in row["cells"]} for name, row in rows.items()}
    assert (
        cells["lp=3"]["c=4"]["latent_drift"] is True
        and cells["lp=3"]["c=4"]["logprob_bitwise"] is False
    )
    assert (
        cells["lp=3"]["c=1"]["logprob_bitwise"] is True
        and cells["lp=99"]["c=4"]["logprob_bitwise"] is True
    )
    md = (out / "sweep.md").read_text()
    cell = r"[\d.]+/s · p50 \d+ ms"
    assert re.search(rf"\| lp=3 \| p1 \(single\) \| 1 ≡ · {cell} \| 1 ~ · {cell} \|", md), md
    assert re.search(r"\| lp=99 \| p1 \(single\) \| 1 ≡ · .* \| 1 ≡ · ", md), md


def test_scenario_keys_only_need_no_server(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=4)
    code, output = run_cli(
        "sweep", scenario, "--grid", "load.stream=true,false", "--out", tmp_path / "sw"
    )
    assert code == 0, output
    assert len(json.loads((tmp_path / "sw" / "sweep.json").read_text())["rows"]) == 2


def test_bad_grid(tmp_path):
    scenario = write_scenario(tmp_path / "s.toml", "http://127.0.0.1:9/v1")
    code, output = run_cli("sweep", scenario, "--grid", "slots")
    assert code == 2 and "--grid 'slots': expected NAME=V1,V2" in output
    code, output = run_cli("sweep", scenario, "--grid", "slots=1,2")
    assert code == 2 and "--server-cmd or --target" in output


@pytest.mark.e2e
def test_sweep_builtin_llamacpp_slots(tmp_path):
    # A real server on two shared cores: the fake server's 5 s timeout is no bound on its answers.
    scenario = write_scenario(
        tmp_path / "s.toml",
        "http://127.0.0.1:9/v1",
        concurrency=[1, 2],
        samples=4,
        probes=[{"id": "p1", "prompt": "Name a colour.", "max_tokens": 8}],
        target={"timeout": 120},
    )
    code, output = run_cli(
        "sweep", scenario, "--target", "llamacpp", "--grid", "slots=1,2", "--out", tmp_path / "sw"
    )
    sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert [r["server"] for r in sweep["rows"]] == [{"slots": 1}, {"slots": 2}]
    assert all(c["ok"] == 4 for r in sweep["rows"] for c in r["cells"])
    # Whether two slots move the answers is this CPU's to say: each row's cells and the sweep's exit
    # say what the answers its run recorded say (tests/servers/test_e2e_targets.py checks those
    # records against the raw bodies the server sent).
    for row in sweep["rows"]:
        texts: dict[int, set[str]] = {}
        for r in read_records(Path(row["run"]) / "records.jsonl"):
            if r["role"] == "probe" and r["counted"]:
                texts.setdefault(r["concurrency"], set()).add(r["output"])
        assert {c["concurrency"]: c["distinct"] for c in row["cells"]} == {
            c: len(t) for c, t in texts.items()
        }, row
    drifted = any(c["drift"] for r in sweep["rows"] for c in r["cells"])
    assert code == (1 if drifted else 0), output


ROOT = Path(__file__).resolve().parents[2]


def _server_script(tmp_path: Path) -> Path:
    """A server command that records its arguments, then serves the fake server on the port it was
    given."""
    script = tmp_path / "srv.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(ROOT)!r})
        open({str(tmp_path / "argv.json")!r}, "w").write(json.dumps(sys.argv[1:]))
        from tests.fakeserver import main
        sys.argv = [sys.argv[0], "--port", sys.argv[1], "--latency", "0.01"]
        main()
    """)
    )
    return script


def test_server_cmd_without_port_is_refused_at_once(tmp_path):
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=2
    )
    cmd = f"{sys.executable} -m tests.fakeserver --port 8000 --drift-at {{drift}}"
    code, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, "--grid", "drift=3", "--out", tmp_path / "sw"
    )
    assert code == 2 and "Traceback" not in output
    assert "--server-cmd: needs {port}" in output and output.count("\n") == 1
    assert not list((tmp_path / "sw").glob("server-*.log"))  # refused before anything was started


def test_unknown_placeholder_and_unused_axis_are_named(tmp_path):
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=2
    )
    cmd = f"{sys.executable} -m tests.fakeserver --port {{port}} --drift-at {{drift_at}}"
    code, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, "--grid", "drift=3", "--out", tmp_path / "sw"
    )
    assert (
        code == 2
        and "placeholder {drift_at} is neither {port} nor a --grid axis (axes: drift)" in output
    )
    cmd = f"{sys.executable} -m tests.fakeserver --port {{port}}"
    code, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, "--grid", "drift=3,99", "--out", tmp_path / "sw"
    )
    assert code == 2 and "--grid drift: --server-cmd has no {drift}" in output


def test_json_and_spaces_in_the_server_cmd(tmp_path):
    # vLLM takes JSON arguments; a placeholder inside a quoted argument with spaces stays one
    # argument.
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=2
    )
    cmd = (
        f"{sys.executable} {_server_script(tmp_path)} {{port}} "
        """--override-generation-config '{"temperature": 0}' """
        """--tag 'slots {slots} of {"x": {slots}}'"""
    )
    code, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, "--grid", "slots=3", "--out", tmp_path / "sw"
    )
    assert code == 0, output
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[1:] == [
        "--override-generation-config",
        '{"temperature": 0}',
        "--tag",
        'slots 3 of {"x": 3}',
    ]
    assert argv[0].isdigit()  # {port} was filled in


def test_server_exiting_during_start_fails_at_once(tmp_path):
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=2
    )
    script = (
        "import sys; print('loading model.gguf', file=sys.stderr); "
        "print('no such file', file=sys.stderr); sys.exit(3)"
    )
    cmd = f"{sys.executable} -c {shlex.quote(script)} {{port}}"
    started = time.monotonic()
    code, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, "--grid", "load.samples=2", "--out", tmp_path / "sw"
    )
    assert code == 3 and "server exited while starting" in output
    assert "loading model.gguf\nno such file" in output  # its last stderr lines
    assert time.monotonic() - started < READY_TIMEOUT_S / 5  # not the readiness timeout


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_cancel_while_the_server_starts_leaves_no_server(tmp_path, signum, code):
    # A server that never gets ready: it writes its pid and sleeps, so the cancel lands while
    # kevload waits.
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=2
    )
    pid_file = tmp_path / "server.pid"
    script = (
        f"import os, sys, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
        "time.sleep(120)"
    )
    cmd = f"{sys.executable} -c {shlex.quote(script)} {{port}}"
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
            "load.samples=2,3",
            "--out",
            str(tmp_path / "sw"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    server_pid = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (pid_file.exists() and pid_file.read_text()):
            time.sleep(0.05)
        server_pid = int(pid_file.read_text())
        assert pid_alive(server_pid)
        os.kill(proc.pid, signum)
        stdout, stderr = proc.communicate(timeout=30)
        assert proc.returncode == code, stderr
        assert "Traceback" not in stderr
        assert not pid_alive(server_pid)
        # The setting it stopped, and the one it never reached, each have a row that says why.
        sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
        assert [(r["setting"], r["verdict"]) for r in sweep["rows"]] == [
            ("load.samples=2", "not_run"),
            ("load.samples=3", "not_run"),
        ]
        assert all(r["reason"].startswith("the sweep was stopped") for r in sweep["rows"])
        assert "| load.samples=3 | not run: the sweep was stopped" in stdout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if server_pid is not None and pid_alive(server_pid):
            stop_group(server_pid, grace=1)


def test_sweep_quiet_prints_only_verdict_lines(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=2)
    code, output = run_cli(
        "sweep", scenario, "--grid", "load.stream=true,false", "--out", tmp_path / "sw", "--quiet"
    )
    assert code == 0, output
    lines = output.splitlines()
    assert [line.split(": ", 1)[0] for line in lines[:2]] == [
        "load.stream=True",
        "load.stream=False",
    ]
    assert all(line.split(": ", 2)[1] == "deterministic" for line in lines[:2])
    # Then only where the sweep was written (stderr, as `run --quiet` says where its records are):
    # no table.
    assert lines[2].startswith("sweep: ") and "sweep.md" in "".join(lines[2:])
    assert "|" not in output and "running" not in output


# A server whose engine dies at its Nth request: that request and every one after it fail at once.
DYING_SERVER = """
import argparse, asyncio, os
from aiohttp import web
parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int)
parser.add_argument("--die-after", type=int)
args = parser.parse_args()
if args.die_after < 0:
    raise SystemExit("cannot allocate the KV cache")
served = 0
async def chat(request):
    global served
    await request.read()
    served += 1
    if served > args.die_after:
        print(f"engine died after {args.die_after} requests", flush=True)
        os._exit(7)
    await asyncio.sleep(0.05)
    return web.json_response({"id": "x", "object": "chat.completion", "model": "fake", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "same"},
         "finish_reason": "stop"}]})
async def health(request):
    return web.json_response({})
app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
app.router.add_get("/health", health)
web.run_app(app, host="127.0.0.1", port=args.port, print=None)
"""


def test_a_setting_whose_server_dies_mid_run_claims_no_throughput_and_no_row_is_lost(tmp_path):
    (tmp_path / "dying.py").write_text(DYING_SERVER)
    cmd = f"{sys.executable} {tmp_path / 'dying.py'} --port {{port}} --die-after {{n}}"
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1, 4], samples=8
    )
    out = tmp_path / "sw"
    started = time.monotonic()
    code, output = run_cli(
        "sweep",
        scenario,
        "--server-cmd",
        cmd,
        "--grid",
        "n=12,1000",
        "--grid",
        "load.mode=single,mixed",
        "--out",
        out,
    )
    assert code == 3, output
    assert time.monotonic() - started < 60  # never waits for a dead server
    sweep = json.loads((out / "sweep.json").read_text())
    rows = {row["setting"]: row for row in sweep["rows"]}
    # Every setting asked for has its row: the ones the dead server never ran say so, none is
    # silently missing.
    assert list(rows) == [
        "n=12,load.mode=single",
        "n=12,load.mode=mixed",
        "n=1000,load.mode=single",
        "n=1000,load.mode=mixed",
    ]
    assert rows["n=12,load.mode=single"]["verdict"] == "target_failed"
    assert rows["n=12,load.mode=single"]["error"].startswith("the server exited during the run")
    assert (
        rows["n=12,load.mode=mixed"]["verdict"] == "not_run"
        and rows["n=12,load.mode=mixed"]["cells"] == []
    )
    assert (
        "the server exited during n=12,load.mode=single" in rows["n=12,load.mode=mixed"]["reason"]
    )
    assert [rows[f"n=1000,load.mode={m}"]["verdict"] for m in ("single", "mixed")] == [
        "deterministic"
    ] * 2
    # The dead setting's c=4 answered nothing: its cost is no rate at all, however fast its requests
    # failed.
    dead = next(c for c in rows["n=12,load.mode=single"]["cells"] if c["level"] == "c=4")
    assert dead["ok"] == 0 and dead["requests_per_s"] > 0  # sweep.json keeps the run's own field
    line = next(
        line
        for line in (out / "sweep.md").read_text().splitlines()
        if line.startswith("| n=12,load.mode=single | p1 (single) |")
    )
    assert line.split(" | ")[-1].rstrip(" |") == "no ok (0/8)", line
    run_cli("report", out, "--format", "html", "-o", tmp_path / "sweep.html")
    throughput = (tmp_path / "sweep.html").read_text().split("<h2>Throughput</h2>", 1)[1]
    dead_row = throughput.split("n=12,load.mode=single · p1 (single)</td>", 1)[1].split("</tr>", 1)[
        0
    ]
    assert dead_row.endswith("<td>–</td>"), dead_row
    # The page names the failed settings and why, as sweep.md does: the one never run has no cell to
    # show it.
    page = (tmp_path / "sweep.html").read_text()
    assert (
        "n=12,load.mode=mixed" in page
        and "not run: the server exited during n=12,load.mode=single" in page
    )
    # Half answered in a second, half failed at once: 4 answers a second, not the 8 requests.
    half = dataclasses.replace(
        row_cells(rows["n=12,load.mode=single"])[1], ok=4, errors={"connect": 4}, requests_per_s=8.0
    )
    assert sweep_cell_text(half).endswith(" · 4.0/s")


def test_a_server_that_fails_to_start_fails_its_setting_and_the_sweep_goes_on(tmp_path):
    (tmp_path / "dying.py").write_text(DYING_SERVER)
    cmd = f"{sys.executable} {tmp_path / 'dying.py'} --port {{port}} --die-after {{n}}"
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1, 2], samples=3
    )
    code, output = run_cli(
        "sweep",
        scenario,
        "--server-cmd",
        cmd,
        "--grid",
        "n=1000,-1,999",
        "--grid",
        "load.mode=single,mixed",
        "--out",
        tmp_path / "sw",
    )
    assert code == 3 and "cannot allocate the KV cache" in output, output
    # Too large a batch for the memory fails that setting alone (both its rows, with the server's
    # last words); the settings around it ran (minutes each, on a real server), and the sweep went
    # through the grid.
    sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert [(r["setting"], r["verdict"]) for r in sweep["rows"]] == [
        ("n=1000,load.mode=single", "deterministic"),
        ("n=1000,load.mode=mixed", "deterministic"),
        ("n=-1,load.mode=single", "target_failed"),
        ("n=-1,load.mode=mixed", "target_failed"),
        ("n=999,load.mode=single", "deterministic"),
        ("n=999,load.mode=mixed", "deterministic"),
    ]
    failed = sweep["rows"][2]
    assert (
        failed["error"].startswith("server exited while starting")
        and "cannot allocate the KV cache" in failed["error"]
        and failed["cells"] == []
        and failed["run"] is None
    )
    assert sweep["complete"] is True
    md = (tmp_path / "sw" / "sweep.md").read_text()
    assert (
        "| n=1000,load.mode=single | p1 (single) |" in md
        and "| n=-1,load.mode=mixed | failed: server exited" in md
    )


# A server that answers `--after` requests, then fails as `--how` says, right as its last answer
# leaves: it exits (`exit`), or its readiness URL turns 503 (`503`). `--after -1`: it never gets
# ready (it never listens).
SICK_SERVER = """
import argparse, os, time
from aiohttp import web
parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int)
parser.add_argument("--after", type=int)
parser.add_argument("--how", choices=["exit", "503"], default="exit")
args = parser.parse_args()
if args.after < 0:
    time.sleep(300)
served = 0
sick = False
async def chat(request):
    global served, sick
    await request.read()
    served += 1
    print(f"served {served}", flush=True)
    last = served == args.after
    # before the answer leaves: once it is in, /health says 503
    sick = sick or (last and args.how == "503")
    response = web.json_response({"id": "x", "object": "chat.completion", "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "same"},
                     "finish_reason": "stop"}]})
    if last and args.how == "exit":
        await response.prepare(request)
        await response.write_eof()
        os._exit(0)
    return response
async def health(request):
    return web.json_response({}, status=503 if sick else 200)
app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
app.router.add_get("/health", health)
web.run_app(app, host="127.0.0.1", port=args.port, print=None)
"""


def sick_server(tmp_path: Path, scenario: Path, how: str = "exit") -> tuple[str, int]:
    """The sick server's command, and how many requests one run of ``scenario`` sends (counted on a
    healthy one)."""
    (tmp_path / "sick.py").write_text(SICK_SERVER)
    cmd = f"{sys.executable} {tmp_path / 'sick.py'} --port {{port}} --after {{n}} --how {how}"
    code, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, "--grid", "n=100000", "--out", tmp_path / "count"
    )
    assert code == 0, output
    served = re.findall(r"served (\d+)", (tmp_path / "count" / "server-n=100000.log").read_text())
    return cmd, int(served[-1])


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("exit", "the server exited during the run"),
        ("503", "the server stopped answering http://127.0.0.1:"),
    ],
)
def test_a_setting_whose_server_fails_right_after_its_last_answer_is_target_failed(
    tmp_path, how, why
):
    # One request at a time: the last one counted is the last one answered.
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=4
    )
    cmd, requests = sick_server(tmp_path, scenario, how)
    out = tmp_path / "sw"
    code, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, "--grid", f"n={requests},100000", "--out", out
    )
    assert code == 3, output
    rows = {row["setting"]: row for row in json.loads((out / "sweep.json").read_text())["rows"]}
    failed = rows[f"n={requests}"]
    # Every answer came and held (its run alone is deterministic), from a server that did not last
    # the run.
    assert (failed["verdict"], failed["run_verdict"]) == ("target_failed", "deterministic")
    assert failed["error"].startswith(why) and failed["verdict_line"].startswith(f"failed: {why}")
    assert all(cell["ok"] == cell["asked"] for cell in failed["cells"])
    assert rows["n=100000"]["verdict"] == "deterministic"  # the next setting still ran
    assert f"| n={requests} | failed: {why}" in (out / "sweep.md").read_text()


def test_a_server_never_ready_fails_its_setting_after_the_ready_timeout_and_the_sweep_goes_on(
    tmp_path,
):
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=2
    )
    (tmp_path / "sick.py").write_text(SICK_SERVER)
    cmd = f"{sys.executable} {tmp_path / 'sick.py'} --port {{port}} --after {{n}}"
    out = tmp_path / "sw"
    started = time.monotonic()
    code, output = run_cli(
        "sweep",
        scenario,
        "--server-cmd",
        cmd,
        "--grid",
        "n=-1,100000",
        "--grid",
        "load.samples=2,3",
        "--ready-timeout",
        "2",
        "--out",
        out,
    )
    assert code == 3, output
    assert time.monotonic() - started < READY_TIMEOUT_S / 10  # the option's 2 s, not the default
    sweep = json.loads((out / "sweep.json").read_text())
    assert [(r["setting"], r["verdict"]) for r in sweep["rows"]] == [
        ("n=-1,load.samples=2", "target_failed"),
        ("n=-1,load.samples=3", "target_failed"),
        ("n=100000,load.samples=2", "deterministic"),
        ("n=100000,load.samples=3", "deterministic"),
    ]
    assert sweep["rows"][0]["error"].startswith("server not ready at http://127.0.0.1:")
    assert "after 2 s (" in sweep["rows"][0]["error"] and sweep["complete"]


@pytest.mark.parametrize("values", ["4,4", "0.5,0.50", "true,True"])
def test_grid_values_that_are_the_same_setting_are_refused_before_any_server_starts(
    tmp_path, values
):
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=2
    )
    cmd = f"{sys.executable} {_server_script(tmp_path)} {{port}} {{x}}"
    code, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, "--grid", f"x={values}", "--out", tmp_path / "sw"
    )
    first, second = values.split(",")
    assert code == 2 and f"--grid x: {first} and {second} are the same setting" in output, output
    assert (
        output.count("\n") == 1 and not (tmp_path / "argv.json").exists()
    )  # no server was started


def test_settings_whose_directory_names_collide_are_named_apart(tmp_path, server):
    # org/m and org_m are two models, and a directory name holds no /: each run gets a directory of
    # its own.
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
    out = tmp_path / "sw"
    code, output = run_cli("sweep", scenario, "--grid", "target.model=org/m,org_m", "--out", out)
    assert code == 0, output
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert [r["setting"] for r in rows] == ["target.model=org/m", "target.model=org_m"]
    runs = [Path(r["run"]) for r in rows]
    assert runs[0] != runs[1] and all(run.parent == out for run in runs)
    assert [json.loads((run / "run.json").read_text())["target"]["model"] for run in runs] == [
        "org/m",
        "org_m",
    ]


def test_a_sweep_ended_by_an_error_gives_every_setting_a_row(tmp_path):
    # The second setting's server command cannot be run: that ends the sweep (it is the command, so
    # every setting would fail alike, exit 2); the first keeps its row, and the two it never ran say
    # why, in every view.
    scenario = write_scenario(
        tmp_path / "s.toml", "http://127.0.0.1:9/v1", concurrency=[1], samples=2
    )
    script = _server_script(tmp_path)
    missing = tmp_path / "no-such-python"
    out = tmp_path / "sw"
    code, output = run_cli(
        "sweep",
        scenario,
        "--server-cmd",
        f"{{exe}} {script} {{port}}",
        "--grid",
        f"exe={sys.executable},{missing},{sys.executable}3",
        "--out",
        out,
    )
    assert code == 2 and "--server-cmd: cannot run" in output, output
    sweep = json.loads((out / "sweep.json").read_text())
    assert [r["verdict"] for r in sweep["rows"]] == ["deterministic", "not_run", "not_run"]
    assert not sweep["complete"]
    why = f"not run: the sweep ended at exe={missing}: --server-cmd: cannot run"
    assert all(row["verdict_line"].startswith(why) for row in sweep["rows"][1:])
    assert (out / "sweep.md").read_text().count(f"| {why}") == 2
    run_cli("report", out, "--format", "html", "-o", tmp_path / "sweep.html")
    assert (tmp_path / "sweep.html").read_text().count(f"{sys.executable}3: {why}") == 1


def test_sweep_md_keeps_its_columns_whatever_the_probe_id_and_setting_hold(tmp_path, server):
    from tests.outputs.test_output_escaping import HOSTILE, _cells

    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1, 2],
        samples=2,
        probes=[{"id": HOSTILE, "prompt": "Say something.", "max_tokens": 16}],
    )
    out = tmp_path / "sw"
    code, output = run_cli(
        "sweep", scenario, "--grid", "params.stop=a|b,<i>c", "--out", out, "--quiet"
    )
    assert code == 0, output
    for text in ((out / "sweep.md").read_text(), run_cli("report", out, "--format", "markdown")[1]):
        rows = [line for line in text.splitlines() if line.startswith("|")]
        assert len(rows) == 4, (
            text
        )  # header, rule, a row per setting: a line break in the probe id split rows
        assert all(len(_cells(row)) == len(_cells(rows[0])) for row in rows), (
            rows
        )  # a | added columns
        assert "\x1b" not in text and "<i>" not in text and "<b>" not in text


def test_a_setting_too_long_for_a_file_name_gets_a_directory_all_the_same(tmp_path, server):
    # A file name holds at most 255 bytes; a model path or many axes make a longer label.
    long = "org/" + "m" * 300
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
    out = tmp_path / "sw"
    code, output = run_cli(
        "sweep", scenario, "--grid", f"target.model={long},{long}x", "--out", out
    )
    assert code == 0, (
        output
    )  # before: OSError "File name too long" ended the sweep, exit 1 with a traceback
    runs = [Path(r["run"]) for r in json.loads((out / "sweep.json").read_text())["rows"]]
    assert runs[0] != runs[1] and all(
        run.parent == out and len(run.name.encode()) <= 255 for run in runs
    )
    assert [json.loads((run / "run.json").read_text())["target"]["model"] for run in runs] == [
        long,
        f"{long}x",
    ]


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda doc: doc.pop("rows"), "`rows`"),
        (lambda doc: doc.update(rows="x"), "$.rows"),
        (lambda doc: doc.update(levels=None), "$.levels"),
        (lambda doc: doc["rows"][0].update(setting=5), "$.rows[0].setting"),
        (lambda doc: doc["rows"][0]["cells"][0].pop("mode"), "rows[0].cells[0].mode"),
    ],
)
@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_report_of_an_edited_sweep_json_exits_2_naming_the_key(tmp_path, server, edit, named, fmt):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
    out = tmp_path / "sw"
    assert (
        run_cli("sweep", scenario, "--grid", "load.stream=true,false", "--out", out, "--quiet")[0]
        == 0
    )
    doc = json.loads((out / "sweep.json").read_text())
    edit(doc)
    (out / "sweep.json").write_text(json.dumps(doc))
    code, output = run_cli("report", out, "--format", fmt)
    assert code == 2, output  # before: a KeyError, AttributeError or TypeError traceback, exit 1
    assert f"{out / 'sweep.json'}: not a kevload sweep.json" in output and named in output, output
