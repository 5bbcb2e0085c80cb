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


def error_histogram(values: np.ndarray, over: np.ndarray | None = None) -> dict | None:
    """Non-negative errors in log bins; `over` marks the values whose element fails the tolerance.

    The bins are those of `histogram_summary` (data.stats' grid, coarsened), computed here in one pass."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if not values.size:
        return None
    tiny = values < 10.0 ** LOG_LO  # zeros (and below 1e-30), as data.stats counts them
    with np.errstate(divide="ignore", invalid="ignore"):
        bins = np.floor(np.log10(values[~tiny]) * SHOWN_BINS_PER_DECADE)
    lo_bin, hi_bin = LOG_LO * SHOWN_BINS_PER_DECADE, LOG_HI * SHOWN_BINS_PER_DECADE - 1
    bins = np.clip(bins, lo_bin, hi_bin).astype(np.int64)  # inf (an overflowing error) into the last bin
    hist = {"start": None, "bins_per_decade": SHOWN_BINS_PER_DECADE, "counts": [],
            "over": None if over is None else [], "zeros": int(tiny.sum())}
    if bins.size:
        first = int(bins.min())
        hist["start"] = first / SHOWN_BINS_PER_DECADE
        hist["counts"] = np.bincount(bins - first).tolist()
        if over is not None:
            hist["over"] = np.bincount(bins[over.ravel()[~tiny]] - first, minlength=len(hist["counts"])).tolist()
    return hist


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


def worst_elements(e: np.ndarray, a: np.ndarray, excess: np.ndarray, ce: str, ca: str,
                    diff: np.ndarray | None = None) -> list[dict]:
    """The WORST_ELEMENTS elements with the largest excess (ties: first position first); -inf never counts."""
    flat = np.asarray(excess, dtype=np.float64).ravel()
    k = min(WORST_ELEMENTS, flat.size)
    if not k:
        return []
    top = np.argpartition(flat, flat.size - k)[flat.size - k:] if flat.size > k else np.arange(flat.size)
    top = top[flat[top] > -np.inf]
    top = top[np.lexsort((top, -flat[top]))]
    out = []
    for f in top:
        idx = tuple(int(i) for i in np.unravel_index(int(f), e.shape))
        abs_err = None if diff is None or not math.isfinite(flat[f]) else float(diff[idx])
        out.append({"index": list(idx), "expected": scalar_value(e, idx, ce), "actual": scalar_value(a, idx, ca),
                    "abs_err": abs_err, "excess": float(flat[f])})
    return out


def sample_pairs(e: np.ndarray, a: np.ndarray, finite: np.ndarray) -> dict | None:
    """At most SAMPLE_PAIRS finite (expected, actual) pairs, evenly spaced over the elements."""
    if np.iscomplexobj(e) or np.iscomplexobj(a):
        return None
    where = np.flatnonzero(finite.ravel())
    if where.size > SAMPLE_PAIRS:
        where = where[np.linspace(0, where.size - 1, SAMPLE_PAIRS).round().astype(np.int64)]
    return {"expected": e.ravel()[where].astype(np.float64).tolist(),
            "actual": a.ravel()[where].astype(np.float64).tolist()}


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
