"""Tallies whose size does not grow with the run: what lets a report stream 10^5 samples.

Each tally keeps a fixed-size summary of a stream of numbers, not the numbers:

- `Counts`: an exact histogram of non-negative integers (a token count), one
  counter per value up to the largest seen, so its size is the longest
  sequence, never the number of samples; percentiles from it are exact.
- `FoldingGrid`: counts (or sums) in at most `cells` buckets per axis; when a
  value falls past the last bucket, the bucket width doubles and neighbours
  merge, so a run of a minute and a run of a week both end in <= `cells`
  buckets, each exact for its (wider) range.
- `LogHistogram`: a fixed grid of log-spaced buckets (latencies), with the exact
  count, sum and maximum beside it.
- `Picks`: the k smallest (or largest) keys seen, with their ids.
"""
from __future__ import annotations

import heapq
import math

import numpy as np


class Counts:
    """Exact histogram of non-negative integers."""

    def __init__(self) -> None:
        self.counts = np.zeros(0, dtype=np.int64)

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.int64)
        if not values.size:
            return
        values = np.clip(values, 0, None)
        added = np.bincount(values)
        if added.size > self.counts.size:
            added[: self.counts.size] += self.counts
            self.counts = added
        else:
            self.counts[: added.size] += added

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def total(self) -> int:
        return int((self.counts * np.arange(self.counts.size)).sum())

    def quantile(self, q: float) -> int | None:
        """Nearest-rank quantile: the smallest value with at least q of the samples at or below it."""
        n = self.n
        if not n:
            return None
        rank = max(1, math.ceil(q * n))
        return int(np.searchsorted(np.cumsum(self.counts), rank))

    def summary(self) -> dict:
        n = self.n
        if not n:
            return {"n": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None, "mean": None,
                    "total": 0}
        nonzero = np.flatnonzero(self.counts)
        return {"n": n, "min": int(nonzero[0]), "p50": self.quantile(0.5), "p90": self.quantile(0.9),
                "p99": self.quantile(0.99), "max": int(nonzero[-1]), "mean": round(self.total() / n, 2),
                "total": self.total()}

    def bins(self, upper: int, count: int = 60) -> dict:
        """`count` equal-width bins over [0, upper]: left edges, width and counts."""
        width = max(1, math.ceil((upper + 1) / count))
        padded = np.zeros(width * count, dtype=np.int64)
        kept = self.counts[: padded.size]
        padded[: kept.size] = kept
        overflow = int(self.counts[padded.size:].sum())
        per_bin = padded.reshape(count, width).sum(axis=1)
        per_bin[-1] += overflow
        return {"width": width, "edges": [i * width for i in range(count)], "counts": per_bin.tolist()}


class FoldingGrid:
    """Sums over `cells` buckets per axis; a bucket's width doubles whenever a value falls past the end."""

    def __init__(self, dims: int, base: tuple[float, ...], cells: int = 64):
        self.cells, self.widths = cells, list(base)
        self.sums = np.zeros((cells,) * dims, dtype=np.float64)

    def add(self, coords: tuple[np.ndarray, ...], weights: np.ndarray | None = None) -> None:
        coords = tuple(np.clip(np.asarray(c, dtype=np.float64), 0, None) for c in coords)
        if not coords[0].size:
            return
        for axis, values in enumerate(coords):
            while values.max() / self.widths[axis] >= self.cells:
                self._fold(axis)
        index = tuple((values // self.widths[axis]).astype(np.int64) for axis, values in enumerate(coords))
        flat = np.ravel_multi_index(index, self.sums.shape)
        weights = np.ones(flat.size) if weights is None else np.asarray(weights, dtype=np.float64)
        self.sums += np.bincount(flat, weights, minlength=self.sums.size).reshape(self.sums.shape)

    def fold_to(self, widths: list[float]) -> None:
        """Widen to at least `widths` (to line two grids up on one axis)."""
        for axis, width in enumerate(widths):
            while self.widths[axis] < width:
                self._fold(axis)

    def _fold(self, axis: int) -> None:
        moved = np.moveaxis(self.sums, axis, 0)
        merged = moved[0::2] + moved[1::2]
        folded = np.zeros_like(moved)
        folded[: merged.shape[0]] = merged
        self.sums = np.moveaxis(folded, 0, axis)
        self.widths[axis] *= 2

    def used(self, axis: int = 0) -> int:
        """Buckets up to the last non-empty one along an axis."""
        other = tuple(a for a in range(self.sums.ndim) if a != axis)
        filled = np.flatnonzero(self.sums.sum(axis=other) if other else self.sums)
        return int(filled[-1]) + 1 if filled.size else 0


class LogHistogram:
    """Positive values in log-spaced buckets (20 a decade from 1 ms to 10^6 s), with exact n, sum, max."""

    LOW, DECADES, PER_DECADE = -3, 9, 20

    def __init__(self) -> None:
        self.counts = np.zeros(self.DECADES * self.PER_DECADE, dtype=np.int64)
        self.n, self.sum, self.max = 0, 0.0, None

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        values = values[np.isfinite(values)]
        if not values.size:
            return
        self.n += int(values.size)
        self.sum += float(values.sum())
        self.max = float(values.max()) if self.max is None else max(self.max, float(values.max()))
        index = np.floor((np.log10(np.clip(values, 1e-3, None)) - self.LOW) * self.PER_DECADE).astype(np.int64)
        self.counts += np.bincount(np.clip(index, 0, self.counts.size - 1), minlength=self.counts.size)

    def quantile(self, q: float) -> float | None:
        """The upper edge of the bucket holding the nearest-rank quantile (at most 12% above it)."""
        if not self.n:
            return None
        bucket = int(np.searchsorted(np.cumsum(self.counts), max(1, math.ceil(q * self.n))))
        return min(10 ** (self.LOW + (bucket + 1) / self.PER_DECADE), self.max)


class Picks:
    """The k entries with the smallest keys (largest, with `largest=True`); ties broken by id."""

    def __init__(self, k: int = 3, largest: bool = False):
        self.k, self.sign = k, -1 if largest else 1
        self.heap: list[tuple] = []  # a max-heap of the kept entries, by negated key

    def offer(self, key, prompt_id: str) -> None:
        entry = (-self.sign * key, _Desc(prompt_id))
        if any(kept[1].value == prompt_id for kept in self.heap):  # a sample stored twice is one example
            return
        if len(self.heap) < self.k:
            heapq.heappush(self.heap, entry)
        elif entry > self.heap[0]:
            heapq.heapreplace(self.heap, entry)

    def offer_many(self, keys: np.ndarray, ids: list[str] | np.ndarray) -> None:
        """Offer only the candidates that can enter: the k best of a batch."""
        keys = np.asarray(keys)
        if keys.size > self.k:
            order = np.argpartition(self.sign * keys, self.k - 1)[: self.k]
            border = (self.sign * keys)[order].max()
            candidates = np.flatnonzero(self.sign * keys <= border)  # ties at the border too
        else:
            candidates = np.arange(keys.size)
        for i in candidates:
            self.offer(keys[i].item(), str(ids[i]))

    def ids(self) -> list[str]:
        return [entry[1].value for entry in sorted(self.heap, reverse=True)]


class _Desc:
    """An id that sorts backwards, so that among equal keys the smallest ids are kept."""

    __slots__ = ("value",)

    def __init__(self, value: str):
        self.value = value

    def __lt__(self, other: "_Desc") -> bool:
        return self.value > other.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.value == other.value
