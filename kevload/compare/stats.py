"""Pure numeric helpers: confidence bounds for "no drift seen", agreement intervals and
constant-memory latency quantiles."""

from __future__ import annotations

import math

import numpy as np

# Log-spaced bins from 1 µs to ~1.1e4 s with 0.5 % width: quantiles are within 0.5 % of the exact
# value while memory per histogram stays fixed, whatever the number of requests.
_LOW = 1e-6
_GROWTH = 1.005
_BINS = int(math.log(1.1e4 / _LOW) / math.log(_GROWTH)) + 2
_LOG_GROWTH = math.log(_GROWTH)
_BATCH = 4096


def drift_upper_bound(n: int, confidence: float = 0.95) -> float:
    """Upper confidence bound on the drift rate after ``n`` clean samples (exact; ≈ 3/n at 95 %)."""
    if n <= 0:
        return 1.0
    return 1.0 - float((1.0 - confidence) ** (1.0 / n))


def samples_for_bound(rate: float, confidence: float = 0.95) -> int:
    """Clean samples needed before the upper bound falls to ``rate``."""
    return math.ceil(math.log(1.0 - confidence) / math.log(1.0 - rate))


# Two-sided 95 % normal quantile (scipy.stats.norm.ppf(0.975)); the only confidence the summaries
# use.
Z95 = 1.959963984540054


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion ``successes / n`` (95 % by default).

    Chosen over the normal (Wald) interval because it stays inside [0, 1] and keeps a width at 0/n
    and n/n, where a determinism claim lives: 8 agreeing samples of 8 give [0.676, 1], not [1, 1].
    ``successes`` may be fractional (a summed share, see ``mean_share_interval``). n = 0: [0, 1].
    """
    if n <= 0:
        return 0.0, 1.0
    p = min(max(successes / n, 0.0), 1.0)
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # At p = 0 or 1 the interval touches the bound exactly; rounding must not push it off.
    low = 0.0 if p == 0.0 else max(0.0, centre - half)
    high = 1.0 if p == 1.0 else min(1.0, centre + half)
    return low, high


def mean_share_interval(
    shares: list[tuple[float, int]], z: float = Z95
) -> tuple[float, float, float] | None:
    """Mean of per-sample shares in [0, 1], given as (share, how many samples had it), with its
    interval.

    The interval is Wilson's with the summed shares as successes and the samples as trials. Any
    variable in [0, 1] with mean p has variance at most p(1 - p), the Bernoulli case Wilson assumes,
    so this interval is at least as wide as a score interval with the true variance: conservative,
    and unlike a t-interval it does not collapse to zero width when every sample agrees fully.
    Returns (mean, low, high), or None without samples.
    """
    n = sum(count for _, count in shares)
    if n <= 0:
        return None
    total = sum(share * count for share, count in shares)
    low, high = wilson_interval(total, n, z)
    return total / n, low, high


class LatencyHistogram:
    """Counts latencies (seconds) in fixed log bins; exact min, max and mean, quantiles to 0.5 %.

    Values are buffered and binned in batches with numpy: one Python list append per value
    instead of a log and a numpy scalar update, which kept the comparator from 1M records/3 s.
    """

    __slots__ = ("_counts", "_pending", "n", "total", "low", "high")

    def __init__(self) -> None:
        self._counts = np.zeros(_BINS, dtype=np.int64)
        self._pending: list[float] = []
        self.n = 0
        self.total = 0.0
        self.low = math.inf
        self.high = -math.inf

    def add(self, value: float) -> None:
        self._pending.append(value)
        if len(self._pending) >= _BATCH:
            self._flush()

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0–1): the geometric centre of the bin holding it, clamped to [min,
        max]."""
        self._flush()
        return self._quantile(np.cumsum(self._counts), q) if self.n else math.nan

    def summary(self) -> dict[str, float]:
        self._flush()
        if self.n == 0:
            return {"n": 0}
        cumulative = np.cumsum(self._counts)
        out: dict[str, float] = {"n": self.n}
        for name, q in (("p50", 0.50), ("p90", 0.90), ("p99", 0.99)):
            out[name] = round(self._quantile(cumulative, q), 6)
        out["max"] = round(self.high, 6)
        out["mean"] = round(self.total / self.n, 6)
        return out

    @property
    def n_total(self) -> int:
        return self.n + len(self._pending)

    def merge(self, other: LatencyHistogram) -> None:
        self._flush()
        other._flush()
        self._counts += other._counts
        self.n += other.n
        self.total += other.total
        self.low = min(self.low, other.low)
        self.high = max(self.high, other.high)

    def _flush(self) -> None:
        if not self._pending:
            return
        values = np.maximum(np.asarray(self._pending, dtype=np.float64), 0.0)
        self._pending.clear()
        with np.errstate(divide="ignore"):
            index = np.where(
                values <= _LOW, 0, np.log(np.maximum(values, _LOW) / _LOW) / _LOG_GROWTH + 1
            )
        self._counts += np.bincount(np.minimum(index.astype(np.int64), _BINS - 1), minlength=_BINS)
        self.n += len(values)
        self.total += float(values.sum())
        self.low = min(self.low, float(values.min()))
        self.high = max(self.high, float(values.max()))

    def _quantile(self, cumulative: np.ndarray, q: float) -> float:
        rank = max(1, math.ceil(q * self.n))
        index = int(np.searchsorted(cumulative, rank))
        centre = _LOW * _GROWTH ** (index - 0.5) if index > 0 else _LOW
        return min(max(centre, self.low), self.high)


def mcnemar_exact(good_to_bad: int, bad_to_good: int) -> float:
    """Two-sided exact McNemar p-value for paired good/bad outcomes: under "no change", each of the
    n discordant pairs goes either way with probability 1/2, so the smaller count is Binomial(n,
    1/2); p is twice its lower tail, at most 1 (1 with no discordant pair: nothing says the two
    differ)."""
    n = good_to_bad + bad_to_good
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(good_to_bad, bad_to_good) + 1))
    return min(1.0, 2 * tail / (1 << n))  # exact integers (1 << n is 2**n) until the one division


# Resamples of a bootstrap interval, and how many are drawn at once (memory: draws × samples
# floats).
BOOTSTRAP_DRAWS = 2000
_BOOTSTRAP_CHUNK = 100


def bootstrap_ratio(
    reference: list[float], candidate: list[float], q: float, *, seed: int = 0
) -> tuple[float, float, float] | None:
    """The ratio of the ``q`` quantiles, candidate over reference, with its 95 %
    percentile-bootstrap interval.

    Each side is resampled on its own (two independent samples of requests), ``BOOTSTRAP_DRAWS``
    times, with numpy's generator seeded by ``seed``: the same records give the same interval. None
    where a side has no value or the reference's quantile is 0 (no ratio)."""
    if not reference or not candidate:
        return None
    ref, cand = np.asarray(reference, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    base = float(np.quantile(ref, q))
    if base <= 0:
        return None
    rng = np.random.default_rng(seed)
    ratios = []
    for start in range(0, BOOTSTRAP_DRAWS, _BOOTSTRAP_CHUNK):
        draws = min(_BOOTSTRAP_CHUNK, BOOTSTRAP_DRAWS - start)
        r = np.quantile(ref[rng.integers(0, ref.size, (draws, ref.size))], q, axis=1)
        c = np.quantile(cand[rng.integers(0, cand.size, (draws, cand.size))], q, axis=1)
        ratios.append(c / np.maximum(r, 1e-12))
    low, high = np.quantile(np.concatenate(ratios), [0.025, 0.975])
    return float(np.quantile(cand, q)) / base, float(low), float(high)


PERMUTATIONS = 2000  # relabelings drawn by ``spread_p``


def spread_p(
    items: list[tuple[list[int], list[int]]], *, seed: int = 0, draws: int = PERMUTATIONS
) -> float:
    """Whether a candidate's answers leave the reference's more than its spread explains: the
    p-value of a permutation test stratified by item, seeded (the same answers give the same p).

    ``items``: per item, the text of each reference sample and of each candidate sample, as labels.
    The statistic is, per item, how many candidate samples have a text no reference sample has,
    standardized by its distribution over relabelings of that item's samples, summed over items.
    Under "both sides draw from the same answers" every relabeling within an item is as likely as
    the one seen, so the p-value is exact up to the draws; an item whose samples all have one text
    has no relabeling that differs and adds nothing. Samples of one item are exchangeable, never
    pooled across items. 1 with no item that can differ."""
    rng = np.random.default_rng(seed)
    observed, null, used = 0.0, np.zeros(draws), False
    for ref, cand in items:
        pooled = np.asarray([*ref, *cand], dtype=np.int64)
        if len(ref) == 0 or len(cand) == 0 or np.all(pooled == pooled[0]):
            continue
        perms = pooled[np.argsort(rng.random((draws, pooled.size)), axis=1)]
        counts = _outside(perms[:, : len(ref)], perms[:, len(ref) :])
        seen = _outside(pooled[None, : len(ref)], pooled[None, len(ref) :])[0]
        mean, sd = counts.mean(), counts.std()
        if sd == 0:
            continue
        used = True
        observed += (seen - mean) / sd
        null += (counts - mean) / sd
    if not used:
        return 1.0
    return float((1 + np.sum(null >= observed - 1e-9)) / (draws + 1))


def _outside(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """Per row: candidate entries whose label no reference entry of the row has."""
    out = np.zeros(ref.shape[0])
    for label in np.unique(np.concatenate([ref.ravel(), cand.ravel()])):
        out += (cand == label).sum(axis=1) * ~(ref == label).any(axis=1)
    return out
