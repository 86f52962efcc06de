"""The plain reference client: one aiohttp session, a semaphore, gather — the style of vLLM's and
Thinking Machines' scripts. Deliberately nothing clever; kevload is measured against it, on the same
event loop (``--loop``, uvloop by default as kevload's CLI runs), so the loop is not what is
measured."""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp
import uvloop


async def main(url: str, concurrency: int, requests: int, stream: bool) -> dict:
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 20,
        "stream": stream,
    }
    semaphore = asyncio.Semaphore(concurrency)
    outputs = []

    async def one(session: aiohttp.ClientSession) -> None:
        async with semaphore, session.post(url, json=body) as response:
            if stream:
                text = []
                async for line in response.content:
                    if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                        chunk = json.loads(line[6:])
                        text.append(chunk["choices"][0]["delta"].get("content") or "")
                outputs.append("".join(text))
            else:
                outputs.append((await response.json())["choices"][0]["message"]["content"])

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        await asyncio.gather(*(one(session) for _ in range(requests)))
        seconds = time.perf_counter() - start
    return {
        "requests": len(outputs),
        "seconds": seconds,
        "distinct": len(set(outputs)),
        "loop": loop_name(),
    }


def loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop this client really ran on, for the bench to check."""
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args()
    run = uvloop.run if args.loop == "uvloop" else asyncio.run
    print(json.dumps(run(main(args.url, args.concurrency, args.requests, args.stream))))
