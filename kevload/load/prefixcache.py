"""Prefix cache warm and cold, on purpose (``load.prefix_cache = "cold_warm"``): how a cold sample
is made, and what the cold and warm answers say side by side.

Each round sends the probe serially, cold (its prefix not in the server's cache), then warm (the
same input, just served). Cold is made by the server's own reset where it has one — vLLM's ``POST
/reset_prefix_cache``, SGLang's ``POST /flush_cache`` — by llama.cpp's per-request ``cache_prompt:
false``, or, where the server has none of these, by a fresh marker opening the probe's whole input
in every round (its first send is cold, the next two warm; all three compare the same input).
``load.cache_reset = "auto"`` probes the endpoints in that order and falls back.

A round's first sample is cold, the rest warm; a record says which in ``cache`` and keeps what the
server said it served from its cache (``cached_tokens``: vLLM's
``usage.prompt_tokens_details.cached_tokens``, llama.cpp's ``timings.cache_n``).
``kevload.compare.coldwarm`` reduces a run's records to the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from kevload.compare.coldwarm import round_length
from kevload.errors import TargetError
from kevload.inputs.probe import Probe
from kevload.inputs.scenario import Scenario
from kevload.inputs.wordsets import shortened

CacheState = Literal["cold", "warm"]
# The server's own resets, in the order "auto" tries them: (method, path).
RESETS = (("reset_prefix_cache", "/reset_prefix_cache"), ("flush_cache", "/flush_cache"))
_PROBE_TIMEOUT_S = 10.0
# A reset's or /props' answer is read whole up to these sizes (SGLang's reset answer is 150 bytes;
# llama.cpp's
# /props a few KiB, more with a long chat template): a larger one is judged too large, never read
# from a cut.
MAX_RESET_BYTES = 64 << 10
MAX_PROPS_BYTES = 4 << 20
# How SGLang's /flush_cache opens its plain-text answer when it flushed (it refuses with a 400).
_SGLANG_FLUSHED = "Cache flushed"


class CacheResetError(TargetError):
    """The server's reset failed mid-run: kevload cannot make the next sample cold, so the run stops
    (exit 3); no cell is called drifted for it."""


@dataclass(frozen=True)
class Method:
    """How cold samples are made in this run, and why that way (``run.json``'s ``prefix_cache``)."""

    name: str  # reset_prefix_cache, flush_cache, cache_prompt or marker
    why: str

    def to_json(self) -> dict[str, str]:
        return {"method": self.name, "why": self.why}


def state_of(sample: int, method: str) -> CacheState:
    """A round's first sample is cold, the rest the warm answers to the same input just after."""
    return "cold" if sample % round_length(method) == 0 else "warm"


def origin(base_url: str) -> str:
    """The server's root (``http://host:port``): where vLLM and SGLang put their resets and
    llama.cpp ``/props``."""
    parts = urlsplit(base_url)
    # Without a user:password@ (never sent in a URL); an IPv6 host keeps its brackets.
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], "", "", ""))


class CacheControl:
    """Makes each probe sample cold or warm: resets before a cold one, and the body fields each
    needs."""

    def __init__(self, method: Method, scenario: Scenario, api_key: str | None):
        self.method = method
        self.root = origin(scenario.target.base_url)
        self.headers = _headers(scenario, api_key)
        self.timeout = scenario.target.timeout

    def state(self, sample: int) -> CacheState:
        return state_of(sample, self.method.name)

    async def prepare(self, state: CacheState) -> dict[str, Any]:
        """Called just before a probe sample is sent; returns the fields to add to its body."""
        if self.method.name == "cache_prompt":
            return {"cache_prompt": state == "warm"}
        if state == "cold" and self.method.name in dict(RESETS):
            path = dict(RESETS)[self.method.name]
            ok, said = await _post(self.root + path, self.headers, self.timeout)
            if not ok:
                raise CacheResetError(
                    f"prefix cache reset failed mid-run: POST {path} answered {said}; the next "
                    "sample could not be made cold (load.cache_reset)"
                )
        return {}


async def pick_method(scenario: Scenario, api_key: str | None) -> Method:
    """The method ``load.cache_reset`` names, or for ``auto`` the first the server has: its reset
    endpoints (one that answers 200 has just reset the cache, which harms nothing before a run),
    llama.cpp (``GET /props`` with its ``default_generation_settings``), else a marker. A reset
    named outright is checked the same way, and one the server lacks stops the run before anything
    is sent (``CacheResetError``, exit 3): it would claim cold samples it cannot make.
    ``cache_prompt`` named outright is used as asked, its ``why`` saying what ``/props`` answered;
    under ``auto`` it is never picked where ``[params]`` sets ``cache_prompt`` itself (sent as
    written)."""
    asked = scenario.load.cache_reset
    root, headers = origin(scenario.target.base_url), _headers(scenario, api_key)
    if asked == "marker":
        return Method(
            "marker", 'load.cache_reset = "marker": a fresh marker opens the probe in every round'
        )
    tried = []
    for name, path in RESETS:
        if asked not in ("auto", name):
            continue
        ok, said = await _post(root + path, headers, _PROBE_TIMEOUT_S)
        if ok:
            return Method(
                name,
                f"POST {path} answered {said}"
                + (' (load.cache_reset = "auto")' if asked == "auto" else ""),
            )
        tried.append(f"POST {path} answered {said}")
    if asked == "auto" and "cache_prompt" in scenario.params:
        # The user's cache_prompt is theirs: overriding it on warm samples would measure a cache
        # they turned off.
        tried.append("[params] sets cache_prompt itself; sent as written")
    elif asked in ("auto", "cache_prompt"):
        ok, said = await _llamacpp(root, headers)
        if ok or asked == "cache_prompt":
            # Named outright it is sent as asked: a llama.cpp behind a proxy that passes only /v1
            # has no /props.
            return Method(
                "cache_prompt",
                ("" if ok else 'load.cache_reset = "cache_prompt", sent as asked though ')
                + f"GET /props {said}: cold samples are sent with cache_prompt: false, warm ones "
                f"with "
                "cache_prompt: true",
            )
        tried.append(f"GET /props {said}")
    if asked != "auto":
        raise CacheResetError(
            f"load.cache_reset = {asked!r}: the server has no such reset ({'; '.join(tried)})"
        )
    return Method(
        "marker",
        f"no reset found ({'; '.join(tried)}): a fresh marker opens the probe in every round",
    )


def marked_rounds(scenario: Scenario, run_id: str) -> Scenario:
    """The marker method's scenario: each probe's rounds as probes of their own, ``<probe>@r<k>``,
    each a cold sample and two warm ones, their text opened by a marker no earlier request carried
    (the run id is new, and the marker names the probe: two probes with the same opening, a shared
    system message, would otherwise share it too)."""
    rounds = scenario.load.samples // 2
    # The round first, then the probe: a server reuses the longest common prefix (llama.cpp to the
    # token), so rounds and probes must part at once.
    probes = tuple(
        _marked(probe, f"[round {k} of {probe.id} in {run_id}] ", f"{probe.id}@r{k}")
        for probe in scenario.probes
        for k in range(rounds)
    )
    return replace(
        scenario, probes=probes, load=replace(scenario.load, samples=round_length("marker"))
    )


def _marked(probe: Probe, marker: str, id: str) -> Probe:
    """The probe with ``marker`` opening its whole input: the first message, not the last, or a
    system message shared by every round would stay cached and the "cold" sample would reuse it."""
    if probe.prompt is not None:
        return replace(probe, id=id, prompt=marker + probe.prompt)
    assert probe.messages is not None  # a prompt or a chat: load.prefix_cache takes no conversation
    first = probe.messages[0]
    return replace(
        probe,
        id=id,
        messages=({**first, "content": marker + first["content"]}, *probe.messages[1:]),
    )


def _headers(scenario: Scenario, api_key: str | None) -> dict[str, str]:
    headers = dict(scenario.target.headers)
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


async def _post(url: str, headers: dict[str, str], timeout: float) -> tuple[bool, str]:
    """POST to a reset endpoint: (whether it reset, what it answered, shortened for a line)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.post(url, headers=headers) as response,
        ):
            body = await _whole(response, MAX_RESET_BYTES)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return False, f"no answer ({type(exc).__name__})"
    return reset_answer(response.status, response.content_type, body)


async def _whole(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body, or None past ``limit`` bytes: an answer is judged whole or not at all, never
    from a cut (a refusal cut short no longer parses and would read as some other answer)."""
    body = bytearray()
    async for chunk in response.content.iter_chunked(1 << 14):
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def reset_answer(status: int, content_type: str, body: bytes | None) -> tuple[bool, str]:
    """Whether a reset endpoint's answer says it reset the cache, and what it said (shortened for a
    line; the decision is always taken on the whole body). A reset is a 200 with: an empty body
    (vLLM before it said ``success``), a JSON object whose ``success`` is ``true`` or absent and
    whose ``error`` is absent or null (vLLM answers ``{"success": false}`` when blocks are still
    held), or SGLang's plain text ``Cache flushed.`` (it refuses with a 400). Anything else is no
    reset: JSON that is not such an object, a body that looks like JSON but does not parse (cut or
    broken), other plain text, an HTML page (a web UI's answer to any path), a body over
    ``MAX_RESET_BYTES``."""
    if status != 200:
        return False, f"{status}"
    if body is None:
        return False, f"200 with an answer over {MAX_RESET_BYTES >> 10} KiB"
    if content_type == "text/html":
        return False, "200 with an HTML page"
    text = body.decode("utf-8", "replace").strip()
    if not text:
        return True, "200"
    said = f"200 {_shown(text)}"
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        if text.startswith(_SGLANG_FLUSHED):
            return True, said
        looks_json = text.startswith(("{", "[", '"'))
        return (
            False,
            f"{said}: {'JSON that does not parse' if looks_json else 'not a reset answer'}",
        )
    if not isinstance(doc, dict):
        return False, f"{said}: JSON {_json_type(doc)}, not an object"
    success = doc.get("success", True)
    if success is False:
        return False, said
    if success is not True:
        return False, f"{said}: success is {_json_type(success)}, not true"
    if doc.get("error") is not None:
        return False, f"{said}: it holds an error"
    return True, said


async def _llamacpp(root: str, headers: dict[str, str]) -> tuple[bool, str]:
    """Whether the server is llama.cpp's: its ``/props`` is a JSON object with a
    ``default_generation_settings`` object."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_PROBE_TIMEOUT_S)) as session,
            session.get(root + "/props", headers=headers) as response,
        ):
            body = await _whole(response, MAX_PROPS_BYTES) if response.status == 200 else b""
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return False, f"no answer ({type(exc).__name__})"
    return props_answer(response.status, body)


def props_answer(status: int, body: bytes | None) -> tuple[bool, str]:
    """Whether a ``GET /props`` answer is llama.cpp's, and what came where it is not."""
    if status != 200:
        return False, f"answered {status}, not llama.cpp's props"
    if body is None:
        return False, f"answered 200 with over {MAX_PROPS_BYTES >> 20} MiB, not llama.cpp's props"
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return (
            False,
            f"answered 200 {_shown(body.decode('utf-8', 'replace'))}, not llama.cpp's props: not "
            f"JSON",
        )
    if not isinstance(doc, dict):
        return False, f"answered 200 with JSON {_json_type(doc)}, not llama.cpp's props"
    if "default_generation_settings" not in doc:
        return False, "answered 200 without default_generation_settings, not llama.cpp's props"
    settings = doc["default_generation_settings"]
    if not isinstance(settings, dict):
        return False, (
            f"answered 200 whose default_generation_settings is a JSON {_json_type(settings)}, not "
            "llama.cpp's props"
        )
    return True, "answered llama.cpp's props"


def _shown(text: str, limit: int = 200) -> str:
    """Text for a line: at most ``limit`` characters (its length said where cut), quoted so that no
    control character reaches a terminal."""
    if len(text) <= limit:
        return repr(text)
    return f"{shortened(text, limit, mark='')!r}… ({len(text)} characters)"


def _json_type(value: object) -> str:
    """A decoded JSON value's type, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names[type(value)]
