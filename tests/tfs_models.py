"""Half-plus-two-style models built the way other people write them, for the model-server conformance tests and
tools/run_tfs_suite.py: TF1 graphs through tf.compat.v1 + SavedModelBuilder (placeholders of unknown shape, a
serialized-tf.Example input, classify/regress method names, a counter variable), and a TF2 tf.Module saved with
tf.saved_model.save (every signature's method name is predict there). Written for exportkit, not copied.
"""
from __future__ import annotations

import json
import os


def build_half_plus(version_dir: str, b: float = 2.0, a: float = 0.5) -> str:
    """y = a*x + b as a TF1 graph: `serving_default` (predict, x of unknown shape), `classify_x_to_y` and
    `regress_x_to_y` over serialized Examples with feature x, `regress_x2_to_y3` (x2 -> a*x2 + 3), and
    `get_counter` / `incr_counter` over a counter variable."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        wa = v1.Variable(a, name="a")
        wb = v1.Variable(b, name="b")
        counter = v1.Variable(0.0, name="counter")
        x = v1.placeholder(tf.float32, name="x")  # no shape at all: TensorInfo with unknown_rank
        y = tf.add(wa * x, wb, name="y")
        serialized = v1.placeholder(tf.string, shape=[None], name="tf_example")
        features = v1.parse_example(serialized, {"x": v1.FixedLenFeature([1], tf.float32, default_value=[0.0]),
                                                 "x2": v1.FixedLenFeature([1], tf.float32, default_value=[0.0])})
        y_ex = tf.add(wa * features["x"], wb, name="y_ex")
        y3 = tf.add(wa * features["x2"], 3.0, name="y3")
        incr = tf.identity(counter.assign_add(1.0), name="incr")  # the value after adding one
        sess.run(v1.global_variables_initializer())

        info = v1.saved_model.utils.build_tensor_info
        sig = v1.saved_model.signature_def_utils.build_signature_def
        predict, classify, regress = ("tensorflow/serving/predict", "tensorflow/serving/classify",
                                      "tensorflow/serving/regress")
        signatures = {
            "serving_default": sig({"x": info(x)}, {"y": info(y)}, predict),
            "classify_x_to_y": sig({"inputs": info(serialized)}, {"scores": info(y_ex)}, classify),
            "regress_x_to_y": sig({"inputs": info(serialized)}, {"outputs": info(y_ex)}, regress),
            "regress_x2_to_y3": sig({"inputs": info(serialized)}, {"outputs": info(y3)}, regress),
            "get_counter": sig({}, {"output": info(counter.value())}, predict),
            "incr_counter": sig({}, {"output": info(incr)}, predict),
        }
        builder = v1.saved_model.builder.SavedModelBuilder(version_dir)
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map=signatures)
        builder.save()
    return version_dir


def build_half_plus_two_tf2(version_dir: str) -> str:
    """The same answers from a TF2 tf.Module (tf.saved_model.save: all method names are predict)."""
    import tensorflow as tf

    class HalfPlusTwo(tf.Module):
        def __init__(self):
            super().__init__()
            self.a = tf.Variable(0.5)
            self.b = tf.Variable(2.0)

        @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
        def predict(self, x):
            return {"y": self.a * x + self.b}

        def _from_examples(self, serialized):
            x = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([1], tf.float32)})["x"]
            return self.a * x + self.b

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def classify(self, inputs):
            return {"scores": self._from_examples(inputs)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def regress(self, inputs):
            return {"outputs": self._from_examples(inputs)}

    module = HalfPlusTwo()
    tf.saved_model.save(module, version_dir, signatures={
        "serving_default": module.predict, "classify_x_to_y": module.classify, "regress_x_to_y": module.regress})
    return version_dir


def metadata_json(version_dir: str, model_name: str, version: int) -> dict:
    """What GET /v1/models/NAME/metadata answers, from the SavedModel's own SignatureDefs (as TF Serving's
    half_plus_two_model_metadata.json was made from its model)."""
    from google.protobuf import json_format
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2

    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(version_dir, "saved_model.pb"), "rb") as handle:
        saved.ParseFromString(handle.read())
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    for key, value in saved.meta_graphs[0].signature_def.items():
        signature_map.signature_def[key].CopyFrom(value)
    options = {"preserving_proto_field_name": True, "always_print_fields_with_no_presence": True}
    return {"model_spec": {"name": model_name, "signature_name": "", "version": str(version)},
            "metadata": {"signature_def": json_format.MessageToDict(signature_map, **options)}}


def build_testdata(root: str) -> dict[str, str]:
    """TF Serving's test data layout (servables/tensorflow/testdata) with models of our own; returns the paths."""
    paths = {
        "half_plus_two": os.path.join(root, "saved_model_half_plus_two_cpu"),
        "half_plus_three": os.path.join(root, "saved_model_half_plus_three"),
        "half_plus_two_tf2": os.path.join(root, "saved_model_half_plus_two_tf2_cpu"),
    }
    build_half_plus(os.path.join(paths["half_plus_two"], "00000123"), b=2.0)
    build_half_plus(os.path.join(paths["half_plus_three"], "00000123"), b=3.0)
    build_half_plus_two_tf2(os.path.join(paths["half_plus_two_tf2"], "00000123"))
    files = {
        "good_model_config.txt": 'model_config_list: {\n  config: {\n    name: "half_plus_two",\n'
                                 '    base_path: "${TEST_HALF_PLUS_TWO_DIR}",\n    model_platform: "tensorflow"\n  },\n'
                                 '  config: {\n    name: "half_plus_three",\n    base_path: "${TEST_HALF_PLUS_THREE_DIR}",\n'
                                 '    model_platform: "tensorflow"\n  }\n}\n',
        "bad_model_config.txt": "this is not a text proto\n",
        "monitoring_config.txt": 'prometheus_config: {\n  enable: true,\n  path: "/monitoring/prometheus/metrics"\n}\n',
        "batching_config.txt": "max_batch_size { value: 128 }\nbatch_timeout_micros { value: 0 }\n"
                               "max_enqueued_batches { value: 1000000 }\nnum_batch_threads { value: 8 }\n",
    }
    for name, text in files.items():
        with open(os.path.join(root, name), "w") as handle:
            handle.write(text)
    with open(os.path.join(root, "half_plus_two_model_metadata.json"), "w") as handle:
        json.dump(metadata_json(os.path.join(paths["half_plus_two"], "00000123"), "default", 123), handle, indent=1)
    return paths


def build_production_toy(version_dir: str, b: float = 1.0) -> str:
    """A TF1 graph for the production-behaviour tests (deadlines, swaps, batching), idle while it waits:
    `serving_default`: x [None] -> y = x + b, rows = the batch's row count per row (what batching merged);
    `slow`: x, delay [None] -> y = x + b after sleeping max(delay) seconds (a tf.data SleepDataset: no CPU spent);
    `ragged`: x [None, None] -> y = x, rows (what variable-length padding made of it)."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        wb = v1.Variable(b, name="b")
        x = v1.placeholder(tf.float32, shape=[None], name="x")
        rows = tf.fill(tf.shape(x), tf.cast(tf.shape(x)[0], tf.float32), name="rows")
        delay = v1.placeholder(tf.float32, shape=[None], name="delay")
        micros = tf.cast(tf.reduce_max(delay) * 1e6, tf.int64)
        slept = tf.data.Dataset.range(1).apply(testing.sleep(micros)).get_single_element()
        slow_y = tf.add(x + wb, tf.cast(slept, tf.float32), name="slow_y")
        x2 = v1.placeholder(tf.float32, shape=[None, None], name="x2")
        y2 = tf.identity(x2, name="y2")
        rows2 = tf.fill(tf.shape(x2)[:1], tf.cast(tf.shape(x2)[0], tf.float32), name="rows2")
        sess.run(v1.global_variables_initializer())
        info = v1.saved_model.utils.build_tensor_info
        sig = v1.saved_model.signature_def_utils.build_signature_def
        predict = "tensorflow/serving/predict"
        builder = v1.saved_model.builder.SavedModelBuilder(version_dir)
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "serving_default": sig({"x": info(x)}, {"y": info(tf.add(x, wb, name="y")), "rows": info(rows)}, predict),
            "slow": sig({"x": info(x), "delay": info(delay)}, {"y": info(slow_y)}, predict),
            "ragged": sig({"x": info(x2)}, {"y": info(y2), "rows": info(rows2)}, predict),
        })
        builder.save()
    return version_dir
