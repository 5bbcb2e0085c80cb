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

The tolerances are in compare/tolerances.py, the fixed-size error summaries (histograms, worst elements,
sampled pairs) in compare/summaries.py; `streamed_comparison` turns --data's streamed statistics into an
OutputComparison.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable

import numpy as np

from exportkit.compare.stats import OutputStats, category_of, element_errors, scalar_value, to_bytes
from exportkit.dtypes import name_of_array
from exportkit.compare.summaries import (error_histograms, histogram_summary, merge_summaries, sample_pairs,
                                         worst_elements)
from exportkit.compare.tolerances import Tolerance, default_tolerance

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
    # --data runs only (streamed over records; see exportkit.compare.stats)
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


def _category(arr: np.ndarray) -> str:
    return category_of(name_of_array(arr))


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
    res.worst_elements = worst_elements(e, a, np.where(diff, np.inf, -np.inf), cat, cat)
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
    failing = m > nf  # any finite element over tolerance
    res.abs_err_histogram, res.rel_err_histogram = error_histograms(fin_diff, rel, err, over if failing else None)
    res.worst_elements = worst_elements(e, a, excess, ce, ca, diff)
    if "float" in (ce, ca):
        res.sample_pairs = sample_pairs(e, a, finite)

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
    for name, value in merge_summaries(items).items():
        setattr(res, name, value)
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


def streamed_comparison(st: OutputStats, files: list[str]) -> OutputComparison:
    """verify --data's streaming statistics of one output (compare.stats) as the report's OutputComparison: the same
    fields a batch comparison fills, and the records (`files[file_no]`, index, byte offset) that fail worst."""
    c = OutputComparison(
        key=st.key, passed=st.passed, expected_dtype=st.expected_dtype, actual_dtype=st.actual_dtype,
        expected_shape=None if st.expected_shape is None else (-1, *st.expected_shape),
        actual_shape=None if st.actual_shape is None else (-1, *st.actual_shape), atol=st.atol, rtol=st.rtol,
        max_abs_err=st.max_abs, max_rel_err=st.max_rel, elements=st.elements, mismatched=st.mismatched,
        nonfinite_mismatched=st.nonfinite, batches=st.batches, records=st.records,
        failing_records=st.failing_records)
    c.mismatch_fraction = st.mismatched / st.elements if st.elements else 0.0
    if not st.exact and st.max_abs is not None:
        c.abs_err_quantiles = st.abs_hist.quantiles(cap=st.max_abs)
        c.rel_err_quantiles = st.rel_hist.quantiles(cap=st.max_rel)
        c.abs_err_histogram, c.rel_err_histogram = histogram_summary(st.abs_hist), histogram_summary(st.rel_hist)
        if st.nonfinite:
            c.required_atol = c.required_rtol = math.inf
        else:
            c.required_atol, c.required_rtol = max(0.0, st.need_atol), st.need_rtol
    c.worst_records = [{"file": files[f], "index": i, "offset": off if off >= 0 else None,
                        "element": element, "expected": exp, "actual": act, "abs_err": abs_err,
                        "excess": excess}
                       for excess, f, i, off, element, exp, act, abs_err in st.worst]
    if st.worst:
        c.worst_expected, c.worst_actual = st.worst[0][5], st.worst[0][6]
    if not c.passed:
        reasons = list(st.structural)
        if st.expected_dtype != st.actual_dtype:
            reasons.append(f"dtype {st.actual_dtype} != {st.expected_dtype}")
        reasons += value_reasons(st.elements, st.mismatched, st.nonfinite, st.exact)
        if st.failing_records:
            reasons.append(f"{st.failing_records} of {st.records} records fail")
        c.reason = "; ".join(reasons)
    return c
