"""A sweep's grid: the settings ``--grid`` names (server settings and scenario keys), their labels,
and the checks of a ``--server-cmd`` or built-in target against them before any server starts."""

from __future__ import annotations

import itertools
import math
import re
import shlex
from dataclasses import dataclass
from typing import Any

from kevload.errors import ScenarioError
from kevload.inputs.overrides import toml_value
from kevload.inputs.urls import shown_url, url_problem
from kevload.records.rundir import apart

# {name} in --server-cmd and --ready-url; any other braces (JSON arguments) are left as they are.
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)\}")
MAX_SETTINGS = 1000  # settings of one sweep: more is a typo, not a test


@dataclass(frozen=True)
class Grid:
    server: dict[str, list[Any]]  # placeholders in --server-cmd, or built-in target settings
    scenario: dict[str, list[Any]]  # dotted scenario keys, swept without restarting anything

    @classmethod
    def parse(cls, specs: list[str]) -> Grid:
        server: dict[str, list[Any]] = {}
        scenario: dict[str, list[Any]] = {}
        for spec in specs:
            name, sep, values = spec.partition("=")
            name = name.strip()
            if not sep or not name or not values.strip():
                raise ScenarioError(
                    f"--grid {spec!r}: expected NAME=V1,V2 "
                    "(e.g. slots=1,2,4 or load.mode=single,mixed)"
                )
            if name in server or name in scenario:
                raise ScenarioError(f"--grid {name}: given twice")
            axis = scenario if "." in name else server
            axis[name] = _distinct(name, [v.strip() for v in values.split(",") if v.strip()])
        # Counted before any setting is made: the settings are the product of the axes.
        settings = math.prod(len(values) for values in (*server.values(), *scenario.values()))
        if settings > MAX_SETTINGS:
            raise ScenarioError(
                f"--grid: expected at most {MAX_SETTINGS:,} settings (each is a run, one after "
                f"another), got {settings:,}"
            )
        return cls(server=server, scenario=scenario)

    def run_dirs(self) -> dict[str, str]:
        """Each setting's run directory name, by its label (a row's ``setting``)."""
        return apart(
            [
                label({**s, **c})
                for s in combinations(self.server)
                for c in combinations(self.scenario)
            ]
        )

    def server_logs(self) -> dict[str, str]:
        """Each server setting's log file name, by its label."""
        names = apart([label(s) for s in combinations(self.server)])
        return {name: f"server-{file}.log" for name, file in names.items()}


def _distinct(name: str, texts: list[str]) -> list[Any]:
    """An axis's values, each once: two that read the same (4,4 or 0.5,0.50) would be one setting
    run twice, under one label and into one run directory."""
    values = [toml_value(text) for text in texts]
    seen: dict[str, str] = {}
    for text, value in zip(texts, values, strict=True):
        if str(value) in seen:
            raise ScenarioError(
                f"--grid {name}: {seen[str(value)]} and {text} are the same setting "
                f"({name}={value}); "
                "give each value once"
            )
        seen[str(value)] = text
    return values


def combinations(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    names = list(axes)
    return [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(axes[n] for n in names))
    ]


def label(setting: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in setting.items()) or "as-is"


def check_server_cmd(server_cmd: str, ready_url: str | None, axes: list[str]) -> None:
    """Refuse a command kevload would run wrongly: no {port} (the server would listen where kevload
    does not look), a placeholder that is neither {port} nor a --grid axis, or an axis the command
    never uses."""
    try:
        argv = shlex.split(server_cmd)
    except ValueError as exc:
        raise ScenarioError(f"--server-cmd: cannot split into arguments ({exc})") from None
    used = {name for arg in argv for name in PLACEHOLDER.findall(arg)}
    if "port" not in used:
        raise ScenarioError(
            "--server-cmd: needs {port} where the server takes its port: kevload picks a free "
            "port per setting and points target.base_url at it"
        )
    # The highest port for {port}, so a digit too many shows; the axes' values are not known here.
    filled = PLACEHOLDER.sub(lambda m: "65535" if m[1] == "port" else "1", ready_url or "")
    if ready_url is not None and (problem := url_problem(filled)) is not None:
        # Polled by urllib once each server starts: a blank or an open IPv6 bracket would end the
        # sweep in a traceback there, a port too large wait out --ready-timeout for every setting.
        raise ScenarioError(
            "--ready-url: expected an http:// or https:// URL such as "
            f"http://127.0.0.1:{{port}}/health ({problem}), got {shown_url(ready_url)!r}"
        )
    ready_names = set(PLACEHOLDER.findall(ready_url or ""))
    unknown = sorted((used | ready_names) - {"port", *axes})
    if unknown:
        raise ScenarioError(
            f"--server-cmd: placeholder {{{unknown[0]}}} is neither {{port}} nor a --grid axis "
            f"(axes: {', '.join(axes) or 'none'})"
        )
    unused = [axis for axis in axes if axis not in used]
    if unused:
        raise ScenarioError(
            f"--grid {unused[0]}: --server-cmd has no {{{unused[0]}}}, so every setting would "
            "start the same server"
        )


def check_axes_used(builtin: str, axes: dict[str, list[Any]]) -> None:
    """Refuse a target setting swept in vain: one whose values, the other axes held at any of
    theirs, give the same command line and environment (the target has no such knob, or the values
    mean the same there, as 64 and 128 threads on two cores). Its rows would be labelled with
    settings that were never applied. The model file and the port are used before the command line
    is made."""
    from kevload.servers.targets import TargetSettings, launch_key

    settings = combinations(axes)
    starts = [launch_key(builtin, TargetSettings.from_options(setting)) for setting in settings]
    for name, values in axes.items():
        if name in ("gguf", "port") or len(values) < 2:
            continue
        alike: dict[str, set[tuple[Any, ...]]] = {}
        for setting, start in zip(settings, starts, strict=True):
            alike.setdefault(repr({k: v for k, v in setting.items() if k != name}), set()).add(
                start
            )
        if all(len(group) == 1 for group in alike.values()):
            raise ScenarioError(
                f"--grid {name}: every value starts the same {builtin} server (the target does not "
                "use this setting, or these values mean the same there)"
            )


def server_argv(server_cmd: str, values: dict[str, Any]) -> list[str]:
    """Split first, then fill each argument's placeholders: a value with spaces stays one argument
    and braces that are not a placeholder (JSON such as '{"temperature": 0}') pass through
    unchanged."""
    return [_fill(arg, values) for arg in shlex.split(server_cmd)]


def _fill(text: str, values: dict[str, Any]) -> str:
    return PLACEHOLDER.sub(lambda m: str(values[m[1]]) if m[1] in values else m[0], text)
