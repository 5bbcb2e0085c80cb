"""`exportkit diff` gates measure what they name (issue 50): a TFX-style classifier (a tf.Module whose predict
signature parses serialized tf.Examples and answers `scores`, [batch, 10] floats) gets its top-1 whatever the output
is called; every gate fails beyond its limit and passes within it; a gate with nothing to measure is exit 2."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import invoke
from exportkit.runtimes.wrappers import top1_of, top1_sources

CLASSES, FEATURES, PER_CLASS = 10, 8, 20
MOVED = np.roll(np.arange(CLASSES), 1)  # NEW's class c scores where OLD's c - 1 did: every top-1 changes


def _signature(method: str = "tensorflow/serving/predict", **outputs) -> dict:
    return {"method": method, "inputs": {"examples": {"dtype": "string", "shape": [-1]}},
            "outputs": {k: {"dtype": d, "shape": s} for k, (d, s) in outputs.items()}}


def test_every_float_output_of_k_classes_gets_its_top1_whatever_it_is_called():
    assert top1_sources(_signature(scores=("float32", [-1, 10]))) == {"scores/top1": ("scores", None)}
    assert top1_sources(_signature(logits=("float32", [-1, -1]), value=("float32", [-1, 1]))) == {
        "logits/top1": ("logits", None)}
    # a Classify-style pair: the top-1 of scores is the classes entry at the highest score, with either method
    pair = {"scores": ("float32", [-1, 3]), "classes": ("string", [-1, 3])}
    for method in ("tensorflow/serving/predict", "tensorflow/serving/classify"):
        assert top1_sources(_signature(method, **pair)) == {"scores/top1": ("scores", "classes")}
    answers = {"scores": np.array([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]], np.float32),
               "classes": np.array([[b"a", b"b", b"c"]] * 2, dtype=object)}
    assert list(top1_of(answers, {"scores/top1": ("scores", "classes")})["scores/top1"]) == [b"b", b"a"]
    # k unknown in the signature: decided on the answers; one column has no top-1 to speak of
    derived = top1_sources(_signature(logits=("float32", [-1, -1])))
    assert list(top1_of({"logits": np.array([[0.0, 2.0]], np.float32)}, derived)["logits/top1"]) == [1]
    assert top1_of({"logits": np.array([[2.0]], np.float32)}, derived) == {}
    binary = top1_sources(_signature("tensorflow/serving/classify", scores=("float32", [-1, 1])))
    assert top1_of({"scores": np.array([[0.3]], np.float32)}, binary) == {}


def _example(x: np.ndarray, label: int) -> bytes:
    from tensorflow.core.example import example_pb2

    e = example_pb2.Example()
    e.features.feature["x"].float_list.value.extend(x.tolist())
    e.features.feature["label"].int64_list.value.append(label)
    return e.SerializeToString()


def _save(path: str, w: np.ndarray) -> None:
    """A tf.Module as TFX-style trainers write one: the predict signature over serialized tf.Example answers
    `scores` alone; `probability` answers one value per record, `label` a string."""
    import tensorflow as tf

    class Classifier(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(w)

        def _x(self, examples):
            return tf.io.parse_example(examples, {"x": tf.io.FixedLenFeature([FEATURES], tf.float32)})["x"]

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def predict(self, examples):
            return {"scores": tf.nn.softmax(tf.matmul(self._x(examples), self.w))}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def probability(self, examples):
            return {"probability": tf.sigmoid(tf.reduce_sum(self._x(examples), axis=1, keepdims=True))}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def label(self, examples):
            best = tf.argmax(tf.matmul(self._x(examples), self.w), axis=1)
            return {"label": tf.strings.as_string(best)}

    m = Classifier()
    tf.saved_model.save(m, path, signatures={"serving_default": m.predict, "probability": m.probability,
                                             "label": m.label})


@pytest.fixture(scope="module")
def tfx_versions(tmp_path_factory):
    """Versions 1 and 2 of the classifier (2 moves every class by one) and logged Predict requests: one
    PredictionLog per record, its tf.Example carrying the true class (= version 1's top-1) as `label`."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    base = tmp_path_factory.mktemp("diff_gates")
    w_old = np.eye(FEATURES, CLASSES, dtype=np.float32)
    _save(str(base / "clf" / "1"), w_old)
    _save(str(base / "clf" / "2"), w_old[:, MOVED])
    rng = np.random.default_rng(0)
    logs = base / "predict_logs.tfrecord"
    with tf.io.TFRecordWriter(str(logs)) as writer:
        for cls in range(FEATURES):  # classes 8 and 9 score 0 in version 1: no record is theirs
            for _ in range(PER_CLASS):
                x = rng.uniform(0, 1, FEATURES).astype(np.float32)
                x[cls] += 2.0
                request = predict_pb2.PredictRequest()
                request.model_spec.name, request.model_spec.signature_name = "clf", "serving_default"
                request.inputs["examples"].CopyFrom(tf.make_tensor_proto([_example(x, cls)]))
                writer.write(prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(
                    request=request)).SerializeToString())
    return {"old": base / "clf" / "1", "new": base / "clf" / "2", "logs": logs}


def _diff(versions, *gates, tmp_path=None):
    out = tmp_path / "diff.json"
    proc = invoke("diff", versions["old"], versions["new"], "--data", versions["logs"], *gates, "--json", out)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.slow
def test_every_gate_fails_beyond_its_limit(tfx_versions, tmp_path):
    proc, report = _diff(tfx_versions, "--max-changed-top1", "1%", "--max-abs-change", "p99=0.001",
                         "--label", "label", "--min-metric-delta", "0", tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    by_name = {g["name"].split(" ")[0]: g for g in report["gates"]}
    assert set(by_name) == {"max-changed-top1", "max-abs-change", "min-metric-delta"}
    assert not any(g["passed"] for g in report["gates"])
    top1 = by_name["max-changed-top1"]
    assert top1["output"] == "scores/top1" and top1["value"] == 1.0  # every record's class moved
    assert by_name["min-metric-delta"]["value"] == pytest.approx(-1.0)  # accuracy 1.0 -> 0.0
    assert report["outputs"][0]["key"] == "scores" and by_name["max-abs-change"]["value"] > 0.5


@pytest.mark.slow
def test_every_gate_passes_within_its_limit(tfx_versions, tmp_path):
    proc, report = _diff(tfx_versions, "--max-changed-top1", "100%", "--max-abs-change", "p99=1",
                         "--label", "label", "--min-metric-delta", "-1", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(report["gates"]) == 3 and all(g["passed"] for g in report["gates"])


@pytest.mark.slow
@pytest.mark.parametrize("signature, gate, missing", [
    ("probability", ["--max-changed-top1", "1%"], "has no top-1 output"),
    ("label", ["--max-abs-change", "p99=0.1"], "has no numeric output"),
    ("label", ["--label", "label", "--min-metric-delta", "0"], "no one-value output"),
])
def test_a_gate_with_nothing_to_measure_is_a_usage_error(tfx_versions, tmp_path, signature, gate, missing):
    """Decided from NEW's signature before any version runs."""
    proc, report = _diff(tfx_versions, "--signature", signature, *gate, tmp_path=tmp_path)
    assert proc.returncode == 2 and report is None  # nothing half-written
    assert f"{gate[-2]} has nothing to measure: signature '{signature}'" in proc.stderr
    assert missing in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_metric_gate_without_labels_in_the_records_is_a_usage_error(tfx_versions, tmp_path):
    proc, report = _diff(tfx_versions, "--label", "clicked", "--min-metric-delta", "0", tmp_path=tmp_path)
    assert proc.returncode == 2 and report is None, proc.stdout + proc.stderr
    assert (f"none of the {FEATURES * PER_CLASS} records compared has the label feature 'clicked'"
            in proc.stderr)


@pytest.mark.slow
def test_verify_latency_gate_with_no_runtime_that_runs_the_model_is_a_usage_error(tfx_versions):
    proc = invoke("verify", tfx_versions["new"], "--runtimes", "golden", "--max-latency-ms", "50")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--max-latency-ms has nothing to measure: runtimes golden replay recorded answers" in proc.stderr
    assert "fix: add a runtime that runs it" in proc.stderr
