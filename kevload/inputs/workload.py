"""Which prompt goes next: the probe, and the companions that change the batch around it."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from kevload.inputs.probe import Probe
from kevload.inputs.scenario import Scenario

# Different kinds and lengths on purpose: batch composition (lengths, padding, kernels chosen)
# is what makes batched inference drift, so companions should vary it as much as possible.
BUILTIN_COMPANIONS: tuple[tuple[str, str, int], ...] = (
    ("short-fact", "What is the capital of France?", 16),
    ("list", "List five fruits that are red, one per line.", 48),
    ("code", "Write a Python function that returns the n-th Fibonacci number iteratively.", 96),
    (
        "math",
        "A train travels 120 km in 1.5 hours. What is its average speed? Explain briefly.",
        64,
    ),
    (
        "story",
        "Tell a very short story about a lighthouse keeper who finds a message in a bottle.",
        128,
    ),
    (
        "translate",
        "Translate into German: The weather is nice today and we are going to the park.",
        40,
    ),
    ("zh", "请用三句话介绍一下长城的历史。", 80),
    ("json", 'Return a JSON object with keys "name", "age" and "city" for a fictional person.', 48),
    (
        "summary",
        (
            "Summarise in two sentences: The printing press, invented by Johannes Gutenberg around "
            "1440, "
            "made books cheaper and faster to produce. Literacy spread across Europe, scientific "
            "ideas "
            "travelled further, and the Reformation used pamphlets to reach ordinary people. "
            "Within fifty "
            "years millions of books were in circulation, and the way knowledge was stored and "
            "shared "
            "changed for good."
        ),
        72,
    ),
    ("one-word", "Answer with one word: is water wet?", 4),
    ("poem", "Write a four-line poem about autumn leaves.", 56),
    ("explain", "Explain to a ten-year-old why the sky is blue.", 112),
)

_FILLER = (
    "The committee met on a grey morning to review the quarterly figures, the staffing plan, the "
    "maintenance backlog and a long list of small requests from every department. "
)

_SUFFIXES = (
    " Continue in a different direction.",
    " Now answer a different question: what is 17 times 23?",
    " Ignore that and describe a cat instead.",
    " Then list three colours.",
)


@dataclass(frozen=True)
class Companion:
    """A request sent beside the probe to shape the batch it runs in; never compared."""

    item: Probe


def companions_for(probe: Probe, scenario: Scenario) -> list[Companion]:
    """The companion pool for one probe under the scenario's mode (empty in ``single`` mode)."""
    load = scenario.load
    if load.mode == "single":
        return []
    if load.mode == "mixed":
        return [Companion(item) for item in _mixed_pool(scenario)]
    if load.mode == "prefix":
        return _prefix_pool(probe, load.prefix_lengths)
    return _needle_pool(load.needle_length)


class CompanionPicker:
    """Seeded random choice, so a rerun of a scenario sends the same companion sequence."""

    def __init__(self, pool: Sequence[Companion], seed: int):
        self._pool = list(pool)
        self._rng = random.Random(seed)

    def __bool__(self) -> bool:
        return bool(self._pool)

    def next(self) -> Companion:
        return self._rng.choice(self._pool)

    def jitter(self, upper: float) -> float:
        return self._rng.uniform(0.0, upper)


def _mixed_pool(scenario: Scenario) -> list[Probe]:
    # A load.companions file was read, checked and sampled with the scenario
    # (kevload.inputs.datasets).
    for dataset in scenario.datasets:
        if dataset.role == "companion":
            return list(dataset.items)
    return [
        Probe(id=f"companion:{name}", prompt=text, max_tokens=tokens)
        for name, text, tokens in BUILTIN_COMPANIONS
    ]


def _prefix_pool(probe: Probe, lengths: Sequence[int]) -> list[Companion]:
    text = probe.text
    cuts = sorted({min(n, max(len(text) - 1, 1)) for n in lengths})
    pool = []
    for cut in cuts:
        for i, suffix in enumerate(_SUFFIXES):
            content = text[:cut] + suffix
            pool.append(Companion(probe.with_text(content, f"companion:prefix{cut}-{i}")))
    return pool


def _needle_pool(length: int) -> list[Companion]:
    pool = []
    for _i, (name, text, _tokens) in enumerate(BUILTIN_COMPANIONS[:6]):
        body = (_FILLER * (length // len(_FILLER) + 1))[: max(length - len(text), 0)]
        pool.append(
            Companion(
                Probe(id=f"companion:long-{name}", prompt=body + "\n\n" + text, max_tokens=64)
            )
        )
    return pool
