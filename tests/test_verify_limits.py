"""Answers too big for a client (issue 50): the gRPC message sizes verify reports are the bytes the protos
serialize to, and the limits it warns about are the ones a real default gRPC client and TF Serving's server
enforce (serving/messages.py, verify/messages.py)."""
from __future__ import annotations

import contextlib
import io
import json
import runpy
import subprocess
import sys

import numpy as np
import pytest

from conftest import invoke
from exportkit.serving.messages import (CLIENT_MAX_RECEIVE, SERVER_MAX_MESSAGE, ModelSpec, request_bytes,
                                        response_bytes, tensor_bytes)
from exportkit.verify.messages import signature_sizes, size_findings

WIDTH = 300_000  # floats per row: 1.2 MB, so 3 rows fit a default client's 4 MiB and 4 do not
WIDE = 1_050_000  # floats per row: 4.2 MB, so not even one row fits


def _arrays() -> dict[str, np.ndarray]:
    import ml_dtypes

    rng = np.random.default_rng(0)
    return {"f32": rng.normal(size=(3, 7)).astype(np.float32), "f64": rng.normal(size=(2, 3)),
            "i32": rng.integers(-300, 300, (4, 5)).astype(np.int32), "i64": rng.integers(-2**40, 2**40, 4),
            "u8": rng.integers(0, 255, (2, 9)).astype(np.uint8), "bool": rng.random((3, 3)) > 0.5,
            "f16": rng.normal(size=(3, 4)).astype(np.float16),
            "bf16": rng.normal(size=(2, 2)).astype(ml_dtypes.bfloat16),
            "str": np.array([[b"abc", b""], [b"x" * 200, b"q"]], dtype=object),
            "c64": (rng.normal(size=(2, 2)) + 1j).astype(np.complex64), "u32": np.array([1, 2**31, 5], np.uint32),
            "u64": np.array([1, 2**63, 5], np.uint64), "i16": np.array([-1, 3], np.int16),
            "empty": np.zeros((0, 4), np.float32), "zero_dim": np.zeros((2, 0, 3), np.int64),
            "scalar": np.float32(2.5)}


def test_tensor_sizes_are_what_the_protos_serialize_to():
    from exportkit.serving.tensors import to_field_tensor_proto, to_tensor_proto

    for key, array in _arrays().items():
        assert tensor_bytes(array) == to_field_tensor_proto(array).ByteSize(), key  # what Predict answers
        assert tensor_bytes(array, content=True) == to_tensor_proto(array).ByteSize(), key  # what clients send


def test_scalar_shape_is_written_as_tensorflow_writes_it():
    from exportkit.tfenv import import_tf

    tf = import_tf()
    assert tensor_bytes(np.float32(2.5), content=True) == tf.make_tensor_proto(np.float32(2.5)).ByteSize()


def test_predict_request_and_response_sizes():
    from exportkit.serving.client.grpc_client import ServingClient
    from exportkit.serving.tensors import to_field_tensor_proto
    from tensorflow_serving.apis import predict_pb2

    arrays = _arrays()
    client = ServingClient("127.0.0.1:1", "ranker", 7, "scores_sig")  # builds requests only: nothing is called
    try:
        assert request_bytes("Predict", arrays, ModelSpec("ranker", "scores_sig", 7)) == \
            client.make_request(arrays).ByteSize()
    finally:
        client.close()
    response = predict_pb2.PredictResponse()
    for key, array in arrays.items():
        response.outputs[key].CopyFrom(to_field_tensor_proto(array))
    response.model_spec.name, response.model_spec.signature_name = "ranker", "scores_sig"
    response.model_spec.version.value = 7
    assert response_bytes("Predict", arrays, ModelSpec("ranker", "scores_sig", 7)) == response.ByteSize()


def test_classify_and_regress_sizes_as_the_server_builds_them():
    """The ClassificationResponse/RegressionResponse exportkit's server builds (classifier.cc, regressor.cc), with
    labels of several lengths, a missing label, and 0.0 / -0.0 scores (proto3 leaves out 0.0 only)."""
    from tensorflow.core.protobuf import meta_graph_pb2
    from tensorflow_serving.apis import classification_pb2, regression_pb2

    from exportkit.serving.server.classifier import postprocess_classification
    from exportkit.serving.server.regressor import postprocess_regression

    spec = ModelSpec("m", "serving_default", 1)
    signature = meta_graph_pb2.SignatureDef()
    signature.outputs["classes"].name, signature.outputs["scores"].name = "c:0", "s:0"
    signature.outputs["outputs"].name = "o:0"
    classes = np.array([[b"cat", b"dog" * 50, b""], [b"a", b"b", b"c"]], dtype=object)
    scores = np.array([[0.5, 0.0, -0.0], [1e-3, 2.0, 3.0]], np.float32)
    for values in ({"c:0": classes, "s:0": scores}, {"s:0": scores}, {"c:0": classes}):
        sig = meta_graph_pb2.SignatureDef()
        for key, name in (("classes", "c:0"), ("scores", "s:0")):
            if name in values:
                sig.outputs[key].name = name
        response = classification_pb2.ClassificationResponse()
        postprocess_classification(sig, 2, values, response.result)
        response.model_spec.name, response.model_spec.signature_name, response.model_spec.version.value = "m", \
            "serving_default", 1
        outputs = {k: values[n] for k, n in (("classes", "c:0"), ("scores", "s:0")) if n in values}
        assert response_bytes("Classify", outputs, spec) == response.ByteSize(), sorted(outputs)
    regressed = np.array([[0.0], [-0.0], [1.5]], np.float32)
    response = regression_pb2.RegressionResponse()
    postprocess_regression(signature, 3, {"o:0": regressed}, response.result)
    response.model_spec.name, response.model_spec.signature_name, response.model_spec.version.value = "m", \
        "serving_default", 1
    assert response_bytes("Regress", {"outputs": regressed}, spec) == response.ByteSize()
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name, request.model_spec.signature_name, request.model_spec.version.value = "m", \
        "serving_default", 1
    from tensorflow.core.example import example_pb2

    def example(**floats) -> bytes:
        e = example_pb2.Example()
        for key, values in floats.items():
            e.features.feature[key].float_list.value.extend(values)
        return e.SerializeToString()

    examples = np.array([example(), example(x=[1.0]), example(x=[0.5] * 300, y=[2.0])], dtype=object)
    for raw in examples:
        request.input.example_list.examples.add().ParseFromString(raw)
    assert request_bytes("Classify", {"inputs": examples}, spec) == request.ByteSize()


def _sizes(rows_bytes: list[tuple[int, int, int]]) -> dict:
    """signature_sizes over stand-in answers: a float32 output whose rows weigh `per_row` bytes."""
    batches, answers = [], []
    for rows, per_row, request in rows_bytes:
        batches.append({"x": np.zeros((rows, request // 4), np.float32)})
        answers.append({"y": np.ones((rows, per_row // 4), np.float32)})
    return signature_sizes("serving_default", "Predict", batches, answers, ModelSpec("m", "serving_default", 1))


def test_a_default_client_limit_is_a_warning_and_the_server_limit_an_error():
    within = _sizes([(1, 400_000, 16), (8, 400_000, 16)])  # 3.2 MB at 8 rows: within 4 MiB
    assert size_findings(within) == [] and within["rows_within"]["default_client"] == 10
    over = _sizes([(1, 1_200_000, 16), (8, 1_200_000, 16)])
    (warning,) = size_findings(over)
    assert warning.severity == "warning" and warning.code == "message-size"
    assert "batch of 8 is 9.6 MB (9.16 MiB)" in warning.message
    assert "output 'y': 1.2 MB (1.14 MiB) per row" in warning.message
    assert 'options=[("grpc.max_receive_message_length", 10 * 1024 * 1024)]' in warning.message
    assert "at most 3 rows per request" in warning.message
    (none_fit,) = size_findings(_sizes([(1, 4_400_000, 16)]))
    assert "cannot receive even one row" in none_fit.message and "send at most" not in none_fit.message
    # above TF Serving's own 2 GiB: computed from the sizes alone (no 2 GiB array is built for it)
    huge = dict(over, batches=[{"rows": 1000, "request_bytes": 100, "response_bytes": SERVER_MAX_MESSAGE + 1}])
    error = next(f for f in size_findings(huge) if f.severity == "error")
    assert "2,147,483,647 bytes (2 GiB) TF Serving's gRPC server sends" in error.message
    assert f"at most {over['rows_within']['server']} rows" in error.message


# -- a real default client against exportkit's server, and verify's claim about it ---------------------------------


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    """A tf.Module whose answer is 1.2 MB per row (`big`, [batch, 300000] float32) beside a small one, and a
    signature `wide` whose one row is 4.2 MB, served by `exportkit serve` as tensorflow_model_server would."""
    from exportkit.serving.launch.process import free_port

    import tensorflow as tf

    class Big(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def serve(self, x):
            row = tf.reduce_sum(x, axis=1, keepdims=True)
            return {"big": row + tf.zeros([1, WIDTH]), "small": row}

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def wide(self, x):
            return {"wide": tf.reduce_sum(x, axis=1, keepdims=True) + tf.zeros([1, WIDE])}

    root = tmp_path_factory.mktemp("big_answer")
    m = Big()
    tf.saved_model.save(m, str(root / "big" / "1"), signatures={"serving_default": m.serve, "wide": m.wide})
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exportkit", "serve", f"--port={port}", "--model_name=big",
                             f"--model_base_path={root / 'big'}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert "AVAILABLE" in line, proc.stderr.read()[-3000:]
        yield {"path": root / "big" / "1", "address": f"127.0.0.1:{port}", "root": root}
    finally:
        proc.terminate()
        proc.wait(30)


def _predict(address: str, rows: int, options=None, signature: str = "serving_default"):
    """Predict as a user's client calls it: grpc.insecure_channel with the options given (none: gRPC's defaults)."""
    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from exportkit.tfenv import import_tf

    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "big", signature
    request.inputs["x"].CopyFrom(import_tf().make_tensor_proto(np.ones((rows, 4), np.float32)))
    with grpc.insecure_channel(address, options=options or []) as channel:
        return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)


@pytest.mark.slow
@pytest.mark.serving
def test_verify_warns_and_a_real_default_client_proves_it(big_model, tmp_path):
    import grpc

    report = tmp_path / "report.json"
    html, summary = tmp_path / "report.html", tmp_path / "summary.md"
    proc = invoke("verify", big_model["path"], "--serving", big_model["address"], "--model-name", "big",
                  "--signature", "serving_default", "--json", report, "--html", html, "--summary", summary)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # a warning: TF Serving answers, a client option fixes it
    data = json.loads(report.read_text())
    (sizes,) = data["messages"]
    by_rows = {b["rows"]: b for b in sizes["batches"]}
    assert sorted(by_rows) == [1, 8] and sizes["rows_within"]["default_client"] == 3
    warning = next(f for f in data["findings"] if f["code"] == "message-size")
    assert warning["severity"] == "warning" and "output 'big'" in warning["message"]
    assert "gRPC messages at the largest batch tried" in proc.stdout and "up to 3 rows" in proc.stdout
    assert "a default gRPC client cannot receive the 9.6 MB Predict answer to 8 rows" in data["verdict"]
    assert 'id="messages"' in html.read_text() and "| serving_default | Predict | 8 |" in summary.read_text()
    assert "**message-size**" in summary.read_text()

    # the reported size is the answer's: byte for byte what the server sends
    assert _predict(big_model["address"], 1).ByteSize() == by_rows[1]["response_bytes"]
    assert _predict(big_model["address"], 3).outputs["big"].tensor_shape.dim[0].size == 3  # the most it claims
    for rows in (4, 8):
        with pytest.raises(grpc.RpcError) as refused:
            _predict(big_model["address"], rows)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "Received message larger than max" in refused.value.details()
    assert f"({by_rows[8]['response_bytes']} vs. {CLIENT_MAX_RECEIVE})" in refused.value.details()
    # the fix the warning names works
    option = [("grpc.max_receive_message_length", 10 * 1024 * 1024)]
    assert 'options=[("grpc.max_receive_message_length", 10 * 1024 * 1024)]' in warning["message"]
    assert _predict(big_model["address"], 8, option).ByteSize() == by_rows[8]["response_bytes"]


@pytest.mark.slow
def test_verify_data_reports_the_sizes_of_its_batches(big_model, tmp_path):
    """verify --data: the first batch of each size it sent (4 records, then the 2 left)."""
    records = tmp_path / "records.npz"
    np.savez(records, x=np.ones((6, 4), np.float32))
    report = tmp_path / "data.json"
    proc = invoke("verify", big_model["path"], "--signature", "serving_default", "--data", records,
                  "--batch-size", "4", "--runtimes", "session", "--json", report)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (sizes,) = json.loads(report.read_text())["messages"]
    assert [b["rows"] for b in sizes["batches"]] == [2, 4] and sizes["rows_within"]["default_client"] == 3
    assert any(f["code"] == "message-size" for f in json.loads(report.read_text())["findings"])


@pytest.mark.slow
@pytest.mark.serving
def test_inspect_requests_write_a_python_client_with_the_option_where_one_row_needs_it(big_model, tmp_path,
                                                                                       monkeypatch):
    import grpc

    out = tmp_path / "requests"
    proc = invoke("inspect", big_model["path"], "--requests", out, "--model-name", "big")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    default = (out / "serving_default.grpc.py").read_text()
    assert "options = []" in default and "a default gRPC client (4 MiB) receives at most 3 rows" in default
    wide = (out / "wide.grpc.py").read_text()
    assert 'options = [("grpc.max_receive_message_length", 5 * 1024 * 1024)]' in wide
    assert "-max-msg-sz 5242880" in (out / "wide.grpcurl.sh").read_text()
    with pytest.raises(grpc.RpcError) as refused:  # the option is needed: a default client refuses one row
        _predict(big_model["address"], 1, signature="wide")
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    monkeypatch.setenv("GRPC_ADDRESS", big_model["address"])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # the script as written (in this process: TensorFlow is imported)
        runpy.run_path(str(out / "wide.grpc.py"), run_name="__main__")
    answer = json.loads(printed.getvalue())
    assert answer["modelSpec"]["signatureName"] == "wide" and len(answer["outputs"]["wide"]["floatVal"]) == WIDE
