"""Fixed-size summaries for reports that show *where* outputs disagree (never the whole arrays):

* `abs_err_histogram` / `rel_err_histogram` (`error_histograms`): counts of the finite errors in log-spaced bins
  (`SHOWN_BINS_PER_DECADE` per decade, cut to the occupied range), `over` counting the elements of each bin that
  fail the tolerance, and `zeros` the exact matches;
* `worst_elements`: the `WORST_ELEMENTS` elements furthest beyond their allowance, with their indices;
* `sample_pairs`: at most `SAMPLE_PAIRS` (expected, actual) pairs of finite elements, evenly spaced over the
  output, for a reference-vs-runtime scatter (float outputs only).

They are computed from compare/stats.py's element errors and shown by the HTML report (verify/render_html.py, report/plots.py).
"""
from __future__ import annotations

import concurrent.futures
import functools
import math
from typing import Any, Iterable

import numpy as np

from exportkit.compare.stats import BINS_PER_DECADE, LOG_HI, LOG_LO, ElementErrors, LogHistogram, scalar_value
from exportkit.compare import _log_bins

SHOWN_BINS_PER_DECADE = 10  # histogram bins shown per decade (compare.stats counts 100 per decade)
WORST_ELEMENTS = 10
SAMPLE_PAIRS = 256

_LO_BIN, _HI_BIN = LOG_LO * SHOWN_BINS_PER_DECADE, LOG_HI * SHOWN_BINS_PER_DECADE - 1
_INDICES = _HI_BIN - _LO_BIN + 2  # index 0: zeros (and below 1e-30); 1 + b - _LO_BIN: bin b
_KEY_SHIFT = _log_bins.KEY_SHIFT  # a value's key: its float64 bits >> this (exponent and 8 mantissa bits)
_PARALLEL_ELEMENTS = 1 << 18  # errors from which a second thread pays (starting one costs ~0.1 ms)
_BLOCK = 1024  # elements per block maximum of the worst elements' bound (shorter rows reduce slower)


def _plain_indices(values: np.ndarray) -> np.ndarray:
    """The definition the bins follow: 0 below 1e-30, else 1 + floor(log10(v) * 10) clipped to the grid, minus
    its lowest bin (inf: the last bin; NaN, never binned, too)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        bins = np.clip(np.floor(np.log10(values) * SHOWN_BINS_PER_DECADE), _LO_BIN, _HI_BIN)
    bins[np.isnan(bins)] = _HI_BIN
    return np.where(values < 10.0 ** LOG_LO, 0, bins - (_LO_BIN - 1)).astype(np.intp)


@functools.cache
def _key_table() -> tuple[np.ndarray, np.ndarray]:
    """For every key (the float64 bits of a non-negative value >> _KEY_SHIFT) the index of its values or, for the
    600 keys holding a bin edge, _INDICES + the upper index; and by index, the smallest float64 it starts at.

    The edges are found by bisection over the float64 bits with `_plain_indices` itself, so the bins are exactly its
    bins. A shift and this look-up replace a log10 per element, the slowest step; built once, in milliseconds."""
    upper = np.arange(1, _INDICES)
    below = np.zeros(upper.size, dtype=np.int64)  # 0.0: index 0
    above = np.full(upper.size, np.float64(np.inf).view(np.int64))  # inf: the last index
    while np.any(above - below > 1):  # index(below) < upper <= index(above)
        middle = below + (above - below) // 2
        high = _plain_indices(middle.view(np.float64)) >= upper
        above, below = np.where(high, middle, above), np.where(high, below, middle)
    keys = above >> _KEY_SHIFT
    assert np.all(np.diff(keys) > 0), "two bin edges in one key"
    inside = (above & ((1 << _KEY_SHIFT) - 1)) != 0  # the edge is not its key's first value
    size = 1 << (63 - _KEY_SHIFT)
    table = np.cumsum(np.bincount(keys + inside, minlength=size)[:size]).astype(np.int32)  # edges below its start
    table[keys[inside]] = _INDICES + upper[inside]
    edges = np.full(_INDICES, np.inf)
    edges[upper] = above.view(np.float64)
    return table, edges


def _bin_counts(values: np.ndarray) -> np.ndarray:
    """Counts of the float64 values by index (see `_plain_indices`), in one pass of verify/_log_bins.c."""
    table, edges = _key_table()
    counts = np.zeros(_INDICES, dtype=np.int64)
    _log_bins.count(np.ascontiguousarray(values, dtype=np.float64), table, edges, counts)
    return counts


def error_histogram(values: np.ndarray, failing: np.ndarray | None = None) -> dict | None:
    """Non-negative errors in log bins; `failing`, the values (among them) of the elements that fail the tolerance,
    counted again as each bin's `over`.

    The bins are those of `histogram_summary` (compare.stats' grid, coarsened)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if not values.size:
        return None
    every = _bin_counts(values)
    every_over = None if failing is None else _bin_counts(np.asarray(failing, dtype=np.float64).ravel())
    counts = every[1:]
    occupied = np.flatnonzero(counts)
    lo, hi = (int(occupied[0]), int(occupied[-1]) + 1) if occupied.size else (0, 0)
    return {"start": (lo + _LO_BIN) / SHOWN_BINS_PER_DECADE if occupied.size else None,
            "bins_per_decade": SHOWN_BINS_PER_DECADE, "counts": counts[lo:hi].tolist(),
            "over": None if every_over is None else every_over[1:][lo:hi].tolist(), "zeros": int(every[0])}


def error_histograms(abs_errors: np.ndarray, rel_errors: np.ndarray, errors: ElementErrors,
                     over: np.ndarray | None) -> tuple[dict | None, dict | None]:
    """The histograms of an output's finite absolute and relative errors (compare.py's), with `over` counting those
    of the `over` elements (None: none fails). The failing elements' errors are taken at their positions: cheap
    when few fail, as usual. On large outputs the relative errors are counted in a second thread at the same time
    (the C loop releases the GIL): the two counts were two thirds of the summaries' cost."""
    where = np.empty(0, np.intp) if over is None else np.flatnonzero(over)
    diff, mag = errors.diff.ravel(), errors.mag.ravel()
    where_rel = where[mag[where] > 0]
    failing_rel = diff[where_rel] / mag[where_rel]
    if abs_errors.size + rel_errors.size < _PARALLEL_ELEMENTS:
        return error_histogram(abs_errors, diff[where]), error_histogram(rel_errors, failing_rel)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rel-histogram") as pool:
        rel_histogram = pool.submit(error_histogram, rel_errors, failing_rel)
        return error_histogram(abs_errors, diff[where]), rel_histogram.result()


def histogram_summary(hist: LogHistogram) -> dict | None:
    """A compare.stats LogHistogram (--data's streamed errors) coarsened to SHOWN_BINS_PER_DECADE and cut to its
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

    Usually one pass: the k-th largest of the block maxima bounds the k-th largest value from below (k blocks hold
    a value at least that large), so the k largest lie in the blocks whose maximum reaches the bound; when those are
    few (no mass of ties) only they are ranked. Otherwise the values above the bound, and the first ones equal to
    it, are. A full argpartition over 1M elements cost as much as the whole comparison."""
    n = flat.size
    blocks = n // _BLOCK
    bound = -np.inf
    if blocks > k:
        whole = blocks * _BLOCK
        with np.errstate(invalid="ignore"):
            maxima = np.fmax.reduce(flat[:whole].reshape(blocks, _BLOCK), axis=1)
        present = maxima[~np.isnan(maxima)]
        if present.size >= k:
            bound = np.partition(present, present.size - k)[present.size - k]
            rows = np.flatnonzero(maxima >= bound)
            if rows.size <= 2 * k:
                within = (rows[:, None] * _BLOCK + np.arange(_BLOCK)).ravel()
                return _ranked(flat, np.concatenate([within, np.arange(whole, n)]), k, bound)
    above = np.flatnonzero(flat > bound)
    if above.size < k and bound > -np.inf:  # the bound is the k-th value: its first positions fill up
        above = np.concatenate([above, _first_equal(flat, bound, k - above.size)])
    return _ranked(flat, above, k, bound)


def _ranked(flat: np.ndarray, positions: np.ndarray, k: int, bound: float) -> np.ndarray:
    """The k largest of flat[positions], largest first, ties in position order; NaN and -inf never count.

    `positions` ascend and include every position whose value can be among the k largest (none below `bound`)."""
    values = flat[positions]
    keep = (values >= bound) & (values > -np.inf)
    positions, values = positions[keep], values[keep]
    if positions.size > k:  # at the k-th value, the first positions
        kth = np.partition(values, positions.size - k)[positions.size - k]
        larger = positions[values > kth]
        positions = np.concatenate([larger, positions[values == kth][:k - larger.size]])
    return positions[np.lexsort((positions, -flat[positions]))]


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
