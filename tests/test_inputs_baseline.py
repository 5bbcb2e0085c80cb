"""Input generation/loading/saving and the baseline signature comparison (no TensorFlow)."""
from __future__ import annotations

import base64
import json

import ml_dtypes
import numpy as np
import pytest

from exportkit.errors import UsageError
from exportkit.verify.baseline import compare_signatures
from exportkit.inputs.generate import DEFAULT_UNKNOWN_DIM, generate_batches
from exportkit.inputs.load import load_inputs
from exportkit.inputs.npz import load_batches, save_batches
from exportkit.inputs.ranges import parse_int_range
from exportkit.inputs.spec import InputSpec

SPECS = [
    InputSpec("x", "float32", [-1, 3]),
    InputSpec("ids", "int64", [-1, -1]),
    InputSpec("words", "string", [-1]),
    InputSpec("mask", "bool", [-1, 2]),
    InputSpec("h", "bfloat16", [-1, 2]),
    InputSpec("d", "float64", [-1]),
    InputSpec("small", "uint8", [-1]),
]


def _eq(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and (
        a.tolist() == b.tolist() if a.dtype == object else np.array_equal(a, b, equal_nan=True))


# ------------------------------------------------------------------ parse_int_range


@pytest.mark.parametrize("spec,rng", [("0:10", (0, 10)), ("-5:5", (-5, 5)), (" 1 : 2 ", (1, 2)),
                                      ("-10:-1", (-10, -1))])
def test_parse_int_range(spec, rng):
    assert parse_int_range(spec) == rng


@pytest.mark.parametrize("spec", ["", "5", "0:", ":5", "a:b", "1.5:3", "5:5", "6:5", "0:10:2", "0-10"])
def test_parse_int_range_errors(spec):
    with pytest.raises(UsageError) as ei:
        parse_int_range(spec)
    assert "LO" in str(ei.value)


# ------------------------------------------------------------------ generate


def test_generate_dtypes_and_shapes():
    b1, b8 = generate_batches(SPECS, samples=8, seed=0)
    for batch, n in ((b1, 1), (b8, 8)):
        assert list(batch) == [s.key for s in SPECS]
        assert batch["x"].dtype == np.float32 and batch["x"].shape == (n, 3)
        assert batch["ids"].dtype == np.int64 and batch["ids"].shape == (n, DEFAULT_UNKNOWN_DIM)
        assert batch["words"].dtype == object and batch["words"].shape == (n,)
        assert all(isinstance(w, bytes) and 1 <= len(w) <= 8 for w in batch["words"])
        assert batch["mask"].dtype == np.bool_ and batch["mask"].shape == (n, 2)
        assert batch["h"].dtype == ml_dtypes.bfloat16 and batch["h"].shape == (n, 2)
        assert batch["d"].dtype == np.float64 and batch["small"].dtype == np.uint8
    assert b8["ids"].min() >= 0 and b8["ids"].max() < 10


def test_generate_value_distributions():
    (_, big) = generate_batches([InputSpec("x", "float32", [-1, 100]), InputSpec("i", "int32", [-1]),
                                 InputSpec("b", "bool", [-1])], samples=1000, seed=3, int_range=(-3, 3))
    x = big["x"]
    assert abs(float(x.mean())) < 0.05 and 0.9 < float(x.std()) < 1.1
    assert set(np.unique(big["i"]).tolist()) == {-3, -2, -1, 0, 1, 2}
    assert 0.4 < big["b"].mean() < 0.6


def test_generate_deterministic_by_seed():
    a = generate_batches(SPECS, 4, seed=7)
    b = generate_batches(SPECS, 4, seed=7)
    c = generate_batches(SPECS, 4, seed=8)
    for x, y in zip(a, b):
        assert all(_eq(x[k], y[k]) for k in x)
    assert not np.array_equal(a[1]["x"], c[1]["x"])


def test_generate_values_independent_of_other_inputs():
    a = generate_batches(SPECS, 4, seed=1)
    b = generate_batches(list(reversed(SPECS[:3])), 4, seed=1)
    assert np.array_equal(a[1]["x"], b[1]["x"]) and _eq(a[1]["words"], b[1]["words"])


def test_generate_single_sample_gives_one_batch():
    batches = generate_batches(SPECS, 1, seed=0)
    assert len(batches) == 1 and batches[0]["x"].shape == (1, 3)


def test_generate_fixed_dims_and_scalars():
    specs = [InputSpec("img", "float32", [4, 5, 5, 3]), InputSpec("t", "float32", [])]
    batches = generate_batches(specs, 8, seed=0)
    assert len(batches) == 1  # no dynamic batch dim anywhere: other batch sizes would be rejected
    assert batches[0]["img"].shape == (4, 5, 5, 3) and batches[0]["t"].shape == ()
    mixed = generate_batches([InputSpec("a", "float32", [-1, 2]), InputSpec("t", "int32", [])], 3, seed=0)
    assert [b["a"].shape for b in mixed] == [(1, 2), (3, 2)] and mixed[1]["t"].shape == ()


def test_generate_unknown_rank_and_unknown_dim_option():
    (b1,) = generate_batches([InputSpec("x", "float32", None)], 1, seed=0, unknown_dim=3)
    assert b1["x"].shape == (1, 3)
    (b1,) = generate_batches([InputSpec("seq", "int32", [-1, -1, 2])], 1, seed=0, unknown_dim=5)
    assert b1["seq"].shape == (1, 5, 2)


def test_generate_int_range_clipped_to_dtype():
    (_, b) = generate_batches([InputSpec("u", "uint8", [-1])], 200, seed=0, int_range=(-5, 1000))
    assert b["u"].min() >= 0 and b["u"].max() <= 255
    with pytest.raises(UsageError):
        generate_batches([InputSpec("u", "uint8", [-1])], 2, seed=0, int_range=(-5, 0))


def test_generate_errors():
    with pytest.raises(UsageError):
        generate_batches(SPECS, 0, seed=0)
    with pytest.raises(UsageError):
        generate_batches([InputSpec("v", "variant", [-1])], 2, seed=0)


# ------------------------------------------------------------------ save / load batches


def test_save_load_batches_round_trip(tmp_path):
    batches = generate_batches(SPECS, 4, seed=0)
    batches[0]["odd key/with slash"] = np.arange(3)
    batches[0]["file"] = np.zeros(2)  # a key np.savez could not take
    batches[1]["nul"] = np.array([b"a\x00", b"\x00", b"b"], dtype=object)
    batches[1]["scalar"] = np.float32(2.5) * np.ones((), np.float32)
    paths = save_batches(tmp_path, batches, prefix="inputs")
    assert [p.name for p in paths] == ["inputs_batch_0.npz", "inputs_batch_1.npz"]
    # readable without pickle by plain numpy, strings as S arrays
    with np.load(paths[0], allow_pickle=False) as z:
        assert z["words"].dtype.kind == "S"
    back = load_batches(tmp_path, prefix="inputs")
    assert len(back) == 2
    for a, b in zip(batches, back):
        assert set(a) == set(b)
        for k in a:
            assert _eq(np.asarray(a[k]), b[k]), k
    assert back[1]["nul"].tolist() == [b"a\x00", b"\x00", b"b"]
    assert back[1]["scalar"].shape == ()


def test_save_batches_without_prefix_and_ordering(tmp_path):
    batches = [{"x": np.array([i])} for i in range(12)]
    save_batches(tmp_path, batches)
    assert (tmp_path / "batch_0.npz").exists() and (tmp_path / "batch_11.npz").exists()
    assert [b["x"][0] for b in load_batches(tmp_path)] == list(range(12))


def test_save_batches_unicode_strings(tmp_path):
    save_batches(tmp_path, [{"s": np.array(["é", "ab"])}], prefix="o")
    assert load_batches(tmp_path, "o")[0]["s"].tolist() == ["é".encode(), b"ab"]


def test_load_batches_missing(tmp_path):
    with pytest.raises(UsageError):
        load_batches(tmp_path, "nope")


# ------------------------------------------------------------------ load_inputs: npz


def test_load_npz(tmp_path):
    p = tmp_path / "in.npz"
    np.savez(p, x=np.ones((2, 3), np.float64), ids=np.zeros((2, 4), np.int32), words=np.array([b"a", b"bc"]),
             mask=np.zeros((2, 2), bool), h=np.ones((2, 2), np.float32), d=np.ones(2), small=np.array([1, 2]))
    (batch,) = load_inputs(p, SPECS)
    assert batch["x"].dtype == np.float32 and batch["x"].shape == (2, 3)
    assert batch["ids"].dtype == np.int64
    assert batch["words"].dtype == object and batch["words"].tolist() == [b"a", b"bc"]
    assert batch["h"].dtype == ml_dtypes.bfloat16
    assert batch["small"].dtype == np.uint8


def test_load_npz_written_by_save_batches(tmp_path):
    batches = generate_batches(SPECS, 3, seed=2)
    paths = save_batches(tmp_path, batches)
    (b,) = load_inputs(paths[1], SPECS)
    for k in b:
        assert _eq(b[k], batches[1][k]), k


def test_load_npz_missing_and_unknown_keys(tmp_path):
    specs = [InputSpec("x", "float32", [-1, 3]), InputSpec("y", "int64", [-1])]
    p = tmp_path / "in.npz"
    np.savez(p, x=np.ones((1, 3)), z=np.ones(1))
    with pytest.raises(UsageError) as ei:
        load_inputs(p, specs)
    msg = str(ei.value)
    assert "missing input 'y'" in msg and "unknown input 'z'" in msg
    assert ei.value.remedy == "the signature's inputs are: x, y"


def test_load_npz_object_array_needs_pickle(tmp_path):
    p = tmp_path / "in.npz"
    np.savez(p, words=np.array([b"a"], dtype=object))
    with pytest.raises(UsageError) as ei:
        load_inputs(p, [InputSpec("words", "string", [-1])])
    assert "dtype='S'" in ei.value.remedy


@pytest.mark.parametrize("value,spec,fragment", [
    (np.ones((1, 4)), InputSpec("x", "float32", [-1, 3]), "dim 1 must be 3"),
    (np.ones((3,)), InputSpec("x", "float32", [-1, 3]), "expected rank 2"),
    (np.array([1.5]), InputSpec("x", "int32", [-1]), "non-integer"),
    (np.array([300]), InputSpec("x", "uint8", [-1]), "do not fit"),
    (np.array([2]), InputSpec("x", "bool", [-1]), "bool"),
    (np.array([b"a"]), InputSpec("x", "float32", [-1]), "strings"),
    (np.array([1.0]), InputSpec("x", "string", [-1]), "strings"),
])
def test_load_npz_bad_values(tmp_path, value, spec, fragment):
    p = tmp_path / "in.npz"
    np.savez(p, x=value)
    with pytest.raises(UsageError) as ei:
        load_inputs(p, [spec])
    assert fragment in str(ei.value) and "'x'" in str(ei.value)


def test_load_npz_integral_floats_to_int(tmp_path):
    p = tmp_path / "in.npz"
    np.savez(p, x=np.array([1.0, 2.0]))
    (b,) = load_inputs(p, [InputSpec("x", "int32", [-1])])
    assert b["x"].dtype == np.int32 and b["x"].tolist() == [1, 2]


def test_load_inconsistent_batch_sizes(tmp_path):
    p = tmp_path / "in.npz"
    np.savez(p, a=np.ones((2, 3)), b=np.ones((3,)))
    with pytest.raises(UsageError) as ei:
        load_inputs(p, [InputSpec("a", "float32", [-1, 3]), InputSpec("b", "float32", [-1])])
    assert "batch size" in str(ei.value)


def test_load_missing_file_and_bad_suffix(tmp_path):
    with pytest.raises(UsageError):
        load_inputs(tmp_path / "nope.npz", SPECS)
    p = tmp_path / "in.csv"
    p.write_text("x\n1\n")
    with pytest.raises(UsageError) as ei:
        load_inputs(p, SPECS)
    assert ".npz" in ei.value.remedy
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(UsageError):
        load_inputs(bad, SPECS)


# ------------------------------------------------------------------ load_inputs: json

JSPECS = [InputSpec("x", "float32", [-1, 2]), InputSpec("w", "string", [-1]), InputSpec("n", "int64", [-1])]


def test_load_json_single_batch(tmp_path):
    p = tmp_path / "in.json"
    p.write_text(json.dumps({"x": [[1, 2], [3, 4.5]], "w": ["héllo", "b"], "n": [1, 2]}))
    (b,) = load_inputs(p, JSPECS)
    assert b["x"].dtype == np.float32 and b["x"].tolist() == [[1, 2], [3, 4.5]]
    assert b["w"].dtype == object and b["w"].tolist() == ["héllo".encode("utf-8"), b"b"]
    assert b["n"].dtype == np.int64


def test_load_json_several_batches_and_b64(tmp_path):
    p = tmp_path / "in.json"
    raw = b"\x00\xffbin"
    p.write_text(json.dumps([
        {"x": [[1, 2]], "w": [{"b64": base64.b64encode(raw).decode()}], "n": [1]},
        {"x": [[1, 2], [3, 4], [5, 6]], "w": ["a", "b", "c"], "n": [1, 2, 3]},
    ]))
    b0, b1 = load_inputs(p, JSPECS)
    assert b0["w"].tolist() == [raw] and b1["x"].shape == (3, 2)


def test_load_json_tf_serving_columnar_form(tmp_path):
    p = tmp_path / "in.json"
    p.write_text(json.dumps({"inputs": {"x": [[1, 2]], "w": ["a"], "n": [1]}}))
    (b,) = load_inputs(p, JSPECS)
    assert b["x"].shape == (1, 2)


@pytest.mark.parametrize("doc,fragment", [
    ({"x": [[1, 2]], "w": ["a"]}, "missing input 'n'"),
    ({"x": [[1, 2]], "w": ["a"], "n": [1], "extra": [1]}, "unknown input 'extra'"),
    ({"x": [[1, 2], [3]], "w": ["a", "b"], "n": [1, 2]}, "'x'"),
    ({"x": [[1, 2]], "w": [1], "n": [1]}, "'w'"),
    ({"x": [[1, 2]], "w": ["a"], "n": ["one"]}, "'n'"),
    ([], "non-empty list"),
    ("just a string", "expected an object"),
])
def test_load_json_errors(tmp_path, doc, fragment):
    p = tmp_path / "in.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(UsageError) as ei:
        load_inputs(p, JSPECS)
    assert fragment in str(ei.value)


def test_load_json_error_names_the_batch(tmp_path):
    p = tmp_path / "in.json"
    p.write_text(json.dumps([{"x": [[1, 2]], "w": ["a"], "n": [1]}, {"x": [[1, 2]], "w": ["a"]}]))
    with pytest.raises(UsageError) as ei:
        load_inputs(p, JSPECS)
    assert "batch 1" in str(ei.value)


def test_load_invalid_json(tmp_path):
    p = tmp_path / "in.json"
    p.write_text("{not json")
    with pytest.raises(UsageError) as ei:
        load_inputs(p, JSPECS)
    assert "not valid JSON" in str(ei.value)


# ------------------------------------------------------------------ baseline


def sig(inputs: dict, outputs: dict) -> dict:
    def side(d):
        return {k: {"dtype": v[0], "shape": v[1], "extra": "ignored"} for k, v in d.items()}

    return {"inputs": side(inputs), "outputs": side(outputs), "method_name": "tensorflow/serving/predict"}


BASE = sig({"x": ("float32", [-1, 3]), "ids": ("int64", [-1, -1])}, {"score": ("float32", [-1, 1])})


def codes(findings):
    return [(f.severity, f.code) for f in findings]


def test_baseline_unchanged():
    assert compare_signatures(BASE, json.loads(json.dumps(BASE))) == []


def test_baseline_removed_input_and_output():
    new = sig({"x": ("float32", [-1, 3])}, {})
    assert codes(compare_signatures(BASE, new)) == [("error", "baseline-removed-input"),
                                                    ("error", "baseline-removed-output")]


def test_baseline_renamed():
    new = sig({"features": ("float32", [-1, 3]), "ids": ("int64", [-1, -1])}, {"probability": ("float32", [-1, 1])})
    f = compare_signatures(BASE, new)
    assert codes(f) == [("error", "baseline-renamed-input"), ("error", "baseline-renamed-output")]
    assert "'x'" in f[0].message and "'features'" in f[0].message


def test_baseline_removed_plus_added_with_other_type_is_not_a_rename():
    new = sig({"features": ("float64", [-1, 3]), "ids": ("int64", [-1, -1])}, {"score": ("float32", [-1, 1])})
    assert codes(compare_signatures(BASE, new)) == [("error", "baseline-removed-input"),
                                                    ("error", "baseline-added-input")]


def test_baseline_added_input_is_breaking_added_output_is_not():
    new = sig({"x": ("float32", [-1, 3]), "ids": ("int64", [-1, -1]), "country": ("string", [-1])},
              {"score": ("float32", [-1, 1]), "logits": ("float32", [-1, 1])})
    assert codes(compare_signatures(BASE, new)) == [("error", "baseline-added-input"),
                                                    ("info", "baseline-added-output")]


@pytest.mark.parametrize("side", ["inputs", "outputs"])
def test_baseline_dtype_changed(side):
    new = json.loads(json.dumps(BASE))
    key = "x" if side == "inputs" else "score"
    new[side][key]["dtype"] = "float16"
    f = compare_signatures(BASE, new)
    assert codes(f) == [("error", "baseline-dtype-changed")]
    assert "float32 -> float16" in f[0].message


def test_baseline_dtype_names_normalised():
    new = json.loads(json.dumps(BASE))
    new["inputs"]["x"]["dtype"] = "DT_FLOAT"
    assert compare_signatures(BASE, new) == []


@pytest.mark.parametrize("old,new,expected", [
    ([-1, 3], [8, 3], ("error", "baseline-input-shape-changed")),   # dynamic batch became fixed
    ([-1, 3], [-1, 4], ("error", "baseline-input-shape-changed")),  # fixed dim changed
    ([-1, 3], [-1, 3, 1], ("error", "baseline-input-shape-changed")),  # rank changed
    (None, [-1, 3], ("error", "baseline-input-shape-changed")),     # unknown rank became known
    ([-1, 3], [-1, -1], ("info", "baseline-input-shape-relaxed")),   # fixed -> any: compatible
    ([-1, 3], None, ("info", "baseline-input-shape-relaxed")),
    ([-1, 3], [None, 3], None),                                      # None == -1
    ([-1, 3], [-1, 3], None),
])
def test_baseline_input_shapes(old, new, expected):
    o = sig({"x": ("float32", old)}, {})
    n = sig({"x": ("float32", new)}, {})
    assert codes(compare_signatures(o, n)) == ([expected] if expected else [])


@pytest.mark.parametrize("old,new,expected", [
    ([-1, 1], [-1, 2], ("error", "baseline-output-shape-changed")),
    ([-1, 1], [-1], ("error", "baseline-output-shape-changed")),
    ([-1, 1], [-1, -1], ("warning", "baseline-output-shape-relaxed")),
    ([-1, 1], None, ("warning", "baseline-output-shape-relaxed")),
    ([-1, -1], [-1, 1], ("info", "baseline-output-shape-narrowed")),
    (None, [-1, 1], ("info", "baseline-output-shape-narrowed")),
    ([-1, 1], [-1, 1], None),
])
def test_baseline_output_shapes(old, new, expected):
    o = sig({}, {"y": ("float32", old)})
    n = sig({}, {"y": ("float32", new)})
    assert codes(compare_signatures(o, n)) == ([expected] if expected else [])


def test_baseline_findings_are_serialisable_and_messages_name_keys():
    new = sig({"x": ("float32", [4, 3])}, {"score": ("float16", [-1, 2])})
    fs = compare_signatures(BASE, new)
    json.dumps([f.to_dict() for f in fs])
    assert {f.code for f in fs} == {"baseline-removed-input", "baseline-input-shape-changed",
                                    "baseline-dtype-changed", "baseline-output-shape-changed"}
    shape = next(f for f in fs if f.code == "baseline-input-shape-changed")
    assert "'x'" in shape.message and "dim 0" in shape.message


def test_baseline_empty_signatures():
    assert compare_signatures({}, {}) == []
    assert codes(compare_signatures({}, BASE)) == [("error", "baseline-added-input")] * 2 + [
        ("info", "baseline-added-output")]
