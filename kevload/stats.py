"""Pure numeric helpers: confidence bounds for "no drift seen" and constant-memory latency quantiles."""

from __future__ import annotations

import math

import numpy as np

# Log-spaced bins from 1 µs to ~1.1e4 s with 0.5 % width: quantiles are within 0.5 % of the exact
# value while memory per histogram stays fixed, whatever the number of requests.
_LOW = 1e-6
_GROWTH = 1.005
_BINS = int(math.log(1.1e4 / _LOW) / math.log(_GROWTH)) + 2
_LOG_GROWTH = math.log(_GROWTH)


def drift_upper_bound(n: int, confidence: float = 0.95) -> float:
    """Upper confidence bound on the drift rate after ``n`` clean samples (exact; ≈ 3/n at 95 %)."""
    if n <= 0:
        return 1.0
    return 1.0 - (1.0 - confidence) ** (1.0 / n)


def samples_for_bound(rate: float, confidence: float = 0.95) -> int:
    """Clean samples needed before the upper bound falls to ``rate``."""
    return math.ceil(math.log(1.0 - confidence) / math.log(1.0 - rate))


class LatencyHistogram:
    """Counts latencies (seconds) in fixed log bins; exact min, max and mean, quantiles to 0.5 %."""

    __slots__ = ("_counts", "n", "total", "low", "high")

    def __init__(self) -> None:
        self._counts = np.zeros(_BINS, dtype=np.int64)
        self.n = 0
        self.total = 0.0
        self.low = math.inf
        self.high = -math.inf

    def add(self, value: float) -> None:
        value = max(value, 0.0)
        self._counts[_bin(value)] += 1
        self.n += 1
        self.total += value
        if value < self.low:
            self.low = value
        if value > self.high:
            self.high = value

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0–1): the geometric centre of the bin holding it, clamped to [min, max]."""
        return self._quantile(np.cumsum(self._counts), q) if self.n else math.nan

    def summary(self) -> dict[str, float]:
        if self.n == 0:
            return {"n": 0}
        cumulative = np.cumsum(self._counts)
        out: dict[str, float] = {"n": self.n}
        for name, q in (("p50", 0.50), ("p90", 0.90), ("p99", 0.99)):
            out[name] = round(self._quantile(cumulative, q), 6)
        out["max"] = round(self.high, 6)
        out["mean"] = round(self.total / self.n, 6)
        return out

    def _quantile(self, cumulative: np.ndarray, q: float) -> float:
        rank = max(1, math.ceil(q * self.n))
        index = int(np.searchsorted(cumulative, rank))
        centre = _LOW * _GROWTH ** (index - 0.5) if index > 0 else _LOW
        return min(max(centre, self.low), self.high)


def _bin(value: float) -> int:
    if value <= _LOW:
        return 0
    return min(int(math.log(value / _LOW) / _LOG_GROWTH) + 1, _BINS - 1)
