"""Tolerances: the per-dtype defaults, `--tol KEY=ATOL,RTOL` and which of `--tol`, `--atol/--rtol` and the
default applies to an output. The element rule they feed is compare/stats.py's `element_errors`."""
from __future__ import annotations

import math
from dataclasses import dataclass

from exportkit.dtypes import canonical, is_float
from exportkit.errors import UsageError


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


def _g(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}"
