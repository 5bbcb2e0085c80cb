"""The tf.keras 2 / Keras 3 .h5 loader (exportkit.sources.h5compat) on the samples and on models built here.

Real TensorFlow, Keras 3 and tf_keras; no mocks. The samples' own tests are in sample_models/tests.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from exportkit.sources import h5compat  # (no TensorFlow import at module level)

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    # Keras' own save_weights: "__array__ implementation doesn't accept a copy keyword" (TF variables)
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
]


# ----------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def custom_objects():
    from sample_models.custom_layers import CUSTOM_OBJECTS

    return dict(CUSTOM_OBJECTS)


def _ranker_inputs(n=5, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(n, 8)).astype("float32"), rng.integers(0, 50, size=(n, 4)).astype("int32")]


# ----------------------------------------------------------------------------------------------- h5compat
def test_h5_attributes(sample):
    assert h5compat.keras_version_of_h5(sample("tfk2_mixed.h5")["path"]).startswith("2.")
    assert h5compat.keras_version_of_h5(sample("mixed_functional.h5")["path"]).startswith("3.")
    config = h5compat.read_h5_model_config(sample("tfk2_mixed.h5")["path"])
    assert config["class_name"] in ("Functional", "Model")
    assert {l["name"] for l in config["config"]["layers"]} >= {"features", "ids", "score", "embedding"}
    with pytest.raises(ValueError, match="no model_config"):
        h5compat.read_h5_model_config(sample("ranker.weights.h5")["path"])


def test_plain_keras3_cannot_load_tfk2_mixed(sample):
    """Why h5compat exists; if a future Keras loads the file itself, load_h5 just takes the first path."""
    import keras

    try:
        keras.models.load_model(sample("tfk2_mixed.h5")["path"], compile=False)
    except (AttributeError, TypeError, ValueError):
        assert h5compat.needs_normalization(sample("tfk2_mixed.h5")["path"])
    else:
        pytest.skip("this Keras version loads tf.keras 2 mixed-precision .h5 files by itself")


@pytest.mark.parametrize("name,policy", [("tfk2_mixed.h5", "mixed_float16"), ("tfk2_functional.h5", "float32")])
def test_load_h5_tfk2_matches_tf_keras(sample, name, policy):
    import tf_keras

    path = sample(name)["path"]
    model = h5compat.load_h5(path, {})
    compute_layers = [l for l in model.layers if type(l).__name__ in ("Dense", "Embedding", "BatchNormalization",
                                                                      "LayerNormalization", "Concatenate")]
    assert compute_layers and {l.dtype_policy.name for l in compute_layers} == {policy}
    assert {l.dtype_policy.name for l in model.get_layer("block").layers} == {policy}
    assert model.get_layer("score").dtype_policy.name == "float32"
    assert [t.name for t in model.inputs] == ["features", "ids"]
    assert model.output_names == ["score", "embedding"]

    x = _ranker_inputs(n=7, seed=3)
    expected = tf_keras.models.load_model(path, compile=False).predict(x, verbose=0)
    got = model.predict(x, verbose=0)
    assert got[1].dtype == (np.float16 if policy == "mixed_float16" else np.float32)
    for e, g in zip(expected, got):
        assert e.dtype == g.dtype
        np.testing.assert_allclose(g.astype("float32"), e.astype("float32"), atol=1e-3, rtol=1e-3)


def test_load_h5_keras3_mixed_with_custom_objects(sample, custom_objects):
    path = sample("mixed_functional.h5")["path"]
    model = h5compat.load_h5(path, {"FeatureCross": custom_objects["FeatureCross"]})
    assert model.get_layer("cross").dtype_policy.name == "mixed_float16"
    score, embedding = model.predict(_ranker_inputs(), verbose=0)
    assert score.dtype == np.float32 and embedding.dtype == np.float16


def test_missing_custom_objects_still_raise(sample):
    import keras

    with pytest.raises(ValueError, match="Unknown layer: 'FeatureCross'"):
        h5compat.load_h5(sample("mixed_functional.h5")["path"], {})
    with pytest.raises(TypeError, match="Could not locate class 'FeatureCross'"):
        keras.models.load_model(sample("mixed_functional.keras")["path"], compile=False)


def test_tfk2_mixed_custom_layer_needs_its_keras3_counterpart(tmp_path):
    """A tf.keras 2 mixed model with a custom layer: normalization happens, the missing class still raises."""
    import keras
    import tf_keras

    from sample_models.build_samples import tf_keras_policy

    class Tfk2Scale(tf_keras.layers.Layer):
        def build(self, input_shape):
            self.w = self.add_weight(name="w", shape=(int(input_shape[-1]),), initializer="random_normal")

        def call(self, x):
            return x * tf_keras.backend.cast(self.w, x.dtype)

    class Keras3Scale(keras.layers.Layer):
        def build(self, input_shape):
            self.w = self.add_weight(name="w", shape=(int(input_shape[-1]),), initializer="zeros")

        def call(self, x):
            return x * keras.ops.cast(self.w, x.dtype)

    tf_keras.utils.set_random_seed(7)
    with tf_keras_policy("mixed_float16"):
        inp = tf_keras.Input((4,), name="x")
        h = Tfk2Scale(name="scale")(tf_keras.layers.Dense(4, name="dense")(inp))
        out = tf_keras.layers.Activation("linear", dtype="float32", name="y")(h)
        tfk2_model = tf_keras.Model(inp, out)
    path = tmp_path / "tfk2_custom_mixed.h5"
    tfk2_model.save(str(path))
    x = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")

    with pytest.raises(ValueError, match="Unknown layer: 'Tfk2Scale'"):
        h5compat.load_h5(path, {})
    model = h5compat.load_h5(path, {"Tfk2Scale": Keras3Scale})
    assert model.get_layer("scale").dtype_policy.name == "mixed_float16"
    np.testing.assert_allclose(model.predict(x, verbose=0), tfk2_model.predict(x, verbose=0), atol=1e-3)


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_tfk2_nested_models_as_outputs(tmp_path, policy):
    """Nested Functional and Sequential models whose calls are model outputs (output_layers refs)."""
    import tf_keras

    from sample_models.build_samples import tf_keras_policy

    tf_keras.utils.set_random_seed(11)
    with tf_keras_policy(policy):
        inner_in = tf_keras.Input((5,))
        inner = tf_keras.Model(inner_in, tf_keras.layers.Dense(3, name="inner_dense")(inner_in), name="inner")
        seq = tf_keras.Sequential([tf_keras.Input((5,)), tf_keras.layers.Dense(2, name="seq_dense")], name="seq")
        x = tf_keras.Input((5,), name="x")
        both = tf_keras.layers.Add(name="add")([inner(x), inner(x)])  # a shared nested model: nodes 1 and 2
        tfk2_model = tf_keras.Model(x, [inner(x), seq(x), both])
    path = tmp_path / f"tfk2_nested_{policy}.h5"
    tfk2_model.save(str(path))
    model = h5compat.load_h5(path, {})
    assert model.get_layer("inner").get_layer("inner_dense").dtype_policy.name == policy
    xs = np.random.default_rng(2).normal(size=(4, 5)).astype("float32")
    for got, expected in zip(model.predict(xs, verbose=0), tfk2_model.predict(xs, verbose=0)):
        np.testing.assert_allclose(got.astype("float32"), expected.astype("float32"), atol=1e-3)


def test_load_h5_does_not_hide_unrelated_errors(tmp_path):
    with pytest.raises((OSError, ValueError)):
        h5compat.load_h5(tmp_path / "missing.h5", {})
    bogus = tmp_path / "bogus.h5"
    bogus.write_bytes(b"not an hdf5 file")
    with pytest.raises((OSError, ValueError)):
        h5compat.load_h5(bogus, {})


# ------------------------------------------------------------------------------------- normalize (pure)
def _policy(name, module=True, cls="Policy"):
    p = {"class_name": cls, "config": {"name": name}}
    if module:
        p = {"module": "keras.mixed_precision", **p, "registered_name": None}
    return p


def test_normalize_rewrites_policies_everywhere_and_copies():
    config = {"class_name": "Functional", "config": {"name": "m", "layers": [
        {"class_name": "Dense", "name": "d", "config": {"name": "d", "dtype": _policy("mixed_float16")},
         "inbound_nodes": []},
        {"class_name": "Dense", "name": "old", "config": {"name": "old", "dtype": _policy("mixed_bfloat16", False)},
         "inbound_nodes": []},
        {"class_name": "Dense", "name": "v1", "inbound_nodes": [],
         "config": {"name": "v1", "dtype": _policy("mixed_float16", False, "PolicyV1")}},
        {"class_name": "Bidirectional", "name": "bi", "inbound_nodes": [], "config": {
            "name": "bi", "dtype": "mixed_float16",
            "layer": {"class_name": "LSTM", "config": {"name": "lstm", "dtype": _policy("mixed_float16")}}}},
        {"class_name": "Policy", "name": "custom_layer_called_policy", "inbound_nodes": [],
         "config": {"name": "custom_layer_called_policy", "dtype": "float32"}},
    ], "input_layers": [], "output_layers": []}}
    before = copy.deepcopy(config)
    out = h5compat.normalize_legacy_config(config)
    assert config == before  # input untouched
    layers = out["config"]["layers"]
    assert layers[0]["config"]["dtype"] == h5compat.keras3_policy("mixed_float16")
    assert layers[1]["config"]["dtype"] == h5compat.keras3_policy("mixed_bfloat16")
    assert layers[2]["config"]["dtype"] == h5compat.keras3_policy("mixed_float16")
    assert layers[3]["config"]["dtype"] == "mixed_float16"
    assert layers[3]["config"]["layer"]["config"]["dtype"] == h5compat.keras3_policy("mixed_float16")
    assert layers[4] == before["config"]["layers"][4]  # a layer class named Policy is not a dtype
    assert h5compat.normalize_legacy_config(out) == out  # idempotent


def test_normalize_renumbers_nested_functional_inbound_refs_only():
    inner = {"class_name": "Functional", "name": "inner", "inbound_nodes": [[["x", 0, 0, {}]], [["x", 0, 0, {}]]],
             "config": {"name": "inner", "layers": [], "input_layers": [], "output_layers": []}}
    add = {"class_name": "Add", "name": "add", "config": {"name": "add"},
           "inbound_nodes": [[["inner", 1, 0, {}], ["inner", 2, 0, {}]]]}
    config = {"class_name": "Functional", "config": {"name": "m", "layers": [inner, add],
                                                     "input_layers": [["x", 0, 0]],
                                                     "output_layers": [["add", 0, 0], ["inner", 1, 0]]}}
    out = h5compat.normalize_legacy_config(config, "2.21.0")
    assert out["config"]["layers"][1]["inbound_nodes"] == [[["inner", 0, 0, {}], ["inner", 1, 0, {}]]]
    # Keras 3's functional_from_config already subtracts 1 for Functional models in output_layers
    assert out["config"]["output_layers"] == [["add", 0, 0], ["inner", 1, 0]]


def test_normalize_renumbers_nested_sequential_only_for_tf_keras2():
    seq = {"class_name": "Sequential", "name": "block", "inbound_nodes": [[["x", 0, 0, {}]]],
           "config": {"name": "block", "layers": [{"class_name": "InputLayer", "config": {"name": "in"}}]}}
    nxt = {"class_name": "Dense", "name": "head", "config": {"name": "head"}, "inbound_nodes": [[["block", 1, 0, {}]]]}
    config = {"class_name": "Functional", "config": {"name": "m", "layers": [seq, nxt],
                                                     "input_layers": [["x", 0, 0]],
                                                     "output_layers": [["head", 0, 0], ["block", 1, 0]]}}
    tfk2 = h5compat.normalize_legacy_config(config, "2.15.0")
    assert tfk2["config"]["layers"][1]["inbound_nodes"] == [[["block", 0, 0, {}]]]
    assert tfk2["config"]["output_layers"] == [["head", 0, 0], ["block", 0, 0]]
    assert h5compat.normalize_legacy_config(config, "3.15.1") == config
    assert h5compat.normalize_legacy_config(config, None) == config
