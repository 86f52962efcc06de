"""The server's own view of each level: its Prometheus ``/metrics`` sampled while a run runs, one
line per sample in ``server-metrics.jsonl``, and read back per cell over the cell's time window
(``cell_view``)."""

from __future__ import annotations

import asyncio
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import msgspec
import numpy as np
import orjson
from prometheus_client.parser import text_string_to_metric_families

from kevload.inputs.scenariokeys import Target
from kevload.inputs.urls import METRICS_OFF
from kevload.records.store import read_typed, url_userinfo

SAMPLES = "server-metrics.jsonl"
INTERVAL_S = 0.1  # how often /metrics is read: a cell of a second still gets about ten samples
# one poll's bound, connecting included: a hanging /metrics costs this, never the run
TIMEOUT_S = 2.0
MAX_BYTES = 8 << 20
# after a parse of p seconds the next read waits 9·p: parsing takes a tenth of the time at most
PARSE_SHARE_INVERSE = 9
# The cell fields (summary.json, sweep.json rows): server_view False and the others None where the
# server publishes nothing.
CELL_FIELDS = (
    "server_view",
    "server_samples",
    "server_running_max",
    "server_running_mean",
    "server_waiting_max",
    "server_prefix_cache_hits",
    "server_kv_cache_usage_max",
    "server_note",
)


@dataclass(frozen=True)
class Names:
    """What one server calls its numbers. Each field lists alternative series names, the first one
    published wins (an older spelling after a newer one); a series with several label sets (vLLM
    labels per engine and model) is summed over them, except the KV-cache share, whose largest value
    is taken."""

    server: str
    running: tuple[str, ...]  # requests the server is running (its batch)
    waiting: tuple[str, ...]  # requests it holds in its queue
    prefix_cache_hits: tuple[str, ...] = ()  # counter: prompt tokens served from its prefix cache
    kv_cache_usage: tuple[str, ...] = ()  # gauge: share of the KV cache in use, 0 to 1


# Extend here for another server; names checked against each server's sources and documentation.
SERVERS = (
    Names(
        "vllm",
        ("vllm:num_requests_running",),
        ("vllm:num_requests_waiting",),
        ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ),
    Names(
        "llamacpp",
        ("llamacpp:requests_processing",),
        ("llamacpp:requests_deferred",),
        ("llamacpp:prompt_tokens_cached_total",),
    ),
    Names(
        "sglang",
        ("sglang:num_running_reqs",),
        ("sglang:num_queue_reqs",),
        ("sglang:cached_tokens_total",),
        ("sglang:token_usage",),
    ),
    Names("tgi", ("tgi_batch_current_size",), ("tgi_queue_size",)),
)
_VALUES = ("running", "waiting", "prefix_cache_hits", "kv_cache_usage")
# Only the lines of series named above reach the parser: a vLLM page of ~600 lines costs ~17 ms to
# parse whole, which would stall the event loop that sends the load ten times a second.
_NAMES = frozenset(name for names in SERVERS for value in _VALUES for name in getattr(names, value))
# A sample line's metric name, by the exposition format's grammar: blanks (spaces or tabs, any
# number) or its labels' brace end it. A prefix such as ``name + " "`` missed ``name<TAB>value``,
# which the format allows.
_SAMPLE_NAME = re.compile(r"[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t{]")
# What each value may be: counts and the counter from 0 to 2^53 (a double's exact integers: past
# them a count is no longer one, and 1e300 would be written as an int of 300 digits, which JSON
# encoders refuse), the KV share from 0 to 1. A value outside is not a number of the view: NaN is
# how some exporters say "none", a negative count is impossible.
_COUNT = (0.0, float(1 << 53), "a count, from 0 to 2^53")
_RANGES = {
    "running": _COUNT,
    "waiting": _COUNT,
    "prefix_cache_hits": (*_COUNT[:2], "a counter, from 0 to 2^53"),
    "kv_cache_usage": (0.0, 1.0, "a share, from 0 to 1"),
}
# URLs whose missing metrics were already said on stderr: a diagnosis or a sweep runs many runs on
# one server.
_WARNED: set[str] = set()
_NOT_FOUND = "HTTP 404"


def metrics_url(target: Target) -> str | None:
    """Where the run reads the server's metrics (``target.metrics_url``): ``auto`` is the base URL's
    origin plus ``/metrics``, ``""`` or ``off`` is nowhere, anything else the URL given."""
    if target.metrics_url in METRICS_OFF:
        return None
    if target.metrics_url != "auto":
        return target.metrics_url
    parts = urlsplit(url_userinfo(target.base_url)[0])
    return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))


def read_view(text: str, model: str | None = None) -> dict[str, Any] | None:
    """One sample from a ``/metrics`` page: ``{"server": "vllm", "running": 4, "waiting": 0, …}``
    (None for a value that server does not publish), or None when the page has none of the servers'
    series. Raises ``ValueError`` when one of those series' lines is not Prometheus text.

    A value outside its range (``_RANGES``: NaN, ±Inf, a negative count, a KV share over 1) is None
    too, and the sample says what came under ``unfit`` (``{"running": "vllm:num_requests_running =
    -3.0 (…)"}``).

    A series with label sets for ``model`` (``model_name``, as vLLM and SGLang label them) is read
    from those alone: the page may speak for other models' servers too (a gateway). Without one (no
    such label, or the target's model is an alias) every label set counts."""
    # Lines end at \n alone, as the format says (splitlines would also cut a label value at \x85 or
    # \u2028).
    lines = [
        line
        for line in text.split("\n")
        if (name := _SAMPLE_NAME.match(line)) and name[1] in _NAMES
    ]
    if not lines:
        return None
    labelled: dict[str, list[tuple[str | None, float]]] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            labelled.setdefault(sample.name, []).append(
                (sample.labels.get("model_name"), float(sample.value))
            )
    series = {
        name: [v for label, v in values if model is not None and label == model]
        or [v for _, v in values]
        for name, values in labelled.items()
    }
    for names in SERVERS:
        view: dict[str, Any] = {}
        unfit: dict[str, str] = {}
        for value in _VALUES:
            view[value], unfit_value = _published(series, getattr(names, value), value)
            if unfit_value is not None:
                unfit[value] = unfit_value
        if (
            view["running"] is not None
            or view["waiting"] is not None
            or unfit.keys() & {"running", "waiting"}
        ):
            return {"server": names.server, **view, **({"unfit": unfit} if unfit else {})}
    return None


class Sampler:
    """Reads the target's metrics (``metrics_url``) every ``INTERVAL_S`` in the driver's event loop,
    one GET at a time on a connection of its own, and appends each sample to
    ``run_dir/server-metrics.jsonl`` stamped with ``clock()`` (the records' clock). ``info`` is what
    ``run.json`` keeps under ``server_metrics``; it is filled in as the sampler learns.

    Nothing it meets fails the run. The first answer decides: a page without the known series, an
    HTTP error, no answer within ``TIMEOUT_S`` or no connection make the metrics unavailable
    (``info["why"]``) and nothing more is read. A page whose known lines do not parse decides
    nothing: reading goes on, and the reads that failed so are written before the first that parses;
    where none does by the run's end, that is why the metrics are unavailable. That is said in one
    line through ``warn``, once per URL and process, unless the URL was only guessed (``auto``) and
    the server answered 404: most servers without metrics, nothing to warn about. A later read that
    fails is a line with its ``error``.
    """

    def __init__(
        self,
        target: Target,
        run_dir: Path,
        *,
        clock: Callable[[], float] = time.perf_counter,
        warn: Callable[[str], None] | None = None,
    ):
        url = metrics_url(target)
        self.url = url
        self.model = target.model
        self.guessed = target.metrics_url == "auto"
        self.path = run_dir / SAMPLES
        self.clock = clock
        self.warn = warn or _to_stderr
        self.info: dict[str, Any] = {
            "url": url,
            "available": None if url else False,
            "server": None,
            "why": None if url else "target.metrics_url is off",
            "interval_s": INTERVAL_S,
            "samples": 0,
            "failed": 0,
            "last_error": None,
        }
        self._task: asyncio.Task[None] | None = None
        self.parse_s = 0.0  # how long the last page took to parse

    async def __aenter__(self) -> Sampler:
        if self.url is not None:
            self._task = asyncio.create_task(self._run(self.url))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.info["available"] is None:  # no page parsed, or none came, before the run ended
            self._unavailable(self.info["last_error"] or "no answer before the run ended")

    async def _run(self, url: str) -> None:
        loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=1)
        fd: int | None = None
        early: list[
            bytes
        ] = []  # reads whose page did not parse, before one did: written once one does
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)
        ) as http:
            try:
                due = loop.time()
                while True:
                    sample = await self._read(http, url)
                    if fd is None and not isinstance(sample, _Unparsed):
                        if isinstance(sample, str):  # the first answer decides: no metrics here
                            self._unavailable(sample)
                            return
                        self.info.update(available=True, server=sample["server"])
                        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                        os.write(fd, b"".join(early))
                    line = self._line(sample)
                    if fd is None:
                        early.append(line)
                    else:
                        os.write(fd, line)
                    due += INTERVAL_S
                    # A read slower than the interval skips the reads it overran rather than
                    # bunching them up, and parsing (which holds the interpreter from the load's
                    # requests) takes a tenth of the time at most.
                    due = max(due, loop.time() + PARSE_SHARE_INVERSE * self.parse_s)
                    await asyncio.sleep(due - loop.time())
            finally:
                if fd is not None:
                    os.close(fd)

    async def _read(self, http: aiohttp.ClientSession, url: str) -> dict[str, Any] | str:
        """One sample, or why there is none."""
        sent = self.clock()
        try:
            async with http.get(url, allow_redirects=False) as response:
                if response.status != 200:
                    return _NOT_FOUND if response.status == 404 else f"HTTP {response.status}"
                body = bytearray()
                async for chunk in response.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > MAX_BYTES:
                        return f"a page larger than {MAX_BYTES >> 20} MiB"
        except TimeoutError:
            return f"no answer within {TIMEOUT_S:g} s"
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return f"cannot read it ({type(exc).__name__}: {exc})"
        answered = self.clock()
        started = time.perf_counter()
        try:
            # In a thread: a page with many label sets of the series read takes long to parse, and
            # the event loop that sends the load and stamps its answers must not wait for it.
            view = await asyncio.to_thread(read_view, body.decode("utf-8", "replace"), self.model)
        except ValueError as exc:
            return _Unparsed(f"not Prometheus text ({exc})")
        finally:
            self.parse_s = time.perf_counter() - started
        if view is None:
            known = ", ".join(n.running[0] for n in SERVERS)
            return f"publishes none of the series kevload reads ({known}, …)"
        # The server read its counters somewhere between the send and the answer: the middle is the
        # best guess.
        return {"t": round((sent + answered) / 2, 6), "rtt_s": round(answered - sent, 6), **view}

    def _unavailable(self, why: str) -> None:
        self.info.update(available=False, why=why)
        url = self.url  # None: no sampler ran, and it is unavailable from the start
        if url is not None and not (self.guessed and why == _NOT_FOUND) and url not in _WARNED:
            _WARNED.add(url)
            self.warn(
                f"kevload: server metrics: {self.url}: {why}; the cells' server_* fields stay null"
            )

    def _line(self, sample: dict[str, Any] | str) -> bytes:
        """The sample's line of ``server-metrics.jsonl``, counted in ``info``."""
        if isinstance(sample, str):
            self.info["failed"] += 1
            self.info["last_error"] = str(sample)
            return orjson.dumps({"t": round(self.clock(), 6), "error": str(sample)}) + b"\n"
        self.info["samples"] += 1
        return orjson.dumps(sample) + b"\n"


class _Unparsed(str):
    """Why a read failed where the page came but one of the known series' lines did not parse: a
    later page may (a value caught mid-write, an exporter's passing bug), so unlike an HTTP error or
    a page without the series it does not decide that the server has no metrics. Only where no page
    of the run parses does it say so."""


@dataclass(frozen=True)
class Samples:
    """A run's samples as arrays in time order; NaN where a value was not published."""

    t: np.ndarray
    rtt: (
        np.ndarray
    )  # each read's send to answer: the server read its numbers somewhere in t ± rtt/2
    failed: np.ndarray  # when each read that failed gave up (sent at most TIMEOUT_S before)
    running: np.ndarray
    waiting: np.ndarray
    prefix_cache_hits: np.ndarray
    kv_cache_usage: np.ndarray


# One line of ``server-metrics.jsonl`` as read back, with the ranges the sampler wrote it in
# (``_RANGES``): a value of another type or out of its range is no sample kevload wrote (an edited
# file), and no number a cell may show.
_Count = Annotated[float, msgspec.Meta(ge=_COUNT[0], le=_COUNT[1])] | None


class _SampleLine(msgspec.Struct, frozen=True, gc=False):
    t: float
    rtt_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    error: str | None = None  # a read that failed: its other fields are absent
    running: _Count = None
    waiting: _Count = None
    prefix_cache_hits: _Count = None
    kv_cache_usage: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None


_SAMPLE_DECODER = msgspec.json.Decoder(_SampleLine)


def read_samples(run_dir: Path) -> Samples | None:
    """The samples ``server-metrics.jsonl`` holds (reads that failed left out); None without the
    file. A line that is no sample (a value of the wrong type or out of its range, no ``t``) is a
    ``RunDirError`` naming the line."""
    path = run_dir / SAMPLES
    if not path.is_file():
        return None
    records = list(read_typed(path, decoder=_SAMPLE_DECODER))
    rows = sorted((r for r in records if r.error is None), key=lambda r: r.t)
    columns = {
        value: np.array(
            [math.nan if getattr(r, value) is None else getattr(r, value) for r in rows],
            dtype=np.float64,
        )
        for value in _VALUES
    }
    return Samples(
        t=np.array([r.t for r in rows], dtype=np.float64),
        rtt=np.array([r.rtt_s or 0.0 for r in rows], dtype=np.float64),
        failed=np.array([r.t for r in records if r.error is not None], dtype=np.float64),
        **columns,
    )


def cell_view(
    samples: Samples | None, t_start: float, t_end: float, concurrency: int
) -> dict[str, Any]:
    """What the server said while one cell ran: the samples sent and answered from the cell's first
    counted send to its last counted answer (the server read its numbers somewhere in between: a
    read that straddles the window's edge may hold another cell's). Gauges: their largest value (and
    the mean of running) in that window. The prefix-cache counter: its increase from the last sample
    answered before the window to the first sent after it (a poll interval more on each side at
    most), none where it dropped anywhere in between (a restart). Without samples only
    ``server_view`` (False); with samples but none in the window (a cell shorter than the interval)
    ``server_samples`` 0 and nothing claimed."""
    if samples is None:
        return {"server_view": False}
    sent, answered = samples.t - samples.rtt / 2, samples.t + samples.rtt / 2
    window = (sent >= t_start) & (answered <= t_end)
    out: dict[str, Any] = {"server_view": True, "server_samples": int(window.sum())}
    if not window.any():
        return out
    out["server_running_max"] = _largest(samples.running[window])
    out["server_waiting_max"] = _largest(samples.waiting[window])
    out["server_kv_cache_usage_max"] = _largest(samples.kv_cache_usage[window])
    running = samples.running[window]
    if not np.isnan(running).all():
        out["server_running_mean"] = round(float(np.nanmean(running)), 3)
    before, after = np.flatnonzero(answered < t_start), np.flatnonzero(sent > t_end)
    hits = samples.prefix_cache_hits[
        before[-1] if len(before) else 0 : after[0] + 1 if len(after) else len(samples.t)
    ]
    published = hits[~np.isnan(hits)]
    # Any drop between the two ends is a restart: the ends alone would hide what was counted before
    # it.
    if math.isfinite(hits[0]) and math.isfinite(hits[-1]) and (np.diff(published) >= 0).all():
        out["server_prefix_cache_hits"] = _number(hits[-1] - hits[0])
    # The note says what the server never did in the whole window: a read that failed there may have
    # been the moment it did (a /metrics that fails while the server is busy leaves only its idle
    # moments).
    failed = ((samples.failed >= t_start) & (samples.failed - TIMEOUT_S <= t_end)).any()
    out["server_note"] = (
        None
        if failed
        else server_note(concurrency, out["server_running_max"], out["server_waiting_max"])
    )
    return out


def server_note(
    concurrency: int, running_max: float | None, waiting_max: float | None
) -> str | None:
    """``server ran ≤ 1 at a time, 3 waiting: …`` where the server held requests back at a level of
    *c* > 1: it ran fewer than *c* at any sample while others waited in its queue. None otherwise,
    and where no read saw it run anything: the cell's answers say it ran some, so those reads missed
    its work and bound nothing."""
    if running_max is None or waiting_max is None or concurrency <= 1 or running_max < 1:
        return None
    if running_max >= concurrency or waiting_max < 1:
        return None
    return (
        f"server ran ≤ {running_max:g} at a time, {waiting_max:g} waiting: the server's batch "
        f"limit, "
        "not kevload, set the level"
    )


def _published(
    series: dict[str, list[float]], names: tuple[str, ...], value: str
) -> tuple[float | None, str | None]:
    """The first of ``names`` the page publishes, combined over its label sets (the KV share: the
    largest, the others: the sum), and what came where a label set's value, or the sum, is outside
    the value's range."""
    low, high, what = _RANGES[value]
    for name in names:
        if name in series:
            values = series[name]
            combined = max(values) if value == "kv_cache_usage" else sum(values)
            bad = next(
                (v for v in (*values, combined) if not low <= v <= high), None
            )  # NaN fails both
            if bad is not None:
                return None, f"{name} = {bad!r} ({what})"
            return _number(combined), None
    return None, None


def _largest(values: np.ndarray) -> float | None:
    return None if np.isnan(values).all() else _number(float(np.nanmax(values)))


def _number(value: float) -> int | float:
    """A gauge's value as JSON shows it best: 4, not 4.0."""
    return int(value) if float(value).is_integer() else round(float(value), 6)


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr)
