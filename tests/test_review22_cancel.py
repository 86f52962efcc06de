"""Review of #22's cancelled requests: what kevload said that the records or the server's truth did not hold.

- An answer whose end arrived with (or before) its cut-off chunk is whole, not cancelled: vLLM sends the last token
  and its finish_reason in one chunk, and a fast server's last chunks come in one read.
- "drifted only in levels with cancellations" is no finding when the level that held without cuts was a lighter
  load than the one that drifted: a server that drifts under load, cut or not, would say the same.
- The level finding names as "held" only levels that had answers.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from kevload.store import read_records
from tests.conftest import load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer


class WholeAnswerServer(FakeServer):
    """Streams as vLLM does, the finish_reason on the chunk of the last token (``together``: the whole stream in
    one write, as a fast server's last chunks reach the client in one read)."""

    def __init__(self, behaviour: Behaviour, *, together: bool = False):
        super().__init__(behaviour)
        self.together = together

    async def _stream(self, request, body, text, chat, fault, logprobs=None, written=None):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        pieces = text.split(" ")
        events = []
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            choice = {"index": 0, "delta": {"content": piece if i == 0 else " " + piece},
                      "finish_reason": "length" if last else None}
            events.append(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        events.append(b"data: [DONE]\n\n")
        try:
            if self.together:
                await response.write(b"".join(events))
            else:
                for event in events:
                    await response.write(event)
                    await asyncio.sleep(0.01)
            await response.write_eof()
        except ConnectionError:
            self.disconnects.append((request.headers.get("X-Request-Id"), 0.0))
        return response


def run(tmp_path, server, name: str = "run", **load) -> tuple[list[dict], dict, str]:
    settings = {"mode": "mixed", "concurrency": [1, 2], "samples": 4, "stream": True, **load}
    scenario = write_scenario(tmp_path / f"{name}.toml", server.url, **settings)
    code, output = run_cli("run", scenario, "--out", tmp_path / name)
    assert code in (0, 1), output
    return list(read_records(tmp_path / name / "records.jsonl")), load_summary(tmp_path / name), output


def test_an_answer_that_ended_on_its_cut_off_chunk_is_ok_not_cancelled(tmp_path):
    # 6 words, cut after 6 chunks: the 6th chunk carries the finish_reason, the answer is whole.
    with WholeAnswerServer(Behaviour(latency=0.01, words=6)) as server:
        rows, summary, output = run(tmp_path, server, cancel_share=1.0, cancel_after_tokens=6)
    planned = [r for r in rows if r.get("cancel_planned")]
    assert planned and not server.disconnects
    assert all(r["status"] == "ok" and r["finish_reason"] == "length" and r["chunks"] == 6 for r in planned), \
        {r["status"] for r in planned}
    assert summary["cancelled"] == 0


def test_an_answer_whose_end_came_in_the_same_read_as_its_cut_off_chunk_is_ok(tmp_path):
    # The whole stream in one write: kevload holds the finished answer when it counts the 2nd chunk.
    with WholeAnswerServer(Behaviour(latency=0.01, words=6), together=True) as server:
        rows, summary, _ = run(tmp_path, server, cancel_share=1.0, cancel_after_tokens=2)
    planned = [r for r in rows if r.get("cancel_planned")]
    assert planned and all(r["status"] == "ok" and r["chunks"] == 6 for r in planned)
    assert summary["cancelled"] == 0
