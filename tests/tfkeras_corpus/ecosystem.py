"""SavedModels written the way TensorFlow's ecosystem libraries write them, for TF Serving:

    python ecosystem.py OUT       (TF_USE_LEGACY_KERAS=1: TF Recommenders refuses Keras 3)

- `tfx_trainer`: a TFX Trainer `run_fn` export. tf.Transform's output (a transform_fn SavedModel with its vocabulary
  asset, a tf.lookup table and z-score constants) is built by hand the way tft writes it (tensorflow-transform
  does not install next to TF 2.21 without downgrading tensorflow-serving-api), loaded back as TFX's
  TransformFeaturesLayer loads it, and the tf_keras model is saved with a `serving_default` over serialized
  tf.Example, as TFX's taxi/penguin templates write it.
- `tfrs_bruteforce`: a TF Recommenders BruteForce index over a query tower, `tf.saved_model.save(index, path)` as
  the retrieval tutorial does.
- `ydf_gbt`: a YDF gradient-boosted trees model, `to_tensorflow_saved_model(mode="tf")`.
- `hub_keras`: a tf_keras model holding a hub.KerasLayer (over a TF2 hub module built here), `model.save(dir)`.

Each goes to OUT/NAME/<version>/, the layout TF Serving is pointed at.
"""
import shutil
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
import tensorflow_hub as hub
import tensorflow_recommenders as tfrs

keras = tf.keras
assert keras.__name__.startswith("tf_keras"), "run with TF_USE_LEGACY_KERAS=1"
OUT = Path(sys.argv[1])
rng = np.random.default_rng(3)
COLOURS = ["red", "green", "blue", "cyan", "amber"]


# ------------------------------------------------------------------------------------------------ TFX
class TransformFn(tf.Module):
    """What tft.TFTransformOutput's transform_fn computes for a preprocessing_fn of
    `tft.compute_and_apply_vocabulary(colour)` and `tft.scale_to_z_score(size)`: the analyzers' results are an
    asset (the vocabulary file) and constants."""

    def __init__(self, vocabulary_file: str, mean: float, var: float):
        super().__init__()
        self.vocabulary = tf.saved_model.Asset(vocabulary_file)
        self.table = tf.lookup.StaticVocabularyTable(
            tf.lookup.TextFileInitializer(self.vocabulary, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                                          tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER), num_oov_buckets=1)
        self.mean, self.std = tf.constant(mean), tf.constant(np.sqrt(var).astype("float32"))

    @tf.function(input_signature=[{"colour": tf.TensorSpec([None, 1], tf.string),
                                   "size": tf.TensorSpec([None, 1], tf.float32)}])
    def __call__(self, features):
        return {"colour_xf": self.table.lookup(features["colour"]),
                "size_xf": (features["size"] - self.mean) / self.std}


class TransformFeaturesLayer(keras.layers.Layer):
    """tft.TFTransformOutput.transform_features_layer(): a tf_keras layer over the loaded transform_fn."""

    def __init__(self, transform_fn_dir: str, **kwargs):
        super().__init__(trainable=False, **kwargs)
        self.transform_fn = tf.saved_model.load(transform_fn_dir)

    def call(self, features):
        return self.transform_fn(features)


def tfx_trainer(out: Path) -> None:
    transform_dir = out / "_transform_output"
    (transform_dir / "vocab").mkdir(parents=True)
    vocabulary_file = transform_dir / "vocab" / "vocab_compute_and_apply_vocabulary_vocabulary"
    vocabulary_file.write_text("\n".join(COLOURS) + "\n")
    sizes = rng.normal(10.0, 3.0, 200).astype("float32")
    tf.saved_model.save(TransformFn(str(vocabulary_file), float(sizes.mean()), float(sizes.var())),
                        str(transform_dir / "transform_fn"))
    tft_layer = TransformFeaturesLayer(str(transform_dir / "transform_fn"))

    colour_xf = keras.Input((1,), dtype=tf.int64, name="colour_xf")
    size_xf = keras.Input((1,), name="size_xf")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(len(COLOURS) + 1, 3)(colour_xf))
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.concatenate([embedded, size_xf]))
    model = keras.Model({"colour_xf": colour_xf, "size_xf": size_xf},
                        keras.layers.Dense(1, activation="sigmoid", name="big")(hidden))
    model.compile(optimizer="adam", loss="binary_crossentropy")
    raw = {"colour": np.array(COLOURS)[rng.integers(0, 5, 200)][:, None], "size": sizes[:, None]}
    model.fit(tft_layer(raw), (sizes > 10).astype("float32"), epochs=1, verbose=0)

    model.tft_layer = tft_layer  # TFX's run_fn keeps the layer on the model so that its assets are saved

    @tf.function(input_signature=[tf.TensorSpec(shape=[None], dtype=tf.string, name="examples")])
    def serve_tf_examples_fn(serialized_tf_examples):
        feature_spec = {"colour": tf.io.FixedLenFeature([1], tf.string),
                        "size": tf.io.FixedLenFeature([1], tf.float32)}  # raw_feature_spec() without the label
        parsed_features = tf.io.parse_example(serialized_tf_examples, feature_spec)
        return {"outputs": model(model.tft_layer(parsed_features))}

    model.save(str(out / "tfx_trainer" / "1700000000"), save_format="tf",
               signatures={"serving_default": serve_tf_examples_fn.get_concrete_function()})


# ------------------------------------------------------------------------------------------ Recommenders
def tfrs_bruteforce(out: Path) -> None:
    users = [str(i) for i in range(20)]
    items = np.array([f"item{i}" for i in range(30)])
    query_model = keras.Sequential([keras.layers.StringLookup(vocabulary=users),
                                    keras.layers.Embedding(len(users) + 1, 8)])
    candidate_model = keras.Sequential([keras.layers.StringLookup(vocabulary=list(items)),
                                        keras.layers.Embedding(len(items) + 1, 8)])
    index = tfrs.layers.factorized_top_k.BruteForce(query_model, k=5)
    candidates = tf.data.Dataset.from_tensor_slices(items).batch(10)
    index.index_from_dataset(tf.data.Dataset.zip((candidates, candidates.map(candidate_model))))
    index(tf.constant(["3"]))
    tf.saved_model.save(index, str(out / "tfrs_bruteforce" / "1"))


# ------------------------------------------------------------------------------------------------- YDF
def ydf_gbt(out: Path) -> None:
    import ydf

    x = rng.normal(size=(300, 2)).astype("float32")
    colour = np.array(COLOURS)[rng.integers(0, 5, 300)]
    data = {"a": x[:, 0], "b": x[:, 1], "colour": colour, "label": ((x[:, 0] > 0) ^ (colour == "red")).astype(int)}
    model = ydf.GradientBoostedTreesLearner(label="label", num_trees=8, max_depth=3).train(data, verbose=0)
    model.to_tensorflow_saved_model(str(out / "ydf_gbt" / "1"), mode="tf")


# ------------------------------------------------------------------------------------------------- Hub
class Encoder(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(rng.normal(size=(6, 4)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32)])
    def __call__(self, x):
        return tf.nn.relu(tf.matmul(x, self.w))


def hub_keras(out: Path) -> None:
    tf.saved_model.save(Encoder(), str(out / "_hub_modules" / "encoder"))
    model = keras.Sequential([keras.Input((6,), name="features"),
                              hub.KerasLayer(str(out / "_hub_modules" / "encoder"), name="encoder"),
                              keras.layers.Dense(2, activation="softmax", name="probs")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(rng.normal(size=(32, 6)), rng.integers(0, 2, 32), epochs=1, verbose=0)
    model.save(str(out / "hub_keras" / "1"))


WRITERS = {"tfx_trainer": tfx_trainer, "tfrs_bruteforce": tfrs_bruteforce, "ydf_gbt": ydf_gbt,
           "hub_keras": hub_keras}

if __name__ == "__main__":
    for name in sys.argv[2:] or WRITERS:
        WRITERS[name](OUT)
    for scratch in OUT.glob("_*"):  # what the exports were built from: TF Serving sees only the version dirs
        shutil.rmtree(scratch)
