"""TF Serving beyond Keras Predict: tf.Example signatures (Estimator- and TFX-style exports built here),
Classify/Regress/MultiInference, the REST API against gRPC, and what batching and repeated requests expose."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import invoke

from sample_models import serving_models


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Every model of sample_models/serving_models.py, built once (a few seconds in all)."""
    out = tmp_path_factory.mktemp("tfs")
    built = {name: getattr(serving_models, name)(out) for name in
             ("estimator_style", "tfx_style", "rest_types", "batch_dependent", "random_model", "numeric_strings")}
    _add_warmup_of_every_kind(built["estimator_style"] + "/1")
    return built


def _examples(version_dir: str, signature: str, n: int, seed: int = 1) -> np.ndarray:
    from exportkit.tfexample.signatures import example_inputs, generate_examples
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph

    meta_graph = select_meta_graph(read_saved_model_proto(version_dir))
    spec = next(iter(example_inputs(meta_graph, signature, version_dir).values()))
    return generate_examples(spec, (n,), np.random.default_rng(seed))


def _add_warmup_of_every_kind(version_dir: str) -> None:
    """Classify, Regress and MultiInference warm-up records, as Estimator users write them."""
    import tensorflow as tf
    from tensorflow_serving.apis import (classification_pb2, inference_pb2, prediction_log_pb2,
                                         regression_pb2)

    from exportkit.serving.client.grpc_client import fill_input
    from exportkit.serving.warmup import warmup_path

    examples = _examples(version_dir, "serving_default", 2)
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.signature_name = "classification"
    fill_input(classify.input, examples)
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.signature_name = "regression"
    fill_input(regress.input, examples)
    multi = inference_pb2.MultiInferenceRequest()
    for sig, method in (("classification", "tensorflow/serving/classify"), ("regression", "tensorflow/serving/regress")):
        task = multi.tasks.add()
        task.model_spec.name, task.model_spec.signature_name, task.method_name = "estimator", sig, method
    fill_input(multi.input, examples)
    path = str(warmup_path(version_dir))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for log in (prediction_log_pb2.PredictionLog(classify_log=prediction_log_pb2.ClassifyLog(request=classify)),
                    prediction_log_pb2.PredictionLog(regress_log=prediction_log_pb2.RegressLog(request=regress)),
                    prediction_log_pb2.PredictionLog(
                        multi_inference_log=prediction_log_pb2.MultiInferenceLog(request=multi))):
            writer.write(log.SerializeToString())


def _verify(path, *args, tmp_path):
    out = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
    result = invoke("verify", path, "--json", out, *args)
    return result, json.loads(out.read_text())


def _codes(report) -> dict:
    return {f["code"]: f for f in report["findings"]}


def _runtime(report, name) -> dict:
    return next(r for r in report["runtimes"] if r["name"] == name)


# ------------------------------------------------------------------------------------------------ feature specs
def test_feature_spec_read_from_the_graph(models):
    from exportkit.tfexample.signatures import check_examples, example_inputs
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph

    est = models["estimator_style"] + "/1"
    spec = example_inputs(select_meta_graph(read_saved_model_proto(est)), "classification", est)["inputs"]
    features = {f.feature: f for f in spec.features}
    assert (features["x"].kind, features["x"].storage, features["x"].shape, features["x"].default) == ("dense", "float32", [2], None)
    assert (features["age"].storage, features["age"].default) == ("int64", [30])
    assert features["color"].default == [b"red"] and features["color"].vocabulary == [b"red", b"green", b"blue"]
    assert (features["tags"].kind, features["tags"].storage, features["tags"].vocabulary) == ("sparse", "string", None)

    tfx = models["tfx_style"] + "/1"  # ParseExampleV2 inside the function library, the table a captured resource
    spec = example_inputs(select_meta_graph(read_saved_model_proto(tfx)), "serving_default", tfx)["examples"]
    features = {f.feature: f for f in spec.features}
    assert features["company"].vocabulary == [b"flash", b"taxi_affiliation", b"other"]
    assert features["hour"].default == [12.0] and features["trip_miles"].default is None

    examples = _examples(est, "classification", 4)
    assert check_examples(spec, examples) is not None  # Estimator examples lack the TFX model's required feature
    assert check_examples(next(iter(example_inputs(select_meta_graph(read_saved_model_proto(est)), "predict",
                                                   est).values())), examples) is None
    colors = {bytes(v) for e in examples for v in _parse(e).features.feature["color"].bytes_list.value}
    assert colors <= {b"red", b"green", b"blue"}

    rest = models["rest_types"] + "/1"  # a plain string input is not mistaken for tf.Example
    assert example_inputs(select_meta_graph(read_saved_model_proto(rest)), "serving_default", rest) == {}


def _parse(serialized):
    from exportkit.tfexample.signatures import parse_example

    return parse_example(serialized)


# ------------------------------------------------------------------------------------------------ verify
@pytest.mark.serving
@pytest.mark.slow
@pytest.mark.parametrize("signature, api", [("serving_default", "Classify"), ("regression", "Regress")])
def test_estimator_style_export_verifies_through_every_runtime(models, tmp_path, signature, api):
    result, report = _verify(models["estimator_style"], "--serving", "embedded", "--signature-name", signature,
                             tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout
    assert [r["name"] for r in report["runtimes"]] == ["saved_model", "session", "serving", "rest"]
    assert all(r["status"] == "ok" and r["outputs"] and all(o["passed"] for o in r["outputs"])
               for r in report["runtimes"] if not r["is_reference"])
    assert _runtime(report, "serving")["server"]["api"] == api and _runtime(report, "rest")["server"]["api"] == api
    assert "serialized tf.Example" in report["inputs"]["examples"]["inputs"]
    assert not {"serving-warmup", "batch-dependent", "nondeterministic", "rest-json"} & set(_codes(report))


@pytest.mark.serving
@pytest.mark.slow
def test_tfx_style_export_with_a_tfrecord_of_examples(models, tmp_path):
    import tensorflow as tf

    records = tmp_path / "examples.tfrecord"
    with tf.io.TFRecordWriter(str(records)) as writer:
        for raw in _examples(models["tfx_style"] + "/1", "serving_default", 5, seed=7):
            writer.write(bytes(raw))
    result, report = _verify(models["tfx_style"], "--serving", "embedded", "--inputs", records, tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout
    assert report["inputs"]["source"] == "file+generated" and 5 in report["inputs"]["batch_sizes"]
    assert {r["name"] for r in report["runtimes"]} == {"saved_model", "session", "serving", "rest"}

    bad = tmp_path / "bad.tfrecord"
    with tf.io.TFRecordWriter(str(bad)) as writer:
        writer.write(bytes(_examples(models["estimator_style"] + "/1", "serving_default", 1)[0]))
    result = invoke("verify", models["tfx_style"], "--serving", "none", "--inputs", bad)
    assert result.returncode == 2 and "trip_miles" in result.stderr and "fix:" in result.stderr


@pytest.mark.slow
def test_generated_inputs_a_model_rejects_are_reported_as_wrong_inputs(models, tmp_path):
    result, report = _verify(models["numeric_strings"], "--serving", "none", tmp_path=tmp_path)
    assert result.returncode == 1
    session = _runtime(report, "session")
    assert "inputs were wrong" in session["error"] and "fail the same way in TF Serving" not in session["error"]
    good = tmp_path / "numbers.json"
    good.write_text(json.dumps({"text": ["1.5", "-2"]}))
    result, report = _verify(models["numeric_strings"], "--runtimes", "saved_model", "--inputs", good, tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout  # the real inputs pass; the generated ones are left out
    assert _codes(report)["generated-inputs-rejected"]["severity"] == "warning"


@pytest.mark.slow
def test_batch_dependent_and_random_models_are_caught(models, tmp_path):
    # In-process runtime only: the checks are the same in every runtime (the serving ones are covered above).
    result, report = _verify(models["batch_dependent"], "--runtimes", "saved_model", tmp_path=tmp_path)
    assert result.returncode == 1
    finding = _codes(report)["batch-dependent"]
    assert finding["severity"] == "error" and "'normalised'" in finding["message"] and "doubled" not in finding["message"]
    assert "nondeterministic" not in _codes(report)

    result, report = _verify(models["random_model"], "--runtimes", "saved_model", tmp_path=tmp_path)
    assert result.returncode == 1
    finding = _codes(report)["nondeterministic"]
    assert finding["severity"] == "error" and "'sample'" in finding["message"] and "'mean'" not in finding["message"]
    assert "batch-dependent" not in _codes(report)  # random rows are not blamed on batching

    result, report = _verify(models["random_model"], "--runtimes", "saved_model,session", "--allow-nondeterministic",
                             tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout
    assert _codes(report)["nondeterministic"]["severity"] == "warning"
    assert {o["key"] for r in report["runtimes"] for o in r["outputs"]} == {"mean"}


@pytest.mark.serving
@pytest.mark.slow
def test_rest_against_grpc_reports_what_json_loses(models, tmp_path):
    result, report = _verify(models["rest_types"], "--serving", "embedded", tmp_path=tmp_path)
    findings = [f for f in report["findings"] if f["code"] == "rest-json"]
    by_output = {f["message"].split("'")[1]: f["message"] for f in findings}
    # bool, UTF-8 strings and *_bytes survive JSON; float64 inputs do not quite: TF Serving's rapidjson parses
    # numbers in normal precision (util/json_tensor.cc sets no kParseFullPrecisionFlag), a few ULP off
    assert set(by_output) == {"big", "raw", "score"}, findings
    assert "2**53" in by_output["big"] and "raw_bytes" in by_output["raw"]
    rest = {o["key"]: o["passed"] for o in _runtime(report, "rest")["outputs"]}
    assert rest == {"big": True, "echo": True, "positive": True, "raw": False, "raw_bytes": True, "score": True}
    assert result.returncode == 1  # a REST client really gets other bytes for 'raw'


# ------------------------------------------------------------------------------------------------ the server
@pytest.fixture(scope="module")
def server(models):
    """`exportkit serve` on the Estimator-style export with gRPC and REST (warm-up of every kind replayed)."""
    from exportkit.serving.launch.process import free_port
    from exportkit.serving.server.model_server import ADDRESS_RE

    proc = subprocess.Popen([sys.executable, "-m", "exportkit", "serve", models["estimator_style"], "--port", "0",
                             "--rest-port", str(free_port()), "--model-name", "est"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        match = ADDRESS_RE.match(proc.stdout.readline())
        assert match and match.group("rest"), proc.stderr.read()
        yield {"grpc": match.group("address"), "rest": match.group("rest"), "proc": proc}
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert "3 warm-up record(s) replayed" in err


def _post(url, body):
    request = urllib.request.Request(url, data=body if isinstance(body, bytes) else json.dumps(body).encode(),
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.serving
def test_classify_regress_multi_inference_like_tf_serving(server, models):
    import grpc
    from tensorflow_serving.apis import inference_pb2, prediction_service_pb2_grpc

    from exportkit.serving.client.grpc_client import ServingClient, ServingError, fill_input
    from exportkit.savedmodel.loader import Tf1SavedModel

    examples = _examples(models["estimator_style"] + "/1", "serving_default", 3)
    reference = Tf1SavedModel(models["estimator_style"] + "/1")
    want = reference.run("classification", {"inputs": examples})
    want_value = reference.run("regression", {"inputs": examples})["outputs"]
    with ServingClient(server["grpc"], "est") as client:
        got = client.classify(examples)
        np.testing.assert_array_equal(got["classes"], want["classes"])
        np.testing.assert_allclose(got["scores"], want["scores"], rtol=1e-6)
        np.testing.assert_allclose(client.regress(examples, "regression"), want_value.reshape(-1), rtol=1e-6)
        # example_list_with_context: context + example bytes, so the context supplies features examples lack
        context = _parse(examples[0])
        partial = _parse(examples[1])
        del partial.features.feature["x"]
        request = client.example_request("classify", [partial.SerializeToString()])
        request.input.Clear()
        fill_input(request.input, [partial.SerializeToString()], context=context.SerializeToString())
        merged = _parse(examples[1])
        merged.features.feature["x"].CopyFrom(context.features.feature["x"])
        np.testing.assert_allclose(client.call(request).result.classifications[0].classes[1].score,
                                   client.classify([merged.SerializeToString()])["scores"][0, 1], rtol=1e-6)
        for mutate, code, message in [
                (lambda r: r.input.Clear(), "INVALID_ARGUMENT", "Input is empty."),
                (lambda r: setattr(r.model_spec, "signature_name", "nope"), "INVALID_ARGUMENT",
                 "No signature was found with the name: nope"),
                (lambda r: setattr(r.model_spec, "signature_name", "predict"), "INVALID_ARGUMENT",
                 "Expected one or two output Tensors, found 3")]:
            request = client.example_request("classify", examples)
            mutate(request)
            with pytest.raises(ServingError) as info:
                client.call(request)
            assert (info.value.code, info.value.message) == (code, message)

    multi = inference_pb2.MultiInferenceRequest()
    for sig, method in (("classification", "tensorflow/serving/classify"), ("regression", "tensorflow/serving/regress")):
        task = multi.tasks.add()
        task.model_spec.name, task.model_spec.signature_name, task.method_name = "est", sig, method
    fill_input(multi.input, examples)
    with grpc.insecure_channel(server["grpc"]) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.MultiInference(multi, timeout=10)
        assert [r.model_spec.signature_name for r in response.results] == ["classification", "regression"]
        assert response.results[1].model_spec.version.value == 1
        np.testing.assert_allclose([r.value for r in response.results[1].regression_result.regressions],
                                   want_value.reshape(-1), rtol=1e-6)
        multi.tasks[1].model_spec.signature_name = "classification"
        with pytest.raises(grpc.RpcError) as info:
            stub.MultiInference(multi, timeout=10)
        assert info.value.details() == "Duplicate evaluation of signature: classification"


@pytest.mark.serving
def test_rest_api_formats_and_errors(server, models):
    from exportkit.serving.json.examples import example_to_json

    base = f"http://{server['rest']}/v1/models/est"
    with urllib.request.urlopen(base, timeout=10) as response:
        status = json.loads(response.read())
    assert status["model_version_status"] == [{"version": "1", "state": "AVAILABLE",
                                                "status": {"error_code": "OK", "error_message": ""}}]
    with urllib.request.urlopen(base + "/versions/1/metadata", timeout=10) as response:
        metadata = json.loads(response.read())
    assert metadata["model_spec"]["name"] == "est"
    assert metadata["metadata"]["signature_def"]["signature_def"]["regression"]["method_name"] == \
        "tensorflow/serving/regress"

    examples = _examples(models["estimator_style"] + "/1", "serving_default", 2)
    code, body = _post(base + ":regress", {"signature_name": "regression",
                                           "examples": [example_to_json(bytes(e)) for e in examples]})
    assert code == 200 and len(body["results"]) == 2
    code, body = _post(base + ":classify", {"examples": [example_to_json(bytes(e)) for e in examples]})
    assert code == 200 and [label for label, _ in body["results"][0]] == ["0", "1", "2"]
    # row and columnar predict of the same serialized Example (a string input: b64)
    import base64

    b64 = {"b64": base64.b64encode(bytes(examples[0])).decode()}
    code, row = _post(base + ":predict", {"signature_name": "predict", "instances": [b64]})
    code2, col = _post(base + ":predict", {"signature_name": "predict", "inputs": {"examples": [b64]}})
    assert code == code2 == 200 and row["predictions"][0]["logits"] == col["outputs"]["logits"][0]

    for url, body, http, words in [
            (base + ":predict", b"", 400, "JSON Parse error: The document is empty"),
            (base + ":predict", {"signature_name": "predict", "instances": [{"x": 1}]}, 400,
             "Failed to process element: 0 key: x of 'instances' list"),
            (base + ":predict", {"signature_name": "predict", "instances": [1.5]}, 400, "is not of expected type: string"),
            (base + "/versions/9:predict", {"instances": [b64]}, 404, "Servable not found"),
            (base + ":classify", {"examples": []}, 400, "'examples' value is an empty array"),
            (base + ":predict", {"signature_name": "nope", "instances": [b64]}, 400,
             'Serving signature name: "nope" not found in signature def'),
            (f"http://{server['rest']}/v1/models/est:explain", {}, 400, "Malformed request: POST")]:
        code, answer = _post(url, body)
        assert code == http and words in answer["error"], (url, answer)


def test_float_printing_matches_tf_serving():
    from exportkit.serving.json.encode import format_float, predict_json

    assert format_float(np.float32(0.1)) == "0.1"  # %.6g reads back as the same float32
    assert format_float(np.float32(1.0)) == "1.0" and format_float(np.float32(1e10)) == "1e+10"
    assert format_float(np.float32(0.12345679)) == "0.123456791"  # needs max_digits10 (9) for float32
    assert format_float(2.0333333333333332, double=True) == "2.0333333333333332"
    assert format_float(float("nan")) == "NaN" and format_float(float("-inf")) == "-Infinity"
    for value in np.random.default_rng(0).standard_normal(200).astype(np.float32):
        assert np.float32(float(format_float(value))) == value
    out = predict_json({"y": np.array([[1.5], [2.0]], np.float32)}, row=True)
    assert json.loads(out) == {"predictions": [[1.5], [2.0]]}


@pytest.mark.serving
def test_inspect_requests_are_ready_to_send(server, models, tmp_path):
    from google.protobuf import json_format
    from tensorflow_serving.apis import classification_pb2, predict_pb2, regression_pb2

    from exportkit.serving.client.grpc_client import ServingClient

    result = invoke("inspect", models["estimator_style"], "--requests", tmp_path / "req", "--model-name", "est")
    assert result.returncode == 0, result.stderr
    kinds = {"classification": classification_pb2.ClassificationRequest, "regression": regression_pb2.RegressionRequest,
             "predict": predict_pb2.PredictRequest, "serving_default": classification_pb2.ClassificationRequest}
    with ServingClient(server["grpc"], "est") as client:
        for name, kind in kinds.items():
            request = json_format.Parse((tmp_path / "req" / f"{name}.grpc.json").read_text(), kind())
            response = client.call(request)  # grpcurl's JSON is the request proto: the server accepts it
            assert response.ByteSize() > 0
            curl = subprocess.run(["sh", str(tmp_path / "req" / f"{name}.curl.sh")], capture_output=True, text=True,
                                  env={"PATH": "/usr/bin:/bin", "REST_ADDRESS": server["rest"]}, timeout=30)
            if shutil.which("curl"):
                answer = json.loads(curl.stdout)
                assert "error" not in answer and ("results" in answer or "predictions" in answer)


def test_rest_client_keeps_trailing_nul_bytes_of_binary_strings():
    """Serialized tf.Examples often end with a 0 byte (an int64 feature whose last value is 0); numpy bytes
    scalars drop trailing NULs, which corrupted such Examples on their way into a REST request."""
    import base64

    from exportkit.serving.client.rest_client import to_json_value

    values = np.array([b"\n\x04\x00\x01\x00", b"ab\x00\x00", b"plain"], dtype=object)
    sent = to_json_value(values)
    assert [base64.b64decode(v["b64"]) for v in sent] == list(values)
    assert base64.b64decode(to_json_value(b"x\x00")["b64"]) == b"x\x00"
