"""What every built-in target shares: the settings users tune, and how a target says how to start
it.

Each target module (``llamacpp``, ``transformers_serve``, ``vllm``) has one ``command(settings,
port, log)`` that provisions what it needs and returns a ``Launch``; the package starts, waits and
stops.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from kevload.errors import ProvisionError
from kevload.inputs.overrides import toml_value
from kevload.servers.targets.model import default_gguf

HOST = "127.0.0.1"

Log = Callable[[str], None]


# vLLM's names for the settings that mean the same on every server (see TargetSettings).
ALIASES = {"max_num_seqs": "slots", "prefix_caching": "cache_prompt"}


@dataclass(frozen=True)
class TargetSettings:
    """What users tune and sweep. ``None`` means the server's own default.

    One knob, one field, whichever server: ``slots`` is the most requests decoded together
    (llama.cpp ``--parallel``, vLLM ``--max-num-seqs``), ``cache_prompt`` the reuse of a prompt's KV
    cache (llama.cpp ``--cache-prompt``, vLLM prefix caching); ``ALIASES`` takes the vLLM names for
    them.
    """

    slots: int = field(default=4, metadata={"min": 1})
    ctx_size: int | None = field(default=None, metadata={"min": 64})
    threads: int | None = field(default=None, metadata={"min": 1})
    batching: bool = True
    cache_prompt: bool = True
    dtype: str = "bfloat16"
    seed: int | None = None
    enforce_eager: bool = False
    max_model_len: int | None = field(default=None, metadata={"min": 16})
    gguf: str | None = None
    port: int | None = field(default=None, metadata={"min": 1})
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> TargetSettings:
        """Settings from user input (CLI, --grid, Python keywords): unknown names and wrong types
        are refused."""
        known = {f.name: f for f in fields(cls)}
        given: dict[str, Any] = {}
        for name, value in options.items():
            field_name = ALIASES.get(name, name)
            if field_name not in known:
                expected = ", ".join(sorted([*known, *ALIASES]))
                raise ProvisionError(f"unknown target setting {name!r}; expected one of {expected}")
            if field_name in given:
                raise ProvisionError(
                    f"target setting {name!r}: {field_name} is given twice (one is an alias)"
                )
            given[field_name] = _checked(known[field_name], name, value)
        return cls(**given)

    @classmethod
    def from_pairs(cls, pairs: Iterable[str], refuse: Callable[[str], str]) -> TargetSettings:
        """Settings from ``KEY=VALUE`` texts, VALUE as TOML (``--target-set``, ``compare
        --target NAME=BUILTIN:…``); a text that is no pair is an error, ``refuse(text)`` its
        message."""
        options: dict[str, Any] = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise ProvisionError(refuse(pair))
            options[key.strip()] = toml_value(value.strip())
        return cls.from_options(options)

    def changed(self) -> dict[str, Any]:
        """The settings that differ from the defaults, as run.json's ``server.settings`` keeps
        them."""
        default = TargetSettings()
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }

    def model_file(self) -> Path:
        """The GGUF to serve: the user's own, or the bundled SmolLM2."""
        gguf = Path(self.gguf).expanduser().resolve() if self.gguf else default_gguf()
        if not gguf.is_file():
            raise ProvisionError(f"gguf: no such model file {gguf}")
        return gguf

    def thread_count(self) -> int:
        return self.threads or os.cpu_count() or 2


_KINDS = {"int": (int, "an integer"), "bool": (bool, "true or false"), "str": (str, "a string")}


def _checked(spec: Any, name: str, value: Any) -> Any:
    """The value if it has the field's type (``None`` where the field allows it); a clear error
    otherwise."""
    kinds = [part.strip() for part in str(spec.type).split("|")]
    if value is None and "None" in kinds:
        return None
    if kinds[0].startswith("tuple"):
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ProvisionError(f"target setting {name}: expected a list of strings, got {value!r}")
    kind, expected = _KINDS[kinds[0]]
    # bool is an int to Python; a setting that wants a number must not take true.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProvisionError(f"target setting {name}: expected {expected}, got {value!r}")
    minimum = spec.metadata.get("min")
    if minimum is not None and value < minimum:
        raise ProvisionError(f"target setting {name}: expected at least {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class Launch:
    """How to start one target: its command line, environment, the model name it answers to, and
    how long it may take to answer its first request (model load and first-call setup)."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(repr=False)  # the user's whole environment: never printed
    model: str
    ready_timeout: float


class Command(Protocol):
    """A built-in target's one entry point: provision once, then say how to start it on ``port``."""

    def __call__(self, settings: TargetSettings, port: int, log: Log) -> Launch: ...
