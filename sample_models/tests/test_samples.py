"""The sample models themselves (sample_models/): samples.json, and that Keras, tf_keras and TensorFlow load and run
them as built. Not exportkit's tests (those are in tests/): `make test-samples`, or `pytest sample_models/tests`.
"""
from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
]


@pytest.fixture(scope="session")
def samples(tmp_path_factory):
    """Every sample, built by build_all as `make samples` does."""
    from sample_models.build_samples import build_all

    out = tmp_path_factory.mktemp("samples")
    entries = build_all(out)
    return {"dir": out, "entries": entries}


@pytest.fixture(scope="session")
def custom_objects():
    from sample_models.custom_layers import CUSTOM_OBJECTS

    return dict(CUSTOM_OBJECTS)


def _path(samples, name) -> str:
    return samples["entries"][name]["path"]


def _ranker_inputs(n=5, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(n, 8)).astype("float32"), rng.integers(0, 50, size=(n, 4)).astype("int32")]


def test_samples_json_describes_every_sample(samples):
    from sample_models.build_samples import SAMPLES

    on_disk = json.loads((samples["dir"] / "samples.json").read_text())
    assert on_disk == samples["entries"]
    assert set(on_disk) == set(SAMPLES)
    for name, entry in on_disk.items():
        assert set(entry) == {"name", "path", "format", "export_args", "policy", "notes"}
        assert entry["name"] == name
        assert Path(entry["path"]).exists(), entry["path"]
        assert entry["format"] in {"h5", "keras", "checkpoint", "weights"}
        assert all(isinstance(a, str) for a in entry["export_args"])
        if "--python-path" in entry["export_args"]:
            assert entry["export_args"][entry["export_args"].index("--python-path") + 1] == str(REPO_ROOT)
    assert on_disk["tfk2_mixed.h5"]["policy"] == "mixed_float16"
    assert on_disk["ranker_ckpt"]["policy"].startswith("mixed_")


def test_mixed_functional_h5_and_keras_agree(samples, custom_objects):
    import keras

    x = _ranker_inputs()
    results = {}
    for name in ("mixed_functional.h5", "mixed_functional.keras"):
        model = keras.models.load_model(_path(samples, name), custom_objects=custom_objects, compile=False)
        assert [t.name for t in model.inputs] == ["features", "ids"]
        assert model.output_names == ["score", "embedding"]
        assert model.get_layer("cross").dtype_policy.name == "mixed_float16"
        assert model.get_layer("scaled").dtype_policy.name == "mixed_float16"
        score, embedding = model.predict(x, verbose=0)
        assert score.dtype == np.float32 and score.shape == (5, 1)
        assert embedding.dtype == np.float16 and embedding.shape == (5, 8)
        assert np.isfinite(score).all() and np.isfinite(embedding.astype("float32")).all()
        results[name] = (score, embedding)
    for a, b in zip(results["mixed_functional.h5"], results["mixed_functional.keras"]):
        np.testing.assert_array_equal(a, b)


def test_other_keras_samples_load_and_run(samples, custom_objects):
    import keras

    multi = keras.models.load_model(_path(samples, "multi_io.keras"), compile=False)
    rng = np.random.default_rng(1)
    out = multi.predict({"user": rng.normal(size=(3, 6)).astype("float32"),
                         "item": rng.normal(size=(3, 6)).astype("float32"),
                         "context": rng.normal(size=(3, 3)).astype("float32")}, verbose=0)
    assert set(out) == {"click", "dwell"}
    assert ((out["click"] > 0) & (out["click"] < 1)).all() and (out["dwell"] >= 0).all()

    text = keras.models.load_model(_path(samples, "text.keras"), compile=False)
    assert text.inputs[0].name == "text" and text.inputs[0].dtype == "string"
    logits = np.asarray(text(np.array([["cat"], ["dog"], ["unseen-word"]])))
    assert logits.shape == (3, 3) and logits.dtype == np.float32
    assert not np.allclose(logits[0], logits[1])  # the vocabulary really maps words to different rows

    from sample_models.custom_layers import ResidualMLP

    sub = keras.models.load_model(_path(samples, "subclassed.keras"), custom_objects=custom_objects, compile=False)
    assert isinstance(sub, ResidualMLP) and sub.built
    assert np.asarray(sub(np.ones((2, 8), "float32"))).shape == (2, 1)


def test_ranker_checkpoint_restores_only_into_its_builder(samples):
    import keras
    import tensorflow as tf

    from sample_models import builders
    from sample_models.build_samples import keras_policy

    folder = Path(_path(samples, "ranker_ckpt"))
    spec = tomllib.loads((folder / "exportkit.toml").read_text())
    assert spec["builder"] == "sample_models.builders:build_ranker"
    assert spec["python_path"] == [str(REPO_ROOT)]
    assert (folder / "checkpoint").is_file() and list(folder.glob("*.index"))
    for asset in spec.get("assets", []):
        assert (folder / asset).is_file()
    prefix = tf.train.latest_checkpoint(str(folder))
    assert prefix

    with keras_policy(spec["policy"]):
        model = builders.build_ranker(**spec["builder_args"])
    assert model.get_layer("scaled").dtype_policy.name == spec["policy"]
    tf.train.Checkpoint(model=model).restore(prefix).assert_existing_objects_matched()
    assert keras.config.dtype_policy().name == "float32"  # the policy came back

    with pytest.raises((AssertionError, ValueError)):
        other = builders.build_other_ranker(**spec["builder_args"])
        tf.train.Checkpoint(model=other).restore(prefix).assert_existing_objects_matched()


def test_weights_sample_rebuilds_from_model_config(samples, custom_objects):
    import keras

    entry = samples["entries"]["ranker.weights.h5"]
    config_path = entry["export_args"][entry["export_args"].index("--model-config") + 1]
    model = keras.models.model_from_json(Path(config_path).read_text(), custom_objects=custom_objects)
    model.load_weights(entry["path"])
    from sample_models import builders

    reference = builders.build_ranker()
    reference.load_weights(entry["path"])
    x = _ranker_inputs()[0]
    np.testing.assert_array_equal(model.predict(x, verbose=0), reference.predict(x, verbose=0))
