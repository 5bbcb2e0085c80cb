"""SavedModels exportkit did not write: plain `tf.Module`s with and without warm-up records, and models whose
signatures reach I/O ops. Built once per session in this process (TensorFlow is imported once)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


@pytest.fixture(scope="session")
def tf():
    from exportkit.tfenv import import_tf

    return import_tf()


def _save(tf, module, path: Path, fn) -> Path:
    tf.saved_model.save(module, str(path), signatures={"serving_default": fn})
    return path.parent


def _plain_module(tf):
    class Plain(tf.Module):
        """What most third-party models are: variables, a signature, no assets.extra/."""

        def __init__(self):
            super().__init__()
            self.w = tf.Variable([[1.0, -2.0], [0.5, 3.0], [2.0, 0.0]])

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.matmul(x, self.w)}

    return Plain()


def _warmup_logs(tf, kinds: list[str]) -> list[bytes]:
    """PredictionLog records of the given kinds, as TF Serving's own tools write them."""
    from tensorflow_serving.apis import (classification_pb2, inference_pb2, predict_pb2, prediction_log_pb2,
                                         regression_pb2)

    example = tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0, 2.0, 3.0]))}))
    records = []
    for kind in kinds:
        log = prediction_log_pb2.PredictionLog()
        if kind == "predict":
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "whatever"  # TF Serving ignores the name during warm-up
            request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones([2, 3], np.float32)))
            log.predict_log.request.CopyFrom(request)
        elif kind == "classify":
            request = classification_pb2.ClassificationRequest()
            request.input.example_list.examples.add().CopyFrom(example)
            log.classify_log.request.CopyFrom(request)
        elif kind == "regress":
            request = regression_pb2.RegressionRequest()
            request.input.example_list.examples.add().CopyFrom(example)
            log.regress_log.request.CopyFrom(request)
        elif kind == "multi_inference":
            request = inference_pb2.MultiInferenceRequest()
            request.input.example_list.examples.add().CopyFrom(example)
            log.multi_inference_log.request.CopyFrom(request)
        records.append(log.SerializeToString())
    return records


@pytest.fixture(scope="session")
def warmup_logs(tf):
    """warmup_logs([kind, ...]) -> serialized PredictionLog records of those kinds."""
    return lambda kinds: _warmup_logs(tf, kinds)


@pytest.fixture(scope="session")
def third_party(tf, tmp_path_factory) -> dict[str, Path]:
    """Base directories: `plain` (no warm-up file), `mixed_warmup` (a predict record, then multi_inference
    records without tasks, which TF Serving's warm-up refuses)."""
    root = tmp_path_factory.mktemp("third_party")
    out = {}
    module = _plain_module(tf)
    out["plain"] = _save(tf, module, root / "plain" / "1", module.serve)
    module = _plain_module(tf)
    out["mixed_warmup"] = _save(tf, module, root / "mixed_warmup" / "1", module.serve)
    extra = out["mixed_warmup"] / "1" / "assets.extra"
    extra.mkdir()
    with tf.io.TFRecordWriter(str(extra / "tf_serving_warmup_requests")) as writer:
        for record in _warmup_logs(tf, ["predict", "multi_inference", "multi_inference"]):
            writer.write(record)
    return out


@pytest.fixture(scope="session")
def io_models(tf, tmp_path_factory) -> dict[str, tuple[Path, str, Path]]:
    """{name: (base dir, the I/O op the signature reaches, the file it would touch)}; every file lives in a
    directory of its own so tests can assert it was not written (or read)."""
    root = tmp_path_factory.mktemp("io_models")
    files = root / "files"
    files.mkdir()
    secret = files / "secret.txt"
    secret.write_text("the contents verify must not read\n")
    record = files / "data.tfrecord"
    with tf.io.TFRecordWriter(str(record)) as writer:
        writer.write(b"one record")
    written = files / "written.txt"
    saved = files / "saved_ckpt"
    spec = tf.TensorSpec([None, 2], tf.float32, name="x")

    def build(name: str, body) -> Path:
        class M(tf.Module):
            @tf.function(input_signature=[spec])
            def serve(self, x):
                return body(x)

        module = M()
        return _save(tf, module, root / name / "1", module.serve)

    def write_file(x):
        tf.io.write_file(str(written), tf.strings.as_string(tf.reduce_sum(x)))
        return {"y": x * 2.0}

    def write_in_cond(x):  # reached only through If/StatelessIf's then_branch attribute
        def write():
            tf.io.write_file(str(written), tf.strings.as_string(tf.reduce_sum(x)))
            return x * 2.0

        return {"y": tf.cond(tf.reduce_sum(x) > 0, write, lambda: x * 2.0)}

    def read_file(x):
        return {"y": x * 2.0, "leak": tf.io.read_file(str(secret))}

    def print_op(x):
        tf.print("x is", x)
        return {"y": x * 2.0}

    def matching(x):
        return {"y": x * 2.0, "n": tf.size(tf.io.matching_files(str(files / "*")))}

    def tfrecord(x):  # a dataset reader reached through ReduceDataset's function attribute
        count = tf.data.TFRecordDataset(str(record)).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
        return {"y": x * 2.0, "n": count}

    def save_v2(x):  # save-path ops count when a signature reaches them
        tf.raw_ops.SaveV2(prefix=str(saved), tensor_names=["x"], shape_and_slices=[""], tensors=[x])
        return {"y": x * 2.0}

    cases = {"write_file": (write_file, "WriteFile", written), "write_in_cond": (write_in_cond, "WriteFile", written),
             "read_file": (read_file, "ReadFile", secret), "print": (print_op, "PrintV2", None),
             "matching_files": (matching, "MatchingFiles", None),
             "tfrecord_dataset": (tfrecord, "TFRecordDataset", record),
             "save_v2": (save_v2, "SaveV2", saved)}
    return {name: (build(name, body), op, path) for name, (body, op, path) in cases.items()}


NETS = '''
import keras


class TwoHeads(keras.Model):
    """A subclassed network returning a tuple, like many pretrained models on PyPI."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.box = keras.layers.Dense(4)
        self.score = keras.layers.Dense(1)

    def call(self, x):
        return self.box(x), self.score(x)


def build_two_heads():
    model = TwoHeads()
    model(keras.ops.zeros((1, 3)))
    return model
'''


@pytest.fixture(scope="session")
def sources(tf, tmp_path_factory) -> Path:
    """A project folder: nets.py, ckpt/ (a TwoHeads checkpoint) with exportkit.toml, and small.keras."""
    import sys

    import keras

    root = tmp_path_factory.mktemp("sources")
    (root / "nets.py").write_text(NETS)
    sys.path.insert(0, str(root))
    try:
        import nets

        model = nets.build_two_heads()
    finally:
        sys.path.remove(str(root))
    tf.train.Checkpoint(model=model).save(str(root / "ckpt" / "ckpt"))  # ckpt/ckpt-1.*, ckpt/checkpoint
    x = keras.Input((3,), name="x")
    keras.Model(x, keras.layers.Dense(2, name="y")(x)).save(str(root / "small.keras"))
    doubled = keras.layers.Lambda(lambda t: t * 2.0, name="double")(x)  # refused in safe mode
    keras.Model(x, doubled).save(str(root / "lambda.keras"))
    return root
