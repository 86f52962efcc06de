"""The model names a server serves (``GET {base_url}/models``), asked when it refuses the one a run
names: "http_404" alone leaves a user guessing; "it serves '/root/.cache/…/SmolLM2'" does not.
Nothing it answers is trusted: a body that is not an OpenAI model list, or is over
``MAX_MODELS_BYTES``, gives no names."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import aiohttp
import msgspec

from kevload.inputs.scenariokeys import Target
from kevload.records.store import url_userinfo

MAX_MODELS_BYTES = 1 << 20
MODELS_TIMEOUT_S = 10.0
# What a server answers a request naming a model it does not serve: vLLM 404, transformers serve
# 400.
REFUSAL_STATUSES = ("http_400", "http_404")


class _Model(msgspec.Struct):
    id: str


class _Models(msgspec.Struct):
    data: list[_Model]


def model_names(status: int, body: bytes | None) -> tuple[str, ...] | None:
    """The ids of a ``/models`` answer; None for anything but a 200 with an OpenAI model list."""
    if status != 200 or body is None:
        return None
    try:
        return tuple(m.id for m in msgspec.json.decode(body, type=_Models).data)
    except msgspec.DecodeError:
        return None


async def served_models(target: Target, api_key: str | None) -> tuple[str, ...] | None:
    """The model names ``target`` serves, or None where it does not say (no answer, no list)."""
    base, basic = url_userinfo(target.base_url)
    headers = dict(target.headers)
    if basic:
        headers["Authorization"] = f"Basic {basic}"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    parts = urlsplit(base)
    url = urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/models"))
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=MODELS_TIMEOUT_S)) as session,
            session.get(url, headers=headers) as response,
        ):
            body = bytearray()
            async for chunk in response.content.iter_chunked(1 << 14):
                body += chunk
                if len(body) > MAX_MODELS_BYTES:
                    return None
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
    return model_names(response.status, bytes(body))


def refusal_message(model: str, status: str, error: str | None, served: tuple[str, ...]) -> str:
    """The error for a model the server does not serve: which, what it said, and what it serves."""
    said = f" ({status}: {error.strip()[:200]})" if error and error.strip() else f" ({status})"
    names = ", ".join(repr(name) for name in served[:5]) + (" …" if len(served) > 5 else "")
    send = f"; send that name (--model {served[0]!r}, or target.model)" if len(served) == 1 else ""
    return f"the server does not serve model {model!r}{said}; it serves {names}{send}"
