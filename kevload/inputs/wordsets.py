"""The closed sets of words that records, datasets, summaries and run directories use, as
``Literal`` types; each tuple beside its type lists the words in the order reports show them. And
``shortened``: how every message quotes a value that may be long."""

from __future__ import annotations

from typing import Literal, get_args

# What a request was sent as: a probe is compared, a companion only shapes the batch, a warm-up is
# neither.
Role = Literal["probe", "companion", "warmup"]
# The roles a dataset's lines and a cell can have: warm-ups make no cell.
SampleRole = Literal["probe", "companion"]
# ``ok`` is the one status compared; failures are transport words or ``http_<code>``, an open set,
# so a status is a ``str`` and only this word is named.
OK = "ok"
# The status (a word of kevload's) of a request kevload cut on purpose: neither compared nor an
# error.
CANCELLED = "cancelled"

Verdict = Literal["deterministic", "nondeterministic", "inconclusive", "target_failed"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
# A sweep row's verdict: its run's, or ``not_run`` for a setting the sweep never ran (it was
# stopped, it ended at an earlier setting, or that setting's server had already failed); the row's
# ``reason`` says which.
SweepVerdict = Literal[Verdict, "not_run"]
# How an output leaves the serial one (``divergence.divergence_kind``).
DivergenceKind = Literal["token", "length", "finish"]
DIVERGENCE_KINDS: tuple[DivergenceKind, ...] = get_args(DivergenceKind)
# Why a probe cell stopped taking samples: load.until_bound's rule (bound, drift, cap) or
# load.samples.
StopReason = Literal["bound", "drift", "cap", "samples"]
# A run directory's state in run.json and summary.json: running until its invocation ends one of
# three ways.
RunState = Literal["running", "complete", "interrupted", "aborted"]


def shortened(text: str, limit: int, mark: str = "…") -> str:
    """``text`` as a message quotes it: whole if it has at most ``limit`` characters, otherwise its
    start and ``mark``, ``limit`` characters in all."""
    return text if len(text) <= limit else text[: limit - len(mark)] + mark
