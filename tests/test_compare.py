"""Pure comparison functions (no TensorFlow)."""
from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from exportkit.dtypes import name_of_array
from exportkit.errors import UsageError
from exportkit.compare.outputs import OutputComparison, compare_arrays, compare_batches, compare_outputs, merge_comparisons
from exportkit.compare.tolerances import EXACT, Tolerance, default_tolerance, parse_tol, resolve_tolerance

T = Tolerance(1e-5, 1e-5)


def default_tols(key, dtype):
    return resolve_tolerance(key, dtype)


def _passes(e, a, atol, rtol):
    return compare_arrays("x", e, a, Tolerance(atol, rtol)).passed


def _json(c: OutputComparison) -> dict:
    return json.loads(json.dumps(c.to_dict(), allow_nan=False))


# ------------------------------------------------------------------ tolerances


def test_no_tensorflow_imported():
    code = ("import sys, exportkit.compare.outputs, exportkit.compare.tolerances, exportkit.inputs.generate, exportkit.inputs.load, exportkit.verify.report, "
            "exportkit.verify.baseline; assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def _readme_defaults() -> dict[str, Tolerance]:
    """The default tolerances as docs/verify.md documents them: one value per dtype,
    used as both atol and rtol; integers, bools and strings exact."""
    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "verify.md").read_text().split())
    documented = re.search(r"Default tolerances \(atol, rtol\) by the dtype the output was computed in: (.*?), "
                           r"integers, bools and strings exact;", text)
    assert documented, "docs/verify.md no longer documents the default tolerances"
    pairs = [item.split() for item in documented.group(1).split(", ")]
    return {name: Tolerance(float(value), float(value)) for name, value in pairs}


README_DEFAULTS = _readme_defaults()


def test_readme_documents_every_float_dtype():
    assert set(README_DEFAULTS) == {"float16", "bfloat16", "float32", "float64"}


@pytest.mark.parametrize("name,expected", [
    *README_DEFAULTS.items(), ("half", README_DEFAULTS["float16"]), ("double", README_DEFAULTS["float64"]),
    *[(name, Tolerance(0.0, 0.0)) for name in ("int8", "int32", "int64", "uint8", "bool", "string")],
])
def test_default_tolerance(name, expected):
    assert default_tolerance(name) == expected


def test_default_tolerances_are_ordered_by_precision():
    order = ["float64", "float32", "float16", "bfloat16"]
    tols = [default_tolerance(n) for n in order]
    assert all(a.atol < b.atol and a.rtol < b.rtol for a, b in zip(tols, tols[1:]))


def test_tolerance_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        T.atol = 1.0  # type: ignore[misc]
    assert T == Tolerance(1e-5, 1e-5)


@pytest.mark.parametrize("spec,key,tol", [
    ("score=1e-4,1e-3", "score", Tolerance(1e-4, 1e-3)),
    (" score = 0 , 0 ", "score", Tolerance(0.0, 0.0)),
    ("a=b=1,2", "a=b", Tolerance(1.0, 2.0)),
    ("out/0=1e-2,0.5", "out/0", Tolerance(1e-2, 0.5)),
])
def test_parse_tol(spec, key, tol):
    assert parse_tol(spec) == (key, tol)


@pytest.mark.parametrize("spec", ["score", "score=", "=1,2", "score=1", "score=1,2,3", "score=a,b", "score=-1,0",
                                  "score=inf,1", "score=nan,1", "", "score=1;2"])
def test_parse_tol_errors(spec):
    with pytest.raises(UsageError) as ei:
        parse_tol(spec)
    assert "KEY=ATOL,RTOL" in str(ei.value)
    assert ei.value.exit_code == 2


def test_resolve_tolerance_precedence():
    per = {"score": Tolerance(0.1, 0.2)}
    assert resolve_tolerance("score", "float32", 1e-3, 1e-3, per) == Tolerance(0.1, 0.2)
    assert resolve_tolerance("other", "float32", 1e-3, 1e-4, per) == Tolerance(1e-3, 1e-4)
    assert resolve_tolerance("other", "float32", None, None, per) == default_tolerance("float32")
    # one global flag keeps the default for the other
    assert resolve_tolerance("o", "float32", atol=1e-3) == Tolerance(1e-3, 1e-5)
    assert resolve_tolerance("o", "float16", rtol=0.5) == Tolerance(1e-2, 0.5)
    # global flags do not loosen exact dtypes; per-output does
    assert resolve_tolerance("ids", "int64", 1.0, 1.0) == EXACT
    assert resolve_tolerance("flag", "bool", 1.0, 1.0) == EXACT
    assert resolve_tolerance("ids", "int64", 1.0, 1.0, {"ids": Tolerance(1, 0)}) == Tolerance(1, 0)
    assert resolve_tolerance("x", "float32") == default_tolerance("float32")


# ------------------------------------------------------------------ element rule at the boundary


def test_identical_arrays_pass_with_zero_tolerance():
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    c = compare_arrays("x", x, x.copy(), EXACT)
    assert c.passed and c.reason is None
    assert c.max_abs_err == 0 and c.max_rel_err == 0 and c.mismatch_fraction == 0
    assert c.required_atol == 0 and c.required_rtol == 0
    assert c.elements == 20 and c.mismatched == 0


def test_atol_boundary_is_inclusive():
    # exact binary values so that the boundary is exact
    e = np.array([1.0, 2.0])
    a = np.array([1.25, 2.0])
    assert _passes(e, a, 0.25, 0.0)
    assert not _passes(e, a, np.nextafter(0.25, 0), 0.0)


def test_rtol_boundary_is_inclusive_and_relative_to_expected():
    e = np.array([4.0])
    a = np.array([5.0])
    assert _passes(e, a, 0.0, 0.25)  # 1 <= 0.25 * |4|
    assert not _passes(e, a, 0.0, np.nextafter(0.25, 0))
    # asymmetric: relative to expected, not actual
    assert not _passes(a, e, 0.0, 0.2 - 1e-12) and _passes(a, e, 0.0, 0.2)


def test_atol_and_rtol_add_up():
    e = np.array([10.0])
    a = np.array([11.0])
    assert _passes(e, a, 0.5, 0.05)  # 1 <= 0.5 + 0.05 * 10
    assert not _passes(e, a, 0.5, 0.04)


def test_matches_numpy_isclose():
    rng = np.random.default_rng(1)
    e = rng.standard_normal(1000)
    a = e + rng.standard_normal(1000) * 1e-4
    c = compare_arrays("x", e, a, Tolerance(1e-4, 1e-3))
    assert c.mismatched == int((~np.isclose(a, e, atol=1e-4, rtol=1e-3)).sum())
    assert math.isclose(c.mismatch_fraction, c.mismatched / 1000)


def test_failing_reason_and_stats():
    e = np.zeros((2, 8), np.float32) + 1
    a = e.copy()
    a[1, 3] += 0.5
    a[0, 0] += 0.1
    a[0, 1] -= 0.1
    c = compare_arrays("score", e, a, T)
    assert not c.passed
    assert c.reason == "3 of 16 elements over tolerance"
    assert c.mismatch_fraction == 3 / 16
    assert c.worst_index == (1, 3)
    assert c.worst_expected == 1.0 and c.worst_actual == 1.5
    assert c.max_abs_err == pytest.approx(0.5)
    assert c.max_rel_err == pytest.approx(0.5)


def test_worst_index_is_the_one_furthest_beyond_its_allowance():
    # abs error largest at index 0, but it is allowed much more there (rtol * 1000)
    e = np.array([1000.0, 1.0])
    a = np.array([1001.0, 1.5])
    c = compare_arrays("x", e, a, Tolerance(0.0, 1e-2))
    assert c.worst_index == (1,)
    assert c.max_abs_err == 1.0


def test_scalar_and_empty_arrays():
    c = compare_arrays("s", np.float32(1.0), np.float32(1.0), T)
    assert c.passed and c.worst_index == () and c.expected_shape == ()
    c = compare_arrays("e", np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), T)
    assert c.passed and c.elements == 0 and c.mismatch_fraction == 0 and c.worst_index is None


# ------------------------------------------------------------------ required tolerances


@pytest.mark.parametrize("seed", range(8))
def test_required_tolerances_pass_when_used_and_fail_when_smaller(seed):
    rng = np.random.default_rng(seed)
    e = rng.standard_normal(200).astype(np.float32)
    e[e == 0] = 1
    a = (e + rng.standard_normal(200).astype(np.float32) * 1e-3).astype(np.float32)
    for tol in (Tolerance(0, 0), Tolerance(1e-5, 1e-5), Tolerance(1e-4, 0), Tolerance(0, 1e-3)):
        c = compare_arrays("x", e, a, tol)
        assert c.required_atol > 0 and c.required_rtol > 0
        assert compare_arrays("x", e, a, Tolerance(c.required_atol, tol.rtol)).passed
        assert not compare_arrays("x", e, a, Tolerance(c.required_atol * (1 - 1e-9), tol.rtol)).passed
        assert compare_arrays("x", e, a, Tolerance(tol.atol, c.required_rtol)).passed
        assert not compare_arrays("x", e, a, Tolerance(tol.atol, c.required_rtol * (1 - 1e-9))).passed


def test_required_tolerances_on_a_passing_output_still_pass():
    e = np.array([1.0, 2.0, 3.0])
    a = e + 1e-7
    c = compare_arrays("x", e, a, Tolerance(1e-5, 1e-5))
    assert c.passed
    assert compare_arrays("x", e, a, Tolerance(c.required_atol, 1e-5)).passed
    assert c.required_rtol == 0  # every element is already within atol


def test_required_rtol_is_inf_when_expected_zero_exceeds_atol():
    c = compare_arrays("x", np.array([0.0, 1.0]), np.array([0.1, 1.0]), T)
    assert c.required_rtol == math.inf
    assert c.required_atol == pytest.approx(0.1)
    assert compare_arrays("x", np.array([0.0, 1.0]), np.array([0.1, 1.0]), Tolerance(c.required_atol, T.rtol)).passed
    assert _json(c)["required_rtol"] == "inf"
    # the zero-expected element is excluded from max_rel_err
    assert c.max_rel_err == 0.0


def test_required_atol_exact_when_rtol_covers_part():
    e = np.array([100.0])
    a = np.array([101.0])
    c = compare_arrays("x", e, a, Tolerance(0.0, 0.005))
    assert c.required_atol == pytest.approx(0.5)
    assert c.required_rtol == pytest.approx(0.01)


# ------------------------------------------------------------------ NaN / Inf


def test_nan_matches_nan_at_same_position():
    e = np.array([1.0, np.nan, 3.0], np.float32)
    assert compare_arrays("x", e, e.copy(), EXACT).passed


def test_nan_vs_number_fails_either_way():
    e = np.array([1.0, np.nan], np.float32)
    a = np.array([1.0, 2.0], np.float32)
    for x, y in ((e, a), (a, e)):
        c = compare_arrays("x", x, y, Tolerance(1e9, 1e9))
        assert not c.passed
        assert c.reason.startswith("NaN/Inf mismatch")
        assert c.nonfinite_mismatched == 1 and c.mismatched == 1
        assert c.worst_index == (1,)
        assert c.required_atol == math.inf and c.required_rtol == math.inf
        assert c.max_abs_err == 0.0  # finite elements agree


def test_nan_at_different_positions_fails():
    e = np.array([np.nan, 1.0])
    a = np.array([1.0, np.nan])
    c = compare_arrays("x", e, a, T)
    assert c.nonfinite_mismatched == 2 and c.mismatch_fraction == 1.0


@pytest.mark.parametrize("e,a,ok", [
    (np.inf, np.inf, True), (-np.inf, -np.inf, True), (np.inf, -np.inf, False), (-np.inf, np.inf, False),
    (np.inf, 1e38, False), (1e38, np.inf, False), (np.inf, np.nan, False), (np.nan, -np.inf, False),
])
def test_infinities(e, a, ok):
    c = compare_arrays("x", np.array([0.0, e], np.float32), np.array([0.0, a], np.float32), Tolerance(1e9, 1e9))
    assert c.passed is ok
    if not ok:
        assert "NaN/Inf mismatch" in c.reason


def test_nonfinite_and_finite_mismatches_are_both_reported():
    e = np.array([np.inf, 1.0, 2.0, 3.0])
    a = np.array([-np.inf, 1.5, 2.0, 3.0])
    c = compare_arrays("x", e, a, T)
    assert c.reason == "NaN/Inf mismatch in 1 of 4 elements; 1 of 4 elements over tolerance"
    assert c.mismatched == 2 and c.worst_index == (0,)
    d = _json(c)
    assert d["worst_expected"] == "inf" and d["worst_actual"] == "-inf"


# ------------------------------------------------------------------ shape / dtype


def test_shape_mismatch_fails_without_errors():
    c = compare_arrays("x", np.zeros((2, 4)), np.zeros((2, 3)), T)
    assert not c.passed
    assert c.reason == "shape (2, 3) != (2, 4)"
    assert c.max_abs_err is None and c.required_atol is None and c.worst_index is None
    assert c.expected_shape == (2, 4) and c.actual_shape == (2, 3)


def test_shape_mismatch_same_size():
    c = compare_arrays("x", np.zeros((2, 3)), np.zeros((3, 2)), T)
    assert not c.passed and c.reason.startswith("shape")


def test_dtype_mismatch_fails_but_errors_are_computed():
    e = np.array([1.0, 2.0], np.float32)
    a = e.astype(np.float16)
    c = compare_arrays("x", e, a, T)
    assert not c.passed
    assert c.reason == "dtype float16 != float32"
    assert c.max_abs_err == 0.0 and c.mismatched == 0
    a2 = np.array([1.0, 3.0], np.float16)
    c2 = compare_arrays("x", e, a2, T)
    assert c2.reason == "dtype float16 != float32; 1 of 2 elements over tolerance"
    assert c2.max_abs_err == 1.0


def test_int_vs_float_dtype_mismatch():
    c = compare_arrays("x", np.array([1, 2], np.int64), np.array([1.0, 2.0]), EXACT)
    assert not c.passed and c.reason == "dtype float64 != int64" and c.max_abs_err == 0


def test_string_vs_number_not_comparable():
    c = compare_arrays("x", np.array([b"a"], object), np.array([1.0]), EXACT)
    assert not c.passed and "dtype float64 != string" in c.reason and "not comparable" in c.reason
    assert c.max_abs_err is None


# ------------------------------------------------------------------ ints, bools, strings, bfloat16


def test_ints_exact_by_default():
    e = np.array([1, 2, 3], np.int32)
    assert compare_arrays("i", e, e.copy(), EXACT).passed
    c = compare_arrays("i", e, np.array([1, 2, 4], np.int32), EXACT)
    assert not c.passed and c.worst_index == (2,) and c.worst_expected == 3 and c.worst_actual == 4
    assert isinstance(c.worst_expected, int)
    assert c.required_atol == 1.0


def test_huge_ints_differing_by_one_fail_despite_float64_rounding():
    e = np.array([2**62], np.int64)
    a = np.array([2**62 + 1], np.int64)
    assert float(e[0]) == float(a[0])
    c = compare_arrays("i", e, a, EXACT)
    assert not c.passed and c.max_abs_err >= 1
    assert compare_arrays("i", e, a, Tolerance(c.required_atol, 0)).passed


def test_ints_with_explicit_tolerance():
    e = np.array([10, 20], np.int64)
    a = np.array([11, 20], np.int64)
    assert compare_arrays("i", e, a, Tolerance(1, 0)).passed
    assert not compare_arrays("i", e, a, Tolerance(0.99, 0)).passed


def test_uint_vs_int_values():
    c = compare_arrays("i", np.array([3], np.uint8), np.array([3], np.int64), EXACT)
    assert not c.passed and c.reason == "dtype int64 != uint8" and c.mismatched == 0


def test_bools_exact_regardless_of_tolerance():
    e = np.array([True, False, True])
    a = np.array([True, True, True])
    c = compare_arrays("b", e, a, Tolerance(10, 10))
    assert not c.passed and c.reason == "1 of 3 elements differ"
    assert c.worst_index == (1,) and c.worst_expected is False and c.worst_actual is True
    assert c.required_atol is None and c.max_abs_err is None
    assert compare_arrays("b", e, e.copy(), EXACT).passed


@pytest.mark.parametrize("a", [
    np.array([b"ab", b"cd"], dtype=object), np.array([b"ab", b"cd"], dtype="S2"), np.array(["ab", "cd"]),
    np.array(["ab", "cd"], dtype=object),
])
def test_strings_compare_across_conventions(a):
    e = np.array([b"ab", b"cd"], dtype=object)
    c = compare_arrays("s", e, a, EXACT)
    assert c.passed, c.reason
    assert c.expected_dtype == "string" and c.actual_dtype == "string"


def test_strings_mismatch():
    e = np.array([[b"a", b"b"], [b"c", "é".encode()]], dtype=object)
    a = np.array([[b"a", b"b"], [b"x", b"e"]], dtype=object)
    c = compare_arrays("s", e, a, Tolerance(1, 1))
    assert not c.passed and c.reason == "2 of 4 elements differ" and c.mismatch_fraction == 0.5
    assert c.worst_index == (1, 0) and c.worst_expected == "c" and c.worst_actual == "x"
    assert c.max_abs_err is None and c.required_atol is None and c.required_rtol is None
    d = _json(c)
    assert d["worst_expected"] == "c"


def test_strings_non_utf8_bytes_are_json_safe():
    """Bytes that are not UTF-8 reach the JSON report as visible escapes, the valid ones as themselves."""
    c = compare_arrays("s", np.array([b"\xff\x00"], object), np.array([b"\xfe"], object), EXACT)
    d = json.loads(json.dumps(c.to_dict(), ensure_ascii=False).encode("utf-8"))
    assert d["worst_expected"] == "\\xff\x00" and d["worst_actual"] == "\\xfe"
    assert d["passed"] is False and d["mismatched"] == 1


def test_string_trailing_nul_is_significant_in_object_arrays():
    c = compare_arrays("s", np.array([b"a\x00"], object), np.array([b"a"], object), EXACT)
    assert not c.passed


def test_bfloat16_compared_in_float64():
    e = np.array([1.0, 2.0, 3.0], ml_dtypes.bfloat16)
    a = np.array([1.0, 2.0, 3.015625], ml_dtypes.bfloat16)  # one ulp at 3 (spacing 2**-6)
    assert name_of_array(e) == "bfloat16"
    c = compare_arrays("h", e, a, default_tolerance("bfloat16"))
    assert c.passed and c.max_abs_err == 0.015625
    assert isinstance(c.worst_expected, float)
    c2 = compare_arrays("h", e, a, EXACT)
    assert not c2.passed and c2.required_atol == 0.015625
    assert compare_arrays("h", e, a, Tolerance(c2.required_atol, 0)).passed
    json.dumps(c.to_dict())


def test_bfloat16_nan_inf():
    e = np.array([np.nan, np.inf], ml_dtypes.bfloat16)
    assert compare_arrays("h", e, e.copy(), EXACT).passed
    assert not compare_arrays("h", e, np.array([np.nan, -np.inf], ml_dtypes.bfloat16), EXACT).passed


def test_bfloat16_vs_float32_is_a_dtype_mismatch():
    e = np.array([1.0], np.float32)
    c = compare_arrays("h", e, e.astype(ml_dtypes.bfloat16), T)
    assert c.reason == "dtype bfloat16 != float32" and c.max_abs_err == 0


def test_float16():
    e = np.array([1.0, 100.0], np.float16)
    a = np.array([1.0009766, 100.0625], np.float16)  # one ulp each
    assert compare_arrays("h", e, a, default_tolerance("float16")).passed


def test_complex():
    e = np.array([1 + 1j], np.complex64)
    c = compare_arrays("c", e, np.array([1 + 1.5j], np.complex64), T)
    assert not c.passed and c.max_abs_err == pytest.approx(0.5)
    json.dumps(c.to_dict())


# ------------------------------------------------------------------ to_dict


def test_to_dict_is_json_safe_and_plain():
    e = np.array([[1.0, np.nan], [np.inf, 4.0]], np.float32)
    a = np.array([[1.5, 2.0], [np.inf, 4.0]], np.float32)
    d = compare_arrays("x", e, a, T).to_dict()
    s = json.dumps(d, allow_nan=False)
    back = json.loads(s)
    assert back == d
    assert back["expected_shape"] == [2, 2] and back["worst_index"] == [0, 1]
    assert back["required_atol"] == "inf"
    for v in d.values():
        assert not isinstance(v, (np.generic, np.ndarray, tuple))
    assert "worst_excess" not in d


# ------------------------------------------------------------------ compare_outputs


def test_compare_outputs_missing_and_extra_sorted():
    ref = {"b": np.zeros(2, np.float32), "a": np.zeros(3, np.int64), "c": np.zeros(1)}
    act = {"a": np.zeros(3, np.int64), "c": np.zeros(1), "z": np.ones(2, np.float32)}
    seen = []

    def tols(key, dtype):
        seen.append((key, dtype))
        return resolve_tolerance(key, dtype)

    res = compare_outputs(ref, act, tols)
    assert [c.key for c in res] == ["a", "b", "c", "z"]
    by = {c.key: c for c in res}
    assert by["a"].passed and by["c"].passed
    assert not by["b"].passed and by["b"].reason == "missing in runtime"
    assert by["b"].expected_dtype == "float32" and by["b"].actual_dtype is None and by["b"].expected_shape == (2,)
    assert not by["z"].passed and by["z"].reason == "unexpected output" and by["z"].actual_shape == (2,)
    assert ("a", "int64") in seen and ("b", "float32") in seen and ("z", "float32") in seen
    assert by["a"].atol == 0 and by["b"].atol == 1e-5
    for c in res:
        json.dumps(c.to_dict(), allow_nan=False)


def test_compare_outputs_uses_reference_dtype_for_tolerance():
    ref = {"x": np.array([1.0], np.float16)}
    act = {"x": np.array([1.005], np.float16)}
    assert compare_outputs(ref, act, default_tols)[0].passed


def test_compare_outputs_empty():
    assert compare_outputs({}, {}, default_tols) == []


# ------------------------------------------------------------------ batches


def test_compare_batches_merges():
    r0 = {"x": np.array([[1.0, 2.0]], np.float32), "i": np.array([1])}
    a0 = {"x": np.array([[1.0, 2.5]], np.float32), "i": np.array([1])}
    r1 = {"x": np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32), "i": np.array([1, 2, 3])}
    a1 = {"x": np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 9.0]], np.float32), "i": np.array([1, 2, 3])}
    res = compare_batches([r0, r1], [a0, a1], default_tols)
    assert [c.key for c in res] == ["i", "x"]
    i, x = res
    assert i.passed and i.batches == 2 and i.elements == 4
    assert not x.passed
    assert x.batches == 2 and x.elements == 8 and x.mismatched == 2
    assert x.mismatch_fraction == 2 / 8
    assert x.reason == "2 of 8 elements over tolerance"
    assert x.max_abs_err == 3.0
    assert x.worst_index == (1, 2, 1) and x.worst_expected == 6.0 and x.worst_actual == 9.0
    assert x.expected_shape == (-1, 2) and x.actual_shape == (-1, 2)
    assert x.required_atol == pytest.approx(max(0.5 - 2e-5, 3 - 6e-5))
    for tol in (Tolerance(x.required_atol, x.rtol),):
        assert all(c.passed for c in compare_batches([r0, r1], [a0, a1], lambda k, d: tol if k == "x" else EXACT))
    json.dumps(x.to_dict(), allow_nan=False)


def test_compare_batches_required_is_max_over_batches():
    r = [{"x": np.array([1.0])}, {"x": np.array([1.0])}]
    a = [{"x": np.array([1.5])}, {"x": np.array([1.25])}]
    x = compare_batches(r, a, lambda k, d: EXACT)[0]
    assert x.required_atol == 0.5 and x.worst_index == (0, 0)
    assert x.required_rtol == 0.5


def test_compare_batches_single_batch_has_plain_index():
    r = [{"x": np.array([1.0, 2.0])}]
    a = [{"x": np.array([1.0, 3.0])}]
    x = compare_batches(r, a, lambda k, d: EXACT)[0]
    assert x.worst_index == (1,) and x.batches == 1


def test_compare_batches_nan_in_one_batch():
    r = [{"x": np.array([1.0])}, {"x": np.array([np.nan, 1.0])}]
    a = [{"x": np.array([1.5])}, {"x": np.array([0.0, 1.0])}]
    x = compare_batches(r, a, lambda k, d: EXACT)[0]
    assert x.worst_index == (1, 0)
    assert x.reason == "NaN/Inf mismatch in 1 of 3 elements; 1 of 3 elements over tolerance"
    assert x.required_atol == math.inf


def test_compare_batches_shape_mismatch_everywhere():
    r = [{"x": np.zeros((1, 3))}, {"x": np.zeros((8, 3))}]
    a = [{"x": np.zeros((1, 4))}, {"x": np.zeros((8, 4))}]
    x = compare_batches(r, a, default_tols)[0]
    assert not x.passed and x.reason == "shape (-1, 4) != (-1, 3)"
    assert x.max_abs_err is None and x.required_atol is None


def test_compare_batches_structural_failure_in_one_batch():
    r = [{"x": np.zeros(1)}, {"x": np.zeros(2)}]
    a = [{"x": np.zeros(1)}, {}]
    x = compare_batches(r, a, default_tols)[0]
    assert not x.passed and x.reason == "missing in runtime (batch 1)"


def test_compare_batches_missing_everywhere_and_unexpected():
    r = [{"x": np.zeros(1)}, {"x": np.zeros(2)}]
    a = [{"y": np.zeros(1)}, {"y": np.zeros(2)}]
    res = compare_batches(r, a, default_tols)
    assert [(c.key, c.reason) for c in res] == [("x", "missing in runtime"), ("y", "unexpected output")]


def test_compare_batches_strings():
    r = [{"s": np.array([b"a"], object)}, {"s": np.array([b"a", b"b"], object)}]
    a = [{"s": np.array([b"a"], object)}, {"s": np.array([b"a", b"c"], object)}]
    s = compare_batches(r, a, default_tols)[0]
    assert s.reason == "1 of 3 elements differ" and s.worst_index == (1, 1) and s.worst_actual == "c"


def test_compare_batches_dtype_mismatch_reason_kept():
    r = [{"x": np.zeros(1, np.float32)}, {"x": np.zeros(2, np.float32)}]
    a = [{"x": np.zeros(1, np.float16)}, {"x": np.zeros(2, np.float16)}]
    x = compare_batches(r, a, default_tols)[0]
    assert x.reason == "dtype float16 != float32" and x.elements == 3


def test_compare_batches_length_mismatch_raises():
    with pytest.raises(ValueError):
        compare_batches([{}], [{}, {}], default_tols)


def test_merge_comparisons_with_explicit_batch_numbers():
    c = compare_arrays("x", np.array([1.0]), np.array([2.0]), EXACT)
    ok = compare_arrays("x", np.array([1.0]), np.array([1.0]), EXACT)
    m = merge_comparisons([ok, c], [3, 7])
    assert m.worst_index == (7, 0) and m.mismatched == 1 and m.elements == 2


# ------------------------------------------------------------------ error summaries (vectorised; pinned to plain definitions)


def _histogram_by_definition(values, over=None):
    """The summaries' histogram as defined: floor(log10(v) * 10) clipped to [-300, 299], zeros below 1e-30."""
    values = np.asarray(values, np.float64).ravel()
    tiny = values < 1e-30
    with np.errstate(divide="ignore"):
        bins = np.clip(np.floor(np.log10(values[~tiny]) * 10), -300, 299).astype(np.int64)
    if not bins.size:
        return {"start": None, "bins_per_decade": 10, "counts": [], "over": None if over is None else [],
                "zeros": int(tiny.sum())}
    first = int(bins.min())
    counts = np.bincount(bins - first).tolist()
    return {"start": first / 10, "bins_per_decade": 10, "counts": counts,
            "over": None if over is None else np.bincount(bins[over.ravel()[~tiny]] - first,
                                                          minlength=len(counts)).tolist(),
            "zeros": int(tiny.sum())}


def test_error_histogram_equals_its_definition_across_rows_zeros_edges_and_overflow():
    from exportkit.compare.summaries import error_histogram

    rng = np.random.default_rng(11)
    n = 150_001  # not a multiple of the counting loop's 8 rows: its tail counts too
    values = np.abs(rng.normal(size=n)) * 10.0 ** rng.integers(-34, 34, size=n)
    values[::5] = 0.0
    values[1:40] = [np.inf, 1e-30, np.nextafter(1e-30, 0), np.nextafter(1e-30, 1), 1e-31, 1e30, 1e31,
                    *10.0 ** (np.arange(-16, 16) / 10)]  # bin edges
    over = rng.random(n) < 0.05
    over[::10] = True  # failing zeros count as zeros, not in the lowest bin
    for mask in (None, over, np.zeros(n, bool), np.ones(n, bool)):
        failing = None if mask is None else values[mask]
        assert error_histogram(values, failing) == _histogram_by_definition(values, mask)
    only_zeros = np.zeros(70_000)
    assert error_histogram(only_zeros, np.zeros(0)) == _histogram_by_definition(only_zeros, only_zeros > 0)
    assert error_histogram(np.zeros(0)) is None
    for size in range(1, 20):  # shorter than, equal to and just past the rows
        assert error_histogram(values[:size]) == _histogram_by_definition(values[:size]), size
    strided = values[::3].reshape(-1, 1)[::2]  # neither contiguous nor float64 after this
    assert error_histogram(strided.astype(np.float32)) == _histogram_by_definition(strided.astype(np.float32))


def test_a_large_outputs_histograms_counted_side_by_side_equal_their_definition():
    """From _PARALLEL_ELEMENTS errors on, the relative errors are counted in a second thread: the same counts."""
    from exportkit.compare.summaries import _PARALLEL_ELEMENTS

    rng = np.random.default_rng(12)
    e = rng.normal(size=_PARALLEL_ELEMENTS // 2 + 1001).astype(np.float32)
    a = e + (rng.normal(size=e.size) * 1e-6).astype(np.float32)
    e[::1009], a[::1009] = 0.0, 1e-7  # judged by atol alone
    a[::997] = e[::997]
    a[::50_001] += 1e-2
    c = compare_arrays("y", e, a, Tolerance(1e-5, 1e-5))
    diff = np.abs(a.astype(np.float64) - e.astype(np.float64))
    mag = np.abs(e.astype(np.float64))
    over = diff > 1e-5 + 1e-5 * mag
    assert 0 < over.sum() < 100 and c.mismatched == over.sum()
    assert c.abs_err_histogram == _histogram_by_definition(diff, over)
    nonzero = mag > 0
    assert c.rel_err_histogram == _histogram_by_definition(diff[nonzero] / mag[nonzero], over[nonzero])


def test_error_histogram_bins_the_values_at_and_around_every_bin_edge_as_defined():
    """The bins come from a table of bin edges, not a log10 per value: every value within 128 ulps of each nominal
    edge 10**(b/10) (the edges log10 defines lie up to ~110 ulps below them), walked one ulp at a time, is binned
    as the definition bins it; so are the extremes of float64."""
    from exportkit.compare.summaries import error_histogram

    nominal = (10.0 ** (np.arange(-300, 301) / 10)).view(np.int64)
    for ulps in range(-128, 129):
        values = (nominal + ulps).view(np.float64)
        over = np.arange(values.size) % 3 == 0  # two values misbinned the opposite ways would not cancel out
        assert error_histogram(values, values[over]) == _histogram_by_definition(values, over), ulps
    extremes = np.array([0.0, 5e-324, 2.2250738585072014e-308, 1e-30, 1.0, 1e30, 1.7976931348623157e308, np.inf])
    assert error_histogram(extremes) == _histogram_by_definition(extremes)


def _worst_by_definition(excess, k=10):
    flat = np.asarray(excess, np.float64).ravel()
    order = sorted((i for i in range(flat.size) if flat[i] > -np.inf), key=lambda i: (-flat[i], i))
    return order[:k]  # NaN compares False with -inf: never counted


@pytest.mark.parametrize("kind", ["normal", "ties", "all-equal", "mostly-minus-inf", "inf", "nan", "few", "small",
                                  "ascending", "plateau", "all-equal-long"])
def test_worst_elements_are_the_largest_excesses_ties_in_position_order(kind):
    from exportkit.compare.summaries import worst_elements

    rng = np.random.default_rng(3)
    x = rng.normal(size=20_000)
    if kind == "ties":
        x = np.round(x, 1)
    elif kind == "all-equal":
        x[:] = -1e-5  # a bit-exact output with many zeros: every zero has the same margin
    elif kind == "mostly-minus-inf":
        x[:] = -np.inf
        x[[5, 19_000, 7]] = [1.0, 2.0, 1.0]
    elif kind == "inf":
        x[rng.random(x.size) < 0.2] = np.inf
    elif kind == "nan":
        x[rng.random(x.size) < 0.2] = np.nan
    elif kind == "few":
        x = x[:7]
    elif kind == "small":
        x = np.round(x[:500], 1)
    elif kind == "ascending":  # the largest values all in the last block
        x = np.sort(np.round(x, 2))
    elif kind == "plateau":  # more blocks reach the 10th largest than are worth ranking: the ties' first positions
        x = np.minimum(np.round(np.tile(x, 3), 1), 1.0)
    elif kind == "all-equal-long":
        x = np.full(70_001, -1e-5)
    worst = worst_elements(x, x, x, "float", "float", np.abs(x))
    assert [w["index"][0] for w in worst] == _worst_by_definition(x)
    assert [w["excess"] for w in worst] == [float(x[w["index"][0]]) for w in worst]


def test_worst_elements_of_multidimensional_int_and_bool_outputs():
    rng = np.random.default_rng(4)
    e = rng.integers(-50, 50, size=(30, 40, 5)).astype(np.int32)
    a = e.copy()
    a[3, 7, 1] += 9
    a[10, 0, 4] -= 2
    a[29, 39, 4] += 9
    c = compare_arrays("i", e, a, Tolerance(1.0, 0.0))
    assert [w["index"] for w in c.worst_elements[:3]] == [[3, 7, 1], [29, 39, 4], [10, 0, 4]]
    assert c.worst_elements[0]["abs_err"] == 9.0 and c.worst_elements[2]["excess"] == 1.0
    assert c.abs_err_histogram == _histogram_by_definition([9, 2, 9] + [0] * (e.size - 3),
                                                          np.array([True, True, True] + [False] * (e.size - 3)))
    assert c.sample_pairs is None  # integers only: nothing to scatter
    b = rng.random((100, 3)) < 0.5
    flipped = b.copy()
    flipped[[4, 60, 61], [0, 2, 1]] ^= True
    c = compare_arrays("b", b, flipped, EXACT)
    assert [w["index"] for w in c.worst_elements] == [[4, 0], [60, 2], [61, 1]]


def test_sample_pairs_are_evenly_spaced_over_the_finite_elements():
    from exportkit.compare.summaries import SAMPLE_PAIRS, sample_pairs

    e = np.arange(10_000, dtype=np.float32).reshape(100, 100)
    pairs = sample_pairs(e, e + 1, np.ones(e.shape, bool))
    spaced = np.linspace(0, e.size - 1, SAMPLE_PAIRS).round()
    assert pairs["expected"] == spaced.tolist() and pairs["actual"] == (spaced + 1).tolist()
    finite = np.ones(e.shape, bool)
    finite[:, ::2] = False
    pairs = sample_pairs(e, e, finite)
    kept = np.flatnonzero(finite.ravel())
    assert pairs["expected"] == kept[np.linspace(0, kept.size - 1, SAMPLE_PAIRS).round().astype(int)].tolist()
    small = np.array([1.0, np.nan, 3.0])
    assert sample_pairs(small, small, np.isfinite(small)) == {"expected": [1.0, 3.0], "actual": [1.0, 3.0]}
