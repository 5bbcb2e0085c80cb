"""PredictionLog records as data (exportkit's warm-up writer, TFX BulkInferrer-style logs, a warm-up file for TF
Serving's half_plus_two test model) and `exportkit diff` between two versions that differ in a known share of
top-1 answers."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import invoke

N = {"a": 40, "b": 30, "c": 130}  # records whose true class (and old top-1) is a, b, c
CLASSES = [b"a", b"b", b"c"]
W_OLD = np.eye(4, 3, dtype=np.float32)
W_NEW = W_OLD[:, [1, 0, 2]]  # classes a and b swapped: exactly the a and b records change their top-1


def build_model(version_dir: str, w: np.ndarray, shift: float = 0.0) -> str:
    """A TF1 graph over serialized tf.Examples (feature x: 4 floats): `serving_default` classify (scores =
    softmax(x @ w), classes a/b/c), `regress` (sum(x) + shift), `predict` over the tensor x (probabilities)."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        serialized = v1.placeholder(tf.string, shape=[None], name="tf_example")
        x_ex = v1.parse_example(serialized, {"x": v1.FixedLenFeature([4], tf.float32)})["x"]
        weights = v1.Variable(w, name="w")
        scores = tf.nn.softmax(tf.matmul(x_ex, weights))
        classes = tf.tile(tf.constant([CLASSES]), [tf.shape(scores)[0], 1])
        outputs = tf.reduce_sum(x_ex, axis=1, keepdims=True) + shift
        x = v1.placeholder(tf.float32, shape=[None, 4], name="x")
        sess.run(v1.global_variables_initializer())
        info = v1.saved_model.utils.build_tensor_info
        sig = v1.saved_model.signature_def_utils.build_signature_def
        signatures = {
            "serving_default": sig({"inputs": info(serialized)}, {"scores": info(scores), "classes": info(classes)},
                                   "tensorflow/serving/classify"),
            "regress": sig({"inputs": info(serialized)}, {"outputs": info(outputs)}, "tensorflow/serving/regress"),
            "predict": sig({"x": info(x)}, {"probabilities": info(tf.nn.softmax(tf.matmul(x, weights)))},
                           "tensorflow/serving/predict"),
        }
        builder = v1.saved_model.builder.SavedModelBuilder(version_dir)
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map=signatures)
        builder.save()
    return version_dir


def example(x, label: bytes, y: float) -> bytes:
    import tensorflow as tf

    return tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=list(x))),
        "label": tf.train.Feature(bytes_list=tf.train.BytesList(value=[label])),
        "y": tf.train.Feature(float_list=tf.train.FloatList(value=[y]))})).SerializeToString()


def bulk_inferrer_logs(path: str, version_dir: str, examples: list[bytes]) -> str:
    """PredictionLog records as TFX's BulkInferrer writes them (bulk_inferrer/executor.py: WriteToTFRecord of
    PredictionLog, GZIP `.gz`; prediction_to_example_utils.py reads one Example per log from
    request.input.example_list and the result from the response): a ClassifyLog and a RegressLog per Example,
    the response being what the model at `version_dir` answered."""
    import tensorflow as tf
    from tensorflow_serving.apis import classification_pb2, prediction_log_pb2, regression_pb2

    loaded = tf.saved_model.load(version_dir)
    batch = tf.constant(examples)
    scores = loaded.signatures["serving_default"](inputs=batch)["scores"].numpy()
    values = loaded.signatures["regress"](inputs=batch)["outputs"].numpy()
    with tf.io.TFRecordWriter(path, "GZIP") as writer:
        for raw, row, value in zip(examples, scores, values):
            request = classification_pb2.ClassificationRequest()
            request.model_spec.signature_name = "serving_default"
            request.input.example_list.examples.add().ParseFromString(raw)
            response = classification_pb2.ClassificationResponse()
            classification = response.result.classifications.add()
            for label, score in zip(CLASSES, row):
                classification.classes.add(label=label.decode(), score=float(score))
            writer.write(prediction_log_pb2.PredictionLog(classify_log=prediction_log_pb2.ClassifyLog(
                request=request, response=response)).SerializeToString())
            request = regression_pb2.RegressionRequest()
            request.model_spec.signature_name = "regress"
            request.input.example_list.examples.add().ParseFromString(raw)
            response = regression_pb2.RegressionResponse()
            response.result.regressions.add(value=float(value[0]))
            writer.write(prediction_log_pb2.PredictionLog(regress_log=prediction_log_pb2.RegressLog(
                request=request, response=response)).SerializeToString())
    return path


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Versions 1 (old), 2 (classes a and b swapped, regression shifted by 0.5) of one model base dir, the
    records (true class = old top-1) and a BulkInferrer-style log of version 1's answers."""
    base = tmp_path_factory.mktemp("diff")
    build_model(str(base / "model" / "1"), W_OLD)
    build_model(str(base / "model" / "2"), W_NEW, shift=0.5)
    rng = np.random.default_rng(0)
    records = []
    for cls, n in N.items():
        for _ in range(n):
            x = rng.uniform(0, 1, 4).astype(np.float32)
            x[CLASSES.index(cls.encode())] += 2.0  # a clear winner: no ties
            records.append(example(x, cls.encode(), float(x.sum())))
    order = rng.permutation(len(records))
    records = [records[i] for i in order]
    logs = bulk_inferrer_logs(str(base / "prediction_logs-00000-of-00001.gz"), str(base / "model" / "1"), records)
    return dict(base=base, old=str(base / "model" / "1"), new=str(base / "model" / "2"), records=records, logs=logs)


# -- the logs as data: fast, no runtime ----------------------------------------------------------------------


def _replayer(signature_name, model_name=None):
    from exportkit.data.predictionlog import LogReplayer

    sigs = {"serving_default": {"method": "tensorflow/serving/classify",
                                "inputs": {"inputs": {"dtype": "string", "shape": [-1]}},
                                "outputs": {"scores": {"dtype": "float32", "shape": [-1, 3]},
                                            "classes": {"dtype": "string", "shape": [-1, 3]}}},
            "regress": {"method": "tensorflow/serving/regress", "inputs": {"inputs": {"dtype": "string", "shape": [-1]}},
                        "outputs": {"outputs": {"dtype": "float32", "shape": [-1, 1]}}},
            "predict": {"method": "tensorflow/serving/predict", "inputs": {"x": {"dtype": "float32", "shape": [-1, 4]}},
                        "outputs": {"probabilities": {"dtype": "float32", "shape": [-1, 3]}}}}
    return LogReplayer(signature_name, sigs[signature_name], sigs, model_name)


def test_logs_decode_as_tf_serving_answers_them():
    """Classify/regress/multi-inference/predict requests become the signature's inputs and their responses the
    `logged` answers; other models, signatures and log types are skipped with TF Serving's reason."""
    from tensorflow_serving.apis import inference_pb2, predict_pb2, prediction_log_pb2 as pl
    from tensorflow_serving.apis import classification_pb2, regression_pb2

    from exportkit.data.predictionlog import is_prediction_log
    from exportkit.serving.tensors import to_tensor_proto

    ex = example([1, 2, 3, 4], b"a", 10.0)
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name = "m"
    classify.input.example_list_with_context.examples.add().ParseFromString(ex)
    classify.input.example_list_with_context.context.features.feature["ctx"].int64_list.value.append(7)
    response = classification_pb2.ClassificationResponse()
    row = response.result.classifications.add()
    for label, score in (("a", 0.1), ("b", 0.2), ("c", 0.7)):
        row.classes.add(label=label, score=score)
    log = pl.PredictionLog(classify_log=pl.ClassifyLog(request=classify, response=response)).SerializeToString()
    assert is_prediction_log(log) and not is_prediction_log(ex)

    r = _replayer("serving_default", "m").replay(log)
    assert r.rows == 1 and r.inputs["inputs"][0].endswith(ex)  # context bytes first (util.cc)
    assert r.logged["classes"].tolist() == [[b"a", b"b", b"c"]]
    np.testing.assert_allclose(r.logged["scores"], [[0.1, 0.2, 0.7]], rtol=1e-6)

    other = _replayer("serving_default", "other")
    assert other.replay(log) is None
    assert dict(other.skipped) == {"Servable not found for request: Latest(m)": 1}

    multi = inference_pb2.MultiInferenceRequest()
    multi.input.example_list.examples.add().ParseFromString(ex)
    for sig, method in (("serving_default", "tensorflow/serving/classify"), ("regress", "tensorflow/serving/regress")):
        task = multi.tasks.add(method_name=method)
        task.model_spec.signature_name = sig
    answer = inference_pb2.MultiInferenceResponse()
    answer.results.add().classification_result.CopyFrom(response.result)
    answer.results.add().regression_result.regressions.add(value=9.5)
    multi_log = pl.PredictionLog(multi_inference_log=pl.MultiInferenceLog(request=multi, response=answer))
    regress = _replayer("regress")
    r = regress.replay(multi_log.SerializeToString())
    assert r.logged["outputs"].tolist() == [[9.5]]  # [batch, 1] like the signature's output

    reg = regression_pb2.RegressionRequest()
    reg.model_spec.signature_name = "nope"
    reg.input.example_list.examples.add().ParseFromString(ex)
    assert regress.replay(pl.PredictionLog(regress_log=pl.RegressLog(request=reg)).SerializeToString()) is None
    predict = predict_pb2.PredictRequest()
    predict.model_spec.signature_name = "predict"
    predict.inputs["x"].CopyFrom(to_tensor_proto(np.ones((2, 4), np.float32)))
    assert regress.replay(pl.PredictionLog(predict_log=pl.PredictLog(request=predict)).SerializeToString()) is None
    assert dict(regress.skipped) == {
        "No signature was found with the name: nope": 1,
        "signature 'predict' (replayed: 'regress'; pass --signature predict for those)": 1}
    r = _replayer("predict").replay(pl.PredictionLog(predict_log=pl.PredictLog(request=predict)).SerializeToString())
    assert r.rows == 2 and r.inputs["x"].shape == (2, 4) and r.logged is None


def test_predict_logs_of_examples_replay_in_bulk_as_one_by_one():
    """The common log (a Predict request sending the one string input) is read without a Replayed per log: the same
    rows, positions and examples as `replay`; any other log (a response, another model or signature, an empty or
    malformed request, another log type) is left to `replay`."""
    from tensorflow_serving.apis import classification_pb2, predict_pb2, prediction_log_pb2 as pl

    from exportkit.data.records import Feeder, RecordBatch
    from exportkit.serving.tensors import to_tensor_proto

    def predict(values, shape=None, model="m", signature="", response=False):
        request = predict_pb2.PredictRequest()
        request.model_spec.name, request.model_spec.signature_name = model, signature
        tensor = request.inputs["inputs"]
        tensor.dtype = 7  # DT_STRING
        tensor.tensor_shape.dim.add().size = len(values) if shape is None else shape
        tensor.string_val.extend(values)
        log = pl.PredictLog(request=request)
        if response:
            log.response.outputs["scores"].CopyFrom(to_tensor_proto(np.full((1, 3), 0.5, np.float32)))
        return pl.PredictionLog(predict_log=log).SerializeToString()

    ex = [example([0, 1, 2, 3], b"a", 1.0), example([4, 5, 6, 7], b"b", 2.0)]
    classify = classification_pb2.ClassificationRequest()
    classify.input.example_list.examples.add().ParseFromString(ex[0])
    common = [predict(ex[:1]), predict(ex, signature="serving_default"), predict(ex[1:], model="")]
    others = [predict(ex[:1], response=True), predict(ex[:1], model="other"), predict(ex[:1], signature="regress"),
              predict([], shape=0), predict(ex[:1], shape=2), b"\xff not a log",
              pl.PredictionLog(classify_log=pl.ClassifyLog(request=classify)).SerializeToString()]
    bulk, one_by_one = _replayer("serving_default", "m"), _replayer("serving_default", "m")
    for record in common:
        assert bulk.example_values([record])[0] == one_by_one.replay(record).inputs["inputs"].tolist()
    assert all(bulk.example_values([*common, record]) is None for record in others)
    bulk.responses = one_by_one.responses = False  # diff's: the logged answers are not read
    assert bulk.example_values([others[0]])[0] == one_by_one.replay(others[0]).inputs["inputs"].tolist()
    assert one_by_one.replay(others[0]).logged is None

    class Source:
        files = ["logs"]
        where = staticmethod(lambda file_no, index: f"logs:{index}")

    def fed(records, bulk_path):
        feeder = Feeder(Source(), [], None, _replayer("serving_default", "m"))
        if not bulk_path:
            feeder._log_key = None
        n = len(records)
        return feeder.fed(RecordBatch(np.zeros(n, int), np.arange(n) + 5, np.arange(n) * 100, records=records)), feeder

    (a, _), (b, _) = fed(common, True), fed(common, False)
    assert len(a) == len(b) == 4 and a.logged is None is b.logged
    for name in ("file_nos", "indices", "offsets", "record_of_row"):
        assert getattr(a, name).tolist() == getattr(b, name).tolist(), name
    assert a.inputs["inputs"].tolist() == b.inputs["inputs"].tolist() == a.examples.tolist() == b.examples.tolist()
    (a, bulk_feeder), (b, feeder) = fed(common + others[:4], True), fed(common + others[:4], False)
    assert a.indices.tolist() == b.indices.tolist() and dict(bulk_feeder.replayer.skipped) == dict(feeder.replayer.skipped)


def test_change_statistics_merge_exactly_and_metrics_are_right():
    from exportkit.data.changes import ChangeStats
    from exportkit.runtimes.wrappers import top1_of

    rng = np.random.default_rng(1)
    old = rng.standard_normal((100, 3)).astype(np.float32)
    new = old + rng.normal(0, 0.01, old.shape).astype(np.float32)
    new[:7] = old[:7][:, ::-1]
    labels = np.argmax(old, axis=1)  # the true class is the old top-1: the old version is always right
    exs = np.asarray([example([0, 0, 0, 0], str(lab).encode(), 0.0) for lab in labels], dtype=object)
    derived = {"p/top1": ("p", None)}
    whole, parts = ChangeStats("p/top1", label_key="label"), [ChangeStats("p/top1", label_key="label") for _ in range(2)]
    args = lambda s: (np.zeros(len(old[s]), int), np.arange(100)[s], np.full(len(old[s]), -1), exs[s])
    t_old, t_new = top1_of({"p": old}, derived)["p/top1"], top1_of({"p": new}, derived)["p/top1"]
    whole.add(t_old, t_new, *args(slice(None)))
    parts[0].add(t_old[:60], t_new[:60], *args(slice(0, 60)))
    parts[1].add(t_old[60:], t_new[60:], *args(slice(60, None)))
    merged = parts[0].merge(parts[1])
    changed = np.argmax(old, axis=1) != np.argmax(new, axis=1)  # the expectation, without the code under test
    assert 0 < changed.sum() < 100
    assert whole.changed == merged.changed == int(changed.sum())
    assert whole.pairs == merged.pairs
    assert whole.metric(False) == merged.metric(False) == ("accuracy", 1.0, pytest.approx(1 - changed.mean()))

    scores = ChangeStats("s")
    y = (rng.uniform(size=500) < 0.4).astype(float)
    s_old, s_new = y + rng.normal(0, 1, 500), y + rng.normal(0, 2, 500)
    exs = np.asarray([example([0, 0, 0, 0], b"x", v) for v in y], dtype=object)
    scores.label_key = "y"
    scores.add(s_old[:, None], s_new[:, None], np.zeros(500, int), np.arange(500), np.full(500, -1), exs)

    def exact_auc(s):
        pos, neg = s[y == 1], s[y == 0]
        return float(((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum())
                     / (len(pos) * len(neg)))

    name, a_old, a_new = scores.metric(False)
    assert name == "auc" and abs(a_old - exact_auc(s_old)) < 2e-3 and abs(a_new - exact_auc(s_new)) < 2e-3
    name, m_old, _ = scores.metric(True)
    assert name == "mse" and m_old == pytest.approx(float(((s_old - y) ** 2).mean()))
    assert scores.mean_shift == pytest.approx(float((s_new - s_old).mean()))


def test_verdict_without_gates_says_whether_anything_changed():
    from exportkit.diff.report import DiffReport, OutputChange, verdict_line

    same = OutputChange("score", "numeric", records=10, changed_records=0, changed_share=0.0,
                        abs_change={"p50": 0.0, "p99": 0.0, "p99.9": 0.0, "max": 0.0})
    moved = OutputChange("score", "numeric", records=10, changed_records=3, changed_share=0.3,
                         abs_change={"p50": 0.0, "p99": 0.2, "p99.9": 0.2, "max": 0.2})
    assert verdict_line(DiffReport("a", "b", "s", inputs={"records": 10}, outputs=[same])).startswith("UNCHANGED: ")
    assert verdict_line(DiffReport("a", "b", "s", inputs={"records": 10}, outputs=[moved])).startswith("CHANGES: ")


@pytest.mark.parametrize("flags, problem", [
    (["--max-changed-top1", "five"], "is not a share"),
    (["--max-changed-top1", "1"], "reads as the fraction 1 (100%"),  # meant 1%: it passed 87% changed
    (["--max-abs-change", "p42=1"], "is not QUANTILE=VALUE"),
    (["--min-metric-delta", "-0.1"], "needs --label"),
])
def test_bad_gates_are_usage_errors(tmp_path, flags, problem):
    result = invoke("diff", str(tmp_path), str(tmp_path), *flags)
    assert result.returncode == 2 and problem in result.stderr and "fix:" in result.stderr


# -- replay and diff through the session runtimes ------------------------------------------------------------


@pytest.mark.slow
def test_bulk_inferrer_log_agrees_with_the_model_that_wrote_it_and_not_with_a_retrained_one(versions, tmp_path):
    out = tmp_path / "v.json"
    result = invoke("verify", versions["old"], "--data", versions["logs"], "--serving", "none", "--runtimes",
                    "saved_model,session", "--json", str(out))
    report = json.loads(out.read_text())
    assert result.returncode == 0, (result.stdout + result.stderr)
    logged = next(r for r in report["runtimes"] if r["name"] == "logged")
    assert {c["key"]: (c["passed"], c["records"]) for c in logged["outputs"]} == {
        "classes": (True, 200), "scores": (True, 200)}
    assert report["inputs"]["records"] == 200
    assert report["inputs"]["skipped"] == {
        "signature 'regress' (replayed: 'serving_default'; pass --signature regress for those)": 200}

    result = invoke("verify", versions["new"], "--data", versions["logs"], "--serving", "none", "--runtimes",
                    "session", "--signature", "regress", "--json", str(out))
    report = json.loads(out.read_text())
    assert result.returncode == 1
    (comparison,) = next(r for r in report["runtimes"] if r["name"] == "logged")["outputs"]
    assert comparison["failing_records"] == 200 and comparison["max_abs_err"] == pytest.approx(0.5, rel=1e-5)


@pytest.mark.slow
def test_diff_gives_the_changed_share_exactly_and_fails_its_gate(versions, tmp_path):
    out, html, summary = tmp_path / "d.json", tmp_path / "d.html", tmp_path / "d.md"
    result = invoke("diff", versions["old"], versions["new"], "--data", versions["logs"], "--label", "label",
                    "--max-changed-top1", "0.5%", "--json", str(out), "--html", str(html), "--summary", str(summary))
    assert result.returncode == 1, (result.stdout + result.stderr)
    report = json.loads(out.read_text())
    assert report["schema_version"] == 1 and not report["passed"] and report["findings"] == []
    top1 = next(c for c in report["outputs"] if c["key"] == "scores/top1")
    assert top1["top1_changed_share"] == (N["a"] + N["b"]) / 200  # exactly the a and b records
    confusion = dict(zip(top1["confusion"]["classes"], top1["confusion"]["counts"]))
    order = top1["confusion"]["classes"]
    assert confusion["c"][order.index("c")] == 130 and confusion["a"][order.index("b")] == 40
    assert confusion["b"][order.index("a")] == 30
    assert top1["metric"] == {"name": "accuracy", "old": 1.0, "new": 0.65, "delta": pytest.approx(-0.35),
                              "gain": pytest.approx(-0.35)}
    (gate,) = report["gates"]
    assert gate["name"] == "max-changed-top1" and not gate["passed"] and gate["value"] == 0.35
    scores = next(c for c in report["outputs"] if c["key"] == "scores")
    assert scores["most_changed"][0]["file"] == versions["logs"] and scores["abs_change"]["max"] > 0.5
    assert "FAILED" in report["verdict"] and "35% of top-1 answers change" in (result.stdout + result.stderr)
    assert "<svg" in html.read_text() and "old \\ new" in html.read_text()
    assert "max-changed-top1" in summary.read_text()


@pytest.mark.slow
def test_diff_of_a_base_dir_on_regress_records_reports_the_shift_and_passes_without_gates(versions, tmp_path):
    out = tmp_path / "d.json"
    result = invoke("diff", str(versions["base"] / "model"), "--data", versions["logs"], "--signature", "regress",
                    "--label", "y", "--json", str(out))
    assert result.returncode == 0, (result.stdout + result.stderr)
    report = json.loads(out.read_text())
    (outputs,) = report["outputs"]
    assert outputs["mean_shift"] == pytest.approx(0.5, rel=1e-5)
    assert outputs["abs_change"]["p99"] == pytest.approx(0.5, rel=0.012)  # log-binned, within 1.2%
    assert outputs["metric"]["name"] == "mse" and outputs["metric"]["old"] == pytest.approx(0, abs=1e-9)
    assert outputs["metric"]["new"] == pytest.approx(0.25, rel=1e-5)
    result = invoke("diff", str(versions["base"] / "model"), "--data", versions["logs"], "--signature", "regress",
                    "--label", "y", "--min-metric-delta", "-0.002", "--max-abs-change", "p99=0.05")
    assert result.returncode == 1 and "min-metric-delta" in (result.stdout + result.stderr)


@pytest.fixture(scope="module")
def warmup_diff(versions, tmp_path_factory):
    """A copy of the old version with the warm-up file exportkit's writer makes (classify and predict records), and
    the in-process `diff --data warmup` of it against the new version (its exit code and JSON document)."""
    import shutil

    from exportkit.serving.warmup import warmup_records, write_warmup_file

    tmp_path = tmp_path_factory.mktemp("warmup")
    old = tmp_path / "1"
    shutil.copytree(versions["old"], old)
    batches = [{"inputs": np.asarray(versions["records"][i:i + 20], dtype=object)} for i in range(0, 200, 20)]
    records = warmup_records("model", "serving_default", batches, method="classify")
    records += warmup_records("model", "predict", [{"x": np.ones((3, 4), np.float32)}])
    write_warmup_file(str(old), records)
    out = tmp_path / "in-process.json"
    result = invoke("diff", str(old), versions["new"], "--data", "warmup", "--json", str(out))
    return dict(old=old, tmp=tmp_path, result=result, doc=json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.slow
def test_exportkit_warmup_records_replay(versions, warmup_diff):
    """The warm-up file as `--data warmup`: verify replays its records (the predict one is skipped), and diff
    compares the 200 classify records (needs no Beam)."""
    out = warmup_diff["tmp"] / "v.json"
    result = invoke("verify", str(warmup_diff["old"]), "--data", "warmup", "--serving", "none", "--runtimes",
                    "session,saved_model", "--json", str(out))
    assert result.returncode == 0, (result.stdout + result.stderr)
    report = json.loads(out.read_text())
    assert report["inputs"]["records"] == 200 and sum(report["inputs"]["skipped"].values()) == 1
    diffed = warmup_diff["result"]
    assert diffed.returncode == 0, (diffed.stdout + diffed.stderr)
    doc = warmup_diff["doc"]
    assert doc["inputs"]["records"] == 200 and sum(doc["inputs"]["skipped"].values()) == 1
    top1 = next(o for o in doc["outputs"] if o["key"] == "scores/top1")
    assert top1["changed_records"] == N["a"] + N["b"]  # classes a and b swapped: exactly their records change


@pytest.mark.slow
def test_beam_diff_of_warmup_records_agrees_with_in_process(versions, warmup_diff):
    """The same diff on Beam's DirectRunner gives the same numbers."""
    pytest.importorskip("apache_beam")
    out = warmup_diff["tmp"] / "beam.json"
    result = invoke("diff", str(warmup_diff["old"]), versions["new"], "--data", "warmup", "--runner", "beam",
                    "--json", str(out))
    assert result.returncode == 0, (result.stdout + result.stderr)
    beam, in_process = json.loads(out.read_text()), warmup_diff["doc"]
    for a, b in zip(in_process["outputs"], beam["outputs"]):
        assert (a["key"], a["changed_records"], a["abs_change"], a["confusion"], a["most_changed"]) == \
            (b["key"], b["changed_records"], b["abs_change"], b["confusion"], b["most_changed"])
    assert beam["inputs"]["skipped"] == in_process["inputs"]["skipped"]


@pytest.mark.slow
def test_no_record_left_to_compare_is_exit_2(versions, tmp_path):
    """Every log is for another signature than the one asked: nothing to compare is the user's to fix (exit 2)."""
    result = invoke("diff", versions["old"], versions["new"], "--data", versions["logs"], "--signature", "predict")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no records to compare" in result.stderr and "fix:" in result.stderr


KILL_THE_NEW_WORKER = """
import os, signal, sys
from exportkit.runtimes import loop

run = loop.BatchLoop.run


def killing_run(self, inputs):  # the new version's worker dies (the OOM killer) before its first batch
    runtime = getattr(self.runtime, "inner", self.runtime)
    if runtime.path.rstrip("/").endswith("2") and runtime.worker.process.poll() is None:
        os.kill(runtime.worker.process.pid, signal.SIGKILL)
        runtime.worker.process.wait()
    return run(self, inputs)


loop.BatchLoop.run = killing_run
sys.argv = ["exportkit", *sys.argv[1:]]
from exportkit.entry import main

main()
"""


@pytest.mark.slow
def test_a_worker_killed_during_diff_is_exit_3_saying_why(versions):
    """A version's TensorFlow worker SIGKILLed mid-run (as the OOM killer or a CI timeout does): exit 3, and the
    message says it was killed and most likely why, not that exportkit is not installed."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", KILL_THE_NEW_WORKER, "diff", versions["old"], versions["new"],
                           "--data", versions["logs"]], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "killed by SIGKILL): signal 9" in proc.stderr and "out of memory" in proc.stderr, proc.stderr
    assert "more memory" in proc.stderr and "installed" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_warmup_file_for_tf_servings_half_plus_two(tmp_path):
    """TF Serving's test models carry no warm-up file (no assets.extra/tf_serving_warmup_requests under
    servables/tensorflow/testdata); this one is written for half_plus_two as TF Serving's docs describe it
    (g3doc/saved_model_warmup.md, example/resnet_warmup.py: PredictionLog records naming model and signature)."""
    import tensorflow as tf
    from tensorflow_serving.apis import (classification_pb2, inference_pb2, predict_pb2, prediction_log_pb2 as pl,
                                         regression_pb2)
    from tfs_models import build_half_plus

    from exportkit.savedmodel.layout import warmup_path
    from exportkit.serving.tensors import to_tensor_proto

    version = build_half_plus(str(tmp_path / "half_plus_two" / "00000123"))
    ex = tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[4.0]))})).SerializeToString()
    logs = []
    predict = predict_pb2.PredictRequest()
    predict.model_spec.name = "half_plus_two"
    predict.inputs["x"].CopyFrom(to_tensor_proto(np.asarray([1.0, 2.0, 5.0], np.float32)))
    logs.append(pl.PredictionLog(predict_log=pl.PredictLog(request=predict)))
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name, regress.model_spec.signature_name = "half_plus_two", "regress_x_to_y"
    regress.input.example_list.examples.add().ParseFromString(ex)
    logs.append(pl.PredictionLog(regress_log=pl.RegressLog(request=regress)))
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name, classify.model_spec.signature_name = "half_plus_two", "classify_x_to_y"
    classify.input.example_list.examples.add().ParseFromString(ex)
    logs.append(pl.PredictionLog(classify_log=pl.ClassifyLog(request=classify)))
    multi = inference_pb2.MultiInferenceRequest()
    multi.input.example_list.examples.add().ParseFromString(ex)
    for sig, method in (("regress_x_to_y", "tensorflow/serving/regress"), ("classify_x_to_y", "tensorflow/serving/classify")):
        task = multi.tasks.add(method_name=method)
        task.model_spec.name, task.model_spec.signature_name = "half_plus_two", sig
    logs.append(pl.PredictionLog(multi_inference_log=pl.MultiInferenceLog(request=multi)))
    path = warmup_path(version)
    path.parent.mkdir()
    with tf.io.TFRecordWriter(str(path)) as writer:
        for log in logs:
            writer.write(log.SerializeToString())
    out = tmp_path / "v.json"
    result = invoke("verify", version, "--data", "warmup", "--serving", "none", "--runtimes", "saved_model,session",
                    "--signature", "regress_x_to_y", "--model-name", "half_plus_two", "--json", str(out))
    assert result.returncode == 0, (result.stdout + result.stderr)
    report = json.loads(out.read_text())
    assert report["inputs"]["records"] == 2  # the regress log and the multi-inference task on regress_x_to_y
    assert report["inputs"]["skipped"] == {
        "signature 'classify_x_to_y' (replayed: 'regress_x_to_y'; pass --signature classify_x_to_y for those)": 1,
        "signature 'serving_default' (replayed: 'regress_x_to_y'; pass --signature serving_default for those)": 1}


@pytest.mark.slow
@pytest.mark.serving
def test_diff_against_the_deployed_version(versions, tmp_path):
    """--serving HOST:PORT: OLD is what a server answers (its signatures from GetModelMetadata)."""
    import re
    import shutil
    import subprocess
    import sys

    shutil.copytree(versions["old"], tmp_path / "deployed" / "1")
    server = subprocess.Popen([sys.executable, "-m", "exportkit", "serve", str(tmp_path / "deployed"), "--port", "0",
                               "--model-name", "ranker"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        address = re.search(r"127\.0\.0\.1:\d+", server.stdout.readline()).group(0)
        out = tmp_path / "d.json"
        result = invoke("diff", versions["new"], "--serving", address, "--model-name", "ranker", "--data",
                        versions["logs"], "--max-changed-top1", "40%", "--json", str(out))
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["old"] == f"deployed at {address}" and report["findings"] == []
    top1 = next(c for c in report["outputs"] if c["key"] == "scores/top1")
    assert top1["top1_changed_share"] == 0.35 and report["gates"][0]["passed"]


@pytest.mark.slow
def test_without_data_generated_batches_and_a_breaking_signature_change_fails(versions, tmp_path):
    """No --data: the generated batches; a version without the `regress` and `predict` signatures breaks their
    clients (exit 1)."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        serialized = v1.placeholder(tf.string, shape=[None], name="tf_example")
        x = v1.parse_example(serialized, {"x": v1.FixedLenFeature([4], tf.float32)})["x"]
        scores = tf.nn.softmax(tf.matmul(x, v1.Variable(W_NEW)))
        classes = tf.tile(tf.constant([CLASSES]), [tf.shape(scores)[0], 1])
        sess.run(v1.global_variables_initializer())
        info = v1.saved_model.utils.build_tensor_info
        signature = v1.saved_model.signature_def_utils.build_signature_def(
            {"inputs": info(serialized)}, {"scores": info(scores), "classes": info(classes)}, "tensorflow/serving/classify")
        builder = v1.saved_model.builder.SavedModelBuilder(str(tmp_path / "3"))
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": signature})
        builder.save()
    out = tmp_path / "d.json"
    result = invoke("diff", versions["old"], tmp_path / "3", "--samples", "16", "--json", out)
    report = json.loads(out.read_text())
    assert result.returncode == 1, result.stdout + result.stderr
    assert [f["code"] for f in report["findings"] if f["severity"] == "error"] == ["baseline-removed-signature"] * 2  # regress, predict
    assert report["inputs"]["source"] == "golden+generated" and report["inputs"]["records"] >= 16
    assert {c["key"] for c in report["outputs"]} == {"classes", "scores", "scores/top1"}
    assert "breaking signature change" in report["verdict"]
