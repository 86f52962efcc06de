"""The tests' independent view of a real server: stdlib only (urllib, threads, json), none of
kevload's code.

A real server's behaviour is never expected of the engine: whether llama.cpp, transformers serve or
vLLM drifts under batching depends on the CPU, the build and the timing. A test instead measures it
here and asserts that kevload's verdict agrees. Two ways, both parsed by ``answer_of`` alone:

- ``alone_and_together`` sends a probe itself, ``n`` times one after another, then ``k`` copies at
  once (released together by a barrier) with optional companions beside them;
- ``seen_in`` reads the raw bodies a ``RecordingProxy`` kept of the requests kevload made: the same
  requests, so a server that drifts in one window and not in another cannot make the two disagree.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Answer:
    """One answer's text and per-token logprobs (None: the server sent none)."""

    text: str
    logprobs: tuple[float, ...] | None = None


def answer_of(raw: bytes) -> Answer:
    """A chat completion's body (whole, or Server-Sent Events) as an Answer."""
    text = raw.decode()
    if not text.lstrip().startswith("{"):  # events (comments such as ": keep-alive" among them)
        pieces: list[str] = []
        numbers: list[float] = []
        for line in text.splitlines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            for choice in json.loads(line[5:]).get("choices", []):
                pieces.append((choice.get("delta") or {}).get("content") or "")
                numbers += [e["logprob"] for e in _content(choice)]
        return Answer("".join(pieces), tuple(numbers) or None)
    (choice,) = json.loads(text)["choices"]
    content = _content(choice)
    return Answer(choice["message"]["content"] or "", tuple(e["logprob"] for e in content) or None)


def _content(choice: dict) -> list[dict]:
    return (choice.get("logprobs") or {}).get("content") or []


@dataclass(frozen=True)
class Level:
    """The answers of one concurrency level, against the serial ones as kevload defines the
    comparison: the serial reference is the most common serial text (and, among its answers, the
    most common logprob vector); the first of equally common ones counts."""

    answers: tuple[Answer, ...]
    serial: tuple[Answer, ...]

    @property
    def distinct(self) -> int:
        return len({a.text for a in self.answers})

    @property
    def reference(self) -> Answer:
        text = _modal([a.text for a in self.serial])
        return Answer(text, _modal([a.logprobs for a in self.serial if a.text == text]))

    @property
    def drift(self) -> bool:
        """More than one text, or another text than the serial one."""
        return self.distinct > 1 or any(a.text != self.reference.text for a in self.answers)

    @property
    def divergence_chars(self) -> tuple[int, int] | None:
        """Where the answers other than the serial one leave it: the first and the last
        character."""
        reference = self.reference.text
        points = [
            len(os.path.commonprefix([reference, a.text]))
            for a in self.answers
            if a.text != reference
        ]
        return (min(points), max(points)) if points else None

    @property
    def bitwise(self) -> bool | None:
        """Where every answer has the serial text: whether its logprobs equal the serial
        reference's, float for float (None: a text drifted, or logprobs were not sent)."""
        reference = self.reference.logprobs
        if self.drift or reference is None or any(a.logprobs is None for a in self.answers):
            return None
        return all(a.logprobs == reference for a in self.answers)

    @property
    def latent(self) -> bool:
        """The serial text everywhere, other logprobs."""
        return self.bitwise is False


def _modal(values: list) -> Any:
    counts = Counter(values)
    return max(counts, key=lambda v: (counts[v], -values.index(v)))


@dataclass(frozen=True)
class Seen:
    """What the independent client saw: the answers by concurrency level (1: serial)."""

    levels: dict[int, Level] = field(default_factory=dict)

    @property
    def drift(self) -> bool:
        return any(level.drift for level in self.levels.values())

    @property
    def latent(self) -> bool:
        return any(level.latent for level in self.levels.values())

    def of(self, level: int) -> Level:
        return self.levels[level]


def seen(by_level: dict[int, list[Answer]]) -> Seen:
    serial = tuple(by_level.get(1, ()))
    return Seen({c: Level(tuple(a), serial) for c, a in sorted(by_level.items())})


def post(url: str, body: dict, timeout: float = 300) -> bytes:
    request = urllib.request.Request(
        f"{url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def chat(model: str, prompt: str, max_tokens: int, **params: object) -> dict:
    """A greedy chat request asking for per-token logprobs (llama.cpp wants top_logprobs too)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 1,
        **params,
    }


def alone_and_together(
    url: str, body: dict, *, n: int, k: int, companions: Iterable[dict] = ()
) -> Seen:
    """``body`` sent ``n`` times alone, then ``n`` rounds of ``k`` copies at once beside
    ``companions``."""
    alone = [answer_of(post(url, body)) for _ in range(n)]
    together = [a for _ in range(n) for a in at_once(url, [body] * k, list(companions))[:k]]
    return seen({1: alone, k: together})


def at_once(url: str, bodies: list[dict], companions: list[dict]) -> list[Answer]:
    """Every body (then every companion) sent at the same moment, released by one barrier."""
    everything = bodies + companions
    raws: list[bytes | BaseException] = [b""] * len(everything)
    gate = threading.Barrier(len(everything))

    def send(i: int) -> None:
        gate.wait()
        try:
            raws[i] = post(url, everything[i])
        except BaseException as exc:  # noqa: BLE001 - raised below, in the test's thread
            raws[i] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(everything))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for raw in raws:
        if isinstance(raw, BaseException):
            raise raw
    return [answer_of(raw) for raw in raws if isinstance(raw, bytes)]


def seen_in(exchanges: Iterable[tuple[dict, bytes]], run_dir: Path, probe: str = "p1") -> Seen:
    """The counted answers to ``probe`` among the exchanges a RecordingProxy kept of a run, by
    level.

    Only which request was which is read from the run's records (the nonce kevload put in the
    ``user`` field, its level and whether it was counted); the answers are parsed from the raw
    bodies.
    """
    which = {}
    for path in sorted(Path(run_dir).glob("records*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r["role"] == "probe" and r["probe"] == probe and r.get("counted", True):
                which[f"kevload-{r['run_id']}-{r['seq']}"] = r["concurrency"]
    by_level: dict[int, list[Answer]] = defaultdict(list)
    for body, raw in exchanges:
        level = which.get(body.get("user"))
        if level is not None:
            by_level[level].append(answer_of(raw))
    return seen(by_level)


def assert_cells_agree(cells: dict[int, dict], seen: Seen) -> None:
    """kevload's cells say what the independent parse of the same answers says, level by level."""
    assert set(cells) == set(seen.levels), (cells, seen)
    for c, cell in cells.items():
        level = seen.of(c)
        assert cell["ok"] == len(level.answers), (c, cell)
        assert (cell["distinct"], cell["drift"]) == (level.distinct, level.drift), (c, cell, level)
        where = (cell["first_divergence_chars"], cell["last_divergence_chars"])
        assert where == (level.divergence_chars or (None, None)), (c, cell, level)
        if level.bitwise is not None:
            assert cell["logprob_samples"] == len(level.answers), (c, cell)
            assert bool(cell["logprob_bitwise"]) == level.bitwise, (c, cell, level)
        assert bool(cell.get("latent_drift")) == level.latent, (c, cell, level)


# The steps of `kevload diagnose` whose cells are plain levels of one probe (the cache step's are
# rounds of cold and warm samples, compared otherwise).
LEVEL_STEPS = ("baseline", "fixed", "concurrency_single", "concurrency_mixed")


def assert_diagnosis_agrees(
    out: Path, exchanges: list[tuple[dict, bytes]], code: int, probe: str = "probe"
) -> dict[str, Seen]:
    """``kevload diagnose --json out.json --out out`` (run through a RecordingProxy) against the
    independent parse of the requests it made: every level step's cells, `crosstalk` named exactly
    where a concurrency step drifted past a serial answer that held, latent crosstalk where the text
    held and the logprobs did not, and the exit code. Returns what was seen, by step."""
    diagnosis = json.loads((out.parent / f"{out.name}.json").read_text())
    steps = {}
    for step in LEVEL_STEPS:
        if (out / step / "summary.json").is_file():
            summary = json.loads((out / step / "summary.json").read_text())
            cells = {
                c["concurrency"]: c
                for c in summary["cells"]
                if c["probe"] == probe and c["role"] == "probe"
            }
            steps[step] = seen_in(exchanges, out / step, probe)
            assert_cells_agree(cells, steps[step])
    concurrent = [steps[s] for s in ("concurrency_single", "concurrency_mixed") if s in steps]
    fixed = steps["fixed"].of(1)
    # As the guide decides: a concurrency step drifted (at any of its levels) past a serial answer
    # that held.
    crosstalk = not fixed.drift and any(s.drift for s in concurrent)
    causes = {cause["verdict"] for cause in diagnosis["causes"]}
    assert ("crosstalk" in causes) == crosstalk, (diagnosis, steps)
    assert code == (1 if causes else 0), diagnosis
    if crosstalk:
        assert diagnosis["verdict"] == "crosstalk" or diagnosis["verdict"] in causes, diagnosis
    latent = any(level.latent for s in concurrent for c, level in s.levels.items() if c > 1)
    if concurrent and fixed.bitwise is not False and all(s.of(1).bitwise for s in concurrent):
        assert bool(diagnosis["findings"].get("latent_crosstalk")) == latent, diagnosis
    if not causes:
        assert diagnosis["verdict"] == "stable" and not any(s.drift for s in steps.values())
    return steps
