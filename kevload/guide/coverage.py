"""The guide's step 4: how live inputs compare with the training set (lengths, keywords, labels)."""

from __future__ import annotations

import codecs
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from kevload.errors import ScenarioError

_LATIN = re.compile(r"[a-z][a-z0-9'_-]+")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
STOPWORDS = frozenset(
    "the a an and or of to in on for is are was were be been it this that with as at by from i you "
    "he she we they "
    "my your our their me him her us them do does did not no yes can could would should will what "
    "which who how "
    "why when where please about into than then so if but".split()
)
_TOP = 20
_RARE_FACTOR = 5.0  # a keyword counts as "rare in training" below 1/5 of its online share
_MIN_SHARE = 0.01  # ...and only keywords in at least 1 % of online inputs are considered
# Production logs have a torn last line (the writer was still writing) or a few broken ones; a file
# that is mostly broken is the wrong file, and the statistics of what is left would mislead.
DEFAULT_MAX_BAD = 10


@dataclass(frozen=True)
class Segmenter:
    """How a run of CJK characters becomes keywords: jieba's words, or character bigrams without
    it."""

    name: str
    cut: Callable[[str], list[str]]


def _bigrams(run: str) -> list[str]:
    return [run[i : i + 2] for i in range(len(run) - 1)]


BIGRAMS = Segmenter("bigram", _bigrams)


def segmenter() -> Segmenter:
    """jieba when it is installed (``pip install kevload[zh]``), character bigrams otherwise."""
    try:
        import jieba
    except ImportError:
        return BIGRAMS
    jieba.setLogLevel(logging.WARNING)  # its dictionary loading talks on stderr otherwise

    def words(run: str) -> list[str]:
        # One-character words are mostly particles (的, 了, 是); they say nothing about the domain.
        return [w for w in jieba.lcut(run) if len(w) > 1]

    return Segmenter("jieba", words)


@dataclass(frozen=True)
class BadLine:
    where: str  # file:line
    reason: str


@dataclass
class Skipped:
    """Lines of one file that were not an input, counted; the first one named."""

    count: int = 0
    first: BadLine | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "first": None if self.first is None else self.first.where,
            "first_reason": None if self.first is None else self.first.reason,
        }


@dataclass
class Side:
    """Streaming statistics for one JSONL file; memory grows with distinct lengths, keywords and
    labels."""

    segmenter: Segmenter = BIGRAMS
    count: int = 0
    lengths: Counter[int] = field(default_factory=Counter)
    keywords: Counter[str] = field(default_factory=Counter)  # document frequency
    labels: Counter[str] = field(default_factory=Counter)
    skipped: Skipped = field(default_factory=Skipped)

    def add(self, text: str, label: str | None) -> None:
        self.count += 1
        self.lengths[len(text)] += 1
        self.keywords.update(set(keywords(text, self.segmenter)))
        if label is not None:
            self.labels[label] += 1

    def length_stats(self) -> dict[str, float | int | None]:
        if not self.count:
            return {"min": None, "p50": None, "p90": None, "p99": None, "max": None}
        values = np.array(sorted(self.lengths), dtype=np.int64)
        cumulative = np.cumsum([self.lengths[v] for v in values])

        def q(p: float) -> int:
            # Nearest-rank percentile over the exact length histogram.
            rank = max(1, math.ceil(p * self.count))
            return int(values[np.searchsorted(cumulative, rank)])

        return {
            "min": int(values[0]),
            "p50": q(0.5),
            "p90": q(0.9),
            "p99": q(0.99),
            "max": int(values[-1]),
        }


def keywords(text: str, seg: Segmenter = BIGRAMS) -> list[str]:
    """Latin-script words (lowercased, stopwords out) and CJK words from ``seg`` (a lone character
    stands alone)."""
    words = [w for w in _LATIN.findall(text.lower()) if w not in STOPWORDS]
    for run in _CJK.findall(text):
        if len(run) == 1:
            words.append(run)
        else:
            words.extend(seg.cut(run))
    return words


def read_inputs(
    path: Path, *, max_bad: int = DEFAULT_MAX_BAD, skipped: Skipped | None = None
) -> Iterator[tuple[str, str | None]]:
    """(input text, label) per line: ``input`` or ``messages`` (the last message's content),
    optional ``label``.

    A line that is not such an object is skipped and counted in ``skipped``; past ``max_bad`` of
    them the file is refused (ScenarioError naming the first one).
    """
    skipped = skipped if skipped is not None else Skipped()
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ScenarioError(f"{path}: coverage input: cannot read: {exc.strerror}") from None
    with handle:
        for number, line in enumerate(handle, 1):
            if number == 1:
                line = line.removeprefix(codecs.BOM_UTF8)  # a byte order mark opening the file
            if not line.strip():
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                doc, reason = (
                    None,
                    "not JSON"
                    if line.endswith(b"\n")
                    else "torn last line (no newline at the end)",
                )
            else:
                reason = "expected an object with input (string) or messages (list)"
            text = _text_of(doc)
            if text is None:
                skipped.count += 1
                skipped.first = skipped.first or BadLine(f"{path}:{number}", reason)
                if skipped.count > max_bad:
                    raise ScenarioError(
                        f"{path}: more than {max_bad} bad lines (--max-bad); the first, "
                        f"{skipped.first.where}: {skipped.first.reason}"
                    )
                continue
            label = doc.get("label")
            yield text, None if label is None else str(label)


def scan(path: Path, *, max_bad: int = DEFAULT_MAX_BAD, seg: Segmenter = BIGRAMS) -> Side:
    side = Side(segmenter=seg)
    for text, label in read_inputs(path, max_bad=max_bad, skipped=side.skipped):
        side.add(text, label)
    return side


def compare(online: Side, train: Side) -> dict[str, Any]:
    """The side-by-side report as a JSON-ready dict."""
    train_len = train.length_stats()
    outside = 0
    low, high = train_len["min"], train_len["max"]
    if low is not None and high is not None:  # the train side has lengths
        outside = sum(n for length, n in online.lengths.items() if length < low or length > high)
    return {
        "segmenter": online.segmenter.name,
        "online": _side_summary(online),
        "train": _side_summary(train),
        "outside_length_range_share": round(outside / online.count, 6) if online.count else None,
        "online_keywords_rare_in_train": rare_keywords(online, train),
        "labels": label_shift(online.labels, train.labels),
    }


def rare_keywords(online: Side, train: Side, limit: int = _TOP) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for word, n in online.keywords.items():
        share = n / online.count
        if share < _MIN_SHARE:
            continue
        train_share = train.keywords.get(word, 0) / train.count if train.count else 0.0
        if train_share < share / _RARE_FACTOR:
            rows.append(
                {
                    "keyword": word,
                    "online_share": round(share, 6),
                    "train_share": round(train_share, 6),
                }
            )
    rows.sort(key=lambda r: (r["train_share"] > 0, -r["online_share"], r["keyword"]))
    return rows[:limit]


def label_shift(online: Counter[str], train: Counter[str], eps: float = 1e-6) -> dict[str, Any]:
    """Label shares on both sides, PSI and Jensen–Shannon divergence (base 2, 0..1)."""
    names = sorted(set(online) | set(train))
    if not names:
        return {"online": {}, "train": {}, "psi": None, "js_divergence": None}
    p = np.array([online.get(n, 0) for n in names], dtype=float)
    q = np.array([train.get(n, 0) for n in names], dtype=float)
    p_share = p / p.sum() if p.sum() else p
    q_share = q / q.sum() if q.sum() else q
    ps, qs = np.clip(p_share, eps, None), np.clip(q_share, eps, None)
    psi = float(np.sum((ps - qs) * np.log(ps / qs)))
    m = (p_share + q_share) / 2
    js = 0.5 * _kl(p_share, m) + 0.5 * _kl(q_share, m)
    return {
        "online": {n: round(float(s), 6) for n, s in zip(names, p_share, strict=True)},
        "train": {n: round(float(s), 6) for n, s in zip(names, q_share, strict=True)},
        "psi": round(psi, 6),
        "js_divergence": round(js, 6),
        "unseen_in_train": [n for n in names if online.get(n) and not train.get(n)],
    }


def boundary_reasons(
    text: str, label: str | None, train: Side, train_len: dict[str, Any]
) -> list[str]:
    """Why one input is a boundary sample with respect to the training set (empty: it is not)."""
    reasons = []
    if train.count and (len(text) < train_len["min"] or len(text) > train_len["max"]):
        reasons.append(
            f"length {len(text)} outside training range {train_len['min']}..{train_len['max']}"
        )
    unseen = sorted({w for w in keywords(text, train.segmenter) if w not in train.keywords})
    if unseen:
        reasons.append("keywords unseen in training: " + ", ".join(unseen[:8]))
    if label is not None and train.labels and label not in train.labels:
        reasons.append(f"label {label!r} unseen in training")
    return reasons


def flag_file(online_path: Path, train: Side, out: Path, *, max_bad: int = DEFAULT_MAX_BAD) -> int:
    """Write every online input with its boundary reasons; returns how many have at least one."""
    train_len = train.length_stats()
    flagged = 0
    with out.open("wb") as handle:
        for text, label in read_inputs(online_path, max_bad=max_bad):
            reasons = boundary_reasons(text, label, train, train_len)
            flagged += bool(reasons)
            handle.write(
                orjson.dumps(
                    {"input": text, "label": label, "boundary": bool(reasons), "reasons": reasons}
                )
                + b"\n"
            )
    return flagged


def probe_coverage(probe_text: str, online_path: Path, train_path: Path) -> dict[str, Any]:
    """Diagnose's data step: is this one input inside the training distribution?"""
    seg = segmenter()
    train = scan(train_path, seg=seg)
    reasons = boundary_reasons(probe_text, None, train, train.length_stats())
    report = compare(scan(online_path, seg=seg), train)
    return {
        "outside": bool(reasons),
        "reasons": reasons,
        "train_length": report["train"]["length"],
        "online_keywords_rare_in_train": report["online_keywords_rare_in_train"][:5],
    }


def _side_summary(side: Side) -> dict[str, Any]:
    return {
        "count": side.count,
        "skipped_lines": side.skipped.to_json(),
        "length": side.length_stats(),
        "top_keywords": [
            {"keyword": w, "share": round(n / side.count, 6)}
            for w, n in sorted(side.keywords.items(), key=lambda kv: (-kv[1], kv[0]))[:_TOP]
        ],
    }


def _text_of(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return None
    text = doc.get("input")
    if isinstance(text, str):
        return text
    messages = doc.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        content = messages[-1].get("content")
        return content if isinstance(content, str) else None
    return None


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    mask = p > 0
    return float(np.sum(p[mask] * np.log2(p[mask] / q[mask])))


def coverage_text(result: dict[str, Any]) -> str:
    on, tr = result["online"], result["train"]
    lines = [
        f"{'':24}{'online':>12}{'train':>12}",
        f"{'count':24}{on['count']:>12}{tr['count']:>12}",
    ]
    for name, side in (("online", on), ("train", tr)):
        skipped = side["skipped_lines"]
        if skipped["count"]:
            lines.append(
                f"{name}: {skipped['count']} bad line(s) skipped; the first, {skipped['first']}: "
                f"{skipped['first_reason']}"
            )
    for key in ("min", "p50", "p90", "p99", "max"):
        lines.append(
            f"{'length ' + key:24}{_num(on['length'][key]):>12}{_num(tr['length'][key]):>12}"
        )
    share = result["outside_length_range_share"]
    lines.append(f"online outside training length range: {share:.1%}" if share is not None else "")
    lines.append(
        "keywords: "
        + (
            "jieba word segmentation"
            if result["segmenter"] == "jieba"
            else "CJK character bigrams (install kevload[zh] for jieba words)"
        )
    )
    lines.append("top keywords online: " + ", ".join(k["keyword"] for k in on["top_keywords"][:10]))
    lines.append("top keywords train:  " + ", ".join(k["keyword"] for k in tr["top_keywords"][:10]))
    rare = result["online_keywords_rare_in_train"]
    lines.append(
        "frequent online, rare or missing in training: "
        + (
            ", ".join(
                f"{r['keyword']} ({r['online_share']:.0%} vs {r['train_share']:.0%})"
                for r in rare[:10]
            )
            or "none"
        )
    )
    labels = result["labels"]
    if labels["psi"] is not None:
        lines.append(
            f"labels: PSI {labels['psi']:.3f}, Jensen-Shannon {labels['js_divergence']:.3f}; "
            f"online "
            + ", ".join(f"{k} {v:.0%}" for k, v in labels["online"].items())
            + "; train "
            + ", ".join(f"{k} {v:.0%}" for k, v in labels["train"].items())
        )
    if "flagged" in result:
        lines.append(f"boundary samples flagged: {result['flagged']} of {on['count']}")
    lines.append("(statistics are clues, not proof)")
    return "\n".join(line for line in lines if line)


def _num(value: Any) -> str:
    return "-" if value is None else str(value)
