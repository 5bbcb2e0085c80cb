"""Pure comparison functions: two arrays and a tolerance in, one `OutputComparison` out.

No TensorFlow here (numpy + stdlib; `ml_dtypes` arrays such as bfloat16 are understood).

Element rule (numpy.isclose semantics, the reference value is `expected`)::

    |actual - expected| <= atol + rtol * |expected|

* NaN matches only NaN at the same position; +Inf/-Inf match only the same infinity at the same position.
  Such mismatches can be fixed by no tolerance: `required_atol`/`required_rtol` become `inf`.
* Strings (bytes/str, any of the `S`, `U` or object-of-bytes conventions) and bools compare exactly; the
  tolerance is ignored for them and the required tolerances are `None`.
* Integers follow the rule above (their default tolerance is exact, 0/0); since two different integers differ
  by at least 1, an integer element passes iff it is equal or `max(|a-e|, 1) <= atol + rtol*|e|`.
* All floating types (including bfloat16, float16) are compared in float64 (complex in complex128).
* A shape mismatch fails and computes nothing else. A dtype mismatch fails, but the errors are still
  computed when both sides are numeric.

Statistics:

* `max_abs_err`: largest |a-e| over the elements where both sides are finite.
* `max_rel_err`: largest |a-e|/|e| over the elements where both are finite and `e != 0` (elements whose
  expected value is 0 can only be judged by atol; they show up in `required_rtol` as `inf` if they exceed atol).
* `worst_index`: the element furthest beyond what it is allowed (largest |a-e| - (atol + rtol*|e|)); a NaN/Inf
  mismatch, if any, is always the worst. For a passing output it is the element with the smallest margin.
  For strings/bools it is the first differing element (None when all are equal).
* `required_atol`: the smallest atol with which every element passes at the given rtol; `required_rtol` the
  smallest rtol with which every element passes at the given atol. Both are checked against the very same
  float64 formula, so using them passes, and anything smaller fails.

Fixed-size summaries for reports that show *where* outputs disagree (never the whole arrays):

* `abs_err_histogram` / `rel_err_histogram`: counts of the finite errors in log-spaced bins
  (`SHOWN_BINS_PER_DECADE` per decade, cut to the occupied range), `over` counting the elements of each bin that
  fail the tolerance, and `zeros` the exact matches;
* `worst_elements`: the `WORST_ELEMENTS` elements furthest beyond their allowance, with their indices;
* `sample_pairs`: at most `SAMPLE_PAIRS` (expected, actual) pairs of finite elements, evenly spaced over the
  output, for a reference-vs-runtime scatter (float outputs only).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable

import numpy as np

from exportkit.data.stats import (BINS_PER_DECADE, LOG_HI, LOG_LO, LogHistogram, category_of, element_errors,
                                  scalar_value, to_bytes)
from exportkit.dtypes import canonical, is_float, name_of_array
from exportkit.errors import UsageError

# --------------------------------------------------------------------------------------------- tolerances


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    def __str__(self) -> str:
        if self.atol == 0 and self.rtol == 0:
            return "exact"
        return f"atol={_g(self.atol)} rtol={_g(self.rtol)}"


# Defaults per output dtype. Reasoning (eps = machine epsilon of the type):
# * float32 (eps 1.2e-7): 1e-5/1e-5 is ~80 ulps. Reloaded graphs on CPU are usually bit-exact, but eager Keras
#   vs a TF1 session or TF Serving may pick other kernels (oneDNN fusions, different reduction order), which
#   moves results by a few ulps per op and accumulates through a network; 1e-5 absorbs that while still
#   catching real bugs (a wrong weight, a dropped layer, float16 sneaking in, all >= 1e-3). TF32 on Ampere GPUs
#   moves results by ~1e-3 relative, which this deliberately does NOT hide.
# * float64 (eps 2.2e-16): 1e-10/1e-10 is ~450k ulps: generous for reordering, yet tight enough to catch a
#   silent float32 computation inside a float64 model (errors around 1e-7).
# * float16 (eps 9.8e-4): 1e-2/1e-2 is ~10 ulps; fp16 rounding differences between kernels are a few ulps.
# * bfloat16 (eps 7.8e-3, 8 significant bits): 5e-2/5e-2 is ~6 ulps.
# * float8 types: 0.25/0.25 (2-3 significant bits; only a sanity check).
# * integers, bools, strings: exact.
_DEFAULTS = {
    "float64": Tolerance(1e-10, 1e-10),
    "complex128": Tolerance(1e-10, 1e-10),
    "float32": Tolerance(1e-5, 1e-5),
    "complex64": Tolerance(1e-5, 1e-5),
    "float16": Tolerance(1e-2, 1e-2),
    "bfloat16": Tolerance(5e-2, 5e-2),
}
EXACT = Tolerance(0.0, 0.0)

def default_tolerance(dtype_name: str) -> Tolerance:
    """The default tolerance for an output of this dtype (see the table above)."""
    name = canonical(dtype_name)
    if name in _DEFAULTS:
        return _DEFAULTS[name]
    if name.startswith(("float8_", "float6_", "float4_")):
        return Tolerance(0.25, 0.25)
    if name in ("float128", "longdouble", "complex256"):
        return _DEFAULTS["float64"]
    return EXACT


def parse_tol(spec: str) -> tuple[str, Tolerance]:
    """Parse `KEY=ATOL,RTOL` (the `--tol` option), e.g. `score=1e-4,1e-3`."""
    form = "expected KEY=ATOL,RTOL with two non-negative numbers, e.g. --tol score=1e-4,1e-3"
    key, sep, values = spec.rpartition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"bad --tol {spec!r}", form)
    parts = [p.strip() for p in values.split(",")]
    if len(parts) != 2:
        raise UsageError(f"bad --tol {spec!r}", form)
    try:
        atol, rtol = (float(p) for p in parts)
    except ValueError:
        raise UsageError(f"bad --tol {spec!r}: not a number", form) from None
    if not (math.isfinite(atol) and math.isfinite(rtol)) or atol < 0 or rtol < 0:
        raise UsageError(f"bad --tol {spec!r}: tolerances must be finite and >= 0", form)
    return key, Tolerance(atol, rtol)


def resolve_tolerance(key: str, dtype_name: str, atol: float | None = None, rtol: float | None = None,
                      per_output: dict[str, Tolerance] | None = None) -> Tolerance:
    """Per-output tolerance (`--tol KEY=..`) beats the global `--atol/--rtol` flags beats the dtype default.

    The global flags apply to floating outputs only: integer outputs stay exact unless named with `--tol`, and
    bools/strings are always compared exactly (a tolerance means nothing for them). A global flag given alone
    keeps the dtype default for the other one.
    """
    if per_output and key in per_output:
        return per_output[key]
    base = default_tolerance(dtype_name)
    if is_float(dtype_name) and (atol is not None or rtol is not None):
        return Tolerance(base.atol if atol is None else float(atol), base.rtol if rtol is None else float(rtol))
    return base


# --------------------------------------------------------------------------------------------- results


@dataclass
class OutputComparison:
    """One output of one runtime compared with the reference (possibly merged over several batches).

    `reason` is None when passed, else one of (joined with "; " when several apply):
    "missing in runtime", "unexpected output", "shape (2, 3) != (2, 4)" and "dtype float16 != float32"
    (the runtime's value first, the reference's second), "NaN/Inf mismatch in N of M elements",
    "N of M elements over tolerance" (numbers), "N of M elements differ" (strings, bools).
    Merged results with a structural failure in one batch say which: "shape (8, 3) != (8, 4) (batch 1)".
    Shapes of merged results have -1 where the batches differ (the batch size).
    """

    key: str
    passed: bool
    reason: str | None = None
    expected_dtype: str | None = None
    actual_dtype: str | None = None
    expected_shape: tuple | None = None
    actual_shape: tuple | None = None
    atol: float | None = None
    rtol: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    mismatch_fraction: float | None = None
    worst_index: tuple | None = None
    worst_expected: Any = None
    worst_actual: Any = None
    required_atol: float | None = None
    required_rtol: float | None = None
    elements: int | None = None  # elements compared (sum over batches)
    mismatched: int | None = None  # elements over tolerance, NaN/Inf mismatches included
    nonfinite_mismatched: int | None = None  # NaN/Inf mismatches alone
    batches: int = 1
    # --data runs only (streamed over records; see exportkit.data.stats)
    records: int | None = None  # records compared
    failing_records: int | None = None  # records with at least one element over tolerance
    abs_err_quantiles: dict | None = None  # {"p50": .., "p99": .., "p99.9": ..} of per-element |a - e|
    rel_err_quantiles: dict | None = None  # the same of |a - e| / |e| (e != 0)
    worst_records: list | None = None  # [{"file", "index", "offset", "element", "expected", "actual", ...}]
    # fixed-size summaries for the HTML report (see the module docstring)
    abs_err_histogram: dict | None = None  # {"start", "bins_per_decade", "counts", "over", "zeros"}
    rel_err_histogram: dict | None = None
    worst_elements: list | None = None  # [{"index", "expected", "actual", "abs_err", "excess"}], worst first
    sample_pairs: dict | None = None  # {"expected": [...], "actual": [...]}
    # how far the worst element is beyond its allowance (inf for NaN/Inf mismatch); used to merge batches
    worst_excess: float | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        """JSON-safe: lists instead of tuples, Python scalars, NaN/Inf as the strings "nan", "inf", "-inf"."""
        return {f.name: to_jsonable(getattr(self, f.name)) for f in fields(self) if f.name != "worst_excess"}

    @property
    def exact(self) -> bool:
        """Compared for equality (strings, bools) rather than with a tolerance."""
        return category_of(self.expected_dtype or self.actual_dtype or "") in ("string", "bool")


def to_jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (np.bool_,)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return f
    if isinstance(v, (complex, np.complexfloating)):
        return str(complex(v))
    if isinstance(v, (bytes, np.bytes_)):
        return bytes(v).decode("utf-8", errors="backslashreplace")
    if isinstance(v, (list, tuple)):
        return [to_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): to_jsonable(x) for k, x in v.items()}
    if isinstance(v, np.ndarray):
        return to_jsonable(v.tolist())
    return str(v)


# --------------------------------------------------------------------------------------------- dtypes




def _category(arr: np.ndarray) -> str:
    return category_of(name_of_array(arr))


def _g(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}"


# --------------------------------------------------------------------------------------------- summaries

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


def _worst_elements(e: np.ndarray, a: np.ndarray, excess: np.ndarray, ce: str, ca: str,
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


def _sample_pairs(e: np.ndarray, a: np.ndarray, finite: np.ndarray) -> dict | None:
    """At most SAMPLE_PAIRS finite (expected, actual) pairs, evenly spaced over the elements."""
    if np.iscomplexobj(e) or np.iscomplexobj(a):
        return None
    where = np.flatnonzero(finite.ravel())
    if where.size > SAMPLE_PAIRS:
        where = where[np.linspace(0, where.size - 1, SAMPLE_PAIRS).round().astype(np.int64)]
    return {"expected": e.ravel()[where].astype(np.float64).tolist(),
            "actual": a.ravel()[where].astype(np.float64).tolist()}


def _merge_summaries(res: OutputComparison, items: list[tuple[int, OutputComparison]]) -> None:
    """The fixed-size summaries of several batches as one: worst elements get their batch number first."""
    res.abs_err_histogram = merge_histograms(c.abs_err_histogram for _, c in items)
    res.rel_err_histogram = merge_histograms(c.rel_err_histogram for _, c in items)
    worst = [{**w, "index": [b, *w["index"]]} for b, c in items for w in (c.worst_elements or [])]
    if any(c.worst_elements is not None for _, c in items):
        worst.sort(key=lambda w: (-w["excess"], w["index"]))
        res.worst_elements = worst[:WORST_ELEMENTS]
    pairs = [c.sample_pairs for _, c in items if c.sample_pairs]
    if pairs:
        expected = [x for p in pairs for x in p["expected"]]
        actual = [x for p in pairs for x in p["actual"]]
        keep = np.linspace(0, len(expected) - 1, min(SAMPLE_PAIRS, len(expected))).round().astype(np.int64)
        res.sample_pairs = {"expected": [expected[i] for i in keep], "actual": [actual[i] for i in keep]}


# --------------------------------------------------------------------------------------------- compare


def value_reasons(elements: int, mismatched: int, nonfinite: int, exact: bool) -> list[str]:
    """Why values differ, from the counts (shared with verify --data's streaming statistics)."""
    parts = []
    if nonfinite:
        parts.append(f"NaN/Inf mismatch in {nonfinite} of {elements} elements")
    rest = mismatched - nonfinite
    if rest:
        parts.append(f"{rest} of {elements} elements {'differ' if exact else 'over tolerance'}")
    return parts


def _smallest_passing(start: float, ok: Callable[[float], bool]) -> float:
    """`start` nudged up by ulps until `ok` holds (float64 rounding of a + r*m may be one ulp short)."""
    x = float(start)
    if math.isnan(x):  # inf - inf on overflowing inputs
        x = 0.0
    for _ in range(64):
        if ok(x):
            return x
        x = float(np.nextafter(x, np.inf))
    # still failing: grow geometrically (never expected; keeps the guarantee "using it passes")
    while not ok(x):
        x = x * 2 if x > 0 else np.finfo(np.float64).tiny
    return x


def compare_arrays(key: str, expected: Any, actual: Any, tol: Tolerance) -> OutputComparison:
    """Compare one runtime's output (`actual`) with the reference (`expected`); see the module docstring."""
    e = np.asarray(expected)
    a = np.asarray(actual)
    edt, adt = name_of_array(e), name_of_array(a)
    res = OutputComparison(key=key, passed=False, expected_dtype=edt, actual_dtype=adt,
                           expected_shape=tuple(int(d) for d in e.shape), actual_shape=tuple(int(d) for d in a.shape),
                           atol=float(tol.atol), rtol=float(tol.rtol))
    if e.shape != a.shape:
        res.reason = f"shape {res.actual_shape} != {res.expected_shape}"
        if edt != adt:
            res.reason += f"; dtype {adt} != {edt}"
        return res

    reasons = [f"dtype {adt} != {edt}"] if edt != adt else []
    ce, ca = _category(e), _category(a)
    res.elements = int(e.size)
    if ce == ca and ce in ("string", "bool", "other"):
        return _compare_exact(res, e, a, ce, reasons)
    if {ce, ca} <= {"bool", "int", "float"}:
        with np.errstate(all="ignore"):  # overflow near float64 max only makes errors inf
            return _compare_numeric(res, e, a, ce, ca, tol, reasons)
    res.reason = "; ".join(reasons + ["values not comparable"])
    return res


def _compare_exact(res: OutputComparison, e: np.ndarray, a: np.ndarray, cat: str, reasons: list[str]) -> OutputComparison:
    n = int(e.size)
    if cat == "string":
        ef = [to_bytes(x) for x in e.flat]
        af = [to_bytes(x) for x in a.flat]
        diff = np.array([x != y for x, y in zip(ef, af)], dtype=bool).reshape(e.shape)
    elif cat == "bool":
        diff = np.asarray(e != a, dtype=bool)
    else:
        diff = np.array([not (x == y) for x, y in zip(e.flat, a.flat)], dtype=bool).reshape(e.shape)
    m = int(diff.sum())
    res.worst_elements = _worst_elements(e, a, np.where(diff, np.inf, -np.inf), cat, cat)
    res.mismatched, res.nonfinite_mismatched = m, 0
    res.mismatch_fraction = m / n if n else 0.0
    if m:
        idx = tuple(int(i) for i in np.argwhere(diff)[0])
        res.worst_index = idx
        res.worst_expected = scalar_value(e, idx, cat)
        res.worst_actual = scalar_value(a, idx, cat)
        res.worst_excess = math.inf
    else:
        res.worst_excess = 0.0 if n else None
    reasons = reasons + value_reasons(n, m, 0, exact=True)
    res.passed = not reasons
    res.reason = "; ".join(reasons) or None
    return res


def _compare_numeric(res: OutputComparison, e: np.ndarray, a: np.ndarray, ce: str, ca: str, tol: Tolerance,
                     reasons: list[str]) -> OutputComparison:
    n = int(e.size)
    atol, rtol = float(tol.atol), float(tol.rtol)
    err = element_errors(e, a, atol, rtol, both_int=ce in ("int", "bool") and ca in ("int", "bool"))
    diff, mag, finite, nonfinite_bad, allowed = err.diff, err.mag, err.finite, err.nonfinite_bad, err.allowed
    over = err.over
    bad = over | nonfinite_bad
    m, nf = int(bad.sum()), int(nonfinite_bad.sum())
    res.mismatched, res.nonfinite_mismatched = m, nf
    res.mismatch_fraction = m / n if n else 0.0

    fin_diff = diff[finite]
    res.max_abs_err = float(fin_diff.max()) if fin_diff.size else 0.0
    nz = finite & (mag > 0)
    rel = diff[nz] / mag[nz]
    res.max_rel_err = float(rel.max()) if rel.size else 0.0

    # required tolerances
    if nf:
        res.required_atol = res.required_rtol = math.inf
    elif n == 0:
        res.required_atol = res.required_rtol = 0.0
    else:
        d, mg = diff[finite], mag[finite]
        need_a = float(max(0.0, (d - rtol * mg).max())) if d.size else 0.0
        res.required_atol = _smallest_passing(need_a, lambda x: bool(np.all(d <= x + rtol * mg)))
        beyond = d > atol
        if not beyond.any():
            res.required_rtol = 0.0
        elif np.any(beyond & (mg == 0)):
            res.required_rtol = math.inf
        else:
            need_r = float(((d[beyond] - atol) / mg[beyond]).max())
            res.required_rtol = _smallest_passing(need_r, lambda r: bool(np.all(d <= atol + r * mg)))

    excess = np.where(finite, diff - allowed, -np.inf)
    excess[nonfinite_bad] = np.inf
    res.abs_err_histogram = error_histogram(fin_diff, over[finite])
    res.rel_err_histogram = error_histogram(rel, over[nz])
    res.worst_elements = _worst_elements(e, a, excess, ce, ca, diff)
    if "float" in (ce, ca):
        res.sample_pairs = _sample_pairs(e, a, finite)

    # worst element
    if n:
        if nf:
            idx = tuple(int(i) for i in np.argwhere(nonfinite_bad)[0])
            res.worst_excess = math.inf
        else:
            flat = int(np.argmax(excess))
            idx = tuple(int(i) for i in np.unravel_index(flat, e.shape))
            res.worst_excess = float(excess[idx]) if finite.any() else -math.inf
        res.worst_index = idx
        res.worst_expected = scalar_value(e, idx, ce)
        res.worst_actual = scalar_value(a, idx, ca)

    reasons = reasons + value_reasons(n, m, nf, exact=False)
    res.passed = not reasons
    res.reason = "; ".join(reasons) or None
    return res


def _structural(key: str, reason: str, arr: np.ndarray, side: str, tol: Tolerance) -> OutputComparison:
    arr = np.asarray(arr)
    res = OutputComparison(key=key, passed=False, reason=reason, atol=float(tol.atol), rtol=float(tol.rtol))
    if side == "expected":
        res.expected_dtype, res.expected_shape = name_of_array(arr), tuple(int(d) for d in arr.shape)
    else:
        res.actual_dtype, res.actual_shape = name_of_array(arr), tuple(int(d) for d in arr.shape)
    return res


def compare_outputs(reference: dict[str, np.ndarray], actual: dict[str, np.ndarray],
                    tolerances: Callable[[str, str], Tolerance]) -> list[OutputComparison]:
    """Compare every output; keys missing in `actual` or only in `actual` are failures. Sorted by key.

    `tolerances(key, dtype_name)` gives the tolerance; dtype_name is the reference's (the runtime's for an
    unexpected output).
    """
    out = []
    for key in sorted(set(reference) | set(actual)):
        if key in reference and key in actual:
            ref = np.asarray(reference[key])
            out.append(compare_arrays(key, ref, actual[key], tolerances(key, name_of_array(ref))))
        elif key in reference:
            ref = np.asarray(reference[key])
            out.append(_structural(key, "missing in runtime", ref, "expected", tolerances(key, name_of_array(ref))))
        else:
            act = np.asarray(actual[key])
            out.append(_structural(key, "unexpected output", act, "actual", tolerances(key, name_of_array(act))))
    return out


def _merge_shapes(shapes: Iterable[tuple | None]) -> tuple | None:
    shapes = [s for s in shapes if s is not None]
    if not shapes:
        return None
    first = shapes[0]
    if any(len(s) != len(first) for s in shapes):
        return first
    return tuple(d if all(s[i] == d for s in shapes) else -1 for i, d in enumerate(first))


def _max_or_none(values: list[float | None], all_required: bool) -> float | None:
    present = [v for v in values if v is not None]
    if not present or (all_required and len(present) != len(values)):
        return None
    return max(present)


def merge_comparisons(per_batch: list[OutputComparison], batch_numbers: list[int] | None = None) -> OutputComparison:
    """Merge the results of one output over several batches into one; worst_index becomes (batch, *index).

    `batch_numbers` are the batches the results belong to (default 0, 1, ...).
    """
    items = list(zip(batch_numbers if batch_numbers is not None else range(len(per_batch)), per_batch))
    first = per_batch[0]
    res = OutputComparison(key=first.key, passed=all(c.passed for c in per_batch), atol=first.atol, rtol=first.rtol,
                           batches=len(per_batch))
    res.expected_dtype = next((c.expected_dtype for c in per_batch if c.expected_dtype is not None), None)
    res.actual_dtype = next((c.actual_dtype for c in per_batch if c.actual_dtype is not None), None)
    res.expected_shape = _merge_shapes(c.expected_shape for c in per_batch)
    res.actual_shape = _merge_shapes(c.actual_shape for c in per_batch)
    res.max_abs_err = _max_or_none([c.max_abs_err for c in per_batch], False)
    res.max_rel_err = _max_or_none([c.max_rel_err for c in per_batch], False)
    res.required_atol = _max_or_none([c.required_atol for c in per_batch], True)
    res.required_rtol = _max_or_none([c.required_rtol for c in per_batch], True)
    counted = [c for c in per_batch if c.mismatched is not None]
    if counted:
        res.elements = sum(c.elements or 0 for c in counted)
        res.mismatched = sum(c.mismatched for c in counted)
        res.nonfinite_mismatched = sum(c.nonfinite_mismatched or 0 for c in counted)
        res.mismatch_fraction = res.mismatched / res.elements if res.elements else 0.0
    # worst element: the batch whose worst element is furthest beyond its allowance (first one on ties)
    best_b, best = None, None
    for b, c in items:
        if c.worst_index is None or c.worst_excess is None:
            continue
        if best is None or c.worst_excess > best.worst_excess:
            best_b, best = b, c
    if best is not None:
        res.worst_index = (best_b, *best.worst_index)
        res.worst_expected, res.worst_actual, res.worst_excess = best.worst_expected, best.worst_actual, best.worst_excess
    _merge_summaries(res, items)
    if res.passed:
        return res
    # reason
    structural = [(b, c) for b, c in items if not c.passed and c.mismatched is None]
    if structural:
        reasons = [c.reason for _, c in structural]
        if len(structural) == len(items) and all(r.startswith("shape ") for r in reasons):
            res.reason = f"shape {res.actual_shape} != {res.expected_shape}"
            if res.expected_dtype != res.actual_dtype:
                res.reason += f"; dtype {res.actual_dtype} != {res.expected_dtype}"
        elif len(structural) == len(items) and len(set(reasons)) == 1:
            res.reason = reasons[0]
        else:
            b, c = structural[0]
            res.reason = f"{c.reason} (batch {b})"
        return res
    reasons = []
    if res.expected_dtype != res.actual_dtype:
        reasons.append(f"dtype {res.actual_dtype} != {res.expected_dtype}")
    reasons += value_reasons(res.elements or 0, res.mismatched or 0, res.nonfinite_mismatched or 0, res.exact)
    res.reason = "; ".join(reasons) or next(c.reason for c in per_batch if c.reason)
    return res


def compare_batches(reference: list[dict[str, np.ndarray]], actual: list[dict[str, np.ndarray]],
                    tolerances: Callable[[str, str], Tolerance]) -> list[OutputComparison]:
    """Compare batch i of `actual` with batch i of `reference`, then merge per output key (sorted by key).

    Merged: max errors and required tolerances, mismatch fraction over all elements of all batches,
    worst_index = (batch, *index) when there is more than one batch.
    """
    if len(reference) != len(actual):
        raise ValueError(f"{len(actual)} batches of outputs for {len(reference)} reference batches")
    if len(reference) == 1:
        return compare_outputs(reference[0], actual[0], tolerances)
    per_key: dict[str, list[tuple[int, OutputComparison]]] = {}
    for b, (ref, act) in enumerate(zip(reference, actual)):
        for c in compare_outputs(ref, act, tolerances):
            per_key.setdefault(c.key, []).append((b, c))
    return [merge_comparisons([c for _, c in per_key[k]], [b for b, _ in per_key[k]]) for k in sorted(per_key)]


def compare_with_default_tolerances(reference: list[dict[str, np.ndarray]],
                                    actual: list[dict[str, np.ndarray]]) -> list[OutputComparison]:
    """compare_batches with the default tolerance of each output's dtype."""
    return compare_batches(reference, actual, lambda key, dtype: default_tolerance(dtype))
