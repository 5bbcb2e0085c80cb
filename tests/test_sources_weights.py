"""Issue 50: an HDF5 file is what its content says, not what its name says. Keras weights (tf_keras by layer,
tf_keras and Keras 3 `.weights.h5` layout) load with --builder under any name (`tf_model.h5`, `weights.hdf5`,
`model.weights.h5`); a full model .h5 given a builder lends it its weights; an HDF5 file that is neither says what
it holds. And the messages met on the way: --builder never silently ignored, no file-object repr in place of a
path, a builder whose own dependency is missing named as such.

The models are two Dense layers built here in both Kerases; their weights are saved from a trained (here: randomly
re-initialized) instance, so a fresh build would not give the same outputs.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from conftest import invoke

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")]

BUILDERS = '''
import keras
import tf_keras


def _two_dense(k, hidden=3):
    x = k.Input((4,), name="x")
    return k.Model(x, k.layers.Dense(1, name="score")(k.layers.Dense(hidden, activation="relu", name="hidden")(x)))


def keras3():
    return _two_dense(keras)


def tfkeras(hidden=3):
    return _two_dense(tf_keras, hidden)


class Pair(tf_keras.layers.Layer):
    """Two blocks of one shape, as a transformer's: with the first frozen, tf_keras stores it after the second."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.first, self.second = tf_keras.layers.Dense(4, name="first"), tf_keras.layers.Dense(4, name="second")

    def call(self, x):
        return self.second(tf_keras.activations.relu(self.first(x)))


def pair():
    x = tf_keras.Input((4,), name="x")
    return tf_keras.Model(x, tf_keras.layers.Dense(1, name="score")(Pair(name="pair")(x)))
'''
NAMES = ("tf_model.h5", "weights.hdf5", "model.weights.h5")
X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{kind: (file, builder, outputs on X)} for three kinds of weights, plus full-model files and a stranger."""
    import h5py

    root = tmp_path_factory.mktemp("weights")
    (root / "site").mkdir()
    (root / "site" / "wbuilders.py").write_text(BUILDERS)
    (root / "site" / "needs_missing.py").write_text("import exportkit_no_such_dependency\n\ndef build():\n    pass\n")
    namespace: dict = {}
    exec(compile(BUILDERS, "wbuilders", "exec"), namespace)
    made = {}
    for kind, builder, suffix in (("tf_keras by layer", "tfkeras", "legacy.h5"),
                                  ("tf_keras .weights.h5", "tfkeras", "tfk.weights.h5"),
                                  ("Keras 3 .weights.h5", "keras3", "k3.weights.h5")):
        model = namespace[builder]()
        rng = np.random.default_rng(len(made))
        model.set_weights([rng.normal(size=w.shape) for w in model.get_weights()])
        model.save_weights(str(root / suffix))
        made[kind] = (root / suffix, f"wbuilders:{builder}", np.asarray(model(X)))
    tuned = namespace["pair"]()  # fine-tuned with its first block frozen
    rng = np.random.default_rng(7)
    tuned.set_weights([rng.normal(size=w.shape) for w in tuned.get_weights()])
    tuned.get_layer("pair").first.trainable = False
    tuned.save_weights(str(root / "tuned.h5"))
    made["frozen block"] = (root / "tuned.h5", "wbuilders:pair", np.asarray(tuned(X)))
    full = namespace["tfkeras"]()
    full.set_weights([np.full(w.shape, 0.5) for w in full.get_weights()])
    full.save(str(root / "full.h5"))
    made["full model"] = (root / "full.h5", "wbuilders:tfkeras", np.asarray(full(X)))
    keras3 = namespace["keras3"]()
    keras3.save(str(root / "full.keras"))
    with h5py.File(root / "stranger.h5", "w") as f:
        f.create_group("a").create_dataset("x", data=np.zeros(3))
        f.create_group("b")
        f.attrs["note"] = "not Keras"
    return root, made


def _load(path, builder=None, site=None, **kwargs):
    from exportkit.options.source import source_options
    from exportkit.sources.load import load_source

    return load_source(source_options(str(path), builder=builder, python_path=[str(site)] if site else [], **kwargs))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["tf_keras by layer", "tf_keras .weights.h5", "Keras 3 .weights.h5"])
def test_weights_load_by_content_under_any_name(files, tmp_path, kind, name):
    from exportkit.sources.load import detect_format

    root, made = files
    source, builder, expected = made[kind]
    renamed = tmp_path / name
    shutil.copy(source, renamed)
    assert detect_format(str(renamed)) == "weights"
    loaded = _load(renamed, builder, root / "site")
    assert loaded.format == "weights"
    np.testing.assert_allclose(np.asarray(loaded.model(X)), expected, rtol=1e-6)


def test_weights_saved_with_a_frozen_block_load_by_name(files):
    """In order, the frozen first block's weights would land in the second (same shapes: no error); the file names
    them, so they load where they belong, as Hugging Face's loader does."""
    import sys

    root, made = files
    source, builder, expected = made["frozen block"]
    loaded = _load(source, builder, root / "site")
    np.testing.assert_allclose(np.asarray(loaded.model(X)), expected, rtol=1e-6)
    in_order = sys.modules["wbuilders"].pair()
    in_order.load_weights(str(source))  # what Keras' reader does with it
    assert not np.allclose(np.asarray(in_order(X)), expected, rtol=1e-6)


def test_weights_that_do_not_fit_say_what_the_file_is(files, tmp_path):
    from exportkit.errors import UsageError

    root, made = files
    source, _, _ = made["tf_keras by layer"]
    shutil.copy(source, tmp_path / "tf_model.h5")
    with pytest.raises(UsageError, match=r"tf_model.h5, Keras weights by layer .*, does not fit the model's "
                                         r"architecture \(.*hidden") as err:
        _load(tmp_path / "tf_model.h5", "wbuilders:tfkeras", root / "site", builder_args=["hidden=5"])
    assert "rebuild the model exactly as it was trained" in err.value.remedy
    assert "exportkit-h5-" not in str(err.value)  # the name it was read under is not the user's


def test_a_full_model_h5_given_a_builder_lends_its_weights(files):
    from exportkit.errors import UsageError
    from exportkit.sources.load import detect_format

    root, made = files
    source, builder, expected = made["full model"]
    assert detect_format(str(source)) == "h5"
    loaded = _load(source, builder, root / "site")
    assert loaded.format == "weights"
    np.testing.assert_allclose(np.asarray(loaded.model(X)), expected, rtol=1e-6)
    # a source that brings its own architecture otherwise: refused, never the builder silently ignored
    with pytest.raises(UsageError, match="--builder would be ignored: .*full.keras is a .keras archive") as err:
        _load(root / "full.keras", builder, root / "site")
    assert "drop --builder" in err.value.remedy
    with pytest.raises(UsageError, match="--format h5 loads the architecture"):
        _load(source, builder, root / "site", format="h5")


def test_an_hdf5_file_that_is_neither_says_what_it_is(files, tmp_path):
    root, _ = files
    for name in ("stranger.h5", "model.weights.h5"):
        shutil.copy(root / "stranger.h5", tmp_path / name)
        r = invoke("export", tmp_path / name, "-o", tmp_path / "out", "--builder", "wbuilders:keras3",
                   "--python-path", root / "site")
        assert r.returncode == 2, r.stdout + r.stderr
        assert (f"{tmp_path / name} is an HDF5 file with groups a, b and attributes note: not a Keras model (no "
                f"model_config attribute) nor Keras weights") in r.stderr
        assert "fix: pass a file written by Keras" in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / "out").exists()


def test_an_empty_weights_file_is_a_damaged_copy(files, tmp_path):
    from exportkit.errors import UsageError

    root, _ = files
    (tmp_path / "model.weights.h5").write_bytes(b"")
    with pytest.raises(UsageError, match=r"model.weights.h5 is empty \(0 bytes\)") as err:
        _load(tmp_path / "model.weights.h5", "wbuilders:keras3", root / "site")
    assert "copy the weights file again" in err.value.remedy


def test_a_weights_file_read_as_a_model_names_its_path(files, tmp_path):
    root, made = files
    shutil.copy(made["tf_keras by layer"][0], tmp_path / "tf_model.h5")
    r = invoke("export", tmp_path / "tf_model.h5", "-o", tmp_path / "out", "--format", "h5")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"No model config found in the file at {tmp_path / 'tf_model.h5'}" in r.stderr, r.stderr
    assert "GFile object" not in r.stderr


def test_a_builder_whose_own_dependency_is_missing(files, tmp_path):
    root, made = files
    source = made["Keras 3 .weights.h5"][0]
    r = invoke("export", source, "-o", tmp_path / "out", "--builder", "needs_missing:build", "--python-path",
               root / "site")
    assert r.returncode == 2, r.stdout + r.stderr
    assert (f"builder module 'needs_missing' ({root / 'site' / 'needs_missing.py'}) was found, but importing it "
            f"failed: it imports 'exportkit_no_such_dependency', which is not installed here") in r.stderr, r.stderr
    assert "pip install" in r.stderr and "--python-path DIR for the directory that contains 'exportkit_no_such" \
        in r.stderr
    r = invoke("export", source, "-o", tmp_path / "out", "--builder", "no_such_builder:build")  # the module itself
    assert r.returncode == 2 and "cannot import builder module 'no_such_builder'" in r.stderr, r.stderr
    assert "pass --python-path DIR" in r.stderr
