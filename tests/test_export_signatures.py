"""Several named signatures per export: subsets, tf.Example parsing, classify and regress; verified one by one."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from conftest import REPO, invoke

CUSTOM = dict(custom_objects=["sample_models.custom_layers"], python_path=[str(REPO)])
FOUR = ["serving_default", "embed:outputs=embedding", "ex:input=examples",
        "cls:input=examples,method=classify,scores=score,classes={labels}",
        "reg:input=examples,method=regress,outputs=score"]


def _export(src, out, signatures, **flags):
    from exportkit.export.pipeline import Progress, export_model
    from exportkit.options.export import export_options

    return export_model(export_options(str(src), str(out), signatures=signatures, **flags), Progress(io.StringIO()))


def _verify(capsys, path, **flags):
    from exportkit.options.verify import VerifyOptions
    from exportkit.verify.command import verify_command

    flags.setdefault("serving", "none")
    code = verify_command(VerifyOptions(path=str(path), json_out="-", **flags))
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture(scope="session")
def exports(sample, tmp_path_factory):
    """Exports with every kind of signature: mixed precision (float16 output cast), dict outputs, strings."""
    base = tmp_path_factory.mktemp("signatures")
    (base / "one.txt").write_text("relevant\n")
    (base / "topics.txt").write_text("sports\nnews\nweather\n")
    (base / "features.json").write_text(json.dumps({"user": {"feature": "u"}}))
    mixed = [s.format(labels=base / "one.txt") for s in FOUR]
    return {
        "mixed": _export(sample("mixed_functional.keras")["path"], base / "mixed", mixed, **CUSTOM),
        "multi_io": _export(sample("multi_io.keras")["path"], base / "multi_io",
                            ["serving_default", "ex:input=examples", "dwell:input=examples,method=regress,outputs=dwell"],
                            feature_spec=str(base / "features.json")),
        "text": _export(sample("text.keras")["path"], base / "text",
                        ["serving_default", f"topic:input=examples,method=classify,classes={base / 'topics.txt'}"]),
    }


def test_signature_specs_are_checked_before_any_work(tmp_path):
    from exportkit.errors import UsageError
    from exportkit.options.export import export_options

    def fails(*signatures, needle, **flags):
        with pytest.raises(UsageError) as err:
            export_options(str(tmp_path / "m.keras"), str(tmp_path / "out"), signatures=list(signatures), **flags)
        assert needle in err.value.message, err.value.message
        assert err.value.remedy

    fails("cls:method=classify", needle="input=tensors")
    fails("r:method=regress,input=examples,outputs=a+b", needle="one output")
    fails("a", "a:outputs=x", needle="given twice")
    fails("a:colour=red", needle="unknown key")
    fails("a:input=protos", needle="input=protos")
    fails("a:scores=x", needle="classify")
    fails("c:input=examples,method=classify,classes=/no/labels.txt", needle="does not exist")
    fails("a", signature_name="other", needle="--signature-name")
    (tmp_path / "features.json").write_text("{}")
    fails("a", feature_spec=str(tmp_path / "features.json"), needle="no signature takes tf.Example")

    (tmp_path / "labels.txt").write_text("x\n")
    (tmp_path / "exportkit.toml").write_text('[signatures.embed]\noutputs = ["e"]\n'
                                             '[signatures.cls]\ninput = "examples"\nmethod = "classify"\n'
                                             'classes = "labels.txt"\n')
    options = export_options(str(tmp_path / "m.keras"), str(tmp_path / "out"), signatures=["embed:outputs=f"])
    assert [(s.name, s.outputs) for s in options.signatures] == [("embed", ["f"]), ("cls", None)]
    assert options.signatures[1].classes == str((tmp_path / "labels.txt").resolve())


@pytest.mark.parametrize("signature,needle", [
    ("embed:outputs=nope", "'nope' is not a model output"),
    ("r:input=examples,method=regress", "regress signature has one output, the model has 2"),
    ("r:input=examples,method=regress,outputs=embedding", "one value per example"),
    ("c:input=examples,method=classify", "which holds the scores"),
])
def test_signatures_that_do_not_fit_the_model_are_usage_errors(sample, tmp_path, signature, needle):
    out = tmp_path / "out"
    proc = invoke("export", sample("mixed_functional.keras")["path"], "-o", out, "--custom-objects",
                  "sample_models.custom_layers", "--python-path", REPO, "--signature", signature, "--no-verify")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr and "fix:" in proc.stderr
    assert not out.exists()


def test_every_kind_of_signature_is_written_with_its_method_warmup_and_golden_record(exports):
    from tensorflow_serving.apis import prediction_log_pb2

    from exportkit.savedmodel.layout import read_golden
    from exportkit.savedmodel.manifest import read_manifest
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph
    from exportkit.savedmodel.signature_defs import signatures_of
    from exportkit.serving.warmup import warmup_path

    version = exports["mixed"].path
    sigs = signatures_of(select_meta_graph(read_saved_model_proto(version)))
    assert {n: s["method"].rpartition("/")[2] for n, s in sigs.items()} == {
        "serving_default": "predict", "embed": "predict", "ex": "predict", "cls": "classify", "reg": "regress"}
    assert set(sigs["embed"]["outputs"]) == {"embedding"}
    assert set(sigs["serving_default"]["outputs"]) == {"score", "embedding"}
    assert {k: (v["dtype"], v["shape"]) for k, v in sigs["ex"]["inputs"].items()} == {"examples": ("string", [-1])}
    assert set(sigs["cls"]["inputs"]) == {"inputs"} and set(sigs["cls"]["outputs"]) == {"scores", "classes"}
    assert sigs["cls"]["outputs"]["classes"]["dtype"] == "string" and sigs["cls"]["outputs"]["scores"]["dtype"] == "float32"
    assert set(sigs["reg"]["outputs"]) == {"outputs"}
    assert (version / "assets" / "one.txt").is_file()

    manifest, _ = read_manifest(version)
    assert set(manifest.signatures) == {"serving_default", "embed", "ex", "cls", "reg"}
    assert manifest.signature_name == "serving_default"  # the first one, for readers of one signature
    assert manifest.signatures["embed"]["outputs"]["embedding"]["compute_dtype"] == "float16"
    assert [f["feature"] for f in manifest.signatures["ex"]["features"]] == ["features", "ids"]
    for name in manifest.signatures:
        inputs, outputs = read_golden(version, name, manifest)
        assert len(inputs) == len(outputs) == 2 and set(outputs[0]) == set(sigs[name]["outputs"])
    _, cls_outputs = read_golden(version, "cls", manifest)
    assert cls_outputs[1]["classes"].shape == (8, 1) and cls_outputs[1]["classes"][0, 0] == b"relevant"

    import tensorflow as tf

    kinds = {}
    for raw in tf.data.TFRecordDataset(str(warmup_path(version))).as_numpy_iterator():
        log = prediction_log_pb2.PredictionLog.FromString(raw)
        kind = log.WhichOneof("log_type")
        request = getattr(log, kind).request
        kinds.setdefault(request.model_spec.signature_name, set()).add(kind)
        if kind != "predict_log":
            assert len(request.input.example_list.examples) in (1, 8)
    assert kinds == {"serving_default": {"predict_log"}, "embed": {"predict_log"}, "ex": {"predict_log"},
                     "cls": {"classify_log"}, "reg": {"regress_log"}}


def _example(features: np.ndarray, ids: np.ndarray) -> bytes:
    """A tf.Example written by hand the way a data pipeline writes one (not with exportkit's encoder)."""
    from tensorflow.core.example import example_pb2, feature_pb2

    example = example_pb2.Example()
    example.features.feature["features"].CopyFrom(
        feature_pb2.Feature(float_list=feature_pb2.FloatList(value=features.tolist())))
    example.features.feature["ids"].CopyFrom(feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=ids.tolist())))
    return example.SerializeToString()


@pytest.mark.slow
def test_example_signature_answers_exactly_what_the_tensor_signature_answers_in_the_tf1_loader(exports):
    from exportkit.runtimes.session import SessionRuntime

    rng = np.random.default_rng(7)
    features = rng.standard_normal((5, 8)).astype(np.float32)
    ids = rng.integers(0, 50, size=(5, 4)).astype(np.int32)
    examples = np.array([_example(f, i) for f, i in zip(features, ids)], dtype=object)
    with SessionRuntime(str(exports["mixed"].path), "serving_default") as session:  # a fresh process, no user code
        tensors = session.run({"features": features, "ids": ids})
        session.use_signature("ex", {})
        parsed = session.run({"examples": examples})
        session.use_signature("cls", {})
        classified = session.run({"inputs": examples})
    for key in ("score", "embedding"):
        assert parsed[key].dtype == tensors[key].dtype == np.float32
        assert np.array_equal(parsed[key], tensors[key]), key
    assert np.array_equal(classified["scores"], tensors["score"])
    assert classified["classes"].tolist() == [[b"relevant"]] * 5


@pytest.mark.slow
def test_verify_checks_every_signature_through_every_runtime(capsys, exports):
    code, report = _verify(capsys, exports["mixed"].path, serving="embedded")
    assert code == 0, report["verdict"]
    assert report["signatures"] == ["cls", "embed", "ex", "reg", "serving_default"]
    ran = {(r["signature"], r["name"]) for r in report["runtimes"] if r["kind"] != "agreement" and r["passed"]}
    for signature in report["signatures"]:
        for runtime in ("golden", "saved_model", "session", "serving"):
            assert (signature, runtime) in ran, (signature, runtime)
    agreements = {r["name"]: r for r in report["runtimes"] if r["kind"] == "agreement"}
    for runtime in ("saved_model", "session", "serving"):
        for pair in ("ex = serving_default", "cls = serving_default", "reg = serving_default"):
            result = agreements[f"{runtime}: {pair}"]
            assert result["passed"] and result["outputs"]
            assert all(o["max_abs_err"] == 0 for o in result["outputs"])
    assert "tf.Example signatures answer what their tensor twins answer" in report["verdict"]
    assert not [f for f in report["findings"] if f["severity"] != "info"], report["findings"]


@pytest.mark.slow
def test_verify_one_signature_and_feature_spec_and_string_features(capsys, exports):
    code, report = _verify(capsys, exports["multi_io"].path, signature_name="dwell", runtimes="golden,saved_model")
    assert code == 0, report["verdict"]
    assert {r["signature"] for r in report["runtimes"]} == {"dwell"}
    code, report = _verify(capsys, exports["multi_io"].path)
    assert code == 0, report["verdict"]
    from exportkit.savedmodel.manifest import read_manifest

    manifest, _ = read_manifest(exports["multi_io"].path)
    assert {f["input"]: f["feature"] for f in manifest.signatures["ex"]["features"]}["user"] == "u"
    code, report = _verify(capsys, exports["text"].path)  # a string input stored as bytes_list
    assert code == 0, report["verdict"]
    assert any(r["kind"] == "agreement" and r["passed"] for r in report["runtimes"])


def test_baseline_removed_signature_breaks_added_one_is_compatible(capsys, exports, sample, tmp_path):
    single = _export(sample("multi_io.keras")["path"], tmp_path / "single", [], no_verify=True).path
    code, report = _verify(capsys, exports["multi_io"].path, baseline=str(single), runtimes="golden")
    assert code == 0, report["findings"]
    assert {f["code"] for f in report["findings"] if f["code"].startswith("baseline")} == {"baseline-added-signature"}
    code, report = _verify(capsys, single, baseline=str(exports["multi_io"].path), runtimes="golden")
    assert code == 1
    removed = [f for f in report["findings"] if f["code"] == "baseline-removed-signature"]
    assert {f["message"].split("'")[1] for f in removed} == {"ex", "dwell"}


def test_inspect_lists_every_signature_with_its_method(exports):
    proc = invoke("inspect", exports["mixed"].path)
    assert proc.returncode == 0
    assert ("signatures: 5: cls (classify), embed (predict), ex (predict), reg (regress), serving_default (predict)"
            in proc.stdout)


def _module_with_signatures(path):
    """A third-party SavedModel (tf.Module, no Keras, no exportkit manifest) with three signatures."""
    import tensorflow as tf

    class Scorer(tf.Module):
        def __init__(self):
            self.w = tf.Variable([[1.0], [-2.0], [0.5]])
            self.table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                tf.constant(["a", "b"]), tf.constant([1, 2], tf.int64)), default_value=0)

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def score(self, x):
            return {"score": tf.matmul(x, self.w)}

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x"),
                                      tf.TensorSpec([None], tf.int64, name="k")])
        def shifted(self, x, k):
            return {"y": x * tf.cast(k[:, None], tf.float32), "k2": k * 2}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="token")])
        def lookup(self, token):
            return {"id": self.table.lookup(token)}

    module = Scorer()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.score, "shifted": module.shifted,
                                                       "lookup": module.lookup})
    return path


@pytest.mark.slow
def test_third_party_module_with_several_signatures_verifies_signature_by_signature(capsys, tmp_path):
    path = _module_with_signatures(tmp_path / "third" / "1")
    code, report = _verify(capsys, path)
    assert code == 0, report["verdict"]
    assert report["signatures"] == ["lookup", "serving_default", "shifted"]
    for signature in report["signatures"]:
        runs = [r for r in report["runtimes"] if r["signature"] == signature]
        assert {r["name"] for r in runs} == {"saved_model", "session"}
        assert any(r["outputs"] for r in runs)
        assert report["references"][signature] == "saved_model"
    code, report = _verify(capsys, path, signature_name="shifted")
    assert code == 0 and report["signatures"] == ["shifted"]
