"""What every built-in target shares: the settings users tune, and how a target says how to start it.

Each target module (``llamacpp``, ``transformers_serve``) has one ``command(settings, port, log)``
that provisions what it needs and returns a ``Launch``; the package starts, waits and stops.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from kevload.targets.cache import ProvisionError
from kevload.targets.model import default_gguf

HOST = "127.0.0.1"

Log = Callable[[str], None]


@dataclass(frozen=True)
class TargetSettings:
    """What users tune and sweep. ``None`` means the server's own default."""

    slots: int = 4
    ctx_size: int | None = None
    threads: int | None = None
    batching: bool = True
    cache_prompt: bool = True
    dtype: str = "bfloat16"
    seed: int | None = None
    gguf: str | None = None
    port: int | None = None
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> TargetSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ProvisionError(f"unknown target setting {unknown[0]!r}; expected one of {', '.join(sorted(known))}")
        return cls(**options)

    def model_file(self) -> Path:
        """The GGUF to serve: the user's own, or the bundled SmolLM2."""
        gguf = Path(self.gguf).expanduser().resolve() if self.gguf else default_gguf()
        if not gguf.is_file():
            raise ProvisionError(f"gguf: no such model file {gguf}")
        return gguf

    def thread_count(self) -> int:
        return self.threads or os.cpu_count() or 2


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
