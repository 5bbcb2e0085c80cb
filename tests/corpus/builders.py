"""Builders of SavedModels written the way others write them, and the verdict the real `tensorflow_model_server`
gives each one (read from TF Serving's sources; the comments cite the file).

Each builder takes a directory and writes a model *base* directory there (`NAME/<version>/...`), the way TF
Serving is pointed at models. Builders run TensorFlow in graph mode inside their own `tf.Graph()`, so nothing global
changes. `Expected` is the server's verdict: does it load the model, and which API answers each signature.

TF 1.x-era writers (SavedModelBuilder, Estimator export graphs) are emulated with `tf.compat.v1`, as the TF 2.21
wheel has no `tf.estimator`; older TensorFlow versions write their own models in tests marked `compat`
(exportkit/tfversions/envs.py's managed environments) through `write_in_env`.
"""
from __future__ import annotations

import os
import struct
import subprocess
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

PREDICT, CLASSIFY, REGRESS = "Predict", "Classify", "Regress"


@dataclass(frozen=True)
class Expected:
    """What TF Serving does with the model: `serves` (loads it and answers every signature, each through the API in
    `apis`), else `refusal`: words its error and exportkit's message must both carry."""

    serves: bool
    apis: dict[str, str] = field(default_factory=dict)
    refusal: str = ""
    why: str = ""  # where in TF Serving's sources the verdict comes from
    loads: bool | None = None  # it loads and runs, and an API refuses it (None: loads == serves)

    @property
    def loaded(self) -> bool:
        return self.serves if self.loads is None else self.loads


@dataclass(frozen=True)
class CorpusModel:
    name: str
    base: Path  # the model base directory (holding the version directory)
    expected: Expected

    @property
    def version_dir(self) -> Path:
        return next(p for p in sorted(self.base.iterdir()) if p.is_dir())


def _tf():
    from exportkit.tfenv import import_tf

    return import_tf()


def _tensor_info(tensor):
    return _tf().compat.v1.saved_model.utils.build_tensor_info(tensor)


def _signature(inputs: dict, outputs: dict, method: str):
    v1 = _tf().compat.v1
    return v1.saved_model.signature_def_utils.build_signature_def(
        {k: _tensor_info(t) for k, t in inputs.items()}, {k: _tensor_info(t) for k, t in outputs.items()},
        method)


def _save(session, export_dir: Path, signatures: dict, **kwargs) -> None:
    v1 = _tf().compat.v1
    builder = v1.saved_model.builder.SavedModelBuilder(str(export_dir))
    builder.add_meta_graph_and_variables(session, [v1.saved_model.tag_constants.SERVING],
                                         signature_def_map=signatures, **kwargs)
    builder.save()


PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"


# ------------------------------------------------------------------------------------------- TF1 graphs
def half_plus_two(root: Path, name: str = "tf1_half_plus_two") -> CorpusModel:
    """y = 0.5 x + 2 the way TF Serving's testdata/saved_model_half_plus_two.py writes it: serialized tf.Example
    input parsed in the graph, `x` fed in the middle of the graph, classify/regress signatures over Examples, and
    two (`*_x2_to_y3`) whose classify/regress method names sit on a float tensor input."""
    tf = _tf()
    v1 = tf.compat.v1
    base = root / name
    with tf.Graph().as_default(), v1.Session() as sess:
        a = v1.Variable(0.5, name="a")
        b = v1.Variable(2.0, name="b")
        c = v1.Variable(3.0, name="c")
        serialized = v1.placeholder(tf.string, name="tf_example", shape=[None])
        parsed = v1.parse_example(serialized, {"x": v1.FixedLenFeature([1], tf.float32),
                                               "x2": v1.FixedLenFeature([1], tf.float32, default_value=[0.0])})
        x = tf.identity(parsed["x"], name="x")
        y = tf.identity(a * x + b, name="y")
        y2 = tf.identity(a * x + c, name="y2")
        x2 = tf.identity(parsed["x2"], name="x2")
        y3 = tf.identity(a * x2 + c, name="y3")
        sess.run(v1.global_variables_initializer())
        _save(sess, base / "00000123", {
            "serving_default": _signature({"x": x}, {"y": y}, PREDICT_METHOD),
            "regress_x_to_y": _signature({"inputs": serialized}, {"outputs": y}, REGRESS_METHOD),
            "regress_x_to_y2": _signature({"inputs": serialized}, {"outputs": y2}, REGRESS_METHOD),
            "regress_x2_to_y3": _signature({"inputs": x2}, {"outputs": y3}, REGRESS_METHOD),
            "classify_x_to_y": _signature({"inputs": serialized}, {"scores": y}, CLASSIFY_METHOD),
            "classify_x2_to_y3": _signature({"inputs": x2}, {"scores": y3}, CLASSIFY_METHOD),
        })
    return CorpusModel(name, base, Expected(True, {
        "serving_default": PREDICT, "regress_x_to_y": REGRESS, "regress_x_to_y2": REGRESS, "classify_x_to_y": CLASSIFY,
        # Classify/Regress need one DT_STRING input (util.cc: GetExampleTensorName? classifier.cc "Expected
        # input tensor to be string"); predict_util.cc's ValidateSignature accepts any of the three method names.
        "regress_x2_to_y3": PREDICT, "classify_x2_to_y3": PREDICT},
        why="predict_util.cc PreProcessPrediction; classifier.cc/regressor.cc need serialized Examples"))


def counter(root: Path, name: str = "tf1_counter") -> CorpusModel:
    """TF Serving's testdata/export_counter.py: a counter variable, signatures without inputs, scalar outputs, and
    a `delta` placeholder of unknown shape (its TensorInfo has unknown rank)."""
    tf = _tf()
    v1 = tf.compat.v1
    base = root / name
    with tf.Graph().as_default(), v1.Session() as sess:
        value = v1.Variable(0.0, dtype=tf.float32, name="counter", use_resource=False)
        incr = value.assign_add(1.0)
        delta = v1.placeholder(tf.float32, name="delta")
        incr_by = value.assign_add(delta)
        reset = value.assign(0.0)
        sess.run(v1.global_variables_initializer())
        _save(sess, base / "00000123", {
            "get_counter": _signature({}, {"output": value}, PREDICT_METHOD),
            "incr_counter": _signature({}, {"output": incr}, PREDICT_METHOD),
            "incr_counter_by": _signature({"delta": delta}, {"output": incr_by}, PREDICT_METHOD),
            "reset_counter": _signature({}, {"output": reset}, PREDICT_METHOD),
        })
    return CorpusModel(name, base, Expected(True, {k: PREDICT for k in (
        "get_counter", "incr_counter", "incr_counter_by", "reset_counter")},
        why="predict_util.cc: zero inputs pass VerifyRequestInputsSize; state lives in the session"))


def no_shape(root: Path, name: str = "tf1_tensorinfo_without_shape") -> CorpusModel:
    """A signature whose TensorInfos carry a name and a dtype and no shape at all (hand-built SignatureDefs, as
    old exporters wrote them)."""
    tf = _tf()
    v1 = tf.compat.v1
    from tensorflow.core.protobuf import meta_graph_pb2

    base = root / name
    with tf.Graph().as_default(), v1.Session() as sess:
        w = v1.Variable([[1.0], [2.0]], name="w")
        x = v1.placeholder(tf.float32, shape=[None, 2], name="features")
        y = tf.identity(tf.matmul(x, w), name="score")
        sess.run(v1.global_variables_initializer())
        signature = meta_graph_pb2.SignatureDef(method_name=PREDICT_METHOD)
        signature.inputs["features"].CopyFrom(meta_graph_pb2.TensorInfo(name=x.name, dtype=x.dtype.as_datatype_enum))
        signature.outputs["score"].CopyFrom(meta_graph_pb2.TensorInfo(name=y.name, dtype=y.dtype.as_datatype_enum))
        _save(sess, base / "1", {"serving_default": signature})
    return CorpusModel(name, base, Expected(True, {"serving_default": PREDICT},
                                            why="a TensorInfo shape is not checked by Predict"))


def _regress_over_examples(export_dir: Path, prediction) -> None:
    """A TF1 graph with one regress signature over serialized Examples ({"x": float [1]}), the Estimator way;
    `prediction(tf, x)` builds its output."""
    tf = _tf()
    v1 = tf.compat.v1
    with tf.Graph().as_default(), v1.Session() as sess:
        serialized = v1.placeholder(tf.string, name="input_example_tensor", shape=[None])
        x = v1.parse_example(serialized, {"x": v1.FixedLenFeature([1], tf.float32)})["x"]
        y = tf.identity(prediction(tf, x), name="prediction")
        sess.run(v1.global_variables_initializer())
        _save(sess, export_dir, {"serving_default": _signature({"inputs": serialized}, {"outputs": y}, REGRESS_METHOD)})


def regress_unknown_rank(root: Path, name: str = "tf1_regress_unknown_rank") -> CorpusModel:
    """A regress signature whose output has unknown rank in the graph ([batch, 1] when run, as Estimator
    regressors answer)."""

    def prediction(tf, x):
        shape = tf.compat.v1.placeholder_with_default(tf.constant([-1, 1]), shape=[None], name="output_shape")
        return tf.reshape(tf.compat.v1.Variable(3.0, name="w") * x, shape)  # rank unknown to shape inference

    _regress_over_examples(root / name / "1", prediction)
    return CorpusModel(name, root / name, Expected(True, {"serving_default": REGRESS},
                                                   why="regressor.cc checks the run output's dims (1, or 2 with "
                                                       "dim 1)"))


def regress_wide_output(root: Path, name: str = "tf1_regress_two_columns") -> CorpusModel:
    """A regress signature whose output is [batch, 2]: TF Serving loads it and answers Predict, and its Regress
    refuses the output ("Expected output Tensor shape to be either [batch_size] or [batch_size, 1]")."""
    _regress_over_examples(root / name / "1", lambda tf, x: tf.concat([x * 2.0, x * 3.0], axis=1))
    return CorpusModel(name, root / name, Expected(False, refusal="refuses the model's output", loads=True,
                                                   why="regressor.cc: output dims must be 1, or 2 with dim 1"))


def missing_tensor(root: Path, name: str = "tf1_signature_tensor_missing") -> CorpusModel:
    """A SignatureDef naming an output tensor the graph does not have (hand-edited signature)."""
    tf = _tf()
    v1 = tf.compat.v1
    from tensorflow.core.protobuf import meta_graph_pb2

    base = root / name
    with tf.Graph().as_default(), v1.Session() as sess:
        x = v1.placeholder(tf.float32, shape=[None, 1], name="x")
        y = tf.identity(x * 2.0, name="y")
        signature = _signature({"x": x}, {"y": y}, PREDICT_METHOD)
        signature.outputs["y"].name = "renamed_y:0"
        signature.outputs["y"].CopyFrom(meta_graph_pb2.TensorInfo(name="renamed_y:0", dtype=1,
                                                                  tensor_shape=signature.outputs["y"].tensor_shape))
        _save(sess, base / "1", {"serving_default": signature})
    return CorpusModel(name, base, Expected(False, refusal="renamed_y",
                                            why="Session.run on the SignatureDef names fails (no such tensor)"))


def estimator_style(root: Path, name: str = "estimator_linear_classifier") -> CorpusModel:
    """The graph tf.estimator.LinearClassifier's export_saved_model writes (emulated with compat.v1: TF 2.21 has no
    tf.estimator): `input_example_tensor` parsed by ParseExampleV2, a global_step, a sharded Saver, a table-free
    main op, and the head's signatures: serving_default and `classification` (classify over Examples), `predict`
    (predict over Examples, several outputs)."""
    tf = _tf()
    v1 = tf.compat.v1
    base = root / name
    with tf.Graph().as_default(), v1.Session() as sess:
        v1.train.get_or_create_global_step()
        serialized = v1.placeholder(tf.string, shape=[None], name="input_example_tensor")
        features = v1.io.parse_example(serialized, {"age": v1.io.FixedLenFeature([1], tf.float32),
                                                    "hours": v1.io.FixedLenFeature([1], tf.float32, [40.0])})
        with v1.variable_scope("linear/linear_model"):
            weights = v1.get_variable("weights", [2, 1], initializer=v1.constant_initializer([[0.03], [-0.02]]))
            bias = v1.get_variable("bias_weights", [1], initializer=v1.zeros_initializer())
        logits = tf.matmul(tf.concat([features["age"], features["hours"]], axis=1), weights) + bias
        logistic = tf.sigmoid(logits, name="head/predictions/logistic")
        probabilities = tf.concat([1 - logistic, logistic], axis=1, name="head/predictions/probabilities")
        class_ids = tf.expand_dims(tf.argmax(logits > 0, axis=1), -1, name="head/predictions/class_ids")
        classes = tf.tile(tf.constant([[b"0", b"1"]]), [tf.shape(serialized)[0], 1], name="head/Tile")
        sess.run(v1.global_variables_initializer())
        classify = _signature({"inputs": serialized}, {"classes": classes, "scores": probabilities}, CLASSIFY_METHOD)
        _save(sess, base / "1700000000", {
            "serving_default": classify, "classification": classify,
            "predict": _signature({"examples": serialized}, {"logits": logits, "logistic": logistic,
                                                             "probabilities": probabilities,
                                                             "class_ids": class_ids}, PREDICT_METHOD)},
            main_op=v1.tables_initializer(), saver=v1.train.Saver(sharded=True))
    return CorpusModel(name, base, Expected(True, {"serving_default": CLASSIFY, "classification": CLASSIFY,
                                                   "predict": PREDICT}))


def py_func(root: Path, name: str = "tf1_py_func") -> CorpusModel:
    """A tf.compat.v1.py_func in the graph: its Python callback lives only in the process that built it."""
    tf = _tf()
    v1 = tf.compat.v1
    base = root / name
    with tf.Graph().as_default(), v1.Session() as sess:
        x = v1.placeholder(tf.float32, [None, 2], name="x")
        y = v1.py_func(lambda a: a * 2, [x], tf.float32, name="double")
        y.set_shape([None, 2])
        _save(sess, base / "1", {"serving_default": _signature({"x": x}, {"y": tf.identity(y, name="y")},
                                                               PREDICT_METHOD)})
    return CorpusModel(name, base, Expected(False, refusal="runs Python code", loads=True,
                                            why="the server has no PyFunc kernel (it lives in tensorflow/python): "
                                                "every request fails"))


# ------------------------------------------------------------------------------------------- TF2 writers
def tf_module(root: Path, name: str = "tf2_module_half_plus_two") -> CorpusModel:
    """TF Serving's HalfPlusTwoModel (tf.Module + tf.saved_model.save), with a classify and a regress signature on a
    float [1] input."""
    tf = _tf()

    class HalfPlusTwo(tf.Module):
        def __init__(self):
            tf.Module.__init__(self)  # (autograph may convert this class's methods: no zero-argument super())
            self.a, self.b, self.c = tf.Variable(0.5), tf.Variable(2.0), tf.Variable(3.0)

        @tf.function(input_signature=[tf.TensorSpec([1], tf.float32)])
        def predict(self, x):
            return {"y": self.a * x + self.b}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def regress_xy(self, serialized):
            x = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([1], tf.float32)})["x"]
            return {"outputs": self.a * x + self.b}

        @tf.function(input_signature=[tf.TensorSpec([1], tf.float32, name="inputs")])
        def classify_x2y3(self, x2):
            return {"scores": self.a * x2 + self.c}

    module = HalfPlusTwo()
    base = root / name
    tf.saved_model.save(module, str(base / "1"), signatures={
        "serving_default": module.predict, "regress_x_to_y": module.regress_xy,
        "classify_x2_to_y3": module.classify_x2y3})
    return CorpusModel(name, base, Expected(True, {"serving_default": PREDICT, "regress_x_to_y": REGRESS,
                                                   "classify_x2_to_y3": PREDICT}))


def keras_export(root: Path, name: str = "keras_model_export") -> CorpusModel:
    """A small Keras 3 model written by `model.export` (ExportArchive's serve endpoint)."""
    import keras

    inputs = keras.Input((4,), name="features")
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(keras.layers.Dense(8, "relu")(inputs)))
    base = root / name
    model.export(str(base / "1"), verbose=False)
    return CorpusModel(name, base, Expected(True, {"serving_default": PREDICT}))


# ------------------------------------------------------------------------------ what the server refuses
def session_bundle(root: Path, name: str = "session_bundle") -> CorpusModel:
    """The pre-SavedModel export format (`export.meta` + `export-?????-of-?????`), which TF Serving removed."""
    tf = _tf()
    v1 = tf.compat.v1
    version = root / name / "1"
    version.mkdir(parents=True)
    with tf.Graph().as_default(), v1.Session() as sess:
        v1.Variable(1.0, name="w")
        sess.run(v1.global_variables_initializer())
        saver = v1.train.Saver(sharded=True)
        saver.save(sess, str(version / "export"), write_meta_graph=False)
        v1.train.export_meta_graph(str(version / "export.meta"))
    return CorpusModel(name, root / name, Expected(
        False, refusal="Session Bundle is deprecated",
        why="session_bundle_util.cc: \"Session Bundle is deprecated and removed.\""))


def tflite_version(root: Path, name: str = "tflite_only") -> CorpusModel:
    """A version directory holding only `model.tflite` (served only with --prefer_tflite_model)."""
    version = root / name / "1"
    version.mkdir(parents=True)
    # A FlatBuffer header with the TFLite file identifier "TFL3" (the content is never parsed here).
    (version / "model.tflite").write_bytes(struct.pack("<I", 28) + b"TFL3" + bytes(24))
    return CorpusModel(name, root / name, Expected(False, refusal="--prefer_tflite_model",
                                                   why="saved_model_bundle_factory: no saved_model.pb; TFLite "
                                                       "models need --prefer_tflite_model"))


# ----------------------------------------------------------------------------- rewritten checkpoints
def snappy_checkpoint(root: Path, name: str = "tf1_half_plus_two_snappy_index") -> CorpusModel:
    """half_plus_two whose variables.index data and index blocks are snappy-compressed (some TF builds write
    them so; TF Serving's own testdata has such indexes)."""
    model = half_plus_two(root, name)
    index = model.version_dir / "variables" / "variables.index"
    index.write_bytes(snappy_table(index.read_bytes()))
    return CorpusModel(name, model.base, model.expected)


def snappy_table(table: bytes, block_bytes: int = 64) -> bytes:
    """The same LevelDB-style table (tsl/lib/io) rewritten with small snappy-compressed blocks (cramjam's raw
    snappy), so that there are several data blocks and the index block is compressed too."""
    import cramjam

    from exportkit.savedmodel.checkpoint import table_entries

    entries = table_entries(table)
    out = bytearray()

    def block(pairs: list[tuple[bytes, bytes]]) -> bytes:  # restart at every entry: no shared prefixes
        body, restarts = bytearray(), []
        for key, value in pairs:
            restarts.append(len(body))
            body += _varint(0) + _varint(len(key)) + _varint(len(value)) + key + value
        body += b"".join(struct.pack("<I", r) for r in restarts) + struct.pack("<I", len(restarts))
        return bytes(body)

    def write(raw: bytes) -> bytes:
        from exportkit.inputs.tfrecord import crc32c

        offset, data = len(out), bytes(cramjam.snappy.compress_raw(raw))
        out.extend(data + b"\x01" + struct.pack("<I", _mask(crc32c(data + b"\x01"))))
        return _varint(offset) + _varint(len(data))

    index, pending, size = [], [], 0
    for key, value in entries:
        pending.append((key, value))
        size += len(key) + len(value)
        if size >= block_bytes:
            index.append((key, write(block(pending))))
            pending, size = [], 0
    if pending:
        index.append((pending[-1][0], write(block(pending))))
    meta = write(block([]))
    index_handle = write(block(index))
    footer = (meta + index_handle).ljust(40, b"\0") + struct.pack("<Q", 0xDB4775248B80FB57)
    return bytes(out) + footer


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


BUILDERS = (half_plus_two, counter, no_shape, regress_unknown_rank, regress_wide_output, missing_tensor, py_func,
            estimator_style, tf_module, keras_export, session_bundle, tflite_version, snappy_checkpoint)


def build_all(root: Path) -> list[CorpusModel]:
    return [builder(Path(root)) for builder in BUILDERS]


# --------------------------------------------------------------------------- older TensorFlow writers
OLD_TF_WRITER = textwrap.dedent('''
    import sys
    import tensorflow as tf
    v1 = tf.compat.v1
    out = sys.argv[1]

    class HalfPlusTwo(tf.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = tf.Variable(0.5), tf.Variable(2.0)

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def predict(self, x):
            return {"y": self.a * x + self.b}

    module = HalfPlusTwo()
    tf.saved_model.save(module, out + "/tf2_module/1", signatures={"serving_default": module.predict})
    with tf.Graph().as_default(), v1.Session() as sess:
        x = v1.placeholder(tf.float32, [None], name="x")
        w = v1.Variable(0.5, name="w")
        y = tf.identity(w * x + 2.0, name="y")
        sess.run(v1.global_variables_initializer())
        builder = v1.saved_model.builder.SavedModelBuilder(out + "/tf1_graph/1")
        info = v1.saved_model.utils.build_tensor_info
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "serving_default": v1.saved_model.signature_def_utils.build_signature_def(
                {"x": info(x)}, {"y": info(y)}, "tensorflow/serving/predict")})
        builder.save()
''')


def write_in_env(python: str, root: Path) -> list[CorpusModel]:
    """Models written by another TensorFlow (a managed environment's interpreter): a tf.Module and a TF1 graph."""
    script = Path(root) / "write_models.py"
    script.write_text(OLD_TF_WRITER)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    subprocess.run([python, "-I", str(script), str(root)], check=True, capture_output=True, env=env, timeout=300)
    return [CorpusModel(f"old_tf_{n}", Path(root) / n, Expected(True, {"serving_default": PREDICT}))
            for n in ("tf2_module", "tf1_graph")]
