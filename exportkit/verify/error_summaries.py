"""Fixed-size summaries for reports that show *where* outputs disagree (never the whole arrays):

* `abs_err_histogram` / `rel_err_histogram`: counts of the finite errors in log-spaced bins
  (`SHOWN_BINS_PER_DECADE` per decade, cut to the occupied range), `over` counting the elements of each bin that
  fail the tolerance, and `zeros` the exact matches;
* `worst_elements`: the `WORST_ELEMENTS` elements furthest beyond their allowance, with their indices;
* `sample_pairs`: at most `SAMPLE_PAIRS` (expected, actual) pairs of finite elements, evenly spaced over the
  output, for a reference-vs-runtime scatter (float outputs only).

They are computed from verify/compare.py's element errors and shown by the HTML report (verify/html.py, plots.py).
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from exportkit.data.stats import BINS_PER_DECADE, LOG_HI, LOG_LO, LogHistogram, scalar_value

SHOWN_BINS_PER_DECADE = 10  # histogram bins shown per decade (data.stats counts 100 per decade)
WORST_ELEMENTS = 10
SAMPLE_PAIRS = 256

_LO_BIN, _HI_BIN = LOG_LO * SHOWN_BINS_PER_DECADE, LOG_HI * SHOWN_BINS_PER_DECADE - 1
_TWO_52 = 2.0 ** 52
_TWO_52_BITS = int(np.float64(_TWO_52).view(np.int64))
_CHUNK = 1 << 16  # elements binned at a time: the temporaries stay in cache (2x faster than whole arrays on 1M)


def _bin_counts(values: np.ndarray, over: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Counts of the values in 1 + their log bin (0: zeros and values below 1e-30), and of the `over` ones.

    The bin is floor(log10(v) * SHOWN_BINS_PER_DECADE) clipped to the grid, as data.stats bins (inf: the last
    bin); computed a chunk at a time into two reused buffers. Zeros (log10: -inf) are clipped into the lowest
    bin with the errors of [1e-30, 1.26e-30) and moved out of it by one count, only where that bin is occupied."""
    size = _HI_BIN - _LO_BIN + 2
    counts = np.zeros(size, dtype=np.int64)
    over_counts = None if over is None else np.zeros(size, dtype=np.int64)
    floats = np.empty(min(values.size, _CHUNK))
    ints = np.empty(floats.size, dtype=np.intp)
    with np.errstate(divide="ignore", invalid="ignore"):
        for start in range(0, values.size, _CHUNK):
            chunk = values[start:start + _CHUNK]
            bins, index = floats[:chunk.size], ints[:chunk.size]
            np.log10(chunk, out=bins)
            bins *= SHOWN_BINS_PER_DECADE
            np.floor(bins, out=bins)
            np.clip(bins, _LO_BIN, _HI_BIN, out=bins)
            bins += _TWO_52 - (_LO_BIN - 1)  # 1 + bin, an integer: now the low bits of the float
            np.subtract(bins.view(np.int64), _TWO_52_BITS, out=index)  # a subtraction, not a slower cast
            found = np.bincount(index, minlength=size)
            tiny = None
            if found[1]:
                tiny = chunk < 10.0 ** LOG_LO  # zeros (and below 1e-30), as data.stats counts them
                _move_to_zeros(found, np.count_nonzero(tiny))
            counts += found
            if over is not None:
                failing = over[start:start + _CHUNK]
                if failing.any():
                    found = np.bincount(index[failing], minlength=size)
                    if found[1]:
                        _move_to_zeros(found, np.count_nonzero(tiny[failing]))
                    over_counts += found
    return counts, over_counts


def _move_to_zeros(counts: np.ndarray, tiny: int) -> None:
    counts[1] -= tiny
    counts[0] += tiny


def error_histogram(values: np.ndarray, over: np.ndarray | None = None) -> dict | None:
    """Non-negative errors in log bins; `over` marks the values whose element fails the tolerance.

    The bins are those of `histogram_summary` (data.stats' grid, coarsened), counted with np.bincount."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if not values.size:
        return None
    every, every_over = _bin_counts(values, None if over is None else np.asarray(over, dtype=bool).ravel())
    counts = every[1:]
    occupied = np.flatnonzero(counts)
    lo, hi = (int(occupied[0]), int(occupied[-1]) + 1) if occupied.size else (0, 0)
    return {"start": (lo + _LO_BIN) / SHOWN_BINS_PER_DECADE if occupied.size else None,
            "bins_per_decade": SHOWN_BINS_PER_DECADE, "counts": counts[lo:hi].tolist(),
            "over": None if every_over is None else every_over[1:][lo:hi].tolist(), "zeros": int(every[0])}


def histogram_summary(hist: LogHistogram) -> dict | None:
    """A data.stats LogHistogram (--data's streamed errors) coarsened to SHOWN_BINS_PER_DECADE and cut to its
    occupied bins; `over` is None (the stream counts errors, not which of them fail).

    Bin i covers [10**(start + i/bins_per_decade), 10**(start + (i+1)/bins_per_decade)); `zeros` counts exact
    matches (and errors below 1e-30); errors of 1e30 and more are counted in the last bin."""
    if not hist.total:
        return None
    counts = hist.counts[1:-1].reshape(-1, BINS_PER_DECADE // SHOWN_BINS_PER_DECADE).sum(axis=1)
    counts[-1] += hist.counts[-1]
    occupied = np.flatnonzero(counts)
    lo, hi = (int(occupied[0]), int(occupied[-1]) + 1) if occupied.size else (0, 0)
    return {"start": LOG_LO + lo / SHOWN_BINS_PER_DECADE if occupied.size else None,
            "bins_per_decade": SHOWN_BINS_PER_DECADE, "counts": counts[lo:hi].tolist(), "over": None,
            "zeros": int(hist.counts[0])}


def merge_histograms(histograms: Iterable[dict | None]) -> dict | None:
    """Histograms of `error_histogram`/`histogram_summary` added up (their bins lie on one fixed grid)."""
    present = [h for h in histograms if h]
    if not present:
        return None
    step = SHOWN_BINS_PER_DECADE
    spans = [(round((h["start"] - LOG_LO) * step), h) for h in present if h["counts"]]
    lo = min((k for k, _ in spans), default=0)
    hi = max((k + len(h["counts"]) for k, h in spans), default=0)
    counts = np.zeros(hi - lo, dtype=np.int64)
    over = None if any(h["over"] is None for h in present) else np.zeros(hi - lo, dtype=np.int64)
    for k, h in spans:
        counts[k - lo:k - lo + len(h["counts"])] += h["counts"]
        if over is not None:
            over[k - lo:k - lo + len(h["over"])] += h["over"]
    return {"start": LOG_LO + lo / step if spans else None, "bins_per_decade": step, "counts": counts.tolist(),
            "over": None if over is None else over.tolist(), "zeros": sum(h["zeros"] for h in present)}


def _largest(flat: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest values, largest first, ties in position order; NaN and -inf never count.

    O(n) in a few passes: the k-th largest of the block maxima bounds the k-th largest value from below (k blocks
    hold a value at least that large), so only the values above the bound, and the first ones equal to it, are
    ranked. A full argpartition over 1M elements cost as much as the whole comparison."""
    n = flat.size
    blocks = n // (16 * k)
    if blocks > k:
        with np.errstate(invalid="ignore"):
            maxima = np.fmax.reduce(flat[:blocks * (n // blocks)].reshape(blocks, -1), axis=1)
        maxima = maxima[~np.isnan(maxima)]
        bound = np.partition(maxima, maxima.size - k)[maxima.size - k] if maxima.size >= k else -np.inf
    else:
        bound = -np.inf
    above = np.flatnonzero(flat > bound)
    if above.size > k:  # rank the k largest of them; at the k-th value, the first positions
        values = flat[above]
        kth = np.partition(values, above.size - k)[above.size - k]
        larger = above[values > kth]
        above = np.concatenate([larger, above[values == kth][:k - larger.size]])
    elif above.size < k and bound > -np.inf:  # the bound is the k-th value: its first positions fill up
        above = np.concatenate([above, _first_equal(flat, bound, k - above.size)])
    return above[np.lexsort((above, -flat[above]))]


def _first_equal(flat: np.ndarray, value: float, count: int, chunk: int = 1 << 16) -> np.ndarray:
    """The first `count` positions holding `value`, scanning a chunk at a time (ties are often plentiful)."""
    found = []
    for start in range(0, flat.size, chunk):
        found.extend(np.flatnonzero(flat[start:start + chunk] == value)[:count - len(found)] + start)
        if len(found) == count:
            break
    return np.asarray(found, dtype=np.intp)


def worst_elements(e: np.ndarray, a: np.ndarray, excess: np.ndarray, ce: str, ca: str,
                   diff: np.ndarray | None = None) -> list[dict]:
    """The WORST_ELEMENTS elements with the largest excess (ties: first position first); -inf never counts."""
    flat = np.asarray(excess, dtype=np.float64).ravel()
    k = min(WORST_ELEMENTS, flat.size)
    if not k:
        return []
    out = []
    for f in _largest(flat, k):
        idx = tuple(int(i) for i in np.unravel_index(int(f), e.shape))
        abs_err = None if diff is None or not math.isfinite(flat[f]) else float(diff[idx])
        out.append({"index": list(idx), "expected": scalar_value(e, idx, ce), "actual": scalar_value(a, idx, ca),
                    "abs_err": abs_err, "excess": float(flat[f])})
    return out


def sample_pairs(e: np.ndarray, a: np.ndarray, finite: np.ndarray) -> dict | None:
    """At most SAMPLE_PAIRS finite (expected, actual) pairs, evenly spaced over the elements."""
    if np.iscomplexobj(e) or np.iscomplexobj(a):
        return None
    finite = finite.ravel()
    if finite.all():  # the positions of the finite elements are 0..n-1: no list of them
        where = np.arange(finite.size) if finite.size <= SAMPLE_PAIRS else _spaced(finite.size)
    else:
        where = np.flatnonzero(finite)
        if where.size > SAMPLE_PAIRS:
            where = where[_spaced(where.size)]
    return {"expected": e.ravel()[where].astype(np.float64).tolist(),
            "actual": a.ravel()[where].astype(np.float64).tolist()}


def _spaced(n: int) -> np.ndarray:
    """SAMPLE_PAIRS positions evenly spaced over 0..n-1."""
    return np.linspace(0, n - 1, SAMPLE_PAIRS).round().astype(np.int64)


def merge_summaries(items: list[tuple[int, Any]]) -> dict:
    """The fixed-size summaries of several batches' comparisons (batch number, OutputComparison) as one, as the
    OutputComparison fields to set: worst elements get their batch number first."""
    merged: dict = {"abs_err_histogram": merge_histograms(c.abs_err_histogram for _, c in items),
                    "rel_err_histogram": merge_histograms(c.rel_err_histogram for _, c in items)}
    worst = [{**w, "index": [b, *w["index"]]} for b, c in items for w in (c.worst_elements or [])]
    if any(c.worst_elements is not None for _, c in items):
        worst.sort(key=lambda w: (-w["excess"], w["index"]))
        merged["worst_elements"] = worst[:WORST_ELEMENTS]
    pairs = [c.sample_pairs for _, c in items if c.sample_pairs]
    if pairs:
        expected = [x for p in pairs for x in p["expected"]]
        actual = [x for p in pairs for x in p["actual"]]
        keep = np.linspace(0, len(expected) - 1, min(SAMPLE_PAIRS, len(expected))).round().astype(np.int64)
        merged["sample_pairs"] = {"expected": [expected[i] for i in keep], "actual": [actual[i] for i in keep]}
    return merged
