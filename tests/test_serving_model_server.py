"""`exportkit serve` as tensorflow_model_server: the requests TF Serving's tensorflow_model_server_test.py makes and
what it asserts, plus what its C++ tests pin (status texts, version policy and labels, batching), on
half-plus-two-style models built here (tests/tfs_models.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tfs_models import build_half_plus, build_half_plus_two_tf2

pytestmark = [pytest.mark.slow, pytest.mark.serving]


def _config(models: dict) -> str:
    """A ModelServerConfig text proto: {name: (base_path, policy text, {label: version})}."""
    out = ["model_config_list {"]
    for name, (base, policy, labels) in models.items():
        out.append(f'  config {{ name: "{name}" base_path: "{base}" model_platform: "tensorflow" {policy}')
        out += [f'    version_labels {{ key: "{k}" value: {v} }}' for k, v in labels.items()]
        out.append("  }")
    return "\n".join(out + ["}"]) + "\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server started with TF Serving's flags: a two-version model (policy all, labels), the same base under
    the default latest policy, a TF2 model, a polled model; REST, a Unix socket and Prometheus on."""
    from exportkit.serving.launch.process import free_port

    root = tmp_path_factory.mktemp("model_server")
    hp = root / "half_plus"
    build_half_plus(str(hp / "1"), b=2.0)
    build_half_plus(str(hp / "2"), b=3.0)
    build_half_plus_two_tf2(str(root / "tf2" / "123"))
    build_half_plus(str(root / "polled" / "1"), b=2.0)
    build_half_plus(str(root / "spare" / "2"), b=3.0)  # copied into polled/ by a test
    config = root / "models.config"
    config.write_text(_config({
        "hp": (hp, "model_version_policy { all {} }", {"stable": 1, "canary": 2}),
        "latest": (hp, "", {}),
        "tf2": (root / "tf2", "", {}),
        "polled": (root / "polled", "", {}),
    }))
    monitoring = root / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }\n')
    grpc_port, rest_port, socket = free_port(), free_port(), str(root / "tfs.sock")
    argv = [sys.executable, "-m", "exportkit", "serve", f"--port={grpc_port}", f"--rest_api_port={rest_port}",
            f"--model_config_file={config}", "--file_system_poll_wait_seconds=1", f"--grpc_socket_path={socket}",
            f"--monitoring_config_file={monitoring}", "--rest_api_timeout_in_ms=5000",
            "--grpc_channel_arguments=grpc.max_connection_age_ms=60000,grpc.so_reuseaddr=1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once every model is AVAILABLE
        assert "AVAILABLE" in line, proc.stderr.read()[-3000:]
        yield {"grpc": f"127.0.0.1:{grpc_port}", "rest": f"127.0.0.1:{rest_port}", "socket": socket, "root": root}
    finally:
        proc.terminate()
        proc.wait(30)


def _stub(address: str):
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    return prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(address))


def _predict_request(name: str, version: int | None = None, label: str | None = None, shape=(1,),
                     signature: str = "serving_default", output_filter=("y",)):
    """VerifyPredictRequest's request: x = 2.0 as float_val with a [1] (or [1, 1]) shape."""
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    request.inputs["x"].dtype = types_pb2.DT_FLOAT
    request.inputs["x"].float_val.append(2.0)
    for size in shape:
        request.inputs["x"].tensor_shape.dim.add().size = size
    request.output_filter.extend(output_filter)
    return request


def _error(call, request):
    import grpc

    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=20)
    return info.value.code().name, info.value.details()


def test_predict_answers_in_float_val_for_a_tensor_the_signature_has_no_shape_for(server):
    response = _stub(server["grpc"]).Predict(_predict_request("hp", version=1), timeout=20)
    assert list(response.outputs["y"].float_val) == [3.0] and not response.outputs["y"].tensor_content
    assert (response.model_spec.name, response.model_spec.signature_name, response.model_spec.version.value) == (
        "hp", "serving_default", 1)
    batch = _stub(server["grpc"]).Predict(_predict_request("hp", version=1, shape=(1, 1), output_filter=()), timeout=20)
    assert list(batch.outputs["y"].float_val) == [3.0] and [d.size for d in batch.outputs["y"].tensor_shape.dim] == [1, 1]


def test_versions_labels_and_the_latest_policy(server):
    stub = _stub(server["grpc"])
    assert stub.Predict(_predict_request("hp", label="stable"), timeout=20).outputs["y"].float_val[0] == 3.0
    canary = stub.Predict(_predict_request("hp", label="canary"), timeout=20)
    assert canary.outputs["y"].float_val[0] == 4.0 and canary.model_spec.version.value == 2
    assert stub.Predict(_predict_request("hp"), timeout=20).model_spec.version.value == 2  # Latest = highest
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc
    import grpc

    status = model_service_pb2_grpc.ModelServiceStub(grpc.insecure_channel(server["grpc"]))
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "latest"
    entries = status.GetModelStatus(request, timeout=20).model_version_status
    assert [(e.version, get_model_status_pb2.ModelVersionStatus.State.Name(e.state)) for e in entries] == [(2, "AVAILABLE")]
    request.model_spec.name = "hp"
    assert [e.version for e in status.GetModelStatus(request, timeout=20).model_version_status] == [2, 1]


def test_status_codes_and_texts_are_tf_servings(server):
    predict = _stub(server["grpc"]).Predict
    # tensorflow_model_server_test_base.WaitForServerReady waits for a text containing "Servable"
    assert _error(predict, _predict_request("intentionally_missing_model")) == (
        "NOT_FOUND", "Servable not found for request: Latest(intentionally_missing_model)")
    assert _error(predict, _predict_request("hp", version=7)) == ("NOT_FOUND", "Servable not found for request: Specific(hp, 7)")
    assert _error(predict, _predict_request("hp", label="nope")) == (
        "INVALID_ARGUMENT", "Unrecognized servable version label: nope")
    assert _error(predict, _predict_request("")) == ("INVALID_ARGUMENT", "ModelSpec has no name specified.")
    code, text = _error(predict, _predict_request("hp", signature="nope"))
    assert code == "FAILED_PRECONDITION" and text.startswith('Serving signature key "nope" not found.')


def _examples_request(kind, name: str, signature: str, x: float = 2.0):
    request = kind()
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    request.input.example_list.examples.add().features.feature["x"].float_list.value.append(x)
    return request


@pytest.mark.parametrize("model", ["hp", "tf2"])
def test_classify_regress_multi_inference(server, model):
    from tensorflow_serving.apis import classification_pb2, inference_pb2, regression_pb2

    stub = _stub(server["grpc"])
    version = 2 if model == "hp" else 123
    classify = stub.Classify(_examples_request(classification_pb2.ClassificationRequest, model, "classify_x_to_y"),
                             timeout=20)
    expected = 4.0 if model == "hp" else 3.0  # hp's latest is version 2 (b = 3)
    assert [[c.score for c in row.classes] for row in classify.result.classifications] == [[expected]]
    assert (classify.model_spec.signature_name, classify.model_spec.version.value) == ("classify_x_to_y", version)
    regress = stub.Regress(_examples_request(regression_pb2.RegressionRequest, model, "regress_x_to_y"), timeout=20)
    assert [r.value for r in regress.result.regressions] == [expected]
    multi = inference_pb2.MultiInferenceRequest()
    for signature, method in (("regress_x_to_y", "tensorflow/serving/regress"),
                              ("classify_x_to_y", "tensorflow/serving/classify")):
        task = multi.tasks.add()
        task.model_spec.name, task.model_spec.signature_name, task.method_name = model, signature, method
    multi.input.example_list.examples.add().features.feature["x"].float_list.value.append(2.0)
    results = stub.MultiInference(multi, timeout=20).results
    assert results[0].regression_result.regressions[0].value == expected
    assert results[1].classification_result.classifications[0].classes[0].score == expected
    assert [r.model_spec.version.value for r in results] == [version, version]


def test_classify_refuses_a_signature_whose_input_is_not_examples_and_predict_answers_on_any(server):
    from tensorflow_serving.apis import classification_pb2, regression_pb2

    stub = _stub(server["grpc"])
    code, text = _error(stub.Classify, _examples_request(classification_pb2.ClassificationRequest, "hp",
                                                         "serving_default"))
    assert code == "INVALID_ARGUMENT" and text.startswith("No classification inputs found in SignatureDef:")
    code, text = _error(stub.Regress, _examples_request(regression_pb2.RegressionRequest, "hp", "classify_x_to_y"))
    assert code == "INVALID_ARGUMENT" and text.startswith("No regression outputs found in SignatureDef:")
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "hp", "classify_x_to_y"
    example = _examples_request(classification_pb2.ClassificationRequest, "hp", "x").input.example_list.examples[0]
    from exportkit.serving.tensors import to_tensor_proto
    import numpy as np

    request.inputs["inputs"].CopyFrom(to_tensor_proto(np.array([example.SerializeToString()], dtype=object)))
    assert list(stub.Predict(request, timeout=20).outputs["scores"].float_val) == [4.0]


def test_a_stateful_signature_counts(server):
    from tensorflow_serving.apis import predict_pb2

    stub = _stub(server["grpc"])

    def call(signature):
        request = predict_pb2.PredictRequest()
        request.model_spec.name, request.model_spec.signature_name = "hp", signature
        request.model_spec.version.value = 1
        return stub.Predict(request, timeout=20).outputs["output"].float_val[0]

    before = call("get_counter")
    assert [call("incr_counter") for _ in range(2)] == [before + 1, before + 2]
    assert call("get_counter") == before + 2


def test_rest_uds_and_prometheus(server):
    import json

    request = urllib.request.Request(f"http://{server['rest']}/v1/models/hp/versions/1:predict",
                                     data=json.dumps({"instances": [2.0, 3.0, 4.0]}).encode())
    assert json.loads(urllib.request.urlopen(request, timeout=20).read()) == {"predictions": [3.0, 3.5, 4.0]}
    via_socket = _stub(f"unix:{server['socket']}").Predict(_predict_request("hp", version=1), timeout=20)
    assert list(via_socket.outputs["y"].float_val) == [3.0]
    page = urllib.request.urlopen(f"http://{server['rest']}/monitoring/prometheus/metrics", timeout=20)
    assert page.headers["Content-Type"] == "text/plain"  # http_server.cc ProcessPrometheusRequest
    text = page.read().decode()
    # TF Serving's names as prometheus_exporter.cc writes them: no _total / _created of prometheus-client
    assert "# TYPE :tensorflow:serving:request_count counter" in text and "_total{" not in text
    assert "_created" not in text and "# HELP" not in text
    rest_count = [line for line in text.splitlines()
                  if line.startswith(':tensorflow:serving:request_latency_count{model_name="hp",API="predict",'
                                     'entrypoint="REST"}')]
    assert rest_count and int(rest_count[0].split()[-1]) >= 1  # REST Predicts are counted too


def test_a_new_version_on_disk_loads_and_the_policy_unloads_the_old_one(server):
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc
    import grpc

    root = server["root"]
    shutil.copytree(root / "spare" / "2", root / "polled" / "tmp-2")
    os.rename(root / "polled" / "tmp-2", root / "polled" / "2")  # appears whole, as a finished export does
    status = model_service_pb2_grpc.ModelServiceStub(grpc.insecure_channel(server["grpc"]))
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "polled"
    states = get_model_status_pb2.ModelVersionStatus.State
    deadline, seen = time.monotonic() + 60, []
    while time.monotonic() < deadline:
        seen = [(e.version, states.Name(e.state)) for e in status.GetModelStatus(request, timeout=20).model_version_status]
        if seen == [(2, "AVAILABLE"), (1, "END")]:
            break
        time.sleep(0.5)
    assert seen == [(2, "AVAILABLE"), (1, "END")]
    assert _stub(server["grpc"]).Predict(_predict_request("polled"), timeout=20).outputs["y"].float_val[0] == 4.0


def _prometheus_lines(rest: str, path: str = "/monitoring/prometheus/metrics") -> list[str]:
    return urllib.request.urlopen(f"http://{rest}{path}", timeout=20).read().decode().splitlines()


def test_load_metrics_count_each_versions_load(server):
    """TF core's loader.cc metrics as prometheus_exporter.cc writes them: one successful load attempt per version
    a model of the config loads (hp/2 twice: "hp" and "latest" both serve it), its load time in microseconds."""
    lines = _prometheus_lines(server["rest"])
    root = server["root"]
    attempts = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in lines
                if line.startswith(":tensorflow:cc:saved_model:load_attempt_count{")}
    for path, count in ((root / "half_plus" / "1", 1), (root / "half_plus" / "2", 2), (root / "tf2" / "123", 1),
                        (root / "polled" / "1", 1)):
        key = f':tensorflow:cc:saved_model:load_attempt_count{{model_path="{path}",status="success"}}'
        assert attempts.get(key) == count, (key, attempts)
    assert not any('status="fail"' in key for key in attempts)
    latencies = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in lines
                 if line.startswith(":tensorflow:cc:saved_model:load_latency{")}
    for path in (root / "half_plus" / "1", root / "half_plus" / "2", root / "tf2" / "123", root / "polled" / "1"):
        assert latencies.get(f':tensorflow:cc:saved_model:load_latency{{model_path="{path}"}}', 0) > 0, latencies
    # one TYPE line per metric, metrics in the order of their TF names (PrometheusExporter::GeneratePage)
    types = [line for line in lines if line.startswith("# TYPE ")]
    assert types.index("# TYPE :tensorflow:cc:saved_model:load_attempt_count counter") + 1 == \
        types.index("# TYPE :tensorflow:cc:saved_model:load_latency counter")
    assert types == sorted(types)


def test_a_changed_model_config_file_is_picked_up_by_the_poll(tmp_path):
    """--model_config_file_poll_wait_seconds (Server::PollFilesystemAndReloadConfig): a model added to the config
    file loads, one removed from it unloads, and a file that does not parse keeps the config the server has."""
    from exportkit.serving.launch.process import free_port

    build_half_plus(str(tmp_path / "a" / "1"), b=2.0)
    build_half_plus(str(tmp_path / "b" / "1"), b=3.0)
    config = tmp_path / "models.config"

    def write_config(text: str) -> None:  # whole or not at all, as a deployment replaces it
        (tmp_path / "models.config.tmp").write_text(text)
        os.replace(tmp_path / "models.config.tmp", config)

    write_config(_config({"a": (tmp_path / "a", "", {})}))
    monitoring = tmp_path / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }\n')
    grpc_port, rest_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exportkit", "serve", f"--port={grpc_port}",
                             f"--rest_api_port={rest_port}", f"--model_config_file={config}",
                             "--model_config_file_poll_wait_seconds=1", f"--monitoring_config_file={monitoring}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "AVAILABLE" in proc.stdout.readline(), proc.stderr.read()[-3000:]
        predict = _stub(f"127.0.0.1:{grpc_port}").Predict
        assert (_answers(predict, "a"), _answers(predict, "b")) == (3.0, None)

        write_config(_config({"b": (tmp_path / "b", "", {})}))
        deadline, answers = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            answers = (_answers(predict, "a"), _answers(predict, "b"))
            if answers == (None, 4.0):
                break
            time.sleep(0.5)
        assert answers == (None, 4.0), f"the config poll did not swap model a for model b: {answers}"

        write_config("model_config_list { this is not a ModelServerConfig")
        time.sleep(3)  # three polls
        assert proc.poll() is None and _answers(predict, "b") == 4.0
        assert f':tensorflow:cc:saved_model:load_attempt_count{{model_path="{tmp_path / "b" / "1"}",' \
               'status="success"} 1' in _prometheus_lines(f"127.0.0.1:{rest_port}")
    finally:
        proc.terminate()
        proc.wait(30)


def _answers(predict, name: str) -> float | None:
    """y for x = 2.0 from model `name`, or None if the server has no such model (NOT_FOUND)."""
    import grpc

    try:
        return predict(_predict_request(name), timeout=20).outputs["y"].float_val[0]
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return None


# ------------------------------------------------------------------------------------------ flags and configs
def test_flags_are_tensorflow_model_servers():
    from exportkit.errors import UsageError
    from exportkit.serving.server.model_server import parse_flags

    options = parse_flags(["--port=9000", "--rest_api_port", "9001", "--model_name=m", "--model_base_path=/m",
                           "--enable_batching", "--tensorflow_intra_op_parallelism=2"])
    assert (options.port, options.rest_api_port, options.model_name, options.enable_batching,
            options.tensorflow_intra_op_parallelism) == (9000, 9001, "m", True, 2)
    assert parse_flags(["/some/model", "--port", "0", "--rest-port", "0"]).path == "/some/model"
    for argv, text in ((["--model_base_path=/m", "--no_such_flag=1"], "unrecognized arguments: --no_such_flag=1"),
                       (["--model_base_path=/m", "--prefer_tflite_model=true"], "--prefer_tflite_model is not supported"),
                       (["--port=1"], "needs exactly one of PATH, --model_base_path, --model_config_file")):
        with pytest.raises(UsageError) as info:
            parse_flags(argv)
        assert text in info.value.message and info.value.remedy


def test_a_bad_config_is_refused_with_tf_servings_message(tmp_path):
    bad = tmp_path / "bad.config"
    bad.write_text("improperly formatted file")
    run = subprocess.run([sys.executable, "-m", "exportkit", "serve", f"--model_config_file={bad}"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "Error parsing text-format tensorflow.serving.ModelServerConfig" in run.stderr and "fix:" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_session_bundle_is_refused_with_tf_servings_message(tmp_path):
    from exportkit.savedmodel.versions import ModelLocation
    from exportkit.serving.server.servable import ServedModel

    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "export.meta").write_bytes(b"")
    served = ServedModel(ModelLocation(str(tmp_path), str(tmp_path / "1"), 1, "m"), "m")
    served.load()
    assert served.state == "END" and served.error == (12, "Session Bundle is deprecated and removed.")


# ------------------------------------------------------------------------------------------ batching
def _batch_size_model(version_dir: str) -> str:
    """y = x * (rows in the batch): what a model whose rows see each other answers under batching."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        x = v1.placeholder(tf.float32, shape=[None], name="x")
        y = tf.identity(x * tf.cast(tf.shape(x)[0], tf.float32), name="y")
        info = v1.saved_model.utils.build_tensor_info
        builder = v1.saved_model.builder.SavedModelBuilder(version_dir)
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "serving_default": v1.saved_model.signature_def_utils.build_signature_def(
                {"x": info(x)}, {"y": info(y)}, "tensorflow/serving/predict")})
        builder.save()
    return version_dir


def test_batching_merges_concurrent_requests_and_pads_to_allowed_sizes(tmp_path):
    from google.protobuf import text_format

    from exportkit.serving.server.config import ModelConfig, read_batching_parameters
    from exportkit.serving.server.predict import predict
    from exportkit.serving.server.server_core import ServerCore

    _batch_size_model(str(tmp_path / "m" / "1"))
    params = tmp_path / "batching.config"
    params.write_text("max_batch_size { value: 4 } batch_timeout_micros { value: 1000000 } "
                      "allowed_batch_sizes: 2 allowed_batch_sizes: 4\n")
    batching = read_batching_parameters(str(params))
    assert text_format.MessageToString(batching, as_one_line=True).startswith("max_batch_size { value: 4 }")
    core = ServerCore(batching=batching)
    core.reload_config([ModelConfig("m", str(tmp_path / "m"))])
    try:
        def ask(value, out, i):
            request = _predict_request("m", output_filter=())
            request.inputs["x"].float_val[0] = value
            out[i] = list(predict(core, request).outputs["y"].float_val)

        alone = [None]
        ask(1.0, alone, 0)
        assert alone == [[2.0]]  # one row, padded to the allowed size 2: the model saw 2 rows
        together = [None] * 3
        threads = [threading.Thread(target=ask, args=(float(i + 1), together, i)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert together == [[4.0], [8.0], [12.0]]  # merged into one run of 3 rows, padded to 4
    finally:
        core.close()


def test_the_method_name_check_when_asked_for(tmp_path):
    from tensorflow_serving.apis import classification_pb2

    from exportkit.serving.server.classifier import classify
    from exportkit.serving.server.config import ModelConfig
    from exportkit.serving.server.server_core import ServerCore
    from exportkit.serving.server.status import RpcError

    build_half_plus(str(tmp_path / "m" / "1"))
    checked, default = ServerCore(method_name_check=True), ServerCore()
    try:
        for core in (checked, default):
            core.reload_config([ModelConfig("m", str(tmp_path / "m"))])
        request = _examples_request(classification_pb2.ClassificationRequest, "m", "regress_x_to_y")
        with pytest.raises(RpcError) as info:
            classify(checked, request)
        assert (info.value.code.name, info.value.message) == (
            "INVALID_ARGUMENT", "Expected classification signature method_name to be tensorflow/serving/classify. "
                                "Was: tensorflow/serving/regress")
        with pytest.raises(RpcError) as info:  # without it, the structure decides: no "scores"/"classes" output
            classify(default, request)
        assert info.value.message.startswith('Expected classification signature outputs to contain at least one of')
    finally:
        checked.close()
        default.close()
