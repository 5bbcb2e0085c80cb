"""tf.keras 2 (tf_keras) as an export source: every format, custom objects, mixed precision, the Keras choice.

One session fixture builds the files in a subprocess the way a TF 2.x-era team writes them: `tf.keras` code run
under TF_USE_LEGACY_KERAS=1 (so tf.keras is tf_keras), a functional model with a registered custom layer,
mixed_float16 with a float32 head, trained one epoch and saved as .h5, .keras, SavedModel, .weights.h5 and a
checkpoint; a subclassed model with get_config; a hub.KerasLayer over a hub module built locally. The CLI runs
in subprocesses without TF_USE_LEGACY_KERAS (as a new user would): exportkit must choose the Keras itself.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


LAYERS = '''
import tensorflow as tf


@tf.keras.utils.register_keras_serializable(package="my")
class Scale(tf.keras.layers.Layer):
    def __init__(self, factor=2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def build(self, shape):
        self.w = self.add_weight(name="w", shape=(shape[-1],), initializer="ones")

    def call(self, x):
        return x * tf.cast(self.w, x.dtype) * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


def swishish(x):  # a custom activation, not registered
    return x * tf.sigmoid(1.5 * x)


class Tower(tf.keras.Model):  # subclassed, not registered
    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.dense = tf.keras.layers.Dense(units)
        self.head = tf.keras.layers.Dense(1, dtype="float32")

    def call(self, x):
        return self.head(self.dense(x))

    def get_config(self):
        return {"units": self.units, "name": self.name}
'''

BUILDERS = '''
import tensorflow as tf
from my_layers import Scale


def build(hidden=8):
    x = tf.keras.Input((4,), name="x")
    ids = tf.keras.Input((3,), dtype="int32", name="ids")
    e = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(20, 4)(ids))
    h = tf.keras.layers.Concatenate()([Scale(3.0)(tf.keras.layers.Dense(hidden)(x)), e])
    return tf.keras.Model([x, ids], tf.keras.layers.Dense(2, dtype="float32", name="head")(h))
'''

MAKE = '''
import numpy as np
import tensorflow as tf
import tensorflow_hub as hub

assert tf.keras.__name__.startswith("tf_keras"), tf.keras  # TF_USE_LEGACY_KERAS=1: tf.keras is tf_keras
import exportkit
import my_builders
import my_layers

tf.keras.utils.set_random_seed(0)
tf.keras.mixed_precision.set_global_policy("mixed_float16")
model = my_builders.build()
tf.keras.mixed_precision.set_global_policy("float32")
model.compile("adam", "mse")
model.fit([np.random.rand(32, 4).astype("float32"), np.random.randint(0, 20, (32, 3))], np.random.rand(32, 2),
          epochs=1, verbose=0)
model.save("m.h5")
model.save("m.keras")
model.save("m_sm")
model.save_weights("m.weights.h5")
tf.train.Checkpoint(model=model).save("ckpt/ckpt")
exportkit.record_reference(model, "m.h5.reference.npz")  # from the training script, tf_keras model

seq = tf.keras.Sequential([tf.keras.Input((5,), name="feat"), tf.keras.layers.Dense(3, activation=my_layers.swishish)])
seq.save("seq.h5")  # tf_keras 2.21 cannot load this .h5 back (its function config); Keras 3 can

tower = my_layers.Tower()
tower(np.zeros((2, 4), "float32"))
tower.save("tower.keras")

class Module(tf.Module):  # a TF Hub module, built here (no downloads)
    def __init__(self):
        self.w = tf.Variable([[1.0, -1.0], [0.5, 2.0], [0.0, 1.0]])

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def __call__(self, x):
        return tf.matmul(x, self.w)

tf.saved_model.save(Module(), "hub_module")
x = tf.keras.Input((3,), name="features")
hubbed = tf.keras.Model(x, tf.keras.layers.Dense(1, name="score")(hub.KerasLayer("hub_module")(x)))
hubbed.save("hub_model.h5")
tf.saved_model.save(Module(), "plain_sm")  # a SavedModel no Keras wrote
'''


@pytest.fixture(scope="session")
def tfk(tmp_path_factory) -> Path:
    """The tf_keras files, built once in a subprocess under TF_USE_LEGACY_KERAS=1."""
    root = tmp_path_factory.mktemp("tfkeras")
    (root / "my_layers.py").write_text(LAYERS)
    (root / "my_builders.py").write_text(BUILDERS)
    (root / "make.py").write_text(textwrap.dedent(MAKE))
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "PYTHONPATH": f"{root}{os.pathsep}{Path(__file__).parents[1]}"}
    proc = subprocess.run([sys.executable, "make.py"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def cli(root: Path, *args, env=None):
    """The CLI as a user runs it: in the directory of their code, TF_USE_LEGACY_KERAS not set unless given."""
    base = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    full = {**base, **(env or {})}
    return subprocess.run([sys.executable, "-m", "exportkit", *map(str, args)], cwd=root, env=full,
                          capture_output=True, text=True, timeout=600)


def _manifest(version_dir: Path) -> dict:
    return json.loads((version_dir / "assets.extra" / "exportkit" / "manifest.json").read_text())


# ---- which Keras: read from the source, without TensorFlow ------------------------------------------------

@pytest.mark.slow  # the tfk fixture builds its files in a subprocess
def test_which_keras_reads_every_format_without_tensorflow(tfk):
    code = textwrap.dedent(f'''
        import sys
        from exportkit.sources.kerases import which_keras
        got = {{f: str(which_keras({str(tfk)!r} + "/" + p, f)) for f, p in [("h5", "m.h5"), ("keras", "m.keras"),
               ("saved_model", "m_sm"), ("checkpoint", "ckpt"), ("weights", "m.weights.h5")]}}
        print(got, "tensorflow" in sys.modules)
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("False")  # TensorFlow was not imported
    assert out.stdout.count("tf.keras 2 (tf_keras)") == 5, out.stdout


@pytest.mark.slow  # the tfk fixture builds its files in a subprocess
def test_keras_choice_flag_and_toml_override(tfk, tmp_path):
    from exportkit.errors import UsageError
    from exportkit.sources.kerases import KERAS3, TF_KERAS, chosen_keras
    from exportkit.options.source import source_options

    assert chosen_keras(source_options(str(tfk / "m.h5")), "h5") is TF_KERAS
    assert chosen_keras(source_options(str(tfk / "m.h5"), keras="3"), "h5") is KERAS3
    (tmp_path / "exportkit.toml").write_text('keras = "2"\n')
    (tmp_path / "w.weights.h5").write_bytes((tfk / "m.weights.h5").read_bytes())
    assert chosen_keras(source_options(str(tmp_path / "w.weights.h5")), "weights") is TF_KERAS
    with pytest.raises(UsageError, match="not 2 or 3"):
        chosen_keras(source_options(str(tfk / "m.h5"), keras="4"), "h5")


def test_dtype_policy_context_restores_both_kerases():
    import keras
    import tf_keras

    from exportkit.sources.kerases import KERAS3, TF_KERAS

    with TF_KERAS.dtype_policy("mixed_float16"), KERAS3.dtype_policy("mixed_bfloat16"):
        assert tf_keras.mixed_precision.global_policy().name == "mixed_float16"
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
    assert tf_keras.mixed_precision.global_policy().name == "float32"
    assert keras.config.dtype_policy().name == "float32"


# ---- messages ----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_missing_custom_layer_names_the_keras_and_the_fix_works(tfk, tmp_path):
    missing = cli(tfk, "export", "m.keras", "-o", tmp_path / "a")
    assert missing.returncode == 2
    assert "Unknown layer 'Scale'" in missing.stderr and "tf.keras 2 (tf_keras)" in missing.stderr
    assert "fix: pass --custom-objects my_layers" in missing.stderr
    # the fix line's flag works (it failed before: "defines or registers no Keras layers")
    fixed = cli(tfk, "export", "m.keras", "-o", tmp_path / "a", "--custom-objects", "my_layers", "--python-path", ".")
    assert fixed.returncode == 0, fixed.stderr
    manifest = _manifest(tmp_path / "a" / "1")
    assert manifest["keras_version"].startswith("2.") and manifest["dtype_policy"] == "mixed_float16"
    assert manifest["signature"]["outputs"]["head"]["dtype"] == "float32"
    assert set(manifest["signature"]["inputs"]) == {"x", "ids"}
    assert manifest["golden"]["int_ranges"] == {"ids": "0:20"}  # derived from the tf_keras Embedding
    assert (tmp_path / "a" / "1" / "assets.extra" / "tf_serving_warmup_requests").is_file()


@pytest.mark.slow
def test_users_own_legacy_keras_setting_is_honoured(tfk, tmp_path):
    """TF_USE_LEGACY_KERAS=0 makes the user's tf.keras layer a Keras 3 one: a tf.keras 2 .h5 is then loaded into
    Keras 3 (converted), a .keras archive cannot be, and the message says why and what to set."""
    env = {"TF_USE_LEGACY_KERAS": "0"}
    keras3 = cli(tfk, "export", "m.h5", "-o", tmp_path / "b", "--custom-objects", "my_layers", "--python-path", ".",
                 "--no-verify", env=env)
    assert keras3.returncode == 0, keras3.stderr
    assert _manifest(tmp_path / "b" / "1")["keras_version"].startswith("3.")
    proc = cli(tfk, "export", "m.keras", "-o", tmp_path / "c", "--custom-objects", "my_layers", "--python-path", ".",
               env=env)
    assert proc.returncode == 2
    assert "Keras 3 classes" in proc.stderr and "fix: your environment sets TF_USE_LEGACY_KERAS=0" in proc.stderr
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())


@pytest.mark.slow  # the tfk fixture builds its files in a subprocess
def test_hub_layer_missing_names_tensorflow_hub(tfk):
    from exportkit.errors import UsageError
    from exportkit.sources.load import load_source
    from exportkit.options.source import source_options

    with pytest.raises(UsageError, match="Unknown layer 'KerasLayer'") as err:
        load_source(source_options(str(tfk / "hub_model.h5")))
    assert "--custom-objects tensorflow_hub" in err.value.remedy


@pytest.mark.slow  # the tfk fixture builds its files in a subprocess
def test_plain_savedmodel_is_still_refused(tfk):
    from exportkit.errors import UsageError
    from exportkit.sources.load import detect_format

    assert detect_format(str(tfk / "m_sm")) == "saved_model"
    with pytest.raises(UsageError, match="already a SavedModel"):
        detect_format(str(tfk / "plain_sm"))


@pytest.mark.slow  # the tfk fixture builds its files in a subprocess
def test_custom_objects_finds_tf_keras_classes_and_hub(tfk):
    from exportkit.sources.kerases import KERAS3, TF_KERAS, keras_of
    from exportkit.sources.load import import_custom_objects, python_path

    with python_path([str(tfk)]):
        found = import_custom_objects(["my_layers", "tensorflow_hub"])
    assert {"Scale", "my>Scale", "Tower", "KerasLayer"} <= set(found)
    assert keras_of(found["KerasLayer"]) is TF_KERAS  # hub 0.16 builds on tf_keras
    # tf.keras is Keras 3 in this (pytest) process, so the user's tf.keras layer is a Keras 3 class here
    assert keras_of(found["Scale"]) is KERAS3


# ---- every format exports and verifies ----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("src, flags", [
    ("m.h5", ["--custom-objects", "my_layers"]),
    ("m_sm", ["--custom-objects", "my_layers"]),
    ("ckpt", ["--builder", "my_builders:build", "--policy", "mixed_float16"]),
    ("m.weights.h5", ["--builder", "my_builders:build", "--policy", "mixed_float16"]),
    ("tower.keras", ["--custom-objects", "my_layers"]),
    ("hub_model.h5", ["--custom-objects", "tensorflow_hub"]),
])
def test_export_and_verify_against_source(tfk, tmp_path, src, flags):
    out = tmp_path / "out"
    proc = cli(tfk, "export", src, "-o", out, "--python-path", ".", *flags)
    assert proc.returncode == 0, proc.stderr
    manifest = _manifest(out / "1")
    assert manifest["keras_version"].startswith("2.")
    if src.startswith("m"):
        assert manifest["dtype_policy"] == "mixed_float16"
        assert manifest["signature"]["outputs"]["head"]["dtype"] == "float32"
    if src == "m.h5":  # the training-time reference recorded from the tf_keras script
        assert manifest["reference"]["links"] == {"trained -> reloaded": "passed", "reloaded -> SavedModel": "passed"}
    if src in ("m.h5", "ckpt"):  # eager tf_keras from the source is the reference runtime
        verify = cli(tfk, "verify", out, "--against", src, "--python-path", ".", *flags, "--serving", "none",
                     "--json", "-")
        assert verify.returncode == 0, verify.stderr
        assert "keras" in {r["name"] for r in json.loads(verify.stdout)["runtimes"]}


@pytest.mark.slow
def test_inspect_source_of_a_tf_keras_file(tfk):
    proc = cli(tfk, "inspect", "m.keras", "--custom-objects", "my_layers", "--python-path", ".", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["policy"] == "mixed_float16" and [i["key"] for i in info["inputs"]] == ["x", "ids"]
    assert info["custom_objects_needed"] == [{"name": "Scale", "module": "my_layers"}]
    assert not [f for f in info["findings"] if f["severity"] == "error"]


def test_contracts_model_io_and_int_ranges_on_a_tf_keras_model():
    """In this process (tf.keras is Keras 3), a model built with `import tf_keras` goes through the same checks."""
    import numpy as np
    import tf_keras

    from exportkit.inputs.ranges import IntRangeFlags
    from exportkit.sources.contracts import check_contracts
    from exportkit.sources.int_ranges import int_ranges_for
    from exportkit.sources.kerases import TF_KERAS, keras_of
    from exportkit.sources.model_io import keyed_outputs, feed_model, model_input_specs
    from exportkit.compare.outputs import compare_with_default_tolerances

    class Forgetful(tf_keras.layers.Layer):
        def __init__(self, scale=1.0, **kwargs):
            super().__init__(**kwargs)
            self.scale = scale

        def call(self, x):
            return x * self.scale

        def get_config(self):
            return super().get_config()  # forgets `scale`

    x = tf_keras.Input((3,), name="x")
    ids = tf_keras.Input((2,), dtype="int32", name="ids")
    emb = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(7, 3)(ids))
    model = tf_keras.Model([x, ids], {"y": tf_keras.layers.Concatenate()([Forgetful(2.0)(x), emb])})
    assert keras_of(model) is TF_KERAS
    specs = model_input_specs(model, [])
    assert [(s.key, s.dtype, s.shape) for s in specs] == [("x", "float32", [-1, 3]), ("ids", "int32", [-1, 2])]
    assert int_ranges_for(model, specs, IntRangeFlags()).by_input == {"ids": (0, 7)}
    batch = {"x": np.ones((2, 3), np.float32), "ids": np.zeros((2, 2), np.int32)}
    assert list(keyed_outputs(model, feed_model(model, batch))) == ["y"]
    findings = check_contracts(model, [batch], {"Forgetful": Forgetful}, compare=compare_with_default_tolerances)
    incomplete = [f for f in findings if f.code == "custom-config-incomplete"]
    assert incomplete and "although this instance has scale=2.0" in incomplete[0].message


@pytest.mark.slow  # the tfk fixture builds its files in a subprocess
def test_tf_keras_h5_that_tf_keras_cannot_read_loads_into_keras3(tfk):
    from exportkit.errors import UsageError
    from exportkit.sources.kerases import KERAS3
    from exportkit.sources.load import load_source
    from exportkit.options.source import source_options

    with pytest.raises(UsageError, match="Unknown layer 'swishish'") as err:
        load_source(source_options(str(tfk / "seq.h5")))
    assert "builtins" not in err.value.remedy  # the function's stored module says nothing
    loaded = load_source(source_options(str(tfk / "seq.h5"), custom_objects=["my_layers"], python_path=[str(tfk)]))
    assert loaded.keras is KERAS3 and loaded.model.layers[-1].activation.__name__ == "swishish"
