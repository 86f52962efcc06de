"""An OpenAI-compatible test server with known behaviour: ground truth for kevload's detectors.

Every answer is a deterministic function of the prompt, unless the test turns on one source of
nondeterminism (sampling without a seed, crowding, mixed batches, a cold cache) or a fault. The
server runs on 127.0.0.1 on a random port, in a thread with its own event loop, so synchronous
tests and kevload's own event loop can both use it.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kevload.wire.logprobcheck import LOGPROBS_CHECK_USER

WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar "
    "papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()


@dataclass
class Behaviour:
    """What the server does; tests set these fields before (or between) runs."""

    latency: float = 0.02  # seconds each request is held, so concurrent requests overlap
    # extra seconds per other request in flight on arrival: slower under load
    latency_per_overlap: float = 0.0
    words: int = 12
    sampling: bool = False  # temperature > 0 without a seed gives random outputs
    seed_honoured: bool = True  # a fixed seed makes sampling repeatable
    greedy_at_zero: bool = True  # temperature 0 is greedy (False: still samples)
    ignore_temperature: bool = False  # every answer greedy, whatever temperature and seed say
    drift_at: int | None = None  # outputs vary once this many requests overlap
    drift_when_mixed: bool = False  # outputs vary when overlapping requests have different prompts
    batched_variant: bool = False  # crowding gives one fixed other output instead of random ones
    cold_differs: bool = False  # the first answer to a prompt differs from later (cached) ones
    cache_switch: bool = True  # cache_prompt=false in the request turns the cache effect off
    always_drift: bool = False  # drift even serially, with all randomness fixed
    reject_fields: tuple[str, ...] = ()  # 400 if the request has one of these fields
    diverge_at_word: int = 5
    ttft: float = 0.0  # extra delay before the first byte
    chunk_delay: float = 0.0  # delay between streamed chunks
    faults: list[str | None] = field(
        default_factory=list
    )  # one entry per request, in arrival order
    stall: float = 30.0  # how long a stall fault stalls
    send_done: bool = True
    retry_after: str = "0"  # the Retry-After a 429 carries
    # Chat answers as reasoning models give them (vLLM/SGLang): a reasoning text in this field
    # ("reasoning_content" or "reasoning") beside the content; tool calls instead of content.
    reasoning_field: str | None = None
    reasoning_varies: bool = False  # the reasoning differs on every request, the content does not
    # the reasoning for an answer's content, where a test says it
    reasoning_for: Callable[[str], str] | None = None
    tool_calls: int = 0  # answer with this many tool calls (content null), arguments from the words
    tool_args_vary: bool = False  # the tool calls' arguments differ on every request
    version: str = ""  # a "model version": another version answers every prompt differently
    # Per-token logprobs, when a request asks for them: a fixed function of the word and its
    # position.
    logprobs_supported: bool = True  # False: the field is ignored, as transformers serve does
    # logprobs (not the text) vary once this many requests overlap …
    logprob_drift_at: int | None = None
    logprob_diverge_at: int = 3  # … from this token on
    logprob_ids: bool = False  # chat entries carry the token "id", as llama.cpp's do
    # completions: "openai" (tokens/token_logprobs) or "content" (llama.cpp)
    completions_logprobs: str = "openai"
    # Position -> a logprob put there (-inf, inf, nan): json.dumps writes them -Infinity, Infinity,
    # NaN.
    logprob_nonfinite: dict[int, float] = field(default_factory=dict)
    # This many logprob checks answered with this text and no logprob entry: llama.cpp sends a token
    # that ends inside a UTF-8 character as "\ufffd" without one; "" is a sampler that picked the
    # end token first.
    empty_checks: int = 0
    empty_check_text: str = "\ufffd"
    logprobs_alone_only: bool = False  # logprobs only for a request that had no other in flight
    # Called on each request's arrival with its index and the requests now at the server (itself
    # included); a number it returns holds that request so long instead of `latency`. Tests act
    # through it at a chosen moment.
    on_arrival: Callable[[int, int], float | None] | None = None
    # A fault by the request's X-Request-Id (its seq tells which worker sent it), where ``faults``
    # gives none.
    fault_for: Callable[[str | None], str | None] | None = None
    # The answer's text as a function of the prompt and the most requests at the server while it was
    # held (1:
    # alone): a server whose answers are known right or wrong, serially and under load (graded
    # answers' tests).
    answer_for: Callable[[str, int], str] | None = None
    # A batch limit: at most this many requests run at once, the others wait in a queue in arrival
    # order (0: none).
    # Only running requests overlap each other (drift_at, drift_when_mixed count them).
    max_running: int = 0
    # The one model it serves, as GET /v1/models lists it; a request naming another gets vLLM's 404.
    # None: any name is answered.
    served_model: str | None = None
    listed_models: tuple[str, ...] | None = None  # what /v1/models lists instead of served_model
    # GET /metrics: None (404, no metrics), "vllm" or "llamacpp" (Prometheus text in that server's
    # names, its gauges what the server is doing now), "garbage" (an HTML page), "malformed" (a
    # known series, a bad value) or "hang" (never answers).
    metrics: str | None = None
    # Conversations: an answer is a function of the whole chat (an earlier answer changes every
    # later one), and it varies under load (another request overlapping it) only from this turn on
    # (0-based: a request with more user messages than this); serially it stays the same.
    drift_from_turn: int | None = None
    # Prefix cache, warm and cold on purpose (kevload.load.prefixcache). An answer is served from
    # the cache when its prompt was seen since the last reset and the request does not say
    # cache_prompt: false (llama.cpp keeps a slot's tokens after such a request too, so the next one
    # may reuse them).
    warm_differs: bool = False  # an answer served from the cache differs from one computed afresh
    chat_text: str | None = None  # a whole chat answer also carries completions' "text": this
    # "/reset_prefix_cache" (vLLM) or "/flush_cache" (SGLang): POST empties the cache
    reset_endpoint: str | None = None
    reset_lies: bool = False  # the reset answers as if it worked and empties nothing
    # resets after this many answer 500 (a reset failing mid-run)
    reset_fails_after: int | None = None
    # say what was served from the cache: "usage" (vLLM) or "timings" (llama.cpp)
    cached_tokens: str | None = None
    props: bool = False  # GET /props answers as llama.cpp's does
    # Outputs vary for a request that was held (before its answer is made) while a client closed
    # another request's stream: a batch that changed under it because a neighbour was cancelled, and
    # nothing else.
    drift_when_cancelled: bool = False


class FakeServer:
    def __init__(self, behaviour: Behaviour | None = None):
        self.behaviour = behaviour or Behaviour()
        self.requests: list[dict[str, Any]] = []
        self.request_ids: list[str | None] = []  # each request's X-Request-Id, in arrival order
        self.arrivals: list[float] = []
        # Each request's time at the server: [X-Request-Id, user, arrived, finished (None while it
        # runs)].
        self.visits: list[list[Any]] = []
        self.injected: dict[str, int] = {}
        self.checks = 0  # logprob checks answered
        self.seen_prompts: set[str] = set()
        self._active: dict[int, dict[str, Any]] = {}
        self._admitted = 0  # requests holding one of max_running places
        self._queue: collections.deque[asyncio.Future] = (
            collections.deque()
        )  # requests waiting for a place
        # prompt words answered from the "cache": a prompt seen before, counted on admission
        self.prefix_hits = 0
        self.metrics_polls = 0
        self.resets = 0  # POSTs to the reset endpoint answered
        # Streams the client closed before their end: (X-Request-Id, time.monotonic() when the
        # server saw it).
        self.disconnects: list[tuple[str | None, float]] = []
        self._next_id = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeServer:
        ready = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _shutdown(self) -> None:
        # Handlers still stalling (fault injection) are cancelled, not left to be destroyed pending.
        me = asyncio.current_task()
        for task in asyncio.all_tasks():
            if task is not me:
                task.cancel()
        await self._runner.cleanup()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_get("/health", _health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/reset_prefix_cache", self._reset)
        app.router.add_post("/flush_cache", self._reset)
        app.router.add_get("/props", self._props)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    # --- request handling ---

    async def _models(self, request: web.Request) -> web.Response:
        b = self.behaviour
        names = b.listed_models if b.listed_models is not None else (b.served_model or "fake",)
        data = [{"id": name, "object": "model"} for name in names]
        return web.json_response({"object": "list", "data": data})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        b = self.behaviour
        body = await request.json()
        if b.served_model is not None and body.get("model") != b.served_model:
            message = f"The model `{body.get('model')}` does not exist."
            error = {"message": message, "type": "NotFoundError", "code": 404}
            return web.json_response({"error": error}, status=404)
        chat = request.path.endswith("/chat/completions")
        if body.get("user") == LOGPROBS_CHECK_USER:
            # kevload's one capability check per run: answered, but neither recorded nor counted for
            # faults, so the tests' fault tables and request lists stay those of the run's own
            # requests.
            self.checks += 1
            if self.checks <= b.empty_checks:
                return web.json_response(
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "model": body.get("model"),
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "length",
                                "message": {"role": "assistant", "content": b.empty_check_text},
                                "logprobs": {"content": []},
                            }
                        ],
                        "usage": {
                            "prompt_tokens": 7,
                            "completion_tokens": 2 if b.empty_check_text else 0,
                        },
                    }
                )
            text = " ".join(WORDS[:3])
            logprobs = self._logprobs(body, text, overlap=1)
            if body.get("stream"):
                return await self._stream(request, body, text, chat, None, logprobs)
            return self._whole(body, text, chat, None, logprobs)
        self.requests.append(body)
        self.request_ids.append(request.headers.get("X-Request-Id"))
        self.arrivals.append(time.monotonic())
        index = len(self.requests) - 1
        fault = b.faults[index] if index < len(b.faults) else None
        if fault is None and b.fault_for is not None:
            fault = b.fault_for(request.headers.get("X-Request-Id"))
        if fault:
            self.injected[fault] = self.injected.get(fault, 0) + 1
        for name in b.reject_fields:
            if name in body:
                return web.json_response(
                    {"error": {"message": f"unknown field {name}"}}, status=400
                )
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        limited = b.max_running > 0
        if limited:
            await self._admit(b.max_running)
        if prompt in self.seen_prompts:
            self.prefix_hits += len(prompt.split())
        me = self._next_id
        self._next_id += 1
        state = {
            "prompt": prompt,
            "max_overlap": 1,
            "prompts": {prompt},
            "arrived": time.monotonic(),
            "cached": prompt in self.seen_prompts and body.get("cache_prompt", True) is not False,
        }
        self._active[me] = state
        hold = b.on_arrival(index, len(self._active)) if b.on_arrival is not None else None
        visit = [request.headers.get("X-Request-Id"), body.get("user"), time.monotonic(), None]
        self.visits.append(visit)
        for other in self._active.values():
            other["max_overlap"] = max(other["max_overlap"], len(self._active))
            other["prompts"].add(prompt)
            state["prompts"].add(other["prompt"])
        try:
            if fault == "echo_auth":
                # Some gateways echo the request headers in their errors; the key must still not
                # leak.
                echoed = (
                    f"{request.headers.get('Authorization')} {request.headers.get('X-Api-Key')}"
                )
                return web.json_response({"error": f"bad key {echoed}"}, status=401)
            if fault in ("http_500", "http_503", "http_429"):
                headers = {"Retry-After": b.retry_after} if fault == "http_429" else {}
                return web.json_response(
                    {"error": "injected"}, status=int(fault[5:]), headers=headers
                )
            if fault == "stall_first_byte":
                await asyncio.sleep(b.stall)
            if fault == "reset_before":
                # One byte of a head first: a drop before any byte on a reused connection is resent
                # instead.
                request.transport.write(b"H")
                request.transport.abort()
                raise ConnectionResetError
            latency = b.latency if hold is None else hold
            await asyncio.sleep(latency + b.ttft + b.latency_per_overlap * (len(self._active) - 1))
        finally:
            self._active.pop(me, None)
            visit[3] = time.monotonic()
            if limited:
                self._release()
        text = self._answer(body, prompt, state)
        logprobs = self._logprobs(body, text, state["max_overlap"])
        cached = len(prompt.split()) if state["cached"] else 0
        if body.get("stream"):
            written = [time.monotonic()]
            try:
                return await self._stream(
                    request, body, text, chat, fault, logprobs, cached, written
                )
            except ConnectionError:
                # The client went away mid-stream: the server's batch changes under what it held
                # then. The close came after the last chunk that was written, and is seen only at
                # the next write: requests that arrived in between may have come after it, so only
                # those held before that last chunk drift.
                self.disconnects.append((request.headers.get("X-Request-Id"), time.monotonic()))
                for other in self._active.values():
                    if other["arrived"] < written[0]:
                        other["neighbour_cancelled"] = True
                return web.Response(status=499)  # nobody reads it: the connection is gone
        return self._whole(body, text, chat, fault, logprobs, cached)

    async def _reset(self, request: web.Request) -> web.Response:
        """vLLM's POST /reset_prefix_cache ({"success": …}) or SGLang's POST /flush_cache, where the
        test gives one."""
        b = self.behaviour
        if b.reset_endpoint != request.path:
            return web.Response(status=404, text="404: Not Found")
        if b.reset_fails_after is not None and self.resets >= b.reset_fails_after:
            return web.json_response({"error": "cannot reset while requests run"}, status=500)
        self.resets += 1
        if not b.reset_lies:
            self.seen_prompts.clear()
        if request.path == "/flush_cache":
            return web.Response(text="Cache flushed.\n")
        return web.json_response({"success": True})

    async def _props(self, request: web.Request) -> web.Response:
        if not self.behaviour.props:
            return web.Response(status=404, text="404: Not Found")
        return web.json_response({"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1})

    async def _admit(self, limit: int) -> None:
        """Wait for one of ``limit`` places; a place freed goes to the request that has waited
        longest."""
        if self._admitted < limit and not self._queue:
            self._admitted += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter in self._queue:
                self._queue.remove(waiter)
            elif waiter.done() and not waiter.cancelled():
                self._release()  # handed a place as it was cancelled: pass it on
            raise

    def _release(self) -> None:
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the place goes straight to it
                return
        self._admitted -= 1

    async def _metrics(self, request: web.Request) -> web.Response:
        """What the server is doing right now, as vLLM or llama.cpp publish it."""
        b = self.behaviour
        self.metrics_polls += 1
        running, waiting = len(self._active), len(self._queue)
        if b.metrics == "hang":
            await asyncio.sleep(3600)
        if b.metrics == "garbage":
            return web.Response(
                text="<html><body>no metrics here</body></html>", content_type="text/html"
            )
        if b.metrics == "malformed":
            return web.Response(text=f"vllm:num_requests_running {running}requests\n")
        if b.metrics == "llamacpp":
            return web.Response(
                text=(
                    "# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused "
                    "from the cache\n"
                    f"# TYPE llamacpp:prompt_tokens_cached_total "
                    f"counter\nllamacpp:prompt_tokens_cached_total "
                    f"{self.prefix_hits}\n# HELP llamacpp:requests_processing Number of requests "
                    f"processing\n"
                    f"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing "
                    f"{running}\n"
                    "# HELP llamacpp:requests_deferred Number of requests deferred\n"
                    f"# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred "
                    f"{waiting}\n"
                )
            )
        if b.metrics == "vllm":
            # Two engines share the work, as vLLM labels its series per engine: a reader must sum
            # them.
            lines = [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
            ]
            lines += [
                f'vllm:num_requests_running{{engine="{e}",model_name="fake"}} {n}.0'
                for e, n in ((0, running - running // 2), (1, running // 2))
            ]
            lines += ["# TYPE vllm:num_requests_waiting gauge"]
            lines += [
                f'vllm:num_requests_waiting{{engine="{e}",model_name="fake"}} {n}.0'
                for e, n in ((0, waiting - waiting // 2), (1, waiting // 2))
            ]
            lines += [
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f'vllm:kv_cache_usage_perc{{engine="0",model_name="fake"}} {running / 8}',
                "# TYPE vllm:prefix_cache_hits counter",
                'vllm:prefix_cache_hits_total{engine="0",model_name="fake"} '
                f"{self.prefix_hits}.0",
                "# TYPE vllm:time_to_first_token_seconds histogram",
                'vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="fake"} 3.0',
                'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="fake"} 4.0',
            ]
            return web.Response(text="\n".join(lines) + "\n")
        return web.Response(status=404, text="404: Not Found")

    def _logprobs(self, body: dict[str, Any], text: str, overlap: int) -> list[float] | None:
        """One logprob per word-token when the request asks (and the server supports it), else
        None."""
        b = self.behaviour
        if (
            not b.logprobs_supported
            or body.get("logprobs") in (None, False)
            or (b.logprobs_alone_only and overlap > 1)
        ):
            return None
        values = []
        for position, word in enumerate(text.split(" ")):
            digest = hashlib.sha256(f"{b.version}{position}:{word}".encode()).digest()
            values.append(-0.01 - int.from_bytes(digest[:4], "big") / 2**32 * 5)
        if b.logprob_drift_at is not None and overlap >= b.logprob_drift_at:
            # Batched numerics: the same tokens win, with slightly other probabilities.
            noise = random.Random()
            for position in range(b.logprob_diverge_at, len(values)):
                values[position] += noise.uniform(1e-7, 1e-5)
        for position, value in b.logprob_nonfinite.items():
            if position < len(values):
                values[position] = value
        return values

    def _logprob_doc(
        self, pieces: list[str], values: list[float], chat: bool, start: int
    ) -> dict[str, Any]:
        """The choice's ``logprobs`` object for these pieces (token positions ``start`` on)."""
        b = self.behaviour
        if chat or b.completions_logprobs == "content":
            entries = []
            for offset, (piece, value) in enumerate(zip(pieces, values, strict=True)):
                entry = {
                    "token": piece,
                    "logprob": value,
                    "top_logprobs": [{"token": piece, "logprob": value}],
                }
                if b.logprob_ids:
                    entry["id"] = (
                        1000 + WORDS.index(piece.strip())
                        if piece.strip() in WORDS
                        else start + offset
                    )
                entries.append(entry)
            return {"content": entries}
        return {
            "tokens": pieces,
            "token_logprobs": values,
            "top_logprobs": [{p: v} for p, v in zip(pieces, values, strict=True)],
        }

    def _answer(self, body: dict[str, Any], prompt: str, state: dict[str, Any]) -> str:
        b = self.behaviour
        if b.answer_for is not None:
            return b.answer_for(prompt, state["max_overlap"])
        temperature = body.get("temperature", 1.0)
        seed = body.get("seed")
        key = hashlib.sha256((b.version + prompt).encode()).digest()
        turn_drift = False
        if b.drift_from_turn is not None and body.get("messages"):
            key = hashlib.sha256(
                (b.version + json.dumps(body["messages"], sort_keys=True)).encode()
            ).digest()
            users = sum(m.get("role") == "user" for m in body["messages"])
            turn_drift = users > b.drift_from_turn and state["max_overlap"] >= 2
        rng = random.Random(key)
        words = [rng.choice(WORDS) for _ in range(b.words)]
        noisy: random.Random | None = None
        sampled = (temperature > 0 or not b.greedy_at_zero) and not b.ignore_temperature
        if b.sampling and sampled:
            noisy = (
                random.Random(f"{key.hex()}-{seed}")
                if seed is not None and b.seed_honoured
                else random.Random()
            )
        crowded = b.drift_at is not None and state["max_overlap"] >= b.drift_at
        mixed = b.drift_when_mixed and len(state["prompts"]) > 1
        cancelled = b.drift_when_cancelled and state.get("neighbour_cancelled", False)
        cold = (
            b.cold_differs
            and prompt not in self.seen_prompts
            and (body.get("cache_prompt", True) or not b.cache_switch)
        )
        self.seen_prompts.add(prompt)
        if crowded and b.batched_variant:
            words[b.diverge_at_word] = "batched"
        elif noisy is None and (crowded or mixed or cancelled or b.always_drift or turn_drift):
            noisy = random.Random()
        if noisy is not None:
            words[b.diverge_at_word :] = [noisy.choice(WORDS) for _ in words[b.diverge_at_word :]]
        if cold:
            words[b.diverge_at_word] = "coldstart"
        if b.warm_differs and state["cached"]:
            words[b.diverge_at_word] = "warmcache"
        return " ".join(words)

    def _whole(
        self,
        body: dict[str, Any],
        text: str,
        chat: bool,
        fault: str | None,
        logprobs: list[float] | None = None,
        cached: int = 0,
    ) -> web.Response:
        if fault == "wrong_content_type":
            return web.Response(text="<html>oops</html>", content_type="text/html")
        if fault == "malformed":
            return web.Response(text='{"choices": [', content_type="application/json")
        if fault == "empty_choices":
            return web.json_response({"choices": []})
        if fault == "error_object":
            return web.json_response({"error": {"message": "injected", "code": 500}})
        choice = {"index": 0, "finish_reason": _finish(fault, self.behaviour)}
        if chat:
            b = self.behaviour
            message = {"role": "assistant", "content": None if b.tool_calls else text}
            if b.reasoning_field:
                message[b.reasoning_field] = _reasoning_text(text, b)
            if b.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": f"call-{secrets.token_hex(4)}",
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                    for name, arguments in _tool_calls(text, b)
                ]
            choice["message"] = message
            if b.chat_text is not None:
                choice["text"] = b.chat_text
        else:
            choice["text"] = text
        pieces = _pieces(text)
        if logprobs is not None:
            choice["logprobs"] = self._logprob_doc(pieces, logprobs, chat, 0)
        tokens = text.split(" ")
        doc = {
            "id": "x",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [choice],
            "system_fingerprint": "fake-1",
            "usage": {
                "prompt_tokens": 7,
                "completion_tokens": len(tokens),
                "total_tokens": 7 + len(tokens),
            },
        }
        account = self._cache_account(cached)
        doc["usage"].update(account.pop("usage", {}))
        return web.json_response(doc | account)

    def _cache_account(self, cached: int) -> dict[str, Any]:
        """What the server says it served from its cache, as vLLM (usage) or llama.cpp (timings)
        says it."""
        b = self.behaviour
        if b.cached_tokens == "usage":
            return {
                "usage": {"prompt_tokens": 7, "prompt_tokens_details": {"cached_tokens": cached}}
            }
        if b.cached_tokens == "timings":
            return {"timings": {"cache_n": cached, "prompt_n": 7 - min(cached, 7)}}
        return {}

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        text: str,
        chat: bool,
        fault: str | None,
        logprobs: list[float] | None = None,
        cached: int = 0,
        written: list[float] | None = None,
    ) -> web.StreamResponse:
        b = self.behaviour
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if fault == "wrong_content_type":
            response.content_type = "text/plain"
        await response.prepare(request)
        pieces = _pieces(text)
        await response.write(b": keep-alive\n\n")
        if chat and b.reasoning_field:
            reasoning = _reasoning_text(text, b)
            for piece in (reasoning[:9], reasoning[9:20], reasoning[20:]):
                await self._event(
                    response,
                    {"choices": [{"index": 0, "delta": {b.reasoning_field: piece}}]},
                    fault,
                )
        for i, piece in enumerate(pieces if not (chat and b.tool_calls) else ()):
            if i == 3 and fault == "stall_mid_stream":
                await asyncio.sleep(b.stall)
            if i == 3 and fault == "reset_mid_stream":
                request.transport.abort()
                return response
            if i == 3 and fault == "truncated":
                await response.write_eof()
                return response
            if i == 3 and fault == "malformed":
                await response.write(b"data: {not json\n\n")
            if i == 3 and fault == "error_event":
                await response.write(b'event: error\ndata: {"error": {"message": "injected"}}\n\n')
            if i == 3 and fault == "error_event_bare":
                # No "error" key and a normal end after it: only the event type says the answer
                # failed.
                await response.write(b'event: error\ndata: {"message": "engine crashed"}\n\n')
            if i == 3 and fault == "error_object":
                await response.write(b'data: {"error": {"message": "injected", "code": 500}}\n\n')
            delta = {"content": piece} if chat else None
            choice = {"index": 0, "delta": delta} if chat else {"index": 0, "text": piece}
            if logprobs is not None:
                choice["logprobs"] = self._logprob_doc([piece], [logprobs[i]], chat, i)
            await self._event(
                response, {"choices": [choice], "system_fingerprint": "fake-1"}, fault
            )
            if written is not None:
                written[0] = time.monotonic()
            if b.chunk_delay:
                await asyncio.sleep(b.chunk_delay)
        if chat and b.tool_calls:
            for index, (name, arguments) in enumerate(_tool_calls(text, b)):
                # As vLLM streams them: the first delta has id and name, then the arguments in
                # pieces.
                head = {
                    "index": index,
                    "id": f"call-{secrets.token_hex(4)}",
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
                deltas = [head] + [
                    {"index": index, "function": {"arguments": arguments[k : k + 7]}}
                    for k in range(0, len(arguments), 7)
                ]
                for delta in deltas:
                    await self._event(
                        response,
                        {"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]},
                        fault,
                    )
        final = {"index": 0, "finish_reason": _finish(fault, b)}
        final.update({"delta": {}} if chat else {"text": ""})
        await self._event(response, {"choices": [final]}, fault)
        usage = {
            "prompt_tokens": 7,
            "completion_tokens": len(pieces),
            "total_tokens": 7 + len(pieces),
        }
        account = self._cache_account(cached)
        usage.update(account.pop("usage", {}))
        await self._event(response, {"choices": [], "usage": usage} | account, fault)
        if b.send_done:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _event(
        self, response: web.StreamResponse, doc: dict[str, Any], fault: str | None
    ) -> None:
        data = f"data: {json.dumps(doc)}\n\n".encode()
        if fault == "trickle":
            for i in range(len(data)):
                await response.write(data[i : i + 1])
        else:
            await response.write(data)


def _pieces(text: str) -> list[str]:
    """The answer's tokens as streamed: each word after the first with its leading space."""
    return [w if i == 0 else " " + w for i, w in enumerate(text.split(" "))]


def _finish(fault: str | None, b: Behaviour) -> str:
    return {"finish_abort": "abort", "finish_error": "error"}.get(
        fault or "", "tool_calls" if b.tool_calls else "stop"
    )


def _reasoning_text(text: str, b: Behaviour) -> str:
    if b.reasoning_for is not None:
        return b.reasoning_for(text)
    noise = f" (attempt {secrets.token_hex(4)})" if b.reasoning_varies else ""
    return f"The user wants words; I will answer {text.split(' ')[0]}{noise}."


def _tool_calls(text: str, b: Behaviour) -> list[tuple[str, str]]:
    calls = []
    for k in range(b.tool_calls):
        args = {"query": text, "page": k}
        if b.tool_args_vary:
            args["nonce"] = secrets.token_hex(4)
        calls.append((f"lookup_{k}", json.dumps(args)))
    return calls


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def main() -> None:
    """Run the fake server as its own process, for sweeps that restart the server between
    settings."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--drift-at", type=int)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--logprob-drift-at", type=int)
    args = parser.parse_args()
    server = FakeServer(
        Behaviour(
            drift_at=args.drift_at, latency=args.latency, logprob_drift_at=args.logprob_drift_at
        )
    )
    serve_until_sigterm(server, args.port)


def serve_until_sigterm(server: FakeServer, port: int) -> None:
    """Serve on ``port`` until the process gets SIGTERM: a crafted server as a process of its own
    (a sweep's ``--server-cmd``)."""
    import signal

    server.port = port
    server.start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    stopped.wait()
    server.stop()


if __name__ == "__main__":
    main()
