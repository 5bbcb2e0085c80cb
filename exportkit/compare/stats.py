"""Streaming comparison statistics: one `OutputStats` per (runtime, output) takes batch after batch and holds a
fixed amount of memory, and two of them merge (Beam's CombineFn merges accumulators the same way), so the
in-process run and a Beam run over the same batches end with identical statistics.

* Counts, maxima and the tolerance that would be needed are exact.
* Quantiles (p50, p99, p99.9) of the per-element absolute and relative errors come from a histogram with fixed
  log-spaced bins, BINS_PER_DECADE per decade from 1e-30 to 1e30 (plus a bin for exact zeros and one for
  anything larger): a quantile is the geometric middle of the bin holding the nearest-rank element, capped at the
  maximum, so it is within a factor 10**(1/(2*BINS_PER_DECADE)) (+-1.2%) of the exact nearest-rank quantile.
  Merging adds integer counts, so it is exact and order-independent.
* The worst records (top-k by how far their worst element is beyond its allowance, ties by position) keep the
  record's position, its worst element and the two values there.

`element_errors` is the one definition of the element rule `|a - e| <= atol + rtol * |e|` (compare.outputs uses
it too).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from exportkit.dtypes import is_float, name_of_array

BINS_PER_DECADE = 100
LOG_LO, LOG_HI = -30, 30
N_BINS = (LOG_HI - LOG_LO) * BINS_PER_DECADE + 2  # [0] zeros and < 1e-30, [-1] >= 1e30
QUANTILES = (0.5, 0.99, 0.999)
WORST_RECORDS = 10


def category_of(dtype_name: str) -> str:
    """string | bool | float | int | other: how values of this dtype are compared."""
    if dtype_name == "string":
        return "string"
    if dtype_name == "bool":
        return "bool"
    if is_float(dtype_name):
        return "float"
    if dtype_name.startswith(("int", "uint")):
        return "int"
    return "other"


@dataclass
class ElementErrors:
    diff: np.ndarray  # |a - e| where both are finite, else 0 (float64)
    mag: np.ndarray  # |e| where both are finite, else 0
    finite: np.ndarray  # both finite
    nonfinite_bad: np.ndarray  # a NaN/Inf on either side that the other side does not match
    allowed: np.ndarray  # atol + rtol * |e|

    @property
    def over(self) -> np.ndarray:
        return self.finite & ~(self.diff <= self.allowed)

    @property
    def bad(self) -> np.ndarray:
        return self.over | self.nonfinite_bad


def element_errors(e: np.ndarray, a: np.ndarray, atol: float, rtol: float, both_int: bool = False) -> ElementErrors:
    """Element-wise errors of `a` against the reference `e` (same shape), computed in float64 (complex128).

    NaN matches only NaN and an infinity only the same infinity. For two integer arrays (`both_int`), distinct
    values differ by at least 1 even where float64 rounding says less (values beyond 2**53)."""
    wide = np.complex128 if (np.iscomplexobj(e) or np.iscomplexobj(a)) else np.float64
    ef, af = e.astype(wide), a.astype(wide)
    with np.errstate(all="ignore"):
        finite = np.isfinite(ef) & np.isfinite(af)
        nonfinite_ok = ~finite & ((np.isnan(ef) & np.isnan(af)) | (ef == af))
        diff = np.where(finite, np.abs(af - ef), 0.0).astype(np.float64)
        mag = np.where(finite, np.abs(ef), 0.0).astype(np.float64)
        if both_int:
            diff = np.where(np.asarray(e == a, dtype=bool), 0.0, np.maximum(diff, 1.0))
        allowed = float(atol) + float(rtol) * mag
    return ElementErrors(diff, mag, finite, ~finite & ~nonfinite_ok, allowed)


class LogHistogram:
    """Counts of non-negative values in fixed log-spaced bins (see the module docstring)."""

    def __init__(self):
        self.counts = np.zeros(N_BINS, dtype=np.int64)

    def add(self, values: np.ndarray) -> None:
        v = np.asarray(values, dtype=np.float64).ravel()
        if not v.size:
            return
        with np.errstate(divide="ignore", invalid="ignore"):
            idx = np.floor((np.log10(v) - LOG_LO) * BINS_PER_DECADE)
        idx = np.where(v > 0, np.clip(np.nan_to_num(idx, nan=0, neginf=-1, posinf=N_BINS) + 1, 0, N_BINS - 1), 0)
        self.counts += np.bincount(idx.astype(np.int64), minlength=N_BINS)

    def merge(self, other: "LogHistogram") -> None:
        self.counts += other.counts

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def quantile(self, q: float, cap: float | None = None) -> float | None:
        """The nearest-rank q-quantile, within one bin (None when empty); capped at `cap` (the exact maximum)."""
        total = self.total
        if not total:
            return None
        rank = max(1, math.ceil(q * total))
        b = int(np.searchsorted(np.cumsum(self.counts), rank))
        if b == 0:
            value = 0.0
        elif b == N_BINS - 1:
            value = math.inf
        else:
            value = 10.0 ** (LOG_LO + (b - 0.5) / BINS_PER_DECADE)
        return min(value, cap) if cap is not None else value

    def quantiles(self, cap: float | None = None) -> dict[str, float | None]:
        return {f"p{q * 100:g}": self.quantile(q, cap) for q in QUANTILES}

    def __getstate__(self):  # Beam pickles accumulators: send the non-zero bins only
        nz = np.flatnonzero(self.counts)
        return {"nz": nz, "counts": self.counts[nz]}

    def __setstate__(self, state):
        self.counts = np.zeros(N_BINS, dtype=np.int64)
        self.counts[state["nz"]] = state["counts"]


def to_bytes(x: Any) -> bytes:
    if isinstance(x, bytes):
        return bytes(x)
    if isinstance(x, str):
        return x.encode("utf-8")
    return str(x).encode("utf-8")


def scalar_value(arr: np.ndarray, idx: tuple, category: str) -> Any:
    v = arr[idx]
    if category == "string":
        return to_bytes(v).decode("utf-8", errors="backslashreplace")
    if category == "bool":
        return bool(v)
    if category == "int":
        return int(v)
    if category == "other":
        return str(v)
    if np.iscomplexobj(arr):
        return complex(v)
    return float(np.asarray(v).astype(np.float64))


def _merge_shape(a: tuple | None, b: tuple | None) -> tuple | None:
    if a is None or b is None or len(a) != len(b):
        return a if a is not None else b
    return tuple(x if x == y else -1 for x, y in zip(a, b))


class OutputStats:
    """One output of one runtime against the reference, over every batch seen so far.

    `worst` holds up to WORST_RECORDS tuples (excess, file_no, index, offset, element, expected, actual, abs_err),
    sorted worst first; excess is inf for a NaN/Inf mismatch or a differing string/bool.
    """

    def __init__(self, key: str, atol: float, rtol: float):
        self.key, self.atol, self.rtol = key, float(atol), float(rtol)
        self.expected_dtype = self.actual_dtype = None
        self.expected_shape = self.actual_shape = None  # per record (without the batch dimension)
        self.structural: list[str] = []  # shape mismatch, missing or unexpected output (first few, with where)
        self.batches = self.records = self.failing_records = self.elements = self.mismatched = self.nonfinite = 0
        self.max_abs = self.max_rel = None
        self.need_atol = 0.0  # max(d - rtol*|e|): the atol that would pass every element at this rtol
        self.need_rtol = 0.0  # max((d - atol)/|e|) where d > atol; inf when such an element has e == 0
        self.abs_hist, self.rel_hist = LogHistogram(), LogHistogram()
        self.worst: list[tuple] = []

    @property
    def exact(self) -> bool:
        return category_of(self.expected_dtype or self.actual_dtype or "") in ("string", "bool")

    @property
    def passed(self) -> bool:
        return not self.structural and not self.mismatched and self.expected_dtype == self.actual_dtype

    def add(self, expected, actual, file_nos: np.ndarray, indices: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Compare one batch (either side None: the output is missing there); returns which records fail.
        `file_nos` is each record's file number (or one number for all)."""
        n = len(indices)
        file_nos = np.broadcast_to(np.asarray(file_nos), (n,))
        failing = np.zeros(n, dtype=bool)
        self.records += n
        self.batches += 1
        where = f"file {int(file_nos[0])} record {int(indices[0])}"
        if expected is None or actual is None:
            self._structural("missing in runtime" if actual is None else "unexpected output", where)
            failing[:] = True
            return failing
        e, a = np.asarray(expected), np.asarray(actual)
        self.expected_dtype = self.expected_dtype or name_of_array(e)
        self.actual_dtype = self.actual_dtype or name_of_array(a)
        per_record = e.ndim >= 1 and e.shape[0] == n and a.shape[:1] == e.shape[:1]
        self.expected_shape = _merge_shape(self.expected_shape, tuple(e.shape[1:] if per_record else e.shape))
        self.actual_shape = _merge_shape(self.actual_shape, tuple(a.shape[1:] if per_record else a.shape))
        if e.shape != a.shape:
            self._structural(f"shape {tuple(a.shape)} != {tuple(e.shape)}", where)
            failing[:] = True
            return failing
        rows = n if per_record else 1
        ce, ca = category_of(name_of_array(e)), category_of(name_of_array(a))
        if ce == ca and ce in ("string", "bool", "other"):
            bad = np.asarray([to_bytes(x) != to_bytes(y) if ce == "string" else not (x == y)
                              for x, y in zip(e.flat, a.flat)], dtype=bool).reshape(e.shape) \
                if ce != "bool" else np.asarray(e != a)
            excess = np.where(bad, math.inf, 0.0)
            self.elements += e.size
            self.mismatched += int(bad.sum())
            err = None
        elif {ce, ca} <= {"bool", "int", "float"}:
            err = element_errors(e, a, self.atol, self.rtol, both_int=ce in ("int", "bool") and ca in ("int", "bool"))
            self._numeric(err)
            excess = np.where(err.finite, err.diff - err.allowed, -math.inf)
            excess[err.nonfinite_bad] = math.inf
        else:
            self._structural("values not comparable", where)
            failing[:] = True
            return failing
        flat = excess.reshape(rows, -1)
        if flat.shape[1] == 0:
            return failing
        worst_el = flat.argmax(axis=1)
        record_excess = flat[np.arange(rows), worst_el]
        fail_rows = record_excess > 0
        self.failing_records += int(fail_rows.sum())
        failing[:] = fail_rows if per_record else bool(fail_rows[0])
        self._offer(e, a, err, ce, ca, per_record, worst_el, record_excess, file_nos, indices, offsets)
        return failing

    def _numeric(self, err: ElementErrors) -> None:
        d, m = err.diff[err.finite], err.mag[err.finite]
        self.elements += err.diff.size
        self.mismatched += int(err.bad.sum())
        self.nonfinite += int(err.nonfinite_bad.sum())
        if d.size:
            self.max_abs = max(self.max_abs or 0.0, float(d.max()))
            self.abs_hist.add(d)
            self.need_atol = max(self.need_atol, float((d - self.rtol * m).max()))
            nz = m > 0
            if nz.any():
                rel = d[nz] / m[nz]
                self.max_rel = max(self.max_rel or 0.0, float(rel.max()))
                self.rel_hist.add(rel)
            else:
                self.max_rel = self.max_rel or 0.0
            beyond = d > self.atol
            if beyond.any():
                if np.any(beyond & (m == 0)):
                    self.need_rtol = math.inf
                else:
                    self.need_rtol = max(self.need_rtol, float(((d[beyond] - self.atol) / m[beyond]).max()))
        elif self.max_abs is None:
            self.max_abs = self.max_rel = 0.0

    def _offer(self, e, a, err, ce, ca, per_record, worst_el, record_excess, file_nos, indices, offsets) -> None:
        rows = len(record_excess)
        shape = e.shape[1:] if per_record else e.shape
        for r in np.lexsort((np.arange(rows), -record_excess))[:WORST_RECORDS]:
            element = tuple(int(i) for i in np.unravel_index(int(worst_el[r]), shape))
            full = (int(r), *element) if per_record else element
            abs_err = float(err.diff[full]) if err is not None and err.finite[full] else None
            self.worst.append((float(record_excess[r]), int(file_nos[r]), int(indices[r]), int(offsets[r]), list(element),
                               scalar_value(e, full, ce), scalar_value(a, full, ca), abs_err))
        self._trim()

    def _trim(self) -> None:
        self.worst.sort(key=lambda w: (-w[0], w[1], w[2]))
        del self.worst[WORST_RECORDS:]

    def _structural(self, reason: str, where: str) -> None:
        self.structural = sorted({*self.structural, f"{reason} ({where})"})[:3]

    def merge(self, other: "OutputStats") -> "OutputStats":
        self.expected_dtype = self.expected_dtype or other.expected_dtype
        self.actual_dtype = self.actual_dtype or other.actual_dtype
        self.expected_shape = _merge_shape(self.expected_shape, other.expected_shape)
        self.actual_shape = _merge_shape(self.actual_shape, other.actual_shape)
        self.structural = sorted({*self.structural, *other.structural})[:3]
        for name in ("batches", "records", "failing_records", "elements", "mismatched", "nonfinite"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("max_abs", "max_rel"):
            values = [v for v in (getattr(self, name), getattr(other, name)) if v is not None]
            setattr(self, name, max(values) if values else None)
        self.need_atol = max(self.need_atol, other.need_atol)
        self.need_rtol = max(self.need_rtol, other.need_rtol)
        self.abs_hist.merge(other.abs_hist)
        self.rel_hist.merge(other.rel_hist)
        self.worst += other.worst
        self._trim()
        return self


def compare_into(stats: dict, label: str, reference: dict, outputs: dict, tolerances: dict, file_nos,
                 indices: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Add one batch of one runtime's outputs to `stats[(label, key)]`, every key of either side; returns which
    records fail. `tolerances[key]` is (atol, rtol); keys not in it are compared exactly."""
    failing = np.zeros(len(indices), dtype=bool)
    for key in sorted(set(reference) | set(outputs)):
        st = stats.get((label, key))
        if st is None:
            st = stats[(label, key)] = OutputStats(key, *tolerances.get(key, (0.0, 0.0)))
        failing |= st.add(reference.get(key), outputs.get(key), file_nos, indices, offsets)
    return failing
