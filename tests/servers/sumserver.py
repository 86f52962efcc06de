"""A crafted server process for sweeps against a reference setting: it answers "What is I+2?"
rightly, except the first ``--wrong`` sums (I < N), which it answers one too high. Its truth is
known: with ``--wrong N`` exactly N items go from good to bad against ``--wrong 0``."""

from __future__ import annotations

import argparse
import re

from tests.fakeserver import Behaviour, FakeServer, serve_until_sigterm


def answer(wrong: int):
    def answer_for(prompt: str, overlap: int) -> str:
        a, b = map(int, re.findall(r"\d+", prompt)[:2])
        return f"The answer is {a + b + (1 if a < wrong else 0)}."

    return answer_for


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--wrong", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.01)
    args = parser.parse_args()
    server = FakeServer(Behaviour(answer_for=answer(args.wrong), latency=args.latency))
    serve_until_sigterm(server, args.port)


if __name__ == "__main__":
    main()
