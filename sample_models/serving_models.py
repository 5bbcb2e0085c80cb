"""SavedModels that exercise TF Serving beyond Keras Predict, written the way other tools write them.

- `estimator_style`: what `tf.estimator.DNNClassifier.export_saved_model` wrote (tf.estimator is gone from
  TF >= 2.16): a TF1 graph over serialized tf.Example (ParseExample, a vocabulary table), with `classification`,
  `regression` and `predict` SignatureDefs (`serving_default` is the classification one, as Estimators did).
- `tfx_style`: what a TFX Trainer exports: a TF2 `tf.function` over serialized tf.Example (ParseExampleV2 inside
  the function library) feeding a Keras model, as the `serving_default` predict signature.
- `rest_types`: predict outputs of every JSON-sensitive dtype (string, float64, int64, bool).
- `batch_dependent`: rows normalised with statistics of the whole batch (a training-mode BatchNorm).
- `random_model`: adds noise on every call (a sampling model).

Each builder writes BASE/1 and returns BASE. TensorFlow is imported inside the builders.
"""
from __future__ import annotations

import os

VOCAB = ["red", "green", "blue"]


def estimator_style(out_dir, name: str = "estimator") -> str:
    import tensorflow as tf

    v1 = tf.compat.v1
    base = os.path.join(str(out_dir), name)
    graph = tf.Graph()
    with graph.as_default():
        serialized = v1.placeholder(tf.string, shape=[None], name="input_example_tensor")
        features = v1.io.parse_example(serialized, {
            "x": v1.io.FixedLenFeature([2], tf.float32),
            "color": v1.io.FixedLenFeature([], tf.string, default_value="red"),
            "age": v1.io.FixedLenFeature([], tf.int64, default_value=30),
            "tags": v1.io.VarLenFeature(tf.string),
        })
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(VOCAB), tf.constant([0, 1, 2], tf.int64)), -1)
        color = tf.one_hot(table.lookup(features["color"]), len(VOCAB))
        n_tags = tf.cast(tf.sparse.reduce_sum(tf.sparse.map_values(tf.strings.length, features["tags"]), axis=1),
                         tf.float32)
        dense = tf.concat([features["x"], color, tf.cast(features["age"], tf.float32)[:, None] / 100.0,
                           n_tags[:, None] / 10.0], axis=1)
        w = v1.get_variable("dnn/w", initializer=tf.constant([[0.5, -0.3, 0.2], [0.1, 0.4, -0.2], [0.3, 0.1, 0.0],
                                                              [-0.2, 0.5, 0.1], [0.05, -0.1, 0.3], [0.2, 0.2, -0.4],
                                                              [0.1, -0.3, 0.25]]))
        b = v1.get_variable("dnn/b", initializer=tf.constant([0.1, -0.1, 0.05]))
        logits = tf.matmul(dense, w) + b
        probabilities = tf.nn.softmax(logits)
        n = tf.shape(logits)[0]
        classes = tf.tile(tf.constant([["0", "1", "2"]]), [n, 1])
        class_ids = tf.argmax(logits, axis=1)
        value = tf.reduce_sum(logits, axis=1, keepdims=True)
        sm = v1.saved_model
        classify = sm.classification_signature_def(serialized, classes, probabilities)
        regress = sm.regression_signature_def(serialized, value)
        predict = sm.predict_signature_def({"examples": serialized},
                                           {"probabilities": probabilities, "class_ids": class_ids, "logits": logits})
        with v1.Session(graph=graph) as session:
            session.run([v1.global_variables_initializer(), v1.tables_initializer()])
            builder = sm.Builder(os.path.join(base, "1"))
            builder.add_meta_graph_and_variables(
                session, [sm.tag_constants.SERVING],
                signature_def_map={"serving_default": classify, "classification": classify,
                                   "regression": regress, "predict": predict},
                main_op=v1.tables_initializer(), strip_default_attrs=True)
            builder.save()
    return base


def tfx_style(out_dir, name: str = "tfx") -> str:
    import keras
    import tensorflow as tf

    base = os.path.join(str(out_dir), name)
    keras.utils.set_random_seed(3)
    inputs = {"trip_miles": keras.Input((1,), name="trip_miles"), "hour": keras.Input((1,), name="hour"),
              "company": keras.Input((1,), name="company", dtype="int64")}
    merged = keras.layers.Concatenate()([inputs["trip_miles"], inputs["hour"],
                                         keras.ops.cast(inputs["company"], "float32")])
    outputs = keras.layers.Dense(1, activation="sigmoid", name="tip")(keras.layers.Dense(4, activation="relu")(merged))
    model = keras.Model(inputs, outputs)
    spec = {"trip_miles": tf.io.FixedLenFeature([1], tf.float32),
            "hour": tf.io.FixedLenFeature([1], tf.float32, default_value=[12.0]),
            "company": tf.io.FixedLenFeature([1], tf.string, default_value=["other"])}
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.constant(["flash", "taxi_affiliation", "other"]), tf.constant([0, 1, 2], tf.int64)), 2)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(examples):
        parsed = tf.io.parse_example(examples, spec)
        parsed["company"] = table.lookup(parsed["company"])
        return {"tip": model(parsed)}

    # ExportArchive tracks the variables the endpoint uses (tf.saved_model.save of a Keras 3 model does not, and
    # the TF1 loader that TF Serving uses then fails).
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(table)
    archive.add_endpoint("serving_default", serve)
    archive.write_out(os.path.join(base, "1"), verbose=False)
    return base


def _save_fn(base: str, fn, input_signature, keep=None) -> str:
    import tensorflow as tf

    module = tf.Module()
    module.fn = tf.function(fn, input_signature=input_signature)
    if keep:
        module.keep = keep
    tf.saved_model.save(module, os.path.join(base, "1"), signatures={"serving_default": module.fn})
    return base


def rest_types(out_dir, name: str = "rest_types") -> str:
    import tensorflow as tf

    def fn(x, word):
        return {"score": tf.reduce_sum(x, axis=1) / 3.0,
                "big": tf.cast(x[:, 0] * 1e6, tf.int64) + tf.constant(2 ** 60, tf.int64),
                "positive": x[:, 0] > 0,
                "echo": tf.strings.join([word, "!"]),
                "raw_bytes": tf.strings.join([word, tf.constant(b"\xff")]),
                "raw": tf.strings.join([word, tf.constant(b"\xfe")])}

    return _save_fn(os.path.join(str(out_dir), name), fn, [tf.TensorSpec([None, 3], tf.float64, name="x"),
                                                          tf.TensorSpec([None], tf.string, name="word")])


def batch_dependent(out_dir, name: str = "batch_dependent") -> str:
    import tensorflow as tf

    def fn(x):
        mean, variance = tf.nn.moments(x, axes=[0])
        return {"normalised": (x - mean) / tf.sqrt(variance + 1e-3), "doubled": 2.0 * x}

    return _save_fn(os.path.join(str(out_dir), name), fn, [tf.TensorSpec([None, 4], tf.float32, name="x")])


def random_model(out_dir, name: str = "random") -> str:
    import tensorflow as tf

    def fn(x):
        return {"sample": x + tf.random.normal(tf.shape(x)), "mean": x}

    return _save_fn(os.path.join(str(out_dir), name), fn, [tf.TensorSpec([None, 4], tf.float32, name="x")])


def numeric_strings(out_dir, name: str = "numeric_strings") -> str:
    """Strings that must hold numbers: random strings are invalid inputs for it (not a broken model)."""
    import tensorflow as tf

    def fn(text):
        return {"value": tf.strings.to_number(text) * 2.0}

    return _save_fn(os.path.join(str(out_dir), name), fn, [tf.TensorSpec([None], tf.string, name="text")])
